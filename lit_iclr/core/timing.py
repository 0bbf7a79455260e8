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

__all__ = ["cpu_time", "interleaved_cpu_times"]


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
