"""AIRE math against independent computation: brute-force impulse-response sums, masks vs. slices, LAMP."""
import copy
import math

import numpy as np
import pytest
import torch

from lit_iclr.aire_prune import aire
from lit_iclr.aire_prune.model import S4DSSM, S5SSM, SSMClassifier


def _spread_steps(ssm, lo=-6.0, hi=0.0, seed=0):
    """Give the states a wide spread of |Lambda_bar| (as after training), up to about 0.9996."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        ssm.log_step.copy_(torch.empty_like(ssm.log_step).uniform_(lo, hi, generator=g))


def _brute_energy(ssm, direction=0):
    """sum_{k<K} ||C_i Lambda_bar_i^k B_bar_i||_F^2 per state, by repeated multiplication in float64."""
    with torch.no_grad():
        log_lam, b_bar = ssm.discretize()
        c = ssm.output_matrices()[direction]
    lam = torch.exp(log_lam.to(torch.complex128)).numpy()
    b = b_bar.detach().to(torch.complex128).numpy()
    c = c.detach().to(torch.complex128).numpy()
    out = []
    for i in range(len(lam)):
        bi = b[i] if b.ndim == 2 else np.array([b[i]])
        ci = c[:, i] if c.ndim == 2 else np.array([c[i]])
        k_max = int(math.ceil(math.log(1e-12) / (2 * math.log(abs(lam[i]))))) + 1
        # h_k = C_i lam^k B_i: an outer product; accumulate its Frobenius energy term by term (no geometric series)
        outer = np.outer(ci, bi)
        power, total = 1.0 + 0j, 0.0
        for _ in range(k_max):
            total += np.sum(np.abs(outer * power) ** 2)
            power *= lam[i]
        out.append(total)
    return np.array(out)


@pytest.mark.parametrize("kind", ["s5", "s4d"])
def test_closed_form_equals_truncated_impulse_energy(kind):
    torch.manual_seed(0)
    ssm = S5SSM(8, 16, blocks=2, seed=3) if kind == "s5" else S4DSSM(4, 8, seed=3)
    _spread_steps(ssm)
    lam_abs = ssm.modal_terms()["lam_abs"]
    assert lam_abs.max() > 0.99 and lam_abs.min() < 0.9  # slow and fast modes both present
    closed = aire.layer_scores(ssm, "aire").numpy()
    brute = _brute_energy(ssm)
    np.testing.assert_array_less(np.abs(closed - brute) / brute, 1e-4)


def test_bidirectional_intended_is_mean_of_direction_energies_and_quirk_is_official():
    ssm = S5SSM(8, 16, bidirectional=True, seed=4)
    _spread_steps(ssm)
    brute = 0.5 * (_brute_energy(ssm, 0) + _brute_energy(ssm, 1))
    closed = aire.layer_scores(ssm, "aire", bidir="intended").numpy()
    np.testing.assert_array_less(np.abs(closed - brute) / brute, 1e-4)
    # the official active line: (||c_f|| + ||c_b||)/2**2 * ||B_bar||^2 / (1 - |lam|^2 + 1e-8)
    log_lam, b_bar = (t.detach().to(torch.complex128) for t in ssm.discretize())
    cf, cb = (c.detach().to(torch.complex128) for c in ssm.output_matrices())
    quirk = ((cf.norm(dim=0) + cb.norm(dim=0)) / 4 * b_bar.norm(dim=1) ** 2
             / ((1 - torch.exp(log_lam.real) ** 2) + 1e-8))
    torch.testing.assert_close(aire.layer_scores(ssm, "aire", bidir="quirk"), quirk)


def test_last_and_magnitude_scores():
    ssm = S5SSM(8, 16, seed=5)
    _spread_steps(ssm)
    lam = ssm.modal_terms()["lam_abs"].double()
    a, last = aire.layer_scores(ssm, "aire"), aire.layer_scores(ssm, "last")
    # AIRE / LAST = (1 - |lam|) / (1 + |lam|) (up to the 1e-8 both add): LAST ranks slow modes much higher
    eps = aire.EPS
    torch.testing.assert_close(a / last, ((1 - lam) ** 2 + eps) / ((1 - lam**2) + eps), rtol=1e-9, atol=0)
    assert (a / last)[lam.argmax()] < (a / last)[lam.argmin()]
    _, b_bar = ssm.discretize()
    mag = b_bar.detach().abs().norm(dim=1).double() * ssm.output_matrices()[0].detach().abs().norm(dim=0).double()
    torch.testing.assert_close(aire.layer_scores(ssm, "magnitude"), mag)


def test_layerwise_normalisation_matches_definition_and_top_is_one():
    g = torch.Generator().manual_seed(0)
    for n in (1, 5, 40):
        s = torch.rand(n, generator=g, dtype=torch.float64) ** 3
        hat = aire.layerwise_normalize(s)
        expected = torch.stack([s[i] / s[s >= s[i]].sum() for i in range(n)])
        torch.testing.assert_close(hat, expected)
        assert hat[s.argmax()] == 1.0
    model = SSMClassifier("s5", d_model=8, n_layers=3, state_size=8)
    p = aire.plan(model, 0.5)
    for hat in p.normalized:
        assert hat.max().item() == 1.0


def test_topk_breaks_ties_towards_earlier_index():
    s = torch.tensor([0.5, 1.0, 0.5, 0.5, 0.2])
    assert aire.topk_mask(s, 3).tolist() == [True, True, True, False, False]
    assert aire.topk_mask(s, 0).sum() == 1  # always keeps at least one state


def test_global_selection_count_and_non_uniform_layers():
    torch.manual_seed(0)
    model = SSMClassifier("s5", d_model=8, n_layers=3, state_size=16)
    for i, ssm in enumerate(model.ssms()):
        _spread_steps(ssm, seed=i)
        with torch.no_grad():
            ssm.C.mul_(torch.linspace(0.05, 3, ssm.n_states)[None, :, None] ** (i + 1))
    for ratio in (0.0, 0.3, 0.65, 0.9):
        p = aire.plan(model, ratio)
        assert sum(p.kept_counts) == max(int((1 - ratio) * 24 + 1e-9), 3)  # at least one state per layer
    assert all(k >= 1 for k in aire.plan(model, 0.8).kept_counts)  # each layer's top state scores 1


@pytest.mark.parametrize("kind,mode", [("s5", "fft"), ("s5", "scan"), ("s4d", "fft")])
def test_high_ratio_keeps_one_state_per_layer_and_runs(kind, mode):
    # S5 3 layers x 4 states: at ratio 0.9 the budget is floor(1.2) = 1 state, and LAMP scores every layer's top state 1
    # (a tie the earlier layer wins), so without the floor the later layers keep nothing and the FFT path fails.
    torch.manual_seed(3)
    model = SSMClassifier(kind, d_model=8, n_layers=3, state_size=8 if kind == "s5" else 4, mode=mode, dropout=0.0,
                          ssm_init="hippo" if kind == "s5" else "s4d_lin").eval()
    total = sum(model.state_counts())
    for ratio in (0.9, 0.99):
        p = aire.plan(model, ratio)
        assert sum(p.kept_counts) == max(int((1 - ratio) * total + 1e-9), 3) and min(p.kept_counts) >= 1
        for s, keep in zip(p.normalized, p.keep, strict=True):  # each layer keeps its strongest state
            assert int(torch.argmax(s)) in keep.tolist()
        x = torch.randn(2, 12, 1)
        sliced = aire.slice_model(model, p)
        out = sliced(x)
        assert torch.isfinite(out).all()
        masked = SSMClassifier(**model.config).eval()
        masked.load_state_dict(model.state_dict())
        aire.apply_mask(masked, p)
        torch.testing.assert_close(out, masked(x), atol=1e-5, rtol=1e-5)
    # ties at the top: three identical geometric layers and a budget of 2 still leave every layer one state
    geometric = 10.0 ** -torch.arange(6, dtype=torch.float64)
    assert aire.plan_from_scores([geometric] * 3, 0.9).kept_counts == [1, 1, 1]
    # when the budget allows, the floor changes nothing: the extra states go to the global top
    assert aire.plan_from_scores([torch.ones(8, dtype=torch.float64), geometric], 0.5).kept_counts == [6, 1]


def test_layer_adaptive_fractions():
    # Energy spread evenly over 8 states vs. concentrated geometrically: LAMP gives the even layer 1/8 .. 1 and the
    # geometric one 1, ~0.09, ~0.009, ... (each state against the energy of the stronger ones), so one global
    # threshold keeps most of the even layer and only the dominant state of the geometric one.
    even = torch.ones(8, dtype=torch.float64)
    geometric = 10.0 ** -torch.arange(8, dtype=torch.float64)
    p = aire.plan_from_scores([even, geometric], 0.5)
    assert p.kept_counts == [7, 1]
    assert p.layer_fractions == [1 / 8, 7 / 8]


@pytest.mark.parametrize("kind,bidir", [("s5", False), ("s5", True), ("s4d", True)])
def test_pruning_zero_score_states_leaves_outputs_unchanged(kind, bidir):
    torch.manual_seed(1)
    model = SSMClassifier(kind, d_model=8, n_layers=2, state_size=8, bidirectional=bidir, dropout=0.0,
                          ssm_init="hippo" if kind == "s5" else "s4d_lin").eval()
    zeroed = 0
    for ssm in model.ssms():
        dead = torch.arange(0, ssm.n_states, 2)
        with torch.no_grad():
            for c in ("C", "C2"):
                if hasattr(ssm, c):
                    p = getattr(ssm, c)
                    if kind == "s5":
                        p[:, dead] = 0.0
                    else:
                        p[dead] = 0.0
        zeroed += len(dead)
    total = sum(model.state_counts())
    x = torch.randn(3, 30, 1)
    smaller, p = aire.prune(model, zeroed / total, "aire")
    assert sum(smaller.state_counts()) == total - zeroed
    for keep in p.keep:
        assert (keep % 2 == 1).all()  # exactly the zero-energy states went
    torch.testing.assert_close(smaller(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind,bidir,mode", [("s5", True, "fft"), ("s5", False, "scan"), ("s4d", False, "fft"),
                                             ("s4d", True, "scan")])
def test_sliced_model_equals_masked_model(kind, bidir, mode):
    torch.manual_seed(2)
    model = SSMClassifier(kind, d_model=8, n_layers=3, state_size=8, bidirectional=bidir, mode=mode, dropout=0.0,
                          ssm_init="hippo" if kind == "s5" else "s4d_lin").eval()
    x = torch.randn(2, 40, 1)
    p = aire.plan(model, 0.6, "aire")
    sliced = aire.slice_model(model, p)
    aire.apply_mask(model, p)
    assert sum(sliced.state_counts()) < sum(model.state_counts())
    out_masked = model(x)
    torch.testing.assert_close(sliced(x), out_masked, atol=1e-5, rtol=1e-5)
    # ... and the pruned output really differs from the unpruned one
    for ssm in model.ssms():
        ssm.state_mask.fill_(1.0)
    assert (model(x) - out_masked).abs().max() > 1e-3


def test_fully_masked_layer_is_only_the_feedthrough():
    ssm = S5SSM(6, 8, bidirectional=True, seed=7)
    ssm.state_mask.zero_()
    u = torch.randn(2, 17, 6)
    torch.testing.assert_close(ssm(u), ssm.D * u)


@pytest.mark.parametrize("kind", ["s5", "s4d"])
def test_impulse_response_is_the_modal_sum(kind):
    """The layer's output to a unit impulse equals sum_i 2 Re(C_i Lambda_bar_i^k B_bar_i) (+ D at k=0)."""
    ssm = S5SSM(3, 8, seed=8) if kind == "s5" else S4DSSM(3, 4, seed=8)
    length = 25
    for mode in ("fft", "scan"):
        ssm.mode = mode
        with torch.no_grad():
            log_lam, b_bar = ssm.discretize()
            c = ssm.output_matrices()[0]
        lam = torch.exp(log_lam).to(torch.complex128).numpy()
        b_np, c_np = b_bar.to(torch.complex128).numpy(), c.to(torch.complex128).numpy()
        for j in range(3):
            u = torch.zeros(1, length, 3)
            u[0, 0, j] = 1.0
            y = ssm(u)[0].detach().double().numpy()
            want = np.zeros((length, 3))
            for k in range(length):
                if kind == "s5":
                    want[k] = 2 * np.real(c_np @ (lam**k * b_np[:, j]))
                else:
                    ch = ssm.channel.numpy()
                    terms = 2 * np.real(c_np * lam**k * b_np) * (ch == j)
                    want[k, j] = terms.sum()
            want[0] += ssm.D.detach().double().numpy() * (np.arange(3) == j)
            np.testing.assert_allclose(y, want, atol=2e-5)


