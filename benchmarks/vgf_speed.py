"""VGF update speed: the project's update (`cli.py fit`, and the same update without Lightning) against the official
JAX code (ryanxhr/vgf), at the project's default size and at the paper's cube-single size, measured in one run.

Each side runs in its own single-threaded worker process, pinned to one core (`--core`; -1 leaves the scheduler free),
so that XLA's own threads cannot spread the official step over two cores (the official one in a JAX environment, e.g. a venv with
`pip install "jax[cpu]" flax optax distrax ml_collections`), on the same transitions (the default OGBench cube-single
data, read by the project's reader and handed to both), the same batch size and the same algorithm step: reference-flow
sampling of B x N actions, L transport steps with a fresh Adam, target critic on the particles, TD step, Polyak,
flow-matching step. Timed blocks of the sides are interleaved, in an order that rotates every round (machine noise hits
all alike), and each side's ratio is also the mean of its per-block ratios against the official block of the same
round, with a paired 95% CI. The `cli.py fit` side is one continuous fit that serves the blocks from a callback. The
first calls, which compile (XLA's jit; `torch.compile` with `--compile`), are reported separately. The project's
products run through the library configs/vgf_cube.yaml picks (`matmul: auto`: MKL on Intel CPUs, oneDNN elsewhere;
`--matmul aten|onednn` forces one).

    .venv/bin/python benchmarks/vgf_speed.py                       # the project's ms/step only, both settings
    .venv/bin/python benchmarks/vgf_speed.py --vs-official ~/src/vgf --official-python /tmp/jaxenv/bin/python

The official code is never fetched or installed by this script (and never used by the tests).
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
SETTINGS = {  # name: (hidden widths, batch, particles N, Euler steps of the reference flow, transport steps L)
    "default": ((128, 128), 128, 8, 5, 1),
    "paper": ((512, 512, 512, 512), 256, 10, 10, 3),
    "tiny": ((8,), 4, 2, 5, 1),  # almost no arithmetic: each side's fixed cost per update (dispatch, wrappers, Python)
}
EPISODES = 5  # of the default cube-single data (configs/vgf_cube.yaml: 50); the step's cost does not depend on it
FLOW = {"flow_lr": 0.05, "alpha": 0.5, "discount": 0.99, "tau": 0.005}  # configs/vgf_cube.yaml (value_q_agg: mean)


# ------------------------------------------------------------------------------------------------------------ workers
def _single_thread_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    return env


class Sampler:
    """Uniform minibatches of the shared transitions, drawn with numpy on both sides."""

    def __init__(self, path: str, batch: int):
        self.data, self.batch = dict(np.load(path)), batch
        self.rng = np.random.default_rng(0)

    def __call__(self) -> dict:
        idx = self.rng.integers(0, len(self.data["rewards"]), self.batch)
        return {k: v[idx] for k, v in self.data.items()}


def official_worker(setting: str, data: str, repo: str) -> None:
    """Serves timed blocks of the official `VGFAgent.update` (one jitted XLA program per update)."""
    sys.path.insert(0, repo)
    import jax
    from agents.vgf import VGFAgent, get_config

    hidden, batch, particles, flow_steps, transport_steps = SETTINGS[setting]
    config = get_config()
    config.update(dict(value_hidden_dims=hidden, actor_hidden_dims=hidden, batch_size=batch, vgf_particles=particles,
                       bc_flow_steps=flow_steps, train_vgf_steps=transport_steps, vgf_lr=FLOW["flow_lr"],
                       vgf_alpha=FLOW["alpha"], discount=FLOW["discount"], tau=FLOW["tau"], train_q_agg="mean",
                       vgf_q_agg="mean"))
    sample = Sampler(data, batch)
    ex = sample()
    agent = VGFAgent.create(0, ex["observations"][:1], ex["actions"][:1], dict(config))
    state = {"agent": agent}

    def run(steps: int) -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        for _ in range(steps):
            state["agent"], info = state["agent"].update(sample())
        jax.block_until_ready(info)
        return time.perf_counter() - t, time.process_time() - c

    serve(run)


def project_worker(setting: str, data: str, side: str, compile_update: bool, compile_mode: str = "default",
                   updates_per_batch: int | None = None, matmul: str = "auto") -> None:
    """Serves timed blocks of the project's update: `plain` (no Lightning) or `fit` (the CLI's Trainer)."""
    import torch

    torch.set_num_threads(1)
    hidden, batch, particles, flow_steps, transport_steps = SETTINGS[setting]
    model_args = dict(actor_hidden=list(hidden), critic_hidden=list(hidden), num_particles=particles,
                      bc_flow_steps=flow_steps, train_flow_steps=transport_steps, value_q_agg="mean",
                      compile_update=compile_update, matmul=matmul, **FLOW)
    if compile_mode != "default":  # torch.compile's mode, e.g. max-autotune-no-cudagraphs (inductor's CPU GEMM templates)
        model_args["compile_options"] = {"mode": compile_mode}
    if side == "plain":
        serve(plain_runner(model_args, data, batch))
    else:
        fit_server(model_args, batch, setting, updates_per_batch)


def plain_runner(model_args: dict, data: str, batch: int):
    import torch

    from lit_iclr.core.host_memory import keep_freed_host_memory
    from lit_iclr.vgf.module import VGF

    keep_freed_host_memory()  # as the platform's Trainer does (the fit side gets it there)
    sample = Sampler(data, batch)
    ex = sample()
    model = VGF(obs_dim=ex["observations"].shape[1], action_dim=ex["actions"].shape[1], **model_args)
    compiled = model_args["compile_update"]
    compile_kw = model_args.get("compile_options", {})
    losses = torch.compile(model.update_losses, **compile_kw) if compiled else model.update_losses
    apply = model.apply_updates_compiled if compiled else model.apply_updates  # as VGF.update
    # as configs/vgf_cube.yaml (fused), or as VGF with compile_update (foreach, traced into one compiled graph)
    kind = {"foreach": True} if compiled else {"fused": True}
    opt_actor = torch.optim.Adam(model.policy.parameters(), lr=3e-4, **kind)
    opt_critic = torch.optim.Adam(model.critic.parameters(), lr=3e-4, **kind)
    gen = torch.Generator()

    def run(steps: int) -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        for k in range(steps):
            b = {key: torch.from_numpy(v) for key, v in sample().items()}
            out = losses(b, model.step_noise(batch, gen.manual_seed(k)))
            opt_critic.zero_grad()
            opt_actor.zero_grad()
            (out["critic_loss"] + out["bc_loss"]).backward()
            apply(opt_critic, opt_actor)  # critic step, Polyak, actor step
        return time.perf_counter() - t, time.process_time() - c

    return run


def fit_server(model_args: dict, batch: int, setting: str, updates_per_batch: int | None = None) -> None:
    """One `cli.py fit` of configs/vgf_cube.yaml (validation off) that serves the timed blocks from inside the run: after
    each block's last step a callback answers the driver and waits for the next request, so every block is the same
    steady-state Trainer (one compile, one fit), and the wait is not timed. Stdin closing ends the fit. Every Trainer
    batch takes the data's `updates_per_batch` gradient steps (the config's unless given; a block's steps are rounded
    up to whole batches and reported)."""
    from lit_iclr.cli import LitIclrCLI
    from lit_iclr.core.timing import fit_block_server

    proto = protocol_stream()

    overrides = []
    for k, v in model_args.items():
        overrides += [f"--model.init_args.{k}", v if isinstance(v, str) else json.dumps(v)]
    args = ["--config", str(ROOT / "configs" / "vgf_cube.yaml"), *overrides, "--data.init_args.batch_size", str(batch),
            "--data.init_args.data_dir", str(ROOT / "data"), "--data.init_args.num_episodes", str(EPISODES),
            "--data.init_args.steps_per_epoch", "1000000", "--trainer.max_epochs", "1",
            "--trainer.limit_val_batches", "0", "--trainer.default_root_dir",
            tempfile.mkdtemp(prefix=f"vgf_speed_{setting}_")]
    if updates_per_batch is not None:
        args += ["--data.init_args.updates_per_batch", str(updates_per_batch)]
    cli = LitIclrCLI(args=args, run=False)
    cli.trainer.callbacks.append(fit_block_server(proto, per_batch=cli.datamodule.updates_per_batch))
    cli.trainer.fit(cli.model, cli.datamodule)


def protocol_stream():
    """The original stdout, kept for the driver's JSON lines; everything printed from here on goes to stderr."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return proto


