"""A provider-side detector of steered generations, from the log-probability traces the API computed anyway."""
from __future__ import annotations

import numpy as np
import torch

from .api import Trace

FEATURES = ("mean_logp", "min_logp", "off_greedy_fraction", "max_log_rank", "first_logp", "length")


def trace_features(trace: Trace) -> torch.Tensor:
    """Per-reply features `[B, 6]`: mean and min log p of the emitted tokens, the fraction that were not the greedy
    token, log(1 + largest rank), log p of the first token and the reply length."""
    m = trace.mask.float()
    n = m.sum(-1).clamp(min=1)
    lp = trace.true_logp * m
    mean = lp.sum(-1) / n
    minimum = torch.where(trace.mask, trace.true_logp, torch.zeros_like(lp)).min(-1).values
    off = ((trace.true_rank > 0).float() * m).sum(-1) / n
    max_rank = torch.log1p((trace.true_rank * trace.mask).max(-1).values.float())
    return torch.stack([mean, minimum, off, max_rank, trace.true_logp[:, 0], n], -1)


def detector_auroc(positives: torch.Tensor, negatives: torch.Tensor, folds: int = 5, seed: int = 0) -> float:
    """Cross-validated AUROC of a logistic-regression detector separating steered (`positives`) from ordinary
    (`negatives`) feature rows; every reply is scored by a model that never saw it."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = torch.cat([positives, negatives]).double().cpu().numpy()
    y = np.r_[np.ones(len(positives)), np.zeros(len(negatives))]
    folds = int(min(folds, len(positives), len(negatives)))
    if folds < 2:
        return float("nan")
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    scores = cross_val_predict(clf, x, y, cv=cv, method="predict_proba")[:, 1]
    return float(roc_auc_score(y, scores))
