"""StageRoute and its baselines as one sequential simulator over a query stream.

Every `stage_length` queries the policy picks a deployed set D_k of at most M_max available models (StageRoute: the
deployment MILP on UCB quality / LCB cost); every query is then routed by the LP restricted to D_k, one model is sampled
from q (the remainder 1 - sum q is the null option: not served, no reward, no cost), its reward and cost are observed
and the estimates updated. The LP solution is cached and re-solved only when some deployed model's UCB or LCB has moved
by more than `cache_tol` since the last solve (`cache_tol=0` solves every query).

Budget: b per query on average, B = b T in total (bandits with knapsacks): once a query's cost would overrun what is
left of B, no further query is served. With `pacing` (our choice; the paper's exact budget handling is not known) the LPs
use the remaining budget per remaining query, (B - spent) / (T - t), instead of b, so early optimistic overspending is
paid back instead of exhausting B before T; the oracle (true means) is paced the same way. Regret is the pseudo-regret
against the oracle that knows (mu, c) and solves the
same deployment problem at every stage boundary: sum_t V*_{k(t)} - mu_{m_t} 1[t served] (`state.regret`); a paced policy can
beat that oracle, so benchmarks measure regret against `Router.horizon_value()`, the bandits-with-knapsacks benchmark that
may move the total budget between stages (V_B - state.reward).
Budget units: with `budget_mode: absolute` b is in the workload's cost units (the default workload: MFLOPs per image;
RouterBench: US dollars per query, where b = 5 is far above every model's mean cost and never binds, which the router
warns about). With `budget_mode: relative` b in [0, 1] places the budget in the workload's own cost range,
c_min + b (c_max - c_min) over the models' mean costs: 0 affords only the cheapest model on average, 1 every model.
All state is in the arrays of `RouterState`, so the Lightning module keeps it in buffers and a run resumes exactly.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, fields

import numpy as np

from lit_iclr.core.errors import ConfigError

from .programs import confidence_bounds, deploy, horizon_oracle_rates, routing_lp
from .workload import Workload

POLICIES = ("stageroute", "oracle", "greedy", "eps_greedy", "cost_blind", "random", "per_query")
BUDGET_MODES = ("absolute", "relative")


@dataclass
class RouterConfig:
    """policy: one of POLICIES; budget b in the workload's cost units (`budget_mode: absolute`) or as a fraction of its
    range of model mean costs (`relative`); stage_length null = ceil(c T^(1/3))."""

    policy: str = "stageroute"
    m_max: int = 3
    budget: float = 0.35
    horizon: int = 10000
    stage_length: int | None = None
    stage_scale: float = 1.0
    radius_scale: float = 1.0
    cache_tol: float = 0.01
    epsilon: float = 0.1
    enumerate_up_to: int = 12
    lp_solver: str = "exact"
    pacing: bool = True
    seed: int = 0
    budget_mode: str = "absolute"

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.budget_mode not in BUDGET_MODES:
            raise ConfigError(f"budget_mode must be one of {BUDGET_MODES}, got {self.budget_mode!r}")
        if self.budget_mode == "relative" and not 0 <= self.budget <= 1:
            raise ConfigError(f"a relative budget is a fraction of the workload's cost range, in [0, 1]; got {self.budget}")
        if self.m_max < 1 or (self.budget <= 0 and self.budget_mode == "absolute") or self.horizon < 1:
            raise ConfigError(f"need m_max >= 1, budget > 0, horizon >= 1 (got {self.m_max}, {self.budget}, {self.horizon})")
        if self.lp_solver not in ("exact", "highs"):
            raise ConfigError(f"lp_solver must be 'exact' or 'highs', got {self.lp_solver!r}")
        if self.stage_length is not None and self.stage_length < 1:
            raise ConfigError(f"stage_length must be >= 1 or null, got {self.stage_length}")

    @property
    def stage(self) -> int:
        """Lambda: the given stage length, or the T^(1/3) rule (T^(2/3) stages) of the regret bound."""
        if self.policy == "per_query":
            return 1
        if self.stage_length is not None:
            return self.stage_length
        return max(1, math.ceil(self.stage_scale * self.horizon ** (1 / 3)))


@dataclass
class RouterState:
    """Per-model statistics and the run's counters (float64 arrays; scalars are 0-d arrays so they can be buffers)."""

    n: np.ndarray
    reward_sum: np.ndarray
    cost_sum: np.ndarray
    deployed: np.ndarray      # 1.0 for deployed models
    q: np.ndarray             # cached routing distribution
    u_solved: np.ndarray      # estimates at the last LP solve (cache key)
    l_solved: np.ndarray
    u_deployed: np.ndarray    # estimates and availability at the last deployment solve (cache key)
    l_deployed: np.ndarray
    avail_deployed: np.ndarray
    rate_solved: np.ndarray   # budget rate at the last LP solve
    rate_deployed: np.ndarray  # budget rate at the last deployment solve
    stage_value: np.ndarray   # V* of the current stage (oracle)
    t: np.ndarray             # queries seen
    spent: np.ndarray         # total cost, in units of the cost bound
    served: np.ndarray
    reward: np.ndarray        # sum of mu_{m_t} over served queries
    realized: np.ndarray      # sum of observed rewards
    regret: np.ndarray
    lp_solves: np.ndarray
    deploy_solves: np.ndarray
    exhausted: np.ndarray

    @classmethod
    def new(cls, num_models: int) -> RouterState:
        z = {f.name: np.zeros(()) for f in fields(cls)}
        for name in ("n", "reward_sum", "cost_sum", "deployed", "q", "u_solved", "l_solved", "u_deployed", "l_deployed",
                     "avail_deployed"):
            z[name] = np.zeros(num_models)
        z["u_solved"][:] = np.nan
        z["u_deployed"][:] = np.nan
        return cls(**z)

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def resolve_budget(cfg: RouterConfig, mean_cost: np.ndarray) -> float:
    """b in the workload's cost units: as given (absolute), or c_min + b (c_max - c_min) of the models' mean costs."""
    lo, hi = float(mean_cost.min()), float(mean_cost.max())
    if cfg.budget_mode == "relative":
        return lo + cfg.budget * (hi - lo)
    if cfg.policy != "cost_blind" and cfg.budget >= hi:
        warnings.warn(f"budget {cfg.budget:g} per query is at or above every model's mean cost (largest {hi:.3g} in the "
                      f"workload's units; costs range {lo:.3g}..{hi:.3g}): it never binds. The default budget is in MFLOPs of "
                      "the default workload; for another workload (RouterBench: dollars) set budget_mode: relative with "
                      "budget in [0, 1], or a budget in that workload's units", UserWarning, stacklevel=3)
    return float(cfg.budget)


