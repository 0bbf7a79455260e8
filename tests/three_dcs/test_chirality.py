"""Chirality metrics against sklearn, brute force and hand-computed cases."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import davies_bouldin_score, roc_auc_score, silhouette_score

from lit_iclr.three_dcs.chirality import (
    chirality_metrics,
    chirality_spec,
    davies_bouldin,
    es_auc,
    hopkins,
    k_medoids,
    nn1_accuracy,
    sci_unsup,
    silhouette,
)
from lit_iclr.three_dcs.distances import euclidean_distance


def blobs(seed=0, n=(5, 4, 3)):
    rng = np.random.default_rng(seed)
    X = np.concatenate([rng.normal(loc=3 * k, size=(m, 4)) for k, m in enumerate(n)])
    y = np.repeat(np.arange(len(n)), n)
    return X, y


def test_es_auc_equals_sklearn_with_ties():
    X, y = blobs()
    D = np.round(euclidean_distance(X), 0)  # many ties
    iu = np.triu_indices(len(y), 1)
    assert es_auc(D, y) == pytest.approx(roc_auc_score((y[:, None] != y[None, :])[iu], D[iu]))
    assert np.isnan(es_auc(D, np.zeros(len(y))))


def test_silhouette_equals_sklearn_including_singletons():
    X, y = blobs(n=(5, 4, 1))
    D = euclidean_distance(X)
    assert silhouette(D, y) == pytest.approx(silhouette_score(D, y, metric="precomputed"))
    assert np.isnan(silhouette(D, np.arange(len(y))))  # every class a singleton


def test_nn1_paper_and_tie_aware():
    X, y = blobs(1)
    D = euclidean_distance(X)
    brute = np.mean([y[min((j for j in range(len(y)) if j != i), key=lambda j: D[i, j])] == y[i] for i in range(len(y))])
    assert nn1_accuracy(D, y, tie_aware=False) == pytest.approx(brute)
    # hand case: point 0 has two tied nearest neighbours, one of each label; class 2 is a singleton (not scored in v2)
    D = np.array([[0, 1, 1, 5], [1, 0, 2, 5], [1, 2, 0, 5], [5, 5, 5, 0.0]])
    y = np.array([0, 0, 1, 2])
    # v2 eligible points: 0 (score 1/2) and 1 (nearest 0: same label, 1) -> 0.75
    assert nn1_accuracy(D, y, tie_aware=True) == pytest.approx(0.75)
    # paper: argmin picks index 1 for point 0 (correct), 0 for point 1 (correct), 0 for 2 and 3 (wrong) -> 0.5
    assert nn1_accuracy(D, y, tie_aware=False) == pytest.approx(0.5)


def test_davies_bouldin_centroid_equals_sklearn_and_medoid_hand_case():
    X, y = blobs(2)
    assert davies_bouldin(euclidean_distance(X), y, X, centroid=True) == pytest.approx(davies_bouldin_score(X, y), rel=1e-6)
    # medoids: class 0 = {0, 1} (tie -> first member, 0), class 1 = {2}; S_0 = 0.5, S_1 = 0; M = D[0, 2] = 4
    D = np.array([[0, 1, 4], [1, 0, 5], [4, 5, 0.0]])
    assert davies_bouldin(D, np.array([0, 0, 1]), None, centroid=False) == pytest.approx((0.5 + 0) / 4)


def test_hopkins_brute_force_and_cluster_tendency():
    X, _ = blobs(3, n=(20, 20))
    rng = np.random.default_rng(0)
    m = 10
    U = rng.uniform(X.min(0), X.max(0), size=(m, 4))
    idx = rng.choice(40, size=m, replace=False)
    u = np.array([np.min(np.linalg.norm(X - p, axis=1)) for p in U])
    w = np.array([np.min([np.linalg.norm(X[i] - X[j]) for j in range(40) if j != i]) for i in idx])
    assert hopkins(X) == pytest.approx(u.sum() / (u.sum() + w.sum()), rel=1e-9)
    rng = np.random.default_rng(1)
    tight = np.concatenate([rng.normal(0, 0.1, (20, 4)), rng.normal(5, 0.1, (20, 4))])
    assert hopkins(tight) > 0.9 and 0.3 < hopkins(rng.uniform(size=(40, 4))) < 0.7  # clusters vs no structure
    assert np.isnan(hopkins(X[:9]))


def test_unsupervised_sci_matches_best_kmeans_silhouette():
    X, _ = blobs(4, n=(6, 6))
    best = max(silhouette_score(X, KMeans(k, n_init=10, random_state=0).fit_predict(X)) for k in range(2, 6))
    assert sci_unsup(X, euclidean_distance(X), kmax=5, on_delta=False, fingerprint=False) == pytest.approx(best)
    lab = k_medoids(euclidean_distance(X), 2)
    assert len(set(lab[:6])) == 1 and len(set(lab[6:])) == 1 and lab[0] != lab[6]


def test_versions_differ_where_the_docs_say():
    X, y = blobs(5, n=(4, 4, 1))
    D = euclidean_distance(X)
    p = chirality_metrics(D, y, X, chirality_spec("paper"))
    v = chirality_metrics(D, y, X, chirality_spec("v2"))
    assert p["ES_AUC"] == v["ES_AUC"] and p["SCI"] == v["SCI"]  # identical in both versions
    assert p["NN1_acc"] != v["NN1_acc"]  # the singleton point counts (as 0) only in paper
    fp = chirality_metrics(D, y, None, chirality_spec("paper"))
    assert np.isnan(fp["Hopkins"])  # no Hopkins for fingerprints
