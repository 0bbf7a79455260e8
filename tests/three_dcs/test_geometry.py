"""Geometry metrics against scipy, explicit matrix formulas, brute-force loops and hand-computed cases."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import pdist, squareform
from scipy.stats import kendalltau, spearmanr

from lit_iclr.three_dcs.distances import cka_rbf, cosine_distance, euclidean_distance, isotonic_r2, tanimoto_distance
from lit_iclr.three_dcs.geometry import (
    angular_smoothness,
    cka_paper_run,
    geometry_metrics,
    geometry_spec,
    lie_at_k,
)


def random_pair(n=12, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    Z = X @ rng.normal(size=(3, 8)) + 0.3 * rng.normal(size=(n, 8))
    return squareform(pdist(X)), Z


def test_distances_match_scipy():
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(9, 5))
    assert np.allclose(cosine_distance(Z), squareform(pdist(Z, "cosine")), atol=1e-10)
    assert np.allclose(euclidean_distance(Z), squareform(pdist(Z)), atol=1e-7)
    B = rng.random((9, 64)) > 0.6
    assert np.allclose(tanimoto_distance(B), squareform(pdist(B, "jaccard")))  # Tanimoto = Jaccard on bits


def test_rank_correlations_equal_scipy_on_the_upper_triangle():
    D, Z = random_pair()
    Delta = cosine_distance(Z)
    iu = np.triu_indices(12, 1)
    out = geometry_metrics(D, Delta, None, geometry_spec("v2"), Z)
    assert out["A1_spearman"] == pytest.approx(spearmanr(D[iu], Delta[iu])[0])
    assert out["A2_kendall"] == pytest.approx(kendalltau(D[iu], Delta[iu])[0])
    # paper runs: Kendall only from 11 conformers on
    assert np.isnan(geometry_metrics(D[:10, :10], Delta[:10, :10], None, geometry_spec("paper"))["A2_kendall"])
    assert np.isfinite(geometry_metrics(D[:11, :11], Delta[:11, :11], None, geometry_spec("paper"))["A2_kendall"])


def test_lie_matches_a_per_conformer_loop():
    D, Z = random_pair(15)
    Delta = cosine_distance(Z)
    for k, include_self in ((10, True), (3, False), (14, False)):
        vals = []
        for i in range(15):
            if include_self:
                nb = np.argpartition(D[i], k)[:k]
            else:
                nb = [j for j in np.argsort(D[i], kind="stable") if j != i][:k]
            a, b = D[i, nb], Delta[i, nb]
            vals.append(np.sqrt(np.mean((a / (a.mean() + 1e-12) - b / (b.mean() + 1e-12)) ** 2)))
        assert lie_at_k(D, Delta, k, include_self) == pytest.approx(np.mean(vals))
    assert lie_at_k(D, 3.0 * D, 3, False) == pytest.approx(0.0, abs=1e-9)  # a rescaled copy is locally isometric


def test_cka_against_explicit_centring_matrices():
    D, Z = random_pair(10)
    Delta = euclidean_distance(Z)
    H = np.eye(10) - np.ones((10, 10)) / 10
    iu = np.triu_indices(10, 1)

    def explicit(KA, KB):
        A, B = H @ KA @ H, H @ KB @ H
        return np.sum(A * B) / (np.linalg.norm(A) * np.linalg.norm(B))

    def k2(M):  # App. C.3 median heuristic on positive squared distances
        s2 = np.median(M[iu] ** 2)
        return np.exp(-(M**2) / (2 * s2))

    assert cka_rbf(D, Delta) == pytest.approx(explicit(k2(D), k2(Delta)), rel=1e-6)

    def kp(M):  # published geometry runs
        return np.exp(-(M**2) / np.median(M[iu]) ** 2)

    assert cka_paper_run(D, Delta) == pytest.approx(explicit(kp(D), kp(Delta)), rel=1e-9)
    assert cka_rbf(D, D) == pytest.approx(1.0)


def test_isotonic_r2_hand_case_and_direction():
    # fit y = f(x) non-decreasing on x = 1, 2, 3, y = 1, 3, 2: pooled [1, 2.5, 2.5], SS_res 0.5, SS_tot 2 -> 0.75
    assert isotonic_r2(np.array([1.0, 2, 3]), np.array([1.0, 3, 2])) == pytest.approx(0.75, abs=1e-9)
    assert np.isnan(isotonic_r2(np.ones(4), np.arange(4.0)))  # guarded: constant x
    assert isotonic_r2(np.ones(1), np.ones(1), guard=False) == pytest.approx(1.0)  # paper: one pair scores 1
    D, Z = random_pair(8)
    const = np.ones((8, 8)) - np.eye(8)
    # a constant representation explains nothing when D is fit on Delta (v2/App. C.3)
    assert geometry_metrics(D, const, None, geometry_spec("v2"))["J_isotonic_R2"] != pytest.approx(1.0)


def test_angular_smoothness_hand_case():
    phi = np.array([0.0, 90.0, 180.0, 270.0])
    Z = np.array([[0.0, 0], [1, 0], [1, 1], [0, 1]])  # unit steps between neighbours, sqrt(2) across
    Delta = euclidean_distance(Z)
    step = np.pi / 2
    # v2: median ||dz|| / dphi over 3 linear steps
    assert angular_smoothness(phi, "median_dz_linear", Delta, Z) == pytest.approx(1 / step)
    # circular steps include 270 -> 0 (distance 1, 90 degrees)
    assert angular_smoothness(phi, "mean_delta_circular", Delta) == pytest.approx(1 / step)
    assert angular_smoothness(phi, "median_halfdelta_circular", Delta) == pytest.approx(0.5 / step)


def test_torsion_sp_uses_circular_distance():
    phi = np.array([-170.0, 170.0, 60.0])  # circular: 20, 130, 110 degrees; linear would put the first pair last
    Z = np.array([[0.0], [0.35], [2.0]])  # Delta: 0.35, 2.0, 1.65 (same order as the circular distances)
    out = geometry_metrics(np.ones((3, 3)) - np.eye(3), euclidean_distance(Z), phi, geometry_spec("v2"), Z)
    assert out["torsion_sp"] == pytest.approx(1.0)


def test_rmsd_reference_is_alignment_invariant(tiny_3dcs):
    from rdkit import Chem
    from rdkit.Geometry import Point3D

    from lit_iclr.three_dcs.formats import read_rotation
    from lit_iclr.three_dcs.geometry import rmsd_matrix

    g = read_rotation(tiny_3dcs)[0]
    m0 = Chem.Mol(g.mols[0])
    moved = Chem.Mol(m0)
    R = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))[0]
    R *= np.sign(np.linalg.det(R))  # proper rotation
    X = m0.GetConformer().GetPositions() @ R.T + 5.0
    for i, p in enumerate(X):
        moved.GetConformer().SetAtomPosition(i, Point3D(*p))
    D = rmsd_matrix([m0, moved, g.mols[len(g.mols) // 2]])
    assert D[0, 1] == pytest.approx(0.0, abs=1e-4)
    assert D[0, 2] > 0.1 and np.allclose(D, D.T)
