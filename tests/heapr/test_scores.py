"""HEAPr's statistics and scores against independent computation, on tiny Hugging Face MoE models."""
from __future__ import annotations

import copy

import pytest
import torch
from scipy.stats import spearmanr

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.moe import UnsupportedMoEError, check_moe, moe_blocks, tiny_model, unfuse_experts
from lit_iclr.heapr.calibrate import calibrate, lm_loss_sum
from lit_iclr.heapr.prune import prune_model
from lit_iclr.heapr.scores import atom_scores, global_keep

from .helpers import markov_batches


def _independent_stats(model, batches, block_idx, e):
    """n, sum_t h_t h_t^T-free pieces for one expert, from the *fused* HF model: routed tokens, h_t and
    g_t = r_t * dL/d(block output)_t (the expert output y_t enters the block output as r_t * y_t)."""
    block = check_moe(model)[block_idx]
    w = block.get_expert(e)
    hs, gs = [], []
    for batch in batches:
        cache = {}

        def hook(mod, args, out, cache=cache):
            cache["x"] = args[0].detach().reshape(-1, args[0].shape[-1])
            out.retain_grad()
            cache["out"] = out

        handle = block.module.register_forward_hook(hook)
        logits = model(input_ids=batch["input_ids"]).logits
        loss, _ = lm_loss_sum(logits, batch["labels"])
        loss.backward()
        handle.remove()
        x, G = cache["x"], cache["out"].grad.reshape(-1, cache["x"].shape[-1])
        with torch.no_grad():
            _, r, idx = block.route(x)
            routed = (idx == e).any(-1)
            r_e = (r * (idx == e)).sum(-1)[routed]
            xe = x[routed]
            hs.append(torch.nn.functional.silu(xe @ w.gate.T) * (xe @ w.up.T))
            gs.append(r_e[:, None] * G[routed])
    model.zero_grad(set_to_none=True)
    return torch.cat(hs), torch.cat(gs), w


@pytest.mark.parametrize("arch", ["qwen2_moe", "deepseek_v2"])
def test_score_is_half_quadratic_form_of_the_ablation_summed_over_tokens(arch):
    model = tiny_model(arch, seed=0, vocab_size=64)
    batches = markov_batches(3, vocab=64)
    for block_idx, e in ((0, 1), (1, 3)):
        h, g, w = _independent_stats(model, batches, block_idx, e)
        n = h.shape[0]
        M = g.T @ g / n  # E[g g^T] over the expert's routed tokens
        # delta_y_t of removing atom k, computed by ablation (atom zeroed), not by the formula -h_k w_k
        k_list = range(w.width)
        direct = []
        for k in k_list:
            keep = torch.ones(w.width, dtype=torch.bool)
            keep[k] = False
            y_full = h @ w.down.T
            y_abl = (h * keep) @ w.down.T
            dy = (y_abl - y_full).detach()
            direct.append(0.5 * torch.einsum("ti,ij,tj->", dy, M, dy))  # 1/2 sum_t dy^T M dy
        direct = torch.stack(direct)
        dense = copy.deepcopy(model)
        calib = calibrate(dense, batches, fisher_state="full")
        S = atom_scores(calib, check_moe(dense), "heapr", "per_token")[block_idx][e]
        assert int(calib.blocks[block_idx].n[e]) == n
        # S_k = E[h_k^2] w_k^T M w_k  ==  (2 / n) * 1/2 sum_t dy_t^T M dy_t
        torch.testing.assert_close(S * n / 2, direct.float(), rtol=1e-3, atol=1e-9)
        calib_atom = calibrate(copy.deepcopy(model), batches, fisher_state="atom")  # O(I) state: same numbers
        S_atom = atom_scores(calib_atom, check_moe(dense), "heapr", "per_token")[block_idx][e]
        torch.testing.assert_close(S_atom, S, rtol=1e-3, atol=1e-9)
        S_freq = atom_scores(calib, check_moe(dense), "heapr", "frequency")[block_idx][e]
        torch.testing.assert_close(S_freq, S * n / calib.tokens)
        assert calib.state_bytes() > calib_atom.state_bytes()


def _train(model, batches, steps=150, lr=1e-2):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for i in range(steps):
        b = batches[i % len(batches)]
        loss, n = lm_loss_sum(model(input_ids=b["input_ids"]).logits, b["labels"])
        (loss / n).backward()
        opt.step()
        opt.zero_grad()
    model.eval()


@torch.no_grad()
def _total_loss(model, batches):
    return sum(float(lm_loss_sum(model(input_ids=b["input_ids"]).logits, b["labels"])[0]) for b in batches)


