"""PhysioNet/CinC 2012 forecasting DataModule: the real record files, or a generated default in that exact format."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from lit_iclr.core import BaseDataModule, DatasetFormatError
from lit_iclr.core.loader import ResumableDataLoader, TensorDictDataset, collate_batched

from .generator import DYNAMICS, generate_physionet
from .physionet import REFERENCE_VARIABLES, SERIES, load_records
from .protocol import records_to_samples, standardise

KEYS = ("x", "x_mask", "x_time", "y", "y_mask", "y_time")


class PhysioNet2012(BaseDataModule):
    default_name = "physionet2012"
    default_version = 3  # v2: post-admission Weight rows; v3: `dynamics` option, multi-scale records by default
    content_options = ("num_patients", "generator_seed", "dynamics")
    model_links = {"n_vars": "n_vars", "lookback_hours": "lookback_hours", "forecast_hours": "forecast_hours",
                   "record_hours": "record_hours"}

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 32, num_workers: int = 0,
                 num_patients: int = 3000, generator_seed: int = 0,
                 dynamics: Literal["multiscale", "v2"] = "multiscale", lookback_hours: float = 36.0,
                 forecast_hours: float = 3.0, record_hours: float = 48.0, resolution_minutes: int = 60,
                 variables: list[str] | None = None, split: Literal["sequential", "random"] = "sequential",
                 split_seed: int = 0, test_fraction: float = 0.1, val_fraction: float = 0.1, cache: bool = True):
        """
        Args:
            root: Folder holding PhysioNet 2012 `set-a/`, `set-b/`, `set-c/` record folders; null: generated default.
            data_dir: Cache folder where the generated default dataset (and the parsed-tensor cache) is written.
            batch_size: Samples per batch.
            num_workers: DataLoader worker processes.
            num_patients: Records written by the default generator.
            generator_seed: Seed of the default generator.
            dynamics: Latent dynamics of the default generator: `multiscale` (a 20-30 h wave + events every 8-12 h,
                structure at the periods ReIMTS's sub-samples see) or `v2` (the records of data version 2).
            lookback_hours: Input window: observations in [0, lookback) hours (benchmark: 36).
            forecast_hours: Targets: observed values in [lookback, lookback + forecast) hours (benchmark: 3).
            record_hours: Record length; timestamps are scaled to [0, 1] by it (benchmark: 48).
            resolution_minutes: Observations are averaged per bin of this many minutes (benchmark: 60, hourly).
            variables: Forecast series (names of the 36 variables and post-admission `Weight`); null: the reference
                code's set, the 37 series less MechVent (its recorded value is always 1).
            split: `sequential`: records in RecordID order, the last `test_fraction` for test and the last
                `val_fraction` of the rest for validation (the reference code's `train_test_split(shuffle=False)`);
                `random`: a seeded permutation first.
            split_seed: Seed of the `random` split.
            test_fraction: Share of records held out for test.
            val_fraction: Share of the remaining records used for validation (0.1 gives the 81/9/10 split).
            cache: Cache the parsed records as a `.pt` in `<data_dir>/cache` (keyed by the files' names, sizes, mtimes).
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.num_patients, self.generator_seed = num_patients, generator_seed
        if dynamics not in DYNAMICS:
            raise ValueError(f"data.dynamics must be one of {DYNAMICS}, got {dynamics!r}")
        self.dynamics = dynamics
        self.lookback_hours, self.forecast_hours, self.record_hours = lookback_hours, forecast_hours, record_hours
        self.resolution_minutes = resolution_minutes
        self.variable_names = list(REFERENCE_VARIABLES if variables is None else variables)
        unknown = sorted(set(self.variable_names) - set(SERIES))
        if unknown or not self.variable_names:
            raise ValueError(f"data.variables: unknown or empty {unknown}; choose from {', '.join(SERIES)}")
        if split not in ("sequential", "random"):
            raise ValueError(f"data.split must be 'sequential' or 'random', got {split!r}")
        self.split = split
        self.split_seed, self.test_fraction, self.val_fraction, self.cache = split_seed, test_fraction, val_fraction, cache
        self.n_vars = len(self.variable_names)
        self.splits: dict[str, TensorDictDataset] = {}

    @property
    def path(self) -> Path:
        if self.root is not None:
            return Path(self.root).expanduser()
        return self.generated_path(f"{self.default_name}-n{self.num_patients}-s{self.generator_seed}-v{self.default_version}")

    def generate_default(self, out_dir: Path) -> None:
        generate_physionet(out_dir, self.num_patients, self.generator_seed, dynamics=self.dynamics)

    def cache_dir(self) -> Path | None:
        """`<data_dir>/cache`: never inside the data folder (the user's real data is not written to)."""
        if not self.cache:
            return None
        return Path(self.data_dir) / "cache"

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        records = load_records(self.path, self.cache_dir())
        samples, dropped = records_to_samples(records, self.lookback_hours, self.forecast_hours, self.record_hours,
                                              self.resolution_minutes, self.variable_names)
        if dropped:
            rank_zero_warn(f"{len(dropped)} of {len(records.files)} records have no observation in the "
                           f"{self.lookback_hours} h lookback or the next {self.forecast_hours} h and are left out "
                           f"(e.g. {', '.join(dropped[:3])})")
        n = len(samples["record_id"])
        if n < 3:
            raise DatasetFormatError(self.path, f"only {n} usable records", "point `root` at the full record folders")
        # sizes as sklearn's train_test_split (test = ceil(n * fraction)), which the reference code uses
        n_test = max(1, math.ceil(n * self.test_fraction))
        n_val = max(1, math.ceil((n - n_test) * self.val_fraction))
        if self.split == "random":
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.split_seed))
            index = {"test": perm[:n_test], "val": perm[n_test:n_test + n_val], "train": perm[n_test + n_val:]}
        else:  # records are in RecordID order (`record_files` sorts them): train | val | test
            n_train = n - n_test - n_val
            index = {"train": torch.arange(n_train), "val": torch.arange(n_train, n_train + n_val),
                     "test": torch.arange(n_train + n_val, n)}
        self.mean, self.std = standardise(samples, index["train"])
        for k in KEYS:
            if not torch.isfinite(samples[k]).all():
                raise DatasetFormatError(self.path, f"non-finite values in `{k}` after standardisation",
                                         "check the records for extreme values")
        tensors = {k: samples[k] for k in (*KEYS, "record_id")}
        self.splits = {name: TensorDictDataset(tensors, idx) for name, idx in index.items()}

    def _loader(self, split: str) -> DataLoader:
        return DataLoader(self.splits[split], batch_size=self.batch_size, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0, collate_fn=collate_batched)

    def train_dataloader(self):
        # resumable: `--ckpt_path last` continues mid-epoch on the same batches (seeded by seed_everything)
        # whole batches by one index per tensor (TensorDictDataset.__getitems__), not 32 row dicts and a collate
        return ResumableDataLoader(self.splits["train"], batch_size=self.batch_size, shuffle=True,
                                   num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                                   collate_fn=collate_batched)

    def val_dataloader(self):
        return self._loader("val")

    def test_dataloader(self):
        return self._loader("test")

    def describe(self) -> str:
        sizes = ", ".join(f"{k} {len(v)}" for k, v in self.splits.items())
        return (f"PhysioNet 2012 records at {self.path} ({sizes}); {self.n_vars} variables, {self.lookback_hours} h "
                f"lookback -> observed values in the next {self.forecast_hours} h, {self.resolution_minutes}-min bins.")