class Router:
    """Runs a policy over a workload; `serve(state, rows)` handles the next len(rows) queries in place."""

    def __init__(self, workload: Workload, cfg: RouterConfig, cost_scale: float | None = None):
        self.w, self.cfg = workload, cfg
        self.scale = float(cost_scale or workload.cost.max() or 1.0)  # known cost bound: costs and b in [0, 1] units
        mu, c = workload.means()
        self.budget = resolve_budget(cfg, c)  # b in the workload's cost units
        self.b = self.budget / self.scale
        self.total_budget = self.b * cfg.horizon
        self.mu, self.c = mu, c / self.scale
        self.cost = workload.cost / self.scale
        self.order = np.argsort(-workload.release, kind="stable")  # newest first (greedy)
        self._oracle_cache: dict[bytes, float] = {}

    # --- estimates -------------------------------------------------------------------------------------------------
    def estimates(self, s: RouterState) -> tuple[np.ndarray, np.ndarray]:
        p = self.cfg.policy
        if p == "oracle":
            return self.mu, self.c
        scale = 0.0 if p in ("greedy", "eps_greedy") else self.cfg.radius_scale
        return confidence_bounds(s.n, s.reward_sum, s.cost_sum, self.cfg.horizon, scale)

    def rate(self, s: RouterState) -> float:
        """Per-query budget of the LPs: b, or with pacing what is left of B per query left, (B - spent) / (T - t)."""
        if self.cfg.policy == "cost_blind":
            return np.inf
        if not self.cfg.pacing:  # the oracle is paced like every other policy (it knows mu and c, not the future draws)
            return self.b
        return max(0.0, float(self.total_budget - s.spent) / max(1.0, self.cfg.horizon - float(s.t)))

    def oracle_value(self, avail: np.ndarray) -> float:
        key = avail.tobytes()
        if key not in self._oracle_cache:
            idx = np.flatnonzero(avail)
            mask = deploy(self.mu[idx], self.c[idx], self.w.capacity[idx], self.b, self.cfg.m_max, self.cfg.enumerate_up_to)
            self._oracle_cache[key] = routing_lp(self.mu[idx][mask], self.c[idx][mask], self.w.capacity[idx][mask], self.b)[1]
        return self._oracle_cache[key]

    def horizon_value(self) -> float:
        """V_B: the bandits-with-knapsacks benchmark over the whole horizon (arrivals seen at once, total budget B = b T,
        budget movable between stages); `horizon_value() - state.reward` is the regret against it."""
        return float(self.horizon_rates().sum())

    def horizon_rates(self) -> np.ndarray:
        """V_B split over the T queries (`programs.horizon_oracle_rates`): cumsum(rates)[t - 1] - reward after t queries
        is the regret curve against V_B, ending at `horizon_value() - state.reward`."""
        t = np.arange(self.cfg.horizon)[:, None] / self.cfg.horizon
        avail = (self.w.release[None] <= t) & (t < self.w.retire[None])
        return horizon_oracle_rates(self.mu, self.c, self.w.capacity, avail, self.total_budget, self.cfg.m_max)

    # --- the two decisions -----------------------------------------------------------------------------------------
    def new_stage(self, s: RouterState, t: int, rng: np.random.Generator) -> bool:
        """Pick D_k for the stage starting at t; False when the cached deployment (and q) is kept."""
        cfg = self.cfg
        avail = self.w.available(t, cfg.horizon)
        s.stage_value[...] = self.oracle_value(avail)
        idx = np.flatnonzero(avail)
        if cfg.policy == "per_query":
            chosen = idx
        elif cfg.policy == "greedy":
            chosen = [m for m in self.order if avail[m]][: cfg.m_max]
        elif cfg.policy == "random":
            chosen = rng.choice(idx, size=min(cfg.m_max, len(idx)), replace=False)
        else:
            u, lcb = self.estimates(s)
            moved = np.abs(np.concatenate([u - s.u_deployed, lcb - s.l_deployed])[np.tile(avail, 2)])
            budget = self.rate(s)
            rate_moved = np.isfinite(budget) and abs(budget - s.rate_deployed) > cfg.cache_tol * self.b
            same = (avail == (s.avail_deployed > 0)).all() and not np.isnan(moved).any() and moved.max() <= cfg.cache_tol
            if same and not rate_moved:  # the deployment problem's data moved less than cache_tol: keep D_k and its q
                return False
            s.u_deployed[:], s.l_deployed[:], s.avail_deployed[:] = u, lcb, avail
            s.rate_deployed[...] = budget if np.isfinite(budget) else 0.0
            mask = deploy(u[idx], lcb[idx], self.w.capacity[idx], budget, cfg.m_max, cfg.enumerate_up_to)
            chosen = idx[mask]
            s.deploy_solves += 1
        s.deployed[:] = 0.0
        s.deployed[np.asarray(chosen, dtype=int)] = 1.0
        s.u_solved[:] = np.nan  # force a routing solve
        return True

    def route(self, s: RouterState) -> None:
        idx = np.flatnonzero(s.deployed)
        s.q[:] = 0.0
        alpha = self.w.capacity[idx]
        if self.cfg.policy == "random":
            s.q[idx] = np.minimum(alpha, 1.0 / len(idx))
            return
        u, lcb = self.estimates(s)
        budget = self.rate(s)
        s.q[idx] = routing_lp(u[idx], lcb[idx], alpha, budget, self.cfg.lp_solver)[0]
        s.u_solved[:], s.l_solved[:] = u, lcb
        s.rate_solved[...] = budget if np.isfinite(budget) else 0.0
        s.lp_solves += 1

    def _stale(self, s: RouterState, m: int) -> bool:
        """Has model m's UCB or LCB moved by more than cache_tol since the last LP solve?"""
        if np.isnan(s.u_solved[m]):
            return True
        if self.cfg.pacing and self.cfg.policy not in ("cost_blind", "random") \
                and abs(self.rate(s) - s.rate_solved) > self.cfg.cache_tol * self.b:
            return True
        u, lcb = self.estimates_one(s, m)
        return abs(u - s.u_solved[m]) > self.cfg.cache_tol or abs(lcb - s.l_solved[m]) > self.cfg.cache_tol

    def estimates_one(self, s: RouterState, m: int) -> tuple[float, float]:
        if self.cfg.policy == "oracle":
            return self.mu[m], self.c[m]
        n = s.n[m]
        if n == 0:
            return 1.0, 0.0
        scale = 0.0 if self.cfg.policy in ("greedy", "eps_greedy") else self.cfg.radius_scale
        r = scale * math.sqrt(2.0 * math.log(max(self.cfg.horizon, 2)) / n)
        return min(1.0, s.reward_sum[m] / n + r), max(0.0, s.cost_sum[m] / n - r)

    # --- the stream ------------------------------------------------------------------------------------------------
    def serve(self, s: RouterState, rows: np.ndarray) -> np.ndarray:
        """Serve queries rows[0], rows[1], ... (row indices of the workload) from time s.t on; returns per-query regret."""
        cfg = self.cfg
        t0 = int(s.t)
        rng = np.random.default_rng([cfg.seed, t0])  # a function of the position only: resume draws the same numbers
        draws, explore = rng.random(len(rows)), rng.random(len(rows))
        regret = np.empty(len(rows))
        lam, eps = cfg.stage, cfg.epsilon if cfg.policy == "eps_greedy" else 0.0
        dirty = bool(np.isnan(s.u_solved).any())  # the cached q is part of the state
        for i, row in enumerate(rows):
            t = t0 + i
            if t % lam == 0 or not s.deployed.any():
                dirty = self.new_stage(s, t, rng) or dirty
            if dirty:
                self.route(s)
                dirty = False
            if explore[i] < eps:  # epsilon-greedy: a uniform deployed model
                idx = np.flatnonzero(s.deployed)
                m = int(idx[min(int(draws[i] * len(idx)), len(idx) - 1)])
            else:
                m = int(np.searchsorted(np.cumsum(s.q), draws[i], side="right"))
                m = -1 if m >= len(s.q) else m  # the null option
            gain = 0.0
            if m >= 0 and not s.exhausted:
                c = self.cost[row, m]
                if s.spent + c > self.total_budget:
                    s.exhausted[...] = 1.0
                else:
                    r = self.w.quality[row, m]
                    s.n[m] += 1
                    s.reward_sum[m] += r
                    s.cost_sum[m] += c
                    s.spent += c
                    s.served += 1
                    s.realized += r
                    gain = self.mu[m]
                    dirty = self._stale(s, m)
            regret[i] = s.stage_value - gain
            s.reward += gain
            s.regret += regret[i]
            s.t += 1
        return regret


def run(workload: Workload, cfg: RouterConfig, rows: np.ndarray | None = None) -> tuple[RouterState, np.ndarray]:
    """Whole horizon in one call: (final state, per-query regret). Rows default to a seeded uniform draw of queries."""
    router = Router(workload, cfg)
    if rows is None:
        rows = query_stream(len(workload.quality), cfg.horizon, cfg.seed)
    state = RouterState.new(workload.num_models)
    return state, router.serve(state, rows)


def query_stream(num_queries: int, horizon: int, seed: int) -> np.ndarray:
    """Which workload row is query t: a seeded draw with replacement (the stream is i.i.d. over the table)."""
    return np.random.default_rng([seed, 7]).integers(0, num_queries, size=horizon)
