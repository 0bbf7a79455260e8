"""Lightning's overhead: the same model, data and optimizer trained N steps through the platform's Trainer and through a
plain PyTorch loop, interleaved in one run; prints a markdown table of the time ratio (target <= 1.10). Times are the
process's CPU time (single-threaded), so the waits of a shared machine's scheduler are not counted.

Trainer variants: `self.log` of the loss every step (Lightning's usual way: per-call bookkeeping and, for a progress-bar
metric, a `.item()` per step), the platform's `log_train` (summed on the device, logged every `log_every_n_steps`),
with the CSV logger, with a progress bar (the platform's line bar for logs; tqdm, Lightning's terminal bar, to
/dev/null), and the same step by manual optimisation (`manual_backward` + `opt.step()`, which the platform's Trainer sends
straight to PyTorch when Lightning's wrappers would do nothing: `lit_iclr/core/direct.py`). Two ratios: the whole run
(`trainer.fit` includes its setup and teardown, a fixed cost per fit) and per step (end of the first step to the end of
the last, the cost every step pays), the latter also as the mean of the per-repeat ratios (each Trainer run against the
plain loop of the same repeat) with its paired 95% confidence interval. The process is pinned to one core (`--core`):
on a 2-core machine, migrations between the cores and the sibling's load moved identical runs by +-15 %.

    .venv/bin/python benchmarks/platform_overhead.py [--steps 300] [--repeats 3] [--widths 512,1024] [--variants default]

(Not named `platform.py`: in benchmarks/ that name would shadow the standard library's `platform` module for every
benchmark script, since a script's folder comes first on sys.path.)
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time

import torch
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_iclr.core.loggers import RunCSVLogger
from lit_iclr.core.module import BaseModule
from lit_iclr.core.progress import LineProgressBar
from lit_iclr.core.stats import ratio_ci
from lit_iclr.core.trainer import Trainer


def make_net(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))


class Regressor(BaseModule):
    def __init__(self, width: int, per_step_log: bool = False, manual: bool = False):
        super().__init__()
        self.net = make_net(width)
        self.per_step_log = per_step_log
        self.automatic_optimization = not manual

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        if not self.automatic_optimization:  # the same step as the plain loop, through Lightning's manual optimisation
            opt = self.optimizers()
            opt.zero_grad(set_to_none=True)
            self.manual_backward(loss)
            opt.step()
        if self.per_step_log:
            self.log("train/loss", loss, prog_bar=True)
        else:
            self.log_train({"train/loss": loss}, prog_bar=("train/loss",))
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def data(steps: int, batch: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch, 64, generator=g)
    return DataLoader(TensorDataset(x, x[:, :8].sum(1)), batch_size=batch, shuffle=False)


def plain(steps: int, batch: int, width: int) -> tuple[float, float]:
    """(CPU time of the whole loop, of the steps after the first)."""
    net, loader = make_net(width), data(steps, batch)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    t = time.process_time()
    first = None
    for x, y in loader:
        loss = nn.functional.mse_loss(net(x).squeeze(-1), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        first = first or time.process_time()
    end = time.process_time()
    return end - t, end - first


DEFAULT = "trainer, log_train + csv + line bar"  # what a `cli.py fit` of a method runs (log_train, CSV, line bar)
VARIANTS = {  # name: (self.log every step, CSV logger, progress bar, manual optimisation)
    "trainer, self.log every step": (True, True, None, False),
    "trainer, log_train": (False, False, None, False),
    "trainer, log_train + csv": (False, True, None, False),
    "trainer, log_train + csv + line bar": (False, True, "line", False),
    "trainer, log_train + csv + tqdm": (False, True, "tqdm", False),
    "trainer, manual optimisation, log_train + csv": (False, True, None, True),
}


class StepClock(Callback):
    """CPU time at the end of each training step: the per-step cost without the fit's setup and teardown."""

    def __init__(self):
        self.ends: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        self.ends.append(time.process_time())


def lightning(steps: int, batch: int, width: int, variant: str = "trainer, log_train") -> tuple[float, float]:
    """(CPU time of the whole `trainer.fit`, of the steps after the first)."""
    per_step, logging, bar, manual = VARIANTS[variant]
    clock = StepClock()
    callbacks = {None: [], "line": [LineProgressBar()], "tqdm": [TQDMProgressBar()]}[bar] + [clock]
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as null, \
            contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        trainer = Trainer(max_steps=steps, accelerator="cpu", devices=1, enable_progress_bar=bar is not None,
                          callbacks=callbacks, enable_model_summary=False, enable_checkpointing=False,
                          num_sanity_val_steps=0, logger=RunCSVLogger(tmp) if logging else False, log_every_n_steps=50,
                          default_root_dir=tmp)
        model, loader = Regressor(width, per_step, manual), data(steps, batch)
        t = time.process_time()
        trainer.fit(model, loader)
        return time.process_time() - t, clock.ends[-1] - clock.ends[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--widths", default="512,1024", help="comma-separated hidden widths (step cost grows with width)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default="all", help=f"comma-separated Trainer variants, `all`, or `default` ({DEFAULT})")
    p.add_argument("--core", type=int, default=1, help="pin the process to this CPU core (-1: no pinning)")
    args = p.parse_args()
    variants = {"all": list(VARIANTS), "default": [DEFAULT]}.get(args.variants, args.variants.split(","))
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    if args.core >= 0:
        os.sched_setaffinity(0, {args.core})
    torch.set_num_threads(1)
    for variant in variants:
        lightning(20, args.batch, 64, variant)  # warm-up: imports, first-call costs
    rows = []
    for width in (int(w) for w in args.widths.split(",")):
        times: dict[str, list[tuple[float, float]]] = {"plain": [], **{v: [] for v in variants}}
        for r in range(args.repeats):  # interleaved, so machine noise hits all alike; the order flips every repeat
            order = ["plain", *variants]
            for name in order if r % 2 == 0 else order[::-1]:
                times[name].append(plain(args.steps, args.batch, width) if name == "plain"
                                   else lightning(args.steps, args.batch, width, name))
        base = statistics.median(t[0] for t in times["plain"])
        base_step = statistics.median(t[1] for t in times["plain"])
        for name, ts in times.items():
            med = statistics.median(t[0] for t in ts)
            step = statistics.median(t[1] for t in ts)
            per_step = [t[1] for t in ts]
            paired = "1" if name == "plain" else ratio_ci(per_step, [b[1] for b in times["plain"]])  # paired by repeat
            rows.append(f"| {width} | {name} | {med:.3f} | {med / base:.3f} | {1000 * step / (args.steps - 1):.2f} | "
                        f"{step / base_step:.3f} | {paired} |")
    print(f"\n{args.steps} steps, batch {args.batch}, 3-layer MLP, AdamW, 1 thread on core {args.core}, median of "
          f"{args.repeats} interleaved repeats (CPU time); log_every_n_steps 50. Whole run: the loop, or `trainer.fit` "
          "with its setup and teardown; per step: from the end of the first step to the end of the last\n")
    print("| MLP width | loop | whole run: median CPU s | ratio | per step: median CPU ms | ratio vs plain PyTorch | "
          "per step: mean of paired ratios [95% CI] |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
