"""ReIMTS benchmark: masked MSE / MAE of GraFITi, mTAN, ReIMTS(each), ReIMTS without fusion and a resampling baseline.

    .venv/bin/python benchmarks/reimts.py            # default data (3000 generated PhysioNet 2012 records), 3 seeds
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

from lit_iclr.reimts import IMTSForecaster, PhysioNet2012
from lit_iclr.reimts.plots import forecast_figure, plt

# name -> model init args; the paper's time-period lists on P12: GraFITi 39 -> 24 -> 12 h, the others 39 -> 24 h
# (ReIMTS rows use the config default finest_loss "horizon"; "all" is the reference code's loss on every sub-sample)
MODELS = {
    "GraFITi": dict(backbone="grafiti", variant="backbone"),
    "ReIMTS(GraFITi)": dict(backbone="grafiti", variant="reimts", periods=[24.0, 12.0]),
    "ReIMTS(GraFITi), loss on all sub-samples": dict(backbone="grafiti", variant="reimts", periods=[24.0, 12.0],
                                                     finest_loss="all"),
    "ReIMTS(GraFITi) w/o fusion": dict(backbone="grafiti", variant="reimts_nofusion", periods=[24.0, 12.0]),
    "Resampling(GraFITi)": dict(backbone="grafiti", variant="resampling", resample_bins=[12.0, 4.0]),
    "mTAN": dict(backbone="mtan", variant="backbone"),
    "ReIMTS(mTAN)": dict(backbone="mtan", variant="reimts", periods=[24.0]),
}
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


def run(name: str, dm: PhysioNet2012, seed: int, epochs: int, args) -> dict:
    L.seed_everything(seed, verbose=False)
    model = IMTSForecaster(n_vars=dm.n_vars, lookback_hours=dm.lookback_hours, forecast_hours=dm.forecast_hours,
                           record_hours=dm.record_hours, d_model=args.d_model, n_layers=1, n_heads=4,
                           plot_every_n_epochs=0, optimizer=lambda p: torch.optim.Adam(p, lr=args.lr),
                           **({"finest_loss": args.finest_loss} | MODELS[name]))
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
    dm = PhysioNet2012(data_dir=str(ROOT / "data"), batch_size=args.batch_size, num_patients=args.patients)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def run_seed(seed: int, args) -> dict[str, dict]:
    """All models for one seed, in this process (so speed ratios compare runs under the same load)."""
    torch.set_num_threads(1)
    dm = data(args)
    results = {}
    for name in args.models:
        r = run(name, dm, seed, args.epochs, args)
        results[name] = {k: v for k, v in r.items() if k != "model"}
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
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--patients", type=int, default=3000, help="generated records (3000 = the default data)")
    p.add_argument("--d_model", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--jobs", type=int, default=1, help="seeds run in this many parallel processes (1 thread each)")
    p.add_argument("--finest_loss", default="horizon", choices=["all", "horizon"])
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
    table = "\n".join(lines)
    print(f"\n{args.seeds} seed(s), {args.epochs} epochs, {len(dm.splits['train'])} train / {len(dm.splits['val'])} val "
          f"/ {len(dm.splits['test'])} test samples, {time.time() - t0:.0f} s\n")
    print(table)
    (out_dir / "results.json").write_text(json.dumps({"args": vars(args), "summary": summary}, indent=1))

    print(f"figures: {out_dir}/forecast_*.png")


if __name__ == "__main__":
    main()
