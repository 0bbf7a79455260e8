"""Is a method's training step ready for a GPU? The checks behind `scripts/gpu_check.sh`.

On the CPU (`--dry-run`, no GPU needed):

- **host syncs per step**: `HostSyncCounter` is a `TorchFunctionMode` active from `on_train_batch_start` to
  `on_train_batch_end` (the training step, its backward and optimiser step). It counts the tensor calls that copy a
  device value to the host on a GPU and so block until the device is done: `.item()`, `.tolist()`, `.numpy()` /
  `np.asarray(t)` (`__array__`), `.cpu()`, `.to("cpu")` (the string; `.to(x.device)` is not counted), `bool(t)` /
  `if t:` (`__bool__`), `int(t)`, `float(t)`, `t.__index__` (a tensor used as a Python index), and the ops whose
  output shape depends on values (`nonzero`, `argwhere`, `masked_select`, `unique`, `unique_consecutive`,
  boolean-mask indexing `x[mask]`). A call counts when the code that made it is the project's (lit_iclr/): calls
  made inside torch (Adam's `step` counter is a CPU tensor read with `.item()`, host-side on a GPU too), Lightning
  or torchmetrics are not the method's and are not counted.
  The first `skip` steps (lazy initialisation, compilation) are not counted, and the run logs no metric in the counted
  steps (`log_every_n_steps` beyond them), so what remains is what every step pays.
- **CPU-only kernels**: every place in lit_iclr/ that calls a CPU-only kernel (oneDNN / mkldnn ops, `.to_mkldnn`) must
  go through `core/onednn_linear.py`, whose products fall back to `F.linear` for any tensor that is not fp32 on the CPU
  (checked on meta tensors, which are not CPU ones).

On a GPU (`scripts/gpu_check.sh` without --dry-run): `compare` runs a config for N steps on the GPU in bf16-mixed and
on the CPU in fp32 with the same seed, compares their logged loss curves within a stated tolerance, and prints samples/s
and MFU (step FLOPs from `cli.py plan`'s counter, at the config's batch, over the device's peak bf16 rate).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch.overrides import TorchFunctionMode

PACKAGE_DIR = str(Path(__file__).resolve().parents[1])  # .../lit_iclr
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_THIS = str(Path(__file__).resolve())
_DISPATCH_FILES = ("torch/overrides.py", "torch/_tensor.py", "torch/functional.py", "torch/_jit_internal.py")
_NUMPY_DIR = str(Path(np.__file__).resolve().parent)


@functools.lru_cache(maxsize=4096)
def _real(path: str) -> str:
    """A code object's file with symlinks resolved, as the directories above are: a frame's `co_filename` keeps the
    path it was imported by (a symlinked virtual environment or checkout), so an unresolved one missed every prefix."""
    return os.path.realpath(path)

SYNC_CALLS = frozenset({"item", "tolist", "numpy", "__array__", "cpu", "__bool__", "__int__", "__float__", "__index__",
                        "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"})


def _is_cpu(device) -> bool:
    # only the literal "cpu": on a CPU run `.to(x.device)` / `.to(self.device)` also names the CPU, and those are the
    # device-agnostic moves a GPU step is meant to make
    return isinstance(device, str) and device.split(":")[0] == "cpu"


def _sync_name(func, args, kwargs) -> str | None:
    name = getattr(func, "__name__", "")
    if name in SYNC_CALLS:
        return name
    if name == "to" and (any(_is_cpu(a) for a in args[1:]) or _is_cpu(kwargs.get("device"))):
        return "to(cpu)"
    if name == "__getitem__" and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
            return "x[bool mask]"
    return None


class HostSyncCounter(TorchFunctionMode):
    """Counts host-syncing tensor calls made by the project's code (see the module docstring), by call site."""

    def __init__(self, package_dir: str = PACKAGE_DIR):
        super().__init__()
        self.package_dir = os.path.realpath(package_dir)
        self.sites: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _sync_name(func, args, kwargs)
        if name is not None:
            site = self._site()
            if site is not None:
                self.sites[(site, name)] += 1
        return func(*args, **kwargs)

    def _site(self) -> str | None:
        """`file:line` of the call when the code that made it is the project's; None when torch (an optimiser's
        CPU step counter, a Tensor method implemented in Python) or another library made it."""
        frame = sys._getframe(2)
        while frame is not None and (frame.f_code.co_filename.endswith(_DISPATCH_FILES)
                                     or _real(frame.f_code.co_filename).startswith(_NUMPY_DIR)):
            frame = frame.f_back  # torch's handle_torch_function, the Tensor method that called it, numpy's wrappers
        if frame is None:
            return None
        path = _real(frame.f_code.co_filename)
        if path.startswith(self.package_dir) and path != _THIS:
            return f"{Path(path).relative_to(Path(self.package_dir).parent)}:{frame.f_lineno}"
        return None

    @property
    def total(self) -> int:
        return sum(self.sites.values())


