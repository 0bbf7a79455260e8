"""Common corruptions in the style of ImageNet-C (Hendrycks & Dietterich, 2019), for 28 x 28 grey images in [0, 1].

Each corruption has five severities whose parameters are ImageNet-C's, rescaled to 28-pixel images where they are
spatial (blur sigma, pixelation size). Noise is drawn from a seeded generator, so a (corruption, severity) pair always
yields the same test set. Used zero-shot: models never see corrupted images in training.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

SEVERITIES = (1, 2, 3, 4, 5)


def _gaussian_noise(x: Tensor, s: int, g: torch.Generator) -> Tensor:
    c = (0.08, 0.12, 0.18, 0.26, 0.38)[s - 1]
    return x + c * torch.randn(x.shape, generator=g)


def _shot_noise(x: Tensor, s: int, g: torch.Generator) -> Tensor:
    c = (60.0, 25.0, 12.0, 5.0, 3.0)[s - 1]            # photons per unit intensity
    return torch.poisson(x * c, generator=g) / c


def _impulse_noise(x: Tensor, s: int, g: torch.Generator) -> Tensor:
    amount = (0.03, 0.06, 0.09, 0.17, 0.27)[s - 1]     # salt-and-pepper fraction
    u = torch.rand(x.shape, generator=g)
    salt = torch.rand(x.shape, generator=g) < 0.5
    return torch.where(u < amount, salt.to(x.dtype), x)


def _gaussian_blur(x: Tensor, s: int, g: torch.Generator) -> Tensor:
    sigma = (0.4, 0.6, 0.8, 1.0, 1.3)[s - 1]
    r = int(3 * sigma + 0.5)
    t = torch.arange(-r, r + 1, dtype=x.dtype)
    k = torch.exp(-(t**2) / (2 * sigma**2))
    k = k / k.sum()
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="reflect"), k.view(1, 1, 1, -1))   # separable: rows, then columns
    return F.conv2d(F.pad(x, (0, 0, r, r), mode="reflect"), k.view(1, 1, -1, 1))


def _contrast(x: Tensor, s: int, g: torch.Generator) -> Tensor:
    c = (0.4, 0.3, 0.2, 0.1, 0.05)[s - 1]
    mean = x.mean(dim=(-1, -2), keepdim=True)
    return (x - mean) * c + mean


def _brightness(x: Tensor, s: int, g: torch.Generator) -> Tensor:
    return x + (0.1, 0.2, 0.3, 0.4, 0.5)[s - 1]


def _pixelate(x: Tensor, s: int, g: torch.Generator) -> Tensor:
    size = (21, 17, 14, 11, 8)[s - 1]
    small = F.interpolate(x, size=(size, size), mode="area")
    return F.interpolate(small, size=x.shape[-2:], mode="nearest")


CORRUPTIONS = {
    "gaussian_noise": _gaussian_noise, "shot_noise": _shot_noise, "impulse_noise": _impulse_noise,
    "gaussian_blur": _gaussian_blur, "contrast": _contrast, "brightness": _brightness, "pixelate": _pixelate,
}


def corrupt(images: Tensor, name: str, severity: int, seed: int = 0) -> Tensor:
    """Corrupt float images (N, C, H, W) in [0, 1]; returns a new tensor clipped to [0, 1]."""
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; known: {', '.join(CORRUPTIONS)}")
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be in {SEVERITIES}, got {severity}")
    g = torch.Generator().manual_seed(seed * 1000 + list(CORRUPTIONS).index(name) * 10 + severity)
    return CORRUPTIONS[name](images.float(), severity, g).clamp(0.0, 1.0)
