"""SOOPER learning-cycle speed: one model-learning + policy-update cycle of the project (`SOOPER.learn`, the part of
`training_step` after the real episode) against the authors' JAX code (yardenas/safe-sim2real, the jitted
`training_step` of `ss2r/algorithms/mbpo/training_step.py` as `ss2r/algorithms/mbpo/train.py` builds it, with
`offline=True`, i.e. without acting in a real environment), on the same transitions, measured in one run.

Data: point-goal transitions from the project's generator (`lit_iclr/sooper/generate.py`), with the discounted cost
accumulated so far C_t (the shield's input, the authors' `cumulative_cost` observation); both sides get the same arrays:
the official side in its model replay buffer (`UniformSamplingQueue`, stored float16 as its train() stores them), the
project as its real replay.

Same work per cycle (`SETTINGS`): an ensemble of E = 5 dynamics members, M model gradient steps on batches of B; R
imagined rollouts of H steps from replay states, every member on every rollout per step, the SOOPER filter
(C_t + Q_c(s, a) against the budget, the authors' Phi) and the prior's value Q_r(s, pi_hat(s)) where it intervenes;
K SAC steps (reward critic with target, actor, temperature) on batches of B from the imagined data; K updates of the
prior's cost critic with the authors' pessimistic target min(c + gamma_c Qbar_c(s', pi_hat(s')), Qbar_c(s, a)) and
a Polyak step. Same widths: actor, critics (2 heads) and members are MLPs with SiLU (swish) of the setting's widths.
What differs, by design of each code:
- networks: the official side runs with `use_bro=False` (a plain MLP critic, its option; its default BRO critic has
  two residual blocks of two layers each, 2.5x the hidden layers, which the project's critic does not have); the
  project's critics have LayerNorm after each hidden layer, its dynamics members output a mean and a log-variance
  (Gaussian NLL, 2x the last layer's width; official: a deterministic L2 model), and each member gets its own bootstrap
  batch of B (official: one batch of B for all members);
- optimisers: project Adam; official AdamW after clipping the global gradient norm at 1 (its train());
- cost critic: the project updates it on batches of real transitions; the official code on the relabelled imagined
  batch of its critic step (the same arithmetic per update);
- rollouts: the official side evaluates every rollout every step (terminated ones are reset to a new start, as its
  model env does) and its SAC batches are relabelled afterwards (one more ensemble, Q_c, Q_r and pi_hat forward over
  the K x B sampled transitions); the project stops terminated rollouts and computes Q_r(s, pi_hat(s)) only where the
  filter intervenes; its imagined buffer keeps the last `model_buffer` transitions across cycles (the official SAC
  buffer state is not carried from one training step to the next, so it samples the current cycle's rollouts);
- observation normalisation: official running statistics on the inputs of every network (`normalize_observations`);
  the project standardises the dynamics model's inputs only.
The project's side is `SOOPER.learn` called without Lightning's Trainer (the fit calls it once per real episode;
`manual_backward` is `loss.backward` there as here, `core/direct.py`).

Each side runs in its own single-threaded process pinned to one core (`--core`, default 1; `core.timing.PinnedWorker`);
a block is `--cycles` cycles (one count per setting); blocks are interleaved in an order that rotates every round,
with an A/A control (a second project process). The first cycle (XLA's jit compile of the whole training step;
torch's lazy init, or with `--compile on` the project's `torch.compile` of every update and imagined step) is reported
apart. `--compile on` adds the eager project cycle as a fourth process and compiles the project side and its A/A control
(`compile_update`), into an inductor cache made fresh for each run: the first cycle of `project` is a cold compile,
that of its A/A control a cache load. `--runs` repeats everything in fresh processes, for the spread across runs
beside each run's paired 95% CI.

The official code is never fetched or installed by this script (and never used by the tests). To get it (tested at
yardenas/safe-sim2real 7e154a7):

    git clone https://github.com/yardenas/safe-sim2real /tmp/sooper_official
    python3.11 -m venv /tmp/jaxenv_s && /tmp/jaxenv_s/bin/pip install "jax[cpu]==0.4.34" "brax==0.12.3" \
        "flax<0.10.3" optax ml_collections absl-py wandb

(the authors pin jax 0.4.34 and a brax fork; PyPI's brax 0.12.3 is the first with the `brax.training.agents.sac.checkpoint`
their imports need, and `ss2r/common/wandb.py` imports wandb at import time; nothing else of theirs is needed offline.)

    .venv/bin/python benchmarks/sooper_speed.py --vs-official /tmp/sooper_official --official-python /tmp/jaxenv_s/bin/python
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# name: model hidden, actor hidden, critic hidden, batch B, model steps M, SAC steps K, rollouts R, horizon H
SETTINGS = {
    "default": dict(model=[64, 64], actor=[64, 64], critic=[64, 64], batch=128, model_steps=25, sac_steps=25,
                    rollouts=256, horizon=10),  # configs/sooper.yaml (its prior-cost updates raised from 10 to K)
    "paper": dict(model=[256, 256, 256], actor=[256, 256, 256], critic=[512, 512], batch=256, model_steps=10,
                  sac_steps=10, rollouts=400, horizon=10),  # the authors' cartpole widths; fewer steps per cycle
    # the default's steps, batch and rollouts with 8-unit layers: almost no arithmetic, each side's fixed cost per cycle
    "tiny": dict(model=[8, 8], actor=[8, 8], critic=[8, 8], batch=128, model_steps=25, sac_steps=25, rollouts=256,
                 horizon=10),
}
ENSEMBLE, HEADS, GAMMA, BUDGET, OPTIMISM, PESSIMISM, TAU = 5, 2, 0.99, 5.0, 0.1, 1.0, 0.005


def write_transitions(path: Path, episodes: int) -> Path:
    """Point-goal transitions (the project's generator) with C_t and gamma_c^t per row, as one npz for both sides."""
    import h5py

    from lit_iclr.sooper.generate import generate_safe_d4rl

    h5 = generate_safe_d4rl(path.with_suffix(".hdf5"), "point_goal", episodes, seed=0)
    with h5py.File(h5, "r") as f:
        d = {k: f[k][()] for k in ("observations", "actions", "rewards", "costs", "next_observations", "terminals",
                                   "timeouts")}
    cum, disc = np.zeros(len(d["rewards"]), np.float32), np.ones(len(d["rewards"]), np.float32)
    c, g = 0.0, 1.0
    for i in range(len(cum)):
        cum[i], disc[i] = c, g
        c, g = c + g * d["costs"][i], g * GAMMA
        if d["terminals"][i] or d["timeouts"][i]:
            c, g = 0.0, 1.0
    masks = 1.0 - d.pop("terminals").astype(np.float32)
    d.pop("timeouts")
    np.savez(path, **{k: v.astype(np.float32) for k, v in d.items()}, masks=masks, cum_cost=cum, disc=disc)
    return path


def protocol_stream():
    """The original stdout for the driver's JSON lines; everything printed from here on goes to stderr."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return proto


def serve(run, proto) -> None:
    """JSON lines: {"cycles": n} -> {"wall": s, "cpu": s, ...} on `proto` (`protocol_stream()`, taken before the
    imports: anything they print goes to stderr)."""
    for line in sys.stdin:
        out = run(json.loads(line)["cycles"])
        proto.write(json.dumps(out) + "\n")
        proto.flush()


# ------------------------------------------------------------------------------------------------------------ workers
def official_worker(setting: str, data: str, repo: str) -> None:
    """Serves blocks of the authors' jitted `training_step` (offline: no environment steps), built by their `train()`
    (stopped right after it has built the step: a stand-in for `make_training_step` keeps what train() passed it)."""
    proto = protocol_stream()
    sys.path.insert(0, repo)
    import functools

    import jax
    import jax.numpy as jnp
    import ss2r.algorithms.mbpo.networks as mbpo_networks
    import ss2r.algorithms.mbpo.train as mbpo_train
    from brax import envs
    from brax.training.acme import running_statistics
    from brax.training.types import Transition
    from ss2r.algorithms.sac.q_transforms import PessimisticCostUpdate, SACBase
    from ss2r.algorithms.sac.types import float16

    cfg = SETTINGS[setting]
    f = dict(np.load(data))
    n, obs_dim, act_dim = len(f["rewards"]), f["observations"].shape[1], f["actions"].shape[1]

    class Spec:  # what train() reads of the environment before it builds the step
        observation_size = {"state": (obs_dim,), "cumulative_cost": (1,)}
        action_size = act_dim

    kept = {}

    class Built(Exception):
        pass

    real_make, real_init = mbpo_train.make_training_step, mbpo_train._init_training_state

    def make_training_step(*args, **kwargs):
        kept["step"], kept["model_buffer"], kept["sac_buffer"] = real_make(*args, **kwargs), args[5], args[6]
        raise Built

    def init_training_state(*args, **kwargs):
        kept["state"] = real_init(*args, **kwargs)
        return kept["state"]

    mbpo_train.make_training_step, mbpo_train._init_training_state = make_training_step, init_training_state
    factory = functools.partial(mbpo_networks.make_mbpo_networks, policy_hidden_layer_sizes=cfg["actor"],
                                value_hidden_layer_sizes=cfg["critic"], model_hidden_layer_sizes=cfg["model"],
                                activation=jax.nn.swish)
    try:
        mbpo_train.train(Spec(), num_timesteps=10**9, episode_length=100, learning_rate=3e-4,
                         critic_learning_rate=3e-4, model_learning_rate=1e-3, alpha_learning_rate=3e-4,
                         init_alpha=0.02, discounting=GAMMA, safety_discounting=GAMMA, batch_size=cfg["batch"],
                         sac_batch_size=cfg["batch"], normalize_observations=True, tau=TAU, min_replay_size=0,
                         max_replay_size=max(n, 50_000), model_grad_updates_per_step=cfg["model_steps"],
                         critic_grad_updates_per_step=cfg["sac_steps"], num_critic_updates_per_actor_update=1,
                         model_to_real_data_ratio=1.0, unroll_length=cfg["horizon"],
                         num_model_rollouts=cfg["rollouts"], network_factory=factory, n_critics=HEADS,
                         model_ensemble_size=ENSEMBLE, safe=True, safety_budget=BUDGET,
                         reward_q_transform=SACBase(use_bro=False), cost_q_transform=PessimisticCostUpdate(),
                         use_bro=False, normalize_budget=False, optimism=OPTIMISM, pessimism=PESSIMISM,
                         model_propagation="random", use_termination=True, safety_filter="sooper", offline=True)
    except Built:
        pass
    obs = lambda s, c: {"state": jnp.asarray(s), "cumulative_cost": jnp.asarray(c)[:, None]}
    zeros = jnp.zeros(n)
    transitions = Transition(
        observation=obs(f["observations"], f["cum_cost"]), action=jnp.asarray(f["actions"]),
        reward=jnp.asarray(f["rewards"]), discount=jnp.asarray(f["masks"]),
        next_observation=obs(f["next_observations"], f["cum_cost"] + f["disc"] * f["costs"]),
        extras={"state_extras": {"truncation": zeros, "cost": jnp.asarray(f["costs"])},
                "policy_extras": {k: zeros for k in ("intervention", "policy_distance", "safety_gap", "cumulative_cost",
                                                     "expected_total_cost", "q_c")}})
    model_buffer, sac_buffer = kept["model_buffer"], kept["sac_buffer"]
    key = jax.random.PRNGKey(0)
    model_state = model_buffer.insert(model_buffer.init(jax.random.PRNGKey(1)), float16(transitions))
    sac_state = sac_buffer.init(jax.random.PRNGKey(2))
    ts = kept["state"]
    ts = ts.replace(normalizer_params=running_statistics.update(ts.normalizer_params, transitions.observation))
    env_state = envs.State(pipeline_state=None, obs=transitions.observation, reward=zeros[:1], done=zeros[:1])
    step = jax.jit(kept["step"])
    state = {"ts": ts, "model": model_state, "key": key}

    def run(cycles: int) -> dict:
        t, c = time.perf_counter(), time.process_time()
        for _ in range(cycles):
            state["key"], k = jax.random.split(state["key"])
            # the authors' train loop passes the same SAC buffer state to every step (training_step returns none)
            state["ts"], _, state["model"], metrics = step(state["ts"], env_state, state["model"], sac_state, k)
        jax.block_until_ready(state["ts"])
        return {"wall": time.perf_counter() - t, "cpu": time.process_time() - c,
                "termination": float(metrics["fraction_done"].mean())}

    serve(run, proto)


def project_model(setting: str, obs_dim: int, action_dim: int, compile_update: bool = False):
    import yaml

    from lit_iclr.sooper.module import SOOPER

    cfg = SETTINGS[setting]
    with open(ROOT / "configs" / "sooper.yaml") as fh:
        args = yaml.safe_load(fh)["model"]["init_args"]
    args.update(obs_dim=obs_dim, action_dim=action_dim, model_hidden=cfg["model"], actor_hidden=cfg["actor"],
                critic_hidden=cfg["critic"], critic_heads=HEADS, ensemble_size=ENSEMBLE, model_updates=cfg["model_steps"],
                sac_updates=cfg["sac_steps"], prior_cost_updates=cfg["sac_steps"], num_rollouts=cfg["rollouts"],
                horizon=cfg["horizon"], budget=BUDGET, optimism=OPTIMISM, pessimism=PESSIMISM, tau=TAU,
                discount=GAMMA, cost_discount=GAMMA, offline_in_model=False, num_threads=None,
                compile_update=compile_update)
    model = SOOPER(**args)
    model.batch_size = cfg["batch"]
    model.__dict__["_direct_manual"] = True  # manual_backward = loss.backward, as in the platform's fit
    return model


def project_worker(setting: str, data: str, compiled: bool = False) -> None:
    """Serves blocks of `SOOPER.learn` on the shared transitions as its real replay (no Trainer); `compiled`: with
    `compile_update` (its first cycle compiles)."""
    proto = protocol_stream()
    import torch

    from lit_iclr.core.cuda_check import drop_failing_nvml_check
    from lit_iclr.core.host_memory import keep_freed_host_memory

    torch.set_num_threads(1)
    keep_freed_host_memory()  # as the platform's Trainer does, and
    drop_failing_nvml_check()  # (every optimizer step asks torch.cuda.is_available(); core/cuda_check.py)
    torch.manual_seed(0)
    f = np.load(data)
    model = project_model(setting, f["observations"].shape[1], f["actions"].shape[1], compiled)
    model.replay = {k: torch.from_numpy(f[k]) for k in ("observations", "actions", "rewards", "costs",
                                                         "next_observations", "cum_cost", "disc")}
    opts = model.configure_optimizers()

    def run(cycles: int) -> dict:
        t, c = time.perf_counter(), time.process_time()
        for _ in range(cycles):
            logs = model.learn(opts)
        return {"wall": time.perf_counter() - t, "cpu": time.process_time() - c,
                "termination": logs["train/imagined_termination_rate"]}

    serve(run, proto)


def Worker(python: str, *args: str, core: int | None, **extra_env: str):
    """One side in its own single-threaded process (`core.timing.PinnedWorker`); asked `{"cycles": n}`."""
    from lit_iclr.core.timing import PinnedWorker  # the driver's import: the official side's Python has no lit_iclr

    env = dict(os.environ, **extra_env, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1", PYTHONPATH=str(ROOT))
    return PinnedWorker([python, __file__, "--worker", *args], env, ROOT, core)


# ----------------------------------------------------------------------------------------------------------- driver
def measure(sides: dict, cycles: int, repeats: int) -> dict[str, dict]:
    out = {name: {"first_s": w.ask({"cycles": 1})["wall"]} for name, w in sides.items()}  # jit / lazy init
    for name, w in sides.items():
        w.ask({"cycles": 1})  # settle
        out[name]["cpu"], out[name]["wall"], out[name]["termination"] = [], [], []
    names = list(sides)
    for r in range(repeats):  # interleaved blocks, the order rotating each round
        for name in names[r % len(names):] + names[:r % len(names)]:
            res = sides[name].ask({"cycles": cycles})
            out[name]["cpu"].append(res["cpu"] / cycles)
            out[name]["wall"].append(res["wall"] / cycles)
            out[name]["termination"].append(res["termination"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vs-official", default="", help="a checkout of github.com/yardenas/safe-sim2real")
    p.add_argument("--official-python", default=sys.executable, help="python of an environment with jax, brax, flax")
    p.add_argument("--settings", default="default,paper")
    p.add_argument("--cycles", default="4,1", help="learning cycles per timed block, per setting")
    p.add_argument("--repeats", type=int, default=6, help="interleaved blocks per side")
    p.add_argument("--runs", type=int, default=1, help="separate runs (fresh processes), for the spread across runs")
    p.add_argument("--episodes", type=int, default=20, help="point-goal episodes of 100 steps in the shared replay")
    p.add_argument("--core", type=int, default=1, help="pin every side to this CPU core (-1: no pinning)")
    p.add_argument("--compile", choices=("off", "on"), default="off",
                   help="on: the project side and its A/A control with `compile_update`, and the eager project side as "
                        "a fourth process (each run compiles into a fresh inductor cache: the first compiled process's "
                        "first cycle is a cold compile, the A/A's reads that cache)")
    p.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        kind, setting, data, *rest = args.worker
        official_worker(setting, data, rest[0]) if kind == "official" else project_worker(setting, data,
                                                                                           rest == ["compiled"])
        return
    from lit_iclr.core.stats import ratio_ci

    core = None if args.core < 0 else args.core
    data = str(write_transitions(Path(tempfile.mkdtemp(prefix="sooper_speed_")) / "transitions.npz", args.episodes))
    ref = "official" if args.vs_official else "project"
    rows, spread, aa = [], {}, []
    for setting, cycles in zip(args.settings.split(","), [int(c) for c in args.cycles.split(",")], strict=False):
        for run in range(args.runs):
            sides = {}
            if args.vs_official:
                sides["official"] = Worker(args.official_python, "official", setting, data, args.vs_official, core=core)
            if args.compile == "on":
                cache = {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="sooper_inductor_")}
                sides["project (eager)"] = Worker(sys.executable, "project", setting, data, core=core)
                sides["project"] = Worker(sys.executable, "project", setting, data, "compiled", core=core, **cache)
                sides["project (A/A)"] = Worker(sys.executable, "project", setting, data, "compiled", core=core,
                                                **cache)
            else:
                sides["project"] = Worker(sys.executable, "project", setting, data, core=core)
                sides["project (A/A)"] = Worker(sys.executable, "project", setting, data, core=core)
            res = measure(sides, cycles, args.repeats)
            for w in sides.values():
                w.close()
            print(f"[{setting} run {run}] " + json.dumps(res), flush=True)
            ref_med = statistics.median(res[ref]["cpu"])
            for name, r in res.items():
                med = statistics.median(r["cpu"])
                ci = ratio_ci(r["cpu"], res[ref]["cpu"]) if name != ref else "-"
                spread.setdefault((setting, name), []).append(med / ref_med)
                rows.append(f"| {setting} | {run} | {name} | {1000 * med:.1f} | {med / ref_med:.3f} | {ci} | "
                            f"{1000 * statistics.median(r['wall']):.1f} | {r['first_s']:.1f} | "
                            f"{statistics.mean(r['termination']):.2f} |")
            aa.append(f"A/A control, {setting} run {run}: project (A/A) / project per-block ratio "
                      f"{ratio_ci(res['project (A/A)']['cpu'], res['project']['cpu'])}")
    pinned = f"pinned to core {core}" if core is not None else "not pinned"
    if args.compile == "on":
        print("\nproject and project (A/A): compile_update; first cycle = compile (the A/A's from the first's cache)")
    print(f"\n{args.runs} run(s) x {args.repeats} interleaved blocks ({args.cycles} cycles) per side, one thread each "
          f"({pinned}; load {os.getloadavg()[0]:.1f}); CPU ms per cycle\n")
    print(f"| setting | run | side | CPU ms / cycle (median) | ratio vs {ref} | per-block ratio, mean [paired 95% CI] | "
          "wall ms / cycle | first cycle (s wall, incl. jit / compile) | imagined termination rate |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n" + "\n".join(aa))
    if args.runs > 1:
        print("\nspread across runs (ratio of medians): " + "; ".join(
            f"{s} {n}: {min(v):.3f}-{max(v):.3f} (mean {statistics.mean(v):.3f})"
            for (s, n), v in spread.items() if n != ref))


if __name__ == "__main__":
    main()