class CountHostSyncs(Callback):
    """Runs `HostSyncCounter` over every training batch after the first `skip` (see the module docstring)."""

    def __init__(self, skip: int = 1, package_dir: str = PACKAGE_DIR):
        self.skip = skip
        self.counter = HostSyncCounter(package_dir)
        self.batches = 0  # seen
        self.steps = 0  # counted
        self._active = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches += 1
        if self.batches > self.skip:
            self.counter.__enter__()
            self._active = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._active:
            self.counter.__exit__(None, None, None)
            self._active = False
            self.steps += 1

    def report(self) -> dict:
        per_step = self.counter.total / self.steps if self.steps else 0.0
        sites = {f"{site} {name}": n / max(self.steps, 1) for (site, name), n in self.counter.sites.most_common()}
        return {"steps": self.steps, "syncs_per_step": per_step, "sites": sites}


# ---------------------------------------------------------------------------------------------------------------------
# CPU-only kernels

CPU_ONLY = re.compile(r"torch\.ops\.mkldnn|torch\._C\._nn\.mkldnn|\.to_mkldnn\(|mkldnn_linear|torch\.mkldnn")
ALLOWED_CPU_ONLY = ("core/onednn_linear.py", "core/plan_devicecheck.py")  # the kernels themselves; their names


def cpu_only_kernel_sites(package_dir: str = PACKAGE_DIR) -> list[str]:
    """`file:line` of every CPU-only kernel call in the package outside core/onednn_linear.py."""
    sites = []
    root = Path(package_dir)
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel in ALLOWED_CPU_ONLY:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if CPU_ONLY.search(line.split("#", 1)[0]):
                sites.append(f"lit_iclr/{rel}:{i}")
    return sites


def onednn_falls_back_off_cpu() -> bool:
    """core/onednn_linear.py's products on tensors that are not on the CPU (meta ones stand for CUDA) take F.linear."""
    from . import onednn_linear

    x = torch.zeros(4096, 256, device="meta")
    w = torch.zeros(512, 256, device="meta", requires_grad=True)
    b = torch.zeros(512, device="meta", requires_grad=True)
    calls = Counter()

    class Ops(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls[getattr(func, "__name__", str(func))] += 1
            return func(*args, **(kwargs or {}))

    with Ops():
        y = onednn_linear.linear(x, w, b, backend="onednn")
        ens = onednn_linear.ensemble_linear(torch.zeros(4, 1024, 256, device="meta"),
                                            torch.zeros(4, 256, 512, device="meta"), None, backend="onednn")
    return y.shape == (4096, 512) and ens.shape[-1] == 512 and not any("onednn" in k or "mkldnn" in k for k in calls)


# ---------------------------------------------------------------------------------------------------------------------
# running configs


class LossCurve(Callback):
    """The logged losses at every logging step (what `log_every_n_steps` wrote), and the time of each batch."""

    def __init__(self):
        self.points: list[tuple[int, dict[str, float]]] = []
        self.times: list[float] = []
        self._t = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.device_ids and torch.cuda.is_available() and pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self._t)
        every = trainer.log_every_n_steps or 0
        if every and trainer.global_step % every == 0:
            losses = {k: float(v) for k, v in trainer.callback_metrics.items()
                      if "loss" in k and k.startswith("train") and hasattr(v, "numel") and v.numel() == 1}
            if losses:
                self.points.append((trainer.global_step, losses))


