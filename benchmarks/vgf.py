"""VGF benchmark: the paper's claims at CPU scale, on the default OGBench task and on the D4RL-format Reacher task.

For every task and seed one VGF model is trained (configs/vgf*.yaml, shorter), then evaluated in the environment with
several acting rules on the *same* networks, all episodes in lock-step:
  bc        one sample of the reference flow policy (behaviour cloning)
  L0        best-of-N reference samples under Q
  L1..L10   VGF with transport budget L (test-time scaling)
  ascent<K> K steps of unconstrained Adam ascent on Q from the reference samples (no kernel, no repulsion)
and three baselines are trained on the same data for the same number of gradient steps, with the same critic and
batch: TD3+BC (penalty-regularised, states normalised), FQL (VGF's own base: the same flow reference policy, distilled
into a one-step policy that maximises Q) and IQL (in-sample, advantage-weighted). Paired 95% CIs over seeds compare
VGF at the pre-registered budget L=3 (the default config's largest) with each of them.
Speed: gradient steps/s of the VGF update relative to the BC-only (flow-matching) update, and the cost of one particle
transport step vs the number of particles N, measured in this run.

    .venv/bin/python benchmarks/vgf.py --tasks reacher --seeds 3 --steps 1000   # the card's headline table
    .venv/bin/python benchmarks/vgf.py --quick          # smoke run
Speed against the official JAX code (and `torch.compile`): benchmarks/vgf_speed.py.
Figures go to benchmarks/out/vgf/ and seeds/figures/vgf_*.png.
"""
from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import torch
import yaml

from lit_iclr.core.figures import plt
from lit_iclr.core.stats import paired_ci
from lit_iclr.vgf import FQL, IQL, TD3BC, VGF, D4RLData, OGBenchData

ROOT = Path(__file__).resolve().parents[1]
warnings.filterwarnings("ignore")
os.environ.setdefault("LIT_ICLR_LINE_PROGRESS", "1")

TASKS = {  # name: (config, DataModule, data overrides)
    "cube": ("configs/vgf_cube.yaml", OGBenchData, {}),
    "reacher": ("configs/vgf.yaml", D4RLData, {}),
    # narrow behaviour: only a sluggish controller + small noise, no random actions (D4RL "medium"-like coverage)
    "reacher_narrow": ("configs/vgf.yaml", D4RLData,
                       {"behaviour_p_expert": 1.0, "behaviour_noise": 0.1, "behaviour_gain": 0.3}),
}
BUDGETS = [0, 1, 2, 3, 5, 10]
ASCENT = [3, 10, 30]
POLICIES = ["bc"] + [f"L{b}" for b in BUDGETS] + [f"ascent{k}" for k in ASCENT]
BASELINES = {"td3bc": TD3BC, "fql": FQL, "iql": IQL}  # trained separately, same data, critic, batch and steps
HEADLINE = "L3"  # VGF's pre-registered budget for the paired comparisons


def baseline(name: str, dm, margs: dict, seed: int):
    common = dict(obs_dim=dm.obs_dim, action_dim=dm.action_dim, actor_hidden=margs["actor_hidden"],
                  critic_hidden=margs["critic_hidden"], discount=margs["discount"], seed=seed)
    if name == "fql":
        common.update(bc_flow_steps=margs["bc_flow_steps"], value_q_agg=margs["value_q_agg"])
    return BASELINES[name](**common)


def load(task: str, eval_episodes: int):
    cfg = yaml.safe_load(open(ROOT / TASKS[task][0]))
    data_args = dict(cfg["data"]["init_args"], eval_episodes=eval_episodes, **TASKS[task][2])
    dm = TASKS[task][1](**data_args)
    dm.prepare_data()
    dm.setup("fit")
    model_args = {k: v for k, v in cfg["model"]["init_args"].items() if not k.endswith("optimizer")}
    return dm, model_args


def train(model, dm, steps: int) -> float:
    dm.steps_per_epoch = steps
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        limit_val_batches=0, num_sanity_val_steps=0, accelerator="cpu", enable_model_summary=False)
    t = time.perf_counter()
    trainer.fit(model, dm)
    return steps / (time.perf_counter() - t)