def serve(run) -> None:
    """JSON lines on the protocol stream: {"steps": n} -> {"wall": s, "cpu": s, "first_step": s}."""
    proto = protocol_stream()
    for line in sys.stdin:
        req = json.loads(line)
        wall, cpu = run(req["steps"])
        proto.write(json.dumps({"wall": wall, "cpu": cpu, "first_step": wall}) + "\n")
        proto.flush()


def Worker(python: str, *args: str, core: int | None = None, env: dict[str, str] | None = None):
    """One side in its own process (`core.timing.PinnedWorker`); with `core` set, the process and every thread it starts
    run on that core only (XLA keeps a thread pool of its own even with one intra-op thread: unpinned, the official
    side ran on 1.7 cores' worth of CPU time per wall second). Asked `{"steps": n}`."""
    from lit_iclr.core.timing import PinnedWorker  # the driver's import: the official side's Python has no lit_iclr

    return PinnedWorker([python, __file__, "--worker", *args], {**_single_thread_env(), **(env or {})}, ROOT, core)


# ----------------------------------------------------------------------------------------------------------- driver
def shared_transitions(path: Path) -> Path:
    """The default OGBench cube-single transitions (generated on first use) as one npz both sides read."""
    from lit_iclr.vgf.data import OGBenchData

    dm = OGBenchData(dataset="cube-single-play-singletask-task2-v0", data_dir=str(ROOT / "data"), num_episodes=EPISODES,
                     episode_length=1001)
    dm.prepare_data()
    dm.setup("fit")
    np.savez(path, **{k: v.numpy() for k, v in dm.transitions.items()})
    return path