def _fit(config: str, steps: int, run_dir: str, extra: list[str], callbacks: list[str]):
    """`cli.py fit` of `config` for `steps` steps (no validation, no checkpoints) with the named callback classes added;
    returns the CLI (its trainer holds the callback instances)."""
    from ..cli import main

    args = ["fit", "--config", config, "--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0",
            "--trainer.num_sanity_val_steps", "0", "--trainer.default_root_dir", run_dir,
            "--checkpoint.save_last", "false", "--checkpoint.save_top_k", "0", *extra]
    for cb in callbacks:
        args.append(f"--trainer.callbacks+=lit_iclr.core.plan_devicecheck.{cb}")
    return main(args)


def _callback(cli, cls):
    return next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == cls.__name__)  # also when run as __main__


def count_step_syncs(config: str, batches: int = 4, run_dir: str = "runs/gpu_check", extra: list[str] = ()) -> dict:
    """Host syncs per training batch of `config` on the CPU (one epoch of `batches` batches, the first not counted),
    by call site. No metric is logged in those batches (`log_every_n_steps` beyond them)."""
    cli = _fit(config, -1, run_dir, ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", str(batches),
                                     "--trainer.log_every_n_steps", "100000", "--trainer.accelerator", "cpu",
                                     "--trainer.devices", "1", "--trainer.enable_progress_bar", "false", *extra],
               ["CountHostSyncs"])
    return _callback(cli, CountHostSyncs).report()


