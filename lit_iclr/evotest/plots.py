"""Learning-curve figure: final score per episode, mean over seeds with the min-max band, one line per method."""
from __future__ import annotations

import numpy as np


def curve_figure(curves: dict[str, list[list[float]]], max_score: float, title: str = ""):
    """`curves`: {method: [curve of seed 0, curve of seed 1, ...]}; returns a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, runs in curves.items():
        a = np.asarray(runs, dtype=float)
        x = np.arange(1, a.shape[1] + 1)
        ax.plot(x, a.mean(0), label=name, lw=2 if name == "evotest" else 1)
        if a.shape[0] > 1:
            ax.fill_between(x, a.min(0), a.max(0), alpha=0.15)
    ax.axhline(max_score, color="k", ls=":", lw=0.8)
    ax.set(xlabel="episode", ylabel="final score", title=title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
