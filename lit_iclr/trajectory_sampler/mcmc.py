"""MCMC kernels batched over chains: Gibbs-with-Gradients on one-hot / binary inputs, MALA on continuous inputs.

Every kernel targets pi(x) proportional to exp(log_target(x)) * 1[x in the constraint set], where `log_target` maps a
batch of chains (C, ...) to (C,) and is differentiable. All chains move at once (tensor ops, no loop over chains).

Evaluation count: a step evaluates the target (value and gradient) once, at the proposal; the value and gradient at the
current state are carried in `State` from the previous step. So one step = one function evaluation (forward + backward)
for every kernel, which is what "equal evaluation budget" counts in the benchmark.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

LogTarget = Callable[[torch.Tensor], torch.Tensor]
# allowed(x) -> bool mask of the moves that keep x inside the constraint set: (C, L, K) for one-hot, (C, n) for binary
Allowed = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class State:
    """Chains and the target's value and gradient there (so a step costs one new evaluation)."""

    x: torch.Tensor
    logp: torch.Tensor
    grad: torch.Tensor


def value_and_grad(log_target: LogTarget, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log_target(x) (C,) and its gradient d log_target / dx, per chain (the sum's gradient: chains are independent)."""
    with torch.enable_grad():
        xr = x.detach().requires_grad_(True)
        logp = log_target(xr)
        if not logp.requires_grad:  # a target that does not depend on x (e.g. a flat start of a ladder)
            return logp.detach(), torch.zeros_like(x)
        (grad,) = torch.autograd.grad(logp.sum(), xr)
    return logp.detach(), grad.detach()


def init_state(log_target: LogTarget, x: torch.Tensor) -> State:
    logp, grad = value_and_grad(log_target, x)
    return State(x.detach(), logp, grad)


# ---------------------------------------------------------------- Gibbs-with-Gradients (Grathwohl et al. 2021)

def gwg_logits(x: torch.Tensor, grad: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Proposal logits over single-position changes (l, k) of one-hot x (C, L, K): d~(x)/2 (GWG, eq. 5 with tau = 2).

    d~_{l,k} = grad_{l,k} - <grad_l, x_l> is the first-order (Taylor) estimate of log pi(x with x_l = e_k) - log pi(x);
    the current letter and disallowed moves get -inf.
    """
    d = grad - (grad * x).sum(-1, keepdim=True)
    logits = d / 2
    forbid = x.bool() if allowed is None else x.bool() | ~allowed
    return logits.masked_fill(forbid, -math.inf).flatten(1)


def gwg_step(state: State, log_target: LogTarget, allowed: Allowed | None = None,
             generator: torch.Generator | None = None) -> tuple[State, torch.Tensor]:
    """One GWG Metropolis-Hastings step on one-hot chains x (C, L, K); returns the new state and the acceptance mask.

    q(x'|x) = softmax(d~(x)/2) over changes; accept with min(1, pi(x') q(x|x') / (pi(x) q(x'|x))).
    """
    x, C = state.x, state.x.shape[0]
    K = x.shape[2]
    logits = gwg_logits(x, state.grad, allowed(x) if allowed is not None else None)
    log_q = torch.log_softmax(logits, -1)
    stuck = torch.isinf(log_q).all(-1)  # no allowed move (e.g. everything fixed): the chain stays
    u = torch.rand(logits.shape, generator=generator, device=x.device).clamp_min(1e-12)
    move = torch.argmax(logits - torch.log(-torch.log(u)), -1)  # Gumbel-max sample of the proposal
    pos, new = move // K, move % K
    rows = torch.arange(C, device=x.device)
    old = x[rows, pos].argmax(-1)
    x_new = x.clone()
    x_new[rows, pos] = torch.nn.functional.one_hot(new, K).to(x.dtype)
    logp_new, grad_new = value_and_grad(log_target, x_new)
    logits_rev = gwg_logits(x_new, grad_new, allowed(x_new) if allowed is not None else None)
    log_q_rev = torch.log_softmax(logits_rev, -1)[rows, pos * K + old]
    log_alpha = logp_new - state.logp + log_q_rev - log_q[rows, move]
    log_alpha = torch.nan_to_num(log_alpha, nan=-math.inf)
    accept = (torch.log(torch.rand(C, generator=generator, device=x.device)) < log_alpha) & ~stuck
    return _select(accept, State(x_new, logp_new, grad_new), state), accept


# ---------------------------------------------------------------- MALA

def mala_step(state: State, log_target: LogTarget, step_size: float | torch.Tensor,
              generator: torch.Generator | None = None) -> tuple[State, torch.Tensor]:
    """One Metropolis-adjusted Langevin step: x' = x + (eps^2 / 2) grad log pi(x) + eps xi, MH-corrected."""
    eps = torch.as_tensor(step_size, dtype=state.x.dtype, device=state.x.device)
    eps = eps.reshape(-1, *([1] * (state.x.dim() - 1))) if eps.dim() else eps
    noise = torch.randn(state.x.shape, generator=generator, device=state.x.device, dtype=state.x.dtype)
    x_new = state.x + 0.5 * eps**2 * state.grad + eps * noise
    logp_new, grad_new = value_and_grad(log_target, x_new)

    def log_q(to, frm, grad_frm):  # log N(to; frm + eps^2/2 grad, eps^2 I), constants cancel
        diff = to - frm - 0.5 * eps**2 * grad_frm
        return -(diff**2 / (2 * eps**2)).flatten(1).sum(-1)

    log_alpha = logp_new - state.logp + log_q(state.x, x_new, grad_new) - log_q(x_new, state.x, state.grad)
    log_alpha = torch.nan_to_num(log_alpha, nan=-math.inf)
    accept = torch.log(torch.rand(len(state.x), generator=generator, device=state.x.device)) < log_alpha
    return _select(accept, State(x_new, logp_new, grad_new), state), accept


def _select(mask: torch.Tensor, a: State, b: State) -> State:
    def pick(u, v):
        return torch.where(mask.reshape(-1, *([1] * (u.dim() - 1))), u, v)

    return State(pick(a.x, b.x), pick(a.logp, b.logp), pick(a.grad, b.grad))


# ---------------------------------------------------------------- SMC reweighting / resampling

def ess(log_w: torch.Tensor) -> torch.Tensor:
    """Effective sample size per group of log-weights (..., C): (sum w)^2 / sum w^2."""
    w = torch.softmax(log_w, -1)
    return 1.0 / (w**2).sum(-1)


def systematic_resample(log_w: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Indices (G, C) of systematic resampling within each group of log-weights (G, C)."""
    G, C = log_w.shape
    cdf = torch.softmax(log_w, -1).cumsum(-1)
    cdf[:, -1] = 1.0
    u = (torch.rand(G, 1, generator=generator, device=log_w.device) + torch.arange(C, device=log_w.device)) / C
    return torch.searchsorted(cdf, u).clamp_max(C - 1)