def test_fft_and_scan_agree_and_macs_shrink():
    torch.manual_seed(3)
    for kind in ("s5", "s4d"):
        model = SSMClassifier(kind, d_model=8, n_layers=2, state_size=8, bidirectional=True, dropout=0.0).eval()
        x = torch.randn(2, 33, 1)
        y_fft = model(x)
        for ssm in model.ssms():
            ssm.mode = "scan"
        torch.testing.assert_close(model(x), y_fft, atol=1e-5, rtol=1e-5)
        smaller, p = aire.prune(model, 0.5)
        assert smaller.state_macs_per_step() == pytest.approx(model.state_macs_per_step() * (1 - p.pruned_fraction))


def test_modal_truncation_score_and_uniform_order_per_layer():
    """modal = ||C_i|| ||B_bar_i|| / (1 - |lam_i|) (the mode's H-infinity norm); each layer keeps the same fraction."""
    torch.manual_seed(0)
    model = SSMClassifier("s5", d_model=8, n_layers=3, state_size=16)
    for i, ssm in enumerate(model.ssms()):
        _spread_steps(ssm, seed=i)
    ssm = next(iter(model.ssms()))
    log_lam, b_bar = (t.detach().to(torch.complex128) for t in ssm.discretize())
    c = ssm.output_matrices()[0].detach().to(torch.complex128)
    lam = torch.exp(log_lam.real)
    # the gain |C_i B_i| / |e^{jw} - lam_i| of the first-order mode over frequency: a grid never exceeds the score,
    # and at w = arg(lam_i) it equals it (the peak)
    score = aire.layer_scores(ssm, "modal")
    gain = (c.norm(dim=0) * b_bar.norm(dim=1))
    w = torch.linspace(-math.pi, math.pi, 4001, dtype=torch.float64)[:, None]
    grid = gain[None, :] / (torch.exp(1j * w) - torch.exp(log_lam)[None, :]).abs()
    assert torch.all(grid <= score[None, :] * (1 + 1e-4))  # the scores come from float32 parameters
    at_peak = gain / (torch.exp(1j * log_lam.imag) - torch.exp(log_lam)).abs()
    torch.testing.assert_close(score, at_peak, rtol=1e-4, atol=0)
    assert torch.all(lam < 1)
    for ratio in (0.3, 0.5, 0.95):
        p = aire.plan(model, ratio, "modal")
        for raw_ssm, keep in zip(model.ssms(), p.keep, strict=True):
            s = aire.layer_scores(raw_ssm, "modal")
            k = max(int((1 - ratio) * s.numel() + 1e-9), 1)
            assert len(keep) == k  # the same order in every layer, at least one state
            assert set(keep.tolist()) == set(torch.argsort(s, descending=True)[:k].tolist())
    smaller, p = aire.prune(model, 0.95, "modal")
    assert smaller(torch.randn(2, 5, 1)).shape == (2, 10)


