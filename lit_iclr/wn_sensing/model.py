"""The two factorisations of a PSD estimate, as plain modules returning (X, Theta) with estimate = X Theta X^T."""
from __future__ import annotations

import torch
from torch import nn

from .manifold import random_stiefel
from .optim import mark_stiefel


class WNFactorization(nn.Module):
    """Generalised weight normalisation: X Theta X^T with X in St(m, r) (direction) and Theta in S^r (magnitude).

    Small initialisation as in the analysis: X_0 uniform on St(m, r), Theta_0 = `init_scale` * I_r.
    """

    def __init__(self, dim: int, rank: int, init_scale: float = 1e-3, seed: int = 0, dtype=torch.float64):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.x = mark_stiefel(nn.Parameter(random_stiefel(dim, rank, g, dtype)))
        self.theta = nn.Parameter(init_scale * torch.eye(rank, dtype=dtype))

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.theta


class BMFactorization(nn.Module):
    """Burer-Monteiro: Y Y^T with Y (m, r), small random init Y_0 = `init_scale` * G / sqrt(m), G_ij ~ N(0, 1)."""

    def __init__(self, dim: int, rank: int, init_scale: float = 1e-3, seed: int = 0, dtype=torch.float64):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.y = nn.Parameter(init_scale * torch.randn(dim, rank, generator=g, dtype=dtype) / dim ** 0.5)
        self.register_buffer("eye", torch.eye(rank, dtype=dtype), persistent=False)

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.y, self.eye
