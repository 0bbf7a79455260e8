"""Manual optimisation without Lightning's per-call wrappers, where those wrappers would do nothing.

With manual optimisation, `self.manual_backward(loss)` and `opt.step()` on a `LightningOptimizer` go through the
strategy and the precision plugin, which dispatch `on_before_backward`, `on_after_backward` and
`on_before_optimizer_step` to every callback and to the module (a profiler context and a `state_key` per callback per
call) before they reach `loss.backward()` and `optimizer.step()`. On one device in fp32, with no callback, module or
profiler that uses those hooks, every one of those dispatches is a no-op, and they cost about 1 ms of CPU per gradient
step of a two-optimizer module (VGF), a few per cent of a small step. `DirectManualOptimization` checks this once per fit
and then sends the two calls straight to PyTorch; the optimizer-step counter behind `global_step` is advanced as
Lightning advances it, so step counts, logging steps, checkpoints and results are unchanged (tested against the wrapped
path). In any other case (DDP, mixed precision, a profiler, a hook in use) Lightning's path is kept.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden

MODULE_HOOKS = ("on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step")
CALLBACK_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")


def wrappers_are_no_ops(trainer: L.Trainer, module: L.LightningModule) -> str | None:
    """None when Lightning's manual-optimisation wrappers would only call PyTorch; else the reason they would not."""
    if module.automatic_optimization:
        return "automatic optimisation"
    if type(trainer.strategy) is not SingleDeviceStrategy or type(trainer.precision_plugin) is not Precision:
        return f"strategy {type(trainer.strategy).__name__} / precision {type(trainer.precision_plugin).__name__}"
    if not isinstance(trainer.profiler, PassThroughProfiler):
        return f"profiler {type(trainer.profiler).__name__}"
    if getattr(module, "_fabric", None) is not None:
        return "module attached to Fabric"
    for hook in MODULE_HOOKS:
        if is_overridden(hook, module, L.LightningModule):
            return f"module overrides {hook}"
    for cb in trainer.callbacks:
        for hook in CALLBACK_HOOKS:
            if is_overridden(hook, cb, Callback):
                return f"callback {type(cb).__name__} overrides {hook}"
    return None


def _direct_step(lightning_optimizer, closure=None, **kwargs: Any) -> Any:
    """`LightningOptimizer.step` minus the strategy / precision dispatch: the manual loop's step counter (which
    `global_step` reads) is advanced by the same callbacks Lightning's own step calls."""
    lightning_optimizer._on_before_step()
    out = lightning_optimizer.optimizer.step(**kwargs) if closure is None else lightning_optimizer.optimizer.step(closure,
                                                                                                              **kwargs)
    lightning_optimizer._on_after_step()
    return out


class DirectManualOptimization(Callback):
    """Per fit: when `wrappers_are_no_ops`, `manual_backward` calls `loss.backward` and each optimizer's `step` calls
    the torch optimizer directly (see the module docstring). `reason` tells why not, when not."""

    def __init__(self):
        self.reason: str | None = "not started"

    def on_train_start(self, trainer, pl_module) -> None:
        self.reason = wrappers_are_no_ops(trainer, pl_module)
        direct = self.reason is None
        pl_module.__dict__["_direct_manual"] = direct  # read by BaseModule.manual_backward
        for opt in trainer.strategy._lightning_optimizers:
            if direct:
                opt.step = partial(_direct_step, opt)
            else:
                opt.__dict__.pop("step", None)

    def on_train_end(self, trainer, pl_module) -> None:
        pl_module.__dict__["_direct_manual"] = False
        for opt in trainer.strategy._lightning_optimizers:
            opt.__dict__.pop("step", None)
