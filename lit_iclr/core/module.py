"""Base LightningModule: the CLI's `model` root class, so any method is chosen by its short class name."""
from __future__ import annotations

from typing import Any

import lightning as L

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


def check_state_compatible(module, checkpoint: dict[str, Any], source: str = "checkpoint") -> None:
    """Raise `CheckpointError` when `checkpoint` was written by another model class or its tensors do not fit."""
    saved_cls = checkpoint.get("lit_iclr_class")
    if saved_cls is not None and saved_cls != class_path(module):
        raise CheckpointError(source, f"written by {saved_cls}, not {class_path(module)}",
                              f"select the model with `--model {saved_cls.rsplit('.', 1)[-1]}` or use a matching checkpoint")
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
