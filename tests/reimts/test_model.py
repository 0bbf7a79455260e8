"""Backbones and ReIMTS: attention against explicit softmax loops, structural properties that must hold exactly."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.reimts.backbones import MTAN, GatedFusion, GraFITi, per_channel_attention, segment_softmax
from lit_iclr.reimts.model import ReIMTS
from lit_iclr.reimts.module import masked_errors

from .test_split import random_batch


def queries(B, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    q_time = torch.tensor([36.0, 37.0, 38.0]).expand(B, 3) / 48
    q_mask = (torch.rand(B, 3, V, generator=g) < 0.6).float()
    q_mask[:, 0, 0] = 1
    return q_time, q_mask


def test_per_channel_attention_equals_masked_softmax_loop():
    g = torch.Generator().manual_seed(0)
    R, H, Nq, L, C = 2, 2, 3, 5, 4
    scores = torch.randn(R, H, Nq, L, generator=g) * 3
    vals = torch.randn(R, L, C, generator=g)
    mask = (torch.rand(R, L, C, generator=g) < 0.5).float()
    mask[0, :, 1] = 0  # a channel never observed -> 0
    got = per_channel_attention(scores, vals, mask)
    for r in range(R):
        for c in range(C):
            obs = mask[r, :, c] > 0
            for h in range(H):
                for q in range(Nq):
                    want = (torch.softmax(scores[r, h, q, obs], 0) * vals[r, obs, c]).sum() if obs.any() else 0.0
                    assert got[r, h, q, c] == pytest.approx(float(want), abs=1e-5)


def test_segment_softmax_equals_per_group_softmax():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(9, 2, generator=g) * 5
    group = torch.tensor([0, 2, 2, 0, 1, 2, 0, 1, 1])
    got = segment_softmax(scores, group, 4)  # group 3 has no edge
    for k in range(3):
        torch.testing.assert_close(got[group == k], torch.softmax(scores[group == k], 0))


def test_grafiti_is_invariant_to_slot_order_and_reads_only_queries():
    torch.manual_seed(0)
    x, mask, t = random_batch(B=3, V=4)
    q_time, q_mask = queries(3, 4)
    net = GraFITi(4, d_model=8, n_layers=2, n_heads=2)
    out, rep = net(x, mask, t, q_time, q_mask)
    perm = torch.randperm(x.shape[1])  # a graph has no slot order: same observations, same forecast
    out_p, rep_p = net(x[:, perm], mask[:, perm], t[:, perm], q_time, q_mask)
    torch.testing.assert_close(out, out_p, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rep, rep_p, atol=1e-5, rtol=1e-5)
    assert torch.all(out[q_mask == 0] == 0) and rep.shape == (3, 4, 8)
    # an unobserved cell's value must not matter
    x2 = x.clone()
    x2[mask == 0] = 123.0
    torch.testing.assert_close(net(x2, mask, t, q_time, q_mask)[0], out)


def test_gated_fusion_with_zero_representation_is_identity():
    f = GatedFusion(6)
    h = torch.randn(4, 6)
    torch.testing.assert_close(f(h, torch.zeros(4, 6)), h)
    r = torch.randn(4, 6)
    torch.testing.assert_close(f(h, r), h + torch.sigmoid(f.gate(r)) * r)


def test_mtan_pass_down_interpolates_the_parent_in_time():
    net = MTAN(3, d_model=4, n_ref=8, fusion=True)
    p_start, p_end = torch.tensor([0.0, 0.0]), torch.tensor([39.0, 39.0]) / 48
    ref = net.ref_times(p_start, p_end)  # (2, 8)
    a, b = torch.randn(2, 1, 4), torch.randn(2, 1, 4)
    rep = a + b * ref.unsqueeze(-1)  # a representation linear in time is interpolated exactly
    c_start = torch.tensor([0.0, 24.0, 0.0, 24.0]) / 48
    c_end = torch.tensor([24.0, 39.0, 24.0, 39.0]) / 48
    got = net.pass_down(rep, 2, c_start, c_end, p_start.repeat_interleave(2), p_end.repeat_interleave(2))
    tau = net.ref_times(c_start, c_end).clamp(float(ref[0, 0]), float(ref[0, -1]))
    want = a.repeat_interleave(2, 0) + b.repeat_interleave(2, 0) * tau.unsqueeze(-1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backbone", ["grafiti", "mtan"])
def test_single_level_reimts_is_the_backbone(backbone):
    torch.manual_seed(0)
    x, mask, t = random_batch(B=3, V=4)
    q_time, q_mask = queries(3, 4)
    m = ReIMTS(backbone, 4, [39.0], 36.0, 48.0, backbone_kwargs={"d_model": 8})
    out = m(x, mask, t, q_time, q_mask)["pred"]
    B = x.shape[0]
    want, _ = m.levels[0](x, mask, t, q_time, q_mask, torch.zeros(B), torch.full((B,), 39 / 48))
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("backbone, periods, align", [("grafiti", [39.0, 24.0, 12.0], "start"), ("mtan", [39.0, 24.0], "start"),
                                                      ("grafiti", [39.0, 24.0, 12.0], "end")])
def test_parent_information_reaches_the_horizon_subsample_only_through_fusion(backbone, periods, align):
    """The horizon sub-sample ([36, 39) / [24, 39), or [27, 39) end-aligned) holds no observation of hour 2: it can
    only know about it through the representations passed down; with the fusion off it must not depend on it at all."""
    torch.manual_seed(0)
    x, mask, t = random_batch(B=2, V=3)
    t[:, 0] = 2 / 48
    mask[:, 0] = 1
    q_time, q_mask = queries(2, 3)
    x2 = x.clone()
    x2[:, 0] += 5.0
    for fusion in (True, False):
        m = ReIMTS(backbone, 3, periods, 36.0, 48.0, fusion=fusion, backbone_kwargs={"d_model": 8}, align=align)
        with torch.no_grad():
            for p in m.parameters():  # make the gates clearly open
                p.add_(torch.randn_like(p) * 0.3)
        with torch.no_grad():
            a, b = m(x, mask, t, q_time, q_mask)["pred"], m(x2, mask, t, q_time, q_mask)["pred"]
        diff = float(((a - b) * q_mask).abs().max())
        assert (diff > 1e-4) if fusion else (diff == 0.0)
    assert m.horizon_index == len(m(x, mask, t, q_time, q_mask)["pred_all"][0]) - 1


def test_masked_errors_ignore_unobserved_points():
    pred, y = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.0, 0.0, 7.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    se, ae, n = masked_errors(pred, y, mask)
    assert (se, ae, n) == (1.0 + 16.0, 1.0 + 4.0, 2.0)


@pytest.mark.parametrize("backbone, periods, align", [
    ("grafiti", [39.0, 24.0, 12.0], "start"), ("mtan", [39.0, 24.0, 12.0], "start"), ("mtan", [39.0, 10.0], "start"),
    ("grafiti", [39.0, 24.0, 12.0], "end"), ("mtan", [39.0, 10.0], "end")])
def test_horizon_path_only_gives_the_same_forecast(backbone, periods, align):
    torch.manual_seed(0)
    x, mask, t = random_batch(B=4, V=3)
    q_time, q_mask = queries(4, 3)
    m = ReIMTS(backbone, 3, periods, 36.0, 48.0, backbone_kwargs={"d_model": 8}, align=align)
    with torch.no_grad():
        full = m(x, mask, t, q_time, q_mask)
        path = m(x, mask, t, q_time, q_mask, horizon_only=True)
    torch.testing.assert_close(path["pred"], full["pred"], atol=1e-5, rtol=1e-5)
    assert m.horizon_path()[0] == 0 and m.horizon_path()[-1] == m.horizon_index == full["pred_all"].shape[1] - 1


@pytest.mark.slow  # tracing with dynamic shapes takes ~1 min of CPU
def test_compiled_forward_and_gradients_agree_with_eager():
    """`compile: true` (static slot padding, GraFITi's edge extraction as an eager island) gives the eager numbers."""
    from lit_iclr.reimts.module import IMTSForecaster

    torch.manual_seed(0)
    x, mask, t = random_batch(B=4, V=3)
    q_time, q_mask = queries(4, 3)
    batch = {"x": x, "x_mask": mask, "x_time": t, "y_time": q_time, "y_mask": q_mask}
    kw = dict(n_vars=3, d_model=8, n_layers=1, n_heads=2, periods=[24.0, 12.0], plot_every_n_epochs=0)
    eager = IMTSForecaster(**kw)
    compiled = IMTSForecaster(**kw, compile=True, compile_options={"backend": "aot_eager"})
    compiled.load_state_dict(eager.state_dict())
    assert compiled.net.static_slots and not eager.net.static_slots
    outs = []
    for m in (eager, compiled):
        pred = m(batch)["pred"]
        (pred**2 * q_mask).sum().backward()
        # a parameter the forecast does not use has no gradient in eager mode and a zero one in the compiled graph
        outs.append((pred.detach(), [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in m.parameters()]))
    torch.testing.assert_close(outs[1][0], outs[0][0], atol=1e-5, rtol=1e-5)
    assert sum(int(g.abs().sum() > 0) for g in outs[0][1]) > 20  # the gradients reach most parameters
    for a, b in zip(outs[0][1], outs[1][1], strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    assert compiled._compiled_forward is not None and "_compiled_forward" not in dict(compiled.named_modules())


def test_naive_forecasts_are_the_last_observed_value_and_the_lookback_mean():
    from lit_iclr.reimts.module import naive_forecasts

    # one record, 3 lookback slots (the last padded), 2 variables; variable 1 is never observed
    x = torch.tensor([[[1.0, 9.0], [3.0, 9.0], [0.0, 0.0]]])
    m = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]])
    batch = {"x": x, "x_mask": m, "x_time": torch.tensor([[0.1, 0.4, 0.0]]), "y": torch.zeros(1, 2, 2)}
    out = naive_forecasts(batch)
    assert out["last_value"].shape == (1, 2, 2)
    assert torch.equal(out["last_value"][0, :, 0], torch.tensor([3.0, 3.0]))  # the slot at t=0.4, not the padding
    assert torch.equal(out["lookback_mean"][0, :, 0], torch.tensor([2.0, 2.0]))
    assert torch.equal(out["last_value"][0, :, 1], torch.zeros(2)) and torch.equal(out["lookback_mean"][0, :, 1],
                                                                                   torch.zeros(2))
