"""SOOPER benchmark: safety during learning and return over the prior, against the baselines, on the default task.

Every method runs configs/sooper.yaml through the CLI (same prior, networks, model, real-step budget), only the
switches differ:
  SOOPER            filter=sooper   (shield C_t + gamma_c^t Q_c(s, a) < d, rollouts terminate there with Q_r value),
                    online Q_c update min(c + gamma_c Q_c(s', pi_hat(s')), Q_c(s, a)) (authors' PessimisticCostUpdate)
  SOOPER, max       the same with the opposite online rule max(...) (real data can only raise Q_c)
  prior             learn=false     (pi_hat alone)
  MB-SAC            filter=none     (unshielded model-based SAC, same optimism)
  SAC-Lagrangian    filter=none, lagrangian=true (reward r - lambda c on the same model data, dual ascent on J_c - d)
  advantage shield  filter=advantage (SAILR: Q_c(s,a) - Q_c(s,pi_hat(s)) > threshold)
Reported per method (mean over seeds): final return (deterministic policy through its filter, 5 held-out episodes),
return relative to the prior, episodes whose discounted cost exceeded d during learning, total real cost during
learning, intervention rate early/late, real env steps/s and imagined transitions/s. Paired 95% CIs over seeds.
Speed also: one batched ensemble forward (E members x N rollouts) vs a Python loop over members, in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sooper.py --seeds 3 --episodes 8   # one process, resumable
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sooper.py --config configs/sooper_cartpole.yaml --seeds 1
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sooper.py --diagnose                # Monte-Carlo check of Q_c
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sooper.py --quick                   # smoke run
Every method of a seed loads the same offline prior (`prior-s<seed>.pt` in --out, fitted by the first run); a run whose
result.json exists is not rerun. Figures: seeds/figures/sooper_curves.png (point_goal), sooper_<task>.png otherwise.
"""
from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
METHODS = {
    "SOOPER": [],
    "SOOPER with max cost update": ["--model.init_args.cost_update", "max"],
    "prior": ["--model.init_args.learn", "false"],
    "MB-SAC (unshielded)": ["--model.init_args.filter", "none"],
    "SAC-Lagrangian": ["--model.init_args.filter", "none", "--model.init_args.lagrangian", "true"],
    "advantage shield (SAILR)": ["--model.init_args.filter", "advantage"],
}


def run(job: tuple[str, int, list[str], str, str]) -> dict:
    """One method, one seed, through the CLI; a finished run's result.json is reused (the benchmark resumes)."""
    method, seed, extra, out, config = job
    slug = "".join(c if c.isalnum() else "-" for c in method.split(" (")[0]).strip("-")
    run_dir = Path(out) / f"{slug}-s{seed}"
    if (run_dir / "result.json").exists():
        return json.loads((run_dir / "result.json").read_text())
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    from lit_iclr.cli import main

    t0, cpu0 = time.perf_counter(), time.process_time()
    # every method of a seed reads the same offline prior (fitted by the first run of that seed, then loaded)
    cli = main(["fit", "--config", str(ROOT / config), "--seed_everything", str(seed),
                "--model.init_args.seed", str(seed), "--trainer.default_root_dir", str(run_dir),
                "--model.init_args.prior_path", str(Path(out) / f"prior-s{seed}.pt"),
                "--data.init_args.data_dir", str(Path(out) / "data"), "--trainer.enable_progress_bar", "false",
                *METHODS[method], *extra])
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/return")]
    col = lambda k: [float(r[k]) if r.get(k) else float("nan") for r in rows]
    result = {"method": method, "seed": seed, "wall_s": wall, "cpu_s": cpu, "final": cli.model.final,
              "budget": cli.model.hparams.budget, "task": cli.datamodule.task,
              **{k.split("/")[1]: col(k) for k in ("train/return", "train/cost", "train/discounted_cost", "train/violation",
                                                    "train/intervention_rate", "train/real_steps", "speed/env_steps_per_s",
                                                    "speed/imagined_per_s")}}
    (run_dir / "result.json").write_text(json.dumps(result))  # each run on its own: a partial benchmark can be reported
    return result


def ci(a: np.ndarray, b: np.ndarray) -> str:
    """Paired 95% CI of mean(a - b) over seeds (`lit_iclr.core.stats.paired_ci`), flagged when it covers 0."""
    from lit_iclr.core.stats import paired_ci

    r = paired_ci(a, b)
    if r.low == r.high:
        return f"{r.mean:+.2f} (no spread)"
    sig = "" if r.low > 0 or r.high < 0 else ", not significant"
    return f"{r.mean:+.2f} [{r.low:+.2f}, {r.high:+.2f}]{sig}"


def ms(v) -> str:
    v = np.asarray(v, dtype=float)
    return f"{v.mean():.1f} +- {v.std(ddof=1) if len(v) > 1 else 0.0:.1f}"


