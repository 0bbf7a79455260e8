"""Readers at real size: each method's DataModule on a file of the real dataset's shapes and layout.

Per method it prints
- the reader's setup time and the train loader's samples/s at the paper batch size with num_workers 0 and 2,
- the samples/s one training step on the named accelerator consumes at the stated MFU (step FLOPs / (peak x MFU)),
  their ratio (goal: loader >= 3x consumption) and the number of loader workers that would get there,
- how one CPU training step's time and the bytes autograd saves for its backward (`saved_tensors_hooks`) grow over
  three input sizes,
as markdown tables, and draws one figure (`--figure`).

Step FLOPs: `lit_iclr.core.plan` (the paper config `configs/paper/<m>.yaml` with the method's `lit_iclr/<m>/plan.py`
when both exist), else `FlopCounterMode` over one real training step of the default config's model on a batch of the
real-shape file (the `flops from` column says which). A default (CPU-sized) model has fewer FLOPs than the paper's, so
its step consumes samples faster: the loader requirement it gives is an upper bound.

    python benchmarks/scale.py                  # all methods (~10 min on 2 cores once the files exist)
    python benchmarks/scale.py --quick          # ~1 min: fewer records, fewer batches (prints what it changes)
    python benchmarks/scale.py --only storm reimts --figure seeds/figures/scale_readers.png

The synthetic files (benchmarks/scale_data.py) are written once into data/scale/ (git-ignored) and reused.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

# this checkout's lit_iclr first (a script's own folder, not the working directory, starts sys.path: without the
# repository root an installed lit_iclr of another checkout would be measured)
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import scale_data  # noqa: E402

ACCEL, MFU = "H100", 0.4


@dataclass
class Spec:
    """One method's real dataset: which writer, which config, what to override, and the input size that grows."""

    name: str
    data: str  # key of scale_data.WRITERS
    config: str
    root: str  # relative to the written folder ("" = the folder itself)
    overrides: list[str] = field(default_factory=list)
    growth_arg: str = ""  # CLI override whose three values grow the input
    growth: tuple = ()
    growth_label: str = ""
    growth_extra: list[str] = field(default_factory=list)  # overrides for the growth runs (smaller batch)


def _storm_periods(days: int) -> list[str]:
    d = [f"2000-01-{1 + k:02d}" for k in range(days)]
    tr, va = days - 4, days - 2
    return [f"--data.init_args.train_period=['{d[0]}:{d[tr - 1]}']", f"--data.init_args.val_period=['{d[tr]}:{d[va - 1]}']",
            f"--data.init_args.test_period=['{d[va]}:{d[-1]}']"]


SPECS = {
    # STORM: the paper's variables (z500, t850, t2m, u10/v10; see papers_1_10.md) + the default config's, lazy reads
    "storm": Spec("storm", "era5", "configs/storm.yaml", "era5_wb2_1.40625deg.zarr",
                  ["--data.init_args.variables=[geopotential@500,temperature@850,u_component_of_wind@500,"
                   "v_component_of_wind@500,specific_humidity@850,2m_temperature,10m_u_component_of_wind,"
                   "10m_v_component_of_wind]", "--data.init_args.eval_lead_times=[6,24]", "--data.init_args.eval_stride=1",
                   "--data.init_args.in_memory=false"],
                  "--model.init_args.coarsen", (2, 1, 0), "model grid (coarsen 2/1/0: 64x32, 128x64, 256x128)",
                  ["--data.init_args.batch_size=2"]),
    # STORM at the paper config's grid (5.625 deg, 64 x 32), variables, leads and in-memory windows: the inputs the
    # plan's step FLOPs are of
    "storm_paper": Spec("storm_paper", "era5_5625", "configs/storm.yaml", "era5_wb2_5.625deg.zarr",
                        ["--data.init_args.variables=[geopotential@500,temperature@850,2m_temperature,"
                         "u_component_of_wind@500,v_component_of_wind@500,u_component_of_wind@850,"
                         "v_component_of_wind@850,specific_humidity@850]", "--data.init_args.lead_times=[6,12,18,24]",
                         "--data.init_args.eval_lead_times=[6,24]",
                         "--data.init_args.eval_stride=1", "--data.init_args.in_memory=true"]),  # as the paper config
    "reimts": Spec("reimts", "physionet", "configs/reimts.yaml", "", [],
                   "--data.init_args.lookback_hours", (27.0, 36.0, 45.0), "lookback hours (27/36/45)"),
    "vgf_d4rl": Spec("vgf_d4rl", "d4rl", "configs/vgf.yaml", "halfcheetah-medium-v2.hdf5",
                     ["--data.init_args.env_id=HalfCheetah-v5", "--data.init_args.batch_size=256",
                      "--data.init_args.updates_per_batch=1"],
                     "--data.init_args.batch_size", (256, 1024, 4096), "batch (256/1024/4096 transitions)"),
    "vgf_ogbench": Spec("vgf_ogbench", "ogbench", "configs/vgf_cube.yaml", "",
                        ["--data.init_args.batch_size=256", "--data.init_args.updates_per_batch=1"],
                        "--data.init_args.batch_size", (256, 1024, 4096), "batch (256/1024/4096 transitions)"),
    "asyncbev": Spec("asyncbev", "nuscenes", "configs/asyncbev.yaml", "",
                     ["--data.init_args.num_sweeps=10", "--data.init_args.max_points=347200",
                      "--data.init_args.image_width=1600", "--data.init_args.image_height=900"],
                     "--data.init_args.num_sweeps", (1, 5, 10), "LiDAR sweeps (1/5/10, 34.7k points each)",
                     ["--data.init_args.batch_size=1"]),
    "mosa": Spec("mosa", "humanml3d", "configs/mosa.yaml", "", [],
                 "--data.init_args.num_frames", (8, 16, 32), "frames per window (8/16/32)"),
    "stageroute": Spec("stageroute", "routerbench", "configs/stageroute.yaml", "routerbench_0shot.pkl",
                       ["--data.init_args.allow_pickle=true"],
                       "--data.init_args.queries_per_step", (100, 500, 2000), "queries per step (100/500/2000)"),
}

