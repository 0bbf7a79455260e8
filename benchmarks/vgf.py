"""VGF benchmark: the paper's claims at CPU scale, on the default OGBench task and on the D4RL-format Reacher task.

For every task and seed one VGF model is trained (configs/vgf*.yaml, shorter), then evaluated in the environment with
several acting rules on the *same* networks, all episodes in lock-step:
  bc        one sample of the reference flow policy (behaviour cloning)
  L0        best-of-N reference samples under Q
  L1..L10   VGF with transport budget L (test-time scaling)
  ascent<K> K steps of unconstrained Adam ascent on Q from the reference samples (no kernel, no repulsion)
and a TD3+BC model (the penalty-regularised baseline) is trained on the same data for the same number of steps.
Speed: gradient steps/s of the VGF update relative to the BC-only (flow-matching) update, and the cost of one particle
transport step vs the number of particles N, measured in this run.

    .venv/bin/python benchmarks/vgf.py                  # both tasks, 3 seeds
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
from lit_iclr.vgf import TD3BC, VGF, D4RLData, OGBenchData

ROOT = Path(__file__).resolve().parents[1]
warnings.filterwarnings("ignore")
os.environ.setdefault("LIT_ICLR_LINE_PROGRESS", "1")

TASKS = {  # name: (config, DataModule, data overrides)
    "cube": ("configs/vgf.yaml", OGBenchData, {}),
    "reacher": ("configs/vgf_reacher.yaml", D4RLData, {}),
    # narrow behaviour: only a sluggish controller + small noise, no random actions (D4RL "medium"-like coverage)
    "reacher_narrow": ("configs/vgf_reacher.yaml", D4RLData,
                       {"behaviour_p_expert": 1.0, "behaviour_noise": 0.1, "behaviour_gain": 0.3}),
}
BUDGETS = [0, 1, 2, 3, 5, 10]
ASCENT = [3, 10, 30]
POLICIES = ["bc"] + [f"L{b}" for b in BUDGETS] + [f"ascent{k}" for k in ASCENT]


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


def run_task(task: str, seeds: list[int], steps: int, eval_episodes: int) -> dict:
    dm, margs = load(task, eval_episodes)
    envs: list = []  # one environment pool for every model of the task (OGBench environments take seconds to build)
    out = {"score": {p: [] for p in POLICIES + ["td3bc"]}, "q": {p: [] for p in POLICIES + ["td3bc"]}, "sps": []}
    for seed in seeds:
        L.seed_everything(seed, verbose=False)
        vgf = VGF(obs_dim=dm.obs_dim, action_dim=dm.action_dim, **dict(margs, seed=seed))
        out["sps"].append(train(vgf, dm, steps))
        vgf.eval_policies, vgf._envs = POLICIES, envs
        res = vgf.rollout(range(eval_episodes), datamodule=dm)
        score = dm.score(res.returns, res.successes)
        for g, p in enumerate(POLICIES):
            out["score"][p].append(float(score[res.groups == g].mean()))
            out["q"][p].append(res.q_means[g])
        L.seed_everything(seed, verbose=False)
        td3 = TD3BC(obs_dim=dm.obs_dim, action_dim=dm.action_dim, actor_hidden=margs["actor_hidden"],
                    critic_hidden=margs["critic_hidden"], discount=margs["discount"], seed=seed)
        train(td3, dm, steps)
        td3._envs = envs
        res = td3.rollout(range(eval_episodes), datamodule=dm)
        out["score"]["td3bc"].append(float(dm.score(res.returns, res.successes).mean()))
        out["q"]["td3bc"].append(res.q_means[0])
        print(f"[{task} seed {seed}] " + " ".join(f"{p}={out['score'][p][-1]:.1f}" for p in out["score"]), flush=True)
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
        obs_rep = obs.unsqueeze(1).expand(-1, n, -1)
        x0 = torch.rand(obs.shape[0], n, dm.action_dim) * 2 - 1
        out["transport_ms"][n] = 1000.0 / rate(lambda o=obs_rep, x=x0: model.move(o, x, 1), repeats)
    return out


def fmt(v):
    return f"{np.mean(v):.1f} ± {np.std(v):.1f}"


def report(results: dict, sp: dict, out_dir: Path) -> None:
    cols = ["bc", "L0", "td3bc", "ascent30", "L1", "L3", "L10"]
    names = {"bc": "BC (reference)", "L0": "best-of-N", "td3bc": "TD3+BC", "ascent30": "ascent (K=30)",
             "L1": "VGF L=1", "L3": "VGF L=3", "L10": "VGF L=10"}
    print("\n| task (metric) | " + " | ".join(names[c] for c in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for task, r in results.items():
        print(f"| {task} ({r['metric']}) | " + " | ".join(fmt(r["score"][c]) for c in cols) + " |")
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
            cells = [f"{np.mean(r['q'][p]):.2f} / {np.mean(r['score'][p]):.1f}" for p in pol]
            print(f"| {task} | " + " | ".join(cells) + " |")
    sp["transport_ms"] = {int(k): v for k, v in sp["transport_ms"].items()}
    print(f"\nSpeed: VGF update {sp['vgf_sps']:.1f} steps/s vs BC-only {sp['bc_sps']:.1f} steps/s "
          f"(ratio {sp['vgf_sps'] / sp['bc_sps']:.3f}); one transport step (B={sp['batch']}):")
    print("\n| N | " + " | ".join(str(n) for n in sp["transport_ms"]) + " |")
    print("|---" * (len(sp["transport_ms"]) + 1) + "|")
    print("| ms | " + " | ".join(f"{v:.1f}" for v in sp["transport_ms"].values()) + " |")

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.2), squeeze=False)
    for ax, (task, r) in zip(axes[0], results.items(), strict=True):
        m = np.array([np.mean(r["score"][f"L{b}"]) for b in BUDGETS])
        s = np.array([np.std(r["score"][f"L{b}"]) for b in BUDGETS])
        ax.plot(BUDGETS, m, marker="o", label="VGF")
        ax.fill_between(BUDGETS, m - s, m + s, alpha=0.2)
        ax.axhline(np.mean(r["score"]["bc"]), color="gray", ls="--", label="BC")
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
        ax.plot(ks, [np.mean(r["score"][p]) for p in pol], marker="o", color="C0", label="true score")
        ax.set_xlabel("ascent steps K")
        ax.set_ylabel(r["metric"], color="C0")
        ax2 = ax.twinx()
        ax2.plot(ks, [np.mean(r["q"][p]) for p in pol], marker="s", color="C3", label="Q estimate")
        ax2.set_ylabel("Q of chosen action", color="C3")
        ax.set_title(f"{task}: unconstrained ascent")
    fig.tight_layout()
    fig.savefig(out_dir / "vgf_overoptimisation.png", dpi=90)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="reacher,cube")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2000, help="gradient steps per model")
    p.add_argument("--episodes", type=int, default=10, help="evaluation episodes per acting rule")
    p.add_argument("--cube-episodes", type=int, default=5, help="evaluation episodes per acting rule on cube")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 50 steps, 2 episodes")
    p.add_argument("--figures", default=str(ROOT / "seeds" / "figures"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "vgf"))
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
        results = {t: json.loads((out_dir / f"{t}.json").read_text()) for t in args.report.split(",")}
        sp = json.loads((out_dir / "speed.json").read_text())
    else:
        for task in args.tasks.split(","):
            episodes = args.cube_episodes if task == "cube" else args.episodes
            results[task] = run_task(task, list(range(args.seeds)), args.steps, 2 if args.quick else episodes)
            (out_dir / f"{task}.json").write_text(json.dumps(results[task]))
        dm, margs = load(args.tasks.split(",")[0], 1)
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
