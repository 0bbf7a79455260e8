"""Run a method's tiny twin config (tests/configs/<name>.yaml) through the CLI and read back what it logged."""
from __future__ import annotations

import csv
import os
import re
import signal
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from lit_iclr.cli import main

ROOT = Path(__file__).resolve().parents[1]


def twin_config(name: str) -> str:
    return str(ROOT / "tests" / "configs" / f"{name}.yaml")


def fit_twin(name: str, run_dir: Path, *extra: str, subcommand: str = "fit"):
    """`cli.py <subcommand> --config tests/configs/<name>.yaml` writing into `run_dir`, data cached in run_dir/data."""
    return main([subcommand, "--config", twin_config(name), "--trainer.default_root_dir", str(run_dir),
                 "--data.init_args.data_dir", str(Path(run_dir) / "data"), *extra])


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def print_config(config: str, capsys) -> str:
    """The fully resolved YAML that `cli.py fit --config <config> --print_config` prints (it must exit 0)."""
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(ROOT / config), "--print_config"])
    assert e.value.code in (0, None)
    return capsys.readouterr().out


# what a run's final `last.ckpt` holds that an exact resume must reproduce
COMPARED = ("state_dict", "optimizer_states", "lr_schedulers", "lit_iclr_rng", "global_step", "epoch")
# metric columns that measure time, not training
TIMED = re.compile(r"(^|/|_)(time|seconds|sec|s|per_s|it_s|throughput|evolve_s|wall)($|_)")


def final_checkpoint(run_dir: Path) -> dict:
    import torch

    return torch.load(Path(run_dir) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def differences(a, b, path: str = "", atol: float = 0.0) -> list[str]:
    """Where two checkpoint pieces differ (tensors bit for bit unless `atol`), as 'path: why' lines."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return [f"{path}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"]
        if atol and a.is_floating_point():
            diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
            return [] if diff <= atol else [f"{path}: max |diff| {diff:.3g}"]
        same = torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.nan_to_num(), b.nan_to_num()))
        if same:
            return []
        diff = (a.double() - b.double()).abs().max().item() if a.is_floating_point() or a.is_complex() else "-"
        return [f"{path}: differs (max |diff| {diff})"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(map(str, a.keys() ^ b.keys()))[:5]} in one only"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}" if path else str(k), atol)]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]", atol)]
    return [] if a == b or (a != a and b != b) else [f"{path}: {a!r} vs {b!r}"[:300]]


def training_rows(run_dir: Path) -> list[dict[str, str]]:
    """metrics.csv rows without empty cells and timing columns, in the order written."""
    return [{k: v for k, v in r.items() if v not in ("", None) and not TIMED.search(k)} for r in metric_rows(run_dir)]


def run_differences(full: Path, resumed: Path, atol: float = 0.0) -> list[str]:
    """Everything in which a resumed run's final state and metric rows differ from an uninterrupted run's."""
    a, b = final_checkpoint(full), final_checkpoint(resumed)
    out = [d for key in COMPARED if key in a or key in b for d in differences(a.get(key), b.get(key), key, atol)]
    if (Path(full) / "metrics.csv").exists() or (Path(resumed) / "metrics.csv").exists():
        ra, rb = training_rows(full), training_rows(resumed)
        if atol and len(ra) == len(rb) and all(x.keys() == y.keys() and all(_close(x[k], y[k], atol) for k in x)
                                               for x, y in zip(ra, rb, strict=True)):
            rb = ra
        if ra != rb:
            first = next((i for i, (x, y) in enumerate(zip(ra, rb, strict=False)) if x != y), min(len(ra), len(rb)))
            out.append(f"metrics.csv: {len(ra)} vs {len(rb)} rows, first difference at row {first}: "
                       f"{ra[first] if first < len(ra) else None} vs {rb[first] if first < len(rb) else None}"[:600])
    return out


def _close(a: str, b: str, atol: float) -> bool:
    try:
        return a == b or abs(float(a) - float(b)) <= atol * max(1.0, abs(float(a)))
    except ValueError:
        return False



class SignalAtBatch(Callback):
    """Sends SIGTERM when the `batch`-th training batch of the run (0-based, counted across epochs) is about to start:
    a stop by batch, for methods whose `global_step` counts several optimizer steps per batch (VGF's actor and critic)
    or whose epochs are shorter than the stop (EvoTest's two-episode epochs)."""

    def __init__(self, batch: int):
        self.batch = batch
        self.seen = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen += 1
        if self.seen - 1 == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)