QUICK_SIZES = {"era5": dict(days=9), "era5_5625": dict(days=9), "physionet": dict(records=1200),
               "d4rl": dict(transitions=100_000),
               "ogbench": dict(episodes=100), "nuscenes": dict(scenes=10, keyframes=2), "humanml3d": dict(motions=300),
               "routerbench": dict(prompts=3650)}


# ---------------------------------------------------------------------------------------------------------- helpers
def n_samples(batch) -> int:
    if isinstance(batch, list):
        return sum(n_samples(b) for b in batch)
    if isinstance(batch, dict):
        v = next(v for v in batch.values() if isinstance(v, torch.Tensor))
        return len(v)
    return len(batch)


def loader_rate(dm, workers: int, batches: int) -> dict:
    """Samples/s of the train loader over `batches` batches after the first (worker start and first batch timed apart);
    epochs are restarted when one ends before that."""
    dm.num_workers = workers
    # one torch thread, as DataLoader workers run: a batch's index gathers on 2 intra-op threads of a shared 2-core
    # machine spun (ReIMTS: 3.5e3 against 1.2e5 samples/s with one thread)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _loader_rate(dm, batches)
    finally:
        torch.set_num_threads(threads)


def _loader_rate(dm, batches: int) -> dict:
    loader = dm.train_dataloader()
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    t_first = time.perf_counter() - t0
    n, t1 = 0, time.perf_counter()
    for _ in range(batches):
        try:
            b = next(it)
        except StopIteration:
            it = iter(loader)
            b = next(it)
        n += n_samples(b)
    dt = time.perf_counter() - t1
    del it, loader
    gc.collect()
    return {"first_s": t_first, "rate": n / dt, "batch": n_samples(first), "first": first}


def _plain_optimizers(module) -> None:
    """Manual optimisation without a Trainer: the module's own optimizers, a plain backward (FLOP counting only)."""
    from lightning.pytorch.core.optimizer import _configure_optimizers

    got = module.configure_optimizers()
    optims = _configure_optimizers(got)[0] if got is not None else []
    module.optimizers = lambda use_pl_optimizer=True: optims[0] if len(optims) == 1 else optims
    module.manual_backward = lambda loss, *a, **k: loss.backward()
    module.lr_schedulers = lambda: None
    module.optimizer_steps_are_plain = lambda: False
    module.clip_gradients = lambda opt, gradient_clip_val=None, **k: torch.nn.utils.clip_grad_norm_(
        [p for g in opt.param_groups for p in g["params"]], gradient_clip_val or 1e9)


def default_step_loss(module, batch):
    """One training step as the Trainer runs it (no logging): the loss for automatic optimisation (its backward is
    run by the caller), or None after a manually optimised step (which ran its own backward and optimizer steps)."""
    if module.automatic_optimization:
        return module.training_step(batch, 0)
    if not getattr(module, "_scale_plain", False):
        _plain_optimizers(module)
        module._scale_plain = True
    module.training_step(batch, 0)
    return None


