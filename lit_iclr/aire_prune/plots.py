"""Figures: per-layer pruning fractions, and accuracy against the fraction of states pruned."""
from __future__ import annotations

import matplotlib.pyplot as plt

import lit_iclr.core.figures  # noqa: F401  (selects the headless backend)

STYLE = {"aire": ("tab:red", "o"), "last": ("tab:blue", "s"), "magnitude": ("tab:green", "^"),
         "random": ("tab:gray", "x"), "aire_quirk": ("k", "."),
         "modal": ("tab:purple", "v")}


def layer_fraction_figure(prune_plan):
    fig, ax = plt.subplots(figsize=(4.5, 3))
    fr = prune_plan.layer_fractions
    ax.bar(range(len(fr)), [100 * f for f in fr], color=STYLE.get(prune_plan.method, ("k",))[0])
    ax.axhline(100 * prune_plan.pruned_fraction, color="k", ls="--", lw=1, label="overall")
    ax.set_xlabel("layer")
    ax.set_ylabel("states pruned (%)")
    ax.set_title(f"{prune_plan.method}: {prune_plan.pruned_fraction:.0%} pruned")
    ax.legend()
    fig.tight_layout()
    return fig


def accuracy_curves_figure(results: dict[str, dict[str, dict[str, list[tuple[float, float]]]]]):
    """results[task][model][method] = [(fraction pruned, accuracy %), ...] -> one panel per (task, model)."""
    panels = [(t, m) for t in results for m in results[t]]
    cols = min(len(panels), 2)
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, (task, model) in zip(axes.flat, panels, strict=False):
        for method, pts in results[task][model].items():
            color, marker = STYLE.get(method, ("k", "."))
            ax.plot([100 * f for f, _ in pts], [a for _, a in pts], marker=marker, color=color, label=method, ms=4)
        base = results[task][model][next(iter(results[task][model]))][0][1]
        ax.axhline(base - 1, color="k", ls=":", lw=1)
        ax.set_title(f"{task} / {model}")
        ax.set_xlabel("states pruned (%)")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    return fig
