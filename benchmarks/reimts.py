"""ReIMTS benchmark: masked MSE / MAE of GraFITi, mTAN, ReIMTS(each), capacity-matched backbones, ReIMTS ablations and
a resampling baseline, with paired 95% confidence intervals of the MSE differences over seeds.

    .venv/bin/python benchmarks/reimts.py            # default data (3000 generated PhysioNet 2012 records), 5 seeds
    .venv/bin/python benchmarks/reimts.py --quick    # smoke run: 400 records, 1 seed, 1 epoch
    .venv/bin/python benchmarks/reimts.py --jobs 3   # the 3 seeds in 3 processes

Every model trains for the same number of epochs with Adam; the test split is scored with the weights of the best
validation epoch. Speed is training samples/s, reported relative to the backbone alone measured in the same run.
Prints a markdown table and writes `benchmarks/out/reimts/{results.json,forecast.png}`.
"""
from __future__ import annotations

import argparse
import copy
import json
import multiprocessing as mp
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import lightning as L
import torch

from lit_iclr.core.stats import paired_ci, ratio_ci
from lit_iclr.core.timing import interleaved_cpu_times
from lit_iclr.reimts import IMTSForecaster, PhysioNet2012
from lit_iclr.reimts.plots import forecast_figure, plt

# name -> model init args (anything not given: d_model 32, 1 GraFITi layer, 4 heads, finest_loss "horizon", align "end").
# The paper's time-period lists on P12: GraFITi 39 -> 24 -> 12 h, mTAN 39 -> 24 h.
G3 = dict(backbone="grafiti", variant="reimts", periods=[24.0, 12.0])
MODELS = {
    "GraFITi": dict(backbone="grafiti", variant="backbone"),
    "GraFITi, 3 layers": dict(backbone="grafiti", variant="backbone", n_layers=3),  # capacity-matched (fewer params)
    "GraFITi, last 12 h only": dict(backbone="grafiti", variant="backbone", context_hours=12.0),  # context diagnostic
    "ReIMTS(GraFITi)": G3,
    "ReIMTS(GraFITi, 3 layers)": G3 | dict(n_layers=3),  # same depth as the 3-layer backbone
    "ReIMTS(GraFITi), loss on all sub-samples": G3 | dict(finest_loss="all"),
    "ReIMTS(GraFITi), start-aligned": G3 | dict(align="start"),
    "ReIMTS(GraFITi) w/o fusion": G3 | dict(variant="reimts_nofusion"),
    "Resampling(GraFITi)": dict(backbone="grafiti", variant="resampling", resample_bins=[12.0, 4.0]),
    "mTAN": dict(backbone="mtan", variant="backbone"),
    "mTAN, d_model 46": dict(backbone="mtan", variant="backbone", d_model=46),  # capacity-matched (fewer params)
    "ReIMTS(mTAN)": dict(backbone="mtan", variant="reimts", periods=[24.0]),
}
# headline comparisons (paired over seeds): (a, b) -> difference a - b of test MSE
PAIRS = [("ReIMTS(GraFITi)", "GraFITi"), ("ReIMTS(GraFITi)", "GraFITi, 3 layers"),
         ("ReIMTS(GraFITi, 3 layers)", "GraFITi, 3 layers"),
         ("ReIMTS(GraFITi)", "Resampling(GraFITi)"), ("ReIMTS(GraFITi), loss on all sub-samples", "ReIMTS(GraFITi)"),
         ("ReIMTS(GraFITi), start-aligned", "ReIMTS(GraFITi)"), ("ReIMTS(GraFITi) w/o fusion", "ReIMTS(GraFITi)"),
         ("GraFITi, last 12 h only", "GraFITi"), ("GraFITi, 3 layers", "GraFITi"),
         ("ReIMTS(mTAN)", "mTAN"), ("ReIMTS(mTAN)", "mTAN, d_model 46")]
REFERENCE = {name: ("mTAN" if "mTAN" in name else "GraFITi") for name in MODELS if name not in ("GraFITi", "mTAN")}


ROOT = Path(__file__).resolve().parents[1]