def _slice_by_name(state: dict, plan) -> dict:
    """The sliced model's state dict from the full one by name (independent of `keep_states`): per-state tensors
    indexed on their state axis (C, C2 of S5 on axis 1), everything else as it is."""
    out = {}
    for name, value in state.items():
        parts = name.split(".")
        if parts[0] == "layers" and parts[2] == "ssm" and parts[3] not in ("D",):
            keep = plan.keep[int(parts[1])]
            s5_c = parts[3] in ("C", "C2") and value.dim() == 3 and value.shape[1] == plan.sizes[int(parts[1])]
            per_state = s5_c or value.shape[0] == plan.sizes[int(parts[1])]
            value = value[:, keep] if s5_c else value[keep] if per_state else value
        out[name] = value
    return out


@pytest.mark.parametrize("kind,bidir,mode", [("s5", True, "fft"), ("s5", False, "scan"), ("s4d", True, "fft")])
def test_slice_model_is_exactly_the_model_built_from_the_kept_entries(kind, bidir, mode):
    # slice_model never deep-copies the full model: the sliced SSM layers are built from the kept entries and the rest
    # copied module by module. Its state dict and outputs must equal, bit for bit, a model constructed at the pruned
    # sizes and loaded with the kept entries (the state dict sliced by name), and nothing may be shared with the source.
    torch.manual_seed(4)
    model = SSMClassifier(kind, d_model=8, n_layers=3, state_size=8, bidirectional=bidir, mode=mode, dropout=0.1,
                          ssm_init="hippo" if kind == "s5" else "s4d_lin").eval()
    for ssm in model.ssms():
        _spread_steps(ssm, seed=len(ssm.log_step))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    p = aire.plan(model, 0.5)
    sliced = aire.slice_model(model, p)
    expected = _slice_by_name(model.state_dict(), p)
    reference = SSMClassifier(**dict(model.config, state_counts=p.kept_counts)).eval()
    reference.load_state_dict(expected)
    got = sliced.state_dict()
    assert got.keys() == expected.keys() and sliced.config == reference.config
    for name, value in expected.items():
        assert torch.equal(got[name], value) and got[name].dtype == value.dtype, name
    assert sliced.state_counts() == p.kept_counts and sliced.state_counts() != model.state_counts()
    x = torch.randn(3, 20, 1)
    assert torch.equal(sliced(x), reference(x))
    assert [m.training for m in sliced.modules()] == [False] * len(list(sliced.modules()))
    # a deep copy: no tensor or hook dictionary shared with the source, which is left as it was
    source = {t.data_ptr() for t in model.state_dict().values()}
    assert not any(t.data_ptr() in source for t in got.values())
    assert sliced.encoder._forward_hooks is not model.encoder._forward_hooks
    with torch.no_grad():
        for t in sliced.parameters():
            t.add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(t.requires_grad for t in sliced.parameters())


