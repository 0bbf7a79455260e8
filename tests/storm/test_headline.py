"""The run summary's headline: persistence logged at every evaluation equals a hand computation; the headline names it."""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from lit_iclr.core.summary import headline_lines
from lit_iclr.storm.module import STORM

LAT = [-84.375 + 11.25 * i for i in range(16)]


def evaluated(prefix: str, batches: list[dict], **kw) -> dict[str, float]:
    """Run the module's evaluation hooks on `batches` and return what it logged (no trainer)."""
    torch.manual_seed(0)
    m = STORM(num_channels=2, num_static=1, history=2, latitudes=LAT, longitudes=[11.25 * i for i in range(32)],
              hidden=[8, 8, 8], num_blocks=1, **kw)
    m._trainer = SimpleNamespace(sanity_checking=True)  # only read to skip the validation figure
    logged: dict[str, float] = {}
    m.log = lambda name, value, **_: logged.__setitem__(name, float(value))
    start, step, end = ((m.on_test_epoch_start, m.test_step, m.on_test_epoch_end) if prefix == "test" else
                        (m.on_validation_epoch_start, m.validation_step, m.on_validation_epoch_end))
    start()
    with torch.no_grad():
        for i, b in enumerate(batches):
            step(b, i)
    end()
    return logged


def hand_batch(a: torch.Tensor, leads=(1, 4)) -> dict:
    """Last input frame 0 everywhere; the truth at every lead is the constant a[b, c] over the whole grid, so the
    latitude-weighted spatial MSE of persistence is a[b, c]^2 for any weights."""
    B, C = a.shape
    x = torch.randn(B, 2, C, 16, 32)
    x[:, -1] = 0.0
    y = a[:, None, :, None, None].expand(B, len(leads), C, 16, 32).clone()
    y[:, 1] *= 2  # the longer lead is twice as far off: MSE (2a)^2
    return {"x": x, "y": y, "static": torch.randn(B, 1, 16, 32), "lead_steps": torch.tensor([list(leads)] * B),
            "init_time": torch.full((B,), 262968.0, dtype=torch.float64), "y_clim": torch.zeros_like(y)}


def test_logged_persistence_equals_hand_computation():
    a1 = torch.tensor([[1.0, 3.0], [2.0, -1.0]])
    a2 = torch.tensor([[0.5, 0.0]])
    got = evaluated("val", [hand_batch(a1), hand_batch(a2)])
    # RMSE per channel = sqrt(mean over the 3 initialisations of a^2), then the mean over the 2 channels
    ch0 = math.sqrt((1.0 + 4.0 + 0.25) / 3)
    ch1 = math.sqrt((9.0 + 1.0 + 0.0) / 3)
    assert math.isclose(got["val/rmse_norm_6h/persistence"], (ch0 + ch1) / 2, rel_tol=1e-6)
    assert math.isclose(got["val/rmse_norm_24h/persistence"], 2 * (ch0 + ch1) / 2, rel_tol=1e-6)
    # climatology (zero here) scores like persistence on this case; the model's own forecast does not
    assert math.isclose(got["val/rmse_norm_6h/climatology"], (ch0 + ch1) / 2, rel_tol=1e-6)
    assert not math.isclose(got["val/rmse_norm_6h/model"], got["val/rmse_norm_6h/persistence"], rel_tol=1e-3)


def test_persistence_is_logged_in_test_too_and_the_headline_reads_it():
    got = evaluated("test", [hand_batch(torch.tensor([[1.0, 1.0]]), leads=(1, 12))], headline_lead=72)
    assert math.isclose(got["test/rmse_norm_72h/persistence"], 2.0, rel_tol=1e-6)
    torch.manual_seed(0)
    m = STORM(num_channels=2, num_static=1, history=2, latitudes=LAT, longitudes=[11.25 * i for i in range(32)],
              hidden=[8, 8, 8], num_blocks=1, headline_lead=72)
    head = m.headline()
    assert head.metric.format(stage="test") == "test/rmse_norm_72h/model" and not head.higher_is_better
    assert head.baselines["persistence"].format(stage="test") == "test/rmse_norm_72h/persistence"
    text = "\n".join(headline_lines(got, head, "test"))
    assert "persistence" in text and "2" in text and "STORM" in text
