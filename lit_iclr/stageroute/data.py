"""DataModule of the query stream: a workload (quality/cost table + model table) and the order queries arrive in.

Each training batch is the next `queries_per_step` query row indices; the module routes them one by one in order.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from lit_iclr.core.data import BaseDataModule
from lit_iclr.core.errors import ConfigError
from lit_iclr.core.loader import ResumableDataLoader

from .router import query_stream
from .workload import Workload, read_workload, write_workload

SOURCES = ("classifiers", "synthetic")


class _Stream(Dataset):
    def __init__(self, rows):
        self.rows = torch.as_tensor(rows, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i]


class RoutingData(BaseDataModule):
    """A routing workload read by `read_workload` (long table or RouterBench), streamed for `horizon` queries."""

    default_name = "stageroute"
    default_version = 1
    content_options = ("source", "classifiers", "train_images", "num_queries", "num_models", "seed")
    model_links = {"num_models": "num_models", "horizon": "horizon"}

    def __init__(self, root: str | None = None, data_dir: str = "data", source: str = "classifiers",
                 allow_pickle: bool = False, horizon: int = 20000, queries_per_step: int = 500,
                 classifiers: list[list] | None = None, train_images: int = 2000, num_queries: int = 2000,
                 num_models: int = 12, seed: int = 0):
        """
        Args:
            root: A folder with quality.parquet|quality.csv (+ models.csv), or RouterBench's `.pkl`/`.parquet`; null
                generates the default into `data_dir`.
            data_dir: Cache folder of the generated workload and of pickle conversions (`cache/`).
            source: Default generator: `classifiers` (timm models on Fashion-MNIST, measured FLOPs) or `synthetic`.
            allow_pickle: Read a RouterBench `.pkl` (a pickle can run code; it is converted once to a parquet cache in
                `data_dir`/cache/, keyed by the pickle's content hash).
            horizon: T, queries in the stream (drawn with replacement from the table's rows).
            queries_per_step: Queries routed per training step.
            classifiers: [timm name, epochs] pairs of the `classifiers` source (default: two tiny timm nets, 1 and 3 epochs).
            train_images: Fashion-MNIST training images of each classifier.
            num_queries: Rows of the generated table (test images, or synthetic queries).
            num_models: K of the `synthetic` source (set from the data otherwise).
            seed: Seed of the generator and of the query order.
        """
        super().__init__(root, data_dir, batch_size=queries_per_step, num_workers=0)
        if source not in SOURCES:
            raise ConfigError(f"data.init_args.source must be one of {SOURCES}, got {source!r}")
        if horizon < 1:
            raise ConfigError(f"data.init_args.horizon must be >= 1, got {horizon}")
        from .classifiers import DEFAULT_CLASSIFIERS

        self.source, self.allow_pickle, self.horizon, self.seed = source, allow_pickle, horizon, seed
        self.classifiers = [list(c) for c in (classifiers or DEFAULT_CLASSIFIERS)]
        self.train_images, self.num_queries = train_images, num_queries
        self.workload: Workload | None = None
        if root is not None and Path(root).exists():
            self.workload = read_workload(root, allow_pickle, Path(data_dir) / "cache")
            self.num_models = self.workload.num_models
        elif root is not None:  # not here (a cluster path, `cli.py plan`): K as configured; prepare_data says it is missing
            self.num_models = num_models
        else:
            self.num_models = len(self.classifiers) if source == "classifiers" else num_models

    def generate_default(self, out_dir: Path) -> None:
        if self.source == "synthetic":
            from .synthetic import synthetic_workload

            w = synthetic_workload(self.num_models, self.num_queries, seed=self.seed)
        else:
            from .classifiers import classifier_workload

            w = classifier_workload([tuple(c) for c in self.classifiers], self.train_images, self.num_queries, self.seed)
        write_workload(out_dir, w)

    def setup(self, stage: str | None = None) -> None:
        if self.workload is None:
            self.workload = read_workload(self.path, self.allow_pickle, Path(self.data_dir) / "cache")

    def train_dataloader(self) -> ResumableDataLoader:
        rows = query_stream(len(self.workload.quality), self.horizon, self.seed)
        return ResumableDataLoader(_Stream(rows), batch_size=self.batch_size, shuffle=False)

    def describe(self) -> str:
        return f"RoutingData: {self.path} ({self.source if self.root is None else 'user'} workload, T={self.horizon})"
