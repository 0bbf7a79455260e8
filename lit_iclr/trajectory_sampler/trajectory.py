"""A training trajectory as data: the checkpoints a Lightning `ModelCheckpoint` left in a folder, loaded in step order.

Any checkpoint folder of a lit-iclr module works: every `*.ckpt` is read with `torch.load(weights_only=True)`, the module
class is taken from `predictor_class`, else from the checkpoint (`lit_iclr_class`, or the `_class_path` LightningCLI
records in the hyperparameters), checked against the platform's allow-list (`core/classes.py`: a LightningModule under
`lit_iclr.`, nothing imported before), rebuilt from the saved hyperparameters and given the checkpoint's `state_dict`.
"""
from __future__ import annotations

import glob
import inspect
from pathlib import Path

import lightning as L
import torch
from torch import nn

from lit_iclr.core.classes import checkpoint_class_names, refusal, resolve_class
from lit_iclr.core.errors import CheckpointError
from lit_iclr.core.hub import read_checkpoint

FIX = ("fit the predictor with `--checkpoint.save_top_k -1 --checkpoint.every_n_train_steps N` and point "
       "`checkpoint_dir` at its run's checkpoints/ folder")


def resolve_folder(pattern: str | Path) -> Path:
    """The folder itself, or the newest folder matching a glob such as `runs/trajectory_sampler/*/checkpoints`."""
    path = Path(pattern).expanduser()
    if path.is_dir():
        return path
    matches = [Path(p) for p in glob.glob(str(path)) if Path(p).is_dir() and any(Path(p).glob("*.ckpt"))]
    if not matches:
        raise CheckpointError(path, "no checkpoint folder here", FIX)
    return max(matches, key=lambda p: p.stat().st_mtime)


def build_predictor(ckpt: dict, path: Path, predictor_class: str | None = None) -> nn.Module:
    """The LightningModule that wrote `ckpt`, rebuilt from its hyperparameters, weights loaded, frozen, eval mode.

    Every class name (the `predictor_class` given, else each one the checkpoint records) passes the platform's
    allow-list before anything is imported or called: a checkpoint cannot make the sampler call an arbitrary class."""
    hp = dict(ckpt.get("hyper_parameters") or {})
    named = [predictor_class] if predictor_class else [name for _, name in checkpoint_class_names(ckpt)]
    if not named:
        raise CheckpointError(path, "does not say which module wrote it",
                              "set `predictor_class` to the dotted path of the LightningModule that wrote the checkpoints")
    fix = "set `predictor_class` to the dotted path of the lit-iclr LightningModule that wrote it"
    for name in named:  # strings first: a refused name in the file stops everything before any import
        if refusal(name) is not None:
            resolve_class(name, L.LightningModule, path, fix)
    classes = {resolve_class(name, L.LightningModule, path, fix) for name in named}
    if len(classes) > 1:
        raise CheckpointError(path, f"names different modules ({', '.join(map(str, named))})", fix)
    (cls,) = classes
    name = named[0]
    kwargs = {k: v for k, v in hp.items() if not k.startswith("_")}
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        # LightningCLI records linked values the class does not take (e.g. another model's linked argument)
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    try:
        module = cls(**kwargs)
        module.load_state_dict(ckpt["state_dict"])
    except (TypeError, RuntimeError) as e:
        raise CheckpointError(path, f"cannot be rebuilt as {name} ({str(e).splitlines()[0][:200]})",
                              "set `predictor_class` to the class that wrote it, with matching hyperparameters") from None
    module.eval().requires_grad_(False)
    return module


def select(steps: list[int], k: int | None, spacing: str = "even") -> list[int]:
    """Indices of at most k checkpoints from the sorted `steps`, always keeping the last (final) one.

    even: evenly spaced in checkpoint order; log: log-spaced in training steps (denser early, where the function moves most).
    """
    n = len(steps)
    if k is None or k >= n:
        return list(range(n))
    if spacing == "even":
        picks = torch.linspace(0, n - 1, k).round().long().tolist()
    elif spacing == "log":
        s = torch.tensor(steps, dtype=torch.float64).clamp_min(1)
        want = torch.logspace(float(s[0].log10()), float(s[-1].log10()), k, dtype=torch.float64)
        picks = (s[None] - want[:, None]).abs().argmin(-1).tolist()
    else:
        raise ValueError(f"spacing must be 'even' or 'log', got {spacing!r}")
    picks = sorted(set(picks) | {n - 1})
    return picks


def load_trajectory(folder: str | Path, predictor_class: str | None = None, max_checkpoints: int | None = None,
                    spacing: str = "even") -> tuple[list[int], list[nn.Module]]:
    """(training steps, predictors) of the checkpoints in `folder`, in training order; duplicates of one step (e.g.
    `last.ckpt`) are kept once."""
    folder = resolve_folder(folder)
    files = sorted(folder.glob("*.ckpt"), key=lambda p: (p.name.startswith("last"), p.name))
    if not files:
        raise CheckpointError(folder, "holds no .ckpt files", FIX)
    by_step: dict[int, tuple[Path, dict]] = {}
    for f in files:
        ckpt = read_checkpoint(f)
        step = int(ckpt.get("global_step", -1))
        by_step.setdefault(step, (f, ckpt))
    steps = sorted(by_step)
    keep = select(steps, max_checkpoints, spacing)
    steps = [steps[i] for i in keep]
    models = [build_predictor(by_step[s][1], by_step[s][0], predictor_class) for s in steps]
    return steps, models


def as_score(model: nn.Module, target: torch.Tensor | None = None):
    """f(x) of a predictor: its scalar output, or log p(target | x) when it outputs class logits (N, classes)."""

    def f(x: torch.Tensor) -> torch.Tensor:
        out = model(x)
        if out.dim() == 2 and out.shape[1] > 1:
            if target is None:
                raise ValueError("the predictor outputs class logits: give a target class (`target_class` or the batch's "
                                 "`target`)")
            return torch.log_softmax(out, -1).gather(1, target.reshape(-1, 1).expand(len(out), 1)).squeeze(1)
        return out.reshape(len(x))

    return f
