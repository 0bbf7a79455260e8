"""AIRE-Prune speed against the authors' JAX code (falcon-arrow/AIRE-Prune, S5 with LAST-style pruning): (a) a training
step of the S5 classifier on the same sequences, (b) scoring and pruning a trained model, measured in one run.

Model and data (configs/aire_prune.yaml): row-wise Fashion-MNIST (28 steps of 28 pixels, the project's reader; the
same normalised training sequences are handed to both sides), S5 with H = 64, 4 layers, P = 32 in J = 2 HiPPO-LegS
blocks (16 stored complex states per layer with conjugate symmetry), ZOH, Re(Lambda) clipped at -1e-4, pre-LayerNorm,
half_glu2, dropout 0.1, mean pooling, 36,490 parameters on both sides; batch 128; Lambda, B and Delta by Adam at 1e-3
with no weight decay, every other parameter by AdamW at 4e-3 with weight decay 0.05, the learning rates set per step.

(a) Official: `s5/train_helpers.py` `train_epoch` over the block's batches (per batch `prep_batch`, a dropout key,
the jitted `train_step`: forward, cross-entropy, gradient, optax `multi_transform` update; then
`update_learning_rate_per_step`), the model built as `s5/train.py` `train()` builds it (`opt_config standard`,
`pruning=True`, cosine schedule). Project: `cli.py fit --config configs/aire_prune.yaml` serving the blocks from a
callback (Lightning's loop, the loader's collate, two logged scalars per step), and the same step without Lightning
(`SSMClassifier` forward, cross-entropy, backward, AdamW, LambdaLR) with the config's FFT convolution and with the
parallel scan. What differs: the official S5 layer runs a parallel associative scan (`jax.lax.associative_scan`), the
project's config an FFT convolution (the `scan` side runs a doubling scan); the official forward computes the AIRE
score, its sort and the LAMP normalisation in every step (its `S5SSM.__call__` returns them, so `pruning=True` is needed
for it to run at all) and masks Lambda_bar, B_bar and C with it (threshold 0 in training: every state kept), the
project's multiplies B_bar and C by a mask of ones; GELU is tanh-approximated in flax, exact in torch; LayerNorm eps
1e-6 against 1e-5; the official batches are numpy arrays drawn in the block, the project fit's come from its DataLoader
(per-sequence indexing and collate), the no-Lightning side draws them as the official side does.

(b) One prune of a trained model at `--ratio` (default 0.5): both sides get the same weights (a project model trained
`--prune-train-steps` steps on the shared data, mapped into the official parameter tree; the logits of the two are
compared). Official: the scores come out of the model's forward (`S5SSM.setup` computes them; the sweep in
`s5/train.py` takes them from `validate`), here the jitted `eval_step` on one sequence, then `_topk_mask_desc` at K =
floor((1 - ratio) * 64) and the k-th score, as `_run_pruning_sweep` does per ratio before its evaluation: a keep mask,
applied by the threshold at every later forward. Project: `aire.prune` (scores from the parameters, LAMP, global top-K,
then a physically smaller copy of the model with every per-state tensor sliced) and `aire.plan` alone (the keep mask,
the official side's output). The keep masks of the two sides are compared.

Each side runs in its own single-threaded process pinned to one core (`--core`); blocks are interleaved in an order
that rotates every round; the first call (XLA's jit on the official side) is reported apart; an A/A control (a second
project fit, a second project prune) in every run; `--runs` separate runs (fresh processes) for the spread across runs.

The official code is never fetched or installed by this script (and never used by the tests). To get it:

    git clone https://github.com/falcon-arrow/AIRE-Prune ~/src/AIRE-Prune          # tested at 57d879b
    python3.11 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install jax==0.4.13 jaxlib==0.4.13 flax==0.7.0 \
        optax==0.1.7 chex==0.1.81 numpy==1.26.3 scipy==1.12.0 tqdm==4.66.1     # its env.yaml's versions (CPU jaxlib)

    .venv/bin/python benchmarks/aire_prune_speed.py --vs-official ~/src/AIRE-Prune --official-python /tmp/jaxenv/bin/python

(s5/ssm.py annotates with `jax.numpy.DeviceArray`, which later jax releases removed, hence jax 0.4.13.) `s5/train.py`
imports its data loaders (torch, torchvision, datasets) and wandb at module level; neither is used by the timed code,
and the worker puts empty modules in their place so that the JAX environment needs neither.
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
sys.path.insert(0, str(ROOT))  # this checkout's lit_iclr (a script's own folder, not the working directory, starts sys.path)
H, LAYERS, P, BLOCKS, BATCH, CLASSES = 64, 4, 32, 2, 128, 10  # configs/aire_prune.yaml
LR, SSM_LR, WD, DROPOUT, WARMUP = 4e-3, 1e-3, 0.05, 0.1, 200


def protocol_stream():
    """The original stdout for the driver's JSON lines; everything printed from here on goes to stderr (a worker takes
    it first thing: the official setup prints to stdout)."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return proto


