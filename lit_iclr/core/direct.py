"""Optimisation without Lightning's per-call wrappers, where those wrappers would do nothing.

Between a `training_step` and `loss.backward()` / `optimizer.step()`, Lightning goes through the strategy and the
precision plugin, which dispatch `on_before_zero_grad`, `on_before_backward`, `on_after_backward` and
`on_before_optimizer_step` to every callback (10 in a `cli.py fit`) and to the module, and the module hooks
`optimizer_zero_grad`, `backward`, `optimizer_step` and `configure_gradient_clipping` (a profiler context and a
`state_key` per callback per call). On one device in fp32, with no callback, module or profiler that uses those hooks,
every one of those dispatches is a no-op; together they cost about 1 ms of CPU per step, a tenth of a 10 ms step.
`DirectOptimization` checks this once per fit and then calls PyTorch directly:

- manual optimisation: `manual_backward` is `loss.backward`, each optimizer's `step` the torch optimizer's;
- automatic optimisation: Lightning's loop keeps its order (training_step -> zero_grad -> backward in the closure,
  accumulation, `optimizer.step(closure)`) and its progress counters, but zero_grad, backward, gradient clipping (the
  Trainer's `gradient_clip_val`, through the module's `clip_gradients` as Lightning's default
  `configure_gradient_clipping` does) and the step are plain calls.

Step counts, logging steps, checkpoints and results are unchanged (tested against the wrapped path). In any other case
(DDP/FSDP, mixed precision, a profiler, a hook in use) Lightning's path is kept and `reason` says why.

`DirectBatches` does the same for the batch's way into `training_step`: Lightning reads the step's signature in every
step (`inspect.getfullargspec`, to know whether it takes `batch_idx`), and on one CPU device sends every batch through
three hooks that return it unchanged (`on_before_batch_transfer`, `transfer_batch_to_device` (a `.to("cpu")` of tensors
already there), `on_after_batch_transfer`). The signature is read once per fit; the hooks are skipped when neither the
module nor the DataModule overrides them. The two per-step callback hooks (`on_train_batch_start`, `on_train_batch_end`)
are dispatched by Lightning to every callback (12 in a `cli.py fit`), each inside a profiler context named by the
callback's `state_key` (a string built per call); without a profiler, `DirectBatches` sends them only to the callbacks
that override them.
"""
from __future__ import annotations

from functools import partial
from types import MethodType
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.trainer import call
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

MODULE_HOOKS = ("on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step")
CALLBACK_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")
# automatic optimisation also routes zero_grad, the step and clipping through hooks
AUTO_MODULE_HOOKS = (*MODULE_HOOKS, "on_before_zero_grad", "optimizer_zero_grad", "optimizer_step",
                     "configure_gradient_clipping")
AUTO_CALLBACK_HOOKS = (*CALLBACK_HOOKS, "on_before_zero_grad")
PATCHED = ("_make_backward_fn", "_make_zero_grad_fn", "_optimizer_step")  # methods of Lightning's automatic loop


def wrappers_are_no_ops(trainer: L.Trainer, module: L.LightningModule) -> str | None:
    """None when Lightning's optimisation wrappers would only call PyTorch; else the reason they would not."""
    if type(trainer.strategy) is not SingleDeviceStrategy or type(trainer.precision_plugin) is not Precision:
        return f"strategy {type(trainer.strategy).__name__} / precision {type(trainer.precision_plugin).__name__}"
    if not isinstance(trainer.profiler, PassThroughProfiler):
        return f"profiler {type(trainer.profiler).__name__}"
    if getattr(module, "_fabric", None) is not None:
        return "module attached to Fabric"
    auto = module.automatic_optimization
    for hook in AUTO_MODULE_HOOKS if auto else MODULE_HOOKS:
        if is_overridden(hook, module, L.LightningModule):
            return f"module overrides {hook}"
    for cb in trainer.callbacks:
        for hook in AUTO_CALLBACK_HOOKS if auto else CALLBACK_HOOKS:
            if is_overridden(hook, cb, Callback):
                return f"callback {type(cb).__name__} overrides {hook}"
    if auto and len(trainer.optimizers) != 1:
        return f"{len(trainer.optimizers)} optimizers"
    return None


