"""STORM vs persistence, climatology and single-scale networks matched in parameters and in compute, on the default
planet (WB2 layout), over several seeds with paired 95% confidence intervals.

    .venv/bin/python benchmarks/storm.py --seeds 3              # the default planet of configs/storm.yaml (486 days)
    .venv/bin/python benchmarks/storm.py --compile_check 5      # eager vs torch.compile CPU time per training step
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
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out" / "storm"
REGION = [30.0, 72.0, 300.0, 45.0]  # North Atlantic / Europe box, crossing 0 E
# the planet and splits of configs/storm.yaml (a training year, two months each of validation and test)
DEFAULT_DAYS = 486
DEFAULT_PERIODS = {"train": ["2000-01-01:2000-12-31"], "val": ["2001-01-01:2001-02-28"],
                   "test": ["2001-03-01:2001-04-30"]}



def _loader(dataset, **kwargs):
    """A DataLoader over STORM's windows: their `__getitems__` returns the stacked batch, which `collate_batched`
    passes through (the default collate would index it as a list of samples)."""
    from lit_iclr.core.loader import collate_batched

    return torch.utils.data.DataLoader(dataset, collate_fn=collate_batched, **kwargs)

def make_data(args):
    """The default planet (or a shorter one: --days, --spinup_days, with date-range splits)."""
    from lit_iclr.storm import WB2WeatherData

    dm = WB2WeatherData(data_dir=str(ROOT / "data"), batch_size=args.batch, eval_lead_times=[6, 24, 72, 120],
                        eval_stride=args.eval_stride, default_days=args.days,
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
    loader = _loader(dm.train_set, batch_size=dm.batch_size, shuffle=True, generator=gen,
                                         drop_last=True)
    step, t0, c0, it = 0, time.time(), time.process_time(), iter(loader)
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
    cpu = time.process_time() - c0
    return {"seconds": time.time() - t0, "cpu_seconds": cpu, "cpu_samples_per_s": steps * dm.batch_size / cpu,
            "final_loss": float(loss.detach())}


@torch.no_grad()
def evaluate(models: dict, dm, region_idx) -> tuple[dict, dict]:
    """Scores per forecaster: {'global'|'region': {lead_h: (rmse_norm, acc)}}; and per multi-scale model and coarse
    head k: {lead_h: (RMSE of head k, RMSE of Down^k of the finest head, RMS of Down(head k-1) - head k)} against
    Down^k of the truth (area-weighted Down, as the loss; latitude-weighted, normalised units, mean over channels)."""
    from lit_iclr.storm.metrics import WB2Scores, lat_weights, spatial_mse
    from lit_iclr.storm.pyramid import area_weights, down

    loader = _loader(dm.test_set, batch_size=16)
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

    b = next(iter(_loader(dm.train_set, batch_size=batch_size)))
    with FlopCounterMode(display=False) as fc:
        m.training_step(b, 0).backward()
    m.zero_grad()
    return fc.get_total_flops() / batch_size


def train_flops(m, dm) -> tuple[float, float]:
    """FLOPs of one training step of a full batch (forward + backward, counted by torch) and its time."""
    from torch.utils.flop_counter import FlopCounterMode

    b = next(iter(_loader(dm.train_set, batch_size=dm.batch_size)))
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


def forecast_figure(m, dm, out: Path = OUT):
    """z500 truth / forecast / error at the evaluation leads, first test initialisation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lit_iclr.storm.module import forecast_figure as draw

    out.mkdir(parents=True, exist_ok=True)
    b = next(iter(_loader(dm.test_set, batch_size=1)))
    leads = dm.test_set.lead_steps.tolist()
    with torch.no_grad():
        preds = m.rollout(b["x"], b["static"], b["init_time"], max(leads))
    pred = torch.stack([preds[k - 1][0][0] for k in leads])
    fig = draw(pred, b["y"][0], leads, 0, m.channel_names, m.norm_mean, m.norm_std, dm.step_hours)
    fig.savefig(out / "storm_forecast.png", dpi=90)
    plt.close(fig)