def ensemble_speed(members: int = 5, rollouts: int = 256, reps: int = 200) -> tuple[float, float]:
    """Imagined-step forward of the dynamics ensemble: one batched call vs a loop over members (transitions/s)."""
    import torch

    from lit_iclr.sooper.nets import DynamicsEnsemble

    torch.set_num_threads(1)
    model = DynamicsEnsemble(4, 2, [128, 128], members)
    s, a = torch.randn(rollouts, 4), torch.randn(rollouts, 2)
    x = (torch.cat([s, a], -1) - model.in_mean) / model.in_std
    with torch.no_grad():
        t = time.perf_counter()
        for _ in range(reps):
            model.predict(s, a)
        batched = reps * rollouts / (time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(reps):
            for e in range(members):  # the same network, member by member
                h = x
                for layer in model.net.hidden:
                    h = torch.nn.functional.silu(h @ layer.weight[e] + layer.bias[e])
                h @ model.net.out.weight[e] + model.net.out.bias[e]
        looped = reps * rollouts / (time.perf_counter() - t)
    return batched, looped


def edge_states(env, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Hazard-edge states of point_goal: just outside the hazard (|p - h| in [r, r + 0.15]), moving towards it."""
    ang = rng.uniform(0, 2 * np.pi, n)
    rad = env.hazard_radius + rng.uniform(0.0, 0.15, n)
    unit = np.stack([np.cos(ang), np.sin(ang)], -1)
    pos = env.hazard + rad[:, None] * unit
    vel = -unit * rng.uniform(0.0, 0.6, n)[:, None]
    return pos, vel


def rollout_cost(env, policy, pos: np.ndarray, vel: np.ndarray, steps: int, gamma_c: float) -> np.ndarray:
    """Monte-Carlo discounted cost sum_t gamma_c^t c_t of a deterministic batched `policy` (obs [N, 4] -> [N, 2])
    run in the real simulator from each (pos, vel), for `steps` steps (one MuJoCo state per start, policy batched)."""
    from lit_iclr.sooper.envs import make_task

    envs = [make_task("point_goal") for _ in range(len(pos))]
    obs = np.stack([e.reset_to(p, v) for e, p, v in zip(envs, pos, vel, strict=True)])
    cost, disc = np.zeros(len(pos)), 1.0
    for _ in range(steps):
        act = policy(obs)
        out = [e.step(a) for e, a in zip(envs, act, strict=True)]
        obs = np.stack([o[0] for o in out])
        cost += disc * np.array([o[4]["cost"] for o in out])
        disc *= gamma_c
    return cost


def diagnose(args) -> None:
    """Is the prior's Q_c(s, pi_hat(s)) an upper bound on pi_hat's real discounted cost-to-go? Checked from hazard-edge
    states (the stress case: moving towards the hazard) and from states of the offline data (visited states)."""
    import torch

    torch.set_num_threads(1)
    from lit_iclr.sooper.data import SafeOfflineData
    from lit_iclr.sooper.envs import point_goal_prior
    from lit_iclr.sooper.module import SOOPER
    from lit_iclr.sooper.planning import aggregate_cost

    kwargs = json.loads(args.diag_kwargs)
    data = {}
    for cost in sorted({float(g.split(":")[2]) for g in args.diag_grid.split(",")}):
        dm = SafeOfflineData(data_dir=str(Path(args.out) / "data"), num_episodes=100, batch_size=128, safe_episode_cost=cost)
        dm.prepare_data()
        dm.setup("fit")
        data[cost] = dm.transitions
    env = dm.make_env()
    rng = np.random.default_rng(0)
    visited = data[cost]["observations"].numpy()[rng.choice(len(data[cost]["rewards"]), args.diag_states, replace=False)]
    starts = {"hazard edge": edge_states(env, args.diag_states, rng), "offline data": (visited[:, :2], visited[:, 2:])}
    gamma_c = 0.99
    print(f"\n### Monte-Carlo check of Q_c(s, pi_hat(s)) ({args.diag_states} states per set, {args.diag_horizon} steps, "
          f"gamma_c = {gamma_c}); options {kwargs}\n")
    for name, (pos, vel) in starts.items():
        scripted = rollout_cost(env, lambda o: point_goal_prior(o, env), pos, vel, args.diag_horizon, gamma_c)
        print(f"- {name}: the behaviour's cautious controller from the same states: J_c = {scripted.mean():.2f}, "
              f"{np.mean(scripted > 0):.0%} enter the hazard")
    print("\n| states | prior steps | critic width | BC-Safe max episode cost | seed | MC J_c of pi_hat (mean) | "
          "pi_hat enters the hazard | Q_c head mean | Q_c as the shield reads it | "
          "Q_c >= MC (head mean / shield) | fit s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for g in args.diag_grid.split(","):
        steps, width, safe_cost = int(g.split(":")[0]), int(g.split(":")[1]), float(g.split(":")[2])
        for seed in range(args.diag_seeds):
            torch.manual_seed(seed)
            m = SOOPER(4, 2, critic_hidden=[width, width], seed=seed, warm_start=False, **kwargs)
            t0 = time.process_time()
            m.fit_prior(data[safe_cost], steps, 128)
            fit_s = time.process_time() - t0
            for name, (pos, vel) in starts.items():
                obs0 = torch.as_tensor(np.concatenate([pos, vel], -1), dtype=torch.float32)
                with torch.no_grad():
                    mc = rollout_cost(env, lambda o, pi=m.prior: pi(torch.as_tensor(o, dtype=torch.float32)).numpy(), pos,
                                      vel, args.diag_horizon, gamma_c)
                    heads = m.prior_cost(obs0, m.prior(obs0))
                q0 = heads.mean(0).numpy()
                qs = aggregate_cost(heads, m.hparams.cost_kappa, m.hparams.cost_margin).numpy()
                print(f"| {name} | {steps} | {width} | {safe_cost:g} | {seed} | {mc.mean():.2f} | {np.mean(mc > 0):.0%} | "
                      f"{q0.mean():.2f} | {qs.mean():.2f} | {np.mean(q0 >= mc):.0%} / {np.mean(qs >= mc):.0%} | "
                      f"{fit_s:.0f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=1, help="processes; 1 runs in this process, in order, resumable")
    p.add_argument("--config", default="configs/sooper.yaml", help="configs/sooper.yaml or configs/sooper_cartpole.yaml")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "sooper"))
    p.add_argument("--report-only", action="store_true", help="re-print the table from the runs' result.json files")
    p.add_argument("--episodes", type=int, default=10, help="real episodes per run (configs/sooper.yaml: 20)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    p.add_argument("--set", default="", help="extra CLI overrides for every method, one string, e.g. "
                   "--set='--model.init_args.cost_kappa 3'")
    p.add_argument("--diagnose", action="store_true", help="Monte-Carlo check of the prior's cost critic, then exit")
    p.add_argument("--diag-states", type=int, default=200)
    p.add_argument("--diag-seeds", type=int, default=2)
    p.add_argument("--diag-grid", default="1000:64:8,3000:64:8",
                   help="prior steps:critic width:BC-Safe max episode cost, comma-separated")
    p.add_argument("--diag-horizon", type=int, default=100, help="Monte-Carlo steps (the episode length)")
    p.add_argument("--diag-kwargs", default="{}", help="SOOPER options of the prior as JSON, e.g. '{\"prior_tau\": 0.05}'")
    args = p.parse_args()
    if args.diagnose:
        return diagnose(args)
    if args.report_only:
        results = [json.loads(f.read_text()) for f in sorted(Path(args.out).glob("*/result.json"))]
        return report(results, float("nan"), args)
    extra = ["--data.init_args.online_episodes", str(3 if args.quick else args.episodes)]
    extra += ["--model.init_args.prior_steps", "200"] if args.quick else []
    extra += args.set.split()
    methods = args.methods.split(",")
    jobs = [(m, s, extra, args.out, args.config) for s in range(args.seeds) for m in methods]
    t0 = time.perf_counter()
    if args.jobs == 1:
        results = []
        for job in jobs:
            results.append(run(job))
            print(f"done {job[0]} seed {job[1]}", flush=True)
    else:
        pool = mp.get_context("spawn").Pool(args.jobs)
        results = list(pool.imap_unordered(run, jobs, chunksize=1))
        pool.close()  # let the workers exit: terminate() (the context manager's exit) hangs on Lightning's SIGTERM handler
        pool.join()
    total = time.perf_counter() - t0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(results))
    report(results, total, args)


def report(results: list[dict], total: float, args) -> None:
    by = {m: sorted([r for r in results if r["method"] == m], key=lambda r: r["seed"]) for m in METHODS}
    by = {m: rs for m, rs in by.items() if rs}
    seeds = sorted(set.intersection(*[{r["seed"] for r in rs} for rs in by.values()]))  # seeds every method finished
    by = {m: [r for r in rs if r["seed"] in seeds] for m, rs in by.items()}
    if "SOOPER" not in by or "prior" not in by:  # a partial sweep: per-run numbers only, no table or figure
        for m, rs in by.items():
            for r in rs:
                print(f"{m} seed {r['seed']}: final return {r['final']['return']:.1f}, over-budget episodes while "
                      f"learning {int(np.nansum(r['violation']))} of {len(r['violation'])}, mean intervention rate "
                      f"{np.nanmean(r['intervention_rate']):.2f}")
        return
    args.seeds = len(seeds)
    final = {m: np.array([r["final"]["return"] for r in rs]) for m, rs in by.items()}
    viol = {m: np.array([np.nansum(r["violation"]) for r in rs]) for m, rs in by.items()}
    episodes = len(by["SOOPER"][0]["return"])
    steps = int(by["SOOPER"][0]["real_steps"][-1])
    first = by["SOOPER"][0]
    print(f"\n### SOOPER vs baselines on {first.get('task', 'point_goal')} (d = {first.get('budget', 5.0):g}), "
          f"{args.seeds} seeds, {episodes} real episodes ({steps} real steps) each\n")
    print("| method | final return | vs prior | over-budget episodes while learning | total cost while learning | "
          "final-eval violations | intervention rate (first 5 / last 5 eps) | env steps/s | imagined/s | CPU s/run |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m, rs in by.items():
        cost = np.array([np.nansum(r["cost"]) for r in rs])
        iv_first = np.mean([np.nanmean(r["intervention_rate"][:5]) for r in rs])
        iv_last = np.mean([np.nanmean(r["intervention_rate"][-5:]) for r in rs])
        env_sps = np.mean([np.nanmean(r["env_steps_per_s"]) for r in rs])
        im = np.mean([np.nanmean(r["imagined_per_s"]) for r in rs]) if m != "prior" else float("nan")
        fviol = np.sum([r["final"]["violations"] for r in rs])
        cpu = np.mean([r.get("cpu_s", float("nan")) for r in rs])
        print(f"| {m} | {ms(final[m])} | {final[m].mean() - final['prior'].mean():+.1f} | "
              f"{ms(viol[m])} ({', '.join(str(int(v)) for v in viol[m])}) | {ms(cost)} | {int(fviol)} | "
              f"{iv_first:.2f} / {iv_last:.2f} | {env_sps:.0f} | {im:.0f} | {cpu:.0f} |")
    print("\nPaired differences over seeds (mean [95% CI]):\n")
    for m in by:
        if m != "prior":
            print(f"- {m} - prior, final return: {ci(final[m], final['prior'])}")
    for m in by:  # the paper's claim: interventions decay as the shield's Q_c is corrected by real data
        if m.startswith("SOOPER") or m.startswith("advantage"):
            first5 = np.array([np.nanmean(r["intervention_rate"][:5]) for r in by[m]])
            last5 = np.array([np.nanmean(r["intervention_rate"][-5:]) for r in by[m]])
            print(f"- {m}, intervention rate last 5 - first 5 episodes: {ci(last5, first5)} "
                  f"(per seed {', '.join(f'{a:.2f}->{b:.2f}' for a, b in zip(first5, last5, strict=True))})")
    if "SOOPER with max cost update" in by:
        mx = "SOOPER with max cost update"
        print(f"- SOOPER - SOOPER with the max update, final return: {ci(final['SOOPER'], final[mx])}; over-budget "
              f"episodes while learning: {ci(viol['SOOPER'], viol[mx])}")
    print(f"- prior - SOOPER, over-budget episodes while learning: {ci(viol['prior'], viol['SOOPER'])}")
    for m in by:
        if m not in ("SOOPER", "prior"):
            print(f"- {m} - SOOPER, over-budget episodes while learning: {ci(viol[m], viol['SOOPER'])}; "
                  f"final return: {ci(final[m], final['SOOPER'])}")
    batched, looped = ensemble_speed()
    print(f"\nEnsemble rollout forward (5 members x 256 rollouts, 1 thread): batched {batched:,.0f} transitions/s vs "
          f"member loop {looped:,.0f} ({batched / looped:.2f}x). Wall time: {total / 60:.1f} min with {args.jobs} processes.")
    figures(by, "sooper_curves.png" if first.get("task", "point_goal") == "point_goal" else f"sooper_{first['task']}.png")


def figures(by: dict, name: str) -> None:
    from lit_iclr.core.figures import plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for m, rs in by.items():
        n = min(len(r["return"]) for r in rs)  # episodes logged by every seed
        x = np.mean([r["real_steps"][:n] for r in rs], 0)
        axes[0].plot(x, np.mean([r["return"][:n] for r in rs], 0), label=m)
        axes[1].plot(x, np.mean([np.cumsum(r["violation"][:n]) for r in rs], 0), label=m)
        axes[2].plot(x, np.mean([r["intervention_rate"][:n] for r in rs], 0), label=m)
    for ax, t in zip(axes, ("episode return (real, while learning)", "cumulative over-budget episodes",
                            "intervention rate"), strict=True):
        ax.set_title(t)
        ax.set_xlabel("real env steps")
    axes[0].legend(fontsize=7)
    out = ROOT / "seeds" / "figures" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(f"\nFigure: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
