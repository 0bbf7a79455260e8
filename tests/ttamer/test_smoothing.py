"""The Laplace smoothing of the Markov model is chosen on calibration queries alone (`ExitPolicies(smoothing=None)`)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_iclr.ttamer import ExitPolicies
from lit_iclr.ttamer.curves import mean_accuracy

LAMBDAS = np.logspace(-3, 0, 8).tolist()
GRID = [0.01, 1.0, 1e4]


def exits(n: int, seed: int, stages: int = 3, classes: int = 5):
    """Exits of a synthetic network: deeper stages are right more often, with some overthinking."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    logits = torch.randn(n, stages, classes, generator=g)
    for k in range(stages):
        logits[torch.arange(n), k, labels] += (k + 1.0) * torch.rand(n, generator=g) * 2
    return logits, labels, torch.tensor([1.0] + [0.5] * (stages - 1), dtype=torch.float64)


def test_selected_smoothing_is_the_best_on_a_held_out_share_of_the_calibration_queries():
    logits, labels, cost = exits(600, 0)
    m = ExitPolicies(stages=3, smoothing=None, smoothing_grid=GRID, lambdas=LAMBDAS)
    m.fit_policies(logits, labels, cost)
    # recomputed here: the held-out share (a seeded permutation, 30 %), one policy fitted per count on the rest with
    # that count fixed, scored by the mean area of its no-recall and recall DP curves on the held-out queries
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    sel, rest = perm[:180], perm[180:]
    scores = []
    for s in GRID:
        ref = ExitPolicies(stages=3, smoothing=s, lambdas=LAMBDAS)
        ref.fit_policies(logits[rest], labels[rest], cost)
        curves = ref.dp_curves(logits[sel], labels[sel])
        lo, hi = float(ref.cost[0]), float(ref.cost.sum())
        scores.append(np.mean([mean_accuracy(v, lo, hi) for v in curves.values()]))
    assert list(m.selection_scores.values()) == pytest.approx(scores, abs=1e-12)
    assert float(m.smoothing_used) == GRID[int(np.argmax(scores))]
    assert max(scores) > min(scores) + 1e-3  # the counts really differ: a flat transition model (1e4) scores worse
    # the served policy is refitted on every calibration query with the chosen count
    full = ExitPolicies(stages=3, smoothing=float(m.smoothing_used), lambdas=LAMBDAS)
    full.fit_policies(logits, labels, cost)
    for name in ("temperatures", "q", "p0", "trans", "stop_value"):
        assert torch.equal(getattr(m, name), getattr(full, name)), name

