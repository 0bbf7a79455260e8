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
        out = m.step(b["x"], b["static"], b["init_time"])[0]
    assert [o.shape[-2:] for o in out] == [(16, 32), (8, 16), (4, 8)]
    fit, cons = m.multires_loss(out, b["y"][:, 0])
    w = m.w
    lat = torch.tensor([-84.375 + 11.25 * i for i in range(16)], dtype=torch.float64)
    a = [torch.cos(torch.deg2rad(lat)), torch.cos(torch.deg2rad(lat)).reshape(8, 2).mean(1)]
    want_cons = sum((((area_down(out[s], a[s]) - out[s + 1]) ** 2 * down(w if s == 0 else down(w))).sum((-2, -1))
                     / down(w if s == 0 else down(w)).sum()).mean() for s in range(2))
    torch.testing.assert_close(cons, want_cons)
    assert fit > 0 and cons > 0


def area_down(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """2x2 cells weighted by cos(latitude) a (H,), written out with reshapes (independent of pyramid.down)."""
    *lead, H, W = x.shape
    cells = x.double().reshape(*lead, H // 2, 2, W // 2, 2)
    wts = a.reshape(H // 2, 2, 1, 1).expand(H // 2, 2, W // 2, 2)
    return ((cells * wts).sum((-3, -1)) / wts.sum((-3, -1))).to(x.dtype)


def test_coarse_heads_are_reported_next_to_the_downsampled_finest_forecast():
    m = module()
    b = batch()
    with torch.no_grad():
        out = m.step(b["x"], b["static"], b["init_time"])[0]
        got = m.coarse_rmse(out, b["y"][:, 0])
    lat = torch.tensor([-84.375 + 11.25 * i for i in range(16)], dtype=torch.float64)
    a0 = torch.cos(torch.deg2rad(lat))
    a1 = a0.reshape(8, 2).mean(1)
    y1, y2 = area_down(b["y"][:, 0], a0), area_down(area_down(b["y"][:, 0], a0), a1)
    f1, f2 = area_down(out[0], a0), area_down(area_down(out[0], a0), a1)
    wl = [a1[:, None].expand(8, 16), a1.reshape(4, 2).mean(1)[:, None].expand(4, 8)]  # cos-latitude loss weights

    def rmse(p, t, w):
        return ((((p.double() - t.double()) ** 2) * w).sum((-2, -1)) / w.sum()).mean().sqrt()

    want = [(rmse(out[1], y1, wl[0]), rmse(f1, y1, wl[0])), (rmse(out[2], y2, wl[1]), rmse(f2, y2, wl[1]))]
    for (gh, gd), (wh, wd) in zip(got, want, strict=True):
        torch.testing.assert_close(gh.double(), wh, rtol=1e-4, atol=0)
        torch.testing.assert_close(gd.double(), wd, rtol=1e-4, atol=0)
    # a head that only copies Down(fine) scores exactly the baseline
    copied = [out[0], area_down(out[0], a0), area_down(area_down(out[0], a0), a1)]
    for head, down_fine in m.coarse_rmse(copied, b["y"][:, 0]):
        torch.testing.assert_close(head, down_fine)


def test_wind_channels_flip_sign_across_the_pole_in_the_network():
    m = module(num_channels=4, channel_names=["geopotential_500", "u_component_of_wind_500",
                                              "v_component_of_wind_500", "10m_u_component_of_wind"])
    assert m.net.pole_sign.tolist() == [1.0, -1.0, -1.0, -1.0]
    assert m.net.encoders[0].gates.pole_sign[:4].tolist() == [1.0, -1.0, -1.0, -1.0]
    assert (m.net.encoders[0].gates.pole_sign[4:] == 1).all()
    assert module(num_channels=2, periodic=False).net.pole_sign is None  # a regional box has no pole


def test_rollout_feeds_its_own_forecast_back():
    """Without carried state each step re-encodes the last `history` frames; with it (the default) the ConvGRU's
    memory runs through the rollout, so step 2 equals encoding the whole trajectory x_{t-1}, x_t, y_hat_{t+1} at once."""
    b = batch()
    for carry in (False, True):
        m = module(carry_state=carry)
        with torch.no_grad():
            preds = m.rollout(b["x"], b["static"], b["init_time"], 2)
            first = m.step(b["x"], b["static"], b["init_time"])[0][0]
            frames = torch.cat([b["x"], first[:, None]], 1)
            second = m.step(frames if carry else frames[:, 1:], b["static"], b["init_time"] + 6)[0][0]
        torch.testing.assert_close(preds[0][0], first)
        torch.testing.assert_close(preds[1][0], second)
        if carry:  # and it is not what re-encoding the window gives
            assert not torch.allclose(second, m.step(frames[:, 1:], b["static"], b["init_time"] + 6)[0][0])


def test_carried_attention_cache_equals_re_encoding_the_window():
    # the attention encoder's state is the embeddings of the last `history` frames: carrying it is exact
    b = batch()
    with torch.no_grad():
        a = module(encoder="attention", carry_state=True).rollout(b["x"], b["static"], b["init_time"], 3)
        c = module(encoder="attention", carry_state=False).rollout(b["x"], b["static"], b["init_time"], 3)
    for pa, pc in zip(a, c, strict=True):
        for sa, sc in zip(pa, pc, strict=True):
            torch.testing.assert_close(sa, sc)


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
        assert len(single.step(b["x"], b["static"], b["init_time"])[0]) == 1
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


def test_compiled_step_agrees_with_eager_forward_and_backward():
    """`compile_step: true` runs the model step through torch.compile (aot_eager here: AOTAutograd traces forward and
    backward, no C++ build); a 2-step rollout loss and every gradient equal the eager ones. Two scales keep the
    tracing short (~20 s CPU here)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    b = batch(leads=(1, 2))
    counter = CompileCounterWithBackend("aot_eager")
    grads = []
    try:
        for compiled in (False, True):
            m = module(num_scales=2, hidden=[4, 4], compile_step=compiled,
                       compile_options={"backend": counter, "fullgraph": True, "dynamic": False})
            loss = m.training_step(b, 0)
            loss.backward()
            grads.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))
    finally:
        torch._dynamo.reset()
    assert counter.frame_count == 2  # the compiled path ran: the full window first, then the carried single frame
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-5, atol=1e-6)
    for ge, gc in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(gc, ge, rtol=1e-4, atol=1e-6)


def test_num_threads_holds_while_the_module_runs_and_is_restored_after():
    import lightning as L

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        m = module(num_threads=1)
        m.trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False)
        m.setup("fit")
        assert torch.get_num_threads() == 1
        m.teardown("fit")
        assert torch.get_num_threads() == 2
        m = module(num_threads=None)  # None leaves torch's setting alone
        m.trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False)
        m.setup("fit")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
