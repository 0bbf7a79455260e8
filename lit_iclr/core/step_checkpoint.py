"""`ModelCheckpoint` whose every-n-steps save never falls between an epoch's last batch and the epoch's end.

Lightning saves an `every_n_train_steps` checkpoint in `on_train_batch_end`. At an epoch's last batch that file holds
an epoch with every batch trained but its end not run (no epoch-end hooks, schedulers or the next epoch's loader), and
Lightning resumes it by starting that epoch's batch counter again: the resumed run trains a batch of a fresh loader
iterator the uninterrupted run never saw, with the random state of before the next epoch's loader (VEA's 2-batch twin
epochs: every weight off by ~5e-4 after one resumed step). The save that would fall there is written after the
epoch's end instead, with the same step in its name: the state a resume continues exactly from (`RandomState` and
`GracefulFitLoop` treat it as an ended epoch), the same weights for a consumer that reads the step checkpoints.
"""
from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint


class StepCheckpoint(ModelCheckpoint):
    """Lightning's `ModelCheckpoint`, with a step save due at an epoch's last batch written at that epoch's end."""

    _deferred_step: int | None = None

    def _step_save_due(self, trainer) -> bool:
        return self._every_n_train_steps >= 1 and trainer.global_step % self._every_n_train_steps == 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._step_save_due(trainer) and trainer.fit_loop.epoch_loop._num_ready_batches_reached():
            self._deferred_step = trainer.global_step  # the epoch ends with this batch: saved in on_train_epoch_end
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        step, self._deferred_step = self._deferred_step, None
        if step == trainer.global_step and not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
        super().on_train_epoch_end(trainer, pl_module)
