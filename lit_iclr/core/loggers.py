"""A CSV logger that keeps metrics.csv across a resume or requeue (Lightning's deletes it when the folder exists)."""
from __future__ import annotations

import csv
import os

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
