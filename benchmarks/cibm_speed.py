"""IB-CBM training speed: an epoch of the IB_B joint model (stochastic concept layer, I(X;C) constraint with the dual
beta) in the project (lit_iclr/cibm, through the platform's Trainer and without Lightning) against the authors' PyTorch
code (dsb-ifi/cibm, `src/train.py` `train_model`), on the same embeddings and concepts, measured in one run.

Data: AwA2's widths (2048 ResNet-101 features, 85 binary concepts, 50 classes; seeded normal features, class-level
concepts as in xlsa17), `--rows` training rows (AwA2's training split has ~17.9k; the per-batch cost does not depend
on it). Both sides get the same tensors: the official side as the list of (features, concepts, label) rows its
`EmbeddingsDataset` holds, with its `DataLoader(batch_size, shuffle=True)`; the project as its `ConceptDataset`.
Same work per batch: batch 128; mu and sigma heads 2048 -> 256 -> 85 (ReLU; softplus clamped at 1e-7), label head
85 -> 50; z = mu + sigma eps; CE + BCE (summed over concepts) + beta (I_c - I_hat), I_hat on a fresh subsample of
M = 200 training inputs (logsumexp marginal); Adam 1e-3; after each batch beta += -0.01 (I_c - I_hat); cosine
schedule stepped per epoch. What differs: the official epoch (`train_model(epochs=1, collect_MIs=False,
merge_train_val=True)`; its default `collect_MIs=True` adds a binning estimate of I(X;Z), I(Z;Y), I(Z;C) over half the
training set after every batch, which the project does not compute while training) also builds each subsample by
indexing its dataset row by row, copies every batch's predictions to numpy, runs its test pass (here one batch of 128
rows) and `torch.save`/`torch.load`s the state dict; the project fit runs Lightning's loop and logs five scalars per
batch, with no vanilla CBM alongside (`vanilla_baseline: false`), no validation and no checkpoint.

Each side runs in its own single-threaded process pinned to one core (`--core`); a block is one training epoch; blocks
are interleaved in an order that rotates every round, with an A/A control (a second project fit). The first epoch
(allocations, lazy init) is reported apart. Run several times (`--runs`) for the spread across runs.

The official code is never fetched or installed by this script (and never used by the tests). To get it:

    git clone https://github.com/dsb-ifi/cibm ~/src/cibm           # tested at 49318f0
    python3.11 -m venv /tmp/cibmvenv && /tmp/cibmvenv/bin/pip install torch torchvision numpy scipy scikit-learn \
        pandas loguru fire lovely-numpy matplotlib tqdm wandb       # src/train.py's imports

    .venv/bin/python benchmarks/cibm_speed.py --vs-official ~/src/cibm --official-python /tmp/cibmvenv/bin/python
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
FEATURES, CONCEPTS, CLASSES, HIDDEN, BATCH, MI_SAMPLES = 2048, 85, 50, 256, 128, 200


def write_data(path: Path, rows: int, test_rows: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    attributes = (rng.random((CLASSES, CONCEPTS)) < 0.4).astype(np.int64)  # class-level concepts (xlsa17's layout)
    y = rng.integers(0, CLASSES, rows + test_rows)
    y[:CLASSES] = np.arange(CLASSES)  # every class in the training rows
    x = (rng.normal(size=(rows + test_rows, FEATURES)) + 0.5 * rng.normal(size=(CLASSES, FEATURES))[y]).astype(np.float32)
    np.savez(path, x=x, c=attributes[y], y=y, rows=rows)
    return path


def protocol_stream():
    """The original stdout for the driver's JSON lines; everything printed from here on goes to stderr."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return proto