class Recorder(L.Callback):
    """Training samples/s (train batches only) and the weights of the best validation epoch."""

    def __init__(self):
        self.samples, self.seconds, self.best, self.state = 0, 0.0, float("inf"), None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seconds += time.perf_counter() - self._t
        self.samples += len(batch["x"])

    def on_train_epoch_end(self, trainer, module):  # runs after the epoch's validation has logged val/mse
        mse = float(trainer.callback_metrics.get("val/mse", float("inf")))
        if mse < self.best:
            self.best, self.state = mse, copy.deepcopy(module.state_dict())


def crop_context(dm: PhysioNet2012, hours: float) -> PhysioNet2012:
    """A copy of the data module whose inputs keep only the last `hours` of the lookback (observations before are
    masked out): how much the backbone gains from older context is what a multi-scale model can exploit."""
    dm = copy.deepcopy(dm)
    cut = (dm.lookback_hours - hours) / dm.record_hours
    for ds in dm.splits.values():
        t = ds.tensors
        keep = (t["x_time"] >= cut - 1e-6).unsqueeze(-1).to(t["x_mask"].dtype)
        t["x_mask"] = t["x_mask"] * keep
        t["x"] = t["x"] * keep
    return dm


def context_check(dm: PhysioNet2012) -> str:
    """Does older context predict the horizon? Closed-form per-variable forecasts of the test targets from the last
    `c` hours of each patient's own lookback (no training): the last observed value, the mean, and a least-squares
    line through the observations (evaluated at the target time). If the longer windows do not beat the short ones,
    the records hold little slow (multi-scale) structure for a model to use."""
    t = dm.splits["test"].tensors
    hours = t["x_time"] * dm.record_hours  # (N, L)
    y, ym, yt = t["y"], t["y_mask"], t["y_time"] * dm.record_hours
    rows = ["| context (h) | last value MSE | mean MSE | linear trend MSE |", "|---|---|---|---|"]
    # the same targets in every row: variables with >= 2 observations in the shortest context
    short = t["x_mask"] * (hours >= dm.lookback_hours - 6).unsqueeze(-1)
    ok = (short.sum(1) >= 2).unsqueeze(1) * ym
    for c in (6, 12, 24, 36):
        m = t["x_mask"] * (hours >= dm.lookback_hours - c).unsqueeze(-1)  # (N, L, V)
        n = m.sum(1)  # observations per patient and variable
        h = hours.unsqueeze(-1).expand_as(m)
        mean = (t["x"] * m).sum(1) / n.clamp_min(1)
        last_idx = (m * torch.arange(1, m.shape[1] + 1).view(1, -1, 1)).argmax(1, keepdim=True)
        last = t["x"].gather(1, last_idx).squeeze(1)
        hm = (h * m).sum(1) / n.clamp_min(1)
        cov = ((h - hm.unsqueeze(1)) * (t["x"] - mean.unsqueeze(1)) * m).sum(1)
        var = (((h - hm.unsqueeze(1)) ** 2) * m).sum(1)
        slope = torch.where(var > 1e-6, cov / var.clamp_min(1e-6), torch.zeros_like(var))
        errs = []
        for pred in (last.unsqueeze(1).expand_as(y), mean.unsqueeze(1).expand_as(y),
                     mean.unsqueeze(1) + slope.unsqueeze(1) * (yt.unsqueeze(-1) - hm.unsqueeze(1))):
            errs.append(float((((pred - y) ** 2) * ok).sum() / ok.sum()))
        rows.append(f"| {c} | {errs[0]:.4f} | {errs[1]:.4f} | {errs[2]:.4f} |")
    return "\n".join(rows) + f"\n\n{int(ok.sum())} test targets (variables with >= 2 observations in the last 6 h)."


def _component_tensor(ds, names: list[str], comps: dict) -> torch.Tensor:
    """(N, 48, V, 2) true hourly (slow, fast) components of every sample's variables (0 where never written)."""
    out = torch.zeros(len(ds), 48, len(names), 2)
    for i, rid in enumerate(ds.tensors["record_id"].tolist()):
        for j, name in enumerate(names):
            if name in comps[int(rid)]:
                out[i, :, j] = torch.from_numpy(comps[int(rid)][name].T).float()
    return out


