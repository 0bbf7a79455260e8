"""A small regression method used by the platform tests (resume, DDP, hub, CLI errors)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import OptimizerCallable
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lit_iclr.core import BaseDataModule, BaseModule, DatasetFormatError
from lit_iclr.core.loader import ResumableDataLoader


class ToyRegression(BaseModule):
    def __init__(self, num_features: int = 1, hidden: int = 16,
                 optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-2),
                 lr_step: int = 3, input_noise: float = 0.0):
        """
        Args:
            num_features: Input size (linked from the data).
            hidden: Hidden width.
            optimizer: Optimizer factory.
            lr_step: StepLR period in steps, so resume can be checked to restore the schedule.
            input_noise: Std of Gaussian noise added to the inputs in training (drawn from torch's generator), so
                resume can be checked to continue the random stream.
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        self.net = nn.Sequential(nn.Linear(num_features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x = batch["x"]
        if self.hparams.input_noise:
            x = x + self.hparams.input_noise * torch.randn_like(x)
        loss = nn.functional.mse_loss(self(x), batch["y"])
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", nn.functional.mse_loss(self(batch["x"]), batch["y"]), sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.log("test/loss", nn.functional.mse_loss(self(batch["x"]), batch["y"]))

    def configure_optimizers(self):
        opt = self.optimizer(self.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=self.hparams.lr_step, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class OtherToy(ToyRegression):
    """Another model class, to check that its checkpoints are refused by ToyRegression."""


class _Dict(TensorDataset):
    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return {"x": x, "y": y}


class ToyData(BaseDataModule):
    default_name = "toy"
    content_options = ("num_samples",)
    model_links = {"num_features": "num_features"}

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 8, num_workers: int = 0,
                 num_samples: int = 64, shuffle: bool = True):
        """
        Args:
            root: Folder holding toy.npz.
            data_dir: Cache for the generated default.
            batch_size: Batch size.
            num_workers: Loader workers.
            num_samples: Samples generated.
            shuffle: Shuffle the training set (seeded; resume restores the position).
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.num_features = 3

    def generate_default(self, out_dir: Path) -> None:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(self.num_samples, 3)).astype(np.float32)
        y = (np.sin(x[:, 0]) + x[:, 1] * x[:, 2]).astype(np.float32)
        np.savez(out_dir / "toy.npz", x=x, y=y)

    def setup(self, stage: str) -> None:
        f = self.path / "toy.npz"
        with np.load(f) as z:
            x, y = z["x"], z["y"]
        if np.isnan(x).any():
            raise DatasetFormatError(f, "NaN in x", "regenerate the file")
        self.ds = _Dict(torch.from_numpy(x), torch.from_numpy(y))

    def train_dataloader(self):
        return ResumableDataLoader(self.ds, batch_size=self.batch_size, shuffle=self.shuffle, num_workers=self.num_workers)

    def val_dataloader(self):
        return DataLoader(self.ds, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.ds, batch_size=self.batch_size)


class Crash(RuntimeError):
    pass


class CrashAtStep(Callback):
    """Simulates a pre-empted job: the process dies when step `step` is about to start (checkpoints so far remain)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise Crash(f"simulated crash at step {self.step}")


class SignalAtStep(Callback):
    """Sends `signal` to this process when step `step` is about to start (a scheduler's SIGTERM, `kill -USR1`)."""

    def __init__(self, step: int, signal: str = "SIGTERM"):
        self.step, self.signal = step, signal

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        import os
        import signal

        if trainer.global_step == self.step:
            os.kill(os.getpid(), getattr(signal, self.signal))


class MisconfiguredData(ToyData):
    """A DataModule whose constructor finds the data malformed (as readers that check metadata eagerly do)."""

    def __init__(self, root: str | None = None):
        super().__init__(root)
        raise DatasetFormatError("era5.zarr", "has no variable 'temperature'", "add it or drop it from `variables`")


class PauseAtStep(Callback):
    """Holds a run at step `step`: touches `ready`, then waits (at most `timeout` s) until `release` exists."""

    def __init__(self, step: int, ready: str, release: str, timeout: float = 120.0):
        self.step, self.ready, self.release, self.timeout = step, Path(ready), Path(release), timeout

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        import time

        if trainer.global_step != self.step:
            return
        self.ready.touch()
        end = time.monotonic() + self.timeout
        while not self.release.exists() and time.monotonic() < end:
            time.sleep(0.05)
