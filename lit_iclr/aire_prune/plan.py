"""Paper-scale plan hooks of AIRE-Prune (`cli.py plan`, see `lit_iclr/core/plan.py`).

A batch is what `ListOpsData` yields: `max_len` token ids per sequence (padded with id 0), the mask of real tokens
and the label. The plan uses full-length sequences (LRA ListOps sources are 500-2000 tokens, padded to 2048).
"""
from __future__ import annotations

import torch

from lit_iclr.core.plan_step import training_loss

DATASET = {
    "name": "LRA ListOps (lra_release/listops-1000: basic_train/val/test.tsv)",
    "bytes": 100_000 * 4.5e3,  # 100k sources of ~1,000 tokens at ~4.5 bytes per token of text
    "samples": 96_000,
    "source": "LRA (Tay et al. 2021): 96k / 2k / 2k ListOps examples of 500-2000 tokens",
}

PAPER = {"params": None, "params_source": None, "steps": None, "accelerator": "H100",
         "note": "no parameter count stated; S5 ListOps settings of the official launch script"}


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    L = datamodule.max_len or 2048
    return {"x": torch.ones(batch_size, L, dtype=torch.long, device=device),
            "x_mask": torch.ones(batch_size, L, dtype=torch.bool, device=device),
            "y": torch.zeros(batch_size, dtype=torch.long, device=device)}


def step_loss(module, batch) -> torch.Tensor:
    """The cross-entropy `training_step` returns, without logging."""
    return training_loss(module, batch)