def _target_features(ds, dm: PhysioNet2012, comp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per observed target: features (n, 6) = [1, mean of the last 12 h, observed in the last 12 h, mean of the whole
    lookback, true slow component, true fast component] at the target hour, its value, and its variable index."""
    t = ds.tensors
    hours = t["x_time"] * dm.record_hours
    feats = []
    for c in (12.0, dm.lookback_hours):
        m = t["x_mask"] * (hours >= dm.lookback_hours - c - 1e-6).unsqueeze(-1)
        n = m.sum(1)
        feats.append(((t["x"] * m).sum(1) / n.clamp_min(1), (n > 0).float()))  # (N, V) each
    ym = t["y_mask"] > 0
    s, q, v = ym.nonzero(as_tuple=True)
    hour = (t["y_time"][s, q] * dm.record_hours).round().long().clamp(0, 47)
    x = torch.stack([torch.ones(len(s)), feats[0][0][s, v], feats[0][1][s, v], feats[1][0][s, v],
                     comp[s, hour, v, 0], comp[s, hour, v, 1]], 1)
    return x, t["y"][s, q, v], v


def oracle_check(dm: PhysioNet2012, args) -> str:
    """Do the records carry multi-scale structure a forecaster can use? Per-variable least squares on the training
    targets, scored on the test targets: a forecaster that is *not* told the generator's latent components (recent and
    whole-lookback means) against oracles told the true slow and / or fast component of each series at the target
    hour (the best a model that extracted the multi-scale structure from the history could know). A small oracle gain
    means the targets hold little multi-scale structure beyond what the recent level gives."""
    from lit_iclr.reimts.generator import generator_components
    comps = generator_components(args.patients, 0, args.dynamics)
    names = dm.variable_names
    tr = _target_features(dm.splits["train"], dm, _component_tensor(dm.splits["train"], names, comps))
    te = _target_features(dm.splits["test"], dm, _component_tensor(dm.splits["test"], names, comps))
    rows = ["| forecaster (per-variable least squares) | features | test MSE |", "|---|---|---|"]
    sets = {"not told (levels only)": [0, 1, 2, 3], "oracle: true slow": [0, 1, 2, 3, 4],
            "oracle: true fast": [0, 1, 2, 3, 5], "oracle: true slow + fast": [0, 1, 2, 3, 4, 5]}
    for label, cols in sets.items():
        se, n = 0.0, 0
        for j in range(len(names)):
            a, b = tr[2] == j, te[2] == j
            if not b.any():
                continue
            w = torch.linalg.lstsq(tr[0][a][:, cols].double(), tr[1][a].double().unsqueeze(1), driver="gelsd").solution
            pred = (te[0][b][:, cols].double() @ w).squeeze(1)
            se, n = se + float(((pred - te[1][b]) ** 2).sum()), n + int(b.sum())
        rows.append(f"| {label} | {', '.join(['1', 'mean 12 h', 'seen 12 h', 'mean 36 h', 'slow', 'fast'][c] for c in cols)} "
                    f"| {se / n:.4f} |")
    return "\n".join(rows) + f"\n\n{n} test targets, data `dynamics: {args.dynamics}`."


def compile_check(dm: PhysioNet2012, args, steps: int = 20, warmup: int = 3, rounds: int = 8) -> str:
    """CPU time (`time.process_time`, one thread) per training step (forward, backward, Adam) of ReIMTS(GraFITi) and
    GraFITi, eager against `compile: true` (inductor, dynamic shapes), on the same training batches in one process.
    The first compiled steps (tracing and code generation) are reported separately as the compile cost. Then `rounds`
    rounds of one pass over the `steps` batches per side, the order flipping every round; compiled / eager by the
    medians and as the mean of the per-round ratios with its paired 95% CI."""
    batches = [b for _, b in zip(range(warmup + steps), dm.train_dataloader(), strict=False)]
    rows = ["| model | eager ms/step | compiled ms/step | compiled / eager (medians) | per-round ratio [paired 95% CI] | "
            "compile s (first steps) |", "|---|---|---|---|---|---|"]
    for name in [m for m in args.models if m in ("GraFITi", "ReIMTS(GraFITi)")]:
        steppers, first = {}, 0.0
        for compiled in (False, True):
            torch.manual_seed(0)
            kw = {"d_model": args.d_model, "n_layers": 1, "n_heads": 4, "align": "end"} | MODELS[name]
            model = IMTSForecaster(n_vars=dm.n_vars, lookback_hours=dm.lookback_hours, forecast_hours=dm.forecast_hours,
                                   record_hours=dm.record_hours, plot_every_n_epochs=0, compile=compiled, **kw)
            opt = torch.optim.Adam(model.parameters(), lr=args.lr)
            model.log = lambda *a, **k: None  # no Trainer here: time the step itself

            def step(batch, model=model, opt=opt):
                opt.zero_grad(set_to_none=True)
                model.training_step(batch, 0).backward()
                opt.step()

            t0 = time.process_time()
            for b in batches[:warmup]:
                step(b)
            first = time.process_time() - t0 if compiled else first
            steppers[compiled] = step
        blocks = interleaved_cpu_times({c: lambda step=step: [step(b) for b in batches[warmup:]]
                                        for c, step in steppers.items()}, rounds)
        ms = {c: [1000 * t / steps for t in times] for c, times in blocks.items()}
        eager, comp = statistics.median(ms[False]), statistics.median(ms[True])
        rows.append(f"| {name} | {eager:.1f} | {comp:.1f} | {comp / eager:.2f}x | {ratio_ci(ms[True], ms[False])} | "
                    f"{first:.1f} |")
    return "\n".join(rows) + (f"\n\n{rounds} interleaved rounds of {steps} timed steps after {warmup} warm-up steps, "
                              f"batch {args.batch_size}, torch {torch.__version__}.")


def run(name: str, dm: PhysioNet2012, seed: int, epochs: int, args) -> dict:
    L.seed_everything(seed, verbose=False)
    kw = dict(MODELS[name])
    if "context_hours" in kw:
        dm = crop_context(dm, kw.pop("context_hours"))
    kw = {"d_model": args.d_model, "n_layers": 1, "n_heads": 4, "finest_loss": args.finest_loss, "align": "end"} | kw
    model = IMTSForecaster(n_vars=dm.n_vars, lookback_hours=dm.lookback_hours, forecast_hours=dm.forecast_hours,
                           record_hours=dm.record_hours, plot_every_n_epochs=0,
                           optimizer=lambda p: torch.optim.Adam(p, lr=args.lr), **kw)
    rec = Recorder()
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        gradient_clip_val=1.0, callbacks=[rec])
    trainer.fit(model, datamodule=dm)
    model.load_state_dict(rec.state)
    res = trainer.test(model, datamodule=dm, verbose=False)[0]
    out = {"mse": res["test/mse"], "mae": res["test/mae"], "samples_per_s": rec.samples / rec.seconds,
           "params": sum(p.numel() for p in model.parameters())}
    print(f"  {name:28s} seed {seed}: mse {out['mse']:.4f} mae {out['mae']:.4f} "
          f"{out['samples_per_s']:.0f} samples/s", flush=True)
    return out | {"model": model}


def data(args) -> PhysioNet2012:
    dm = PhysioNet2012(data_dir=str(ROOT / "data"), batch_size=args.batch_size, num_patients=args.patients,
                       split=args.split, dynamics=args.dynamics)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def run_file(args, name: str, seed: int) -> Path:
    """Where one run's result is kept: a rerun of the same command skips finished runs (resumable on a busy machine)."""
    key = f"e{args.epochs}-n{args.patients}-d{args.d_model}-{args.split}-{args.finest_loss}"
    key += "" if args.dynamics == "v2" else f"-{args.dynamics}"  # data v2 runs keep their earlier folder
    return Path(args.out) / "runs" / key / f"{name.replace(' ', '_').replace(',', '')}-s{seed}.json"


