"""The video metrics against independent computation: FD against the closed form of two Gaussians, KID against a
direct double loop, jerk and flicker against hand cases, and the CLI logging them with the real-data floor."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_iclr.mosa.metrics import flicker, frechet_distance, frechet_gaussians, joint_jerk, kid


def _spd(rng, d):
    a = rng.normal(size=(d, d))
    return a @ a.T + d * np.eye(d)


def test_frechet_gaussians_equals_the_2x2_closed_form_for_non_commuting_covariances():
    # for 2x2 M with real positive eigenvalues: tr sqrt(M) = sqrt(tr M + 2 sqrt(det M))
    s1, s2 = np.array([[2.0, 0.7], [0.7, 1.0]]), np.array([[1.0, -0.4], [-0.4, 3.0]])
    assert not np.allclose(s1 @ s2, s2 @ s1)
    mu1, mu2 = np.array([0.5, -1.0]), np.array([2.0, 1.0])
    m = s1 @ s2
    tr_sqrt = np.sqrt(np.trace(m) + 2 * np.sqrt(np.linalg.det(m)))
    want = ((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * tr_sqrt
    assert frechet_gaussians(mu1, s1, mu2, s2) == pytest.approx(want, rel=1e-9)


def test_frechet_distance_of_samples_approaches_the_gaussians_closed_form():
    rng = np.random.default_rng(0)
    d = 4
    s1, s2 = _spd(rng, d), _spd(rng, d)
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    # closed form with the matrix square root by eigendecomposition: tr (S1 S2)^(1/2) = tr (S1^(1/2) S2 S1^(1/2))^(1/2)
    w, v = np.linalg.eigh(s1)
    r1 = v @ np.diag(np.sqrt(w)) @ v.T
    want = ((mu1 - mu2) ** 2).sum() + np.trace(s1 + s2) - 2 * np.sqrt(np.linalg.eigvalsh(r1 @ s2 @ r1)).sum()
    a = rng.multivariate_normal(mu1, s1, 200_000)
    b = rng.multivariate_normal(mu2, s2, 200_000)
    assert frechet_distance(a, b) == pytest.approx(want, rel=0.02)
    assert frechet_distance(a[:1000], a[1000:2000]) < 0.05 * want  # same distribution: near zero


def test_kid_equals_a_direct_unbiased_mmd_with_the_cubic_kernel():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(7, 3)), rng.normal(0.5, 1.0, size=(5, 3))
    k = lambda x, y: (x @ y / 3 + 1) ** 3  # noqa: E731
    xx = sum(k(a[i], a[j]) for i in range(7) for j in range(7) if i != j) / (7 * 6)
    yy = sum(k(b[i], b[j]) for i in range(5) for j in range(5) if i != j) / (5 * 4)
    xy = sum(k(a[i], b[j]) for i in range(7) for j in range(5)) / (7 * 5)
    assert kid(a, b) == pytest.approx(xx + yy - 2 * xy, rel=1e-10)


def test_kid_is_unbiased_near_zero_for_one_distribution_and_positive_for_two():
    rng = np.random.default_rng(2)
    same = [kid(rng.normal(size=(20, 4)), rng.normal(size=(20, 4))) for _ in range(300)]
    shifted = kid(rng.normal(size=(200, 4)), rng.normal(0.5, 1.0, size=(200, 4)))
    assert abs(np.mean(same)) < 3 * np.std(same) / np.sqrt(len(same)) and shifted > 10 * np.std(same) / np.sqrt(300)


def test_jerk_and_flicker_hand_cases():
    t = torch.arange(6.0)
    uv = torch.zeros(1, 6, 2, 2)
    uv[0, :, 0, 0] = t**2          # constant acceleration: zero jerk
    uv[0, :, 1, 1] = t**3 / 6      # third difference of t^3 / 6 is 1
    assert float(joint_jerk(uv)) == pytest.approx(0.5)  # mean over the two joints
    video = torch.zeros(1, 3, 3, 2, 2)
    video[0, 1] = 2 / 127.5        # a one-frame flash of 2 levels: |0 - 2*2 + 0| = 4
    assert float(flicker(video)) == pytest.approx(4.0)
    video[0, :] = (torch.arange(3.0) / 127.5).view(3, 1, 1, 1)  # a steady ramp has no flicker
    assert float(flicker(video)) == pytest.approx(0.0, abs=1e-6)


def test_the_tiny_twin_logs_kid_jerk_and_the_real_floor(tmp_path):
    from tests.twin import fit_twin, metric_rows

    fit_twin("mosa", tmp_path, "--data.init_args.num_clips", "80", "--model.init_args.evaluator_epochs", "1")
    rows = [r for r in metric_rows(tmp_path) if r.get("val/kid")]
    assert rows, "no validation logged the video metrics"
    r = rows[-1]
    for key in ("val/kid_real", "val/kid_true_structure", "val/jerk_px", "val/jerk_px_real", "val/warp_err_real"):
        assert r.get(key), key
    assert float(r["val/jerk_px"]) > 0 and float(r["val/warp_err_real"]) > 0
    assert list((tmp_path / "data").glob("*-evaluators-e1.pt"))  # fit once and stored beside the data