def serve(run, proto) -> None:
    """JSON lines: {"n": k} -> run(k)'s dict plus the block's CPU and wall seconds."""
    for line in sys.stdin:
        n = json.loads(line)["n"]
        t, c = time.perf_counter(), time.process_time()
        out = run(n) or {}
        proto.write(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c, **out}) + "\n")
        proto.flush()


class Sampler:
    """Uniform minibatches of the shared sequences, drawn with numpy (the official and the no-Lightning sides)."""

    def __init__(self, path: str):
        f = np.load(path)
        self.x, self.y = f["x"], f["y"]
        self.rng = np.random.default_rng(0)

    def __call__(self) -> tuple[np.ndarray, np.ndarray]:
        idx = self.rng.integers(0, len(self.y), BATCH)
        return self.x[idx], self.y[idx]


# ------------------------------------------------------------------------------------------------- official workers
def official_model(repo: str, seq_len: int, d_input: int):
    """The classifier and its train state, built as `s5/train.py` `train()` builds them (lines of its setup, with the
    config's sizes): HiPPO-LegS blocks, conjugate symmetry, `init_S5SSM`, `BatchClassificationModel`,
    `create_train_state(opt_config="standard")`."""
    import types

    sys.path.insert(0, repo)
    sys.modules.setdefault("s5.dataloading", types.SimpleNamespace(Datasets={}))  # torch loaders: unused here
    sys.modules.setdefault("wandb", types.ModuleType("wandb"))  # logging of the sweep: unused here
    from functools import partial

    import jax
    import jax.numpy as jnp
    from jax.scipy.linalg import block_diag
    from s5.seq_model import BatchClassificationModel
    from s5.ssm import init_S5SSM
    from s5.ssm_init import make_DPLR_HiPPO
    from s5.train_helpers import create_train_state

    block_size = P // BLOCKS
    lam, _, _, v, _ = make_DPLR_HiPPO(block_size)
    block_size, ssm_size = block_size // 2, P // 2  # conj_sym
    lam, v = lam[:block_size], v[:, :block_size]
    lam = (lam * jnp.ones((BLOCKS, block_size))).ravel()
    vinv = block_diag(*([v.conj().T] * BLOCKS))
    v = block_diag(*([v] * BLOCKS))
    ssm = init_S5SSM(H=H, P=ssm_size, Lambda_re_init=lam.real, Lambda_im_init=lam.imag, V=v, Vinv=vinv,
                     C_init="lecun_normal", discretization="zoh", dt_min=1e-3, dt_max=1e-1, conj_sym=True,
                     clip_eigs=True, bidirectional=False, pruning=True)
    model_cls = partial(BatchClassificationModel, ssm=ssm, d_output=CLASSES, d_model=H, n_layers=LAYERS, padded=False,
                        activation="half_glu2", dropout=DROPOUT, mode="pool", prenorm=True, batchnorm=False)
    state = create_train_state(model_cls, jax.random.PRNGKey(0), False, False, in_dim=d_input, bsz=BATCH,
                               seq_len=seq_len, weight_decay=WD, batchnorm=False, opt_config="standard", ssm_lr=SSM_LR,
                               lr=LR, dt_global=False)
    return model_cls, state


class _AsTorch:
    """What `prep_batch` calls on a DataLoader's tensors (`.numpy()`), around a numpy array."""

    def __init__(self, a: np.ndarray):
        self.a = a

    def numpy(self) -> np.ndarray:
        return self.a