def run_curve(config: str, steps: int, accelerator: str, precision: str, run_dir: str, extra: list[str] = (),
              log_every: int = 5) -> dict:
    """Loss curve, samples/s (steps after the first fifth) and syncs of `steps` steps of `config`."""
    torch.manual_seed(0)
    cli = _fit(config, steps, run_dir, ["--trainer.accelerator", accelerator, "--trainer.devices", "1",
                                        "--trainer.precision", precision, "--trainer.log_every_n_steps", str(log_every),
                                        *extra], ["LossCurve"])
    curve = _callback(cli, LossCurve)
    batch = int(getattr(cli.datamodule, "batch_size", 1) or 1)
    warm = max(len(curve.times) // 5, 1)
    timed = curve.times[warm:] or curve.times
    seconds = sum(timed) / max(len(timed), 1)
    return {"points": curve.points, "step_s": seconds, "samples_per_s": batch / seconds if seconds else None,
            "batch_size": batch}


def curve_difference(a: list, b: list) -> float | None:
    """Mean over the logged steps both runs have of |a - b| / mean |b| for the loss keys both logged (b: the reference)."""
    ref = {s: v for s, v in b}
    diffs, scale = [], []
    for step, losses in a:
        if step not in ref:
            continue
        for k, v in losses.items():
            if k in ref[step]:
                diffs.append(abs(v - ref[step][k]))
                scale.append(abs(ref[step][k]))
    if not diffs:
        return None
    return (sum(diffs) / len(diffs)) / max(sum(scale) / len(scale), 1e-12)


def step_flops_of(config: str) -> int | None:
    """FLOPs of one training step at the config's batch, by `cli.py plan`'s counter (None without a method plan)."""
    from . import plan as P

    try:
        module, dm, _ = P.build_on_meta([config])
        hooks = P.method_hooks(module)
        batch = hooks.example_batch(dm, int(getattr(dm, "batch_size", 1) or 1), "meta")
        return P.step_flops(module, batch, hooks.step_loss)
    except Exception:  # noqa: BLE001 - MFU is then not reported
        return None


def _peak_tflops() -> float | None:
    from .plan import ACCELERATORS

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    for key, acc in ACCELERATORS.items():
        if key in name.upper():
            return acc.bf16_tflops
    return None


def compare(config: str, steps: int, tolerance: float, run_dir: str) -> dict:
    """GPU bf16-mixed against CPU fp32 (see the module docstring); `ok` when the curves agree within `tolerance`."""
    gpu = run_curve(config, steps, "gpu", "bf16-mixed", f"{run_dir}/gpu")
    cpu = run_curve(config, steps, "cpu", "32-true", f"{run_dir}/cpu")
    diff = curve_difference(gpu["points"], cpu["points"])
    flops = step_flops_of(config)
    peak = _peak_tflops()
    mfu = flops / gpu["step_s"] / (peak * 1e12) if flops and peak and gpu["step_s"] else None
    ok = diff is not None and diff <= tolerance
    return {"config": config, "ok": ok, "curve_difference": diff, "tolerance": tolerance,
            "gpu_samples_per_s": gpu["samples_per_s"], "cpu_samples_per_s": cpu["samples_per_s"], "mfu": mfu,
            "step_flops": flops, "gpu_points": gpu["points"], "cpu_points": cpu["points"]}


def dry_run(configs: list[str], steps: int, run_dir: str, max_syncs: float, echo=None) -> list[dict]:
    """`count_step_syncs` of each config (`steps` batches); a config that cannot run is a failed row saying why."""
    rows = []
    for config in configs:
        name = Path(config).stem
        try:
            report = count_step_syncs(config, steps, f"{run_dir}/{name}")
            report.update(config=config, ok=report["syncs_per_step"] <= max_syncs, error=None)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the CLI exits on a config error; record it and go on
            if "No `training_step()` method defined" in str(e):  # a sampling/evaluation config: nothing to check
                report = {"config": config, "ok": True, "steps": 0, "syncs_per_step": 0.0, "sites": {},
                          "error": None, "note": "no training step (a test/predict config)"}
                rows.append(report)
                if echo:
                    echo(report)
                continue
            report = {"config": config, "ok": False, "steps": 0, "syncs_per_step": float("nan"), "sites": {},
                      "error": f"{type(e).__name__}: {e}"}
        rows.append(report)
        if echo:
            echo(report)
    return rows


def _dry_row(r: dict) -> str:
    if r.get("error"):
        return f"| {r['config']} | 0 | - | did not run: {r['error'][:200]} |"
    if r.get("note"):
        return f"| {r['config']} | 0 | - | {r['note']} |"
    where = "; ".join(f"{k} ({v:g})" for k, v in list(r["sites"].items())[:4]) or "-"
    return f"| {r['config']} | {r['steps']} | {r['syncs_per_step']:g} | {where} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lit_iclr.core.plan_devicecheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("dry-run", "compare", "kernels"))
    ap.add_argument("configs", nargs="*")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--tolerance", type=float, default=0.1, help="mean |loss_gpu - loss_cpu| / mean |loss_cpu|")
    ap.add_argument("--max-syncs", type=float, default=0.0, help="host syncs allowed per training step")
    ap.add_argument("--run-dir", default="runs/gpu_check")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    a = ap.parse_args(argv)
    failed = 0
    if a.mode == "kernels":
        sites = cpu_only_kernel_sites()
        fallback = onednn_falls_back_off_cpu()
        print(f"CPU-only kernel calls outside core/onednn_linear.py: {', '.join(sites) or 'none'}")
        print(f"core/onednn_linear.py falls back to F.linear off the CPU: {'yes' if fallback else 'NO'}")
        return 0 if not sites and fallback else 1
    if a.mode == "dry-run":
        rows = dry_run(a.configs, a.steps, a.run_dir, a.max_syncs,
                       echo=lambda r: print(f"gpu_check: {_dry_row(r)}", file=sys.stderr, flush=True))
        print("| config | counted batches | host syncs / batch | where |\n|---|---:|---:|---|")
        for r in rows:
            print(_dry_row(r))
            failed += not r["ok"]
    else:
        rows = [compare(c, a.steps, a.tolerance, f"{a.run_dir}/{Path(c).stem}") for c in a.configs]
        print(f"| config | loss curve gpu bf16 vs cpu fp32 (tolerance {a.tolerance:g}) | samples/s gpu | samples/s cpu | "
              "MFU |\n|---|---:|---:|---:|---:|")
        for r in rows:
            d = "-" if r["curve_difference"] is None else f"{r['curve_difference']:.3f}"
            mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
            print(f"| {r['config']} | {d} {'ok' if r['ok'] else 'FAIL'} | {r['gpu_samples_per_s'] or 0:.1f} | "
                  f"{r['cpu_samples_per_s'] or 0:.1f} | {mfu} |")
            failed += not r["ok"]
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
