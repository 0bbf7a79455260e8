"""`BaseModule.log_train`: per-step metrics summed on the device, written as window means on Lightning's logging steps."""
from __future__ import annotations

import csv

import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_iclr.core.loggers import RunCSVLogger
from lit_iclr.core.module import BaseModule
from lit_iclr.core.trainer import Trainer


class Logs(BaseModule):
    """Logs the step index k as `a` every step and 10 k as `b` on even steps only; never trains anything real."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.k = 0

    def training_step(self, batch, batch_idx):
        metrics = {"a": torch.tensor(float(self.k))}
        if self.k % 2 == 0:
            metrics["b"] = torch.tensor(10.0 * self.k)
        self.log_train(metrics, prog_bar=("a",))
        self.k += 1
        return (self.w * batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_means_over_each_window_on_the_logging_steps(tmp_path):
    loader = DataLoader(TensorDataset(torch.ones(12, 1)), batch_size=1)
    trainer = Trainer(max_steps=12, log_every_n_steps=4, logger=RunCSVLogger(str(tmp_path)), accelerator="cpu",
                      enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Logs(), loader)
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("a")]
    # windows of 4 steps: k = 0..3, 4..7, 8..11; `b` only from the even k of each window
    assert [int(r["step"]) for r in rows] == [3, 7, 11]
    assert [float(r["a"]) for r in rows] == [1.5, 5.5, 9.5]
    assert [float(r["b"]) for r in rows] == [10.0, 50.0, 90.0]
    assert float(trainer.progress_bar_metrics["a"]) == 9.5
    assert trainer.callback_metrics["a"].device.type == "cpu"


def test_no_trainer_no_logging():
    m = Logs()
    m.log_train({"a": torch.tensor(1.0)})  # outside a Trainer: nothing to log to, and no error
    assert "_train_metric_sums" not in m.__dict__
