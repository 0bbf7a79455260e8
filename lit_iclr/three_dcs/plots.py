"""Figure: representation distance to the first conformer along one torsion scan, one curve per representation."""
from __future__ import annotations

import numpy as np

from lit_iclr.core.figures import plt

from .distances import representation_distance


def torsion_figure(group, embeddings: dict[str, np.ndarray], reference: np.ndarray, metric: str = "cosine"):
    """`embeddings` {name: (C, dim)}; each curve is Delta(conformer 0, conformer i) scaled by its maximum, against the
    torsion angle, with the heavy-atom RMSD (reference D) as a dashed line."""
    order = np.argsort(group.torsion_deg)
    phi = group.torsion_deg[order]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ref = reference[order[0], order]
    ax.plot(phi, ref / max(ref.max(), 1e-12), "k--", lw=2, label="heavy-atom RMSD (reference)")
    for name, Z in embeddings.items():
        D = representation_distance(Z, "tanimoto" if Z.dtype == bool else metric)
        d = D[order[0], order]
        ax.plot(phi, d / max(d.max(), 1e-12), marker=".", label=name)
    ax.set_xlabel(f"torsion angle (deg), {group.key}")
    ax.set_ylabel("distance to first conformer / max")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig
