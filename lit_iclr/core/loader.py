"""A training DataLoader whose position survives a checkpoint, so `--ckpt_path last` continues mid-epoch exactly.

The shuffle order of epoch e depends only on (seed, e) (`EpochShuffleSampler`), and the loader reports how many batches
of the current epoch it has yielded through `state_dict()`, which Lightning stores in the checkpoint and hands back
through `load_state_dict()` on resume; the sampler then skips those samples. Under DDP Lightning swaps in its
`DistributedSampler`, which is seeded by epoch in the same way.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, Dataset, Sampler


class EpochShuffleSampler(Sampler[int]):
    """Indices 0..n-1, permuted by a generator seeded with `seed + epoch` (identity when `shuffle` is false)."""

    def __init__(self, n: int, shuffle: bool = True, seed: int = 0):
        self.n, self.shuffle, self.seed = n, shuffle, seed
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:  # called by Lightning at the start of every epoch
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(self.n)
        start, self.skip = self.skip, 0
        return iter(order[start:].tolist())

    def __len__(self) -> int:
        return self.n


class ResumableDataLoader(DataLoader):
    """`DataLoader(dataset, batch_size, shuffle)` with an exactly restorable position (see module docstring).

    `consumed` (batches of the current epoch already trained on) is kept up to date by `LoaderPosition`, a callback the
    platform's Trainer always adds: the loader itself cannot tell, since Lightning fetches batches ahead of the step.
    """

    def __init__(self, dataset: Dataset, batch_size: int = 1, shuffle: bool = False, seed: int = 0, **kwargs: Any):
        self.seed = seed
        super().__init__(dataset, batch_size=batch_size, sampler=EpochShuffleSampler(len(dataset), shuffle, seed),
                         **kwargs)
        self.consumed = 0

    def state_dict(self) -> dict[str, int]:
        epoch = self.sampler.epoch if isinstance(self.sampler, EpochShuffleSampler) else 0
        return {"epoch": epoch, "batches": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        skip = state["batches"] * (self.batch_size or 1)
        if isinstance(self.sampler, EpochShuffleSampler) and skip < len(self.sampler):  # else: the epoch had ended
            self.sampler.epoch = state["epoch"]
            self.sampler.skip = skip


class LoaderPosition(Callback):
    """Tells resumable training loaders how many batches of the epoch have been trained on."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        loader = trainer.train_dataloader
        if isinstance(loader, ResumableDataLoader):
            loader.consumed = batch_idx + 1

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        loader = trainer.train_dataloader
        if isinstance(loader, ResumableDataLoader):
            loader.consumed = 0