def official_train_worker(proto, data: str, repo: str) -> None:
    """Serves blocks of the official `train_epoch` over `n` batches (one call per block)."""
    sample = Sampler(data)
    seq_len, d_input = sample.x.shape[1:]
    model_cls, state = official_model(repo, seq_len, d_input)
    import jax
    from s5.train_helpers import cosine_annealing, train_epoch

    box = {"state": state, "step": 0, "key": jax.random.PRNGKey(1)}

    def batches(n: int):
        for _ in range(n):
            x, y = sample()
            yield _AsTorch(x), _AsTorch(y)

    def run(n: int) -> None:
        box["key"], key = jax.random.split(box["key"])
        lr_params = (cosine_annealing, SSM_LR, LR, box["step"], 100_000, "standard", 0.0)
        box["state"], loss, box["step"] = train_epoch(box["state"], key, model_cls, batches(n), seq_len, d_input,
                                                      False, lr_params)
        jax.block_until_ready((box["state"], loss))

    serve(run, proto)


def to_official_params(params: dict, weights: dict[str, np.ndarray]) -> dict:
    """The project's `SSMClassifier` state dict in the official parameter tree (torch Linear weights transposed into
    flax kernels; log_step (n,) -> (n, 1))."""
    import jax.numpy as jnp

    def put(tree, path, value):
        *up, last = path
        for k in up:
            tree = tree[k]
        assert tree[last].shape == value.shape, (path, tree[last].shape, value.shape)
        tree[last] = jnp.asarray(value, dtype=tree[last].dtype)

    put(params, ["encoder", "encoder", "kernel"], weights["encoder.weight"].T)
    put(params, ["encoder", "encoder", "bias"], weights["encoder.bias"])
    for i in range(LAYERS):
        layer, pre = params["encoder"][f"layers_{i}"], f"layers.{i}."
        for name in ("Lambda_re", "Lambda_im", "B", "C", "D"):
            put(layer, ["seq", name], weights[pre + "ssm." + name])
        put(layer, ["seq", "log_step"], weights[pre + "ssm.log_step"][:, None])
        put(layer, ["norm", "scale"], weights[pre + "norm.weight"])
        put(layer, ["norm", "bias"], weights[pre + "norm.bias"])
        put(layer, ["out2", "kernel"], weights[pre + "out.weight"].T)
        put(layer, ["out2", "bias"], weights[pre + "out.bias"])
    put(params, ["decoder", "kernel"], weights["decoder.weight"].T)
    put(params, ["decoder", "bias"], weights["decoder.bias"])
    return params


def official_prune_worker(proto, data: str, weights: str, repo: str, ratio: float) -> None:
    """Serves blocks of `n` official prunes: scores from the jitted `eval_step` on one sequence, `_topk_mask_desc`."""
    f = np.load(data)
    seq_len, d_input = f["x"].shape[1:]
    model_cls, state = official_model(repo, seq_len, d_input)
    import jax.numpy as jnp
    from s5.train import _topk_mask_desc
    from s5.train_helpers import eval_step

    state = state.replace(params=to_official_params(state.params, dict(np.load(weights))))
    model = model_cls(training=False)
    check = jnp.asarray(f["x"][:8]), jnp.asarray(f["y"][:8].astype(float))
    _, _, logits, _ = eval_step(*check, jnp.ones((8, seq_len)), jnp.zeros(8), state, model, False)
    one = (check[0][:1], check[1][:1], jnp.ones((1, seq_len)), jnp.zeros(1))
    total = LAYERS * P // 2
    keep = max(int(total * (100.0 - 100.0 * ratio) / 100.0), 1)  # as `_run_pruning_sweep`
    box = {}

    def run(n: int) -> dict:
        for _ in range(n):
            scores = eval_step(*one, state, model, False)[3]
            mask, idx = _topk_mask_desc(scores[0], keep)
            box["threshold"] = float(np.asarray(scores[0])[idx].min())
        return {"mask": mask.astype(int).tolist(), "logits": np.asarray(logits).tolist()}

    serve(run, proto)


