"""Leakage and impurity of concept representations.

- OIS, the oracle impurity score (Espinosa Zarlenga et al., AAAI 2023): pi(C_hat)[i, j] is the test ROC-AUC of a small
  MLP (one ReLU layer of 32) predicting true concept j from the soft representation of concept i; pi(C) the same from
  the true concept i (an oracle, diagonal set to 1). OIS = ||pi(C_hat) - pi(C)||_F / (K / 2), in [0, 1] (x100 in tables).
  The K x K predictors are trained at once as one batched MLP (full-batch Adam) rather than K^2 separate fits.
- NIS, the niche impurity score (same paper): for beta in 0, 0.05, ..., 0.95 the niche of concept j is the soft
  concepts whose |corr| with true concept j exceeds beta; NI_beta = mean over j of the ROC-AUC of predicting concept j
  from the soft concepts *outside* its niche; NIS = integral of NI_beta over beta (trapezoid). Two ways to predict:
  `mode="refit"` (default) fits an MLP (20, 20) for concept j on the outside-niche inputs only (one fit per distinct
  niche), so the AUC measures the information about j held outside its niche. `mode="reference"` is the reference
  code (`concept-quality`): one MLP trained on all soft concepts, niche inputs zeroed at test, the K scores put through
  a softmax over concepts before a per-concept AUC. That variant ranks a mixed representation *below* a pure one:
  (i) the softmax makes concept j's score depend on the other concepts' outputs, which see the niche of j unmasked, so
  a pure representation scores ~0.85 per beta instead of 0.5; (ii) a predictor trained on the full input learns to
  subtract the shared component of a mixed representation, so with the niche zeroed its score for j is anti-correlated
  with j (AUC < 0.5). Measured in `seeds/cibm.md`; both pinned by tests.
- Class leakage (the generator's leakage channel): the test accuracy of a logistic-regression probe predicting the
  class from the soft concept probabilities minus the same probe on the thresholded (hard) predicted concepts: the class
  information the soft values carry beyond the concepts they state.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from scipy.stats import rankdata


def roc_auc_rows(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Row-wise ROC-AUC (Mann-Whitney U with average ranks for ties); rows with one class only get 0.5."""
    ranks = rankdata(scores, axis=-1)
    pos = labels.sum(-1)
    neg = labels.shape[-1] - pos
    u = (ranks * labels).sum(-1) - pos * (pos + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = u / (pos * neg)
    return np.where((pos == 0) | (neg == 0), 0.5, auc)


def purity_matrix(reps: np.ndarray, c_true: np.ndarray, hidden: int = 32, steps: int = 60, lr: float = 3e-2,
                  test_size: float = 0.2, seed: int = 0, oracle: bool = False) -> np.ndarray:
    """(K, K) test AUCs of predicting true concept j from representation i; `reps` is (N, K, d) or (N, K)."""
    with torch.inference_mode(False), torch.enable_grad():  # also when called from a Lightning test loop
        return _purity_matrix(reps, c_true, hidden, steps, lr, test_size, seed, oracle)


def _purity_matrix(reps, c_true, hidden, steps, lr, test_size, seed, oracle) -> np.ndarray:
    reps = reps[..., None] if reps.ndim == 2 else reps
    n, k, d = reps.shape
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    n_test = int(round(test_size * n))
    te, tr = perm[:n_test], perm[n_test:]
    x = torch.as_tensor(reps, dtype=torch.float32)
    x = (x - x[tr].mean(0)) / x[tr].std(0).clamp_min(1e-6)
    c = torch.as_tensor(c_true, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    w1 = (torch.randn(k, k, d, hidden, generator=g) / d**0.5).requires_grad_()
    b1 = torch.zeros(k, k, 1, hidden, requires_grad=True)
    w2 = (torch.randn(k, k, hidden, generator=g) / hidden**0.5).requires_grad_()
    b2 = torch.zeros(k, k, 1, requires_grad=True)

    def logits(idx):  # pair (i, j): representation i -> concept j, for all pairs at once: (K, K, n)
        xi = x[idx].permute(1, 0, 2).unsqueeze(1)                      # (K, 1, n, d)
        h = torch.relu(torch.matmul(xi, w1) + b1)                      # (K, K, n, hidden)
        return torch.matmul(h, w2.unsqueeze(-1)).squeeze(-1) + b2       # (K, K, n)

    target = c[tr].T.unsqueeze(0).expand(k, k, len(tr))  # [i, j, n] = c_j
    opt = torch.optim.Adam([w1, b1, w2, b2], lr=lr)
    for _ in range(steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(tr), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        s = logits(te).numpy()
    labels = np.broadcast_to(c_true[te].T[None], s.shape)
    auc = roc_auc_rows(s.reshape(k * k, -1), labels.reshape(k * k, -1)).reshape(k, k)
    if oracle:
        np.fill_diagonal(auc, 1.0)
    return auc


_ORACLES: dict[tuple, np.ndarray] = {}  # the oracle matrix depends on the true concepts only: computed once per test set


def oracle_impurity_score(reps: np.ndarray, c_true: np.ndarray, seed: int = 0, **kw) -> float:
    k = c_true.shape[1]
    pred = purity_matrix(reps, c_true, seed=seed, **kw)
    key = (hash(np.ascontiguousarray(c_true, dtype=np.float32).tobytes()), c_true.shape, seed, tuple(sorted(kw.items())))
    if key not in _ORACLES:
        _ORACLES[key] = purity_matrix(c_true.astype(np.float32), c_true, seed=seed, oracle=True, **kw)
    oracle = _ORACLES[key]
    return float(np.linalg.norm(np.abs(oracle - pred), ord="fro") / (k / 2))


def niche_impurity_score(c_soft: np.ndarray, c_true: np.ndarray, delta_beta: float = 0.05, test_size: float = 0.2,
                         seed: int = 0, max_iter: int = 200, mode: str = "refit") -> float:
    """NIS = sum_beta trapezoid of NI_beta, NI_beta = mean_j AUC(c_j | soft concepts outside niche_j(beta))."""
    from sklearn.model_selection import train_test_split

    if mode not in ("refit", "reference"):
        raise ValueError(f"NIS mode must be 'refit' or 'reference', got {mode!r}")
    xs_tr, xs_te, c_tr, c_te = train_test_split(c_soft, c_true.astype(int), test_size=test_size, random_state=seed)
    k = c_true.shape[1]
    corr = np.nan_to_num(np.corrcoef(np.hstack([xs_tr, c_tr]).T)[:k, k:])  # [i, j]: soft concept i vs true concept j
    score = (_ni_refit if mode == "refit" else _ni_reference)(xs_tr, xs_te, c_tr, c_te, max_iter)
    betas = np.arange(0.0, 1.0, delta_beta)
    ni = np.array([score(np.abs(corr) > beta) for beta in betas])  # niches[i, j]: soft i is in the niche of concept j
    return float(((ni[1:] + ni[:-1]) * delta_beta / 2).sum())  # trapezoid over beta, as the reference


def _mlp(max_iter: int):
    from sklearn.neural_network import MLPClassifier

    return MLPClassifier((20, 20), random_state=1, max_iter=max_iter)  # the reference's predictor (it allows 1000 iterations)


def _ni_refit(xs_tr, xs_te, c_tr, c_te, max_iter):
    """NI_beta with a predictor of c_j fitted on the outside-niche soft concepts only (cached per distinct niche)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import roc_auc_score

    cache: dict[tuple[int, bytes], float] = {}

    def auc(j: int, inside: np.ndarray) -> float:
        key = (j, inside.tobytes())
        if key not in cache:
            yj = c_te[:, j]
            if inside.all() or c_tr[:, j].min() == c_tr[:, j].max() or yj.min() == yj.max():
                cache[key] = 0.5  # nothing outside the niche (or one class only): chance
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    clf = _mlp(max_iter).fit(xs_tr[:, ~inside], c_tr[:, j])
                cache[key] = float(roc_auc_score(yj, clf.predict_proba(xs_te[:, ~inside])[:, 1]))
        return cache[key]

    return lambda niches: float(np.mean([auc(j, niches[:, j]) for j in range(niches.shape[1])]))


def _ni_reference(xs_tr, xs_te, c_tr, c_te, max_iter):
    """NI_beta as the reference code computes it: one full-input MLP, niche zeroed, softmax over concepts, macro AUC."""
    from scipy.special import softmax
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import roc_auc_score

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = _mlp(max_iter).fit(xs_tr, c_tr)
    keep = (c_te.min(0) == 0) & (c_te.max(0) == 1)

    def score(niches: np.ndarray) -> float:
        k = niches.shape[1]
        preds = np.stack([clf.predict_proba(np.where(niches[:, j][None, :], 0.0, xs_te))[:, j] for j in range(k)], 1)
        return float(roc_auc_score(c_te[:, keep], softmax(preds, axis=1)[:, keep]))

    return score


def class_leakage(c_probs: np.ndarray, y: np.ndarray, test_size: float = 0.3, seed: int = 0) -> dict[str, float]:
    """Probe accuracy of y from soft concept probabilities, from hard concepts, and their difference (the leakage)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    if len(y) < 20 or len(np.unique(y)) < 2:
        return {}  # too few points for a held-out probe (e.g. a smoke run's two batches)
    counts = np.unique(y, return_counts=True)[1]
    stratify = y if counts.min() >= 2 and len(counts) <= test_size * len(y) else None
    tr, te = train_test_split(np.arange(len(y)), test_size=test_size, random_state=seed, stratify=stratify)
    if len(np.unique(y[tr])) < 2:
        return {}
    accs = {}
    for name, feats in (("soft", c_probs), ("hard", (c_probs > 0.5).astype(np.float32))):
        probe = LogisticRegression(max_iter=300).fit(feats[tr], y[tr])
        accs[name] = float((probe.predict(feats[te]) == y[te]).mean())
    return {"probe_soft": accs["soft"], "probe_hard": accs["hard"], "leakage": accs["soft"] - accs["hard"]}
