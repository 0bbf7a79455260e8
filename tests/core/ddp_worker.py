"""Run by the DDP tests as its own process (real DDP over gloo on the CPU), saving what each rank ends with.

    python tests/core/ddp_worker.py toy OUT_DIR DEVICES BATCH_SIZE         the toy model, 6 steps
    python tests/core/ddp_worker.py skip OUT_DIR [MODEL]                   rank 1 never reaches rank 0's all-reduce
                                                                           (BroadcastOnRankZeroToy: rank 0's broadcast)
    python tests/core/ddp_worker.py twin OUT_DIR CONFIG DEVICES [ARGS...]  a twin config for one optimiser step

`twin` is the first-step-equality harness (`first_step` below runs it twice): `DEVICES` processes each with the
twin's per-device batch, one optimiser step, then a validation of the stepped model; each rank saves its parameters
and the validation metrics to OUT_DIR/devices{D}_rank{r}.pt. A method that refuses several processes
(`single_process_reason`) exits 2 with its one-line reason on stderr.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from lit_iclr.cli import main  # noqa: E402
from tests.core.toy import ToyRegression  # noqa: E402

QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


class SkippingToy(ToyRegression):
    """Rank 1 skips a collective that rank 0 runs (a rank-dependent code path)."""

    def training_step(self, batch, batch_idx):
        if self.global_rank == 0:
            (Path(self.trainer.default_root_dir).parent / "entered").write_text(str(time.time()))  # rank 0 waits
            dist.all_reduce(torch.ones(1))
        else:
            time.sleep(120)
        return super().training_step(batch, batch_idx)


class BroadcastOnRankZeroToy(ToyRegression):
    """Rank 0 alone reads `trainer.log_dir` (a broadcast from rank 0) at the second step, while rank 1 goes on to that
    step's gradient all-reduce: the hang model interactions had, both ranks waiting in different collectives."""

    def training_step(self, batch, batch_idx):
        if batch_idx == 1 and self.global_rank == 0:
            (Path(self.trainer.default_root_dir).parent / "entered").write_text(str(time.time()))
            _ = self.trainer.log_dir
        return super().training_step(batch, batch_idx)


def _save(cli, out: Path, devices: str, **extra) -> None:
    metrics = {k: float(v) for k, v in cli.trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
    params = {k: v.detach().cpu().clone() for k, v in cli.model.named_parameters()}
    torch.save({"state": params, "metrics": metrics, "world": cli.trainer.world_size, "pid": os.getpid(),
                "global_step": cli.trainer.global_step, **extra}, out / f"devices{devices}_rank{cli.trainer.global_rank}.pt")


def toy(out: Path, devices: str, batch: str) -> None:
    strategy = ["--trainer.strategy", "ddp"] if int(devices) > 1 else []
    cli = main(["fit", "--model", "ToyRegression", "--data", "ToyData", "--data.init_args.data_dir", str(out / "data"),
                "--data.init_args.batch_size", batch, "--trainer.accelerator", "cpu", "--trainer.devices", devices,
                *strategy, "--trainer.max_steps", "6", "--trainer.max_epochs", "10", "--trainer.num_sanity_val_steps",
                "0", *QUIET, "--trainer.default_root_dir", str(out / f"run{devices}")])
    cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)  # val/loss averaged over ranks
    _save(cli, out, devices, val_loss=float(cli.trainer.callback_metrics["val/loss"]))


def skip(out: Path, model: str = "SkippingToy") -> None:
    sys.modules.setdefault("tests.core.ddp_worker", sys.modules["__main__"])  # the model class by its import path
    main(["fit", "--config", "configs/trainer/ddp.yaml", "--model", f"tests.core.ddp_worker.{model}", "--data",
          "ToyData", "--data.init_args.data_dir", str(out / "data"), "--data.init_args.batch_size", "4",
          "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy.init_args.timeout_s", "5",
          "--trainer.max_steps", "6", "--trainer.num_sanity_val_steps", "0", *QUIET,
          "--trainer.default_root_dir", str(out / "run2")])


def twin(out: Path, config: str, devices: str, *args: str) -> None:
    strategy = ["--config", "configs/trainer/ddp.yaml"] if int(devices) > 1 else []  # first: it sets devices
    cli = main(["fit", "--config", config, *strategy, "--trainer.accelerator", "cpu", "--trainer.devices", devices,
                "--trainer.num_nodes", os.environ.get("TWIN_NUM_NODES", "1"),
                "--trainer.default_root_dir", str(out / f"run{devices}"), "--data.init_args.data_dir",
                str(out / "data"), "--trainer.max_steps", "1", "--trainer.num_sanity_val_steps", "0",
                "--trainer.limit_val_batches", "0", "--trainer.logger", "false", "--checkpoint.save_last", "false",
                *QUIET, *args])
    # the stepped model, validated on the whole (tiny) validation set: metrics must be reduced over ranks
    cli.trainer.limit_val_batches = 1.0
    if type(cli.model).validation_step is not L.LightningModule.validation_step:  # a method may have none
        cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    _save(cli, out, devices)


