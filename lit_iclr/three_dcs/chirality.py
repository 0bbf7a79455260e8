"""Chirality axis (stereoisomers): do a molecule's conformer embeddings separate its stereoisomer labels?

Per molecule (all conformers of all its stereoisomers, labels `y` = stereoisomer id incl. diastereomers): ES-AUC,
NN@1 accuracy, SCI (silhouette with the labels), Hopkins statistic, unsupervised SCI (best-k k-means silhouette) and
the Davies-Bouldin index. `paper` reproduces Table 2's code path, `v2` follows App. C.5; each difference is a field of
`ChiralitySpec`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from .distances import EPS, condensed, euclidean_distance, roc_auc


@dataclass(frozen=True)
class ChiralitySpec:
    """nn1_tie_aware: score tied nearest neighbours by their label share and skip points whose class has no other member
        (v2) instead of `argmin` over all points (paper).
    dbi_centroid: Davies-Bouldin with class centroids of the vectors (v2, App. C.5) instead of medoids of Delta (paper).
    unsup_on_delta: unsupervised silhouette on the chosen Delta (v2) instead of Euclidean on the raw vectors (paper).
    hopkins_normalised: Hopkins on L2-normalised vectors when the distance is cosine (v2).
    hopkins_supervised_only: Hopkins only for molecules that enter the supervised metrics (v2).
    unsup_kmax: largest k of the k-means scan (None: n - 1, the published run).
    """

    nn1_tie_aware: bool = True
    dbi_centroid: bool = True
    unsup_on_delta: bool = True
    hopkins_normalised: bool = True
    hopkins_supervised_only: bool = True
    unsup_kmax: int | None = None


PRESETS = {
    "paper": ChiralitySpec(nn1_tie_aware=False, dbi_centroid=False, unsup_on_delta=False, hopkins_normalised=False,
                           hopkins_supervised_only=False),
    "v2": ChiralitySpec(),
    # the released package (three_dbench 0.1.0, evaluate_en_separation): the paper path with k <= 10 in the k-means scan
    "release": ChiralitySpec(nn1_tie_aware=False, dbi_centroid=False, unsup_on_delta=False, hopkins_normalised=False,
                             hopkins_supervised_only=False, unsup_kmax=10),
}


def chirality_spec(version: str = "paper", **overrides) -> ChiralitySpec:
    if version not in PRESETS:
        raise ValueError(f"metric version must be one of {tuple(PRESETS)}, got {version!r}")
    return replace(PRESETS[version], **{k: v for k, v in overrides.items() if v is not None})


def es_auc(Delta: np.ndarray, y: np.ndarray) -> float:
    """ROC-AUC of `Delta_ij` for predicting `y_i != y_j` over the pairs i < j (NaN if all pairs share or differ)."""
    y = np.asarray(y)
    return roc_auc(condensed(Delta), condensed((y[:, None] != y[None, :]).astype(float)) > 0)


def nn1_accuracy(Delta: np.ndarray, y: np.ndarray, tie_aware: bool) -> float:
    """Leave-one-out 1-NN accuracy. Paper: `argmin_{j != i}` (lowest index wins ties) over all points. Tie-aware (v2):
    each point scores the share of its exactly tied nearest neighbours with its label; only points whose class has
    another member count."""
    y = np.asarray(y)
    n = len(y)
    D = np.asarray(Delta, dtype=np.float64).copy()
    np.fill_diagonal(D, np.inf)
    same = y[:, None] == y[None, :]
    if not tie_aware:
        return float((y[np.argmin(D, 1)] == y).mean()) if n > 1 else float("nan")
    tied = D == D.min(1, keepdims=True)
    score = (tied & same).sum(1) / tied.sum(1)
    eligible = same.sum(1) > 1  # the point itself plus at least one other member
    return float(score[eligible].mean()) if eligible.any() else float("nan")


def silhouette(Delta: np.ndarray, y: np.ndarray) -> float:
    """Mean silhouette `(b_i - a_i) / max(a_i, b_i)` from a precomputed distance matrix (singleton classes score 0);
    NaN unless 2 <= n_labels <= n - 1 (sklearn's rule)."""
    y = np.asarray(y)
    labels, inv = np.unique(y, return_inverse=True)
    n, c = len(y), len(labels)
    if n < 3 or not 2 <= c <= n - 1:
        return float("nan")
    Y = np.eye(c)[inv]  # one-hot (n, c)
    S = np.asarray(Delta, dtype=np.float64) @ Y  # sum of distances from each point to each class
    cnt = Y.sum(0)
    own = cnt[inv]
    a = S[np.arange(n), inv] / np.maximum(own - 1, 1)
    mean_other = S / cnt
    mean_other[np.arange(n), inv] = np.inf
    b = mean_other.min(1)
    s = np.where(own > 1, (b - a) / np.maximum(np.maximum(a, b), 1e-300), 0.0)
    return float(s.mean())


def hopkins(X: np.ndarray, seed: int = 0) -> float:
    """Hopkins statistic `H = sum u / (sum u + sum w)`: `u` nearest-data distances of m uniform points in the bounding
    box, `w` nearest-other-point distances of m sampled data points, `m = max(10, int(0.1 n))`; NaN for n < 10."""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    if n < 10:
        return float("nan")
    rng = np.random.default_rng(seed)
    m = max(10, int(0.1 * n))
    U = rng.uniform(X.min(0), X.max(0), size=(m, X.shape[1]))
    idx = rng.choice(n, size=m, replace=False)
    u = np.sqrt(np.maximum(((U[:, None, :] - X[None]) ** 2).sum(-1), 0)).min(1)
    Dw = euclidean_distance(X)[idx]
    Dw[np.arange(m), idx] = np.inf
    w = Dw.min(1)
    return float(u.sum() / (u.sum() + w.sum() + EPS))


def k_medoids(Delta: np.ndarray, k: int, seed: int = 0, iters: int = 50) -> np.ndarray:
    """Labels of a k-medoids clustering of a precomputed distance matrix (greedy BUILD, then alternate assignment and
    medoid update until stable); used for fingerprints, which have no centroid under Tanimoto."""
    D = np.asarray(Delta, dtype=np.float64)
    medoids = [int(np.argmin(D.sum(1)))]
    for _ in range(1, k):  # BUILD: add the point that lowers the total distance most
        cur = D[:, medoids].min(1)
        gain = np.maximum(cur[:, None] - D, 0).sum(0)
        gain[medoids] = -1
        medoids.append(int(np.argmax(gain)))
    medoids = np.array(medoids)
    for _ in range(iters):
        lab = np.argmin(D[:, medoids], 1)
        onehot = np.eye(k, dtype=bool)[lab]  # (n, k)
        cost = D @ onehot  # cost[p, c]: total distance of p to the members of cluster c
        cost[~onehot] = np.inf  # a medoid must be a member of its cluster
        new = np.argmin(cost, 0)
        if np.array_equal(new, medoids):
            break
        medoids = new
    return np.argmin(D[:, medoids], 1)


def sci_unsup(X: np.ndarray | None, Delta: np.ndarray, kmax: int | None, on_delta: bool, fingerprint: bool) -> float:
    """Best silhouette over k = 2..kmax of k-means labels (k-medoids on Delta for fingerprints); NaN for n < 3."""
    from sklearn.cluster import KMeans
    from sklearn.exceptions import ConvergenceWarning

    n = Delta.shape[0]
    if n < 3:
        return float("nan")
    kmax = n - 1 if kmax is None else min(int(kmax), n - 1)
    Dx = Delta if (on_delta or fingerprint) else euclidean_distance(X)
    best = -np.inf
    for k in range(2, kmax + 1):  # a scan over candidate k, each a full clustering
        if fingerprint:
            lab = k_medoids(Delta, k)
        else:
            with warnings.catch_warnings():  # duplicate points give fewer distinct clusters than k: expected here
                warnings.simplefilter("ignore", ConvergenceWarning)
                lab = KMeans(n_clusters=k, n_init=10, random_state=0).fit_predict(X)
        s = silhouette(Dx, lab)
        if np.isfinite(s):
            best = max(best, s)
    return float(best) if np.isfinite(best) else float("nan")


def davies_bouldin(Delta: np.ndarray, y: np.ndarray, X: np.ndarray | None, centroid: bool) -> float:
    """DBI = mean_c max_{d != c} (S_c + S_d) / M_cd. Centroid (v2, = sklearn on non-degenerate input): S_c mean distance
    of members to the class mean of X, M_cd centroid distance (+1e-12). Medoid (paper): medoid of Delta per class,
    S_c mean Delta to it, M_cd = Delta(m_c, m_d), no epsilon."""
    y = np.asarray(y)
    labels, inv = np.unique(y, return_inverse=True)
    c = len(labels)
    if c < 2:
        return float("nan")
    Y = np.eye(c)[inv]
    cnt = Y.sum(0)
    if centroid and not (cnt > 1).any():
        return float("nan")  # v2: every class a singleton, S = 0 whatever the representation
    if centroid and X is not None:
        mu = (Y.T @ X) / cnt[:, None]
        S = (np.linalg.norm(X - mu[inv], axis=1) @ Y) / cnt
        M = euclidean_distance(mu) + EPS
    else:  # medoid approximation on Delta (paper; v2 keeps it for fingerprints, with the epsilon)
        D = np.asarray(Delta, dtype=np.float64)
        med = np.argmin(np.where(Y > 0, D @ Y, np.inf), 0)  # member with the smallest summed distance to its class
        S = (D[:, med] * Y).sum(0) / cnt
        M = D[np.ix_(med, med)] + (EPS if centroid else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        R = (S[:, None] + S[None, :]) / M
    np.fill_diagonal(R, -np.inf)
    return float(np.nanmax(R, 1).mean())


def chirality_metrics(Delta: np.ndarray, y: np.ndarray, X: np.ndarray | None, spec: ChiralitySpec,
                      cosine: bool = False) -> dict[str, float]:
    """The Table-2 metrics of one molecule. `X` the vectors (None for fingerprints, then Delta is Tanimoto)."""
    y = np.asarray(y)
    n = len(y)
    fingerprint = X is None
    nan = float("nan")
    if n < 2:
        return dict.fromkeys(("ES_AUC", "NN1_acc", "SCI", "Hopkins", "SCI_unsup", "DBI"), nan)
    supervised = len(np.unique(y)) > 1
    Xu = None if fingerprint else np.asarray(X, dtype=np.float64)
    if Xu is not None and cosine and (spec.hopkins_normalised or spec.unsup_on_delta):
        Xn = Xu / (np.linalg.norm(Xu, axis=1, keepdims=True) + EPS)  # v2 with cosine: clustering on the unit sphere
    else:
        Xn = Xu
    out = {
        "ES_AUC": es_auc(Delta, y) if supervised else nan,
        "NN1_acc": nn1_accuracy(Delta, y, spec.nn1_tie_aware) if supervised else nan,
        "SCI": silhouette(Delta, y) if supervised else nan,
        "DBI": davies_bouldin(Delta, y, Xn if spec.dbi_centroid else None, spec.dbi_centroid) if supervised else nan,
    }
    hop_ok = not fingerprint and (supervised or not spec.hopkins_supervised_only)
    out["Hopkins"] = hopkins(Xn if spec.hopkins_normalised else Xu) if hop_ok else nan
    X_unsup = Xn if spec.unsup_on_delta else Xu
    out["SCI_unsup"] = sci_unsup(X_unsup, Delta, spec.unsup_kmax, spec.unsup_on_delta, fingerprint) if supervised else nan
    return out
