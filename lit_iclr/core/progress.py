"""A progress bar that prints whole lines when stdout is not a terminal (SLURM logs, CI), never carriage returns."""
from __future__ import annotations

import os
import sys
import time

from lightning.pytorch.callbacks import ProgressBar


def use_line_progress() -> bool:
    """Line-based when stdout is not a TTY (or LIT_ICLR_LINE_PROGRESS=1)."""
    forced = os.environ.get("LIT_ICLR_LINE_PROGRESS")
    if forced is not None:
        return forced == "1"
    return not sys.stdout.isatty()


class LineProgressBar(ProgressBar):
    """Prints `epoch e step s/N loss=...` every `every_seconds` seconds and at the end of each epoch."""

    def __init__(self, every_seconds: float = 10.0):
        super().__init__()
        self.every_seconds = every_seconds
        self._enabled = True
        self._last = 0.0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _line(self, trainer, pl_module, prefix: str, batch_idx: int | None = None) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        metrics = self.get_metrics(trainer, pl_module)
        shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in metrics.items() if k != "v_num")
        total = self.total_train_batches
        shown_batch = "-" if batch_idx is None else str(batch_idx + 1)
        if isinstance(total, int) and batch_idx is not None and batch_idx < total:
            shown_batch += f"/{total}"
        print(f"{prefix} epoch {trainer.current_epoch} batch {shown_batch} "
              f"step {trainer.global_step} {shown}".rstrip(), flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_seconds:
            self._last = now
            self._line(trainer, pl_module, "[train]", batch_idx)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._line(trainer, pl_module, "[train]")

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._line(trainer, pl_module, "[val]")
