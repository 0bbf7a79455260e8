"""A method's twin config run with real DDP (2 CPU processes, gloo) against one process with the same global batch.

`fit_steps` runs `cli.py fit --config tests/configs/<name>.yaml` as its own process (Lightning's DDP launcher starts
the other rank by re-running that command) for a few optimiser steps without validation and returns the parameters
of `last.ckpt`. With 2 processes x batch/2 against 1 process x batch, the ranks' k-th batches together are the
single process's k-th batch (`core/loader.py`'s `EpochShuffleSampler`), so the parameters must agree to float
tolerance. Under Adam the first step is about `lr * sign(g)` whatever the gradient's scale, so a comparison meant to
catch a wrongly scaled gradient sets SGD: its step is `lr * g` itself. A third run, one process with one rank's
half of the batch, shows that the comparison can fail: its parameters differ from both.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.twin import ROOT, twin_config


def fit_steps(run_dir: Path, name: str, devices: int, batch_size: int, *extra: str, steps: int = 1,
              data_dir: Path | None = None, timeout: float = 280) -> dict[str, torch.Tensor]:
    """Parameters after `steps` optimiser steps of the twin `name` on `devices` CPU processes."""
    strategy = ["--trainer.strategy", "ddp"] if devices > 1 else []
    cmd = [sys.executable, str(ROOT / "cli.py"), "fit", "--config", twin_config(name), "--trainer.accelerator", "cpu",
           "--trainer.devices", str(devices), *strategy, "--trainer.max_steps", str(steps),
           "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0",
           "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(run_dir),
           "--data.init_args.data_dir", str(data_dir or Path(run_dir).parent / "data"),
           "--data.init_args.batch_size", str(batch_size), *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd[2:])}\n{proc.stderr[-4000:]}"
    ckpt = torch.load(Path(run_dir) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] >= steps, ckpt["global_step"]
    return ckpt["state_dict"]


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest |a - b| over the floating-point tensors both hold, and where."""
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())[:5]
    worst, where = 0.0, ""
    for k in a:
        if a[k].is_floating_point() and a[k].numel():
            d = (a[k].double() - b[k].double()).abs().max().item()
            if d > worst:
                worst, where = d, k
    return worst, where



SGD = ["--model.init_args.optimizer", "torch.optim.SGD", "--model.init_args.optimizer.init_args.lr", "0.1"]


def sgd_first_step_diff(tmp_path: Path, name: str, global_batch: int, *extra: str) -> tuple[float, str]:
    """Largest parameter difference after one SGD step (lr 0.1, so 0.1 x the gradient difference) of 2 processes x
    `global_batch` / 2 against 1 process x `global_batch`; the 2-process run first, so it also makes the data."""
    ddp = fit_steps(tmp_path / "ddp", name, 2, global_batch // 2, *SGD, *extra)
    one = fit_steps(tmp_path / "one", name, 1, global_batch, *SGD, *extra)
    return max_abs_diff(ddp, one)