def _direct_step(lightning_optimizer, closure=None, **kwargs: Any) -> Any:
    """Manual optimisation: `LightningOptimizer.step` minus the strategy / precision dispatch; the manual loop's step
    counter (which `global_step` reads) is advanced by the same callbacks Lightning's own step calls."""
    lightning_optimizer._on_before_step()
    out = lightning_optimizer.optimizer.step(**kwargs) if closure is None else lightning_optimizer.optimizer.step(closure,
                                                                                                              **kwargs)
    lightning_optimizer._on_after_step()
    return out


# Automatic optimisation: replacements for three methods of Lightning's `_AutomaticOptimization` loop (`loop`), bound
# to the loop instance for one fit. Each keeps the original's progress-counter updates.

def _make_backward_fn(loop, optimizer):
    if loop._skip_backward:
        return None
    return _backward  # Strategy.backward -> Precision.backward -> LightningModule.backward: loss.backward()


def _backward(loss) -> None:
    loss.backward()


def _make_zero_grad_fn(loop, batch_idx: int, optimizer):
    if loop._skip_backward or batch_idx % loop.trainer.accumulate_grad_batches != 0:
        return None
    progress = loop.optim_progress.optimizer.zero_grad

    def zero_grad_fn() -> None:  # _on_before_zero_grad + LightningModule.optimizer_zero_grad's default
        progress.increment_ready()
        progress.increment_started()
        optimizer.zero_grad()
        progress.increment_completed()

    return zero_grad_fn


def _optimizer_step(loop, batch_idx: int, closure) -> None:
    trainer = loop.trainer
    optimizer = trainer.optimizers[0]
    module = trainer.lightning_module
    clip = trainer.gradient_clip_val
    if clip:  # Precision._after_closure -> configure_gradient_clipping's default -> clip_gradients
        def closure_and_clip(inner=closure):
            out = inner()
            module.clip_gradients(optimizer, gradient_clip_val=clip,
                                  gradient_clip_algorithm=trainer.gradient_clip_algorithm)
            return out
        closure = closure_and_clip
    should_accumulate = trainer.fit_loop._should_accumulate()
    progress = loop.optim_progress.optimizer.step
    if not should_accumulate:
        progress.increment_ready()
    optimizer.step(closure=closure)  # LightningModule.optimizer_step's default, minus strategy / precision dispatch
    if not should_accumulate:
        progress.increment_completed()


_AUTOMATIC = {"_make_backward_fn": _make_backward_fn, "_make_zero_grad_fn": _make_zero_grad_fn,
              "_optimizer_step": _optimizer_step}


class _PerFitPatch(Callback):
    """Patches made at train start, undone when the fit ends or fails (`_restore`)."""

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore(trainer, pl_module)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._restore(trainer, pl_module)

    @staticmethod
    def _restore(trainer, pl_module) -> None:
        raise NotImplementedError


class DirectOptimization(_PerFitPatch):
    """Per fit: when `wrappers_are_no_ops`, the optimisation calls go straight to PyTorch (see the module docstring).
    `reason` tells why not, when not."""

    def __init__(self):
        self.reason: str | None = "not started"

    def on_train_start(self, trainer, pl_module) -> None:
        self.reason = wrappers_are_no_ops(trainer, pl_module)
        direct = self.reason is None
        manual = not pl_module.automatic_optimization
        pl_module.__dict__["_direct_manual"] = direct and manual  # read by BaseModule.manual_backward
        for opt in trainer.strategy._lightning_optimizers:
            if direct and manual:
                opt.step = partial(_direct_step, opt)
            else:
                opt.__dict__.pop("step", None)
        loop = trainer.fit_loop.epoch_loop.automatic_optimization
        for name in PATCHED:
            if direct and not manual:
                setattr(loop, name, MethodType(_AUTOMATIC[name], loop))
            else:
                loop.__dict__.pop(name, None)

    @staticmethod
    def _restore(trainer, pl_module) -> None:
        """Lightning's own wrappers again (the next fit of this Trainer checks anew)."""
        pl_module.__dict__["_direct_manual"] = False
        for opt in trainer.strategy._lightning_optimizers:
            opt.__dict__.pop("step", None)
        loop = trainer.fit_loop.epoch_loop.automatic_optimization
        for name in PATCHED:
            loop.__dict__.pop(name, None)


