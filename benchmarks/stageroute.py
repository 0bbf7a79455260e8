"""StageRoute benchmark on the synthetic long-horizon workload (12 arriving models, M_max = 3, b = 0.35).

Protocol (every policy under the same budget pacing, the same workload draws and the same query streams):
(0) tuning on separate streams: workload and stream seeds 100-104 (the test seeds are 0-4) at T = 10000, the same
    budget of 4 values for StageRoute's radius scale s and for epsilon-greedy's epsilon; the lowest mean regret vs V_B
    wins and is used on the test streams;
(1) regret against V_B (the bandits-with-knapsacks benchmark over the horizon) vs T over 2.5 decades (T = 300 .. 100000),
    StageRoute (tuned s and the textbook s = 1), epsilon-greedy (tuned epsilon) and the oracle that knows the means (paced
    like the others), with paired 95% CIs and the log-log slope per seed;
(2) every policy at T = 10000 with paired 95% CIs against tuned StageRoute; (3) the stage length of the T^(1/3) rule vs a
    sweep; (4) speed: the exact routing LP vs HiGHS, subset enumeration vs the MILP, the LP cache, per-query routing.

    OMP_NUM_THREADS=1 python benchmarks/stageroute.py --jobs 2     # runs (resumable: results in runs/stageroute_bench)
    python benchmarks/stageroute.py --report                       # tables + seeds/figures/stageroute_regret.png
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from lit_iclr.core.stats import mean_std, paired_ci  # noqa: E402
from lit_iclr.stageroute.router import Router, RouterConfig, run  # noqa: E402
from lit_iclr.stageroute.synthetic import synthetic_workload  # noqa: E402

BUDGET, M_MAX = 0.35, 3
TUNE_SEEDS, TEST_SEEDS, T_TUNE = tuple(range(100, 105)), tuple(range(5)), 10000
S_GRID, EPS_GRID = (0.03, 0.1, 0.3, 1.0), (0.01, 0.03, 0.1, 0.3)  # the same tuning budget: 4 values x 5 streams each
HORIZONS = (300, 1000, 3000, 10000, 30000, 100000)
T_POLICIES, T_STAGE, T_SPEED = 10000, 10000, 3000
OTHERS = ("greedy", "cost_blind", "random", "per_query")


def tuning_jobs() -> list[dict]:
    return ([{"horizon": T_TUNE, "radius_scale": s, "seed": k} for s in S_GRID for k in TUNE_SEEDS]
            + [{"horizon": T_TUNE, "policy": "eps_greedy", "epsilon": e, "seed": k} for e in EPS_GRID for k in TUNE_SEEDS])


def test_jobs(s: float, eps: float) -> list[dict]:
    out = []
    for k in TEST_SEEDS:
        for T in HORIZONS:
            out += [{"horizon": T, "radius_scale": s, "seed": k}, {"horizon": T, "radius_scale": 1.0, "seed": k},
                    {"horizon": T, "policy": "eps_greedy", "epsilon": eps, "seed": k},
                    {"horizon": T, "policy": "oracle", "seed": k}]
        out += [{"horizon": T_POLICIES, "policy": p, "radius_scale": s, "seed": k} for p in OTHERS]
        rule = math.ceil(T_STAGE ** (1 / 3))
        out += [{"horizon": T_STAGE, "stage_length": lam, "radius_scale": s, "seed": k} for lam in (1, 4 * rule, 16 * rule)]
        out += [{"horizon": T_SPEED, "radius_scale": s, "seed": k, **kw} for kw in
                ({"lp_solver": "highs"}, {"lp_solver": "highs", "enumerate_up_to": 0}, {"cache_tol": 0.0})]
    unique = {key(j): j for j in out}
    return sorted(unique.values(), key=lambda j: -j["horizon"])  # longest first: the pool ends evenly


def one(kw: dict) -> dict:
    w = synthetic_workload(12, 20000, seed=kw["seed"])
    cfg = RouterConfig(budget=BUDGET, m_max=M_MAX, **kw)
    t = time.perf_counter()
    s, _ = run(w, cfg)
    dt = time.perf_counter() - t
    T = cfg.horizon
    res = {"regret": Router(w, cfg).horizon_value() - float(s.reward), "stage_regret": float(s.regret),
           "cost": float(s.spent) * w.cost.max() / T, "served": float(s.served) / T, "qps": T / dt,
           "lp": float(s.lp_solves), "deploy": float(s.deploy_solves), "stage": cfg.stage, "sec": dt}
    return {**res, "key": key(kw), **kw}


def key(kw: dict) -> str:
    return json.dumps(kw, sort_keys=True)


def load(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def execute(out: Path, todo: list[dict], jobs: int) -> None:
    done = {r["key"] for r in load(out)}
    todo = [j for j in todo if key(j) not in done]
    with ProcessPoolExecutor(jobs) as ex, (out / "results.jsonl").open("a") as f:
        for res in ex.map(one, todo):
            f.write(json.dumps(res) + "\n")
            f.flush()
            print(res["key"], f"regret {res['regret']:.1f} ({res['sec']:.1f} s)", flush=True)


def get(rows: list[dict], seeds, **kw) -> list[dict]:
    """Rows matching kw (absent keys at RouterConfig's defaults), one per seed in `seeds`, in seed order."""
    defaults = RouterConfig.__dataclass_fields__
    got = {r["seed"]: r for r in rows if r["seed"] in seeds
           and all(r.get(k, defaults[k].default) == v for k, v in kw.items())
           and all(r.get(k, defaults[k].default) == defaults[k].default for k in
                   ("stage_length", "lp_solver", "cache_tol", "enumerate_up_to") if k not in kw)}
    return [got[k] for k in seeds if k in got]


def tuned(rows: list[dict]) -> tuple[float, float, list[str]]:
    """(s, epsilon) with the lowest mean regret vs V_B on the tuning streams, and the tuning table."""
    lines = ["| knob | value | regret vs V_B (tuning streams) |", "|---|---|---|"]
    best = {}
    for name, grid, kw in (("s (StageRoute)", S_GRID, lambda v: {"radius_scale": v, "policy": "stageroute"}),
                           ("epsilon (epsilon-greedy)", EPS_GRID, lambda v: {"epsilon": v, "policy": "eps_greedy"})):
        scores = {}
        for v in grid:
            r = get(rows, TUNE_SEEDS, horizon=T_TUNE, **kw(v))
            if len(r) == len(TUNE_SEEDS):
                scores[v] = np.mean([x["regret"] for x in r])
                lines.append(f"| {name} | {v} | {mean_std([x['regret'] for x in r])} |")
        best[name] = min(scores, key=scores.get) if len(scores) == len(grid) else None
    return best["s (StageRoute)"], best["epsilon (epsilon-greedy)"], lines


def col(rows, k):
    return [r[k] for r in rows]


def slope(ts, values) -> float:
    return float(np.polyfit(np.log(ts), np.log(np.maximum(values, 1e-9)), 1)[0])


def report(out: Path, figure: Path | None) -> None:
    rows = load(out)
    s, eps, lines = tuned(rows)
    n = len(TEST_SEEDS)
    print(f"## Tuning (workload and stream seeds {TUNE_SEEDS[0]}-{TUNE_SEEDS[-1]}, T = {T_TUNE}, 4 values per knob)\n")
    print("\n".join(lines))
    if s is None or eps is None:
        print("\n(tuning incomplete)")
        return
    print(f"\nChosen: s = {s}, epsilon = {eps}.\n")
    arms = {f"stageroute s = {s} (tuned)": {"radius_scale": s, "policy": "stageroute"},
            "stageroute s = 1 (textbook)": {"radius_scale": 1.0, "policy": "stageroute"},
            f"eps_greedy eps = {eps} (tuned)": {"policy": "eps_greedy", "epsilon": eps},
            "oracle (paced)": {"policy": "oracle"}}
    curves = {name: {T: get(rows, TEST_SEEDS, horizon=T, **kw) for T in HORIZONS} for name, kw in arms.items()}
    ours = curves[f"stageroute s = {s} (tuned)"]
    print(f"## Regret vs V_B against T (test seeds {TEST_SEEDS[0]}-{TEST_SEEDS[-1]}, b = {BUDGET}, M_max = {M_MAX})\n")
    print("| T | " + " | ".join(arms) + " | tuned StageRoute - eps_greedy | tuned StageRoute - oracle |")
    print("|---|" + "---|" * (len(arms) + 2))
    eg, orc = curves[f"eps_greedy eps = {eps} (tuned)"], curves["oracle (paced)"]
    for T in HORIZONS:
        if any(len(c[T]) != n for c in curves.values()):
            continue
        cells = [mean_std(col(c[T], "regret")) for c in curves.values()]
        print(f"| {T} | " + " | ".join(cells) + f" | {paired_ci(col(ours[T], 'regret'), col(eg[T], 'regret'))} | "
              f"{paired_ci(col(ours[T], 'regret'), col(orc[T], 'regret'))} |")
    print("\n| policy | regret / T at T = 300 | at T = 100000 | cost per query at T = 100000 | served at T = 100000 |")
    print("|---|---|---|---|---|")
    for name, c in curves.items():
        if len(c[HORIZONS[0]]) == n and len(c[HORIZONS[-1]]) == n:
            print(f"| {name} | {np.mean(col(c[HORIZONS[0]], 'regret')) / HORIZONS[0]:.4f} | "
                  f"{np.mean(col(c[HORIZONS[-1]], 'regret')) / HORIZONS[-1]:.4f} | {mean_std(col(c[HORIZONS[-1]], 'cost'))} | "
                  f"{mean_std(col(c[HORIZONS[-1]], 'served'))} |")

    print(f"\n## Log-log slope of regret vs V_B over T = {HORIZONS[0]} .. {HORIZONS[-1]} "
          f"({math.log10(HORIZONS[-1] / HORIZONS[0]):.1f} decades; claim: 2/3)\n")
    print("| policy | slope of the mean | per-seed slopes | per-seed mean +- std | local slopes of the mean |")
    print("|---|---|---|---|---|")
    fits = {}
    for name, c in curves.items():
        ts = [T for T in HORIZONS if len(c[T]) == n]
        if len(ts) < 2:
            continue
        m = [np.mean(col(c[T], "regret")) for T in ts]
        per = [slope(ts, [c[T][i]["regret"] for T in ts]) for i in range(n)]
        local = [math.log(m[i + 1] / m[i]) / math.log(ts[i + 1] / ts[i]) if min(m[i], m[i + 1]) > 0 else float("nan")
                 for i in range(len(ts) - 1)]
        fits[name] = (ts, m, slope(ts, m), per)
        print(f"| {name} | {slope(ts, m):.3f} | {', '.join(f'{x:.2f}' for x in per)} | {mean_std(per)} | "
              f"{', '.join(f'{x:.2f}' for x in local)} |")

    ref = ours[T_POLICIES]
    print(f"\n## Every policy at T = {T_POLICIES} (test seeds; difference = policy - tuned StageRoute, paired 95% CI)\n")
    print("| policy | regret vs V_B | per-stage-oracle regret | cost per query | served | policy - StageRoute | "
          "LP solves | deployment solves |")
    print("|---|---|---|---|---|---|---|---|")
    table = [(name, c[T_POLICIES]) for name, c in curves.items()]
    table += [(p, get(rows, TEST_SEEDS, horizon=T_POLICIES, policy=p, radius_scale=s)) for p in OTHERS]
    for name, r in table:
        if len(r) != n or len(ref) != n:
            continue
        ci = "-" if r is ref else str(paired_ci(col(r, "regret"), col(ref, "regret")))
        print(f"| {name} | {mean_std(col(r, 'regret'))} | {mean_std(col(r, 'stage_regret'))} | {mean_std(col(r, 'cost'))} | "
              f"{mean_std(col(r, 'served'))} | {ci} | {np.mean(col(r, 'lp')):.0f} | {np.mean(col(r, 'deploy')):.0f} |")

    rule = math.ceil(T_STAGE ** (1 / 3))
    base = ours[T_STAGE]
    print(f"\n## Stage length at T = {T_STAGE} (s = {s}): the T^(1/3) rule (Lambda = {rule}) vs a sweep\n")
    print("| Lambda | regret vs V_B | Lambda - rule, paired 95% CI | served |")
    print("|---|---|---|---|")
    for lam in (1, rule, 4 * rule, 16 * rule):
        r = base if lam == rule else get(rows, TEST_SEEDS, horizon=T_STAGE, stage_length=lam, radius_scale=s)
        if len(r) != n or len(base) != n:
            continue
        ci = "-" if lam == rule else str(paired_ci(col(r, "regret"), col(base, "regret")))
        print(f"| {lam}{' (rule)' if lam == rule else ''} | {mean_std(col(r, 'regret'))} | {ci} | "
              f"{mean_std(col(r, 'served'))} |")

    base = ours[T_SPEED]
    print(f"\n## Speed at T = {T_SPEED} (s = {s}; queries/s of the runs' processes, ratio to the default)\n")
    print("| run | regret vs V_B | LP solves | deployment solves | queries/s | speed ratio | regret - default |")
    print("|---|---|---|---|---|---|---|")
    for name, kw in (("default: exact LP, enumeration, cache_tol 0.01", None),
                     ("HiGHS linprog for routing", {"lp_solver": "highs"}),
                     ("HiGHS linprog + HiGHS MILP for deployment", {"lp_solver": "highs", "enumerate_up_to": 0}),
                     ("cache_tol 0 (an LP every query)", {"cache_tol": 0.0})):
        r = base if kw is None else get(rows, TEST_SEEDS, horizon=T_SPEED, radius_scale=s, **kw)
        if len(r) != n or len(base) != n:
            continue
        ci = "-" if kw is None else str(paired_ci(col(r, "regret"), col(base, "regret")))
        print(f"| {name} | {mean_std(col(r, 'regret'))} | {np.mean(col(r, 'lp')):.0f} | {np.mean(col(r, 'deploy')):.0f} | "
              f"{np.mean(col(r, 'qps')):.0f} | {np.mean(col(r, 'qps')) / np.mean(col(base, 'qps')):.2f} | {ci} |")

    if figure is not None and fits:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4.2))
        for name, (ts, m, fit, per) in fits.items():
            line = ax.plot(ts, m, marker="o", label=f"{name}: slope {fit:.2f} (per seed {np.mean(per):.2f} +- "
                                                     f"{np.std(per, ddof=1):.2f})")[0]
            for i in range(n):
                ax.plot(ts, [max(curves[name][T][i]["regret"], 1e-1) for T in ts], color=line.get_color(), lw=0.5,
                        alpha=0.35)
        t0 = np.array([HORIZONS[0], HORIZONS[-1]], float)
        anchor = fits[next(iter(fits))][1][0]
        ax.plot(t0, anchor * (t0 / t0[0]) ** (2 / 3), ":", color="grey", label="slope 2/3")
        ax.plot(t0, anchor * (t0 / t0[0]), "-.", color="lightgrey", label="slope 1")
        ax.set(xscale="log", yscale="log", xlabel="T (queries)", ylabel="regret vs V_B (mean; thin: each seed)",
               title="StageRoute: cumulative regret vs T (test streams)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(figure, dpi=120)
        print(f"\nFigure: {figure}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("runs/stageroute_bench"))
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--report", action="store_true", help="print the tables from the results found under --out")
    ap.add_argument("--figure", type=Path, default=Path("seeds/figures/stageroute_regret.png"))
    args = ap.parse_args()
    if args.report:
        report(args.out, args.figure)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    execute(args.out, tuning_jobs(), args.jobs)
    s, eps, _ = tuned(load(args.out))
    print(f"tuned on seeds {TUNE_SEEDS}: s = {s}, epsilon = {eps}", flush=True)
    execute(args.out, test_jobs(s, eps), args.jobs)
    report(args.out, args.figure)


if __name__ == "__main__":
    main()
