"""Fixed (not trained) conformer representations as LightningModules with an `embed(mols)` method, so every
representation of the benchmark, fixed or learned, is called the same way."""
from __future__ import annotations

import numpy as np

from lit_iclr.core import BaseModule

from . import features


class MorganFingerprint(BaseModule):
    """2-D Morgan bits: the same for every conformer (geometry-blind); `chirality` adds stereo tags read from 3-D."""

    def __init__(self, radius: int = 2, n_bits: int = 2048, chirality: bool = False):
        super().__init__()
        self.save_hyperparameters()

    def embed(self, mols) -> np.ndarray:
        return features.morgan_bits(mols, self.hparams.radius, self.hparams.n_bits, self.hparams.chirality)


class DistanceHistogram(BaseModule):
    """Per element-pair histogram of interatomic distances: geometry-aware, reflection-invariant (chirality-blind)."""

    def __init__(self, n_bins: int = 24, r_max: float = 8.0):
        super().__init__()
        self.save_hyperparameters()

    def embed(self, mols) -> np.ndarray:
        return features.per_topology(features.distance_histogram, mols, n_bins=self.hparams.n_bins,
                                     r_max=self.hparams.r_max)


class ChiralHistogram(BaseModule):
    """Distance histogram + signed dihedral and signed chiral-volume histograms: flips under reflection."""

    def __init__(self, n_bins: int = 24, r_max: float = 8.0, n_angle_bins: int = 24):
        super().__init__()
        self.save_hyperparameters()

    def embed(self, mols) -> np.ndarray:
        return features.per_topology(features.chiral_histogram, mols, n_bins=self.hparams.n_bins,
                                     r_max=self.hparams.r_max, n_angle_bins=self.hparams.n_angle_bins)
