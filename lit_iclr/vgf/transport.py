"""Value gradient flow: particles from the reference policy moved toward pi* ~ exp(Q / alpha) (paper Sec. 3).

The reference mu is pushed along a discretised Wasserstein gradient flow of F(rho) = -E_rho[Q] + alpha E_rho[log rho],
approximated with N particles per state by Stein variational gradient descent (SVGD, Liu & Wang 2016):

    phi(a_i) = 1/N sum_j [ k(a_j, a_i) grad_{a_j} Q(s, a_j) / alpha + grad_{a_j} k(a_j, a_i) ]          (SVGD field)
    k(x, y)  = exp(-||x - y||^2 / (2 h)),  h = median_{i,j} ||a_i - a_j||^2 / (2 log(N + 1))   (per state)
    a       <- clip(a + Adam_eta(phi), -1, 1)                                                   (L steps)

Adam's state is fresh for every call, so its first step moves each coordinate by about eta whatever the scale of Q:
the transport budget L x eta bounds how far particles leave the reference support, and is the only regulariser.
Everything is batched: particles are `[B, N, action_dim]`, all states and all particles move at once.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

ScoreFn = Callable[[torch.Tensor], torch.Tensor]


def pairwise_sq_dists(x: torch.Tensor) -> torch.Tensor:
    """||x_i - x_j||^2 for particles `[B, N, D]` -> `[B, N, N]` (exact, non-negative)."""
    return (x.unsqueeze(-2) - x.unsqueeze(-3)).pow(2).sum(-1)


def median_bandwidth(sq_dists: torch.Tensor) -> torch.Tensor:
    """h = median of all N x N squared distances / (2 log(N + 1)), one per state: `[B, N, N]` -> `[B, 1, 1]`."""
    n = sq_dists.shape[-1]
    # interpolating median, as numpy/jax: the mean of the two middle values (the middle one when n * n is odd); equal
    # to torch.quantile(., 0.5), which costs about twice as much (its checks and general interpolation)
    ordered = sq_dists.flatten(-2).sort(-1).values
    m = ordered.shape[-1]
    med = torch.lerp(ordered[..., (m - 1) // 2], ordered[..., m // 2], 0.5)
    return (med / (2.0 * math.log(n + 1.0))).clamp_min(1e-12)[..., None, None]


def rbf_kernel(x: torch.Tensor, bandwidth: torch.Tensor | float | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """K_ij = exp(-||x_i - x_j||^2 / (2 h)) with the median bandwidth when `bandwidth` is None; returns (K, h)."""
    sq = pairwise_sq_dists(x)
    h = median_bandwidth(sq) if bandwidth is None else torch.as_tensor(bandwidth, dtype=x.dtype, device=x.device)
    return torch.exp(-sq / (2.0 * h)), h


def svgd_direction(x: torch.Tensor, score: torch.Tensor, alpha: float,
                   bandwidth: torch.Tensor | float | None = None) -> torch.Tensor:
    """The SVGD field phi for particles `x` `[B, N, D]` and scores grad_a Q `[B, N, D]` (bandwidth held constant).

    Driving term  sum_j k(a_j, a_i) grad Q(a_j) / alpha   = K @ score / alpha  (K is symmetric);
    repulsion     sum_j grad_{a_j} k(a_j, a_i)            = (a_i sum_j K_ij - sum_j K_ij a_j) / h.
    """
    k, h = rbf_kernel(x, bandwidth)
    drive = k @ score / alpha
    repulse = (x * k.sum(-1, keepdim=True) - k @ x) / h
    return (drive + repulse) / x.shape[-2]


class ParticleAdam:
    """Adam as an *ascent* rule on a particle tensor, state fresh per transport (the JAX code passes -phi to optax).

    `max_norm` clips each state's direction block `[N, D]` to that L2 norm first (A-VGF's clipping, applied per state so
    a state's actions do not depend on the rest of the batch).
    """

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 max_norm: float | None = None):
        self.lr, self.betas, self.eps, self.max_norm = lr, betas, eps, max_norm
        self.t = 0
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def step(self, x: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        if self.max_norm is not None:
            norm = direction.flatten(-2).norm(dim=-1)[..., None, None]
            direction = direction * (self.max_norm / norm.clamp_min(self.max_norm))
        b1, b2 = self.betas
        if self.m is None:
            self.m, self.v = torch.zeros_like(x), torch.zeros_like(x)
        self.t += 1
        self.m = b1 * self.m + (1 - b1) * direction
        self.v = b2 * self.v + (1 - b2) * direction.pow(2)
        m_hat = self.m / (1 - b1**self.t)
        v_hat = self.v / (1 - b2**self.t)
        return x + self.lr * m_hat / (v_hat.sqrt() + self.eps)


def transport(x: torch.Tensor, score_fn: ScoreFn, steps: int, lr: float, alpha: float = 1.0,
              kernel: bool = True, max_norm: float | None = None, keep: Iterable[int] = ()
              ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Move particles `x` `[B, N, D]` for `steps` flow steps; returns the final particles and {l: particles after l}.

    `kernel=True` is VGF (the SVGD field); `kernel=False` drops the kernel and repulsion, leaving N independent
    Adam ascents on Q: the unconstrained gradient-ascent baseline. `keep` names the step counts whose particles are
    returned as well, so every evaluation budget L in {0, 1, 2, 3} is read off one transport of max(L) steps.
    """
    keep = set(keep)
    snaps = {0: x} if 0 in keep else {}
    opt = ParticleAdam(lr, max_norm=max_norm)
    for step in range(1, steps + 1):
        score = score_fn(x)
        direction = svgd_direction(x, score, alpha) if kernel else score
        x = opt.step(x, direction).clamp(-1.0, 1.0)
        if step in keep:
            snaps[step] = x
    return x, snaps


def critic_score(q_fn: Callable[[torch.Tensor], torch.Tensor]) -> ScoreFn:
    """grad_a sum Q(s, a) w.r.t. the particles only (no parameter gradients are accumulated).

    `torch.func.grad` rather than `torch.autograd.grad`: the same numbers, and `torch.compile` traces it into the
    update's graph (it breaks the graph at `autograd.grad`); it also works under an outer `torch.no_grad()`.
    """
    grad = torch.func.grad(lambda a: q_fn(a).sum())

    def score(x: torch.Tensor) -> torch.Tensor:
        return grad(x.detach())

    return score


def select_best(particles: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The particle of highest Q per state: particles `[B, N, D]`, q `[B, N]` -> `[B, D]` (acting rule of VGF)."""
    idx = q.argmax(-1)
    return particles[torch.arange(particles.shape[0], device=particles.device), idx]