def step_cost(module, batch, reps: int = 2) -> dict:
    """CPU time of one training step (median of `reps` after one warm-up) and the bytes its autograd graph saves."""
    from torch.utils.flop_counter import FlopCounterMode

    module.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FlopCounterMode(display=False) as counter:  # forward + backward (+ a manual step's own backward)
            loss = default_step_loss(module, batch)
            if loss is not None and loss.requires_grad:
                loss.backward()
        module.zero_grad(set_to_none=True)
        flops = int(counter.get_total_flops())
        saved: dict[int, int] = {}

        def pack(t):
            try:
                s = t.untyped_storage()
                saved[s.data_ptr()] = s.nbytes()
            except (RuntimeError, NotImplementedError):
                pass
            return t

        def once(hooks: bool) -> float:
            t0 = time.perf_counter()
            if hooks:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    loss = default_step_loss(module, batch)
            else:
                loss = default_step_loss(module, batch)
            if loss is not None and loss.requires_grad:
                loss.backward()
            module.zero_grad(set_to_none=True)
            return time.perf_counter() - t0

        hooks = True
        try:
            once(True)  # warm-up, and the saved bytes
        except RuntimeError as e:  # torch.func transforms (vmap/grad) refuse saved-tensor hooks
            if "saved tensor hooks" not in str(e):
                raise
            hooks = False
            once(False)
        times = [once(False) for _ in range(reps)]
    return {"flops": flops, "cpu_s": statistics.median(times), "saved_bytes": sum(saved.values()) if hooks else None}


def paper_flops(spec: Spec, batch_size: int) -> tuple[int, str] | None:
    """FLOPs of one step of the paper config through `lit_iclr.core.plan`, when the paper config and the method's
    plan hooks exist."""
    paper = Path(f"configs/paper/{spec.config.split('/')[-1].replace('_cube', '')}")
    pkg = spec.name.split("_")[0]
    if not paper.exists() or not Path(f"lit_iclr/{pkg}/plan.py").exists():
        return None
    from lit_iclr.core import plan

    try:
        module, dm, _ = plan.build_on_meta([str(paper)])
        hooks = plan.method_hooks(module)
        batch = hooks.example_batch(dm, batch_size, "meta")
        return plan.step_flops(module, batch, hooks.step_loss), f"{paper} + lit_iclr/{pkg}/plan.py"
    except Exception as e:  # noqa: BLE001 - a plan in progress must not stop the reader measurement
        print(f"  ({spec.name}: paper plan not usable: {type(e).__name__}: {str(e)[:120]}; using the default config)")
        return None


