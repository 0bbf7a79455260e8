"""CAMEx's curvature operator M_i, Kronecker-factored, applied to the matrix blocks of flat domain vectors.

CAMEx (Nguyen et al., ICLR 2025) merges E_hat = E_base + sum_i s_i M_i tau_i, where M_i is a learned curvature
(natural-gradient-like) preconditioner of expert i. For a weight block of shape (out, in) it reshapes tau into
(o1, o2, i1, i2) with o1*o2 = out, i1*i2 = in (factors nearest sqrt), and applies four small per-expert matrices, one per
axis, summed over `rank` terms; the factors start at the identity. We average over the rank instead of summing so that
M_i = I at initialisation for every rank (CAMEx's sum starts at rank * I; a choice recorded in seeds/namex.md).
Biases and any block not listed pass through unchanged (M_i = I there).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def nearest_factors(n: int) -> tuple[int, int]:
    """(a, b) with a * b = n and a the largest divisor of n not above sqrt(n)."""
    a = int(math.isqrt(n))
    while n % a:
        a -= 1
    return a, n // a


class KroneckerCurvature(nn.Module):
    """M_i tau_i for every expert i, on the blocks `blocks = [(offset, out, in), ...]` of a flat parameter vector."""

    def __init__(self, num_experts: int, blocks: list[tuple[int, int, int]], rank: int = 1):
        super().__init__()
        self.blocks = blocks
        self.factors = nn.ParameterList()
        for _, out_f, in_f in blocks:
            for d in (*nearest_factors(out_f), *nearest_factors(in_f)):
                self.factors.append(nn.Parameter(torch.eye(d).repeat(rank, num_experts, 1, 1)))

    def _apply_block(self, tau: Tensor, out_f: int, in_f: int, f: list[Tensor]) -> Tensor:
        lead = tau.shape[:-1]                                  # (U, n)
        o1, o2 = nearest_factors(out_f)
        i1, i2 = nearest_factors(in_f)
        t = tau.reshape(-1, lead[-1], o1, o2, i1, i2)
        t = torch.einsum("rnpa,unabcd->urnpbcd", f[0], t)      # one factor per axis of the reshaped block
        t = torch.einsum("rnqb,urnabcd->urnaqcd", f[1], t)
        t = torch.einsum("rnsc,urnabcd->urnabsd", f[2], t)
        t = torch.einsum("rntd,urnabcd->urnabct", f[3], t)
        return t.mean(1).reshape(*lead, out_f * in_f)          # average over the rank terms

    def forward(self, tau: Tensor) -> Tensor:
        """tau (..., n, P) -> M tau, same shape."""
        pieces, start = [], 0
        for j, (offset, out_f, in_f) in enumerate(self.blocks):
            pieces.append(tau[..., start:offset])
            end = offset + out_f * in_f
            pieces.append(self._apply_block(tau[..., offset:end], out_f, in_f, list(self.factors[4 * j: 4 * j + 4])))
            start = end
        pieces.append(tau[..., start:])
        return torch.cat(pieces, dim=-1)
