"""Walsh-Fourier analysis on {0,1}^n: the mechanism check (early checkpoints carry low-degree energy first).

f(x) = sum_T fhat(T) chi_T(x), chi_T(x) = prod_{i in T} (2 x_i - 1); fhat(T) = 2^-n sum_x f(x) chi_T(x).
"""
from __future__ import annotations

import torch


def walsh_coefficients(values: torch.Tensor) -> torch.Tensor:
    """fhat (..., 2^n) from f on all of {0,1}^n (..., 2^n) in `landscapes.all_binary` order, by the fast
    Walsh-Hadamard transform (n butterfly stages, O(n 2^n)). Index T's bit i says i in T.

    Butterfly on (-1)^{popcount(T & x)}; chi_T(x) = (-1)^{|T|} (-1)^{popcount(T & x)}, so the sign is fixed below.
    """
    N = values.shape[-1]
    n = N.bit_length() - 1
    if 2**n != N:
        raise ValueError(f"expected 2^n values, got {N}")
    h = values.to(torch.float64).clone()
    lead = h.shape[:-1]
    for i in range(n):  # stage i pairs indices that differ in bit i
        h = h.reshape(*lead, N // 2 ** (i + 1), 2, 2**i)
        a, b = h[..., 0, :], h[..., 1, :]
        h = torch.stack([a + b, a - b], -2)
    h = h.reshape(*lead, N) / N
    return h * (-1.0) ** degrees(n).to(h)


def degrees(n: int) -> torch.Tensor:
    """|T| for every index T of the 2^n coefficients."""
    idx = torch.arange(2**n)
    return ((idx[:, None] >> torch.arange(n)) & 1).sum(-1)


def energy_per_degree(values: torch.Tensor) -> torch.Tensor:
    """sum_{|T| = d} fhat(T)^2 for d = 0..n: (..., n + 1)."""
    fhat = walsh_coefficients(values)
    n = fhat.shape[-1].bit_length() - 1
    deg = degrees(n).to(fhat.device)
    out = torch.zeros(*fhat.shape[:-1], n + 1, dtype=fhat.dtype, device=fhat.device)
    return out.index_add_(out.dim() - 1, deg, fhat**2)


def recovered_per_degree(values: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 - ||fhat_d - fhat*_d||^2 / ||fhat*_d||^2 per degree d (1: degree d learned exactly; NaN where f* has none)."""
    err = energy_per_degree(values - target)
    ref = energy_per_degree(target)
    return 1 - err / ref
