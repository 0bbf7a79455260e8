"""The Stiefel manifold St(m, r) = {X : X^T X = I_r}: tangent projection and retractions (embedded metric)."""
from __future__ import annotations

import torch

RETRACTIONS = ("qr", "polar")


def sym(b: torch.Tensor) -> torch.Tensor:
    """sym(B) = (B + B^T) / 2 over the last two dimensions."""
    return (b + b.transpose(-1, -2)) / 2


def tangent_project(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Riemannian gradient G = G~ - X sym(X^T G~): the Euclidean gradient projected on T_X St (X^T G + G^T X = 0)."""
    return g - x @ sym(x.transpose(-1, -2) @ g)


def retract(y: torch.Tensor, method: str = "qr") -> torch.Tensor:
    """A point of St(m, r) near Y = X - eta G: the Q factor of Y = QR with diag(R) > 0, or the polar factor U V^T."""
    if method == "qr":
        q, r = torch.linalg.qr(y)
        sign = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
        sign = torch.where(sign == 0, torch.ones_like(sign), sign)   # the sign fix makes the factor unique
        return q * sign.unsqueeze(-2)
    if method == "polar":
        u, _, vh = torch.linalg.svd(y, full_matrices=False)
        return u @ vh
    raise ValueError(f"unknown retraction {method!r}; choose one of {RETRACTIONS}")


def random_stiefel(m: int, r: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """X uniform on St(m, r) (Haar): the QR factor, sign-fixed, of a Gaussian m x r matrix."""
    return retract(torch.randn(m, r, generator=generator, dtype=dtype), "qr")
