"""The two optimisation problems of StageRoute, solved with scipy's HiGHS.

Routing LP over a deployed set D (per query):
    max_q  sum_m q_m U_m   s.t.  sum_m q_m L_m <= b,  sum_m q_m <= 1,  0 <= q_m <= alpha_m        (m in D)
Deployment MILP over the available pool (per stage):
    max_{q, z}  sum_m q_m U_m  s.t. the constraints above, q_m <= alpha_m z_m, sum_m z_m <= M_max, z in {0, 1}
U is an optimistic quality (UCB), L an optimistic cost (LCB); with the true means they give the oracle.

The routing LP has only two coupling constraints, so besides HiGHS (`solver="highs"`) it is solved exactly in closed form
(`solver="exact"`, the default): dualise the cost row with nu >= 0; for fixed nu the rest is a fractional knapsack solved
by filling models in decreasing order of U - nu L. The dual g(nu) = nu b + max_q sum q (U - nu L) is convex piecewise
linear with breakpoints where two scores U - nu L cross or one crosses 0, so its minimum is at one of those O(K^2) points;
the primal optimum mixes the two greedy solutions on either side of nu* so that the cost row is tight (complementary
slackness). Vectorised over many LPs at once, which makes the deployment problem a batch of LPs over every subset.
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


def _greedy(w: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """argmax_q sum q w s.t. sum q <= 1, 0 <= q <= alpha, for every row of w (..., K): fill by decreasing w, positive only."""
    order = np.argsort(-w, axis=-1, kind="stable")
    a = np.take_along_axis(alpha, order, -1)
    before = np.cumsum(a, -1) - a
    take = np.clip(np.minimum(a, 1.0 - before), 0.0, None) * (np.take_along_axis(w, order, -1) > 0)
    q = np.zeros_like(w)
    np.put_along_axis(q, order, take, -1)
    return q


def routing_lp_batch(u: np.ndarray, lcb: np.ndarray, alpha: np.ndarray, budget: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact (q (S, K), value (S,)) of S routing LPs at once (rows of u, lcb, alpha); pad unused slots with alpha = 0."""
    u, lcb, alpha = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (u, lcb, alpha))
    al = np.broadcast_to(alpha, u.shape)
    if not np.isfinite(budget):  # cost-blind: nu = 0
        q = _greedy(u, al)
        return q, (q * u).sum(-1)
    budget = max(float(budget), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        pair = (u[:, :, None] - u[:, None, :]) / (lcb[:, :, None] - lcb[:, None, :])  # U_i - nu L_i = U_j - nu L_j
        zero = u / lcb                                                                   # U_i - nu L_i = 0
    nu = np.concatenate([np.zeros((len(u), 1)), pair.reshape(len(u), -1), zero], 1)
    nu = np.where(np.isfinite(nu) & (nu > 0), nu, 0.0)
    nu = np.concatenate([nu, 2.0 * nu.max(1, keepdims=True) + 1.0], 1)                 # beyond every breakpoint
    w = u[:, None, :] - nu[:, :, None] * lcb[:, None, :]                                 # (S, C, K)
    g = nu * budget + (_greedy(w, np.broadcast_to(al[:, None, :], w.shape)) * w).sum(-1)  # the dual g(nu)
    best = np.where(g <= g.min(1, keepdims=True) + 1e-12, nu, np.inf).min(1)             # smallest minimiser nu*
    right = np.where(nu > best[:, None] * (1 + 1e-12) + 1e-15, nu, np.inf).min(1)
    left = np.where(nu < best[:, None] * (1 - 1e-12) - 1e-15, nu, -np.inf).max(1)
    at = (lambda v: _greedy(u - v[:, None] * lcb, al))
    q_plus = at(0.5 * (best + right))                                      # cost at or below b (g's right slope >= 0)
    q_minus = at(np.where(best > 0, 0.5 * (best + np.maximum(left, 0.0)), best))
    c_plus, c_minus = (q_plus * lcb).sum(-1), (q_minus * lcb).sum(-1)
    gap = c_minus - c_plus
    theta = np.where((best > 0) & (gap > 1e-15), np.clip((budget - c_plus) / np.where(gap > 1e-15, gap, 1.0), 0, 1), 0.0)
    q = theta[:, None] * q_minus + (1 - theta[:, None]) * q_plus           # the cost row tight when nu* > 0
    return q, (q * u).sum(-1)


def routing_lp(u: np.ndarray, lcb: np.ndarray, alpha: np.ndarray, budget: float,
               solver: str = "exact") -> tuple[np.ndarray, float]:
    """(q, value) of the routing LP over the given models; `budget=inf` drops the cost row (cost-blind)."""
    k = len(u)
    if k == 0:
        return np.zeros(0), 0.0
    if solver == "exact":
        q, v = routing_lp_batch(u, lcb, alpha, budget)
        return np.clip(q[0], 0.0, alpha), float(v[0])
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
    """The deployment problem by enumerating every subset of size min(M_max, K): one batch of exact routing LPs."""
    k = len(u)
    subsets = np.array(list(itertools.combinations(range(k), min(m_max, k))), dtype=int).reshape(-1, min(m_max, k))
    _, v = routing_lp_batch(u[subsets], lcb[subsets], alpha[subsets], budget)
    i = int(np.flatnonzero(v >= v.max() - 1e-12)[0])  # the first best subset (lexicographic order)
    mask = np.zeros(k, bool)
    mask[subsets[i]] = True
    return mask, float(v[i])


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


def horizon_oracle_value(mu: np.ndarray, c: np.ndarray, alpha: np.ndarray, avail: np.ndarray, total_budget: float,
                         m_max: int) -> float:
    """Upper bound on the expected reward of any policy with total cost <= B over a stream whose query t sees the models
    avail[t] (T, K): the bandits-with-knapsacks LP benchmark, through its Lagrangian dual
        V = min_{nu >= 0}  nu B + sum_t max_{|D| <= M_max, q} sum_{m in D} q_m (mu_m - nu c_m)   (sum q <= 1, q <= alpha),
    convex in nu (a max of linear functions), minimised by a bounded scalar search. Unlike the per-stage oracle held to b
    in every stage, it may move budget between stages, as a paced policy under the total budget B = b T can, and (being
    the LP relaxation) time-share between deployments of the same pool, so no policy beats it in expectation."""
    return float(horizon_oracle_rates(mu, c, alpha, avail, total_budget, m_max).sum())


def horizon_oracle_rates(mu: np.ndarray, c: np.ndarray, alpha: np.ndarray, avail: np.ndarray, total_budget: float,
                         m_max: int) -> np.ndarray:
    """V_B split over the queries: v_t = nu* B / T + max_{D, q} sum q (mu - nu* c) over the models available at t, at the
    dual minimiser nu* of `horizon_oracle_value`. sum_t v_t = V_B; the prefix sums give the benchmark's share of the
    first t queries, so `cumsum(v)[t - 1] - reward_t` is a regret curve that ends at the regret against V_B."""
    from scipy.optimize import minimize_scalar

    avail = np.asarray(avail, bool)
    sets, inverse, counts = np.unique(avail, axis=0, return_inverse=True, return_counts=True)
    subsets = []
    for mask in sets:
        idx = np.flatnonzero(mask)
        size = min(m_max, len(idx))
        subsets.append(idx[np.array(list(itertools.combinations(range(len(idx)), size)), dtype=int)] if len(idx) else None)

    def pattern_values(nu: float) -> np.ndarray:
        out = np.zeros(len(sets))
        for k, sub in enumerate(subsets):
            if sub is not None:
                w = mu[sub] - nu * c[sub]
                out[k] = float((_greedy(w, alpha[sub]) * w).sum(-1).max())
        return out

    def dual(nu: float) -> float:
        return nu * total_budget + float(counts @ pattern_values(nu))

    with np.errstate(divide="ignore"):
        hi = float(np.max(np.where(c > 0, mu / np.maximum(c, 1e-300), 0.0))) + 1.0  # beyond it no costly model pays
    res = minimize_scalar(dual, bounds=(0.0, hi), method="bounded", options={"xatol": 1e-10})
    nu = min((float(res.x), 0.0, hi), key=dual)
    return nu * total_budget / len(avail) + pattern_values(nu)[inverse.ravel()]