# -------------------------------------------------------------------------------------------------- project workers
def project_fit_worker(proto, rows: int | None) -> None:
    """One `cli.py fit` of configs/aire_prune.yaml (validation off) serving the blocks: after a block's last step a
    callback answers the driver and waits for the next request (not timed); stdin closing ends the fit."""
    from lit_iclr.cli import LitIclrCLI
    from lit_iclr.core.timing import fit_block_server

    args = ["--config", str(ROOT / "configs" / "aire_prune.yaml"), "--trainer.limit_val_batches", "0",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir",
            tempfile.mkdtemp(prefix="aire_speed_fit_")]
    if rows is not None:
        args += ["--data.init_args.train_size", str(rows)]
    cli = LitIclrCLI(args=args, run=False)
    cli.trainer.callbacks.append(fit_block_server(proto, key="n"))
    cli.trainer.fit(cli.model, cli.datamodule)


def project_model(d_input: int, mode: str = "fft"):
    from lit_iclr.aire_prune.model import SSMClassifier

    return SSMClassifier("s5", d_input, 0, CLASSES, H, LAYERS, P, BLOCKS, True, False, "hippo", "layer", "half_glu2",
                         DROPOUT, 1e-3, 1e-1, True, mode, None, 0)


def project_optimizer(model, total_steps: int):
    """AIREPruneClassifier.configure_optimizers' groups and schedule, without a Trainer."""
    import math

    import torch

    from lit_iclr.aire_prune.module import SSM_PARAMS

    ssm, other = [], []
    for name, param in model.named_parameters():
        (ssm if name.rsplit(".", 1)[-1] in SSM_PARAMS else other).append(param)
    opt = torch.optim.AdamW([{"params": other}, {"params": ssm, "lr": SSM_LR, "weight_decay": 0.0}], lr=LR,
                            weight_decay=WD)

    def schedule(step: int) -> float:
        if step < WARMUP:
            return (step + 1) / WARMUP
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - WARMUP) / max(total_steps - WARMUP, 1))))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def project_plain_worker(proto, data: str, mode: str) -> None:
    """The project's training step without Lightning: forward, cross-entropy, backward, AdamW, LambdaLR."""
    import torch
    import torch.nn.functional as F

    from lit_iclr.core.host_memory import keep_freed_host_memory

    torch.set_num_threads(1)
    keep_freed_host_memory()  # as the platform's Trainer does (the fit side gets it there)
    torch.manual_seed(0)
    sample = Sampler(data)
    model = project_model(sample.x.shape[2], mode).train()
    opt, sched = project_optimizer(model, 100_000)

    def run(n: int) -> None:
        for _ in range(n):
            x, y = sample()
            loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()

    serve(run, proto)


def prune_runner(weights: str, d_input: int, ratio: float, what: str):
    """`run(n)`: `n` project prunes of the shared trained weights, `aire.prune` (plan + slice) or `aire.plan` (the keep
    mask alone); returns the last one's keep mask over all states, layer after layer (0/1)."""
    import torch

    from lit_iclr.aire_prune import aire

    model = project_model(d_input).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(weights).items()})
    box = {}

    def run(n: int) -> dict:
        for _ in range(n):
            box["plan"] = aire.prune(model, ratio)[1] if what == "prune" else aire.plan(model, ratio)
        plan = box["plan"]
        mask = np.zeros(sum(plan.sizes), dtype=int)
        for i, keep in enumerate(plan.keep):
            mask[sum(plan.sizes[:i]) + keep.numpy()] = 1
        return {"mask": mask.tolist()}

    return run


def project_prune_worker(proto, weights: str, d_input: int, ratio: float, what: str) -> None:
    import torch

    torch.set_num_threads(1)
    serve(prune_runner(weights, d_input, ratio, what), proto)


def Worker(python: str, *args: str, core: int | None):
    """One side in its own process, pinned to `core` (`core.timing.PinnedWorker`); asked {"n": k} for one block."""
    from lit_iclr.core.timing import PinnedWorker  # the driver's import: the official side's Python has no lit_iclr

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1", JAX_PLATFORMS="cpu",
               TQDM_DISABLE="1")  # the official epoch's progress bar off, as the project fit's (enable_progress_bar)
    return PinnedWorker([python, __file__, "--worker", *args], env, ROOT, core)