BATCH_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def batch_hooks_are_no_ops(trainer: L.Trainer, module: L.LightningModule) -> str | None:
    """None when the batch-transfer hooks would return every batch unchanged; else the reason they would not."""
    if type(trainer.strategy) is not SingleDeviceStrategy or trainer.strategy.root_device.type != "cpu":
        return f"strategy {type(trainer.strategy).__name__} on {trainer.strategy.root_device}"
    for hook in BATCH_HOOKS:
        if is_overridden(hook, module, L.LightningModule):
            return f"module overrides {hook}"
        if trainer.datamodule is not None and is_overridden(hook, trainer.datamodule, L.LightningDataModule):
            return f"datamodule overrides {hook}"
    return None


def _unchanged(batch: Any, *args: Any, **kwargs: Any) -> Any:
    return batch


PER_STEP_CALLBACK_HOOKS = ("on_train_batch_start", "on_train_batch_end")
_lightning_call_callback_hooks = call._call_callback_hooks


def _call_callback_hooks(trainer, hook_name: str, *args: Any, monitoring_callbacks: bool | None = None,
                         **kwargs: Any) -> None:
    """Lightning's `_call_callback_hooks`; for a Trainer whose per-step hooks `DirectBatches` listed, only the callbacks
    that override the hook are called, with no profiler context (the Trainer's profiler is a pass-through)."""
    listed = trainer.__dict__.get("_direct_callback_hooks")
    if listed is None or hook_name not in listed or monitoring_callbacks is not None:
        return _lightning_call_callback_hooks(trainer, hook_name, *args, monitoring_callbacks=monitoring_callbacks,
                                              **kwargs)
    module = trainer.lightning_module
    prev_fx_name = module._current_fx_name  # as Lightning: `self.log` in a callback hook knows where it is
    module._current_fx_name = hook_name
    for fn in listed[hook_name]:
        fn(trainer, module, *args, **kwargs)
    module._current_fx_name = prev_fx_name


call._call_callback_hooks = _call_callback_hooks  # the loops call it through the module: one dispatch for all Trainers


class DirectBatches(_PerFitPatch):
    """Per fit: the training step's signature is read once, and the batch-transfer hooks are skipped on one CPU device
    when they are no-ops (see the module docstring). `reason` tells why the hooks are kept, when they are."""

    def __init__(self):
        self.reason: str | None = "not started"

    def on_train_start(self, trainer, pl_module) -> None:
        takes_idx = is_param_in_hook_signature(pl_module.training_step, "batch_idx", min_args=2)

        def build_kwargs(kwargs, batch, batch_idx):  # _TrainingEpochLoop._build_kwargs with the answer kept
            kwargs["batch"] = batch
            if takes_idx:
                kwargs["batch_idx"] = batch_idx
            return kwargs

        trainer.fit_loop.epoch_loop._build_kwargs = build_kwargs
        if isinstance(trainer.profiler, PassThroughProfiler):
            trainer.__dict__["_direct_callback_hooks"] = {
                hook: [getattr(cb, hook) for cb in trainer.callbacks if is_overridden(hook, cb, Callback)]
                for hook in PER_STEP_CALLBACK_HOOKS}
        self.reason = batch_hooks_are_no_ops(trainer, pl_module)
        if self.reason is None:
            pl_module.__dict__["_on_before_batch_transfer"] = _unchanged
            trainer.strategy.batch_to_device = _unchanged

    @staticmethod
    def _restore(trainer, pl_module) -> None:
        trainer.fit_loop.epoch_loop.__dict__.pop("_build_kwargs", None)
        trainer.__dict__.pop("_direct_callback_hooks", None)
        pl_module.__dict__.pop("_on_before_batch_transfer", None)
        trainer.strategy.__dict__.pop("batch_to_device", None)
