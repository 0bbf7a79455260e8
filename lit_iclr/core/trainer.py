"""The platform's Trainer: Lightning's, plus `prepare` (make or verify a config's data without training)."""
from __future__ import annotations

import lightning as L
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.loops import _Loop
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.loops.utilities import _is_max_limit_reached
from lightning.pytorch.utilities import rank_zero_info

from .atomic import AtomicCheckpointIO
from .cuda_check import drop_failing_nvml_check
from .direct import DirectBatches, DirectOptimization
from .host_memory import keep_freed_host_memory
from .loader import EpochMetrics, LoaderPosition, RandomState
from .loggers import MetricsAtCheckpoint
from .signals import CheckpointOnSignal

drop_failing_nvml_check()  # after Lightning's import set the check


class GracefulEpochLoop(_TrainingEpochLoop):
    """Lightning's epoch loop, which also ends after the batch at which a graceful stop was saved (`core/signals.py`).

    Not through `trainer.should_stop`: that would run an extra validation after the batch, which a run that never
    stopped does not have."""

    @property
    def done(self) -> bool:
        return bool(self.trainer.fit_loop.graceful_stop) or super().done


class GracefulFitLoop(_FitLoop):
    """Lightning's fit loop, except that an epoch cut short by a graceful stop (a signal, or `max_steps` before the
    epoch's last batch) does not end: no epoch-end hooks, epoch metrics, epoch schedulers or checkpoints for part of
    an epoch. Its checkpoint (saved at the stopping batch) then resumes inside the epoch, exactly where it stopped."""

    graceful_stop: str | None = None

    @property
    def restarting(self) -> bool:
        return self._restarting

    @restarting.setter
    def restarting(self, restarting: bool) -> None:
        # Lightning restarts an epoch whenever `max_steps` is set, even one that had ended when it was saved: it then
        # trains an extra batch in the old epoch (or, with no validation, runs out the epochs without training). An
        # ended epoch is not restarted; the next one starts.
        p = self.epoch_progress.current
        unfinished = p.ready != p.processed or p.started != p.processed
        _Loop.restarting.fset(self, restarting and unfinished)

    def on_run_start(self) -> None:
        self.graceful_stop = None
        super().on_run_start()

    @property
    def done(self) -> bool:
        return bool(self.graceful_stop) or super().done

    def _cut_short(self) -> bool:
        loop = self.epoch_loop
        stopped = bool(self.graceful_stop) or _is_max_limit_reached(loop.global_step, self.max_steps)
        return stopped and not loop._num_ready_batches_reached()

    def on_advance_end(self) -> None:
        if self._cut_short():
            return
        super().on_advance_end()


class Trainer(L.Trainer):
    """Lightning's Trainer; always tracks the training loader's position, the random state, the metric rows and the
    running epoch aggregates of logged metrics so mid-epoch resume is exact, and saves a checkpoint on SIGTERM /
    SIGUSR1 or at `max_steps` inside an epoch from which
    resuming equals never stopping (`GracefulFitLoop`); checkpoint files are written atomically (`core/atomic.py`).
    Lightning's per-step wrappers of the
    optimisation (`DirectOptimization`) and of the batch's way into the step (`DirectBatches`) are skipped where they
    would do nothing. Freed host memory is kept for the next step instead of being faulted in anew (`host_memory`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        epoch_loop = GracefulEpochLoop(self, min_steps=self.fit_loop.epoch_loop.min_steps, max_steps=self.max_steps)
        self.fit_loop = GracefulFitLoop(self, min_epochs=self.fit_loop.min_epochs, max_epochs=self.fit_loop.max_epochs)
        self.fit_loop.epoch_loop = epoch_loop
        if type(self.strategy.checkpoint_io) is TorchCheckpointIO:  # a plugin the user chose is kept
            self.strategy.checkpoint_io = AtomicCheckpointIO()
        keep_freed_host_memory()
        self.callbacks.extend([LoaderPosition(), RandomState(), EpochMetrics(), MetricsAtCheckpoint(),
                               CheckpointOnSignal(), DirectOptimization(), DirectBatches()])

    def prepare(self, model: L.LightningModule, datamodule: L.LightningDataModule) -> None:
        """Generate (or check) the config's dataset and read it back once through the real reader; no training.

        Args:
            model: The configured model (unused; parsed so the same config works for every subcommand).
            datamodule: The DataModule whose data is prepared.
        """
        datamodule.trainer = self
        datamodule.prepare_data()
        datamodule.setup("fit")
        describe = getattr(datamodule, "describe", None)
        rank_zero_info(describe() if describe else f"{type(datamodule).__name__}: ready")
