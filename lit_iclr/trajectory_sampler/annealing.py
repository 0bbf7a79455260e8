"""Annealed samplers over a ladder of targets: the training trajectory (the paper) and its final-model baselines.

A ladder is a list of stages (f_k, beta_k, m_k): warm-started chains run m_k MCMC steps on pi_k(x) ~ exp(beta_k f_k(x)).

- `trajectory`: f_k = the k-th checkpoint of training (early = smooth, late = sharp), beta_k = beta, m steps each; with
  `smc`, incremental weights w ~ exp(beta f_k(x) - beta f_{k-1}(x)) and resampling when the ESS drops (SMC sampler).
- `final`: the final model only, K*m steps (single-model MCMC).
- `temperature`: the final model with beta_k rising geometrically from beta_min to beta, m steps each (simulated
  annealing / annealed importance sampling ladder; same optional SMC).
- `tempering`: parallel tempering on the final model: R replicas at betas geometric in [beta_min, beta], K*m/R steps each
  (same evaluation count), adjacent swaps every `swap_every` steps; the beta replica is returned.

The evaluation budget is the same for all four: K*m evaluations per chain (+1 per stage switch to score the warm start).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from .mcmc import Allowed, State, ess, gwg_step, init_state, mala_step, systematic_resample

Score = Callable[[torch.Tensor], torch.Tensor]  # f(x): (C, ...) -> (C,)
SAMPLERS = ("trajectory", "final", "temperature", "tempering")


@dataclass
class Kernel:
    """Which MCMC step to run: `gwg` on one-hot chains (C, L, K) or `mala` on continuous chains (C, d)."""

    name: str = "gwg"
    step_size: float = 0.1
    allowed: Allowed | None = None

    def __call__(self, state: State, log_target, generator=None):
        if self.name == "gwg":
            return gwg_step(state, log_target, self.allowed, generator)
        if self.name == "mala":
            return mala_step(state, log_target, self.step_size, generator)
        raise ValueError(f"unknown kernel {self.name!r}: use 'gwg' or 'mala'")


@dataclass
class Trace:
    """What a run reports besides the final chains."""

    evaluations: int = 0                   # per chain
    accepted: float = 0.0                  # mean acceptance rate
    first_hit: torch.Tensor | None = None  # (C,) step of the first visit to the `hit` set (-1: never)
    resamples: int = 0
    stage_logp: list[float] = field(default_factory=list)


def _scaled(f: Score, beta: float | torch.Tensor) -> Score:
    return lambda x: beta * f(x)


def run_ladder(x0: torch.Tensor, stages: Sequence[tuple[Score, float, int]], kernel: Kernel, smc: bool = False,
               ess_threshold: float = 0.5, groups: int = 1, hit: Callable[[torch.Tensor], torch.Tensor] | None = None,
               generator: torch.Generator | None = None) -> tuple[State, Trace]:
    """Run warm-started chains x0 (C, ...) through `stages` [(f_k, beta_k, m_k)]; chains form `groups` equal groups
    (one per query) inside which SMC weights are normalised and resampled."""
    trace = Trace()
    C = x0.shape[0]
    log_w = torch.zeros(groups, C // groups, device=x0.device)
    first_hit = torch.full((C,), -1, dtype=torch.long, device=x0.device)
    state, step, acc_sum, acc_n = None, 0, 0.0, 0
    for f, beta, m in stages:
        target = _scaled(f, beta)
        new = init_state(target, x0 if state is None else state.x)
        trace.evaluations += 1
        if state is not None and smc:
            # incremental importance weight of the annealed (SMC) sampler: pi_k(x) / pi_{k-1}(x), unnormalised
            log_w = log_w + (new.logp - state.logp).reshape(groups, -1)
            if (ess(log_w) < ess_threshold * log_w.shape[1]).any():
                idx = systematic_resample(log_w, generator)
                flat = (idx + torch.arange(groups, device=idx.device)[:, None] * idx.shape[1]).flatten()
                new = State(new.x[flat], new.logp[flat], new.grad[flat])
                first_hit = first_hit[flat]
                log_w = torch.zeros_like(log_w)
                trace.resamples += 1
        state = new
        for _ in range(m):
            state, accept = kernel(state, target, generator)
            step += 1
            acc_sum, acc_n = acc_sum + float(accept.float().mean()), acc_n + 1
            if hit is not None:
                first_hit = torch.where((first_hit < 0) & hit(state.x), step, first_hit)
        trace.evaluations += m
        trace.stage_logp.append(float(state.logp.mean()))
    trace.accepted = acc_sum / max(acc_n, 1)
    trace.first_hit = first_hit if hit is not None else None
    return state, trace


def run_tempering(x0: torch.Tensor, f: Score, betas: torch.Tensor, steps: int, kernel: Kernel, swap_every: int = 1,
                  hit: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  generator: torch.Generator | None = None) -> tuple[State, Trace]:
    """Parallel tempering: replicas r = 0..R-1 at betas[r] (ascending, last = target), all chains stepped at once.

    Swap of adjacent replicas (r, r+1) accepted with min(1, exp((beta_r - beta_{r+1}) (f(x_{r+1}) - f(x_r)))),
    even and odd pairs alternating. Returns the state of the target replica (C, ...).
    """
    R, C = len(betas), x0.shape[0]
    beta_c = betas.to(x0.dtype).repeat_interleave(C)  # chain r*C + c sits at replica r
    # f and the constraint may be per chain (a query's reference, target class): apply them to each replica's C chains
    per_replica = lambda fn: (lambda x: torch.cat(list(map(fn, x.reshape(R, C, *x.shape[1:])))))
    target = lambda x: beta_c * per_replica(f)(x)
    if kernel.allowed is not None:
        kernel = replace(kernel, allowed=per_replica(kernel.allowed))
    state = init_state(target, x0.repeat(R, *([1] * (x0.dim() - 1))))
    trace = Trace(evaluations=R)
    first_hit = torch.full((C,), -1, dtype=torch.long, device=x0.device)
    acc = 0.0
    view = lambda t: t.reshape(R, C, *t.shape[1:])
    for step in range(1, steps + 1):
        state, accept = kernel(state, target, generator)
        acc += float(view(accept)[-1].float().mean())
        if step % swap_every == 0 and R > 1:
            state = _swap(state, betas.to(x0.dtype), R, C, parity=(step // swap_every) % 2, generator=generator)
        if hit is not None:
            first_hit = torch.where((first_hit < 0) & hit(view(state.x)[-1]), step * R, first_hit)
    trace.evaluations += steps * R
    trace.accepted = acc / max(steps, 1)
    trace.first_hit = first_hit if hit is not None else None
    top = State(view(state.x)[-1], view(state.logp)[-1], view(state.grad)[-1])
    trace.stage_logp.append(float(top.logp.mean()))
    return top, trace


def _swap(state: State, betas: torch.Tensor, R: int, C: int, parity: int, generator=None) -> State:
    """Metropolis swaps between replicas (r, r+1), r = parity, parity + 2, ...; values/gradients rescaled by beta."""
    x = state.x.reshape(R, C, *state.x.shape[1:])
    fx = state.logp.reshape(R, C) / betas[:, None]            # f(x_r) = log pi_r / beta_r
    gx = state.grad.reshape(R, C, *state.grad.shape[1:]) / betas.reshape(R, *([1] * (state.grad.dim())))
    lo = torch.arange(parity, R - 1, 2, device=x.device)
    if len(lo) == 0:
        return state
    hi = lo + 1
    log_a = (betas[lo, None] - betas[hi, None]) * (fx[hi] - fx[lo])
    ok = torch.log(torch.rand(log_a.shape, generator=generator, device=x.device)) < log_a  # (P, C)
    perm = torch.arange(R, device=x.device)[:, None].repeat(1, C)  # replica r takes the chain of replica perm[r]
    perm[lo] = torch.where(ok, hi[:, None], lo[:, None])
    perm[hi] = torch.where(ok, lo[:, None], hi[:, None])
    cols = torch.arange(C, device=x.device)[None].expand(R, C)
    x, fx, gx = x[perm, cols], fx[perm, cols], gx[perm, cols]
    bshape = (R, 1, *([1] * (state.grad.dim() - 1)))
    grad = (betas.reshape(bshape) * gx).reshape(state.grad.shape)
    return State(x.reshape(state.x.shape), (betas[:, None] * fx).reshape(-1), grad)


def geometric_betas(beta_min: float, beta: float, n: int) -> torch.Tensor:
    """n inverse temperatures from beta_min to beta, geometric (n = 1: just beta)."""
    if n == 1:
        return torch.tensor([beta])
    return beta_min * (beta / beta_min) ** (torch.arange(n, dtype=torch.float64) / (n - 1))


def sample(method: str, scores: Sequence[Score], x0: torch.Tensor, beta: float, steps_per_stage: int, kernel: Kernel,
           beta_min: float = 0.05, replicas: int = 4, swap_every: int = 1, smc: bool = False, ess_threshold: float = 0.5,
           groups: int = 1, hit=None, generator: torch.Generator | None = None) -> tuple[State, Trace]:
    """Run `method` (one of SAMPLERS) with the same budget: len(scores) * steps_per_stage steps per chain.

    `scores` are the checkpoints' functions in training order; the baselines use only the last one.
    """
    K, final = len(scores), scores[-1]
    if method == "trajectory":
        stages = [(f, beta, steps_per_stage) for f in scores]
    elif method == "final":
        stages = [(final, beta, K * steps_per_stage)]
    elif method == "temperature":
        stages = [(final, float(b), steps_per_stage) for b in geometric_betas(beta_min, beta, K)]
    elif method == "tempering":
        R = max(1, min(replicas, K * steps_per_stage))
        betas = geometric_betas(beta_min, beta, R).float()
        return run_tempering(x0, final, betas, (K * steps_per_stage) // R, kernel, swap_every, hit, generator)
    else:
        raise ValueError(f"unknown sampler {method!r}; use one of {SAMPLERS}")
    return run_ladder(x0, stages, kernel, smc=smc, ess_threshold=ess_threshold, groups=groups, hit=hit,
                      generator=generator)