def run_task(task: str, seeds: list[int], steps: int, eval_episodes: int, save=None, done: dict | None = None) -> dict:
    """Train and evaluate VGF and every baseline per seed; `save(out)` after each model, so a stopped run keeps them.

    `done`: the saved results of a stopped run of the same seeds; the models it finished are kept, not rerun (every
    model is trained and evaluated from its own seed, so the others do not depend on them)."""
    dm, margs = load(task, eval_episodes)
    margs.pop("eval_extra", None)
    envs: list = []  # one environment pool for every model of the task (OGBench environments take seconds to build)
    names = POLICIES + list(BASELINES)
    out = done or {"score": {p: [] for p in names}, "q": {p: [] for p in names},
                   "sps": {m: [] for m in ["vgf", *BASELINES]}, "params": {}}
    for i, seed in enumerate(seeds):
        if len(out["score"]["bc"]) <= i:
            L.seed_everything(seed, verbose=False)
            vgf = VGF(obs_dim=dm.obs_dim, action_dim=dm.action_dim, **dict(margs, seed=seed))
            out["params"]["vgf"] = sum(p.numel() for p in vgf.parameters() if p.requires_grad)
            out["sps"]["vgf"].append(train(vgf, dm, steps))
            vgf.eval_policies, vgf._envs = POLICIES, envs
            res = vgf.rollout(range(eval_episodes), datamodule=dm)
            score = dm.score(res.returns, res.successes)
            for g, p in enumerate(POLICIES):
                out["score"][p].append(float(score[res.groups == g].mean()))
                out["q"][p].append(res.q_means[g])
            if save:
                save(out)
        for name in BASELINES:
            if len(out["score"][name]) > i:
                continue  # finished in an earlier run
            L.seed_everything(seed, verbose=False)
            model = baseline(name, dm, margs, seed)
            out["params"][name] = sum(p.numel() for p in model.parameters() if p.requires_grad)
            out["sps"][name].append(train(model, dm, steps))
            model._envs = envs
            res = model.rollout(range(eval_episodes), datamodule=dm)
            out["score"][name].append(float(dm.score(res.returns, res.successes).mean()))
            out["q"][name].append(res.q_means[0])
            if save:
                save(out)
        print(f"[{task} seed {seed}] " + " ".join(f"{p}={out['score'][p][i]:.1f}" for p in out["score"]), flush=True)
    for env in envs:
        env.close()
    out["metric"] = "success %" if task == "cube" else "normalised return"
    return out


def speed(dm, margs, particles=(2, 4, 8, 16, 32), repeats: int = 10) -> dict:
    """VGF update vs BC-only update (steps/s, same batch and networks), and one transport step vs N."""
    torch.manual_seed(0)
    batch = next(iter(dm.train_dataloader()))
    model = VGF(obs_dim=dm.obs_dim, action_dim=dm.action_dim, **margs)
    opt_a = torch.optim.Adam(model.policy.parameters(), lr=3e-4)
    opt_c = torch.optim.Adam(model.critic.parameters(), lr=3e-4)

    def bc_step():
        loss = model.policy.flow_matching_loss(batch["observations"], batch["actions"])
        opt_a.zero_grad()
        loss.backward()
        opt_a.step()

    def vgf_step():
        target = model.td_target(batch)
        loss = (model.critic(batch["observations"], batch["actions"]) - target).pow(2).sum(0).mean()
        opt_c.zero_grad()
        loss.backward()
        opt_c.step()
        bc_step()

    def rate(fn, n):
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return n / (time.perf_counter() - t)

    out = {"bc_sps": rate(bc_step, repeats * 5), "vgf_sps": rate(vgf_step, repeats)}
    obs = batch["next_observations"]
    out["transport_ms"] = {}
    for n in particles:
        obs_rep = obs.unsqueeze(1)  # [B, 1, D], broadcast against the particles
        x0 = torch.rand(obs.shape[0], n, dm.action_dim) * 2 - 1
        out["transport_ms"][n] = 1000.0 / rate(lambda o=obs_rep, x=x0: model.move(o, x, 1), repeats)
    return out


def fmt(v):
    """mean ± sample std over the seeds that finished (NaN = a seed whose run stopped before this model); (n=k) if fewer."""
    v = np.asarray(v, dtype=float)
    done = v[np.isfinite(v)]
    std = np.std(done, ddof=1) if len(done) > 1 else 0.0
    return f"{np.mean(done):.1f} ± {std:.1f}" + (f" (n={len(done)})" if len(done) < len(v) else "")


