"""The two optimisation problems of StageRoute, solved with scipy's HiGHS.

Routing LP over a deployed set D (per query):
    max_q  sum_m q_m U_m   s.t.  sum_m q_m L_m <= b,  sum_m q_m <= 1,  0 <= q_m <= alpha_m        (m in D)
Deployment MILP over the available pool (per stage):
    max_{q, z}  sum_m q_m U_m  s.t. the constraints above, q_m <= alpha_m z_m, sum_m z_m <= M_max, z in {0, 1}
U is an optimistic quality (UCB), L an optimistic cost (LCB); with the true means they give the oracle.
"""
from __future__ import annotations

import itertools

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp


def confidence_bounds(n: np.ndarray, reward_sum: np.ndarray, cost_sum: np.ndarray, horizon: int,
                      scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """UCB_m = min(1, mu_hat + s sqrt(2 ln T / n)), LCB_m = max(0, c_hat - s sqrt(2 ln T / n)); n = 0 gives (1, 0).

    Costs are in units of the workload's cost bound, so both lie in [0, 1]."""
    seen = n > 0
    safe = np.maximum(n, 1)
    radius = scale * np.sqrt(2.0 * np.log(max(horizon, 2)) / safe)
    ucb = np.where(seen, np.minimum(1.0, reward_sum / safe + radius), 1.0)
    lcb = np.where(seen, np.maximum(0.0, cost_sum / safe - radius), 0.0)
    return ucb, lcb


def routing_lp(u: np.ndarray, lcb: np.ndarray, alpha: np.ndarray, budget: float) -> tuple[np.ndarray, float]:
    """(q, value) of the routing LP over the given models; `budget=inf` drops the cost row (cost-blind)."""
    k = len(u)
    if k == 0:
        return np.zeros(0), 0.0
    rows, rhs = [np.ones(k)], [1.0]
    if np.isfinite(budget):
        rows.append(lcb), rhs.append(budget)
    res = linprog(-u, A_ub=np.vstack(rows), b_ub=rhs, bounds=np.stack([np.zeros(k), alpha], 1), method="highs")
    if res.status != 0:  # the zero vector is always feasible, so this is a solver failure
        raise RuntimeError(f"routing LP failed: {res.message}")
    q = np.clip(res.x, 0.0, alpha)
    return q, float(u @ q)


def deploy_milp(u: np.ndarray, lcb: np.ndarray, alpha: np.ndarray, budget: float, m_max: int) -> tuple[np.ndarray, float]:
    """(deployed mask, value) of the deployment MILP (variables x = [q, z]) with HiGHS branch and bound."""
    k = len(u)
    c = np.concatenate([-u, np.zeros(k)])
    eye = np.eye(k)
    a = [np.hstack([eye, -np.diag(alpha)]), np.concatenate([np.ones(k), np.zeros(k)])[None],
         np.concatenate([np.zeros(k), np.ones(k)])[None]]
    ub = [np.zeros(k), [1.0], [m_max]]
    if np.isfinite(budget):
        a.append(np.concatenate([lcb, np.zeros(k)])[None]), ub.append([budget])
    res = milp(c, constraints=LinearConstraint(np.vstack(a), -np.inf, np.concatenate(ub)),
               integrality=np.concatenate([np.zeros(k), np.ones(k)]),
               bounds=Bounds(np.zeros(2 * k), np.concatenate([alpha, np.ones(k)])))
    if res.status != 0:
        raise RuntimeError(f"deployment MILP failed: {res.message}")
    q, z = res.x[:k], res.x[k:] > 0.5
    return _fill(z | (q > 1e-9), u, m_max), float(-res.fun)


def deploy_enumerate(u: np.ndarray, lcb: np.ndarray, alpha: np.ndarray, budget: float, m_max: int) -> tuple[np.ndarray, float]:
    """The deployment problem by enumerating every subset of size min(M_max, K) and solving its routing LP."""
    k = len(u)
    best, best_set = -1.0, ()
    for subset in itertools.combinations(range(k), min(m_max, k)):
        idx = list(subset)
        _, v = routing_lp(u[idx], lcb[idx], alpha[idx], budget)
        if v > best + 1e-12:
            best, best_set = v, subset
    mask = np.zeros(k, bool)
    mask[list(best_set)] = True
    return mask, best


def deploy(u: np.ndarray, lcb: np.ndarray, alpha: np.ndarray, budget: float, m_max: int,
           enumerate_up_to: int = 4) -> np.ndarray:
    """Deployed mask: enumeration while the pool has at most `enumerate_up_to` models, HiGHS MILP beyond."""
    if len(u) <= m_max:
        return np.ones(len(u), bool)
    solve = deploy_enumerate if len(u) <= enumerate_up_to else deploy_milp
    return solve(u, lcb, alpha, budget, m_max)[0]


def _fill(mask: np.ndarray, u: np.ndarray, m_max: int) -> np.ndarray:
    """Use free deployment slots (z = 0 in the optimum) for the next-best models by U: they cost nothing to hold."""
    mask = mask.copy()
    for m in np.argsort(-u, kind="stable"):
        if mask.sum() >= min(m_max, len(u)):
            break
        mask[m] = True
    return mask