def run_seed(seed: int, args) -> dict[str, dict]:
    """All models for one seed, in this process (so speed ratios compare runs under the same load)."""
    torch.set_num_threads(1)
    dm = data(args)
    results = {}
    for name in args.models:
        cached = run_file(args, name, seed)
        if cached.exists():
            results[name] = json.loads(cached.read_text())
            continue
        r = run(name, dm, seed, args.epochs, args)
        results[name] = {k: v for k, v in r.items() if k != "model"}
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(results[name] | {"seed": seed, "model": name}))
        if seed == 0 and name in ("GraFITi", "ReIMTS(GraFITi)", "mTAN", "ReIMTS(mTAN)"):
            # forecast figure of one test patient
            batch = next(iter(dm.test_dataloader()))
            with torch.no_grad():
                pred = r["model"].eval()(batch)["pred"]
            fig = forecast_figure(batch, pred, 0, dm.variable_names, title=f"{name}: one test patient")
            fname = Path(args.out) / f"forecast_{name.replace('(', '_').replace(')', '').lower()}.png"
            fig.savefig(fname, dpi=80)
            plt.close(fig)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 400 records, 1 seed, 1 epoch")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--patients", type=int, default=3000, help="generated records (3000 = the default data)")
    p.add_argument("--split", default="sequential", choices=["sequential", "random"])
    p.add_argument("--d_model", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--jobs", type=int, default=1, help="seeds run in this many parallel processes (1 thread each)")
    p.add_argument("--finest_loss", default="horizon", choices=["all", "horizon"])
    p.add_argument("--dynamics", default="multiscale", choices=["multiscale", "v2"], help="generated data version")
    p.add_argument("--context_check", action="store_true", help="only the closed-form context table (seconds)")
    p.add_argument("--oracle_check", action="store_true", help="only the closed-form oracle table (a minute)")
    p.add_argument("--compile_check", action="store_true", help="only eager vs compiled CPU time per training step")
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "reimts"))
    args = p.parse_args()
    if args.quick:
        args.seeds, args.epochs, args.patients = 1, 1, 400
    torch.set_num_threads(1)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dm = data(args)  # generate + parse once here, so the workers read the cache
    print(dm.describe(), flush=True)
    if args.context_check:
        print(context_check(dm))
        return
    if args.oracle_check:
        print(oracle_check(dm, args))
        return
    if args.compile_check:
        print(compile_check(dm, args))
        return
    t0 = time.time()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as ex:
            per_seed = list(ex.map(run_seed, range(args.seeds), [args] * args.seeds))
    else:
        per_seed = [run_seed(seed, args) for seed in range(args.seeds)]
    results = {m: [ps[m] for ps in per_seed] for m in args.models}

    def ms(vals):
        return (statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0)

    lines = ["| model | test MSE | test MAE | MSE vs backbone | train samples/s | speed vs backbone | params |",
             "|---|---|---|---|---|---|---|"]
    summary = {}
    for name, rs in results.items():
        mse, mae, sps = ms([r["mse"] for r in rs]), ms([r["mae"] for r in rs]), ms([r["samples_per_s"] for r in rs])
        ref = REFERENCE.get(name)
        rel_mse = rel_speed = "-"
        if ref in results:
            base = ms([r["mse"] for r in results[ref]])[0]
            rel_mse = f"{100 * (mse[0] - base) / base:+.1f}%"
            # speed ratio per seed (same process, same data), then averaged
            ratios = [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(rs, results[ref], strict=True)]
            rel_speed = f"{statistics.mean(ratios):.2f}x"
        summary[name] = {"mse": mse, "mae": mae, "samples_per_s": sps, "runs": rs}
        lines.append(f"| {name} | {mse[0]:.4f} ± {mse[1]:.4f} | {mae[0]:.4f} ± {mae[1]:.4f} | {rel_mse} | "
                     f"{sps[0]:.0f} | {rel_speed} | {rs[0]['params']:,} |")
    lines += ["", "| paired difference of test MSE (a - b), 95% CI over seeds | a | b | params a / b |", "|---|---|---|---|"]
    for a, b in PAIRS:
        if a in results and b in results:
            ci = paired_ci([r["mse"] for r in results[a]], [r["mse"] for r in results[b]])
            lines.append(f"| {ci} | {a} | {b} | {results[a][0]['params']:,} / {results[b][0]['params']:,} |")
            summary.setdefault("pairs", []).append({"a": a, "b": b, "mean": ci.mean, "low": ci.low, "high": ci.high})
    table = "\n".join(lines)
    print(f"\n{args.seeds} seed(s), {args.epochs} epochs, {len(dm.splits['train'])} train / {len(dm.splits['val'])} val "
          f"/ {len(dm.splits['test'])} test samples, {time.time() - t0:.0f} s\n")
    print(table)
    (out_dir / "results.json").write_text(json.dumps({"args": vars(args), "summary": summary}, indent=1))

    print(f"figures: {out_dir}/forecast_*.png")


if __name__ == "__main__":
    main()
