"""Interleaved timing for speed comparisons inside one process (e.g. eager against compiled).

Machines here are noisy, and a side that always runs first or second is biased by it. `interleaved_cpu_times` runs
the sides in blocks, flipping or rotating the order every round, and returns each side's CPU seconds per block. Pair
block k of one side with block k of another (`lit_iclr.core.stats.ratio_ci`) for the ratio and its CI.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

__all__ = ["PinnedWorker", "cpu_time", "fit_block_server", "interleaved_cpu_times"]


def cpu_time() -> float:
    """CPU seconds of this process (`time.process_time`, fine-grained) and its finished children (e.g. the C++ compiler
    runs that torch.compile starts; `os.times`, whole clock ticks)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def interleaved_cpu_times(blocks: Mapping[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Run each side's block once per round, the order rotating every round; CPU seconds per block, per side."""
    names = list(blocks)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = cpu_time()
            blocks[name]()
            out[name].append(cpu_time() - t0)
    return out


class PinnedWorker:
    """One side of a speed comparison in its own process, asked one JSON object a line on stdin and answering one on
    stdout (the benchmarks' `--worker` mode); with `core` set, the process and every thread it starts run on that core
    only (a runtime's own thread pool, XLA's for one, otherwise spreads over the machine)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | os.PathLike, core: int | None = None):
        pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(env), cwd=cwd, preexec_fn=pin)

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.args[1:]} exited with {self.proc.wait()}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def fit_block_server(proto, key: str = "steps", per_batch: int = 1):
    """A Lightning callback that serves timed blocks from inside one continuous `fit` (a speed benchmark's `cli.py
    fit` side): it reads {key: n} from stdin, lets n optimizer steps run (rounded up to whole Trainer batches of
    `per_batch` steps), then writes {"wall", "cpu", "first_step", "steps"} of that block to `proto` and reads the next
    request; stdin closing stops the fit. Time between blocks (the driver's turn) is not counted. `first_step` is the
    first block's wall time (it holds any compile), 0 after it."""
    import sys

    from lightning.pytorch.callbacks import Callback

    class FitBlockServer(Callback):
        def __init__(self):
            self.left, self.steps, self.first = 0, 0, True
            self.t0 = self.c0 = 0.0

        def next_block(self, trainer) -> None:
            line = sys.stdin.readline()
            if not line:
                trainer.should_stop = True
                self.left = -1
                return
            self.steps = -(-json.loads(line)[key] // per_batch) * per_batch
            self.left = self.steps
            self.t0, self.c0 = time.perf_counter(), time.process_time()  # from the end of the previous step

        def on_train_start(self, trainer, *args) -> None:
            self.next_block(trainer)

        def on_train_batch_end(self, trainer, *args) -> None:
            self.left -= per_batch
            if self.left != 0:
                return
            wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
            proto.write(json.dumps({"wall": wall, "cpu": cpu, "first_step": wall if self.first else 0.0,
                                    "steps": self.steps}) + "\n")
            proto.flush()
            self.first = False
            self.next_block(trainer)

    return FitBlockServer()
