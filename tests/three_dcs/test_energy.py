"""Energy metrics against scipy/sklearn and hand-computed cases; the published window protocol."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ks_2samp, spearmanr
from sklearn.metrics import roc_auc_score

from lit_iclr.three_dcs.distances import condensed, euclidean_distance
from lit_iclr.three_dcs.energy import EnergySpec, ejs, energy_metrics, energy_spec, jump_scale, window_starts


def window(n=30, seed=0):
    rng = np.random.default_rng(seed)
    E = rng.normal(scale=3.0, size=n)
    Z = np.c_[E, rng.normal(size=(n, 3))]  # representation partly follows the energy
    return E, euclidean_distance(Z) / 10


def test_published_window_starts():
    assert window_starts(100_000, 100, 2000, 2025)[:3].tolist() == [43852, 97456, 97273]


def test_rank_metrics_and_roc_equal_scipy_sklearn():
    E, Delta = window()
    out = energy_metrics(E, Delta, energy_spec("v2"))
    dE = condensed(np.abs(E[:, None] - E[None, :]))
    x = condensed(Delta)
    assert out["spearman"] == pytest.approx(spearmanr(dE, x)[0])
    sigma = np.sqrt(np.mean(dE**2))
    assert out["ROC_AUC"] == pytest.approx(roc_auc_score(dE > 2 * sigma, x))
    assert out["spearman"] > 0.3  # the representation carries the energy


def test_jump_scales_and_ejs_hand_case():
    dE = np.array([1.0, 2.0, 3.0, 10.0])
    assert jump_scale(dE, "robust") == pytest.approx(2.5 / 0.6744897501960817, rel=1e-9)
    assert jump_scale(dE, "rms") == pytest.approx(np.sqrt((1 + 4 + 9 + 100) / 4))
    delta = np.array([0.1, 0.2, 0.9, 0.8])  # 0.75-quantile 0.825
    value, n = ejs(dE, delta, lam=1.0, sigma=2.5)  # jumps: dE > 2.5 -> {3, 10}, Delta {0.9, 0.8}: one above
    assert (value, n) == (pytest.approx(0.5), 2)


def test_cka_bandwidth_versions():
    E, Delta = window()
    p = energy_metrics(E, Delta, energy_spec("paper", low_precision=False))
    v = energy_metrics(E, Delta, energy_spec("v2"))
    assert p["cka_rbf"] != pytest.approx(v["cka_rbf"])  # shared vs separate bandwidth
    same = energy_metrics(E, np.abs(E[:, None] - E[None, :]), energy_spec("v2"))
    assert same["cka_rbf"] == pytest.approx(1.0) and same["spearman"] == pytest.approx(1.0)


def test_smoothness_versions_hand_case():
    E = np.array([0.0, 1.0, 3.0, 6.0])
    Z = np.array([[0.0], [0.1], [0.3], [0.6]])
    Delta = euclidean_distance(Z)
    v = energy_metrics(E, Delta, energy_spec("v2"))
    dE, x = condensed(np.abs(E[:, None] - E[None, :])), condensed(Delta)
    qz, qe = np.quantile(x, 0.9) + 1e-12, np.quantile(dE, 0.9) + 1e-12
    steps = np.array([1.0, 2.0, 3.0])
    expect = np.exp(-(steps / 10 / qz) / (steps / qe + 1e-12))
    assert v["Smoothness"] == pytest.approx(expect.mean())
    assert v["TS"] == pytest.approx(expect[steps > 0.2 * qe].mean())
    p = energy_metrics(E, Delta, energy_spec("paper"))
    assert p["Smoothness"] == pytest.approx(np.mean(np.exp(-(steps / 10) / (steps + 1e-8))), rel=1e-3)  # float16 Delta
    assert np.isnan(energy_metrics(E, Delta, EnergySpec(time_ordered=False))["TS"])  # v2 needs time order
    assert p["KS"] == pytest.approx(ks_2samp(x.astype(np.float16).astype(float), dE).statistic)


def test_cka_kendall_w1_against_explicit_formulas():
    from scipy.stats import kendalltau, wasserstein_distance

    E, Delta = window(20, seed=3)
    dEm = np.abs(E[:, None] - E[None, :])
    dE, x = condensed(dEm), condensed(Delta)
    H = np.eye(20) - 1 / 20

    def cka(KA, KB):
        A, B = H @ KA @ H, H @ KB @ H
        return np.sum(A * B) / (np.linalg.norm(A) * np.linalg.norm(B))

    both = np.concatenate([dE, x])
    s2 = np.median(both[both > 0] ** 2)  # paper: one bandwidth over both distance sets
    p = energy_metrics(E, Delta, energy_spec("paper", low_precision=False))
    assert p["cka_rbf"] == pytest.approx(cka(np.exp(-dEm**2 / (2 * s2)), np.exp(-Delta**2 / (2 * s2))), rel=1e-6)
    v = energy_metrics(E, Delta, energy_spec("v2"))
    assert v["kendall"] == pytest.approx(kendalltau(dE, x)[0])
    qz, qe = np.quantile(x, 0.9), np.quantile(dE, 0.9)
    assert v["W1"] == pytest.approx(wasserstein_distance(x / qz, dE / qe), rel=1e-6)
    assert p["EJS_num_jumps_lam2"] == int((dE > 2 * np.median(dE) / 0.6744897501960817).sum())
