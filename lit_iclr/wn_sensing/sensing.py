"""The linear sensing operator M: S^m -> R^n, y_i = <M_i, A>, applied without a loop over measurements.

Two operators:
- `gaussian`: M_i = (G_i + G_i^T) / (2 sqrt(n)) with G_i i.i.d. N(0, 1). Then E ||M(Z)||^2 = ||Z||_F^2 for symmetric Z,
  the isotropy behind the restricted isometry property. Stored as one (n, m*m) matrix: M(Z) is a single matvec and
  M*(r) a single vecmat, so nothing of size n x m x m is ever formed per step.
- `rank_one`: M_i = a_i a_i^T with a_i ~ N(0, I_m) / (2 n)^(1/4) (structured measurements, as in phase retrieval).
  Only the (n, m) vectors are stored: M(X Theta X^T)_i = (a_i^T X) Theta (X^T a_i), so the m x m matrix is never formed
  either. Rank-one measurements satisfy an l1/l2 RIP only, so the l2 theory of the paper covers `gaussian`.
"""
from __future__ import annotations

import math

import torch

OPERATORS = ("gaussian", "rank_one")


def sample_operator(kind: str, n: int, m: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """The operator's tensor: (n, m*m) for `gaussian`, (n, m) for `rank_one`."""
    if kind == "gaussian":
        g = torch.randn(n, m, m, generator=generator, dtype=dtype)
        return ((g + g.transpose(1, 2)) / (2 * math.sqrt(n))).reshape(n, m * m)
    if kind == "rank_one":
        return torch.randn(n, m, generator=generator, dtype=dtype) / (2 * n) ** 0.25
    raise ValueError(f"unknown sensing operator {kind!r}; choose one of {OPERATORS}")


class SensingOperator:
    """M and its adjoint M* for one operator tensor (see the module docstring for the two kinds)."""

    def __init__(self, kind: str, tensor: torch.Tensor, dim: int):
        if kind not in OPERATORS:
            raise ValueError(f"unknown sensing operator {kind!r}; choose one of {OPERATORS}")
        self.kind, self.tensor, self.dim = kind, tensor, dim
        self.n = tensor.shape[0]

    def to(self, device=None, dtype=None) -> SensingOperator:
        return SensingOperator(self.kind, self.tensor.to(device=device, dtype=dtype), self.dim)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """M(Z) for a symmetric m x m matrix Z."""
        if self.kind == "gaussian":
            return self.tensor @ z.reshape(-1)
        return torch.einsum("ij,jk,ik->i", self.tensor, z, self.tensor)

    def factored(self, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """M(X Theta X^T) for X (m, r), Theta (r, r); the rank-one kind never forms the m x m product."""
        if self.kind == "gaussian":
            return self(x @ theta @ x.T)
        b = self.tensor @ x                       # (n, r): a_i^T X for every i at once
        return ((b @ theta) * b).sum(-1)

    def adjoint(self, r: torch.Tensor) -> torch.Tensor:
        """M*(r) = sum_i r_i M_i (symmetric m x m)."""
        if self.kind == "gaussian":
            return (r @ self.tensor).reshape(self.dim, self.dim)
        return (self.tensor * r[:, None]).T @ self.tensor


def loss(op: SensingOperator, y: torch.Tensor, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """f(X, Theta) = 1/4 ||M(X Theta X^T) - y||^2 (the paper's objective; Y Y^T is X = Y, Theta = I)."""
    return 0.25 * (op.factored(x, theta) - y).pow(2).sum()


def relative_error(estimate: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """||estimate - A||_F / ||A||_F."""
    return torch.linalg.matrix_norm(estimate - target) / torch.linalg.matrix_norm(target)