def measure(setting: str, sides: dict[str, Worker], steps: int, repeats: int) -> dict[str, dict]:
    # first call: XLA's jit / torch.compile (the fit side's first block warms up; its clock starts after step 1)
    out = {name: {"first_s": w.ask({"steps": 1})["first_step"]} for name, w in sides.items()}
    for name, w in sides.items():
        w.ask({"steps": max(1, steps // 4)})  # settle
        out[name]["ms"] = []
    names = list(sides)
    for k in range(repeats):  # interleaved blocks; the order rotates each round (no side always runs first or last)
        for name in names[k % len(names):] + names[:k % len(names)]:
            r = sides[name].ask({"steps": steps})
            taken = r.get("steps", steps)  # a fit with several updates per Trainer batch rounds up to whole batches
            out[name]["ms"].append(1000.0 * r["cpu"] / taken)
            out[name].setdefault("wall_ms", []).append(1000.0 * r["wall"] / taken)
    for name in out:
        out[name]["median_ms"] = statistics.median(out[name]["ms"])
    print(f"[{setting}] " + json.dumps(out), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="default,paper")
    p.add_argument("--steps", default="30,4", help="timed steps per block, per setting")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--vs-official", default="", help="a checkout of github.com/ryanxhr/vgf (run in its own JAX env)")
    p.add_argument("--official-python", default=sys.executable, help="python of an environment with jax, flax, optax")
    p.add_argument("--compile", choices=["off", "on", "both"], default="both",
                   help="the project's compile_update (both: the fit side eager and compiled, the plain side eager)")
    p.add_argument("--no-fit", action="store_true", help="skip the cli.py fit side")
    p.add_argument("--updates-per-batch", default="",
                   help="the fit side's data.updates_per_batch (default: configs/vgf_cube.yaml's); a comma list gives "
                        "one fit side per value, an empty item the config's")
    p.add_argument("--core", type=int, default=1, help="pin every side to this CPU core (-1: no pinning)")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode of the project's update (max-autotune-no-cudagraphs: inductor's CPU GEMM "
                        "templates, a longer compile)")
    p.add_argument("--official-kept-memory", action="store_true",
                   help="also run the official side with glibc's malloc thresholds as the project sets them "
                        "(lit_iclr/core/host_memory.py), through the MALLOC_*_ environment variables")
    p.add_argument("--matmul", default="auto", choices=["aten", "onednn", "auto"],
                   help="the project's matmul library (configs/vgf_cube.yaml: auto, i.e. aten (MKL) on Intel CPUs and "
                        "onednn elsewhere)")
    p.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        kind, setting, data, *rest = args.worker
        if kind == "official":
            official_worker(setting, data, rest[0])
        else:
            project_worker(setting, data, rest[0], rest[1] == "1", rest[2], int(rest[3]) if rest[3] else None, rest[4])
        return
    from lit_iclr.core.stats import ratio_ci  # the driver only: the official worker's environment has no lit_iclr deps

    tmp = Path(tempfile.mkdtemp(prefix="vgf_speed_"))
    data = str(shared_transitions(tmp / "transitions.npz"))
    compiles = {"off": ["0"], "on": ["1"], "both": ["0", "1"]}[args.compile]
    rows = []
    core = None if args.core < 0 else args.core
    for setting, steps in zip(args.settings.split(","), [int(s) for s in args.steps.split(",")], strict=False):
        sides = {}
        if args.vs_official:
            sides["official"] = Worker(args.official_python, "official", setting, data, args.vs_official, core=core)
            if args.official_kept_memory:
                from lit_iclr.core.host_memory import MMAP_THRESHOLD, TRIM_THRESHOLD

                kept = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
                sides["official, kept host memory"] = Worker(args.official_python, "official", setting, data,
                                                             args.vs_official, core=core, env=kept)
        for c in compiles:
            tag = "compiled" if c == "1" else "eager"
            if c == "0" or args.compile == "on":
                sides[f"plain-{tag}"] = Worker(sys.executable, "project", setting, data, "plain", c, args.compile_mode,
                                               "", args.matmul, core=core)
            for n in ([] if args.no_fit else args.updates_per_batch.split(",")):
                name = f"fit-{tag}" + (f", {n} updates/batch" if n else "")
                sides[name] = Worker(sys.executable, "project", setting, data, "fit", c, args.compile_mode, n,
                                     args.matmul, core=core)
        res = measure(setting, sides, steps, args.repeats)
        for w in sides.values():
            w.close()
        ref = res.get("official", {}).get("median_ms")
        for name, r in res.items():
            ratio = f"{r['median_ms'] / ref:.2f}" if ref else "-"
            paired = "-"
            if ref and name != "official":  # block k of this side against block k of the official side (interleaved)
                paired = ratio_ci(r["ms"], res["official"]["ms"])
            wall = statistics.median(r["wall_ms"])
            wall_ref = statistics.median(res["official"]["wall_ms"]) if ref else None
            wall_ratio = f"{wall / wall_ref:.2f}" if wall_ref else "-"
            rows.append(f"| {setting} | {name} | {r['median_ms']:.1f} | {ratio} | {paired} | {wall:.1f} | {wall_ratio} | "
                        f"{r['first_s']:.1f} |")
    pinned = f"every side pinned to core {core}" if core is not None else "not pinned"
    print(f"\n{args.repeats} interleaved blocks per side, median ms/step of each single-threaded process ({pinned}; on a "
          "shared machine wall time also counts waiting for a core)\n")
    print("| setting | side | CPU ms / step | ratio vs official | per-block ratio, mean [paired 95% CI] | wall ms / step | "
          "ratio vs official | first call (s wall, incl. compile) |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