def test_copy_module_equals_deepcopy_and_keeps_shared_tensors_shared():
    from lit_iclr.aire_prune.modcopy import copy_module

    torch.manual_seed(5)
    model = SSMClassifier("s5", d_model=8, n_layers=2, state_size=8, dropout=0.1).train()
    model.layers[1].out.weight = model.layers[0].out.weight  # a tied weight stays tied in the copy, as with deepcopy
    ours, theirs = copy_module(model), copy.deepcopy(model)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True))
    assert ours.layers[1].out.weight is ours.layers[0].out.weight
    assert ours.layers[0].out.weight is not model.layers[0].out.weight
    assert [type(m) for m in ours.modules()] == [type(m) for m in theirs.modules()]
    assert [m.training for m in ours.modules()] == [m.training for m in theirs.modules()]
    assert ours.config == model.config and ours.config is not model.config
    x = torch.randn(2, 10, 1)
    torch.manual_seed(0)
    a = ours(x)
    torch.manual_seed(0)
    assert torch.equal(a, theirs(x))


@pytest.mark.parametrize("bidir", [False, True])
def test_layers_scored_in_one_pass_equal_layer_by_layer(bidir):
    # aire.plan scores S5 layers of one size in one stacked pass; the terms, normalised scores and keep sets must equal
    # the layer-by-layer path exactly, for every method and both bidirectional forms.
    torch.manual_seed(6)
    model = SSMClassifier("s5", d_model=8, n_layers=4, state_size=8, bidirectional=bidir, dropout=0.0).eval()
    for i, ssm in enumerate(model.ssms()):
        _spread_steps(ssm, seed=i)
    stacked = S5SSM.stacked_modal_terms(model.ssms())
    for i, ssm in enumerate(model.ssms()):
        one = ssm.modal_terms()
        assert torch.equal(stacked["lam_abs"][i], one["lam_abs"]) and torch.equal(stacked["b_norm2"][i], one["b_norm2"])
        assert torch.equal(stacked["c_norm2"][:, i], one["c_norm2"])
    for method in ("aire", "last", "magnitude", "modal"):
        for form in ("intended", "quirk"):
            raw = [aire.layer_scores(ssm, method, form) for ssm in model.ssms()]
            for ratio in (0.3, 0.5, 0.9):
                got, want = aire.plan(model, ratio, method, form), aire.plan_from_scores(raw, ratio, method)
                assert [k.tolist() for k in got.keep] == [k.tolist() for k in want.keep] and got.threshold == want.threshold
                assert all(torch.equal(a, b) for a, b in zip(got.normalized, want.normalized, strict=True))
    # layers of different sizes (a pruned model) are not stacked: scored layer by layer
    assert S5SSM.stacked_modal_terms(aire.prune(model, 0.5)[0].ssms()) is None
