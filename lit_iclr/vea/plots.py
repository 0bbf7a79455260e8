"""The per-layer figure: RAPT image share, evidence AUROC / NDCG, and top-patch hit rates of wrong and right answers."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def layer_figure(res: dict, std: dict | None = None):
    """`res` holds lists per layer (`layer/...`); `std` optionally the same keys' standard deviations over seeds."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    layers = np.arange(len(res["layer/auroc"]))
    panels = [
        (axes[0], [("layer/rapt_share", "RAPT image share"), ("layer/image_mass", "attention mass on image")], "share"),
        (axes[1], [("layer/auroc", "evidence AUROC"), ("layer/ndcg", "evidence NDCG")], "score"),
        (axes[2], [("layer/hit_correct", "top patch in evidence (right answers)"),
                   ("layer/hit_wrong", "top patch in evidence (wrong answers)")], "rate"),
    ]
    for ax, series, ylabel in panels:
        for key, label in series:
            y = np.asarray(res[key], dtype=float)
            ax.plot(layers, y, marker="o", label=label)
            if std is not None and key in std:
                s = np.asarray(std[key], dtype=float)
                ax.fill_between(layers, y - s, y + s, alpha=0.2)
        ax.set_xlabel("decoder layer")
        ax.set_ylabel(ylabel)
        ax.set_xticks(layers)
        ax.legend(fontsize=7)
    axes[1].axhline(0.5, color="grey", lw=0.8, ls="--")
    axes[2].axhline(res.get("evidence_fraction", 0.0), color="grey", lw=0.8, ls="--")
    fig.tight_layout()
    return fig
