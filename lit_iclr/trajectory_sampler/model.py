"""Predictors f_theta whose training trajectories become samplers (plain torch, no Lightning)."""
from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh, "gelu": nn.GELU}


class LandscapeMLP(nn.Module):
    """Scalar regressor f(x) on flattened inputs: bits (N, n), one-hot sequences (N, L, K) or points (N, d)."""

    def __init__(self, input_dim: int, hidden: int = 128, depth: int = 2, activation: str = "relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        layers, d = [], input_dim
        for _ in range(depth):
            layers += [nn.Linear(d, hidden), ACTIVATIONS[activation]()]
            d = hidden
        layers.append(nn.Linear(d, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1)).squeeze(-1)


class SmallCNN(nn.Module):
    """Classifier of (N, 1, H, W) or flattened (N, H*W) images: two conv blocks, global pooling, linear head."""

    def __init__(self, num_classes: int = 10, width: int = 16, image_size: int = 28):
        super().__init__()
        self.image_size = image_size
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.reshape(-1, 1, self.image_size, self.image_size)
        return self.head(self.features(x).flatten(1))
