"""Figures: intervention curves per family, and the information plane I(X;C) vs I(C;Y) over training."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def intervention_figure(curves: dict[str, np.ndarray], title: str = "Test-time interventions (random group order)"):
    """One line per model: accuracy against the number of concept groups set to their true values."""
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, curve in curves.items():
        curve = np.asarray(curve)
        ax.plot(np.arange(len(curve)), 100 * curve, marker="o", ms=3, label=label)
    ax.set_xlabel("intervened concept groups")
    ax.set_ylabel("task accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def information_plane(points: dict[str, list] | list, label: str = ""):
    """I_hat(X;C) (x) against I(C;Y) (y) at each validation, coloured by epoch; `points` is [(epoch, ixc, icy)] or a
    {label: points} dict for several models."""
    series = points if isinstance(points, dict) else {label: points}
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, pts in series.items():
        pts = np.asarray(pts, dtype=float)
        if len(pts) == 0:
            continue
        ax.plot(pts[:, 1], pts[:, 2], "-", alpha=0.5, label=name)
        ax.scatter(pts[:, 1], pts[:, 2], c=pts[:, 0], cmap="viridis", s=14)
    ax.set_xlabel("I(X;C) (nats, minibatch estimate)")
    ax.set_ylabel("I(C;Y) (nats)")
    ax.set_title("Information plane over training (colour: epoch)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
