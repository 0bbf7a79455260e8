"""Ground-truth landscapes f*(x) with known structure: the default data's generators and the benchmark's exact targets.

- `BooleanLandscape` on {0,1}^n: a rugged spin-glass term, a deceptive pull away from the needle bits and a needle
  B * prod_{i in S} x_i (a high-order monomial): local samplers on exp(beta f*) need exponentially long to cross into it.
- `MotifLandscape` on one-hot DNA (L, 4): transcription-factor affinity in the PWM style (soft-max over positions of
  position-weight-matrix log-odds per motif) plus epistatic letter pairs.
- `GaussianModes2D` on R^2: log of a mixture of sharp, well separated Gaussians on a ring (floored far from the modes).

Each is a small dataclass of tensors, seeded, with `to_dict`/`from_dict` (plain JSON) so a generated dataset carries its
exact target next to the data.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

ALPHABET = "ACGT"


def _t(v) -> torch.Tensor:
    return torch.as_tensor(v, dtype=torch.float32)


@dataclass
class BooleanLandscape:
    h: list[float]                 # (n,) fields on spins s = 2x - 1
    J: list[list[float]]           # (n, n) strictly upper-triangular couplings
    needle: list[int]              # S: the needle's bits
    needle_height: float           # B
    deception: float               # c: each needle bit alone costs c

    @classmethod
    def generate(cls, n: int, needle_size: int, needle_height: float, deception: float, rugged: float = 0.3,
                 field: float = 0.1, seed: int = 0) -> BooleanLandscape:
        g = torch.Generator().manual_seed(seed)
        h = field * torch.randn(n, generator=g)
        J = torch.triu(rugged * torch.randn(n, n, generator=g), 1) / math.sqrt(n)
        needle = sorted(torch.randperm(n, generator=g)[:needle_size].tolist())
        return cls(h.tolist(), J.tolist(), needle, needle_height, deception)

    @property
    def n(self) -> int:
        return len(self.h)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """f*(x) for x (N, n) in {0,1} (float): sum h s + sum_{i<j} J s_i s_j + B prod_S x - c sum_S x."""
        s = 2 * x - 1
        xs = x[:, self.needle]
        rugged = s @ _t(self.h) + ((s @ _t(self.J)) * s).sum(-1)
        return rugged + self.needle_height * xs.prod(-1) - self.deception * xs.sum(-1)

    def in_needle(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, self.needle].bool().all(-1)

    def to_dict(self) -> dict:
        return {"kind": "boolean", **asdict(self)}


@dataclass
class MotifLandscape:
    pwms: list[list[list[float]]]  # (M, w, 4) log-odds of each motif
    pair_pos: list[list[int]]      # (P, 2) positions of epistatic pairs
    pair_letters: list[list[int]]  # (P, 2) letters that interact
    pair_weight: list[float]       # (P,) weight of each pair (both letters present)
    length: int
    pool_temperature: float = 1.0  # soft-max over motif positions

    @classmethod
    def generate(cls, length: int = 24, motifs: int = 2, width: int = 6, pairs: int = 12, pair_scale: float = 1.0,
                 seed: int = 0) -> MotifLandscape:
        g = torch.Generator().manual_seed(seed)
        probs = _dirichlet(motifs, width, g)  # peaked letter distributions per motif position
        pwms = torch.log(probs.clamp_min(1e-3) / 0.25)
        pos = torch.stack([torch.randperm(length, generator=g)[:2] for _ in range(pairs)])
        letters = torch.randint(0, 4, (pairs, 2), generator=g)
        weight = pair_scale * torch.randn(pairs, generator=g)
        return cls(pwms.tolist(), pos.tolist(), letters.tolist(), weight.tolist(), length)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """f*(x) for one-hot x (N, L, 4): sum_m tau logsumexp_p(PWM_m . x[p:p+w] / tau) + sum_pairs w 1[x_i=a, x_j=b]."""
        pwms = _t(self.pwms)
        w = pwms.shape[1]
        windows = x.unfold(1, w, 1)  # (N, L-w+1, 4, w)
        per_pos = torch.einsum("npkw,mwk->nmp", windows, pwms)
        tau = self.pool_temperature
        motif = (tau * torch.logsumexp(per_pos / tau, -1)).sum(-1)
        pos, let = torch.as_tensor(self.pair_pos), torch.as_tensor(self.pair_letters)
        both = x[:, pos[:, 0], let[:, 0]] * x[:, pos[:, 1], let[:, 1]]
        return motif + both @ _t(self.pair_weight)

    def to_dict(self) -> dict:
        return {"kind": "motif", **asdict(self)}


def _dirichlet(motifs: int, width: int, g: torch.Generator) -> torch.Tensor:
    """Peaked letter distributions (Dirichlet(0.25) via normalised Gamma draws from the seeded generator)."""
    e = -torch.log(torch.rand(motifs, width, 4, generator=g).clamp_min(1e-12))  # Exp(1) = Gamma(1)
    gam = e ** 4  # heavier tail than Gamma(1): one letter dominates per position, as in real PWMs
    return gam / gam.sum(-1, keepdim=True)


@dataclass
class GaussianModes2D:
    centers: list[list[float]]  # (K, 2)
    sigma: float
    floor: float                # log-density floor far from every mode

    @classmethod
    def generate(cls, modes: int = 8, radius: float = 3.0, sigma: float = 0.15, floor: float = -12.0) -> GaussianModes2D:
        a = 2 * math.pi * torch.arange(modes) / modes
        return cls(torch.stack([radius * torch.cos(a), radius * torch.sin(a)], -1).tolist(), sigma, floor)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """f*(x) = max(log (1/K) sum_k N(x; mu_k, sigma^2 I), floor)."""
        d2 = torch.cdist(x, _t(self.centers)) ** 2
        K = d2.shape[1]
        logp = torch.logsumexp(-d2 / (2 * self.sigma**2), -1) - math.log(K) - math.log(2 * math.pi * self.sigma**2)
        return torch.maximum(logp, torch.full_like(logp, self.floor))

    def nearest_mode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cdist(x, _t(self.centers)).argmin(-1)

    def to_dict(self) -> dict:
        return {"kind": "gaussian_modes", **asdict(self)}


def landscape_from_dict(d: dict):
    kind = d.get("kind")
    cls = {"boolean": BooleanLandscape, "motif": MotifLandscape, "gaussian_modes": GaussianModes2D}.get(kind)
    if cls is None:
        raise ValueError(f"unknown landscape kind {kind!r}")
    return cls(**{k: v for k, v in d.items() if k != "kind"})


def all_binary(n: int) -> torch.Tensor:
    """Every point of {0,1}^n (2^n, n), in the order of the integer whose bit i (little-endian) is x_i."""
    idx = torch.arange(2**n)
    return ((idx[:, None] >> torch.arange(n)) & 1).float()
