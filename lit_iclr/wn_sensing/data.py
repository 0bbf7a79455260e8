"""DataModule of a matrix-sensing problem: a generated `problem.npz` (or the user's), read back by `read_problem`.

Training is full-batch: every "batch" is one iteration over all n measurements, so the loader yields step indices
(`steps_per_epoch` per epoch) and the problem itself stays in memory. Under DDP every rank computes the same full
gradient (the averaged one is one process's), so each rank is dealt `steps_per_epoch` indices, and validation, one
evaluation of the iterate against the target, runs whole on every rank (`EveryIndexOnEveryRank`): split by Lightning,
its single index left rank 1 with no batch.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

from lit_iclr.core.data import BaseDataModule
from lit_iclr.core.errors import ConfigError
from lit_iclr.core.loader import EveryIndexOnEveryRank, IndexDataset, ResumableDataLoader

from .problem import TARGETS, Problem, degrees_of_freedom, generate, read_problem
from .sensing import OPERATORS


class SensingData(BaseDataModule):
    """Matrix sensing y = M(A) of a PSD rank-r_A matrix A (synthetic or made from a photograph), as `problem.npz`."""

    default_name = "wn-sensing"
    default_version = 1
    content_options = ("dim", "true_rank", "condition_number", "measurements_per_dof", "noise", "operator", "target",
                       "image", "seed")
    model_links = {"dim": "dim", "true_rank": "true_rank"}

    def __init__(self, root: str | None = None, data_dir: str = "data", dim: int = 40, true_rank: int = 3,
                 condition_number: float = 4.0, measurements_per_dof: float = 8.0, noise: float = 0.0,
                 operator: str = "gaussian", target: str = "synthetic", image: str = "china.jpg", seed: int = 0,
                 steps_per_epoch: int = 100):
        """
        Args:
            root: A `problem.npz` (or a folder holding one) with `sensing`, `operator`, `y` and optionally `target`;
                null generates the default problem into `data_dir`.
            data_dir: Cache folder for the generated problem.
            dim: m, the side of the m x m target (generated problems only; read from the file otherwise).
            true_rank: r_A, the rank of the target (generated problems only; null for a user's problem).
            condition_number: sigma_1 / sigma_{r_A} of the synthetic target (eigenvalues geometric from 1).
            measurements_per_dof: n / (m r_A - r_A (r_A - 1) / 2), the oversampling of the degrees of freedom.
            noise: Gaussian measurement noise, as a fraction of ||A||_F / sqrt(n) per measurement.
            operator: `gaussian` (dense symmetric Gaussian M_i, RIP) or `rank_one` (M_i = a_i a_i^T, structured).
            target: `synthetic` (random low-rank) or `image` (top eigenpairs of a photograph's row Gram matrix).
            image: scikit-learn sample image used when target is `image` (`china.jpg` or `flower.jpg`).
            seed: Seed of the target, the operator and the noise.
            steps_per_epoch: Full-gradient iterations per epoch.
        """
        super().__init__(root, data_dir, batch_size=1, num_workers=0)
        if operator not in OPERATORS:
            raise ConfigError(f"data.init_args.operator must be one of {OPERATORS}, got {operator!r}")
        if target not in TARGETS:
            raise ConfigError(f"data.init_args.target must be one of {TARGETS}, got {target!r}")
        if steps_per_epoch <= 0:
            raise ConfigError(f"data.init_args.steps_per_epoch must be positive, got {steps_per_epoch}")
        self.condition_number, self.measurements_per_dof, self.noise = condition_number, measurements_per_dof, noise
        self.operator, self.target, self.image, self.seed = operator, target, image, seed
        self.steps_per_epoch = steps_per_epoch
        self.dim, self.true_rank = dim, true_rank
        if root is not None:  # sizes come from the user's file (its header only)
            problem = read_problem(root)
            self.dim, self.true_rank = problem.dim, None
        self.problem: Problem | None = None

    def generate_default(self, out_dir: Path) -> None:
        arrays = generate(self.dim, self.true_rank, self.condition_number, self.measurements_per_dof, self.noise,
                          self.operator, self.target, self.image, self.seed)
        np.savez(out_dir / "problem.npz", **arrays)

    def setup(self, stage: str | None = None) -> None:
        if self.problem is not None:
            return
        self.problem = read_problem(self.path)
        rank = self.true_rank
        if rank is not None and self.problem.op.n < degrees_of_freedom(self.problem.dim, rank):
            warnings.warn(
                f"{self.path}: {self.problem.op.n} measurements for {degrees_of_freedom(self.problem.dim, rank)} degrees of "
                f"freedom of a rank-{rank} matrix: A is not identifiable, the fit will match y without recovering A; "
                "raise measurements_per_dof above 1 (recovery typically needs 3 or more)", stacklevel=2)

    def _world(self) -> int:
        return self.trainer.world_size if self.trainer is not None else 1

    def train_dataloader(self) -> ResumableDataLoader:
        # the training sampler deals index i to rank i % world: steps_per_epoch iterations per epoch on every rank
        return ResumableDataLoader(IndexDataset(self.steps_per_epoch * self._world()), batch_size=1, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(IndexDataset(1), batch_size=1, sampler=EveryIndexOnEveryRank(1))

    def test_dataloader(self) -> DataLoader:
        return DataLoader(IndexDataset(1), batch_size=1, sampler=EveryIndexOnEveryRank(1))

    def describe(self) -> str:
        return (f"SensingData: {self.path} ({self.operator} operator, {self.target} rank-{self.true_rank} target, "
                f"m={self.dim}, {self.measurements_per_dof} measurements per degree of freedom)")