def paired(a, b):
    """Paired 95% CI of a - b over the seeds where both finished, as a table cell."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    both = np.isfinite(a) & np.isfinite(b)
    return str(paired_ci(a[both], b[both])) + (f" (n={both.sum()})" if both.sum() < len(a) else "")


def report(results: dict, sp: dict, out_dir: Path) -> None:
    cols = ["bc", "L0", "td3bc", "fql", "iql", "ascent30", "L1", "L3", "L10"]
    names = {"bc": "BC (reference)", "L0": "best-of-N", "td3bc": "TD3+BC", "fql": "FQL", "iql": "IQL",
             "ascent30": "ascent (K=30)", "L1": "VGF L=1", "L3": "VGF L=3", "L10": "VGF L=10"}
    print("\n| task (metric) | seeds | " + " | ".join(names[c] for c in cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for task, r in results.items():
        cells = [fmt(r["score"][c]) if r["score"].get(c) else "-" for c in cols]
        print(f"| {task} ({r['metric']}) | {len(r['score']['bc'])} | " + " | ".join(cells) + " |")
    print(f"\nPaired difference VGF {HEADLINE} minus each method (95% CI over seeds; same seeds, data, critic, steps):\n")
    others = [c for c in ["bc", "L0", "td3bc", "fql", "iql", "ascent30"]]
    print("| task | " + " | ".join(names[c] for c in others) + " |")
    print("|---" * (len(others) + 1) + "|")
    for task, r in results.items():
        cells = [paired(r["score"][HEADLINE], r["score"][c]) if r["score"].get(c) else "-" for c in others]
        print(f"| {task} | " + " | ".join(cells) + " |")
    if any("params" in r for r in results.values()):
        print("\nParameters (trainable) and training speed (gradient steps/s in this run, same batch):\n")
        print("| task | method | parameters | steps/s |")
        print("|---|---|---|---|")
        for task, r in results.items():
            for m, n in r.get("params", {}).items():
                print(f"| {task} | {m} | {n} | {np.nanmean(r['sps'][m]):.1f} |")
    print("\nTest-time scaling (score vs evaluation budget L, same trained models):\n")
    print("| task | " + " | ".join(f"L={b}" for b in BUDGETS) + " |")
    print("|---" * (len(BUDGETS) + 1) + "|")
    for task, r in results.items():
        print(f"| {task} | " + " | ".join(fmt(r["score"][f"L{b}"]) for b in BUDGETS) + " |")
    print("\nOver-optimisation (unconstrained ascent): Q estimate of the chosen action vs true score:\n")
    print("| task | " + " | ".join(f"K={k}: Q / score" for k in [0] + ASCENT) + " |")
    print("|---" * (len(ASCENT) + 2) + "|")
    for task, r in results.items():
        pol = ["L0"] + [f"ascent{k}" for k in ASCENT]
        if all(p in r["q"] for p in pol):  # runs whose Q estimates were not saved are left out
            cells = [f"{np.nanmean(r['q'][p]):.2f} / {np.nanmean(r['score'][p]):.1f}" for p in pol]
            print(f"| {task} | " + " | ".join(cells) + " |")
    if sp is not None:
        sp["transport_ms"] = {int(k): v for k, v in sp["transport_ms"].items()}
        print(f"\nSpeed: VGF update {sp['vgf_sps']:.1f} steps/s vs BC-only {sp['bc_sps']:.1f} steps/s "
              f"(ratio {sp['vgf_sps'] / sp['bc_sps']:.3f}); one transport step (B={sp['batch']}):")
        print("\n| N | " + " | ".join(str(n) for n in sp["transport_ms"]) + " |")
        print("|---" * (len(sp["transport_ms"]) + 1) + "|")
        print("| ms | " + " | ".join(f"{v:.1f}" for v in sp["transport_ms"].values()) + " |")

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.2), squeeze=False)
    for ax, (task, r) in zip(axes[0], results.items(), strict=True):
        m = np.array([np.nanmean(r["score"][f"L{b}"]) for b in BUDGETS])
        s = np.array([np.nanstd(r["score"][f"L{b}"]) for b in BUDGETS])
        ax.plot(BUDGETS, m, marker="o", label="VGF")
        ax.fill_between(BUDGETS, m - s, m + s, alpha=0.2)
        ax.axhline(np.nanmean(r["score"]["bc"]), color="gray", ls="--", label="BC")
        ax.set_xlabel("evaluation budget L")
        ax.set_ylabel(r["metric"])
        ax.set_title(task)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "vgf_test_time_scaling.png", dpi=90)

    with_q = {t: r for t, r in results.items() if all(f"ascent{k}" in r["q"] for k in ASCENT) and "L0" in r["q"]}
    fig, axes = plt.subplots(1, max(len(with_q), 1), figsize=(4.5 * max(len(with_q), 1), 3.2), squeeze=False)
    ks = [0] + ASCENT
    for ax, (task, r) in zip(axes[0], with_q.items(), strict=False):
        pol = ["L0"] + [f"ascent{k}" for k in ASCENT]
        ax.plot(ks, [np.nanmean(r["score"][p]) for p in pol], marker="o", color="C0", label="true score")
        ax.set_xlabel("ascent steps K")
        ax.set_ylabel(r["metric"], color="C0")
        ax2 = ax.twinx()
        ax2.plot(ks, [np.nanmean(r["q"][p]) for p in pol], marker="s", color="C3", label="Q estimate")
        ax2.set_ylabel("Q of chosen action", color="C3")
        ax.set_title(f"{task}: unconstrained ascent")
    fig.tight_layout()
    fig.savefig(out_dir / "vgf_overoptimisation.png", dpi=90)


def merge_runs(out_dir: Path, task: str) -> dict:
    """`<task>.json`, or the per-seed files `<task>_s*.json` of parallel runs concatenated in seed order."""
    if (out_dir / f"{task}.json").exists():
        return json.loads((out_dir / f"{task}.json").read_text())
    files = sorted(out_dir.glob(f"{task}_s*.json"))
    parts = [json.loads(f.read_text()) for f in files]
    out = dict(parts[0], metric="success %" if task == "cube" else "normalised return")
    for key in ("score", "q", "sps"):  # a run stopped mid-seed saved the models it finished: the rest become NaN
        out[key] = {k: [x for f, p in zip(files, parts, strict=True) for x in _pad(p[key][k], f)] for k in parts[0][key]}
    return out


def _pad(values: list, f: Path) -> list:
    n = len(f.stem.split("_s")[-1].split("-"))  # seeds in `<task>_s1-2.json`
    return list(values) + [float("nan")] * (n - len(values))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="reacher,cube")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed-list", default="", help="comma-separated seeds to run instead of 0..seeds-1; results go to "
                   "<task>_s<seeds>.json, merged by --report")
    p.add_argument("--steps", type=int, default=2000, help="gradient steps per model")
    p.add_argument("--episodes", type=int, default=10, help="evaluation episodes per acting rule")
    p.add_argument("--cube-episodes", type=int, default=5, help="evaluation episodes per acting rule on cube")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 50 steps, 2 episodes")
    p.add_argument("--figures", default=str(ROOT / "seeds" / "figures"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "vgf"))
    p.add_argument("--skip-speed", action="store_true", help="no speed measurement (tables and figures only)")
    p.add_argument("--resume", action="store_true", help="keep the models a stopped run of the same seeds saved")
    p.add_argument("--report", default="", help="only report: comma-separated tasks whose saved results to merge")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        args.seeds, args.steps, args.episodes = 1, 50, 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    t0 = time.perf_counter()
    if args.report:  # merge results saved by earlier runs (each task's JSON, the speed of the first)
        results = {t: merge_runs(out_dir, t) for t in args.report.split(",")}
        sp = None if args.skip_speed else json.loads((out_dir / "speed.json").read_text())
    else:
        for task in args.tasks.split(","):
            episodes = args.cube_episodes if task == "cube" else args.episodes
            seeds = [int(x) for x in args.seed_list.split(",")] if args.seed_list else list(range(args.seeds))
            name = f"{task}_s{'-'.join(map(str, seeds))}.json" if args.seed_list else f"{task}.json"
            done = json.loads((out_dir / name).read_text()) if args.resume and (out_dir / name).exists() else None
            results[task] = run_task(task, seeds, args.steps, 2 if args.quick else episodes, done=done,
                                     save=lambda out, f=out_dir / name: f.write_text(json.dumps(out)))
            (out_dir / name).write_text(json.dumps(results[task]))
        sp = None
        if not args.skip_speed:
            dm, margs = load(args.tasks.split(",")[0], 1)
            margs.pop("eval_extra", None)
            sp = speed(dm, margs, repeats=3 if args.quick else 10)
            sp["batch"] = dm.batch_size
            (out_dir / "speed.json").write_text(json.dumps(sp))
    print(f"\n{args} finished in {time.perf_counter() - t0:.0f} s")
    report(results, sp, out_dir)
    fig_dir = Path(args.figures)
    fig_dir.mkdir(parents=True, exist_ok=True)
    for name in ("vgf_test_time_scaling.png", "vgf_overoptimisation.png"):
        (fig_dir / name).write_bytes((out_dir / name).read_bytes())


if __name__ == "__main__":
    main()
