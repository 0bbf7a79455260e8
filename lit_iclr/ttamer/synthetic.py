"""The family on which no-recall serving is arbitrarily worse than recall, and exact optima by enumeration.

Doubling cascade with S stages: stage 1's answer is right with probability x_1 = 2^-(S-1); after each stage the next
one's value doubles with probability 1/2 or collapses to 0 for good (x_{k+1} = 2 x_k or 0; a deeper exit that
"overthinks"). Values are calibrated probabilities, all in [0, 1]. The value sequence is a martingale, so by optional
stopping every no-recall policy gets E[x_tau] = x_1, while recall keeps the best seen: E[max_k x_k] = x_1 (S + 1) / 2.
With costs epsilon per stage the ratio of the two optima is about 2 / (S + 1) -> 0 as S grows: no constant factor.
"""
from __future__ import annotations

import itertools

import torch

from .policies import MarkovModel, level_index, value_grid


def doubling_instance(stages: int, eps: float = 0.0) -> MarkovModel:
    """Bins: 0 = collapsed (value 0), 1 = alive (value 2^(k - S + 1) at stage k, counting from 0)."""
    alive = torch.tensor([2.0 ** (k - stages + 1) for k in range(stages)], dtype=torch.float64)
    q = torch.stack([torch.zeros(stages, dtype=torch.float64), alive], 1)          # (S, 2)
    p0 = torch.tensor([0.0, 1.0], dtype=torch.float64)
    step = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)              # 0 absorbs; alive -> 0 or alive
    trans = step.expand(stages - 1, 2, 2).clone()
    return MarkovModel(q, p0, trans, torch.full((stages,), eps, dtype=torch.float64))


def enumerate_optimum(model: MarkovModel, lam: float, recall: bool) -> float:
    """Best objective over every deterministic history-dependent stopping rule, by brute force (small instances only).

    A history is the tuple of bins seen so far; a rule is one stop/continue bit per history of length 1..S-1. Each rule
    is scored exactly over all bin paths weighted by their probability. With recall and a model carrying calibrated
    stop values, stopping after stage k in bin b with running best m pays `stop_value[k, b, level of m]` instead of m.
    """
    s, b = model.q.shape
    histories = [h for k in range(1, s) for h in itertools.product(range(b), repeat=k)]
    if len(histories) > 20:
        raise ValueError(f"{len(histories)} histories: 2^{len(histories)} rules is too many to enumerate")
    index = {h: i for i, h in enumerate(histories)}
    paths = list(itertools.product(range(b), repeat=s))
    prob = torch.tensor([float(model.p0[p[0]]) * float(torch.prod(torch.tensor(
        [model.trans[k, p[k], p[k + 1]] for k in range(s - 1)], dtype=torch.float64))) for p in paths],
        dtype=torch.float64)
    cum = torch.cumsum(model.cost, 0)
    best = -float("inf")
    for bits in itertools.product((False, True), repeat=len(histories)):
        total = 0.0
        for p, w in zip(paths, prob.tolist(), strict=True):
            if w == 0:
                continue
            k = 0
            while k < s - 1 and bits[index[p[:k + 1]]]:
                k += 1
            vals = [float(model.q[i, p[i]]) for i in range(k + 1)]
            if recall and model.stop_value is not None:
                grid = value_grid(model)
                level = int(level_index(torch.tensor([max(vals)], dtype=torch.float64), grid)[0])
                out = float(model.stop_value[k, p[k], level])
            else:
                out = max(vals) if recall else vals[-1]
            total += w * (out - lam * float(cum[k]))
        best = max(best, total)
    return best
