"""A training DataLoader whose position survives a checkpoint, so `--ckpt_path last` continues mid-epoch exactly.

The shuffle order of epoch e depends only on (seed, e) (`EpochShuffleSampler`), and the loader reports how many batches
of the current epoch it has yielded through `state_dict()`, which Lightning stores in the checkpoint and hands back
through `load_state_dict()` on resume; the sampler then skips those samples. Under DDP each rank takes its share of
the same permutation.
"""
from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class EpochShuffleSampler(DistributedSampler):
    """Indices permuted by a generator seeded with `seed + epoch`, split across ranks like `DistributedSampler`.

    Being a `DistributedSampler`, Lightning keeps it under DDP instead of wrapping it in a second shuffle; the rank's
    share is `order[rank::world]`, so the union of all ranks' k-th batches is the single-process k-th batch of the
    same global size. `seed=None` follows `seed_everything` (PL_GLOBAL_SEED), as Lightning's own sampler does.
    """

    def __init__(self, n: int, shuffle: bool = True, seed: int | None = None):  # noqa: D107 - no process group needed
        self.n, self.shuffle, self._seed = n, shuffle, seed
        self.epoch = 0
        self.skip = 0
        self.drop_last = False

    @property
    def seed(self) -> int:
        return self._seed if self._seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))

    @staticmethod
    def _world() -> tuple[int, int]:
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
        return 1, 0

    def set_epoch(self, epoch: int) -> None:  # called by Lightning at the start of every epoch
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        world, rank = self._world()
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(self.n)
        pad = -self.n % world  # equal shares per rank, padded from the start as DistributedSampler does
        if pad:
            order = torch.cat([order, order[:pad]])
        share = order[rank::world]
        start, self.skip = self.skip, 0
        return iter(share[start:].tolist())

    def __len__(self) -> int:
        return math.ceil(self.n / self._world()[0])


class EveryIndexOnEveryRank(DistributedSampler):
    """Every index 0..n-1 on every rank, in order: an evaluation that each rank runs whole (a small set whose metric
    needs all of it at once, e.g. CKA), or of which the module takes its rank's share itself and reduces sums and counts
    (so a rank with no share still runs the evaluation, and its reduction, instead of being skipped by Lightning).
    A `DistributedSampler`, so Lightning keeps it under DDP instead of splitting the set."""

    def __init__(self, n: int):  # noqa: D107 - no process group needed
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class IndexDataset(Dataset):
    """0..n-1 as tensors: the data stream of methods whose batch is an index (an evaluation episode, an iteration)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


class TensorDictDataset(Dataset):
    """Rows of equally long tensors served as dicts (the keys say what each tensor is), `tensors[k][index]`.

    A DataLoader with a batch size fetches a batch through `__getitems__`: one index per tensor for the whole batch,
    instead of one dict of row views per sample and a collate that stacks them (at batch 32 that per-sample path cost
    more than the rest of a small model's step). Give the loader `collate_fn=collate_batched`, which passes that
    ready batch through.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], index: torch.Tensor | None = None):
        n = {len(v) for v in tensors.values()}
        if len(n) != 1:
            raise ValueError(f"TensorDictDataset: tensors of different lengths {sorted(n)}")
        self.tensors = {k: v[index] for k, v in tensors.items()} if index is not None else dict(tensors)
        self.n = len(next(iter(self.tensors.values())))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.tensors.items()}

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return {k: v[idx] for k, v in self.tensors.items()}


def collate_batched(batch):
    """`collate_fn` for datasets whose `__getitems__` returns the stacked batch (`TensorDictDataset`): passed through;
    a list of samples (a dataset without `__getitems__`) is collated as usual."""
    from torch.utils.data import default_collate

    return batch if isinstance(batch, dict) else default_collate(batch)


class ResumableDataLoader(DataLoader):
    """`DataLoader(dataset, batch_size, shuffle)` with an exactly restorable position (see module docstring).

    `consumed` (batches of the current epoch already trained on) is kept up to date by `LoaderPosition`, a callback the
    platform's Trainer always adds: the loader itself cannot tell, since Lightning fetches batches ahead of the step.
    """

    def __init__(self, dataset: Dataset, batch_size: int = 1, shuffle: bool = False, seed: int | None = None,
                 **kwargs: Any):
        self.seed = seed
        # Lightning re-creates the loader with its DistributedSampler under DDP (same seed + epoch permutation).
        sampler = kwargs.pop("sampler", None) or EpochShuffleSampler(len(dataset), shuffle, seed)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
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

    def on_train_start(self, trainer, pl_module) -> None:
        # Lightning hands the saved loader position over only while it creates the training loader, after restoring
        # the checkpoint. A module that reads `trainer.estimated_stepping_batches` in `configure_optimizers` makes it
        # create the loader before the restore, and the position would be dropped: hand it over now.
        trainer.fit_loop._load_combined_loader_states()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        loader = trainer.train_dataloader
        if isinstance(loader, ResumableDataLoader):
            loader.consumed = batch_idx + 1

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        loader = trainer.train_dataloader
        if isinstance(loader, ResumableDataLoader):
            loader.consumed = 0


