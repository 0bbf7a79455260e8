"""STORM vs persistence, climatology and single-scale networks matched in parameters and in compute, on the default
planet (WB2 layout), over several seeds with paired 95% confidence intervals.

    .venv/bin/python benchmarks/storm.py --seeds 3 --jobs 3     # the tables in seeds/storm.md
    .venv/bin/python benchmarks/storm.py --quick                # smoke run

Every network is trained the same way (same data, steps, batch, optimiser, 2-step rollout loss, seed) and evaluated on
the test year by autoregressive rollout: latitude-weighted RMSE (normalised units, mean over channels) and ACC at 6 h
to 5 days, globally and over a regional box (regional scores of the global forecasts). Also: each coarse head of STORM
against Down^k of its own finest forecast (does a head carry information of its own?), the ablation without
cross-scale exchange, training FLOPs per model, speed (achieved FLOP/s vs. this machine's fp32 matmul peak measured in
the same run) and the data loader's throughput.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out" / "storm"
REGION = [30.0, 72.0, 300.0, 45.0]  # North Atlantic / Europe box, crossing 0 E


def make_data(args):
    """The default planet (or a shorter one: --days, --spinup_days, with date-range splits)."""
    from lit_iclr.storm import WB2WeatherData

    dm = WB2WeatherData(data_dir=str(ROOT / "data"), batch_size=args.batch, eval_lead_times=[6, 24, 72, 120],
                        eval_stride=64 if args.quick else args.eval_stride, default_days=args.days,
                        default_spinup_days=args.spinup_days, train_period=args.train_period,
                        val_period=args.val_period, test_period=args.test_period)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def make_model(dm, seed: int = 0, **kw):
    from lit_iclr.storm import STORM

    args = dict(num_channels=dm.num_channels, num_static=dm.num_static, history=dm.history, latitudes=dm.latitudes,
                longitudes=dm.longitudes, periodic=dm.periodic, channel_names=dm.channel_names, num_blocks=1,
                hidden=[16, 24, 32], warmup_steps=30)
    args.update(kw)
    torch.manual_seed(seed)
    m = STORM(**args)
    m.norm_mean.copy_(torch.as_tensor(dm.stats["mean"]))
    m.norm_std.copy_(torch.as_tensor(dm.stats["std"]))
    m.diff_scale.copy_(torch.as_tensor(dm.stats["diff_std"] / dm.stats["std"]))
    m.log = lambda *a, **k: None
    return m


def n_params(m) -> int:
    return sum(p.numel() for p in m.parameters())


def train(m, dm, steps: int, lr: float = 2e-3, seed: int = 0) -> dict:
    opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=1e-4)
    warm = min(30, max(1, steps // 5))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.05 + 0.475 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm))))
    gen = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(dm.train_set, batch_size=dm.batch_size, shuffle=True, generator=gen,
                                         drop_last=True)
    step, t0, it = 0, time.time(), iter(loader)
    m.train()
    while step < steps:
        try:
            b = next(it)
        except StopIteration:
            it = iter(loader)
            b = next(it)
        loss = m.training_step(b, step)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
    return {"seconds": time.time() - t0, "samples_per_s": steps * dm.batch_size / (time.time() - t0),
            "final_loss": float(loss.detach())}


@torch.no_grad()
def evaluate(models: dict, dm, region_idx) -> tuple[dict, dict]:
    """Scores per forecaster: {'global'|'region': {lead_h: (rmse_norm, acc)}}; and per multi-scale model and coarse
    head k: {lead_h: (RMSE of head k, RMSE of Down^k of the finest head, RMS of Down(head k-1) - head k)} against
    Down^k of the truth (area-weighted Down, as the loss; latitude-weighted, normalised units, mean over channels)."""
    from lit_iclr.storm.metrics import WB2Scores, lat_weights, spatial_mse
    from lit_iclr.storm.pyramid import area_weights, down

    loader = torch.utils.data.DataLoader(dm.test_set, batch_size=16)
    leads = dm.test_set.lead_steps.tolist()
    w = lat_weights(torch.tensor(dm.latitudes))[:, None].expand(len(dm.latitudes), len(dm.longitudes)).contiguous()
    ilat, ilon = region_idx
    wr = lat_weights(torch.tensor(dm.latitudes)[ilat])[:, None].expand(len(ilat), len(ilon)).contiguous()
    names = ["persistence", "climatology", *models]
    scores = {n: {"global": WB2Scores(len(leads), dm.num_channels, w), "region": WB2Scores(len(leads), dm.num_channels, wr)}
              for n in names}
    heads_acc: dict = {}
    for m in models.values():
        m.eval()
    for b in loader:
        y, clim = b["y"], b["y_clim"]
        fc = {"persistence": b["x"][:, -1:].expand_as(y), "climatology": clim}
        for name, m in models.items():
            preds = m.rollout(m._grid(b["x"]), m._grid(b["static"]), b["init_time"], max(leads))
            fc[name] = torch.stack([preds[k - 1][0] for k in leads], 1)
            ws = area_weights(m.area, m.S)
            for j, lead in enumerate(leads):
                target, fine, wl, p = y[:, j], preds[lead - 1][0], w, preds[lead - 1]
                for k in range(1, m.S):
                    target, fine, wl = down(target, ws[k - 1]), down(fine, ws[k - 1]), down(wl)
                    sums = [spatial_mse(p[k], target, wl).mean(1), spatial_mse(fine, target, wl).mean(1),
                            spatial_mse(down(p[k - 1], ws[k - 1]), p[k], wl).mean(1)]
                    acc = heads_acc.setdefault(name, {}).setdefault(k, {}).setdefault(lead * dm.step_hours, [0, 0, 0, 0])
                    for i, v in enumerate(sums):
                        acc[i] += float(v.sum())
                    acc[3] += y.shape[0]
        for name, f in fc.items():
            scores[name]["global"].update(f, y, clim)
            sub = lambda t: t[..., ilat, :][..., ilon]
            scores[name]["region"].update(sub(f), sub(y), sub(clim))
    out = {}
    for name in names:
        out[name] = {}
        for where in ("global", "region"):
            r, a = scores[name][where].compute()
            out[name][where] = {lead * dm.step_hours: (float(r[j].mean()), float(a[j].mean())) for j, lead in enumerate(leads)}
    heads = {name: {k: {h: [math.sqrt(v / n) for v in acc[:3]] for h, (*acc, n) in per_k.items()}
                    for k, per_k in per_model.items()} for name, per_model in heads_acc.items()}
    return out, heads


def matmul_peak(seconds: float = 3.0, n: int = 1024) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    reps, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * n**3 * reps / (time.time() - t0)


def step_flops(m, dm, batch_size: int = 2) -> float:
    """FLOPs per sample of one training step (forward + backward of the 2-step rollout loss, counted by torch)."""
    from torch.utils.flop_counter import FlopCounterMode

    b = next(iter(torch.utils.data.DataLoader(dm.train_set, batch_size=batch_size)))
    with FlopCounterMode(display=False) as fc:
        m.training_step(b, 0).backward()
    m.zero_grad()
    return fc.get_total_flops() / batch_size


def train_flops(m, dm) -> tuple[float, float]:
    """FLOPs of one training step of a full batch (forward + backward, counted by torch) and its time."""
    from torch.utils.flop_counter import FlopCounterMode

    b = next(iter(torch.utils.data.DataLoader(dm.train_set, batch_size=dm.batch_size)))
    with FlopCounterMode(display=False) as fc:
        m.training_step(b, 0).backward()
    t0 = time.time()
    for _ in range(3):
        m.zero_grad()
        m.training_step(b, 0).backward()
    return fc.get_total_flops(), (time.time() - t0) / 3


def loader_rate(dm, batches: int = 30) -> float:
    loader = dm.train_dataloader()
    t0, n = time.time(), 0
    for i, b in enumerate(loader):
        n += b["x"].shape[0]
        if i + 1 >= batches:
            break
    return n / (time.time() - t0)


def figures(models, dm, results, out: Path = OUT):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lit_iclr.storm.module import forecast_figure

    out.mkdir(parents=True, exist_ok=True)
    m = models["STORM"]
    b = next(iter(torch.utils.data.DataLoader(dm.test_set, batch_size=1)))
    leads = dm.test_set.lead_steps.tolist()
    with torch.no_grad():
        preds = m.rollout(b["x"], b["static"], b["init_time"], max(leads))
    pred = torch.stack([preds[k - 1][0][0] for k in leads])
    fig = forecast_figure(pred, b["y"][0], leads, 0, m.channel_names, m.norm_mean, m.norm_std, dm.step_hours)
    fig.savefig(out / "storm_forecast.png", dpi=90)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for name, r in results.items():
        hs = sorted(r["global"])
        axes[0].plot(hs, [r["global"][h][0] for h in hs], "o-", label=name)
        axes[1].plot(hs, [r["global"][h][1] for h in hs], "o-", label=name)
    axes[0].set(xlabel="lead (h)", ylabel="lat-weighted RMSE (normalised)", yscale="log")
    axes[1].set(xlabel="lead (h)", ylabel="ACC")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "storm_skill.png", dpi=90)
    plt.close(fig)


def model_specs(dm, names: list[str]) -> dict[str, dict]:
    """STORM, its ablation, and the single-scale network at the width matching STORM's parameters or its training
    FLOPs (searched over widths; the FLOPs are counted by torch on the same training step)."""
    storm = make_model(dm)
    target_p, target_f = n_params(storm), step_flops(storm, dm)
    widths = range(8, 96, 2)
    w_par = min(widths, key=lambda wd: abs(n_params(make_model(dm, num_scales=1, hidden=[wd])) - target_p))
    flops = {wd: step_flops(make_model(dm, num_scales=1, hidden=[wd]), dm) for wd in range(8, w_par + 1, 4)}
    w_flop = min(flops, key=lambda wd: abs(flops[wd] - target_f))
    specs = {"STORM": {}, "STORM w/o cross-scale": dict(cross_scale=False),
             f"single-scale, same params (width {w_par})": dict(num_scales=1, hidden=[w_par]),
             f"single-scale, same FLOPs (width {w_flop})": dict(num_scales=1, hidden=[w_flop])}
    # "STORM" names STORM only; longer names are prefixes ("STORM w/o", "single-scale")
    return {k: v for k, v in specs.items() if any(k == n or (n != "STORM" and k.startswith(n)) for n in names)}


def run_seed(seed: int, args) -> dict:
    """Train and evaluate every model for one seed (one process, one thread)."""
    import numpy as np

    from lit_iclr.storm.wb2 import region_index

    torch.set_num_threads(1)
    dm = make_data(args)
    ilat, ilon = region_index(np.array(dm.latitudes), np.array(dm.longitudes), REGION)
    models, info = {}, {}
    for name, kw in args.specs.items():
        m = make_model(dm, seed, **kw)
        info[name] = {"params": n_params(m), "gflop_per_sample": step_flops(m, dm) / 1e9,
                      **train(m, dm, args.steps, seed=seed)}
        models[name] = m
        print(f"seed {seed} trained {name}: {info[name]}", flush=True)
    results, heads = evaluate(models, dm, (ilat, ilon))
    out = {"results": results, "heads": heads, "train": info}
    if seed == 0 and not args.quick:
        peak = matmul_peak()
        flops, step_s = train_flops(models["STORM"], dm)
        load = loader_rate(dm)
        out["speed"] = {"samples_per_s": dm.batch_size / step_s, "flops": flops, "step_s": step_s, "peak": peak,
                        "loader": load, "batch": dm.batch_size}
        figures(models, dm, results, Path(args.out))
    Path(args.out).mkdir(parents=True, exist_ok=True)  # each seed as it finishes
    (Path(args.out) / f"seed{seed}.json").write_text(json.dumps(out, indent=1, default=str))
    return out


def report(per_seed: list[dict], args) -> str:
    from lit_iclr.core.stats import paired_ci

    def ms(v):
        return f"{statistics.mean(v):.4f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.4f}"

    names = list(per_seed[0]["results"])
    hs = sorted(per_seed[0]["results"]["STORM"]["global"], key=float)
    get = lambda n, where, h, i: [ps["results"][n][where][h][i] for ps in per_seed]  # noqa: E731
    info = per_seed[0]["train"]
    test = " ".join(str(p) for p in args.test_period) if args.test_period else "2003"
    out = [f"{len(per_seed)} seed(s), {args.steps} training steps x batch {args.batch}, test period {test}, "
           "mean ± std over seeds\n",
           "| forecaster | params | train GFLOP / sample | " + " | ".join(f"global RMSE {h} h" for h in hs)
           + f" | global ACC {hs[-1]} h | region RMSE {hs[0]} h | region RMSE {hs[-1]} h |",
           "|---|---|---|" + "---|" * (len(hs) + 3)]
    for n in names:
        p = f"{info[n]['params']:,}" if n in info else "0"
        g = f"{info[n]['gflop_per_sample']:.3f}" if n in info else "-"
        out.append(f"| {n} | {p} | {g} | " + " | ".join(ms(get(n, "global", h, 0)) for h in hs)
                   + f" | {ms(get(n, 'global', hs[-1], 1))} | {ms(get(n, 'region', hs[0], 0))} | "
                   f"{ms(get(n, 'region', hs[-1], 0))} |")
    out += ["", "Paired difference of global RMSE, STORM - baseline (negative: STORM better), 95% CI over seeds:", "",
            "| baseline | " + " | ".join(f"{h} h" for h in hs) + " |", "|---|" + "---|" * len(hs)]
    for n in names:
        if n in ("STORM",):
            continue
        out.append(f"| {n} | " + " | ".join(str(paired_ci(get("STORM", "global", h, 0), get(n, "global", h, 0)))
                                           for h in hs) + " |")
    heads = [ps["heads"]["STORM"] for ps in per_seed]
    out += ["", "STORM's coarse heads vs Down^k of its own finest forecast (RMSE against Down^k of the truth) and the "
            "consistency RMS of Down(head k-1) - head k:", "",
            "| head | lead | head RMSE | Down^k(fine) RMSE | paired difference head - Down^k(fine), 95% CI | consistency RMS |",
            "|---|---|---|---|---|---|"]
    for k in sorted(heads[0], key=int):
        for h in hs:
            a = [hd[k][h][0] for hd in heads]
            b = [hd[k][h][1] for hd in heads]
            c = [hd[k][h][2] for hd in heads]
            out.append(f"| {k} | {h} h | {ms(a)} | {ms(b)} | {paired_ci(a, b)} | {ms(c)} |")
    out += ["", "| training time (s, same process per seed; load varies) | "
            + " | ".join(info) + " |", "|---|" + "---|" * len(info),
            "| mean over seeds | " + " | ".join(f"{statistics.mean(ps['train'][n]['seconds'] for ps in per_seed):.0f}"
                                                for n in info) + " |"]
    sp = per_seed[0].get("speed")
    if sp:
        sps = sp["samples_per_s"]
        out.append(f"\n| speed (1 thread, seed 0) | value |\n|---|---|\n| STORM training samples/s | {sps:.1f} |\n"
                   f"| train-step FLOPs per sample (fwd+bwd, 2-step rollout) | {sp['flops'] / sp['batch'] / 1e9:.2f} GFLOP |\n"
                   f"| achieved FLOP/s | {sp['flops'] / sp['step_s'] / 1e9:.2f} GFLOP/s |\n"
                   f"| fp32 matmul peak (1024^2, same run) | {sp['peak'] / 1e9:.2f} GFLOP/s |\n"
                   f"| fraction of peak | {sp['flops'] / sp['step_s'] / sp['peak']:.3f} |\n"
                   f"| loader samples/s (in-memory) | {sp['loader']:.0f} ({sp['loader'] / sps:.0f}x the training step) |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 20 steps, 1 seed, few initialisations")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16, help="training batch size")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1, help="seeds run in this many processes (1 thread each)")
    ap.add_argument("--eval_stride", type=int, default=16, help="one test initialisation every this many 6-h steps")
    ap.add_argument("--models", nargs="*", default=["STORM", "single-scale"],
                    help="name prefixes: STORM, 'STORM w/o', single-scale")
    ap.add_argument("--days", type=int, default=1461, help="days of the generated planet (1461: the default store)")
    ap.add_argument("--spinup_days", type=int, default=60, help="spin-up days of the generated planet")
    for split in ("train", "val", "test"):
        ap.add_argument(f"--{split}_period", nargs="*", default=None,
                        help="years or 'YYYY-MM-DD:YYYY-MM-DD' ranges (default: 2000-2001 / 2002 / 2003)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    if args.quick:
        args.steps, args.seeds = min(args.steps, 20), 1
    torch.set_num_threads(1)
    t_all = time.time()
    # generate / cache the statistics and search the matched widths once, before the workers start
    args.specs = model_specs(make_data(args), args.models)
    print(f"models: {args.specs} ({time.time() - t_all:.0f} s)", flush=True)
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as ex:
            per_seed = list(ex.map(run_seed, range(args.seeds), [args] * args.seeds))
    else:
        per_seed = [run_seed(seed, args) for seed in range(args.seeds)]
    table = report(per_seed, args)
    print("\n" + table + f"\n\ntotal {time.time() - t_all:.0f} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "per_seed": per_seed}, indent=1, default=str))


if __name__ == "__main__":
    main()
