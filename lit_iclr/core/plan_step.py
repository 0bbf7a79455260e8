"""The loss of one `training_step` without Lightning: for the methods' `plan.py` (`step_loss`) and paper-scale tests.

`training_loss(module, batch)` runs `module.training_step(batch, 0)` with `log`, `log_dict` and `log_train` silenced
(they need a Trainer) and returns the scalar loss it backpropagates (a tensor, or a step output dict's `loss`).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def quiet_logging(module):
    """`module.log`, `log_dict` and `log_train` do nothing inside the block (no Trainer is attached)."""
    names = [n for n in ("log", "log_dict", "log_train") if hasattr(module, n)]
    for n in names:
        setattr(module, n, lambda *a, **k: None)
    try:
        yield module
    finally:
        for n in names:
            module.__dict__.pop(n, None)


def training_loss(module, batch, batch_idx: int = 0) -> torch.Tensor:
    """The loss `training_step(batch, batch_idx)` returns, computed without a Trainer."""
    with quiet_logging(module):
        out = module.training_step(batch, batch_idx)
    return out["loss"] if isinstance(out, dict) else out
