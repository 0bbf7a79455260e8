"""The simulator: budget accounting, oracle, cache, and StageRoute beating greedy on a small stream."""
from __future__ import annotations

import numpy as np

from lit_iclr.stageroute.router import Router, RouterConfig, RouterState, run
from lit_iclr.stageroute.synthetic import synthetic_workload


def test_budget_never_overrun_and_regret_adds_up():
    w = synthetic_workload(6, 500, initial=2, seed=1)
    for policy in ("stageroute", "cost_blind", "random"):
        s, reg = run(w, RouterConfig(policy=policy, horizon=800, budget=0.2, m_max=2))
        assert float(s.spent) <= 0.2 / w.cost.max() * 800 + 1e-9
        assert np.isclose(reg.sum(), float(s.regret))
        assert int(s.n.sum()) == int(s.served) <= 800


def test_oracle_value_is_its_expected_reward():
    # an oracle facing a fixed pool and a loose budget earns V* per query in expectation: regret ~ 0
    w = synthetic_workload(5, 2000, initial=5, seed=2)
    s, _ = run(w, RouterConfig(policy="oracle", horizon=3000, budget=10.0, m_max=2))
    assert float(s.served) == 3000 and abs(float(s.regret)) / 3000 < 0.01  # sampling noise of m_t only


def test_state_is_complete_a_fresh_router_continues_the_run():
    # what a resumed run does: a new Router (no caches) continues from the saved arrays; same chunks, same numbers
    w = synthetic_workload(6, 300, initial=2, seed=4)
    cfg = RouterConfig(horizon=900, m_max=2)
    rows = np.random.default_rng([cfg.seed, 7]).integers(0, 300, size=900)
    chunks = np.array_split(rows, 3)
    one, s1 = Router(w, cfg), RouterState.new(6)
    full = [one.serve(s1, c) for c in chunks]
    s2 = RouterState.new(6)
    first = [Router(w, cfg).serve(s2, c) for c in chunks[:2]]
    s3 = RouterState(**{k: v.copy() for k, v in s2.arrays().items()})
    rest = Router(w, cfg).serve(s3, chunks[2])
    np.testing.assert_allclose(np.concatenate(first + [rest]), np.concatenate(full))
    for k, v in s1.arrays().items():
        np.testing.assert_allclose(getattr(s3, k), v, err_msg=k)
    assert not np.allclose(full[2], 0)


def test_stageroute_beats_greedy_newest():
    w = synthetic_workload(8, 3000, initial=2, seed=5)
    ours = [float(run(w, RouterConfig(horizon=4000, seed=i))[0].regret) for i in range(2)]
    greedy = [float(run(w, RouterConfig(policy="greedy", horizon=4000, seed=i))[0].regret) for i in range(2)]
    assert sum(ours) < sum(greedy)


def test_horizon_benchmark_bounds_the_per_stage_oracle_and_a_paced_policy():
    # V_B may move budget between stages, so it is at least the per-stage oracle's sum of V*_k (regret + reward of the
    # oracle run), and a paced StageRoute run, which the per-stage oracle can trail, stays below it
    w = synthetic_workload(6, 400, initial=2, seed=6)
    cfg = RouterConfig(policy="oracle", horizon=1500, m_max=2, budget=0.3)
    s, _ = run(w, cfg)
    v_b = Router(w, cfg).horizon_value()
    assert v_b >= float(s.regret) + float(s.reward) - 1e-6
    ours, _ = run(w, RouterConfig(horizon=1500, m_max=2, budget=0.3, radius_scale=0.1))
    assert float(ours.reward) < v_b
