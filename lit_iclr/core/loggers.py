"""A CSV logger that keeps metrics.csv across a resume or requeue (Lightning's deletes it when the folder exists),
and drops the rows logged after the checkpoint a run resumes from."""
from __future__ import annotations

import csv
import os

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        # Resume appends to the rows already written instead of deleting them; the header is read back so new
        # metric names still trigger Lightning's header rewrite.
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                header = next(csv.reader(f), [])
            self.metrics_keys = sorted(set(self.metrics_keys) | set(header))


class RunCSVLogger(CSVLogger):
    """`CSVLogger` writing `metrics.csv` straight into the run folder and appending to it when a run resumes."""

    def __init__(self, save_dir: str, name: str = "", version: str = "", **kwargs):
        super().__init__(save_dir, name=name, version=version, **kwargs)

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def _csv_logger(trainer) -> RunCSVLogger | None:
    return next((lg for lg in trainer.loggers if isinstance(lg, RunCSVLogger)), None)


def _rows_in(path: str) -> list[list[str]]:
    if not os.path.isfile(path):
        return []
    with open(path, newline="") as f:
        return list(csv.reader(f))


class MetricsAtCheckpoint(Callback):
    """Keeps metrics.csv in step with the checkpoint a run resumes from.

    A checkpoint records how many metric rows had been logged when it was written. Resuming from it keeps those rows,
    and of the later ones only the rows of batches the checkpoint includes (the batch or epoch being checkpointed logs
    its row just after); rows of batches that are trained again are dropped, so no step has two values.

    Rows carry Lightning's logging step (`_batches_that_stepped`, one per batch), not `global_step` (one per optimizer
    step): a bandit's fit takes no optimizer step and SOOPER's takes ~14 per batch, so only the logging step says which
    rows a checkpoint covers.
    """

    @staticmethod
    def first_step_after(trainer) -> int:
        """The logging step of the first batch a run resumed from a checkpoint saved now trains.

        Lightning raises `_batches_that_stepped` after a batch's end hooks and its validation, and lowers it again only
        around the epoch-end row (`fit_loop.on_advance_end`). So a save inside a batch (batch end, a mid-epoch or
        epoch-end validation) sees the batch's own step, and a save in `on_train_epoch_end` (the epoch progress counts
        the epoch processed, not yet completed) sees the next one."""
        loop = trainer.fit_loop
        step = loop.epoch_loop._batches_that_stepped
        at_epoch_end = loop.epoch_progress.current.processed > loop.epoch_progress.current.completed
        return step if at_epoch_end or loop._should_accumulate() else step + 1

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        logger = _csv_logger(trainer)
        if logger is not None:
            written = max(len(_rows_in(logger.experiment.metrics_file_path)) - 1, 0)
            checkpoint["lit_iclr_metrics_rows"] = written + len(logger.experiment.metrics)
            checkpoint["lit_iclr_metrics_step"] = self.first_step_after(trainer)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        logger, logged = _csv_logger(trainer), checkpoint.get("lit_iclr_metrics_rows")
        if logger is None or logged is None or not trainer.is_global_zero:
            return
        path = logger.experiment.metrics_file_path
        rows = _rows_in(path)
        if len(rows) - 1 <= logged:
            return
        header, step_col = rows[0], rows[0].index("step") if "step" in rows[0] else None
        # checkpoints written before the logging step was recorded: global_step (equal for one optimizer step a batch)
        first = checkpoint.get("lit_iclr_metrics_step", checkpoint.get("global_step", 0))
        later = [r for r in rows[1 + logged:] if step_col is not None and r[step_col] != ""
                 and int(float(r[step_col])) < first]
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", newline="") as f:
            csv.writer(f).writerows([header, *rows[1:1 + logged], *later])
        os.replace(tmp, path)
