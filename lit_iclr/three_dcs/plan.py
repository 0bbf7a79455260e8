"""`cli.py plan` hooks of 3DCS (see `lit_iclr/core/plan.py`).

A batch is QM9 molecules padded to QM9's largest (29 atoms with hydrogens): atomic numbers `z`, positions `pos` and the
standardised target `y`; the loss is `training_step`'s MSE. The 3DCS scoring (embedding every benchmark conformer, then
the GCE metrics on the CPU) runs at validation and is not part of the step.
"""
from __future__ import annotations

import torch

MAX_ATOMS = 29  # QM9: at most 9 heavy atoms, 29 atoms with hydrogens


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    z = dict(device=device)
    return {"z": torch.ones(batch_size, MAX_ATOMS, dtype=torch.long, **z), "pos": torch.zeros(batch_size, MAX_ATOMS, 3, **z),
            "y": torch.zeros(batch_size, **z)}


def step_loss(module, batch) -> torch.Tensor:
    pred, _ = module(batch["z"], batch["pos"])
    return torch.nn.functional.mse_loss(pred, batch["y"])


DATASET = {"name": "QM9 (qm9pack CSV), 110,000 training molecules", "bytes": 1.5e8, "samples": 110_000,
           "source": "QM9: 133,885 molecules; about 150 MB as CSV with coordinates (reconstructed)"}
PAPER = {"params": None, "params_source": "not stated (a benchmark; the encoders are other papers')", "steps": None,
         "accelerator": "H100", "note": "the benchmark's scoring (10M rotation conformers embedded) is not in the step"}
