"""Representation distances within one molecule, condensed pair vectors, and the shared estimators (ranks, CKA, isotonic R^2).

Every function works on whole matrices at once (no loop over conformers or pairs): the within-molecule distance matrix
`Delta` is one matrix product, and the pair statistics run on its upper triangle (`condensed`).
"""
from __future__ import annotations

import numpy as np
from scipy.stats import rankdata
from sklearn.isotonic import IsotonicRegression

EPS = 1e-12


def condensed(M: np.ndarray) -> np.ndarray:
    """Upper triangle (i < j) of a square matrix, row by row (scipy's `squareform` order)."""
    iu = np.triu_indices(M.shape[0], 1)
    return np.asarray(M, dtype=np.float64)[iu]


def cosine_distance(Z: np.ndarray) -> np.ndarray:
    """`1 - cos(z_i, z_j)` with the 1e-12 norm guard of the reference code and an exact 0 diagonal."""
    Z = np.asarray(Z, dtype=np.float64)
    X = Z / (np.linalg.norm(Z, axis=1, keepdims=True) + EPS)
    D = 1.0 - np.clip(X @ X.T, -1.0, 1.0)
    np.fill_diagonal(D, 0.0)
    return D


def stored_half_cosine(Z: np.ndarray) -> np.ndarray:
    """`(1 - cos)/2` as the released energy evaluator stores it (three_dbench `pairwise_distances_from_embeddings_large`):
    float32 rows normalised, their products divided again by the normalised norms (+1e-12), clipped, cast to float16;
    returned as float64 with a 0 diagonal. Computed in float64 instead, about one pair in a thousand lands one float16
    step away."""
    X = np.asarray(Z, dtype=np.float32)
    X = X / (np.linalg.norm(X, axis=1, keepdims=True).astype(np.float32) + np.float32(EPS))
    nrm = np.linalg.norm(X, axis=1, keepdims=True) + np.float32(EPS)
    S = np.clip((X @ X.T) / (nrm * nrm.T), np.float32(-1.0), np.float32(1.0))
    D = (np.float32(0.5) * (np.float32(1.0) - S)).astype(np.float16).astype(np.float64)
    np.fill_diagonal(D, 0.0)
    return D


def euclidean_distance(Z: np.ndarray) -> np.ndarray:
    """`||z_i - z_j||_2` from the Gram matrix (clamped at 0 against round-off)."""
    Z = np.asarray(Z, dtype=np.float64)
    sq = (Z * Z).sum(1)
    D2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (Z @ Z.T), 0.0)
    np.fill_diagonal(D2, 0.0)
    return np.sqrt(D2)


def tanimoto_distance(B: np.ndarray) -> np.ndarray:
    """`1 - |F_i & F_j| / |F_i | F_j|` for 0/1 bit vectors (RDKit's convention: two empty fingerprints have similarity 0)."""
    B = np.asarray(B, dtype=np.float64)
    inter = B @ B.T
    cnt = B.sum(1)
    union = cnt[:, None] + cnt[None, :] - inter
    sim = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    D = 1.0 - sim
    np.fill_diagonal(D, 0.0)
    return D


def representation_distance(Z: np.ndarray, metric: str) -> np.ndarray:
    """Within-molecule distance matrix: `cosine` (1 - cos), `half_cosine` ((1 - cos)/2, the energy axis),
    `stored_half_cosine` (the same in the reference code's float32 -> float16 storage), `euclidean`, or `tanimoto`
    (bit vectors; used for fingerprints whatever the metric asked, as the reference evaluators do)."""
    if metric == "tanimoto":
        return tanimoto_distance(Z)
    if metric == "cosine":
        return cosine_distance(Z)
    if metric == "half_cosine":
        return 0.5 * cosine_distance(Z)
    if metric == "stored_half_cosine":
        return stored_half_cosine(Z)
    if metric == "euclidean":
        return euclidean_distance(Z)
    raise ValueError(f"unknown distance {metric!r}; expected cosine, half_cosine, stored_half_cosine, euclidean or "
                     "tanimoto")


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC-AUC as the Mann-Whitney statistic with average ranks (ties count 1/2, as `sklearn.metrics.roc_auc_score`).

    NaN when only one class is present.
    """
    labels = np.asarray(labels, dtype=bool)
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(scores)
    return float((r[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def isotonic_r2(x: np.ndarray, y: np.ndarray, guard: bool = True) -> float:
    """R^2 of the non-decreasing fit `y_hat = f_iso(x)`: `1 - SS_res / (SS_tot + 1e-12)`.

    `guard` returns NaN for fewer than 2 pairs or a constant `x` (v2); without it a single pair scores 1.0 (paper runs).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size == 0 or (guard and (x.size < 2 or np.allclose(x.min(), x.max()))):
        return float("nan")
    yhat = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(x, y).predict(x)
    ss_res = float(np.sum((y - yhat) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2)) + EPS
    return 1.0 - ss_res / ss_tot


def median_sigma(d: np.ndarray) -> float:
    """Median heuristic `sigma = sqrt(median{d^2 : d > 0} + eps)` (1.0 when no positive distance)."""
    d = np.asarray(d, dtype=np.float64)
    pos = d[np.isfinite(d) & (d > 0)]
    return float(np.sqrt(np.median(pos * pos) + EPS)) if pos.size else 1.0


def centred_cka(KA: np.ndarray, KB: np.ndarray) -> float:
    """`<HKaH, HKbH>_F / (||HKaH||_F ||HKbH||_F)` with `H = I - 11^T/n` (centring by row/column means, no n x n product)."""

    def centre(K):
        return K - K.mean(0, keepdims=True) - K.mean(1, keepdims=True) + K.mean()

    A, B = centre(KA), centre(KB)
    den = float(np.linalg.norm(A) * np.linalg.norm(B))
    return float(np.sum(A * B) / (den + 1e-20)) if den > 0 else float("nan")


def rbf_kernel(D: np.ndarray, sigma: float) -> np.ndarray:
    """`exp(-d^2 / (2 sigma^2 + eps))` with a unit diagonal (App. C.3)."""
    K = np.exp(-(np.asarray(D, dtype=np.float64) ** 2) / (2.0 * sigma * sigma + EPS))
    np.fill_diagonal(K, 1.0)
    return K


def cka_rbf(D: np.ndarray, Delta: np.ndarray, shared_sigma: bool = False) -> float:
    """RBF-CKA of two distance matrices; median-heuristic bandwidths per matrix, or one over both (`shared_sigma`)."""
    if D.shape[0] < 2:
        return float("nan")
    a, b = condensed(D), condensed(Delta)
    if shared_sigma:
        sa = sb = median_sigma(np.concatenate([a, b]))
    else:
        sa, sb = median_sigma(a), median_sigma(b)
    return centred_cka(rbf_kernel(D, sa), rbf_kernel(Delta, sb))


def circular_distance(phi_deg: np.ndarray) -> np.ndarray:
    """`min(|phi_i - phi_j|, 2 pi - |phi_i - phi_j|)` in radians, all pairs."""
    phi = np.mod(np.deg2rad(np.asarray(phi_deg, dtype=np.float64).reshape(-1)), 2 * np.pi)
    d = np.abs(phi[:, None] - phi[None, :])
    return np.minimum(d, 2 * np.pi - d)


def mean_ci(values) -> tuple[float, float, int]:
    """Mean, 95% half-width `1.96 sd(ddof=1)/sqrt(n)` and n over the finite values (the reference summaries)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan"), 0
    half = 1.96 * v.std(ddof=1) / np.sqrt(v.size) if v.size > 1 else float("nan")
    return float(v.mean()), float(half), int(v.size)
