"""StageRoute benchmark on the synthetic long-horizon workload (12 arriving models, M_max = 3, b = 0.35).

Prints markdown tables: (1) cumulative regret vs T with the fitted log-log slope (claim: about 2/3) and cost vs budget;
(2) every baseline at the largest T with paired 95% CIs against StageRoute; (3) the stage length of the T^(1/3) rule vs a
sweep; (4) the LP cache: routing speed and regret with cache_tol 0 (an LP per query) vs 0.01; per-query routing without
stage commitment (upper reference) at a small T.
    OMP_NUM_THREADS=1 python benchmarks/stageroute.py [--seeds 5] [--quick]
"""
from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from lit_iclr.core.stats import mean_std, paired_ci  # noqa: E402
from lit_iclr.stageroute.router import RouterConfig, run  # noqa: E402
from lit_iclr.stageroute.synthetic import synthetic_workload  # noqa: E402

BUDGET, M_MAX = 0.35, 3


def one(seed: int, **kw) -> dict:
    w = synthetic_workload(12, 20000, seed=seed)
    cfg = RouterConfig(budget=BUDGET, m_max=M_MAX, seed=seed, **kw)
    t = time.perf_counter()
    s, _ = run(w, cfg)
    dt = time.perf_counter() - t
    T = cfg.horizon
    return {"regret": float(s.regret), "cost": float(s.spent) * w.cost.max() / T, "served": float(s.served) / T,
            "qps": T / dt, "lp": float(s.lp_solves), "deploy": float(s.deploy_solves), "stage": cfg.stage, "sec": dt}


def col(rows, key):
    return [r[key] for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smaller horizons (a smoke run)")
    args = ap.parse_args()
    seeds = range(args.seeds)
    horizons = [500, 1500, 5000] if args.quick else [1000, 3000, 10000, 20000]
    t_max = horizons[-1]

    print(f"## Regret vs T (StageRoute, stage length ceil(T^(1/3)), {args.seeds} seeds, b = {BUDGET})\n")
    print("| T | stages | regret | regret / T | cost per query (b = 0.35) | served | queries/s |")
    print("|---|---|---|---|---|---|---|")
    by_t = {}
    for T in horizons:
        rows = [one(s, horizon=T) for s in seeds]
        by_t[T] = rows
        print(f"| {T} | {math.ceil(T / rows[0]['stage'])} | {mean_std(col(rows, 'regret'))} | "
              f"{np.mean(col(rows, 'regret')) / T:.4f} | {mean_std(col(rows, 'cost'))} | {mean_std(col(rows, 'served'))} | "
              f"{np.mean(col(rows, 'qps')):.0f} |")
    logt = np.log(horizons)
    slope = np.polyfit(logt, np.log([np.mean(col(by_t[T], "regret")) for T in horizons]), 1)[0]
    per_seed = [np.polyfit(logt, np.log(np.maximum([by_t[T][i]["regret"] for T in horizons], 1e-9)), 1)[0] for i in seeds]
    print(f"\nFitted log-log slope of mean regret: {slope:.3f} (per seed {mean_std(per_seed)}; the paper's bound: 2/3)\n")

    print(f"## Every policy at T = {t_max} ({args.seeds} seeds; difference = policy - StageRoute, paired 95% CI)\n")
    print("| policy | regret | cost per query | served | regret - StageRoute | LP solves | MILP solves |")
    print("|---|---|---|---|---|---|---|")
    base = by_t[t_max]
    for p in ("stageroute", "oracle", "greedy", "eps_greedy", "cost_blind", "random"):
        rows = base if p == "stageroute" else [one(s, horizon=t_max, policy=p) for s in seeds]
        ci = "-" if p == "stageroute" else str(paired_ci(col(rows, "regret"), col(base, "regret")))
        print(f"| {p} | {mean_std(col(rows, 'regret'))} | {mean_std(col(rows, 'cost'))} | {mean_std(col(rows, 'served'))} | "
              f"{ci} | {np.mean(col(rows, 'lp')):.0f} | {np.mean(col(rows, 'deploy')):.0f} |")

    t_mid = horizons[-2]
    rule = math.ceil(t_mid ** (1 / 3))
    print(f"\n## Stage length at T = {t_mid}: the T^(1/3) rule (Lambda = {rule}) vs a sweep\n")
    print("| Lambda | regret | cost per query | served |")
    print("|---|---|---|---|")
    for lam in sorted({1, rule, 4 * rule, 16 * rule}):
        rows = by_t[t_mid] if lam == rule else [one(s, horizon=t_mid, stage_length=lam) for s in seeds]
        print(f"| {lam}{' (rule)' if lam == rule else ''} | {mean_std(col(rows, 'regret'))} | {mean_std(col(rows, 'cost'))} | "
              f"{mean_std(col(rows, 'served'))} |")

    t_small = horizons[1]
    print(f"\n## LP cache and per-query routing at T = {t_small}\n")
    print("| run | regret | LP solves | queries/s | regret - StageRoute (tol 0.01) |")
    print("|---|---|---|---|---|")
    ref = by_t[t_small]
    for name, kw in (("StageRoute, cache_tol 0.01", {}), ("StageRoute, cache_tol 0 (LP every query)", {"cache_tol": 0.0}),
                     ("per-query routing, no stages (upper reference)", {"policy": "per_query"})):
        rows = ref if not kw else [one(s, horizon=t_small, **kw) for s in seeds]
        ci = "-" if not kw else str(paired_ci(col(rows, "regret"), col(ref, "regret")))
        print(f"| {name} | {mean_std(col(rows, 'regret'))} | {np.mean(col(rows, 'lp')):.0f} | {np.mean(col(rows, 'qps')):.0f} | "
              f"{ci} |")


if __name__ == "__main__":
    main()
