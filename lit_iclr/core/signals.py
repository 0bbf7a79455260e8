"""SIGTERM / SIGUSR1 save a checkpoint and stop, outside SLURM's requeue (where Lightning saves and requeues itself).

Without this, SIGTERM lets the epoch run to its end and stops silently, and SIGUSR1 (which `#SBATCH --signal` sends,
also to a run started by hand) kills the process with no checkpoint. Here either signal only sets a flag; the next
training batch end saves `<run>/checkpoints/last.ckpt` (with the loader position, so `--ckpt_path last` continues
exactly) and stops the fit, saying so in one line.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.environments import SLURMEnvironment

SIGNALS = ("SIGTERM", "SIGUSR1")


class CheckpointOnSignal(Callback):
    """On SIGTERM or SIGUSR1: save last.ckpt at the end of the current training batch, print one line, stop."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict[int, object] = {}

    def _handler(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def on_train_start(self, trainer, pl_module) -> None:
        env = trainer._accelerator_connector.cluster_environment
        if isinstance(env, SLURMEnvironment) and env.auto_requeue:
            return  # Lightning saves an HPC checkpoint and requeues the job
        for name in SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._handler)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.received is None:
            return
        ckpt = trainer.checkpoint_callback
        folder = Path(ckpt.dirpath) if ckpt is not None and ckpt.dirpath else Path(trainer.default_root_dir) / "checkpoints"
        path = folder / "last.ckpt"
        trainer.save_checkpoint(path)
        trainer.should_stop = True
        if trainer.is_global_zero:
            print(f"lit-iclr: {self.received} received: saved {path} at step {trainer.global_step}; "
                  "continue with `--ckpt_path last`", file=sys.stderr, flush=True)
        self.received = None

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