def build(spec: Spec, root: Path, extra: list[str] = ()):
    from lit_iclr.core.plan import build as build_cfg

    args = [f"--data.init_args.root={root}", "--data.init_args.data_dir=data/scale/cache", *spec.overrides, *extra]
    if spec.name.startswith("storm"):
        args += _storm_periods(spec_days(root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module, dm, _ = build_cfg([spec.config], "cpu", args)
    return module, dm


def spec_days(root: Path) -> int:
    import xarray as xr

    ds = xr.open_zarr(root, consolidated=True)
    return int(ds.sizes["time"] // 4)


def setup(dm, module=None) -> float:
    """prepare_data + setup of the DataModule (timed), then the module's own `setup` with the DataModule as a Trainer
    would give it (statistics, routers built from the data), under a stand-in that only carries the DataModule."""
    import types

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.prepare_data()
        dm.setup("fit")
        dt = time.perf_counter() - t0
        if module is not None and hasattr(module, "setup"):
            module._trainer = types.SimpleNamespace(datamodule=dm, global_step=0, global_rank=0, world_size=1,
                                                    strategy=types.SimpleNamespace(root_device=torch.device("cpu")))
            try:
                module.setup("fit")
            finally:
                module._trainer = None
    return dt


# ---------------------------------------------------------------------------------------------------------- running
def measure(spec: Spec, out_root: Path, sizes: dict, batches: int, reps: int, workers=(0, 2), growth: bool = True,
            accel: str = ACCEL, mfu: float = MFU, min_step_s: float = 1e-3, paper: bool = True) -> dict:
    from lit_iclr.core.plan import accelerator

    t0 = time.perf_counter()
    folder = scale_data.WRITERS[spec.data](out_root / spec.data, **sizes.get(spec.data, {}))
    write_s = time.perf_counter() - t0
    root = folder / spec.root if spec.root else folder
    module, dm = build(spec, root)
    res = {"method": spec.name, "data": spec.data, "disk_MB": scale_data.disk_bytes(folder) / 1e6, "write_s": write_s,
           "setup_s": setup(dm, module)}
    for w in workers:
        r = loader_rate(dm, w, batches)
        res[f"rate_w{w}"], res[f"first_w{w}"] = r["rate"], r["first_s"]
        first = r["first"]
    res["batch"] = n_samples(first)
    res["shapes"] = {k: list(v.shape) for k, v in (first[0] if isinstance(first, list) else first).items()
                     if isinstance(v, torch.Tensor)} if isinstance(first, (dict, list)) else list(first.shape)
    cost = step_cost(module, first, reps)
    got = paper_flops(spec, res["batch"]) if paper else None
    res["flops"], res["flops_from"] = got if got else (cost["flops"], f"FlopCounterMode, {spec.config} model")
    a = accelerator(accel)
    step_s = res["flops"] / (a.bf16_tflops * 1e12 * mfu) if res["flops"] else None
    res["gpu_step_flops_s"] = step_s
    if step_s is not None:  # a small model's step is bound by kernel launches, not FLOPs: at least `min_step_s`
        step_s = max(step_s, min_step_s)
    res["gpu_step_s"] = step_s
    res["consume"] = res["batch"] / step_s if step_s else None
    best = max(res[f"rate_w{w}"] for w in workers)
    res["ratio"] = best / res["consume"] if res["consume"] else None
    # workers for 3x: each worker adds about the single-process rate (the rate at num_workers 0)
    res["workers_3x"] = math.ceil(3 * res["consume"] / res["rate_w0"]) if res["consume"] else 0
    del module
    gc.collect()
    res["growth"] = []
    if growth and spec.growth_arg:
        for v in spec.growth:
            m, d = build(spec, root, [*spec.growth_extra, f"{spec.growth_arg}={v}"])
            setup(d, m)
            d.num_workers = 0
            b = next(iter(d.train_dataloader()))
            c = step_cost(m, b, reps)
            res["growth"].append({"size": v, "cpu_s": c["cpu_s"],
                                  "saved_MB": None if c["saved_bytes"] is None else c["saved_bytes"] / 1e6,
                                  "flops": c["flops"], "batch": n_samples(b)})
            del m, d
            gc.collect()
    print(f"  {spec.name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return res


def _fmt(x, unit=""):
    if x is None:
        return "-"
    for div, suf in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suf}{unit}"
    return f"{x:.3g}{unit}"


def tables(results: list[dict], accel: str, mfu: float) -> str:
    lines = [f"| method | data (disk) | batch | setup s | loader samples/s w0 / w2 | "
             f"{accel} step at MFU {mfu} (FLOPs -> with floor) | consumes samples/s | loader / consumption | "
             "workers for 3x | FLOPs/step (from) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = f"{r['ratio']:.3g}x" if r["ratio"] is not None else "-"
        lines.append(f"| {r['method']} | {r['data']} ({r['disk_MB']:.0f} MB) | {r['batch']} | {r['setup_s']:.1f} | "
                     f"{r['rate_w0']:.4g} / {r['rate_w2']:.4g} | {_fmt(r['gpu_step_flops_s'], 's')} -> "
                     f"{_fmt(r['gpu_step_s'], 's')} | {_fmt(r['consume'])} | "
                     f"{ratio} | {r['workers_3x']} | {_fmt(r['flops'])} ({r['flops_from']}) |")
    lines += ["", "| method | input size grown | size | batch | CPU step s | saved for backward MB | FLOPs/step |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        spec = SPECS[r["method"]]
        for g in r["growth"]:
            lines.append(f"| {r['method']} | {spec.growth_label} | {g['size']} | {g['batch']} | {g['cpu_s']:.3g} | "
                         f"{_fmt(g['saved_MB'])} | {_fmt(g['flops'])} |")
    return "\n".join(lines)


def figure(results: list[dict], path: Path, accel: str, mfu: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    names = [r["method"] for r in results]
    x = range(len(names))
    a.bar([i - 0.27 for i in x], [r["rate_w0"] for r in results], 0.27, label="loader, 0 workers")
    a.bar(list(x), [r["rate_w2"] for r in results], 0.27, label="loader, 2 workers")
    a.bar([i + 0.27 for i in x], [3 * (r["consume"] or 0) for r in results], 0.27, label=f"3x {accel} consumption")
    a.set_yscale("log")
    a.set_xticks(list(x), names, rotation=30, ha="right")
    a.set_ylabel("samples / s")
    a.set_title(f"train loader vs. 3x what one {accel} step consumes (MFU {mfu})")
    a.legend(fontsize=8)
    for r in results:
        if len(r["growth"]) < 2:
            continue
        g = r["growth"]
        t0 = g[0]["cpu_s"]
        b.plot([1, 2, 3], [e["cpu_s"] / t0 for e in g], "o-", label=r["method"])
        if g[0]["saved_MB"]:
            b.plot([1, 2, 3], [e["saved_MB"] / g[0]["saved_MB"] for e in g], "x--", color=b.lines[-1].get_color())
    b.set_yscale("log")
    b.set_xticks([1, 2, 3], ["small", "middle", "largest"])
    b.set_ylabel("relative to the smallest size")
    b.set_title("CPU step time (o) and saved-for-backward bytes (x) over 3 input sizes")
    b.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", choices=list(SPECS), help="methods to run (default: all)")
    p.add_argument("--quick", action="store_true", help="~1 min: fewer records per file, fewer batches, one rep")
    p.add_argument("--batches", type=int, default=8, help="batches timed per loader setting")
    p.add_argument("--reps", type=int, default=2, help="timed CPU steps per size (after one warm-up)")
    p.add_argument("--no-growth", action="store_true", help="skip the three-size step-time/memory growth")
    p.add_argument("--out", default=str(scale_data.ROOT), help="where the synthetic files go")
    p.add_argument("--figure", default=None, help="write the figure here (e.g. seeds/figures/scale_readers.png)")
    p.add_argument("--json", default="benchmarks/out/scale.json")
    p.add_argument("--merge", default=None, help="earlier --json results: rows of the methods run now replace theirs")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: measure one method, print its JSON
    p.add_argument("--accelerator", default=ACCEL)
    p.add_argument("--mfu", type=float, default=MFU)
    p.add_argument("--min-step-ms", type=float, default=1.0,
                   help="floor of the accelerator step time (kernel launches of a small model; 1 ms assumed)")
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    sizes, out = {}, Path(args.out)
    if args.quick:
        sizes, out = QUICK_SIZES, Path(args.out + "-quick")
        args.batches, args.reps = min(args.batches, 3), 1
        if not args.one:
            print(f"--quick changes: files {QUICK_SIZES} under {out} (per-record shapes unchanged); batches timed "
                  f"{args.batches}; reps {args.reps}; methods {args.only or ['reimts', 'vgf_d4rl', 'stageroute']}")
        args.only = args.only or ["reimts", "vgf_d4rl", "stageroute"]
    if args.one:  # one method per process: separate CLI parsers, memory and worker pools
        r = measure(SPECS[args.one], out, sizes, args.batches, args.reps, growth=not args.no_growth,
                    accel=args.accelerator, mfu=args.mfu, min_step_s=args.min_step_ms / 1e3)
        print("SCALE-RESULT " + json.dumps(r, default=str))
        return [r]
    print(f"machine: {os.cpu_count()} CPU cores (loader workers compete with the main process for them); torch "
          f"{torch.__version__}")
    import subprocess

    results = []
    for name in args.only or list(SPECS):
        print(f"{name}: writing/reading {SPECS[name].data} ...", flush=True)
        cmd = [sys.executable, __file__, "--one", name, "--out", args.out, "--batches", str(args.batches), "--reps",
               str(args.reps), "--accelerator", args.accelerator, "--mfu", str(args.mfu), "--min-step-ms",
               str(args.min_step_ms), "--json", ""] + (["--quick"] if args.quick else []) + \
              (["--no-growth"] if args.no_growth else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = [line for line in proc.stdout.splitlines() if line.startswith("SCALE-RESULT ")]
        for line in proc.stdout.splitlines():
            if line.startswith("  ") or line.startswith("--quick"):
                print(line)
        if proc.returncode or not got:
            print(f"  {name}: FAILED (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
            continue
        results.append(json.loads(got[-1][len("SCALE-RESULT "):]))
    if args.merge:
        ran = {r["method"] for r in results}
        old = [r for r in json.loads(Path(args.merge).read_text()) if r["method"] not in ran]
        results = sorted(old + results, key=lambda r: list(SPECS).index(r["method"]))
    print(tables(results, args.accelerator, args.mfu))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    if args.figure:
        figure(results, Path(args.figure), args.accelerator, args.mfu)
    return results


if __name__ == "__main__":
    main()
