"""Paper-scale plan hooks of STORM (`cli.py plan`, see `lit_iclr/core/plan.py`).

The paper's data and sizes were not found (abstract only): configs/paper/storm.yaml is reconstructed, and PAPER states
no parameter count. A batch is what `WB2WeatherData` yields: `history` input frames and one target frame per training
lead of the C forecast channels on the (lat, lon) grid the DataModule reports, the static fields, the leads in model
steps and the initialisation time (hours since 1970, float64).
"""
from __future__ import annotations

import torch

from lit_iclr.core.plan_step import training_loss

DATASET = {
    "name": "ERA5, WeatherBench 2 5.625 deg (64 x 32), 6-hourly, 1979-2018 (reconstructed choice)",
    "bytes": 58_440 * 8 * 64 * 32 * 4,  # 6-hourly steps 1979-2018 x 8 channels x 64 x 32 float32 (the variables read)
    "samples": 54_056,  # 6-hourly initialisations of 1979-2015 (training period)
    "source": "WB2 store layout; size of the 8 channels read over 1979-2018 in float32",
}

PAPER = {"params": None, "params_source": None, "steps": None, "accelerator": "H100",
         "note": "abstract only: sizes, data and schedule reconstructed"}


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    dm, B = datamodule, batch_size
    H, W, C = len(dm.latitudes), len(dm.longitudes), dm.num_channels
    leads = [h // dm.step_hours for h in dm.lead_times]
    return {
        "x": torch.zeros(B, dm.history, C, H, W, device=device),
        "y": torch.zeros(B, len(leads), C, H, W, device=device),
        "static": torch.zeros(B, dm.num_static, H, W, device=device),
        # read on the host by training_step (`.tolist()`): kept on the CPU
        "lead_steps": torch.tensor([leads] * B, dtype=torch.long),
        "init_time": torch.full((B,), 420_000.0, dtype=torch.float64, device=device),
    }


def step_loss(module, batch) -> torch.Tensor:
    """The rollout loss `training_step` returns (multi-resolution fit + consistency), without logging."""
    return training_loss(module, batch)
