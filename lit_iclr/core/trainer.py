"""The platform's Trainer: Lightning's, plus `prepare` (make or verify a config's data without training)."""
from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from .cuda_check import drop_failing_nvml_check
from .direct import DirectBatches, DirectOptimization
from .host_memory import keep_freed_host_memory
from .loader import LoaderPosition, RandomState
from .loggers import MetricsAtCheckpoint
from .signals import CheckpointOnSignal

drop_failing_nvml_check()  # after Lightning's import set the check


class Trainer(L.Trainer):
    """Lightning's Trainer; always tracks the training loader's position, the random state and the metric rows so
    mid-epoch resume is exact, and saves a checkpoint on SIGTERM / SIGUSR1. Lightning's per-step wrappers of the
    optimisation (`DirectOptimization`) and of the batch's way into the step (`DirectBatches`) are skipped where they
    would do nothing. Freed host memory is kept for the next step instead of being faulted in anew (`host_memory`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        keep_freed_host_memory()
        self.callbacks.extend([LoaderPosition(), RandomState(), MetricsAtCheckpoint(), CheckpointOnSignal(),
                                DirectOptimization(), DirectBatches()])

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
