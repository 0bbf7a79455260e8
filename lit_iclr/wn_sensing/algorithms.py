"""The four solvers of the study on one interface: a factorisation, its optimizer, and one full-gradient iteration.

    wn_rgd     X Theta X^T, Riemannian GD on X (QR/polar retraction), Euclidean GD on Theta  (the paper's method)
    gd         Y Y^T, plain GD from a small random init (overparameterised when rank > r_A; exact when rank = r_A)
    scaled_gd  Y Y^T, ScaledGD(lambda): GD preconditioned by (Y^T Y + lambda I)^-1
    prec_gd    Y Y^T, PrecGD: the same with lambda_t proportional to sqrt(f(Y_t))
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .model import BMFactorization, WNFactorization
from .optim import ScaledGD, StiefelRGD
from .sensing import SensingOperator, loss, relative_error

METHODS = ("wn_rgd", "gd", "scaled_gd", "prec_gd")
DEFAULT_DAMPING = {"scaled_gd": 1e-3, "prec_gd": 1.0}


@dataclass
class SolverConfig:
    """Step sizes and initialisation of one solver (defaults tuned on the default problem, see seeds/wn_sensing.md)."""

    method: str = "wn_rgd"
    rank: int = 6
    lr: float = 0.5             # X step (wn_rgd) or Y step (the others), in units of 1 / ||A||
    lr_theta: float = 1.0       # Theta step of wn_rgd
    retraction: str = "qr"
    init_scale: float = 1e-3
    damping: float | None = None  # lambda / ||A|| of scaled_gd (default 1e-3); the sqrt(f) factor of prec_gd (default 1)
    seed: int = 0


def make_factorization(cfg: SolverConfig, dim: int, dtype=torch.float64) -> nn.Module:
    """X Theta X^T for `wn_rgd`, Y Y^T for the others."""
    if cfg.method not in METHODS:
        raise ValueError(f"unknown method {cfg.method!r}; choose one of {METHODS}")
    cls = WNFactorization if cfg.method == "wn_rgd" else BMFactorization
    return cls(dim, cfg.rank, cfg.init_scale, cfg.seed, dtype)


def make_optimizer(cfg: SolverConfig, model: nn.Module, a_norm: float = 1.0) -> torch.optim.Optimizer:
    """The method's optimizer, steps in units of ||A||_2 so one setting serves targets of any scale.

    The gradient in X scales as ||A||^2 (grad_X f = S X Theta, S ~ X Theta X^T - A, Theta ~ A), the one in Y as ||A||
    (grad_Y f = S Y), the one in Theta and the preconditioned step not at all.
    """
    if cfg.method == "wn_rgd":
        return StiefelRGD(model.parameters(), lr=cfg.lr / a_norm**2, lr_euclidean=cfg.lr_theta,
                          retraction=cfg.retraction, symmetric=True)
    if cfg.method == "gd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr / a_norm)
    damping = "fixed" if cfg.method == "scaled_gd" else "residual"
    value = cfg.damping if cfg.damping is not None else DEFAULT_DAMPING[cfg.method]
    value = value * a_norm if damping == "fixed" else value
    return ScaledGD(model.parameters(), lr=cfg.lr, damping=damping, damping_value=value)


def build(cfg: SolverConfig, dim: int, dtype=torch.float64, a_norm: float = 1.0
          ) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_factorization(cfg, dim, dtype)
    return model, make_optimizer(cfg, model, a_norm)


def spectral_scale(op: SensingOperator, y: torch.Tensor) -> float:
    """||M*(y)||_2, an estimate of ||A||_2 from the measurements alone (M*M ~ identity on low-rank matrices)."""
    return float(torch.linalg.matrix_norm(op.adjoint(y), ord=2))


def iterate(model: nn.Module, opt: torch.optim.Optimizer, op: SensingOperator, y: torch.Tensor) -> torch.Tensor:
    """One full-gradient iteration; returns f before the step."""
    opt.zero_grad(set_to_none=True)
    f = loss(op, y, *model())
    f.backward()
    if isinstance(opt, ScaledGD):
        opt.step(loss=f)
    else:
        opt.step()
    return f.detach()


def estimate(model: nn.Module) -> torch.Tensor:
    x, theta = model()
    return (x @ theta @ x.T).detach()


def solve(cfg: SolverConfig, op: SensingOperator, y: torch.Tensor, target: torch.Tensor, iters: int,
          tol: float = 0.0) -> dict:
    """Run `iters` iterations (or until the relative error falls below `tol`); returns the error history and model."""
    model, opt = build(cfg, op.dim, y.dtype, spectral_scale(op, y))
    errors = torch.empty(iters + 1, dtype=y.dtype)
    errors[0] = relative_error(estimate(model), target)
    done = iters
    for t in range(iters):  # iterations are sequential by nature; each one is a few matrix products
        iterate(model, opt, op, y)
        errors[t + 1] = relative_error(estimate(model), target)
        if not torch.isfinite(errors[t + 1]):
            errors[t + 2:] = float("nan")
            done = t + 1
            break
        if errors[t + 1] < tol:
            done = t + 1
            break
    return {"errors": errors[: done + 1], "model": model}