# ----------------------------------------------------------------------------------------------------------- driver
def write_data(path: Path, rows: int | None) -> Path:
    """The row-wise Fashion-MNIST training sequences of configs/aire_prune.yaml (the project's reader), as one npz."""
    from lit_iclr.aire_prune.data import SequentialImageData

    dm = SequentialImageData(downsample=1, read_by="row", batch_size=BATCH, train_size=rows)
    dm.prepare_data()
    dm.setup("fit")
    np.savez(path, x=dm.train_set.x, y=dm.train_set.y.astype(np.int64))
    return path


def train_weights(data: Path, path: Path, steps: int) -> Path:
    """A project model trained `steps` steps on the shared data (not timed): the trained model both sides prune."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)  # the driver is not pinned: one thread, as the workers
    torch.manual_seed(0)
    sample = Sampler(str(data))
    model = project_model(sample.x.shape[2]).train()
    opt, sched = project_optimizer(model, steps)
    for _ in range(steps):
        x, y = sample()
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    np.savez(path, **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    return path


def measure(sides: dict, n: int, repeats: int) -> dict[str, dict]:
    """First call apart (one step / one prune: XLA's jit), a settling block, then interleaved rotating blocks."""
    out = {name: {"first_s": w.ask({"n": 1})["wall"], "per": []} for name, w in sides.items()}
    for name, w in sides.items():
        out[name]["last"] = w.ask({"n": max(1, n // 4)})
    names = list(sides)
    for k in range(repeats):
        for name in names[k % len(names):] + names[:k % len(names)]:
            r = sides[name].ask({"n": n})
            out[name]["per"].append(1000.0 * r["cpu"] / n)
            out[name]["last"] = r
    for w in sides.values():
        w.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vs-official", default="", help="a checkout of github.com/falcon-arrow/AIRE-Prune")
    p.add_argument("--official-python", default=sys.executable, help="python of an environment with jax 0.4.13, flax")
    p.add_argument("--rows", type=int, default=0, help="training sequences (0: the whole split, as the config)")
    p.add_argument("--steps", type=int, default=20, help="training steps per block")
    p.add_argument("--prunes", type=int, default=50, help="prunes per block")
    p.add_argument("--repeats", type=int, default=8, help="interleaved blocks per side")
    p.add_argument("--runs", type=int, default=1, help="separate runs (fresh processes), for the spread across runs")
    p.add_argument("--ratio", type=float, default=0.5, help="pruning ratio of (b)")
    p.add_argument("--prune-train-steps", type=int, default=200, help="training steps of the model that (b) prunes")
    p.add_argument("--parts", default="train,prune", help="train, prune or both")
    p.add_argument("--core", type=int, default=0, help="pin every side to this CPU core (-1: no pinning)")
    p.add_argument("--no-scan", action="store_true", help="skip the project's step with the parallel scan")
    p.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        kind, *rest = args.worker
        proto = protocol_stream()
        {"official-train": lambda: official_train_worker(proto, rest[0], rest[1]),
         "official-prune": lambda: official_prune_worker(proto, rest[0], rest[1], rest[2], float(rest[3])),
         "fit": lambda: project_fit_worker(proto, int(rest[0]) or None),
         "plain": lambda: project_plain_worker(proto, rest[0], rest[1]),
         "prune": lambda: project_prune_worker(proto, rest[0], int(rest[1]), float(rest[2]), rest[3])}[kind]()
        return
    core = None if args.core < 0 else args.core
    tmp = Path(tempfile.mkdtemp(prefix="aire_speed_"))
    data = write_data(tmp / "data.npz", args.rows or None)
    d_input = int(np.load(data)["x"].shape[2])
    parts = args.parts.split(",")
    weights = train_weights(data, tmp / "weights.npz", args.prune_train_steps) if "prune" in parts else None
    results: dict[str, list[dict]] = {"train": [], "prune": []}
    for run in range(args.runs):
        if "train" in parts:
            sides = {}
            if args.vs_official:
                sides["official"] = Worker(args.official_python, "official-train", str(data), args.vs_official,
                                           core=core)
            sides["project fit"] = Worker(sys.executable, "fit", str(args.rows), core=core)
            sides["project fit (A/A)"] = Worker(sys.executable, "fit", str(args.rows), core=core)
            sides["project, no Lightning"] = Worker(sys.executable, "plain", str(data), "fft", core=core)
            if not args.no_scan:
                sides["project, no Lightning, scan"] = Worker(sys.executable, "plain", str(data), "scan", core=core)
            res = measure(sides, args.steps, args.repeats)
            print(f"[run {run} train] " + json.dumps({k: {"first_s": v["first_s"], "ms": v["per"]}
                                                      for k, v in res.items()}), flush=True)
            results["train"].append(res)
        if "prune" in parts:
            sides = {}
            if args.vs_official:
                sides["official"] = Worker(args.official_python, "official-prune", str(data), str(weights),
                                           args.vs_official, str(args.ratio), core=core)
            for name, what in (("project prune (plan + slice)", "prune"), ("project prune (A/A)", "prune"),
                               ("project plan only (keep mask)", "plan")):
                sides[name] = Worker(sys.executable, "prune", str(weights), str(d_input), str(args.ratio), what,
                                     core=core)
            res = measure(sides, args.prunes, args.repeats)
            print(f"[run {run} prune] " + json.dumps({k: {"first_s": v["first_s"], "ms": v["per"]}
                                                      for k, v in res.items()}), flush=True)
            results["prune"].append(res)
    report(results, args, core, weights, data)


def report(results: dict, args, core: int | None, weights: Path | None, data: Path) -> None:
    from lit_iclr.core.stats import ratio_ci

    pinned = f"every side pinned to core {core}" if core is not None else "not pinned"
    for part, unit in (("train", "step"), ("prune", "prune")):
        runs = results[part]
        if not runs:
            continue
        ref = "official" if args.vs_official else next(iter(runs[0]))
        n = args.steps if part == "train" else args.prunes
        print(f"\n({part}) {len(runs)} run(s) x {args.repeats} interleaved blocks of {n} {unit}s per side ({pinned}; "
              f"load {os.getloadavg()[0]:.1f}); CPU ms per {unit}\n")
        print(f"| run | side | CPU ms / {unit} (median) | ratio of medians vs {ref} | mean of per-block ratios "
              "[paired 95% CI] | first call (s wall) |")
        print("|---|---|---|---|---|---|")
        ratios: dict[str, list[float]] = {}
        for k, res in enumerate(runs):
            for name, r in res.items():
                med, ref_med = statistics.median(r["per"]), statistics.median(res[ref]["per"])
                ratios.setdefault(name, []).append(med / ref_med)
                ci = ratio_ci(r["per"], res[ref]["per"]) if name != ref else "-"
                print(f"| {k + 1} | {name} | {med:.2f} | {med / ref_med:.3f} | {ci} | {r['first_s']:.2f} |")
        aa = [name for name in runs[0] if "A/A" in name][0]
        base = aa.replace(" (A/A)", "") if part == "train" else "project prune (plan + slice)"
        for k, res in enumerate(runs):
            print(f"A/A control, run {k + 1}: {aa} / {base} per-block ratio {ratio_ci(res[aa]['per'], res[base]['per'])}")
        if len(runs) > 1:
            print("spread across runs (ratio of medians): " + "; ".join(
                f"{name}: {min(v):.3f}-{max(v):.3f} (mean {statistics.mean(v):.3f})" for name, v in ratios.items()
                if name != ref))
        if part == "prune" and args.vs_official:
            res = runs[-1]
            same = all(res[ref]["last"]["mask"] == r["last"]["mask"] for name, r in res.items() if name != ref)
            print(f"keep masks at ratio {args.ratio}: official and project {'identical' if same else 'DIFFERENT'} "
                  f"({sum(res[ref]['last']['mask'])} of {len(res[ref]['last']['mask'])} states kept)")
            logit_gap = official_logit_gap(res[ref]["last"]["logits"], weights, data)
            print(f"same weights: log-softmax outputs of the two models on 8 sequences differ by at most {logit_gap:.2e} "
                  "(flax's tanh GELU and LayerNorm eps 1e-6 against torch's exact GELU and 1e-5)")


def official_logit_gap(official: list, weights: Path, data: Path) -> float:
    import torch

    f = np.load(data)
    model = project_model(f["x"].shape[2]).eval()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in np.load(weights).items()})
    with torch.no_grad():
        ours = torch.log_softmax(model(torch.from_numpy(f["x"][:8])), -1).numpy()
    return float(np.abs(ours - np.asarray(official)).max())


if __name__ == "__main__":
    main()