# ------------------------------------------------------------------------------------------------------------ workers
def official_worker(data: str, repo: str) -> None:
    """Serves epochs of the official `train_model` (one call with epochs=1 per block)."""
    import warnings

    warnings.filterwarnings("ignore")  # as the official __main__ does
    sys.path.insert(0, str(Path(repo) / "src"))
    os.chdir(tempfile.mkdtemp(prefix="cibm_official_"))  # train_model writes logs/<logdir>/model.pth under the cwd
    import torch
    import train
    from dataset.emb import EmbeddingsDataset
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    f = np.load(data)
    n = int(f["rows"])
    x, c, y = f["x"], torch.from_numpy(f["c"]).int(), f["y"]
    rows = [(x[i], c[i], y[i]) for i in range(len(y))]  # the official setup()'s (features, attrs[label], label) rows
    train.set_seed(0)
    train_set, test_set = EmbeddingsDataset(rows[:n], 0.0), EmbeddingsDataset(rows[n:], 0.0)
    loaders = {"train": DataLoader(train_set, batch_size=BATCH, shuffle=True),
               "test": DataLoader(test_set, batch_size=BATCH, shuffle=False)}
    model, optim, scheduler = train.configure_training(False, True, [FEATURES, HIDDEN], train_set.num_concepts,
                                                       train_set.num_classes, "relu", "adam", True, 1e-3, 0.0,
                                                       torch.device("cpu"), 1000)
    os.makedirs("logs/bench", exist_ok=True)
    proto = protocol_stream()
    for line in sys.stdin:
        json.loads(line)
        t, cpu = time.perf_counter(), time.process_time()
        train.train_model(loaders, model, optim, scheduler, verbose=0, MI_const=1, jensen=False, blackbox=False,
                          sz=MI_SAMPLES, beta=0.5, beta_lr=-1e-2, epochs=1, logdir="bench", collect_MIs=False,
                          merge_train_val=True, use_HC=False, use_kl_ce_objective=False)
        proto.write(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - cpu}) + "\n")
        proto.flush()


def project_model():
    import torch

    from lit_iclr.cibm import CIBM

    return CIBM(input_shape=[FEATURES], num_concepts=CONCEPTS, num_classes=CLASSES, family="joint", ib="B",
                stochastic=True, hidden=HIDDEN, mi_samples=MI_SAMPLES, mi_source="train", vanilla_baseline=False,
                probe_leakage=False, leakage_metrics=False, use_scheduler=True,
                optimizer=lambda p: torch.optim.Adam(p, lr=1e-3))


def project_data(data: str):
    import torch

    from lit_iclr.cibm.data import ConceptDataset

    f = np.load(data)
    n = int(f["rows"])
    x, c, y = torch.from_numpy(f["x"][:n]), torch.from_numpy(f["c"][:n]).float(), torch.from_numpy(f["y"][:n])
    return ConceptDataset(x, c, y)


def project_fit_worker(data: str) -> None:
    """One fit of the platform's Trainer that serves the blocks: each epoch waits for the driver's request at its
    start (not timed) and reports its CPU time at its end; stdin closing stops the fit."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback

    from lit_iclr.core.loader import ResumableDataLoader
    from lit_iclr.core.trainer import Trainer

    torch.set_num_threads(1)
    dataset = project_data(data)

    class Data(L.LightningDataModule):
        train_inputs = dataset.x  # the pool of the I(X;C) subsample (as the project's DataModules expose it)

        def train_dataloader(self):
            return ResumableDataLoader(dataset, batch_size=BATCH, shuffle=True)

    proto = protocol_stream()

    class BlockServer(Callback):
        def on_train_epoch_start(self, trainer, *args) -> None:
            if not sys.stdin.readline():
                trainer.should_stop = True
                trainer.limit_train_batches = 0
                raise KeyboardInterrupt  # ends the fit without another epoch
            self.t, self.c = time.perf_counter(), time.process_time()

        def on_train_epoch_end(self, trainer, *args) -> None:
            proto.write(json.dumps({"wall": time.perf_counter() - self.t, "cpu": time.process_time() - self.c}) + "\n")
            proto.flush()

    L.seed_everything(0, verbose=False)
    trainer = Trainer(max_epochs=1000, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, callbacks=[BlockServer()])
    try:
        trainer.fit(project_model(), datamodule=Data())
    except KeyboardInterrupt:
        pass


def project_plain_worker(data: str) -> None:
    """The same epoch without Lightning: `CIBM.losses` (the training step's losses), backward, Adam, the dual step."""
    import torch
    from torch.utils.data import DataLoader

    from lit_iclr.cibm.ib import dual_update
    from lit_iclr.core.host_memory import keep_freed_host_memory

    torch.set_num_threads(1)
    keep_freed_host_memory()  # as the platform's Trainer does (the fit side gets it there)
    torch.manual_seed(0)
    dataset = project_data(data)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True)
    model = project_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    g = torch.Generator().manual_seed(0)
    state = {"beta": 0.5, "step": 0}
    proto = protocol_stream()
    for line in sys.stdin:
        json.loads(line)
        t, cpu = time.perf_counter(), time.process_time()
        for batch in loader:
            sub = dataset.x[torch.randperm(len(dataset), generator=g)[:MI_SAMPLES]]
            r = model.losses(batch, state["step"], state["beta"], sub_x=sub)
            opt.zero_grad(set_to_none=True)
            r["loss"].backward()
            opt.step()
            state["beta"] = dual_update(state["beta"], float(r["mi"].detach()), 1.0, -0.01)
            state["step"] += 1
        sched.step()
        proto.write(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - cpu}) + "\n")
        proto.flush()


