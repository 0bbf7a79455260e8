"""Test-time interventions: set the concepts of k chosen groups to their true values, for k = 0 .. number of groups.

Group orders are per sample: `random_order` (the official code draws 5 random trials) or `uncertainty_order` (most
uncertain first: the official score is log N(0; mu, sigma) averaged over a group's concepts, i.e. the density the
Gaussian concept layer puts on the decision boundary; deterministic models use -|logit|). The official code averages the
uncertainty over the whole test batch and intervenes on the same groups for every sample; here each sample gets its own
order (a choice, documented in the card).

Summaries: AUC = mean accuracy over k = 1..G (official "Interventions AUC"), normalised AUC = mean successive gain
(official), and whether the curve is monotone (no drop larger than `tol`).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .ib import gaussian_log_prob


def group_mask(order: torch.Tensor, groups: list[list[int]], k: int, num_concepts: int) -> torch.Tensor:
    """(B, K) bool: the concepts of each sample's first k groups in `order` (B, G)."""
    member = torch.zeros(len(groups), num_concepts, dtype=torch.bool, device=order.device)
    for g, idx in enumerate(groups):
        member[g, idx] = True
    chosen = order[:, :k]  # (B, k) group ids
    return member[chosen].any(1) if k > 0 else torch.zeros(len(order), num_concepts, dtype=torch.bool, device=order.device)


def random_order(batch: int, num_groups: int, generator: torch.Generator) -> torch.Tensor:
    return torch.argsort(torch.rand(batch, num_groups, generator=generator), dim=1)


def uncertainty_order(c_logits: torch.Tensor, sigma: torch.Tensor | None, groups: list[list[int]]) -> torch.Tensor:
    """Groups sorted most-uncertain first, per sample."""
    if sigma is not None and sigma.shape == c_logits.shape:
        per_concept = gaussian_log_prob(torch.zeros_like(c_logits).unsqueeze(-1), c_logits.unsqueeze(-1), sigma.unsqueeze(-1))
    else:
        per_concept = -c_logits.abs()
    score = torch.stack([per_concept[:, idx].mean(1) for idx in groups], dim=1)  # (B, G), higher = more uncertain
    return torch.argsort(score, dim=1, descending=True)


def intervention_curve(predict: Callable[[torch.Tensor], torch.Tensor], order: torch.Tensor, groups: list[list[int]],
                       num_concepts: int, y: torch.Tensor) -> np.ndarray:
    """Accuracy for k = 0..G intervened groups; `predict(mask)` returns label logits with `mask` (B, K) intervened."""
    accs = []
    for k in range(len(groups) + 1):
        logits = predict(group_mask(order, groups, k, num_concepts))
        accs.append((logits.argmax(-1) == y).float().mean().item())
    return np.asarray(accs)


def summarize(curve: np.ndarray, tol: float = 0.005) -> dict[str, float]:
    gains = np.diff(curve)
    return {"auc": float(curve[1:].mean()), "normalized_auc": float(gains.mean()),
            "monotone": float(bool((gains >= -tol).all())), "full": float(curve[-1])}
