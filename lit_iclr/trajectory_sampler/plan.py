"""`cli.py plan` hooks of the trajectory sampler (see `lit_iclr/core/plan.py`).

The gradient part is the predictor's training (MSE on measured scores), whose checkpoints the sampler anneals across;
the sampler itself (Gibbs-with-Gradients / MALA on each checkpoint) is a `predict` run costing one forward and one input
gradient of the predictor per chain per MCMC step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    shape = datamodule.expected_shape()
    return {"x": torch.zeros(batch_size, *shape, device=device), "y": torch.zeros(batch_size, device=device)}


def step_loss(module, batch) -> torch.Tensor:
    return F.mse_loss(module(batch["x"]), batch["y"])  # LandscapePredictor.training_step


DATASET = {"name": "TFBind8 (design-bench; Barrera et al. 2016 PBM 8-mer affinities)", "bytes": 1.2e6, "samples": 65_536,
           "source": "4^8 sequences x (9-byte FASTA line + ~20-byte score line)"}
PAPER = {"params": None, "params_source": "not stated (predictor architecture not found)", "steps": None,
         "accelerator": "H100", "note": "predictor and schedule reconstructed; the sampler adds forward/gradient evaluations"}