def test_scores_rank_correlate_with_true_loss_increase_of_each_ablation():
    """Exact ablation of every atom of a trained tiny Qwen2-MoE, vs the scores.

    The model is trained on fresh samples of a Markov source, then its experts' W_down is fitted on the calibration
    text (the paper assumes a trained optimum, where the first-order term vanishes). The true loss change of removing
    atom k splits exactly into a first-order part -w_k^T dL/dw_k (from autograd) and the rest, the curvature part that
    1/2 n S_k estimates.
    """
    torch.manual_seed(0)
    model = unfuse_experts(tiny_model("qwen2_moe", seed=1, vocab_size=32, hidden_size=24, moe_intermediate_size=8))
    _train(model, markov_batches(100, batch=16, seq=24, vocab=32, seed=7), steps=250)
    batches = markov_batches(4, batch=16, seq=24, vocab=32, seed=99)
    downs = [p for n, p in model.named_parameters() if ".experts." in n and "down_proj" in n]
    opt = torch.optim.Adam(downs, lr=3e-3)
    for _ in range(100):  # full-batch fit of W_down on the calibration text
        sum(lm_loss_sum(model(input_ids=b["input_ids"]).logits, b["labels"])[0] for b in batches).div(1000).backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    model.zero_grad()
    for b in batches:
        lm_loss_sum(model(input_ids=b["input_ids"]).logits, b["labels"])[0].backward()
    calib = calibrate(model, batches, fisher_state="full")
    blocks = check_moe(model)
    base = _total_loss(model, batches)
    true, first = [], []
    for b in blocks:  # exact: every atom removed on its own, loss re-evaluated
        for e in range(b.num_experts):
            col, grad = b.get_expert(e).down, b.experts[e].down_proj.weight.grad
            for k in range(col.shape[1]):
                first.append(float(-(grad[:, k] * col[:, k]).sum()))  # first-order term g^T delta_y, exactly
                saved = col[:, k].clone()
                with torch.no_grad():
                    col[:, k] = 0
                true.append(_total_loss(model, batches) - base)
                with torch.no_grad():
                    col[:, k] = saved
    true, curvature = torch.tensor(true), torch.tensor(true) - torch.tensor(first)
    flat = {m: torch.cat([s for per in atom_scores(calib, blocks, m, "frequency") for s in per])
            for m in ("heapr", "wanda", "magnitude", "random")}
    rho = {m: spearmanr(v.numpy(), true.numpy()).statistic for m, v in flat.items()}
    rho_curv = spearmanr(flat["heapr"].numpy(), curvature.numpy()).statistic
    # Spearman of the HEAPr score vs the curvature part, measured over data seeds 0-3 on an Intel Xeon: 0.76, 0.89,
    # 0.89, 0.83 (seed 0, the one used here, reads higher on AMD EPYC); 0.7 sits below that spread, far above chance.
    assert rho_curv > 0.7, rho_curv
    assert rho["heapr"] > 0.7 and rho["heapr"] > rho["magnitude"] and abs(rho["random"]) < 0.3, rho


