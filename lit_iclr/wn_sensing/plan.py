"""`cli.py plan` hooks of WN matrix sensing (see `lit_iclr/core/plan.py`).

A step is one full-gradient iteration over all n measurements: the "batch" is the whole problem, the (n, m^2) Gaussian
operator and y (n,), and the loss is f(X, Theta) = 1/4 ||M(X Theta X^T) - y||^2. `batch_size` does not change it.
"""
from __future__ import annotations

import math

import torch

from .problem import degrees_of_freedom
from .sensing import SensingOperator, loss


def _n(datamodule) -> int:
    return int(math.ceil(datamodule.measurements_per_dof * degrees_of_freedom(datamodule.dim, datamodule.true_rank)))


def example_batch(datamodule, batch_size: int = 1, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    m, n = datamodule.dim, _n(datamodule)
    width = m * m if datamodule.operator == "gaussian" else m
    return {"sensing": torch.zeros(n, width, dtype=torch.float64, device=device),
            "y": torch.zeros(n, dtype=torch.float64, device=device),
            "operator": datamodule.operator, "dim": m}


def step_loss(module, batch) -> torch.Tensor:
    op = SensingOperator(batch["operator"], batch["sensing"], batch["dim"])
    return loss(op, batch["y"], *module.factor())


def dataset(dim: int = 100, rank: int = 5, oversampling: float = 8.0) -> dict:
    n = int(math.ceil(oversampling * degrees_of_freedom(dim, rank)))
    return {"name": f"synthetic Gaussian sensing, m={dim}, r_A={rank}, n={n} (generated, no download)",
            "bytes": 8.0 * n * dim * dim, "samples": 1,
            "source": "problem.npz of the paper config: the float64 (n, m^2) operator dominates"}


DATASET = dataset()
PAPER = {"params": None, "params_source": "not stated (theory paper; the factor has m r + r^2 = 2,400 entries)",
         "steps": 2000, "accelerator": "H100",
         "note": "full-batch Riemannian GD; sizes and iteration count reconstructed (configs/paper/wn_sensing.yaml)"}
