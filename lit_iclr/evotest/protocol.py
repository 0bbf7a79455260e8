"""The J-TTL protocol's measures: learning curve R^(e), normalised AUC, wins, episodes to first win, keeps winning."""
from __future__ import annotations

import numpy as np


def normalised_auc(curve, max_score: float) -> float:
    """mean_e R^(e) / R_max: the area under the learning curve, scaled to [0, 1] (1 = max score in every episode)."""
    curve = np.asarray(curve, dtype=float)
    return float(curve.mean() / max_score) if curve.size else 0.0


def first_win(wins) -> int | None:
    """1-based episode of the first win, or None."""
    idx = np.flatnonzero(np.asarray(wins, dtype=bool))
    return int(idx[0]) + 1 if idx.size else None


def keeps_winning(wins) -> bool | None:
    """Whether every episode after the first win is also a win (None when never won)."""
    w = np.asarray(wins, dtype=bool)
    f = first_win(w)
    return None if f is None else bool(w[f - 1:].all())


def summarise(curve, wins, max_score: float) -> dict:
    curve = np.asarray(curve, dtype=float)
    return {"auc": normalised_auc(curve, max_score), "best": float(curve.max()) if curve.size else 0.0,
            "final": float(curve[-1]) if curve.size else 0.0, "wins": int(np.sum(wins)),
            "first_win": first_win(wins), "keeps_winning": keeps_winning(wins)}
