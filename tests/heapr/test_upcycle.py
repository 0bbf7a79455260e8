"""The MoE upcycled from a dense SwiGLU LM: exactness when every expert is active, the partition, the least-squares
router, and HEAPr / whole-expert pruning running on it unchanged, against independent computation (tiny random Llama)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.moe import check_moe
from lit_iclr.heapr.calibrate import calibrate
from lit_iclr.heapr.dense import calibrate_dense, dense_atom_scores, swiglu_mlps
from lit_iclr.heapr.prune import prune_model
from lit_iclr.heapr.scores import atom_scores
from lit_iclr.heapr.upcycle import UpcycledMoE, balanced_kmeans, mlp_activations, set_top_k, upcycle

from .conftest import batches

WIDTH, E = 24, 4


@pytest.mark.parametrize("grouping", ["kmeans", "coactivation", "contiguous"])
def test_all_active_upcycled_model_equals_dense(llama, grouping):
    moe = copy.deepcopy(llama)
    info = upcycle(moe, batches(), num_experts=E, grouping=grouping)
    assert len(check_moe(moe)) == 2 and all(isinstance(b.module, UpcycledMoE) for b in check_moe(moe))
    for groups in info.groups:  # a balanced partition of the neurons
        assert [len(gi) for gi in groups] == [WIDTH // E] * E
        assert torch.equal(torch.sort(torch.cat(groups)).values, torch.arange(WIDTH))
    ids = batches(1, seed=5)[0]["input_ids"]
    torch.testing.assert_close(moe(input_ids=ids).logits, llama(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_balanced_kmeans_recovers_clusters_with_equal_sizes():
    g = torch.Generator().manual_seed(0)
    centers = torch.eye(6)[:3] * 10
    x = torch.cat([c + 0.1 * torch.randn(8, 6, generator=g) for c in centers])
    labels = balanced_kmeans(x[torch.randperm(24, generator=g)], 3, seed=1)
    assert torch.bincount(labels).tolist() == [8, 8, 8]
    labels = balanced_kmeans(x, 3, seed=1)  # unshuffled: each block of 8 rows is one cluster
    assert all(len(set(labels[i * 8:(i + 1) * 8].tolist())) == 1 for i in range(3))
    with pytest.raises(ConfigError, match="divisor"):
        balanced_kmeans(x, 5)


def test_router_is_the_least_squares_fit_of_expert_norms(llama):
    moe = copy.deepcopy(llama)
    data = batches(4)
    info = upcycle(moe, data, num_experts=E, top_k=2, grouping="contiguous", ridge=0.0)
    xs, hs = mlp_activations(llama, data)
    for layer, (mlp, b) in enumerate(zip(swiglu_mlps(llama), check_moe(moe), strict=True)):
        W = mlp.down_proj.weight.double().numpy()
        h, x = hs[layer].double().numpy(), xs[layer].double().numpy()
        norms = np.stack([np.linalg.norm(h[:, e * 6:(e + 1) * 6] @ W[:, e * 6:(e + 1) * 6].T, axis=1) for e in range(E)],
                         1)
        sol = np.linalg.lstsq(np.c_[x, np.ones(len(x))], norms, rcond=None)[0].T  # affine fit: [R | b]
        np.testing.assert_allclose(b.router.weight.double().numpy(), sol[:, :-1], rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(b.router.e_score_correction_bias.double().numpy(), sol[:, -1], rtol=1e-3, atol=1e-4)
        assert 0.0 < info.router_r2[layer] <= 1.0


def test_top_k_routing_sums_the_selected_experts(llama):
    moe = copy.deepcopy(llama)
    upcycle(moe, batches(), num_experts=E, top_k=2, grouping="kmeans")
    block = moe.model.layers[0].mlp
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    chosen = (x @ block.gate.weight.T + block.gate.e_score_correction_bias).topk(2, dim=-1).indices
    ref = torch.stack([sum(block.experts.expert_forward(int(e), x[t])[1] for e in chosen[t]) for t in range(5)])
    torch.testing.assert_close(block(x), ref, atol=1e-5, rtol=1e-5)
    set_top_k(moe, E)  # all active again: the dense MLP
    torch.testing.assert_close(block(x), swiglu_mlps(llama)[0](x), atol=1e-5, rtol=1e-5)


def test_heapr_scores_on_all_active_upcycled_model_equal_dense_scores(llama):
    """Per-token HEAPr on the all-active MoE (every expert sees every token, weight 1) = HEAPr on the dense MLPs."""
    moe = copy.deepcopy(llama)
    info = upcycle(moe, None, num_experts=E, grouping="kmeans")
    data = batches(2)
    calib = calibrate(moe, data)
    dense = dense_atom_scores(calibrate_dense(llama, data), llama, "heapr")
    for layer, per_expert in enumerate(atom_scores(calib, check_moe(moe), "heapr")):
        for e, s in enumerate(per_expert):
            torch.testing.assert_close(s, dense[layer][info.groups[layer][e]], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("method", ["heapr", "frequency", "naee"])
def test_pruning_methods_run_on_the_upcycled_model(llama, method):
    moe = copy.deepcopy(llama)
    upcycle(moe, batches(), num_experts=E, top_k=2, grouping="kmeans")
    rep, _ = prune_model(moe, batches(2, seed=3), 0.25, method)
    assert rep.atoms_pruned == int(0.25 * 2 * WIDTH)
    blocks = check_moe(moe)
    router_rows = 16 * (2 * E - sum(b.num_experts for b in blocks))  # dropped experts take their router rows along
    assert rep.params_before - rep.params_after == rep.atoms_pruned * 3 * 16 + router_rows  # gate/up rows, down column
    if method != "heapr":  # whole experts gone with their router rows; top-k still within the kept experts
        assert sum(b.num_experts for b in blocks) == 2 * E - 2
        assert all(b.router.weight.shape[0] == b.router.e_score_correction_bias.shape[0] == b.num_experts for b in blocks)
    assert torch.isfinite(moe(input_ids=batches(1)[0]["input_ids"]).logits).all()


def test_bad_upcycle_options_are_clear_errors(llama):
    with pytest.raises(ConfigError, match="needs calibration"):
        upcycle(copy.deepcopy(llama), None, num_experts=E, top_k=2)
    with pytest.raises(ConfigError, match="divisor"):
        upcycle(copy.deepcopy(llama), None, num_experts=5, grouping="contiguous")
    with pytest.raises(ConfigError, match="grouping"):
        upcycle(copy.deepcopy(llama), None, num_experts=E, grouping="spectral")