def test_global_ranking_prunes_the_lowest_atoms_across_layers():
    scores = [[torch.tensor([5.0, 1.0, 3.0]), torch.tensor([0.5])], [torch.tensor([2.0, 4.0, 0.1, 6.0])]]
    keep = global_keep(scores, 0.375)  # 3 of 8 atoms: 0.1, 0.5, 1.0
    assert [m.tolist() for per in keep for m in per] == [[True, False, True], [False], [True, True, False, True]]
    with pytest.raises(ConfigError, match="strictly between 0 and 1"):
        global_keep(scores, 1.0)


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral", "deepseek_v3"])
def test_pruned_model_is_smaller_and_equals_masked_dense(arch):
    model = tiny_model(arch, seed=2, vocab_size=64)
    batches = markov_batches(2, vocab=64)
    dense = copy.deepcopy(model)
    shared_before = [copy.deepcopy(s.state_dict()) for b in moe_blocks(dense) for s in b.shared]
    report, calib = prune_model(model, batches, 0.4, "heapr")
    assert report.atoms_pruned == round(0.4 * report.atoms_total)
    assert report.params_after == report.params_before - 3 * 32 * report.atoms_pruned
    assert report.expert_flops_after < report.expert_flops_before
    # the same atoms zeroed in the dense model (no slicing) give identical logits
    ids = batches[0]["input_ids"]
    masked = unfuse_experts(copy.deepcopy(dense))
    for bm, bp in zip(check_moe(masked), check_moe(model), strict=True):
        for e in range(bm.num_experts):
            kept = bp.get_expert(e)
            full = bm.get_expert(e)
            # which atoms survived: match the kept down columns inside the full matrix
            match = (full.down.T[:, None, :] == kept.down.T[None, :, :]).all(-1).any(-1)
            assert int(match.sum()) == kept.width
            with torch.no_grad():
                full.down[:, ~match] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, masked(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    shared_after = [s.state_dict() for b in moe_blocks(model) for s in b.shared]
    for a, b in zip(shared_before, shared_after, strict=True):  # shared experts untouched
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_baseline_scores_match_their_formulas():
    model = tiny_model("qwen2_moe", seed=3, vocab_size=64)
    batches = markov_batches(2, vocab=64)
    calib = calibrate(model, batches, with_gradients=False)
    blocks = check_moe(model)
    w = blocks[1].get_expert(2)
    n = float(calib.blocks[1].n[2])
    wanda = atom_scores(calib, blocks, "wanda")[1][2]
    torch.testing.assert_close(wanda, calib.blocks[1].h2[2] / n * (w.down ** 2).sum(0))
    mag = atom_scores(calib, blocks, "magnitude")[1][2]
    torch.testing.assert_close(mag, w.down.norm(dim=0) * torch.sqrt((w.gate ** 2).sum(1) + (w.up ** 2).sum(1)))
    r1, r2 = atom_scores(None, blocks, "random", seed=5), atom_scores(None, blocks, "random", seed=5)
    assert torch.equal(r1[0][0], r2[0][0])
    with pytest.raises(ValueError, match="gradient statistics"):
        atom_scores(calib, blocks, "heapr")


def test_whole_expert_baselines():
    model = tiny_model("qwen2_moe", seed=4, vocab_size=64, num_experts=6)
    batches = markov_batches(2, vocab=64)
    dense = copy.deepcopy(model)
    report, calib = prune_model(model, batches, 0.34, "frequency")
    counts = [calib.blocks[i].n for i in range(2)]
    freq_order = sorted((float(c[e]), i, e) for i, c in enumerate(counts) for e in range(6))
    dropped = {(i, e) for _, i, e in freq_order[:4]}  # 4 of 12 experts ~ 34 % of the atoms
    assert report.atoms_pruned == 4 * 16
    for i, b in enumerate(check_moe(model)):
        kept = [e for e in range(6) if (i, e) not in dropped]
        ref = check_moe(dense)[i]
        assert b.num_experts == len(kept)
        for j, e in enumerate(kept):
            assert torch.equal(b.router.weight[j], ref.router.weight[e])

    # NAEE: the chosen subset has the smallest reconstruction error, checked by masking the router's logits
    model = copy.deepcopy(dense)
    _, calib = prune_model(model, batches, 0.17, "naee")  # round(0.17 * 6) = 1 expert per layer
    for i, b in enumerate(check_moe(model)):
        ref = check_moe(dense)[i]
        x = torch.cat(calib.blocks[i].inputs)
        with torch.no_grad():
            full = ref.module(x[None])[0]
            errs = []
            for drop in range(6):
                logits = x @ ref.router.weight.T
                logits[:, drop] = -float("inf")
                p = logits.softmax(-1)
                w, idx = p.topk(2, -1)
                out = torch.sigmoid(ref.shared_gate(x)) * ref.shared[0](x)
                for e in range(6):
                    sel = (idx == e)
                    rows = sel.any(-1)
                    if rows.any():
                        out[rows] += (w * sel).sum(-1)[rows, None] * ref.expert_forward(e, x[rows])
                errs.append(float((out - full).pow(2).sum()))
        best = min(range(6), key=lambda d: errs[d])
        kept = [e for e in range(6) if e != best]
        assert b.num_experts == 5
        assert all(torch.equal(b.router.weight[j], ref.router.weight[e]) for j, e in enumerate(kept))


def test_bad_inputs_are_clear():
    from transformers import LlamaConfig, LlamaForCausalLM

    dense = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    with pytest.raises(UnsupportedMoEError, match="no Mixture-of-Experts block"):
        prune_model(dense, markov_batches(1, vocab=64), 0.2)
    model = tiny_model("mixtral")
    for bad in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(ConfigError, match="strictly between 0 and 1"):
            prune_model(model, None, bad)
    with pytest.raises(ConfigError, match="unknown pruning method"):
        prune_model(model, None, 0.2, method="obs")
    with pytest.raises(ConfigError, match="needs calibration data"):
        prune_model(model, None, 0.2, method="heapr")
