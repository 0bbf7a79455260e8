"""A module's torch CPU threads while it fits, validates or tests, and the process's setting restored afterwards.

Small CPU models (16-128 unit MLPs, 64x32 grids) spend more time in the intra-op thread pool's hand-offs than in
arithmetic, and on a shared or oversubscribed machine a second thread can multiply a step's CPU time; so a method may
fix its thread count as a config option. The count applies only while a Trainer drives the module on a CPU device, and
the setting it found is put back in `teardown`, so tests and notebooks that fit several modules in one process are not
left with another module's choice.

    class MyModule(LightningModule):
        def __init__(self, ..., num_threads: int | None = 1):
            check_num_threads(num_threads)
            self._threads = CpuThreads(num_threads)

        def setup(self, stage):
            self._threads.enter(self)

        def teardown(self, stage):
            self._threads.exit()
"""
from __future__ import annotations

import torch

from .errors import ConfigError


def check_num_threads(num_threads: int | None, option: str = "model.num_threads") -> int | None:
    """`num_threads` when it is a positive integer or None (torch's own setting), else a ConfigError naming `option`."""
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1):
        raise ConfigError(f"{option} must be a positive integer or null (torch's own setting), got {num_threads!r}")
    return num_threads


class CpuThreads:
    """Sets `torch.set_num_threads(n)` on `enter` (once, while on a CPU device) and restores the previous value on `exit`."""

    def __init__(self, num_threads: int | None):
        self.num_threads = check_num_threads(num_threads)
        self._before: int | None = None

    def enter(self, module=None) -> None:
        """Called from the module's `setup`; `module` (a LightningModule) limits it to runs on a CPU device."""
        if not self.num_threads or self._before is not None:
            return
        trainer = getattr(module, "_trainer", None) if module is not None else None
        if trainer is not None and trainer.strategy.root_device.type != "cpu":
            return  # GPU runs: the host threads only feed the device
        self._before = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)

    def exit(self) -> None:
        """Called from the module's `teardown`: the thread count the process had before `enter`."""
        if self._before is not None:
            torch.set_num_threads(self._before)
            self._before = None
