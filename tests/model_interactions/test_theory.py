"""The exact recursions against a Monte Carlo of the finite-sample process and against their own definitions."""
import numpy as np
import pytest

from lit_iclr.model_interactions import theory as th


@pytest.fixture
def problem():
    return th.default_problem(K=2, d=4, seed=1)


def test_moments_match_monte_carlo(problem):
    rng = np.random.default_rng(0)
    n, G, R = 24, 3, 3000
    d0, d1 = th.draw_designs(problem, n, 0.0, 0.5, rng), th.draw_designs(problem, n, 0.5, 0.5, rng)
    m, C, _ = th.moments(problem, n, 0.5, 0.5, G, d0, d1)
    theta = th.monte_carlo(problem, d0, d1, G, R, rng).reshape(R, G + 1, -1)
    mc_m = theta.mean(0)
    mc_C = np.einsum("rti,rtj->tij", theta - mc_m, theta - mc_m) / (R - 1)
    se = np.sqrt(np.einsum("tii->ti", C) / R)
    assert np.all(np.abs(mc_m - m) < 5 * se)                       # means within 5 standard errors
    assert np.abs(mc_C - C).max() < 0.15 * np.abs(C).max()        # covariances within sampling error
    # risks computed from the moments equal risks measured directly on the simulated estimates
    R_exact = th.risks(problem, m, C)["R"][-1]
    last = theta[:, -1].reshape(R, problem.K, problem.d)
    for k in range(problem.K):
        for j in range(problem.K):
            e = last[:, k] - problem.theta_priv[j]
            direct = np.einsum("ra,ab,rb->r", e, problem.S_priv[j], e).mean()
            assert direct == pytest.approx(R_exact[k, j], rel=0.08)


def test_spectral_radius_and_fixed_point(problem):
    for alpha in (0.0, 0.3, 0.7):
        r = th.recursion(problem, *th.grams(problem, 100, alpha, 0.5))
        assert r.spectral_radius < 1
        m, C = r.fixed_point()
        np.testing.assert_allclose(m, r.c + r.Q @ m, atol=1e-10)            # m* = c + Q m*
        np.testing.assert_allclose(C, r.Q @ C @ r.Q.T + r.N, atol=1e-10)    # C* = Q C* Q^T + N
        mt, Ct, _ = th.moments(problem, 100, alpha, 0.5, 300)
        np.testing.assert_allclose(mt[-1], m, atol=1e-8)                    # the iteration converges to it
        np.testing.assert_allclose(Ct[-1], C, atol=1e-8)
    r1 = th.recursion(problem, *th.grams(problem, 100, 1.0, 0.5))
    assert r1.spectral_radius == pytest.approx(1.0)                         # only synthetic data: rho(Q) = 1
    with pytest.raises(ValueError):
        r1.fixed_point()
    _, C1, _ = th.moments(problem, 100, 1.0, 0.5, 60)
    tr = np.einsum("tii->t", C1)
    assert tr[60] > 2 * tr[20] > 0                                          # variance grows without bound


def test_population_q_blocks_and_counts(problem):
    n_priv, n_pub, n_syn = th.counts(100, 0.5, 0.25, 2)
    assert (n_priv, n_pub, n_syn) == (12, 38, 25)
    G_priv, G_pub, G_syn = th.grams(problem, 100, 0.5, 0.25)
    r = th.recursion(problem, G_priv, G_pub, G_syn)
    G0 = G_priv[0] + G_pub[0] + G_syn[0].sum(0)
    np.testing.assert_allclose(r.Q[:4, 4:], np.linalg.solve(G0, G_syn[0, 1]))   # Q_01 = G_0^{-1} G_syn,01
    np.testing.assert_allclose(r.c[:4], np.linalg.solve(G0, G_priv[0] @ problem.theta_priv[0]
                                                         + G_pub[0] @ problem.theta_pub))


def test_interaction_helps_cross_task_and_homogenises(problem):
    iso = th.summarize(problem, **th.risks(problem, *th.moments(problem, 200, 0.0, 0.5, 20)[:2]))
    mix = th.summarize(problem, **th.risks(problem, *th.moments(problem, 200, 0.5, 0.5, 20)[:2]))
    assert mix["cross"][-1] < iso["cross"][-1]
    assert mix["gap"][-1] < iso["gap"][-1]
