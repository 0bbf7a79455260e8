"""Run folders: runs/<config name>/<SLURM job id or timestamp>, created atomically, with a config written once.

A run folder is the record of what produced its checkpoints: its `config.yaml` is never overwritten, and resuming
(`--ckpt_path last`) continues only a run whose saved model and data match the resolved config. Options that do not
change what is trained (trainer limits, loggers, workers) may differ; the change is recorded in run_info.json.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml

from .errors import CheckpointError, ConfigError
from .runlock import lock_run_dir

# model/data options that may change between a run and its resume (they do not change what is trained)
RESUME_TOLERATED = {"data.init_args.data_dir", "data.init_args.num_workers"}
CKPT_KEYWORDS = {"last", "best", "hpc", "registry"}


def config_name(config_files: list[str]) -> str:
    """The method config's stem: the first `--config` that is not a trainer overlay (configs/trainer/*.yaml)."""
    for f in config_files:
        if Path(f).parent.name != "trainer":
            return Path(f).stem
    return "cli"


def new_run_dir(base: Path, stamp: str | None = None) -> Path:
    """Create and return a fresh folder `base/<stamp>` (or `<stamp>-1`, `-2` ...): `mkdir` without `exist_ok` is atomic,
    so two runs started in the same second never share a folder."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    base.mkdir(parents=True, exist_ok=True)
    for n in range(10_000):
        run = base / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            run.mkdir()
            return run
        except FileExistsError:
            continue
    raise ConfigError(f"cannot create a new run folder under {base}: 10000 runs named {stamp}*")


def has_checkpoint(run_dir: Path) -> bool:
    ckpts = run_dir / "checkpoints"
    return any(ckpts.glob("last*.ckpt")) or any(run_dir.glob("hpc_ckpt_*.ckpt"))


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{'a.b.c': value} of a nested dict (lists are values)."""
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_changes(saved: dict, current: dict) -> tuple[list[str], dict[str, list]]:
    """(model/data keys that differ, other keys that differ with [saved, current]) between two resolved configs."""
    a, b = flatten(saved), flatten(current)
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and k != "ckpt_path")
    identity = [k for k in differ if k.split(".", 1)[0] in ("model", "data") and k not in RESUME_TOLERATED]
    others = {k: [a.get(k), b.get(k)] for k in differ if k not in identity}
    return identity, others


def saved_config(run_dir: Path) -> dict | None:
    f = Path(run_dir) / "config.yaml"
    if not f.is_file():
        return None
    try:
        return yaml.safe_load(f.read_text()) or {}
    except yaml.YAMLError:
        return None


def check_resumable(run_dir: Path, current: dict) -> dict[str, list]:
    """The tolerated changes between `run_dir`'s saved config and `current`; `ConfigError` if model or data differ."""
    saved = saved_config(run_dir)
    if saved is None:
        return {}
    identity, others = config_changes(saved, current)
    if identity:
        a, b = flatten(saved), flatten(current)
        shown = "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in identity[:4])
        more = f" (+{len(identity) - 4} more)" if len(identity) > 4 else ""
        raise ConfigError(f"{run_dir} belongs to another run: its config.yaml trained another model or data ({shown}{more}); "
                          "use the config it was trained with, or another run folder (a new run without --ckpt_path last)")
    return others


def resolve_run_dir(default_root_dir: str | None, config_files: list[str], resume: bool = False,
                    runs_root: str = "runs", current: dict | None = None) -> tuple[Path, dict[str, list] | None]:
    """Where this run writes, and (when resuming) the tolerated config changes to record.

    An explicit `--trainer.default_root_dir` is used as is; else runs/<config>/<job id | new timestamped folder>. Under
    SLURM the job id is stable across requeues. With `--ckpt_path last` the newest earlier run of the same config name
    whose saved config has the same model and data and which holds a checkpoint is continued; when there is none,
    `ConfigError` (a fresh start is only made when asked for). The folder is locked for this process
    (`core/runlock.py`): another process training in it makes this fail, naming that process.
    """
    current = current or {}
    explicit = default_root_dir and default_root_dir not in (os.getcwd(), ".")
    base = Path(runs_root) / config_name(config_files)
    job = os.environ.get("SLURM_JOB_ID")
    if explicit or job:
        if explicit:
            run = Path(default_root_dir)
        else:
            array = os.environ.get("SLURM_ARRAY_TASK_ID")
            run = base / (f"{job}_{array}" if array else job)
        changes = check_resumable(run, current) if (resume or saved_config(run) is not None) else None
        if resume and not has_checkpoint(run):
            raise CheckpointError(run / "checkpoints" / "last.ckpt", "--ckpt_path last: there is no checkpoint to resume",
                                  "run `fit` without --ckpt_path to start a new run, or pass the path of a .ckpt")
        run.mkdir(parents=True, exist_ok=True)
        lock_run_dir(run)
        return run, changes
    if not resume:
        run = new_run_dir(base)
        lock_run_dir(run)
        return run, None
    earlier = sorted((p for p in base.glob("*") if p.is_dir() and has_checkpoint(p)),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    refused = []
    for run in earlier:
        try:
            changes = check_resumable(run, current)
        except ConfigError as e:
            refused.append(e)
            continue
        lock_run_dir(run)  # one writer per run folder: a second resume of the same run fails here
        return run, changes
    if refused:
        raise ConfigError(f"--ckpt_path last: none of the {len(refused)} runs under {base} trained this model and data "
                          f"(newest: {refused[0]})")
    raise CheckpointError(base, "--ckpt_path last: no earlier run of this config holds a checkpoint",
                          "run `fit` without --ckpt_path to start a new run, or pass the path of a .ckpt")
