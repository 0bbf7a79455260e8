"""Lightning's overhead: the same model, data and optimizer trained N steps through the platform's Trainer and through a
plain PyTorch loop, interleaved in one run; prints a markdown table of the time ratio (target <= 1.10). Times are the
process's CPU time (single-threaded), so the waits of a shared machine's scheduler are not counted.

Trainer variants: `self.log` of the loss every step (Lightning's usual way: per-call bookkeeping and, for a progress-bar
metric, a `.item()` per step), the platform's `log_train` (summed on the device, logged every `log_every_n_steps`),
with the CSV logger, and with a progress bar (the platform's line bar for logs; tqdm, Lightning's terminal bar, to
/dev/null).

    .venv/bin/python benchmarks/platform_overhead.py [--steps 300] [--repeats 3] [--widths 512,1024]

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
from lightning.pytorch.callbacks import TQDMProgressBar
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_iclr.core.loggers import RunCSVLogger
from lit_iclr.core.module import BaseModule
from lit_iclr.core.progress import LineProgressBar
from lit_iclr.core.trainer import Trainer


def make_net(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))


class Regressor(BaseModule):
    def __init__(self, width: int, per_step_log: bool = False):
        super().__init__()
        self.net = make_net(width)
        self.per_step_log = per_step_log

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
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


def plain(steps: int, batch: int, width: int) -> float:
    net, loader = make_net(width), data(steps, batch)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    t = time.process_time()
    for x, y in loader:
        loss = nn.functional.mse_loss(net(x).squeeze(-1), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.process_time() - t


VARIANTS = {  # name: (self.log every step, CSV logger, progress bar)
    "trainer, self.log every step": (True, True, None),
    "trainer, log_train": (False, False, None),
    "trainer, log_train + csv": (False, True, None),
    "trainer, log_train + csv + line bar": (False, True, "line"),
    "trainer, log_train + csv + tqdm": (False, True, "tqdm"),
}


def lightning(steps: int, batch: int, width: int, variant: str = "trainer, log_train") -> float:
    per_step, logging, bar = VARIANTS[variant]
    callbacks = {None: [], "line": [LineProgressBar()], "tqdm": [TQDMProgressBar()]}[bar]
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as null, \
            contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        trainer = Trainer(max_steps=steps, accelerator="cpu", devices=1, enable_progress_bar=bar is not None,
                          callbacks=callbacks, enable_model_summary=False, enable_checkpointing=False,
                          num_sanity_val_steps=0, logger=RunCSVLogger(tmp) if logging else False, log_every_n_steps=50,
                          default_root_dir=tmp)
        model, loader = Regressor(width, per_step), data(steps, batch)
        t = time.process_time()
        trainer.fit(model, loader)
        return time.process_time() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--widths", default="512,1024", help="comma-separated hidden widths (step cost grows with width)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    for variant in VARIANTS:
        lightning(20, args.batch, 64, variant)  # warm-up: imports, first-call costs
    rows = []
    for width in (int(w) for w in args.widths.split(",")):
        times: dict[str, list[float]] = {"plain": [], **{v: [] for v in VARIANTS}}
        for _ in range(args.repeats):  # interleaved, so machine noise hits all alike
            times["plain"].append(plain(args.steps, args.batch, width))
            for variant in VARIANTS:
                times[variant].append(lightning(args.steps, args.batch, width, variant))
        base = statistics.median(times["plain"])
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append(f"| {width} | {name} | {med:.3f} | {1000 * med / args.steps:.2f} | {med / base:.3f} |")
    print(f"\n{args.steps} steps, batch {args.batch}, 3-layer MLP, AdamW, 1 thread, median of {args.repeats} interleaved "
          "repeats (CPU time); log_every_n_steps 50\n")
    print("| MLP width | loop | median CPU time (s) | ms / step | ratio vs plain PyTorch |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
