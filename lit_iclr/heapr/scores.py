"""Importance of every atomic expert, and the global selection of the atoms to prune.

Atomic expert k of expert e: (row k of W_gate, row k of W_up, column k of W_down = w_k). Removing it changes the
expert's output by delta_y = -h_k w_k, so with the output-space Fisher M = E[g g^T] (HEAPr, Eq. for S_k):

    Delta L ~= 1/2 E[delta_y^T M delta_y] = 1/2 E[h_k^2] w_k^T M w_k   =>   S_k = E[h_k^2] * w_k^T M w_k

(the first-order term is dropped at a trained optimum; activations and gradients are decoupled).

`averaging` is how an expert's expectation is taken:
- "per_token" (the official code, `mean_sen`): mean over the tokens routed to *that* expert. An expert used by 1 % of
  the tokens scores like one used by 50 %.
- "frequency": expected change per calibration token: the per-token score times the expert's routing frequency
  n_e / N (equivalently, sums over routed tokens divided by all N tokens), so rarely used atoms cost less.

Baseline atomic scores: "wanda" (activation only, E[h_k^2] ||w_k||^2), "magnitude" (||w_k|| ||[g_k; u_k]||), "random".
"""
from __future__ import annotations

import torch

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.moe import MoEBlock

from .calibrate import Calibration

ATOM_METHODS = ("heapr", "wanda", "magnitude", "random")
AVERAGING = ("per_token", "frequency")


def quad_forms(M: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """w_k^T M w_k for every column w_k of `down` [d, I], in one pass: sum_i (M W)_ik W_ik."""
    W = down.detach().float().to(M.device)
    return ((M @ W) * W).sum(0)


def _expectation(total: torch.Tensor, n: float, tokens: int, averaging: str) -> torch.Tensor:
    if n == 0:  # never routed during calibration: no evidence that the atoms matter
        return torch.zeros_like(total)
    return total / n if averaging == "per_token" else total / tokens


def atom_scores(calib: Calibration | None, blocks: list[MoEBlock], method: str = "heapr",
                averaging: str = "per_token", seed: int = 0) -> list[list[torch.Tensor]]:
    """Scores [I_e] of every atom of every expert of every block (higher = more important)."""
    if method not in ATOM_METHODS:
        raise ConfigError(f"unknown atomic scoring method {method!r}; choose from {', '.join(ATOM_METHODS)}")
    if averaging not in AVERAGING:
        raise ConfigError(f"averaging must be one of {AVERAGING}, got {averaging!r}")
    g = torch.Generator().manual_seed(seed)
    out = []
    for bi, b in enumerate(blocks):
        s = calib.blocks[bi] if calib is not None else None
        per_expert = []
        for e in range(b.num_experts):
            w = b.get_expert(e)
            if method == "random":
                per_expert.append(torch.rand(w.width, generator=g))
                continue
            if method == "magnitude":  # ||w_k|| * ||[g_k; u_k]||: weights only
                mag = w.down.detach().float().norm(dim=0) * torch.cat([w.gate, w.up], 1).detach().float().norm(dim=1)
                per_expert.append(mag.cpu())
                continue
            n = float(s.n[e])
            eh2 = _expectation(s.h2[e], n, calib.tokens, averaging)  # E[h_k^2]
            if method == "wanda":
                per_expert.append((eh2 * w.down.detach().float().to(eh2.device).pow(2).sum(0)).cpu())
                continue
            if s.M is not None:  # w_k^T E[g g^T] w_k; the Fisher mean is always over the expert's routed tokens
                quad = quad_forms(s.M[e], w.down) / max(n, 1.0)
            elif s.gh2 is not None:
                quad = s.gh2[e] / max(n, 1.0)
            else:
                raise ValueError("HEAPr needs gradient statistics: calibrate(..., with_gradients=True)")
            per_expert.append((eh2 * quad).cpu())  # S_k = E[h_k^2] * w_k^T M w_k
        out.append(per_expert)
    return out


def global_keep(scores: list[list[torch.Tensor]], ratio: float) -> list[list[torch.Tensor]]:
    """Boolean keep-masks: the `ratio` fraction of all atoms with the lowest scores, ranked across all layers, is pruned.

    Ties are broken by position (stable sort), so the selection is deterministic.
    """
    check_ratio(ratio)
    flat = torch.cat([s.flatten().double() for per in scores for s in per])
    n_prune = int(round(ratio * flat.numel()))
    keep = torch.ones(flat.numel(), dtype=torch.bool)
    keep[torch.argsort(flat, stable=True)[:n_prune]] = False
    out, i = [], 0
    for per in scores:
        row = []
        for s in per:
            row.append(keep[i: i + s.numel()].clone())
            i += s.numel()
        out.append(row)
    return out


def check_ratio(ratio: float) -> None:
    if not (isinstance(ratio, int | float) and 0.0 < float(ratio) < 1.0):
        raise ConfigError(f"prune ratio must be strictly between 0 and 1 (the fraction of routed-expert atoms "
                          f"removed), got {ratio!r}")
