"""STORM vs persistence, climatology and a single-scale network of the same size, on the default planet (WB2 layout).

    .venv/bin/python benchmarks/storm.py            # the table in seeds/storm.md
    .venv/bin/python benchmarks/storm.py --quick    # smoke run

Every network is trained the same way (same data, steps, batch, optimiser, 2-step rollout loss) and evaluated on the
test year by autoregressive rollout: latitude-weighted RMSE (normalised units, mean over channels) and ACC at 6 h and
5 days, globally and over a regional box (regional scores of the global forecasts). Also: the multi-resolution
consistency ||Down(y_hat_fine) - y_hat_coarse|| of STORM's heads vs. separately trained coarse models, the ablation
without cross-scale exchange, training speed (samples/s, achieved FLOP/s vs. this machine's fp32 matmul peak measured
in the same run) and the data loader's throughput.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out" / "storm"
REGION = [30.0, 72.0, 300.0, 45.0]  # North Atlantic / Europe box, crossing 0 E


def make_data(quick: bool):
    from lit_iclr.storm import WB2WeatherData

    dm = WB2WeatherData(data_dir=str(ROOT / "data"), batch_size=16, eval_lead_times=[6, 24, 72, 120],
                        eval_stride=32 if quick else 16)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def make_model(dm, **kw):
    from lit_iclr.storm import STORM

    args = dict(num_channels=dm.num_channels, num_static=dm.num_static, history=dm.history, latitudes=dm.latitudes,
                longitudes=dm.longitudes, periodic=dm.periodic, channel_names=dm.channel_names, num_blocks=1,
                hidden=[16, 24, 32], warmup_steps=30)
    args.update(kw)
    torch.manual_seed(0)
    m = STORM(**args)
    m.norm_mean.copy_(torch.as_tensor(dm.stats["mean"]))
    m.norm_std.copy_(torch.as_tensor(dm.stats["std"]))
    m.diff_scale.copy_(torch.as_tensor(dm.stats["diff_std"] / dm.stats["std"]))
    m.log = lambda *a, **k: None
    return m


def n_params(m) -> int:
    return sum(p.numel() for p in m.parameters())


def train(m, dm, steps: int, lr: float = 2e-3) -> dict:
    opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=1e-4)
    warm = 30
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.05 + 0.475 * (1 + math.cos(math.pi * (s - warm) / (steps - warm))))
    gen = torch.Generator().manual_seed(0)
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
            "final_loss": float(loss)}


@torch.no_grad()
def evaluate(models: dict, dm, region_idx) -> tuple[dict, dict]:
    """Scores per forecaster: {'global'|'region': {lead_h: (rmse_norm, acc)}}; consistency per pair of resolutions."""
    from lit_iclr.storm.metrics import WB2Scores, lat_weights
    from lit_iclr.storm.pyramid import down

    loader = torch.utils.data.DataLoader(dm.test_set, batch_size=16)
    leads = dm.test_set.lead_steps.tolist()
    w = lat_weights(torch.tensor(dm.latitudes))[:, None].expand(len(dm.latitudes), len(dm.longitudes)).contiguous()
    ilat, ilon = region_idx
    wr = lat_weights(torch.tensor(dm.latitudes)[ilat])[:, None].expand(len(ilat), len(ilon)).contiguous()
    names = ["persistence", "climatology", *models]
    scores = {n: {"global": WB2Scores(len(leads), dm.num_channels, w), "region": WB2Scores(len(leads), dm.num_channels, wr)}
              for n in names}
    cons = {}
    for m in models.values():
        m.eval()
    for b in loader:
        y, clim = b["y"], b["y_clim"]
        fc = {"persistence": b["x"][:, -1:].expand_as(y), "climatology": clim}
        heads = {}
        for name, m in models.items():
            preds = m.rollout(m._grid(b["x"]), m._grid(b["static"]), b["init_time"], max(leads))
            heads[name] = [[preds[k - 1][s] for k in leads] for s in range(m.S)]
            if m.coarsen == 0:
                fc[name] = torch.stack(heads[name][0], 1)
        for name, f in fc.items():
            scores[name]["global"].update(f, y, clim)
            sub = lambda t: t[..., ilat, :][..., ilon]
            scores[name]["region"].update(sub(f), sub(y), sub(clim))
        # multi-resolution consistency: RMS of Down(finer) - coarser, lat-weighted, normalised units, per lead
        for label, fine, coarse, level in _pairs(heads):
            for j, lead in enumerate(leads):
                wl = w
                for _ in range(level + 1):
                    wl = down(wl)
                d = ((down(fine[j]) - coarse[j]) ** 2 * wl).sum((-2, -1)) / wl.sum()
                acc = cons.setdefault(label, {}).setdefault(lead * dm.step_hours, [0.0, 0])
                acc[0] += float(d.mean(1).sum())
                acc[1] += d.shape[0]
    out = {}
    for name in names:
        out[name] = {}
        for where in ("global", "region"):
            r, a = scores[name][where].compute()
            out[name][where] = {lead * dm.step_hours: (float(r[j].mean()), float(a[j].mean())) for j, lead in enumerate(leads)}
    cons = {k: {h: math.sqrt(s / n) for h, (s, n) in v.items()} for k, v in cons.items()}
    return out, cons


def _pairs(heads: dict):
    """(label, finer forecasts, coarser forecasts, level of the finer grid) for STORM's heads and separate models."""
    if "STORM" in heads:
        h = heads["STORM"]
        for s in range(len(h) - 1):
            yield f"STORM heads {s}->{s + 1}", h[s], h[s + 1], s
    chain = [heads.get(n) for n in ("single-scale", "separate coarse x2", "separate coarse x4")]
    if all(c is not None for c in chain):
        for s in range(2):
            yield f"separate models {s}->{s + 1}", chain[s][0], chain[s + 1][0], s


