"""StageRoute benchmark on the synthetic long-horizon workload (12 arriving models, M_max = 3, b = 0.35, 5 seeds).

Regret is measured against two comparators: the horizon (bandits-with-knapsacks) benchmark V_B, which may move the total
budget B = b T between stages as a paced policy can (the headline, never beaten in expectation), and the per-stage oracle
held to b in every stage (the earlier definition, which a paced policy can beat). Tables:
(1) regret vs T for three confidence-radius scales, with fitted log-log slopes (claim: about 2/3) and a figure;
(2) every policy at T = 10000 with paired 95% CIs against StageRoute; (3) the stage length of the T^(1/3) rule vs a sweep;
(4) speed: the exact routing LP vs HiGHS, subset enumeration vs the MILP, the LP cache, per-query routing.

    OMP_NUM_THREADS=1 python benchmarks/stageroute.py --part 0 --parts 2 &   # jobs split over processes (resumable)
    OMP_NUM_THREADS=1 python benchmarks/stageroute.py --part 1 --parts 2
    python benchmarks/stageroute.py --report                                 # tables + seeds/figures/stageroute_regret.png
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from lit_iclr.core.stats import mean_std, paired_ci  # noqa: E402
from lit_iclr.stageroute.router import Router, RouterConfig, run  # noqa: E402
from lit_iclr.stageroute.synthetic import synthetic_workload  # noqa: E402

BUDGET, M_MAX = 0.35, 3
HORIZONS = (1000, 3000, 10000, 30000, 100000)
SCALES = (1.0, 0.3, 0.1)
T_POLICIES, T_STAGE, T_SPEED = 10000, 10000, 3000
POLICIES = ("oracle", "greedy", "eps_greedy", "cost_blind", "random", "per_query")


def jobs(seeds: int) -> list[tuple[str, dict]]:
    """(table, RouterConfig overrides) for every run; the T = 100000 runs last (the longest, an extension)."""
    out = []
    for s in range(seeds):
        out += [("scale", {"horizon": T, "radius_scale": r, "seed": s}) for T in HORIZONS for r in SCALES
                if T < max(HORIZONS) or r != 0.3]  # the longest horizon for s = 1 and 0.1 only (CPU time)
        out += [("policy", {"horizon": T_POLICIES, "policy": p, "seed": s}) for p in POLICIES]
        rule = math.ceil(T_STAGE ** (1 / 3))
        out += [("stage", {"horizon": T_STAGE, "stage_length": lam, "radius_scale": r, "seed": s})
                for lam in (1, 4 * rule, 16 * rule) for r in (0.1,)]
        out += [("speed", {"horizon": T_SPEED, "seed": s, **kw}) for kw in
                ({"lp_solver": "highs"}, {"lp_solver": "highs", "enumerate_up_to": 0}, {"cache_tol": 0.0},
                 {"policy": "per_query"})]
    return sorted(out, key=lambda j: (j[1]["horizon"] == max(HORIZONS), j[1]["seed"]))


def one(kw: dict) -> dict:
    w = synthetic_workload(12, 20000, seed=kw["seed"])
    cfg = RouterConfig(budget=BUDGET, m_max=M_MAX, **kw)
    t = time.perf_counter()
    s, _ = run(w, cfg)
    dt = time.perf_counter() - t
    T = cfg.horizon
    return {"regret": Router(w, cfg).horizon_value() - float(s.reward), "stage_regret": float(s.regret),
            "cost": float(s.spent) * w.cost.max() / T, "served": float(s.served) / T, "qps": T / dt,
            "lp": float(s.lp_solves), "deploy": float(s.deploy_solves), "stage": cfg.stage, "sec": dt}


def key(kw: dict) -> str:
    return json.dumps(kw, sort_keys=True)


def work(out: Path, part: int, parts: int, seeds: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"part{part}.jsonl"
    done = {r["key"] for p in out.glob("part*.jsonl") for r in map(json.loads, p.read_text().splitlines())}
    for i, (table, kw) in enumerate(jobs(seeds)):
        if i % parts != part or key(kw) in done:
            continue
        res = one(kw)
        res.update(table=table, key=key(kw), **kw)
        with path.open("a") as f:
            f.write(json.dumps(res) + "\n")
        print(table, kw, f"regret {res['regret']:.0f} ({res['sec']:.0f} s)", flush=True)


def col(rows, k):
    return [r[k] for r in rows]


def report(out: Path, seeds: int, figure: Path | None) -> None:
    rows = [r for p in sorted(out.glob("part*.jsonl")) for r in map(json.loads, p.read_text().splitlines())]

    def get(**kw):
        got = [r for r in rows if all(r.get(k, d) == v for k, v, d in
                                      ((k, v, RouterConfig.__dataclass_fields__[k].default) for k, v in kw.items()))]
        return sorted(got, key=lambda r: r["seed"])[:seeds]

    sr = {(T, s): get(horizon=T, radius_scale=s, policy="stageroute", stage_length=None, lp_solver="exact",
                      cache_tol=0.01, enumerate_up_to=12) for T in HORIZONS for s in SCALES}
    print(f"## Regret vs T: StageRoute with radius s sqrt(2 ln T / n), stage length ceil(T^(1/3)), {seeds} seeds, "
          f"b = {BUDGET}\n")
    print("Regret against V_B (horizon benchmark, total budget b T); in brackets the earlier per-stage-oracle regret.\n")
    print("| s | T | regret vs V_B | regret / T | per-stage-oracle regret | cost per query (b = 0.35) | served | queries/s |")
    print("|---|---|---|---|---|---|---|---|")
    fits = {}
    for s in SCALES:
        ts = [T for T in HORIZONS if len(sr[T, s]) == seeds]
        for T in ts:
            r = sr[T, s]
            print(f"| {s} | {T} | {mean_std(col(r, 'regret'))} | {np.mean(col(r, 'regret')) / T:.4f} | "
                  f"{mean_std(col(r, 'stage_regret'))} | {mean_std(col(r, 'cost'))} | {mean_std(col(r, 'served'))} | "
                  f"{np.mean(col(r, 'qps')):.0f} |")
        if len(ts) >= 2:
            lt = np.log(ts)
            m = [np.mean(col(sr[T, s], "regret")) for T in ts]
            fits[s] = (ts, m, np.polyfit(lt, np.log(np.maximum(m, 1e-9)), 1))
    print("\n| s | fitted slope, all T | local slopes between consecutive T | per-seed slope (all T) |")
    print("|---|---|---|---|")
    for s, (ts, m, fit) in fits.items():
        local = [math.log(m[i + 1] / m[i]) / math.log(ts[i + 1] / ts[i]) if m[i] > 0 and m[i + 1] > 0 else float("nan")
                 for i in range(len(ts) - 1)]
        per_seed = [np.polyfit(np.log(ts), np.log(np.maximum([sr[T, s][i]["regret"] for T in ts], 1e-9)), 1)[0]
                    for i in range(seeds)]
        print(f"| {s} | {fit[0]:.3f} | {', '.join(f'{x:.2f}' for x in local)} | {mean_std(per_seed)} |")

    ref = {s: sr[T_POLICIES, s] for s in SCALES}
    print(f"\n## Every policy at T = {T_POLICIES} ({seeds} seeds; difference = policy - StageRoute (s = 1), paired 95% CI)\n")
    print("Same stream, workload, budget pacing and M_max for every policy; oracle knows the means; per-query routing "
          "ignores the stage commitment (an upper reference).\n")
    print("| policy | regret vs V_B | cost per query | served | regret - StageRoute s = 1 | regret - StageRoute s = 0.1 | "
          "LP solves | deployment solves |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in [("stageroute s = 1", ref[1.0]), ("stageroute s = 0.3", ref[0.3]), ("stageroute s = 0.1", ref[0.1])] + \
            [(p, get(horizon=T_POLICIES, policy=p)) for p in POLICIES]:
        if len(r) != seeds or len(ref[1.0]) != seeds:
            continue
        ci1 = str(paired_ci(col(r, "regret"), col(ref[1.0], "regret"))) if r is not ref[1.0] else "-"
        ci2 = str(paired_ci(col(r, "regret"), col(ref[0.1], "regret"))) if r is not ref[0.1] and len(ref[0.1]) == seeds \
            else "-"
        print(f"| {name} | {mean_std(col(r, 'regret'))} | {mean_std(col(r, 'cost'))} | {mean_std(col(r, 'served'))} | "
              f"{ci1} | {ci2} | {np.mean(col(r, 'lp')):.0f} | {np.mean(col(r, 'deploy')):.0f} |")

    rule = math.ceil(T_STAGE ** (1 / 3))
    print(f"\n## Stage length at T = {T_STAGE}: the T^(1/3) rule (Lambda = {rule}) vs a sweep (regret vs V_B)\n")
    print("| Lambda | regret vs V_B (s = 0.1) | Lambda - rule, paired 95% CI | served |")
    print("|---|---|---|---|")
    for lam in (1, rule, 4 * rule, 16 * rule):
        r = sr[T_STAGE, 0.1] if lam == rule else get(horizon=T_STAGE, stage_length=lam, radius_scale=0.1)
        if len(r) != seeds or len(sr[T_STAGE, 0.1]) != seeds:
            continue
        ci = "-" if lam == rule else str(paired_ci(col(r, "regret"), col(sr[T_STAGE, 0.1], "regret")))
        print(f"| {lam}{' (rule)' if lam == rule else ''} | {mean_std(col(r, 'regret'))} | {ci} | "
              f"{mean_std(col(r, 'served'))} |")

    base = sr[T_SPEED, 1.0]
    print(f"\n## Speed at T = {T_SPEED} (s = 1; queries/s in the same runs' processes, ratio to the default)\n")
    print("| run | regret vs V_B | LP solves | deployment solves | queries/s | speed ratio | regret - default |")
    print("|---|---|---|---|---|---|---|")
    for name, kw in (("default: exact LP, enumeration, cache_tol 0.01", None),
                     ("HiGHS linprog for routing", {"lp_solver": "highs", "enumerate_up_to": 12}),
                     ("HiGHS linprog + HiGHS MILP for deployment", {"lp_solver": "highs", "enumerate_up_to": 0}),
                     ("cache_tol 0 (an LP every query)", {"cache_tol": 0.0}),
                     ("per-query routing, no stages", {"policy": "per_query"})):
        r = base if kw is None else get(horizon=T_SPEED, **kw)
        if len(r) != seeds or len(base) != seeds:
            continue
        ci = "-" if kw is None else str(paired_ci(col(r, "regret"), col(base, "regret")))
        print(f"| {name} | {mean_std(col(r, 'regret'))} | {np.mean(col(r, 'lp')):.0f} | {np.mean(col(r, 'deploy')):.0f} | "
              f"{np.mean(col(r, 'qps')):.0f} | {np.mean(col(r, 'qps')) / np.mean(col(base, 'qps')):.2f} | {ci} |")

    if figure is not None and fits:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 4))
        for s, (ts, m, fit) in fits.items():
            sd = [np.std(col(sr[T, s], "regret"), ddof=1) for T in ts]
            line = ax.errorbar(ts, m, yerr=sd, marker="o", capsize=3, label=f"s = {s}: slope {fit[0]:.2f}")
            ax.plot(ts, np.exp(np.polyval(fit, np.log(ts))), "--", color=line[0].get_color(), lw=1)
        t0 = np.array([min(HORIZONS), max(HORIZONS)], float)
        anchor = fits[min(fits)][1][0]
        ax.plot(t0, anchor * (t0 / t0[0]) ** (2 / 3), ":", color="grey", label="slope 2/3")
        ax.plot(t0, anchor * (t0 / t0[0]), "-.", color="lightgrey", label="slope 1")
        ax.set(xscale="log", yscale="log", xlabel="T (queries)", ylabel="regret vs V_B (mean +- std, 5 seeds)",
               title="StageRoute: cumulative regret vs T")
        ax.legend(fontsize=8)
        fig.tight_layout()
        figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(figure, dpi=120)
        print(f"\nFigure: {figure}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("runs/stageroute_bench"))
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--report", action="store_true", help="print the tables from the results found under --out")
    ap.add_argument("--figure", type=Path, default=Path("seeds/figures/stageroute_regret.png"))
    args = ap.parse_args()
    if args.report:
        report(args.out, args.seeds, args.figure)
    else:
        work(args.out, args.part, args.parts, args.seeds)


if __name__ == "__main__":
    main()