class RandomState(Callback):
    """Saves the torch / numpy / python random states in every checkpoint and restores them when training resumes, so
    randomness drawn in `training_step` (noise, dropout, sampled times) continues the interrupted stream.

    They are restored just before the first resumed batch is fetched (after the sanity check and the loader's start,
    which draw from the same generators and would otherwise differ between an interrupted and an uninterrupted run; a
    dataset drawing its augmentation in `__getitem__` then draws what the run that went on drew); from a checkpoint
    written at an epoch's end, at the next epoch's start, before its loader iterator is created (as it was then).
    Stored as tensors and lists, so checkpoints still load with `weights_only=True`.
    """

    def __init__(self):
        self._pending: dict | None = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        checkpoint["lit_iclr_rng"] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                                      "numpy": [kind, keys.tolist(), pos, has_gauss, gauss]}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._pending = checkpoint.get("lit_iclr_rng")
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
        self._at_epoch_end = bool(progress) and progress["ready"] == progress["started"] == progress["processed"]

    def on_train_start(self, trainer, pl_module) -> None:
        # Saved inside an epoch: the run that went on fetched the next batch after the save (with the generators as
        # saved); this run's loader iterator exists already (made in setup_data), its first fetch is next.
        fetcher = trainer.fit_loop._data_fetcher
        if self._pending is not None and not getattr(self, "_at_epoch_end", False) and fetcher is not None \
                and fetcher.iterator is not None:
            fetcher.iterator = _RestoreAtFirstFetch(fetcher.iterator, self._restore_pending)

    def _restore_pending(self) -> None:
        if self._pending is not None:
            self._restore()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        # Saved at an epoch's end: the run that went on created the next epoch's loader iterator after the save, which
        # draws its base seed from the torch generator. Restore now and create the iterator again, as that run did.
        if self._pending is None or not getattr(self, "_at_epoch_end", False):
            return
        self._restore()
        fetcher = trainer.fit_loop._data_fetcher
        if fetcher is not None:
            iter(fetcher)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if self._pending is not None:
            self._restore()

    def _restore(self) -> None:
        state, self._pending = self._pending, None
        torch.set_rng_state(state["torch"])
        random.setstate(_tuples(state["python"]))
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))


@contextmanager
def random_state_kept():
    """Run a block (a dataset's generation) without changing the torch (CPU), numpy or python random state after it:
    a run that generates its data then trains on the same random stream as one that finds the data cached."""
    torch_state, np_state, py_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        np.random.set_state(np_state)
        random.setstate(py_state)


class _RestoreAtFirstFetch:
    """An iterator that calls `restore()` once, just before it fetches its first item from `it`."""

    def __init__(self, it, restore):
        self.it, self.restore = it, restore

    def __iter__(self):
        return self

    def __next__(self):
        if self.restore is not None:
            restore, self.restore = self.restore, None
            restore()
        return next(self.it)


def _tuples(value):
    """random.setstate wants the nested tuples that a checkpoint round trip may have turned into lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


class EpochMetrics(Callback):
    """Saves the running epoch aggregates of `self.log(..., on_epoch=True)` in training (Lightning's training
    `_ResultCollection`, which it does not checkpoint) and, resuming inside that epoch, adds them back, so the epoch's
    logged mean / sum / max / min covers every batch of the epoch, not only those after the resume.

    They are merged at the end of each resumed batch into the entries the resumed steps logged (value and batch count):
    `saved + new` is the addition the uninterrupted run made, so the epoch values are bit-equal. Each rank keeps its
    own aggregates (gathered at the save); a resume with another world size cannot split them and does not restore them.
    """

    KEY = "lit_iclr_epoch_metrics"
    _REDUCE = {torch.mean: "mean", torch.sum: "sum", sum: "sum", torch.max: "max", max: "max", torch.min: "min", min: "min"}

    def __init__(self):
        self._pending: dict | None = None

    @staticmethod
    def _running(trainer) -> dict:
        out = {}
        for key, m in trainer.fit_loop.epoch_loop._results.items():
            if not m.is_tensor or not m.meta.on_epoch or m.has_reset:
                continue
            reduce = EpochMetrics._REDUCE.get(m.meta.reduce_fx)
            if reduce is None:
                continue
            entry = {"reduce": reduce, "value": m.value.detach().cpu().clone()}
            if reduce == "mean":
                entry["count"] = m.cumulated_batch_size.detach().cpu().clone()
            out[key] = entry
        return out

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        running = self._running(trainer)
        ranks = [running]
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():  # every rank saves (dump_checkpoint)
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, running)
        checkpoint[self.KEY] = ranks

    def on_load_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
        inside = bool(progress) and not (progress["ready"] == progress["started"] == progress["processed"])
        ranks = checkpoint.get(self.KEY)
        self._pending = None
        if inside and ranks and len(ranks) == trainer.world_size:
            self._pending = dict(ranks[trainer.global_rank]) or None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._pending:
            return
        results = trainer.fit_loop.epoch_loop._results
        for key in [k for k in self._pending if k in results and not results[k].has_reset]:
            saved, m = self._pending.pop(key), results[key]
            value = saved["value"].to(m.value.device, m.value.dtype)
            if saved["reduce"] in ("mean", "sum"):
                m.value = value + m.value
                if saved["reduce"] == "mean":
                    m.cumulated_batch_size = saved["count"].to(m.cumulated_batch_size.device) + m.cumulated_batch_size
            else:
                m.value = (torch.maximum if saved["reduce"] == "max" else torch.minimum)(value, m.value)
            m._computed = None

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._pending = None  # a metric the resumed part of the epoch never logged
