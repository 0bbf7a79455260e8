"""The routing LP and the deployment MILP against brute force on small instances."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from lit_iclr.stageroute.programs import (
    confidence_bounds,
    deploy,
    deploy_enumerate,
    deploy_milp,
    horizon_oracle_value,
    routing_lp,
    routing_lp_batch,
)


def vertex_lp(u, lcb, alpha, b):
    """Brute force over the vertices of {0 <= q <= alpha, lcb.q <= b, 1.q <= 1}: at a vertex at most two coordinates are
    strictly inside their box, fixed by the two other constraints being tight."""
    k, best = len(u), 0.0
    rows = np.vstack([lcb, np.ones(k)])
    rhs = np.array([b, 1.0])
    for free in itertools.chain.from_iterable(itertools.combinations(range(k), r) for r in range(3)):
        rest = [m for m in range(k) if m not in free]
        for bounds in itertools.product((0, 1), repeat=len(rest)):
            q = np.zeros(k)
            q[rest] = np.asarray(bounds) * alpha[rest]
            cands = []
            if not free:
                cands.append(q)
            else:
                left = rhs - rows[:, rest] @ q[rest]
                for tight in itertools.combinations(range(2), len(free)):
                    a = rows[np.ix_(list(tight), list(free))]
                    if abs(np.linalg.det(a)) < 1e-12:
                        continue
                    x = q.copy()
                    x[list(free)] = np.linalg.solve(a, left[list(tight)])
                    cands.append(x)
            for x in cands:
                if (x >= -1e-9).all() and (x <= alpha + 1e-9).all() and (rows @ x <= rhs + 1e-9).all():
                    best = max(best, float(u @ x))
    return best


@pytest.mark.parametrize("seed", range(4))
def test_routing_lp_matches_vertex_enumeration(seed):
    rng = np.random.default_rng(seed)
    k = 4
    u, lcb, alpha = rng.random(k), rng.random(k), rng.uniform(0.2, 1.0, k)
    b = rng.uniform(0.05, 0.6)
    q, v = routing_lp(u, lcb, alpha, b)
    assert v == pytest.approx(vertex_lp(u, lcb, alpha, b), abs=1e-7)
    assert (q >= -1e-9).all() and (q <= alpha + 1e-9).all() and q.sum() <= 1 + 1e-9 and lcb @ q <= b + 1e-9


def test_cost_blind_lp_is_the_capacity_knapsack():
    u, lcb, alpha = np.array([0.9, 0.5, 0.7]), np.array([1.0, 0.1, 0.5]), np.array([0.4, 1.0, 0.5])
    q, v = routing_lp(u, lcb, alpha, np.inf)  # fill best first: 0.4 of m0, 0.5 of m2, 0.1 of m1
    np.testing.assert_allclose(q, [0.4, 0.1, 0.5], atol=1e-9)
    assert v == pytest.approx(0.36 + 0.05 + 0.35)


@pytest.mark.parametrize("seed", range(2))
def test_deployment_milp_matches_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    k, m_max = 6, 3
    u, lcb, alpha = rng.random(k), rng.random(k), rng.uniform(0.2, 0.8, k)
    b = rng.uniform(0.1, 0.5)
    brute = max(vertex_lp(u[list(s)], lcb[list(s)], alpha[list(s)], b)
                for r in range(1, m_max + 1) for s in itertools.combinations(range(k), r))
    mask, v = deploy_milp(u, lcb, alpha, b, m_max)
    assert v == pytest.approx(brute, abs=1e-6) and mask.sum() == m_max
    assert routing_lp(u[mask], lcb[mask], alpha[mask], b)[1] == pytest.approx(brute, abs=1e-6)
    assert deploy_enumerate(u, lcb, alpha, b, m_max)[1] == pytest.approx(brute, abs=1e-6)
    assert deploy(u, lcb, alpha, b, m_max).sum() == m_max


def test_confidence_bounds_closed_form():
    n, rs, cs = np.array([0, 4, 100]), np.array([0.0, 2.0, 80.0]), np.array([0.0, 2.0, 10.0])
    u, lcb = confidence_bounds(n, rs, cs, horizon=1000, scale=0.5)
    r = 0.5 * np.sqrt(2 * np.log(1000) / np.array([1, 4, 100]))
    np.testing.assert_allclose(u, [1.0, min(1, 0.5 + r[1]), min(1, 0.8 + r[2])])
    np.testing.assert_allclose(lcb, [0.0, max(0, 0.5 - r[1]), max(0, 0.1 - r[2])])


@pytest.mark.parametrize("seed", range(3))
def test_exact_lp_matches_highs_on_degenerate_instances(seed):
    # ties in U, equal or zero costs, a zero, a loose and an infinite budget: the dual-breakpoint solver must stay exact
    rng = np.random.default_rng(200 + seed)
    for trial in range(40):
        k = int(rng.integers(1, 7))
        u, lcb, alpha = rng.random(k), rng.random(k) * (rng.random(k) < 0.8), rng.uniform(0.05, 1.0, k)
        if trial % 5 == 0:
            u[:] = u[0]
        if trial % 7 == 0:
            lcb[:] = lcb[0]
        b = [0.0, rng.uniform(0.0, 0.6), 5.0, np.inf][trial % 4]
        q, v = routing_lp(u, lcb, alpha, b, solver="exact")
        assert v == pytest.approx(routing_lp(u, lcb, alpha, b, solver="highs")[1], abs=1e-9)
        assert (q >= -1e-12).all() and (q <= alpha + 1e-12).all() and q.sum() <= 1 + 1e-9
        assert not np.isfinite(b) or lcb @ q <= b + 1e-9


def test_exact_lp_batch_rows_are_independent_lps():
    rng = np.random.default_rng(7)
    u, lcb, alpha = rng.random((5, 3)), rng.random((5, 3)), rng.uniform(0.2, 1.0, (5, 3))
    _, v = routing_lp_batch(u, lcb, alpha, 0.3)
    np.testing.assert_allclose(v, [vertex_lp(u[i], lcb[i], alpha[i], 0.3) for i in range(5)], atol=1e-9)


def test_horizon_oracle_with_one_pool_is_T_times_the_stage_oracle():
    # with no deployment choice (M_max = K) it is exactly T times the stage LP; with M_max < K it may also time-share
    # between deployments (the LP relaxation), so it is at least T times the best single deployment
    rng = np.random.default_rng(3)
    mu, c, alpha = rng.random(5), rng.random(5), rng.uniform(0.3, 1.0, 5)
    avail = np.ones((100, 5), bool)
    assert horizon_oracle_value(mu, c, alpha, avail, 30.0, 5) == pytest.approx(100 * routing_lp(mu, c, alpha, 0.3)[1], abs=1e-6)
    assert horizon_oracle_value(mu, c, alpha, avail, 30.0, 2) >= 100 * deploy_enumerate(mu, c, alpha, 0.3, 2)[1] - 1e-6


def test_horizon_oracle_moves_budget_between_pools_like_the_joint_lp():
    # two pools (a dear, better model arrives half-way), no deployment choice (M_max = K): the value is the joint LP over
    # both halves' routings with one total budget, solved here directly by HiGHS
    from scipy.optimize import linprog

    mu, c, alpha = np.array([0.5, 0.6, 0.95]), np.array([0.1, 0.3, 0.9]), np.array([1.0, 0.6, 0.7])
    avail = np.ones((200, 3), bool)
    avail[:100, 2] = False
    b, n = 0.3, 100
    # x = [q1 (models 0, 1), q2 (models 0, 1, 2)]: max n mu.q1 + n mu.q2, sum q1 <= 1, sum q2 <= 1, n c.q1 + n c.q2 <= 2 n b
    a_ub = [[1, 1, 0, 0, 0], [0, 0, 1, 1, 1], list(n * np.concatenate([c[:2], c]))]
    res = linprog(-n * np.concatenate([mu[:2], mu]), A_ub=a_ub, b_ub=[1, 1, 2 * n * b],
                  bounds=list(zip(np.zeros(5), np.concatenate([alpha[:2], alpha]), strict=True)), method="highs")
    per_stage = n * routing_lp(mu[:2], c[:2], alpha[:2], b)[1] + n * routing_lp(mu, c, alpha, b)[1]
    value = horizon_oracle_value(mu, c, alpha, avail, 2 * n * b, m_max=3)
    assert value == pytest.approx(-res.fun, abs=1e-6)
    assert value > per_stage + 1.0  # moving budget to the half with the better model is worth it here