def Worker(python: str, *args: str, core: int | None):
    """One side in its own process, pinned to `core` (`core.timing.PinnedWorker`); asked `{}` for one epoch."""
    from lit_iclr.core.timing import PinnedWorker  # the driver's import: the official side's Python has no lit_iclr

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return PinnedWorker([python, __file__, "--worker", *args], env, ROOT, core)


# ----------------------------------------------------------------------------------------------------------- driver
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vs-official", default="", help="a checkout of github.com/dsb-ifi/cibm")
    p.add_argument("--official-python", default=sys.executable, help="python of an environment with src/train.py's deps")
    p.add_argument("--rows", type=int, default=4096, help="training rows (one epoch = rows / 128 batches)")
    p.add_argument("--repeats", type=int, default=6, help="interleaved epochs per side")
    p.add_argument("--runs", type=int, default=1, help="separate runs (fresh processes), for the spread across runs")
    p.add_argument("--core", type=int, default=1, help="pin every side to this CPU core (-1: no pinning)")
    p.add_argument("--no-plain", action="store_true", help="skip the project's epoch without Lightning")
    p.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        kind, data, *rest = args.worker
        {"official": lambda: official_worker(data, rest[0]), "fit": lambda: project_fit_worker(data),
         "plain": lambda: project_plain_worker(data)}[kind]()
        return
    from lit_iclr.core.stats import ratio_ci

    core = None if args.core < 0 else args.core
    data = str(write_data(Path(tempfile.mkdtemp(prefix="cibm_speed_")) / "data.npz", args.rows, BATCH))
    runs = []
    for run in range(args.runs):
        sides = {}
        if args.vs_official:
            sides["official"] = Worker(args.official_python, "official", data, args.vs_official, core=core)
        sides["project fit"] = Worker(sys.executable, "fit", data, core=core)
        sides["project fit (A/A)"] = Worker(sys.executable, "fit", data, core=core)
        if not args.no_plain:
            sides["project, no Lightning"] = Worker(sys.executable, "plain", data, core=core)
        first = {name: w.ask({})["cpu"] for name, w in sides.items()}
        cpu = {name: [] for name in sides}
        names = list(sides)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                cpu[name].append(sides[name].ask({})["cpu"])
        for w in sides.values():
            w.close()
        print(f"[run {run}] " + json.dumps({"first_epoch_cpu_s": first, "cpu_s_per_epoch": cpu}), flush=True)
        runs.append(cpu)
    ref = "official" if args.vs_official else "project fit"
    pinned = f"pinned to core {core}" if core is not None else "not pinned"
    print(f"\n{args.runs} run(s) x {args.repeats} interleaved epochs per side ({pinned}; load {os.getloadavg()[0]:.1f}); "
          f"{args.rows} rows, batch {BATCH}; CPU s per epoch\n")
    print(f"| run | side | CPU s / epoch (median) | ratio vs {ref} | per-block ratio, mean [paired 95% CI] |")
    print("|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {}
    for k, cpu in enumerate(runs):
        for name, v in cpu.items():
            med, ref_med = statistics.median(v), statistics.median(cpu[ref])
            ratios.setdefault(name, []).append(med / ref_med)
            ci = ratio_ci(v, cpu[ref]) if name != ref else "-"
            print(f"| {k} | {name} | {med:.3f} | {med / ref_med:.3f} | {ci} |")
    for k, cpu in enumerate(runs):
        print(f"A/A control, run {k}: project fit (A/A) / project fit per-block ratio "
              f"{ratio_ci(cpu['project fit (A/A)'], cpu['project fit'])}")
    if args.runs > 1:
        print("\nspread across runs (ratio of medians): " + "; ".join(
            f"{n}: {min(r):.3f}-{max(r):.3f} (mean {statistics.mean(r):.3f})" for n, r in ratios.items() if n != ref))


if __name__ == "__main__":
    main()
