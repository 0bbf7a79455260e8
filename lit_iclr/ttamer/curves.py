"""Accuracy-cost trade-off curves: the Pareto envelope of a policy's operating points and its area."""
from __future__ import annotations

import numpy as np


def pareto(points: list[tuple[float, float]]) -> np.ndarray:
    """(K, 2) [cost, accuracy] points no other point beats (cheaper and at least as accurate), sorted by cost."""
    pts = np.array(sorted(points, key=lambda p: (p[0], -p[1])), dtype=float)
    keep, best = [], -np.inf
    for c, a in pts:
        if a > best:
            keep.append((c, a))
            best = a
    return np.array(keep)


def upper_hull(points: list[tuple[float, float]]) -> np.ndarray:
    """The concave upper hull of the Pareto points: every point on it is reached by randomising, query by query,
    between the two policies at its ends, so it is the trade-off curve a policy family really offers."""
    front = pareto(points)
    hull: list[np.ndarray] = []
    for p in front:
        while len(hull) >= 2 and np.cross(hull[-1] - hull[-2], p - hull[-2]) >= 0:
            hull.pop()
        hull.append(p)
    return np.array(hull)


def mean_accuracy(points: list[tuple[float, float]], lo: float, hi: float, grid: int = 512) -> float:
    """Mean over budgets c in [lo, hi] of the best accuracy reachable at expected cost <= c (the upper hull, flat after
    its last point, 0 below its cheapest point): the area under the trade-off curve divided by the budget range."""
    hull = upper_hull(points)
    budgets = np.linspace(lo, hi, grid)
    acc = np.interp(budgets, hull[:, 0], hull[:, 1], left=0.0, right=hull[-1, 1])
    acc[budgets < hull[0, 0]] = 0.0
    return float(acc.mean())
