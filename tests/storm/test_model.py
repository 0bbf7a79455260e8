"""STORM network and module: multi-resolution heads, consistency loss, rollout, ablation switches, odd grids."""
from __future__ import annotations

import torch

from lit_iclr.storm.module import STORM
from lit_iclr.storm.pyramid import down


def batch(B=2, C=3, H=16, W=32, leads=(1, 2)):
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(B, 2, C, H, W, generator=g), "y": torch.randn(B, len(leads), C, H, W, generator=g),
            "static": torch.randn(B, 1, H, W, generator=g), "lead_steps": torch.tensor([list(leads)] * B),
            "init_time": torch.full((B,), 262968.0, dtype=torch.float64),
            "y_clim": torch.zeros(B, len(leads), C, H, W)}


def module(**kw):
    args = dict(num_channels=3, num_static=1, history=2, latitudes=[-84.375 + 11.25 * i for i in range(16)],
                longitudes=[11.25 * i for i in range(32)], hidden=[8, 8, 8], num_blocks=1)
    args.update(kw)
    torch.manual_seed(0)
    m = STORM(**args)
    m.log = lambda *a, **k: None
    return m


def test_heads_at_every_resolution_and_consistency_term_matches_definition():
    m = module()
    b = batch()
    with torch.no_grad():
        out = m.step(b["x"], b["static"], b["init_time"])
    assert [o.shape[-2:] for o in out] == [(16, 32), (8, 16), (4, 8)]
    fit, cons = m.multires_loss(out, b["y"][:, 0])
    w = m.w
    want_cons = sum((((down(out[s]) - out[s + 1]) ** 2 * down(w if s == 0 else down(w))).sum((-2, -1))
                     / down(w if s == 0 else down(w)).sum()).mean() for s in range(2))
    torch.testing.assert_close(cons, want_cons)
    assert fit > 0 and cons > 0


def test_rollout_feeds_its_own_forecast_back():
    m = module()
    b = batch()
    with torch.no_grad():
        preds = m.rollout(b["x"], b["static"], b["init_time"], 2)
        first = m.step(b["x"], b["static"], b["init_time"])[0]
        window = torch.cat([b["x"][:, 1:], first[:, None]], 1)
        second = m.step(window, b["static"], b["init_time"] + 6)[0]
    torch.testing.assert_close(preds[0][0], first)
    torch.testing.assert_close(preds[1][0], second)


def test_training_reduces_the_loss_and_gradients_reach_every_scale():
    m = module()
    b = batch()
    b["y"] = b["x"][:, -1:].repeat(1, 2, 1, 1, 1) * 0.9  # a learnable target
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = m.training_step(b, 0)
        opt.zero_grad()
        loss.backward()
        if not losses:
            assert all(m.net.encoders[s].cand.weight.grad.abs().sum() > 0 for s in range(3))
            assert m.net.exchange[0].f2c[0].weight.grad.abs().sum() > 0
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_ablations_and_single_scale_and_spectral_options():
    assert module(cross_scale=False).net.exchange is None
    single = module(num_scales=1, hidden=[12])
    b = batch()
    with torch.no_grad():
        assert len(single.step(b["x"], b["static"], b["init_time"])) == 1
        spec = module(decomposition="spectral", encoder="attention")
        assert spec(b["x"], b["static"], b["init_time"], 2).shape == (2, 2, 3, 16, 32)


def test_regional_grid_not_divisible_is_padded_and_cropped():
    m = module(latitudes=[20.0 + 1.5 * i for i in range(13)], longitudes=[100.0 + 1.5 * i for i in range(22)],
               periodic=False)
    assert m.pad == (3, 2) and m.w[-3:].abs().sum() == 0  # padded rows carry no loss weight
    b = batch(H=13, W=22)
    with torch.no_grad():
        assert m(b["x"], b["static"], b["init_time"], 3).shape == (2, 3, 3, 13, 22)
    assert torch.isfinite(m.training_step(b, 0))


def test_coarsened_model_forecasts_the_coarse_grid():
    m = module(coarsen=1, num_scales=2, hidden=[8, 8])
    b = batch()
    with torch.no_grad():
        assert m(b["x"], b["static"], b["init_time"], 1).shape == (2, 1, 3, 8, 16)
