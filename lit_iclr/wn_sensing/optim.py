"""Optimizers for factorised parameters: Riemannian GD on Stiefel-valued ones, and scaled (preconditioned) GD.

Any model can hand `StiefelRGD` a mix of parameters: those marked with `mark_stiefel` (orthonormal columns, shape
(..., m, r) with m >= r) take a Riemannian step with retraction, all others a plain Euclidean step. This is the
direction-magnitude split of weight normalisation generalised to matrices (W = X Theta with X on the Stiefel
manifold); a DoRA-style adapter whose direction factor is marked Stiefel trains with the same optimizer.
"""
from __future__ import annotations

import torch

from .manifold import retract, sym, tangent_project


def mark_stiefel(param: torch.nn.Parameter) -> torch.nn.Parameter:
    """Declare `param` (columns orthonormal) manifold-valued; returns it for use in `nn.Module.__init__`."""
    if param.dim() < 2 or param.shape[-2] < param.shape[-1]:
        raise ValueError(f"a Stiefel parameter needs shape (..., m, r) with m >= r, got {tuple(param.shape)}")
    param.manifold = "stiefel"
    return param


def is_stiefel(param: torch.Tensor) -> bool:
    return getattr(param, "manifold", None) == "stiefel"


class StiefelRGD(torch.optim.Optimizer):
    """Riemannian gradient descent (Algorithm 1 of the WN matrix-sensing paper) for marked parameters.

    For a Stiefel parameter X with Euclidean gradient G~:  G = G~ - X sym(X^T G~),  X <- Retr(X - lr G).
    For every other parameter (Theta):                     Theta <- Theta - lr_euclidean grad, re-symmetrised when
    the group sets `symmetric=True` (Theta in S^r).
    """

    def __init__(self, params, lr: float = 0.1, lr_euclidean: float | None = None, retraction: str = "qr",
                 symmetric: bool = False):
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        defaults = dict(lr=lr, lr_euclidean=lr if lr_euclidean is None else lr_euclidean, retraction=retraction,
                        symmetric=symmetric)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if is_stiefel(p):
                    p.copy_(retract(p - group["lr"] * tangent_project(p, p.grad), group["retraction"]))
                else:
                    p.add_(p.grad, alpha=-group["lr_euclidean"])
                    if group["symmetric"] and p.dim() == 2 and p.shape[0] == p.shape[1]:
                        p.copy_(sym(p))
        return loss


class ScaledGD(torch.optim.Optimizer):
    """Preconditioned GD on a Burer-Monteiro factor Y (m, r): Y <- Y - lr grad (Y^T Y + lambda I)^-1.

    `damping="fixed"` is ScaledGD(lambda) (Xu, Shen, Ma, Chi 2023) with lambda = `damping_value`; `damping="residual"`
    is PrecGD (Zhang, Fattahi, Zhang 2021) with lambda_t = `damping_value` * sqrt(f(Y_t)), which needs the loss from
    a closure or `step(loss=...)`.
    """

    def __init__(self, params, lr: float = 0.5, damping: str = "fixed", damping_value: float = 1e-3):
        if damping not in ("fixed", "residual"):
            raise ValueError(f"damping must be 'fixed' or 'residual', got {damping!r}")
        super().__init__(params, dict(lr=lr, damping=damping, damping_value=damping_value))

    @torch.no_grad()
    def step(self, closure=None, loss: torch.Tensor | None = None):
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                lam = group["damping_value"]
                if group["damping"] == "residual":
                    if loss is None:
                        raise ValueError("ScaledGD(damping='residual') needs the loss: pass a closure or loss=")
                    lam = lam * float(loss.detach().clamp_min(0).sqrt())
                gram = p.T @ p + lam * torch.eye(p.shape[1], dtype=p.dtype, device=p.device)
                # grad @ gram^-1 as a solve (gram is SPD)
                p.sub_(group["lr"] * torch.linalg.solve(gram, p.grad.T).T)
        return loss