def skill_figure(per_seed: list[dict], out: Path = OUT):
    """RMSE and ACC against lead, mean over seeds, for every forecaster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for name in per_seed[0]["results"]:
        hs = sorted(per_seed[0]["results"][name]["global"], key=float)
        for i, ax in enumerate(axes):
            ax.plot([float(h) for h in hs], [statistics.mean(ps["results"][name]["global"][h][i] for ps in per_seed)
                                             for h in hs], "o-", label=name)
    axes[0].set(xlabel="lead (h)", ylabel="lat-weighted RMSE (normalised)", yscale="log")
    axes[1].set(xlabel="lead (h)", ylabel="ACC")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "storm_skill.png", dpi=90)
    plt.close(fig)


def model_specs(dm, names: list[str], hidden: list[int]) -> dict[str, dict]:
    """STORM, its ablation, and the single-scale network at the width matching STORM's parameters or its training
    FLOPs (searched over widths; the FLOPs are counted by torch on the same training step)."""
    storm = make_model(dm, hidden=hidden)
    target_p, target_f = n_params(storm), step_flops(storm, dm)
    widths = range(8, 96, 2)
    w_par = min(widths, key=lambda wd: abs(n_params(make_model(dm, num_scales=1, hidden=[wd])) - target_p))
    flops = {wd: step_flops(make_model(dm, num_scales=1, hidden=[wd]), dm) for wd in range(8, w_par + 1, 4)}
    w_flop = min(flops, key=lambda wd: abs(flops[wd] - target_f))
    specs = {"STORM": dict(hidden=hidden), "STORM w/o cross-scale": dict(cross_scale=False, hidden=hidden),
             f"single-scale, same params (width {w_par})": dict(num_scales=1, hidden=[w_par]),
             f"single-scale, same FLOPs (width {w_flop})": dict(num_scales=1, hidden=[w_flop])}
    # "STORM" names STORM only; longer names are prefixes ("STORM w/o", "single-scale")
    return {k: v for k, v in specs.items() if any(k == n or (n != "STORM" and k.startswith(n)) for n in names)}


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def run_one(seed: int, name: str, kw: dict, dm, args, region_idx) -> dict:
    """Train and evaluate one network for one seed (one thread); the result is written to its own file, so a run
    that is cut short resumes from the next missing (seed, network)."""
    m = make_model(dm, seed, **kw)
    info = {"params": n_params(m), "gflop_per_sample": step_flops(m, dm) / 1e9, **train(m, dm, args.steps, seed=seed)}
    print(f"seed {seed} trained {name}: {info}", flush=True)
    results, heads = evaluate({name: m}, dm, region_idx)
    out = {"results": results, "heads": heads, "train": {name: info}}
    if seed == 0 and name == "STORM" and not args.quick:
        peak = matmul_peak()
        flops, step_s = train_flops(m, dm)
        out["speed"] = {"samples_per_s": dm.batch_size / step_s, "flops": flops, "step_s": step_s, "peak": peak,
                        "loader": loader_rate(dm), "batch": dm.batch_size}
        forecast_figure(m, dm, Path(args.out))
    return out


def run_all(dm, args) -> list[dict]:
    """Every (seed, network) not yet in args.out; returns per seed the merged results of the seeds that are complete."""
    import numpy as np

    from lit_iclr.storm.wb2 import region_index

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    region_idx = region_index(np.array(dm.latitudes), np.array(dm.longitudes), REGION)
    per_seed = []
    for seed in range(args.seeds):
        merged: dict = {"results": {}, "heads": {}, "train": {}}
        for name, kw in args.specs.items():
            path = out / f"seed{seed}-{slug(name)}.json"
            if path.exists():
                one = json.loads(path.read_text())
            else:
                torch.manual_seed(seed)
                one = json.loads(json.dumps(run_one(seed, name, kw, dm, args, region_idx), default=str))
                path.write_text(json.dumps(one, indent=1, default=str))
            for key in ("results", "heads", "train"):
                merged[key].update(one[key])
            if "speed" in one:
                merged["speed"] = one["speed"]
        per_seed.append(merged)
    return per_seed


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
    out += ["", "| training CPU time (s, one thread; mean over seeds) | " + " | ".join(info) + " |",
            "|---|" + "---|" * len(info),
            "| CPU s | " + " | ".join(f"{statistics.mean(ps['train'][n]['cpu_seconds'] for ps in per_seed):.0f}"
                                      for n in info) + " |",
            "| ratio to STORM | " + " | ".join(
                f"{statistics.mean(ps['train'][n]['cpu_seconds'] / ps['train']['STORM']['cpu_seconds'] for ps in per_seed):.2f}"
                for n in info) + " |"]
    sp = per_seed[0].get("speed")
    if sp:
        sps = sp["samples_per_s"]
        out.append(f"\n| speed (1 thread, seed 0; wall clock, shared machine) | value |\n|---|---|\n"
                   f"| STORM training samples/s | {sps:.1f} |\n"
                   f"| train-step FLOPs per sample (fwd+bwd, 2-step rollout) | {sp['flops'] / sp['batch'] / 1e9:.2f} GFLOP |\n"
                   f"| achieved FLOP/s | {sp['flops'] / sp['step_s'] / 1e9:.2f} GFLOP/s |\n"
                   f"| fp32 matmul peak (1024^2, same run) | {sp['peak'] / 1e9:.2f} GFLOP/s |\n"
                   f"| fraction of peak | {sp['flops'] / sp['step_s'] / sp['peak']:.3f} |\n"
                   f"| loader samples/s (in-memory) | {sp['loader']:.0f} ({sp['loader'] / sps:.0f}x the training step) |")
    return "\n".join(out)


def scale_report(dirs: list[str], baseline: str) -> str:
    """STORM against one baseline across finished runs of different size (e.g. --steps 100 vs 200), on the seeds that
    every run has: mean RMSE and the paired STORM - baseline difference per lead."""
    from lit_iclr.core.stats import paired_ci

    runs = []
    for d in dirs:
        args = json.loads((Path(d) / "args.json").read_text())
        names = {n: slug(n) for n in args["specs"]}
        base = next(n for n in names if n.startswith(baseline))
        done = {s for s in range(args["seeds"]) if all((Path(d) / f"seed{s}-{names[n]}.json").exists() for n in ("STORM", base))}
        runs.append((d, args, names, base, done))
    seeds = sorted(set.intersection(*(r[-1] for r in runs)))
    rows = []
    for d, args, names, base, _ in runs:
        st, bl = ([json.loads((Path(d) / f"seed{s}-{names[n]}.json").read_text()) for s in seeds] for n in ("STORM", base))
        for h in st[0]["results"]["STORM"]["global"]:
            a = [r["results"]["STORM"]["global"][h][0] for r in st]
            b = [r["results"][base]["global"][h][0] for r in bl]
            p = [r["results"]["persistence"]["global"][h][0] for r in st]
            rows.append(f"| {args['steps']} x {args['batch']} | {h} h | {statistics.mean(a):.4f} | {statistics.mean(b):.4f} | "
                        f"{statistics.mean(p):.4f} | {paired_ci(a, b)} |")
    return "\n".join([f"seeds {seeds}; baseline: {baseline}", "",
                      "| training steps x batch | lead | STORM RMSE | baseline RMSE | persistence RMSE | STORM - baseline |",
                      "|---|---|---|---|---|---|", *rows])


def compile_check(dm, steps: int, options: dict, rounds: int = 1) -> dict:
    """CPU time per training step (batch of the data module, 2-step rollout, forward + backward + AdamW) of STORM
    eager and with `compile_step: true` (torch.compile of the model step), one thread, in the same process. The first
    two steps are timed apart: for the compiled model they hold the compile (tracing and code generation for the
    first step's full window and the later steps' single frame). Then `rounds` rounds of `steps`-step blocks of each,
    the order flipping every round; the speed-up is eager / compiled by the medians and, with 2 or more rounds, as the
    mean of the per-round ratios with its paired 95% CI."""
    from lit_iclr.core.stats import ratio_ci
    from lit_iclr.core.timing import cpu_time, interleaved_cpu_times

    b = next(iter(_loader(dm.train_set, batch_size=dm.batch_size, shuffle=False)))
    out, runs = {}, {}
    for mode in ("eager", "compiled"):
        m = make_model(dm, 0, compile_step=mode == "compiled", compile_options=options)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

        def one(m=m, opt=opt):
            loss = m.training_step(b, 0)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return float(loss.detach())

        c0 = cpu_time()
        first = one()
        one()
        out[mode] = {"first_loss": first, "first_two_steps_cpu_s": cpu_time() - c0}
        runs[mode] = lambda one=one: [one() for _ in range(steps)]
    blocks = interleaved_cpu_times(runs, rounds)
    for mode in runs:
        out[mode]["block_step_cpu_s"] = [t / steps for t in blocks[mode]]
        out[mode]["step_cpu_s"] = statistics.median(out[mode]["block_step_cpu_s"])
        print(mode, out[mode], flush=True)
    e, c = out["eager"], out["compiled"]
    out["speedup"] = e["step_cpu_s"] / c["step_cpu_s"]
    if rounds > 1:
        out["speedup_paired"] = ratio_ci(e["block_step_cpu_s"], c["block_step_cpu_s"])
    out["compile_cpu_s"] = c["first_two_steps_cpu_s"] - 2 * c["step_cpu_s"]
    return out


def thread_check(steps: int, rounds: int, batch: int, hidden: list[int], threads=(1, 2)) -> dict:
    """CPU and wall seconds of a default-sized STORM training step (2-step rollout, fwd + bwd + AdamW) and of a 20-step
    evaluation rollout (no grad) at each torch thread count, rounds interleaved (order flipped every round); random
    inputs on the 64 x 32 grid with the default 6 channels, 2 static fields (no data needed)."""
    from lit_iclr.storm.module import STORM

    torch.manual_seed(0)
    m = STORM(hidden=hidden, num_blocks=1)
    m.log = lambda *a, **k: None
    opt = torch.optim.AdamW(m.parameters(), 1e-3)
    B = batch
    b = {"x": torch.randn(B, 2, 6, 32, 64), "y": torch.randn(B, 2, 6, 32, 64), "static": torch.randn(B, 2, 32, 64),
         "lead_steps": torch.tensor([[1, 2]] * B), "init_time": torch.full((B,), 262980.0, dtype=torch.float64)}

    def train_step():
        loss = m.training_step(b, 0)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def rollout():
        with torch.no_grad():
            m.rollout(b["x"], b["static"], b["init_time"], 20)

    res: dict = {str(n): {"train_cpu": [], "train_wall": [], "eval20_cpu": [], "eval20_wall": []} for n in threads}
    before = torch.get_num_threads()
    for r in range(rounds):
        for n in (threads if r % 2 == 0 else threads[::-1]):
            torch.set_num_threads(n)
            train_step()  # warm-up at this thread count
            for key, fn, k in (("train", train_step, steps), ("eval20", rollout, 1)):
                c, w = time.process_time(), time.perf_counter()
                for _ in range(k):
                    fn()
                res[str(n)][f"{key}_cpu"].append((time.process_time() - c) / k)
                res[str(n)][f"{key}_wall"].append((time.perf_counter() - w) / k)
    torch.set_num_threads(before)
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in res.items()}
    return {"batch": B, "hidden": hidden, "steps_per_block": steps, "rounds": rounds, "median": med,
            "load_average_1min": __import__("os").getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 20 steps, 1 seed, few initialisations")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16, help="training batch size")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--eval_stride", type=int, default=4, help="one test initialisation every this many 6-h steps")
    ap.add_argument("--models", nargs="*", default=["STORM", "single-scale"],
                    help="name prefixes: STORM, 'STORM w/o', single-scale, 'single-scale, same FLOPs', ...")
    ap.add_argument("--hidden", type=int, nargs="*", default=[16, 24, 32], help="STORM widths per scale")
    ap.add_argument("--days", type=int, default=DEFAULT_DAYS,
                    help=f"days of the generated planet ({DEFAULT_DAYS}: the store of configs/storm.yaml)")
    ap.add_argument("--spinup_days", type=int, default=60, help="spin-up days of the generated planet")
    for split in ("train", "val", "test"):
        ap.add_argument(f"--{split}_period", nargs="*", default=DEFAULT_PERIODS[split],
                        help="years or 'YYYY-MM-DD:YYYY-MM-DD' ranges (default: those of configs/storm.yaml)")
    ap.add_argument("--out", default=str(OUT), help="results folder; finished (seed, network) runs in it are skipped")
    ap.add_argument("--compile_check", type=int, default=0, metavar="STEPS",
                    help="only time STORM's training step eager vs compiled over this many steps (and the compile)")
    ap.add_argument("--compile_rounds", type=int, default=1,
                    help="--compile_check: blocks of STEPS steps per side, interleaved (order flipping every round)")
    ap.add_argument("--compile_backend", default="inductor")
    ap.add_argument("--thread_check", type=int, default=0, metavar="STEPS",
                    help="time a training step and a 20-step evaluation rollout with 1 and 2 torch threads, STEPS "
                         "steps per block, --compile_rounds rounds interleaved (random inputs, no data)")
    ap.add_argument("--scale_report", nargs="*", default=None, metavar="DIR",
                    help="only print STORM vs --scale_baseline across these finished result folders")
    ap.add_argument("--scale_baseline", default="single-scale, same FLOPs")
    args = ap.parse_args()
    if args.scale_report:
        print(scale_report(args.scale_report, args.scale_baseline))
        return
    if args.quick:  # every setting a smoke run changes, said out loud
        changed = {"steps": min(args.steps, 20), "seeds": 1, "eval_stride": max(args.eval_stride, 64)}
        print("quick: " + ", ".join(f"{k} {getattr(args, k)} -> {v}" for k, v in changed.items())
              + "; no speed measurement and no forecast figure", flush=True)
        for k, v in changed.items():
            setattr(args, k, v)
    print("settings: " + ", ".join(f"{k}={v}" for k, v in vars(args).items() if v is not None and v is not False),
          flush=True)
    if args.thread_check:
        print(json.dumps(thread_check(args.thread_check, args.compile_rounds, args.batch, args.hidden), indent=1))
        return
    torch.set_num_threads(1)
    t_all = time.time()
    dm = make_data(args)
    if args.compile_check:
        res = compile_check(dm, args.compile_check, {"backend": args.compile_backend}, args.compile_rounds)
        print(json.dumps(res, indent=1))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"compile-{args.compile_backend}.json").write_text(json.dumps(res, indent=1))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spec_file = out / "args.json"  # the matched widths are searched once per results folder
    if spec_file.exists():
        args.specs = json.loads(spec_file.read_text())["specs"]
    else:
        args.specs = model_specs(dm, args.models, args.hidden)
        spec_file.write_text(json.dumps(vars(args), indent=1, default=str))
    print(f"models: {args.specs} ({time.time() - t_all:.0f} s)", flush=True)
    per_seed = run_all(dm, args)
    skill_figure(per_seed, out)
    table = report(per_seed, args)
    print("\n" + table + f"\n\ntotal {time.time() - t_all:.0f} s")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "per_seed": per_seed}, indent=1, default=str))


if __name__ == "__main__":
    main()
