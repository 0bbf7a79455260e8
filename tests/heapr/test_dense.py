"""HEAPr on a dense SwiGLU LM (each MLP one expert of atoms): statistics, scores and removal against independent
computation on a tiny random Llama."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.core.errors import ConfigError
from lit_iclr.heapr.calibrate import lm_loss_sum
from lit_iclr.heapr.dense import (
    atoms_removed,
    calibrate_dense,
    dense_atom_scores,
    dense_keep,
    sequence_nll,
    swiglu_mlps,
    text_blocks,
)

from .conftest import batches


def reference_stats(model, data):
    """h at every down_proj and g = dL/dy by a zero perturbation eps added to each MLP output (grad wrt eps = g)."""
    mlps = swiglu_mlps(model)
    hs, gs = [[] for _ in mlps], [[] for _ in mlps]
    for b in data:
        ids = b["input_ids"]
        eps = [torch.zeros(ids.shape[0], ids.shape[1], m.down_proj.out_features, requires_grad=True) for m in mlps]
        handles = []
        for i, m in enumerate(mlps):
            handles.append(m.down_proj.register_forward_pre_hook(lambda mod, a, i=i: hs[i].append(a[0].flatten(0, 1))))
            handles.append(m.down_proj.register_forward_hook(lambda mod, a, out, e=eps[i]: out + e))
        loss, _ = lm_loss_sum(model(input_ids=ids).logits, ids)
        for h in handles:
            h.remove()
        for i, g in enumerate(torch.autograd.grad(loss, eps)):
            gs[i].append(g.flatten(0, 1))
    return [torch.cat(h) for h in hs], [torch.cat(g) for g in gs]


def test_statistics_match_perturbation_gradients(llama):
    data = batches()
    stats = calibrate_dense(llama, data)
    H, G = reference_stats(llama, data)
    assert stats.tokens == 3 * 2 * 12
    for i in range(2):
        torch.testing.assert_close(stats.h2[i], H[i].pow(2).sum(0), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(stats.M[i], G[i].T @ G[i], rtol=1e-4, atol=1e-6)


def test_heapr_score_is_the_quadratic_loss_change_of_the_actual_ablation(llama):
    """S_k = mean_t delta_y_t^T M delta_y_t, with delta_y from running the MLP with atom k removed."""
    data = batches()
    stats = calibrate_dense(llama, data)
    scores = dense_atom_scores(stats, llama, "heapr")
    H, _ = reference_stats(llama, data)
    for i, m in enumerate(swiglu_mlps(llama)):
        M = stats.M[i] / stats.tokens
        W = m.down_proj.weight
        for k in (0, 7, 23):
            h_abl = H[i].clone()
            h_abl[:, k] = 0
            dy = h_abl @ W.T - H[i] @ W.T  # the MLP output change of the ablation, token by token
            expected = torch.einsum("td,de,te->t", dy, M, dy).mean()
            torch.testing.assert_close(scores[i][k], expected, rtol=1e-4, atol=1e-9)


def test_baseline_scores_by_hand(llama):
    stats = calibrate_dense(llama, batches())
    m = swiglu_mlps(llama)[1]
    W, Wg, Wu = m.down_proj.weight, m.gate_proj.weight, m.up_proj.weight
    mag = dense_atom_scores(None, llama, "magnitude")[1]
    k = 5
    assert mag[k] == pytest.approx(float(W[:, k].norm() * torch.cat([Wg[k], Wu[k]]).norm()), rel=1e-5)
    wanda = dense_atom_scores(stats, llama, "wanda")[1]
    assert wanda[k] == pytest.approx(float(stats.h2[1][k] / stats.tokens * W[:, k].pow(2).sum()), rel=1e-5)
    with pytest.raises(ConfigError, match="unknown atomic"):
        dense_atom_scores(stats, llama, "nope")


def test_removal_equals_a_narrower_mlp_and_is_restored(llama):
    from transformers.models.llama.modeling_llama import LlamaMLP

    stats = calibrate_dense(llama, batches())
    keep = dense_keep(dense_atom_scores(stats, llama, "heapr"), 0.25)
    assert sum(int((~k).sum()) for k in keep) == round(0.25 * 48)  # global: the layers may lose different counts
    per_layer = dense_keep(dense_atom_scores(None, llama, "magnitude"), 0.25, per_layer=True)
    assert [int((~k).sum()) for k in per_layer] == [6, 6]
    ids = batches(1)[0]["input_ids"]
    before = llama(input_ids=ids).logits
    with atoms_removed(llama, keep):
        pruned = llama(input_ids=ids).logits
        x = torch.randn(5, 16)
        for m, k in zip(swiglu_mlps(llama), keep, strict=True):
            narrow = LlamaMLP(llama.config.__class__(**{**llama.config.to_dict(), "intermediate_size": int(k.sum())}))
            narrow.gate_proj.weight.data = m.gate_proj.weight[k].clone()
            narrow.up_proj.weight.data = m.up_proj.weight[k].clone()
            narrow.down_proj.weight.data = m.down_proj.weight[:, k].clone()
            torch.testing.assert_close(m(x), narrow(x))
    assert not torch.allclose(pruned, before)
    torch.testing.assert_close(llama(input_ids=ids).logits, before, rtol=0, atol=0)  # weights restored exactly


def test_sequence_nll_and_blocks(llama):
    ids = batches(1, b=3)[0]["input_ids"]
    nll = sequence_nll(llama, ids, batch_size=2)
    loss, n = lm_loss_sum(llama(input_ids=ids).logits, ids)
    assert nll.shape == (3,)
    assert float(nll.mean()) == pytest.approx(float(loss) / int(n), rel=1e-5)

    class Tok:
        eos_token_id = 0

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) % 7 + 1 for c in text]}

    blocks = text_blocks(Tok(), ["abcd", "efgh"], 3)  # a b c | d <eos> e | f g h, the final <eos> cut off
    code = [ord(c) % 7 + 1 for c in "abcdefgh"]
    assert blocks.tolist() == [code[:3], [code[3], 0, code[4]], code[5:]]
    with pytest.raises(ConfigError, match="fewer than one block"):
        text_blocks(Tok(), ["a"], 8)
