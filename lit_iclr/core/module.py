"""Base LightningModule: the CLI's `model` root class, so any method is chosen by its short class name."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch

from .errors import CheckpointError


def class_path(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


class BaseModule(L.LightningModule):
    """Base of every method's LightningModule. Methods subclass this and keep `__init__` to what they use.

    Checkpoints record the module's class; loading one into a different model, or one whose tensors do not match,
    raises `CheckpointError` naming what differs instead of a wall of state-dict keys.
    """

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lit_iclr_class"] = class_path(self)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        check_state_compatible(self, checkpoint, source=checkpoint.get("_path", "checkpoint"))

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's `manual_backward`; straight to `loss.backward` when the platform's `DirectOptimization`
        found Lightning's wrappers to be no-ops for this fit (one device, fp32, no backward hooks in use)."""
        if self.__dict__.get("_direct_manual", False):
            loss.backward(*args, **kwargs)
        else:
            super().manual_backward(loss, *args, **kwargs)

    def optimizer_steps_are_plain(self) -> bool:
        """True when, in this fit, `opt.step()` of manual optimisation is a plain PyTorch call (`DirectOptimization`
        found Lightning's wrappers to be no-ops: one device, fp32, no step hooks in use). A module may then step the
        raw `opt.optimizer`s itself, e.g. all of them inside one compiled function, and count them with
        `count_optimizer_steps`; otherwise it must call `opt.step()`."""
        return self.__dict__.get("_direct_manual", False)

    def count_optimizer_steps(self, *optimizers) -> None:
        """Record steps made on the raw optimizers of these `LightningOptimizer`s as Lightning's `opt.step()` does (the
        manual loop's step counter, which `global_step`, logging and checkpointing read)."""
        for opt in optimizers:
            opt._on_before_step()
            opt._on_after_step()

    def log_train(self, metrics: Mapping[str, torch.Tensor | float], prog_bar: Iterable[str] = (),
                  flush: bool = True) -> None:
        """Per-step training metrics, summed on the device and logged as their mean every `log_every_n_steps`.

        `self.log` in every step costs Lightning's per-call bookkeeping (about 0.2 ms a metric on CPU) and, for progress-bar
        metrics, a `.item()` host sync per step. Here a step costs one stack and one add on the device; on a logging step
        (the steps on which Lightning writes to its loggers) the window's means come to the host in one transfer and are
        logged as CPU tensors, so the stale values Lightning keeps between logging steps never sync the device either.
        Keys may differ between steps (e.g. an actor loss every other step): each is averaged over the steps that had it.
        `flush=False` only accumulates: more updates of the same training step follow (and the last one flushes).
        """
        trainer = self._trainer
        if trainer is None or trainer.log_every_n_steps == 0:
            return
        keys = tuple(metrics)
        values = list(metrics.values())
        device = self.device
        with torch.no_grad():
            if all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 and v.dim() == 0 and v.device == device
                   for v in values):
                values = torch.stack(values)  # the usual case (float32 losses on the module's device): one call
            else:
                values = torch.stack([torch.as_tensor(v, device=device).float().reshape(()) for v in values])
        acc = self.__dict__.setdefault("_train_metric_sums", {})  # plain dict: not module state, not checkpointed
        if keys in acc:
            acc[keys][0].add_(values)
            acc[keys][1] += 1
        else:
            acc[keys] = [values, 1]
        # Lightning's own test for "write to the loggers after this step" (the step counter it uses is internal)
        flush = flush and (trainer._logger_connector.should_update_logs or trainer.fast_dev_run)
        if not flush or (self.automatic_optimization and trainer.fit_loop._should_accumulate()):
            return
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for group, (total, n) in acc.items():
            for k, v in zip(group, total.tolist(), strict=True):  # one device-to-host copy per key set
                sums[k] = sums.get(k, 0.0) + v
                counts[k] = counts.get(k, 0) + n
        acc.clear()
        shown = set(prog_bar)
        for k, v in sums.items():
            self.log(k, torch.tensor(v / counts[k]), prog_bar=k in shown, on_step=True, on_epoch=False, batch_size=1)


def check_class_matches(cls: type, checkpoint: dict[str, Any], source: str | Path = "checkpoint") -> None:
    """Raise `CheckpointError` unless every class the checkpoint names (`lit_iclr_class`, else the `_class_path`
    LightningCLI records in its hyperparameters) is `cls`. A name that differs from `cls`'s path is resolved through
    the allow-list of `classes.py` (a re-export names the same class), so nothing outside it is imported."""
    from .classes import checkpoint_class_names, refusal, resolve_class

    own = class_path(cls)
    for key, saved in checkpoint_class_names(checkpoint):
        if saved == own:
            continue
        fix = (f"select the model with `--model {str(saved).rsplit('.', 1)[-1]}` or use a checkpoint of {own}")
        if refusal(saved) is None and resolve_class(saved, BaseModule, source, fix) is cls:
            continue
        raise CheckpointError(source, f"written by {saved} ({key}), not {own}", fix)


def check_state_compatible(module, checkpoint: dict[str, Any], source: str = "checkpoint") -> None:
    """Raise `CheckpointError` when `checkpoint` was written by another model class or its tensors do not fit."""
    check_class_matches(type(module), checkpoint, source)
    state = checkpoint.get("state_dict")
    if state is None:
        return
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [k for k in own.keys() & state.keys() if tuple(own[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing tensors (e.g. {missing[:3]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected tensors (e.g. {unexpected[:3]})")
        if mismatched:
            k = sorted(mismatched)[0]
            parts.append(f"{len(mismatched)} tensors of another shape (e.g. {k}: checkpoint {tuple(state[k].shape)} "
                         f"vs model {tuple(own[k].shape)})")
        raise CheckpointError(source, "does not fit this model: " + "; ".join(parts),
                              "load it with the config it was trained with (its run folder holds config.yaml)")