def matmul_peak(seconds: float = 3.0, n: int = 1024) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    reps, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * n**3 * reps / (time.time() - t0)


def train_flops(m, dm) -> tuple[float, float]:
    """FLOPs of one training step (forward + backward, counted by torch) and its time."""
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


def figures(models, dm, results, cons):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lit_iclr.storm.module import forecast_figure

    OUT.mkdir(parents=True, exist_ok=True)
    m = models["STORM"]
    b = next(iter(torch.utils.data.DataLoader(dm.test_set, batch_size=1)))
    leads = dm.test_set.lead_steps.tolist()
    with torch.no_grad():
        preds = m.rollout(b["x"], b["static"], b["init_time"], max(leads))
    pred = torch.stack([preds[k - 1][0][0] for k in leads])
    fig = forecast_figure(pred, b["y"][0], leads, 0, m.channel_names, m.norm_mean, m.norm_std, dm.step_hours)
    fig.savefig(OUT / "storm_forecast.png", dpi=90)
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
    fig.savefig(OUT / "storm_skill.png", dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    steps = args.steps or (20 if args.quick else 200)
    t_all = time.time()
    dm = make_data(args.quick)
    import numpy as np

    from lit_iclr.storm.wb2 import region_index

    ilat, ilon = region_index(np.array(dm.latitudes), np.array(dm.longitudes), REGION)
    storm = make_model(dm)
    target = n_params(storm)
    # single-scale network of the same parameter count: one width, searched to match
    width = min(range(8, 96), key=lambda wd: abs(n_params(make_model(dm, num_scales=1, hidden=[wd])) - target))
    specs = {
        "STORM": {},
        "STORM w/o cross-scale": dict(cross_scale=False),
        "single-scale": dict(num_scales=1, hidden=[width]),
        "separate coarse x2": dict(num_scales=1, hidden=[width], coarsen=1),
        "separate coarse x4": dict(num_scales=1, hidden=[width], coarsen=2),
    }
    models, train_info = {}, {}
    for name, kw in specs.items():
        m = storm if name == "STORM" else make_model(dm, **kw)
        train_info[name] = {"params": n_params(m), **train(m, dm, steps)}
        models[name] = m
        print(f"trained {name}: {train_info[name]}", flush=True)
    results, cons = evaluate(models, dm, (ilat, ilon))
    peak = matmul_peak()
    flops, step_s = train_flops(storm, dm)
    load = loader_rate(dm)
    figures({k: v for k, v in models.items()}, dm, {k: v for k, v in results.items() if "coarse" not in k}, cons)
    short, long_ = 6, max(results["STORM"]["global"])
    print(f"\nSTORM benchmark ({'quick' if args.quick else 'full'}; {steps} training steps x batch {dm.batch_size}, "
          f"test year {dm.test_period}, {len(dm.test_set)} initialisations; regional box {REGION})\n")
    print(f"| forecaster | params | global RMSE {short} h | global ACC {short} h | global RMSE {long_} h | "
          f"global ACC {long_} h | region RMSE {short} h | region RMSE {long_} h | region ACC {long_} h |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if "coarse" in name:
            continue
        g, rg = r["global"], r["region"]
        p = train_info.get(name, {}).get("params", 0)
        print(f"| {name} | {p} | {g[short][0]:.4f} | {g[short][1]:.4f} | {g[long_][0]:.4f} | {g[long_][1]:.4f} | "
              f"{rg[short][0]:.4f} | {rg[long_][0]:.4f} | {rg[long_][1]:.4f} |")
    print("\nRMSE: latitude-weighted, in units of each channel's training std, mean over the 6 channels.\n")
    hs = sorted(next(iter(cons.values())))
    print("| multi-resolution consistency RMS | " + " | ".join(f"{h} h" for h in hs) + " |")
    print("|---|" + "---|" * len(hs))
    for label, v in cons.items():
        print(f"| {label} | " + " | ".join(f"{v[h]:.4f}" for h in hs) + " |")
    full = {h: results["STORM"]["global"][h][0] for h in hs}
    print("\n| per-lead gap (global RMSE) | " + " | ".join(f"{h} h" for h in hs) + " |")
    print("|---|" + "---|" * len(hs))
    for name in ("single-scale", "STORM w/o cross-scale", "persistence"):
        print(f"| {name} / STORM | " + " | ".join(f"{results[name]['global'][h][0] / full[h]:.3f}" for h in hs) + " |")
    sps = dm.batch_size / step_s
    print(f"\n| speed (1 thread) | value |\n|---|---|\n| STORM training samples/s | {sps:.1f} |\n"
          f"| train-step FLOPs per sample (fwd+bwd, 2-step rollout) | {flops / dm.batch_size / 1e9:.2f} GFLOP |\n"
          f"| achieved FLOP/s | {flops / step_s / 1e9:.2f} GFLOP/s |\n| fp32 matmul peak (1024^2, same run) | "
          f"{peak / 1e9:.2f} GFLOP/s |\n| fraction of peak | {flops / step_s / peak:.3f} |\n"
          f"| loader samples/s (in-memory) | {load:.0f} ({load / sps:.0f}x the training step) |")
    print(f"\ntotal {time.time() - t_all:.0f} s")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps({"results": results, "consistency": cons, "train": train_info,
                                                  "speed": {"samples_per_s": sps, "flops": flops, "peak": peak,
                                                            "loader": load}}, indent=1, default=str))


if __name__ == "__main__":
    main()
