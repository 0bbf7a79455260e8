"""Graceful stops (SIGTERM, SIGUSR1, `max_steps`) that save the position inside the epoch, so resuming equals never stopping.

Either signal only sets a flag (also under SLURM, where Lightning's own handler would write an `hpc_ckpt` at whatever
instant the signal lands, mid-step). At the end of the training batch then running, `last.ckpt` is saved, as
`ModelCheckpoint` saves a mid-epoch checkpoint: the epoch is not finished and the loader position holds the batches
trained on. The fit stops there without ending the epoch (`GracefulFitLoop` in `core/trainer.py`): no epoch-end hooks,
metrics or checkpoints for a part of an epoch, so `--ckpt_path last` continues the same epoch. A signal arriving at the
epoch's last batch lets the epoch end first and saves after it. Under SLURM with auto-requeue, SIGUSR1 (the
`--signal` of `scripts/slurm/fit.sbatch`) then requeues the job, which resumes in the same run folder.

`max_steps` reached before the epoch's end is the same kind of stop: the checkpoint is saved at that batch, and the
unfinished epoch is not ended, so a resume with a larger `max_steps` equals a run that was given it from the start.

Under DDP the flag is reduced over the ranks at every batch end, so all ranks save and stop at the same step.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.plugins.environments import SLURMEnvironment

SIGNALS = ("SIGTERM", "SIGUSR1")


def _slurm_job_id() -> str | None:
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job is not None and "SLURM_ARRAY_TASK_ID" in os.environ:
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def requeue_slurm_job() -> str:
    """`scontrol requeue <job id>` (what Lightning's SLURM handler runs); returns a short account of what happened."""
    job = _slurm_job_id()
    if not job or not re.fullmatch(r"[0-9_]+", job):
        return "no SLURM job id to requeue"
    try:
        rc = subprocess.call(["scontrol", "requeue", job])
    except FileNotFoundError:
        return f"scontrol not found: job {job} not requeued"
    return f"requeued SLURM job {job}" if rc == 0 else f"`scontrol requeue {job}` failed (exit {rc})"


class CheckpointOnSignal(Checkpoint):
    """On SIGTERM or SIGUSR1, or at `max_steps` before the epoch's end: save last.ckpt at the end of the batch, stop.

    A `Checkpoint` callback, so Lightning runs its epoch-end hook after `ModelCheckpoint`'s (a stop at the epoch's last
    batch is saved after the whole epoch end).
    """

    def __init__(self):
        self.received: str | None = None
        self._previous: dict[int, object] = {}
        self._stop_after_epoch: str | None = None
        self._stopped_at: int | None = None

    def _handler(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def _signals(self, trainer) -> list[int]:
        sigs = [getattr(signal, name) for name in SIGNALS if hasattr(signal, name)]
        env = trainer._accelerator_connector.cluster_environment
        if isinstance(env, SLURMEnvironment) and env.requeue_signal is not None and env.requeue_signal not in sigs:
            sigs.append(env.requeue_signal)
        return sigs

    def on_train_start(self, trainer, pl_module) -> None:
        self.received, self._stop_after_epoch, self._stopped_at = None, None, None
        for sig in self._signals(trainer):
            self._previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._handler)

    def _received_on_any_rank(self, trainer) -> str | None:
        if trainer.world_size > 1:
            anywhere = trainer.strategy.reduce_boolean_decision(self.received is not None, all=False)
            return (self.received or "SIGTERM") if anywhere else None
        return self.received

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        received = self._received_on_any_rank(trainer)
        epoch_ends = trainer.fit_loop.epoch_loop._num_ready_batches_reached()
        if received is not None:
            self.received = None
            trainer.fit_loop.graceful_stop = received  # the fit ends after this batch, or after this epoch's end
            if epoch_ends:  # the epoch ends with this batch: end it (hooks, metrics, schedulers), then save
                self._stop_after_epoch = received
                return
            self._stopped_at = trainer.global_step
            self._report(trainer, received, self.save_last(trainer))
        elif (trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps and not epoch_ends
              and any(isinstance(c, ModelCheckpoint) for c in trainer.checkpoint_callbacks)):
            # a planned end of the run: saved only where checkpointing is on (`enable_checkpointing=False` writes no
            # file; before, it wrote <default_root_dir>/checkpoints/last.ckpt, the working directory by default)
            self._stopped_at = trainer.global_step
            self.save_last(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        # The stopping batch was also a validation batch: save again after it, as `ModelCheckpoint` does at a validation
        # end (what validation drew from the random generators is then in the checkpoint, and it is not run twice).
        if self._stopped_at is not None and self._stopped_at == trainer.global_step and not trainer.sanity_checking:
            self.save_last(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self._stop_after_epoch is None:
            return
        received, self._stop_after_epoch = self._stop_after_epoch, None
        # saved again even when a batch-end checkpoint exists at this step: that one would resume past the epoch's end
        self._report(trainer, received, self.save_last(trainer))

    @staticmethod
    def save_last(trainer) -> Path:
        """Save `last.ckpt` now (through `ModelCheckpoint`, so it records the save and writes no second one at this
        step); returns its path."""
        ckpt = trainer.checkpoint_callback
        if isinstance(ckpt, ModelCheckpoint) and ckpt.dirpath:
            if ckpt.save_last is True:
                ckpt._save_last_checkpoint(trainer, ckpt._monitor_candidates(trainer))
                return Path(ckpt.last_model_path)
            path = Path(ckpt.dirpath) / f"{ckpt.CHECKPOINT_NAME_LAST}{ckpt.FILE_EXTENSION}"
            ckpt._save_checkpoint(trainer, str(path))
            return path
        path = Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"
        trainer.save_checkpoint(path)
        return path

    @staticmethod
    def _report(trainer, received: str, path: Path) -> None:
        env = trainer._accelerator_connector.cluster_environment
        requeue = ""
        if isinstance(env, SLURMEnvironment) and env.auto_requeue and received == getattr(
                env.requeue_signal, "name", "SIGUSR1") and trainer.is_global_zero:
            requeue = f"; {requeue_slurm_job()}"
        if trainer.is_global_zero:
            print(f"lit-iclr: {received} received: saved {path} at step {trainer.global_step}{requeue}; "
                  "continue with `--ckpt_path last`", file=sys.stderr, flush=True)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