def twin_batch_args(config: str | Path, devices: int) -> tuple[list[str], int | None]:
    """`--data.init_args.batch_size` giving each of `devices` ranks half the global batch of the comparison (the
    twin's batch, rounded down to an even number); no argument for a DataModule without a batch size."""
    import yaml

    batch = ((yaml.safe_load(Path(config).read_text()) or {}).get("data") or {}).get("init_args", {}).get("batch_size")
    if not isinstance(batch, int) or batch < 2:
        return [], None
    per_device = batch // 2
    return ["--data.init_args.batch_size", str(per_device * 2 // devices)], per_device * 2


def run_worker(*argv: str, env: dict | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """The worker in its own process; `timeout` seconds (default 540, or LIT_ICLR_DDP_WORKER_TIMEOUT_S on a machine
    shared with other jobs, where one twin's 2-process run has taken over 9 minutes)."""
    timeout = timeout if timeout is not None else float(os.environ.get("LIT_ICLR_DDP_WORKER_TIMEOUT_S", 540))
    return subprocess.run([sys.executable, str(Path(__file__)), *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, **(env or {})})


def first_step(config: str | Path, out: Path, *args: str) -> dict:
    """One optimiser step of `config` on 1 process x global batch and on 2 processes x global batch / 2.

    Returns {"status": "ok" | "one process" | "failed", "reason": one line, "single": rank-0 result of 1 process,
    "ranks": [rank results of 2 processes]}; ok only when both runs finished."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for devices in (1, 2):
        batch, _ = twin_batch_args(config, devices)
        proc = run_worker("twin", str(out), str(config), str(devices), *batch, *args)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("lit-iclr: error:")]
        if proc.returncode != 0:
            reason = errors[-1] if errors else (proc.stderr.strip().splitlines() or ["no output"])[-1]
            if devices == 2 and "runs on one process only" in reason:
                return {"status": "one process", "reason": reason.removeprefix("lit-iclr: error: "), "results": results}
            return {"status": "failed", "reason": f"{devices} process(es): {reason[:400]}", "results": results,
                    "stderr": proc.stderr[-4000:]}
        results[devices] = [torch.load(p, weights_only=True) for p in sorted(out.glob(f"devices{devices}_rank*.pt"))]
    return {"status": "ok", "reason": "", "single": results[1][0], "ranks": results[2]}


WALL_CLOCK = ("_per_s", "speed_ratio")  # measured speeds (JULI), not reduced values


def measured(result: dict) -> dict:
    """What the platform card's table reports of a `first_step` result: the largest parameter difference of the ranks
    against one process, and the validation metrics compared (those `compare` checks) with the largest relative one."""
    single, ranks = result["single"], result["ranks"]
    diff = max(((r["state"][k].double() - v.double()).abs().max().item() for k, v in single["state"].items()
                for r in ranks if k in r["state"] and r["state"][k].shape == v.shape and v.numel()), default=0.0)
    keys = [k for k in single["metrics"] if k.startswith("val/") and not any(t in k for t in WALL_CLOCK)]
    rel = max((abs(r["metrics"].get(k, float("nan")) - single["metrics"][k]) / max(abs(single["metrics"][k]), 1e-12)
               for k in keys for r in ranks), default=0.0)
    return {"max_param_diff": diff, "val_metrics": len(keys), "max_metric_rel_diff": rel}


def compare(result: dict, rtol: float = 1e-4, atol: float = 1e-4) -> list[str]:
    """Where a `first_step` result breaks first-step equality or metric reduction, as lines ([] when it holds)."""
    single, ranks = result["single"], result["ranks"]
    problems = []
    if len(ranks) != 2 or {r["world"] for r in ranks} != {2}:
        return [f"expected 2 ranks of a world of 2, got {[r['world'] for r in ranks]}"]
    for k, v in single["state"].items():
        for i, r in enumerate(ranks):
            w = r["state"].get(k)
            if w is None or w.shape != v.shape:
                problems.append(f"rank {i}: parameter {k} missing or of another shape")
            elif not torch.allclose(w.double(), v.double(), rtol=rtol, atol=atol):
                problems.append(f"rank {i}: parameter {k} differs by {(w.double() - v.double()).abs().max():.3g}")
    for k, v in single["metrics"].items():
        if not k.startswith("val/") or any(t in k for t in WALL_CLOCK):
            continue  # a measured speed depends on the machine's load, not on the reduction
        for i, r in enumerate(ranks):
            w = r["metrics"].get(k)
            if w is None or abs(w - v) > max(1e-4, 1e-3 * abs(v)):
                problems.append(f"rank {i}: {k} = {w} vs {v} on one process")
    return problems


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "toy":
        toy(Path(rest[0]), rest[1], rest[2])
    elif mode == "skip":
        skip(Path(rest[0]), *rest[1:])
    elif mode == "twin":
        twin(Path(rest[0]), rest[1], rest[2], *rest[3:])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
