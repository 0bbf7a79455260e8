"""Budget units on a RouterBench-format workload (US dollars per query): an absolute budget in the default workload's
MFLOPs never binds and says so; a relative budget sits in the workload's own range of mean costs and binds."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lit_iclr.core.errors import ConfigError
from lit_iclr.stageroute.router import Router, RouterConfig, run
from lit_iclr.stageroute.workload import read_workload


def routerbench_pickle(path, rows=300, seed=0):
    """RouterBench's wide layout, pickled by pandas: per model a quality column and `<model>|total_cost` in dollars."""
    rng = np.random.default_rng(seed)
    models = {"gpt-4-1106-preview": (0.85, 0.03), "claude-v2": (0.7, 0.01), "mistral-7b-chat": (0.45, 2e-4)}
    df = pd.DataFrame({"sample_id": [f"mmlu-x.{i}" for i in range(rows)], "prompt": ["q"] * rows,
                       "eval_name": ["mmlu-x"] * rows})
    for m, (acc, usd) in models.items():
        df[m] = (rng.random(rows) < acc).astype(float)
        df[f"{m}|model_response"] = "a"
        df[f"{m}|total_cost"] = usd * rng.uniform(0.5, 1.5, rows)
    df["oracle_model_to_route_to"] = "mistral-7b-chat"
    df.to_pickle(path)
    return df


def test_absolute_budget_in_mflops_never_binds_on_dollars_and_warns(tmp_path):
    df = routerbench_pickle(tmp_path / "routerbench_0shot.pkl")
    w = read_workload(tmp_path / "routerbench_0shot.pkl", allow_pickle=True, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match="never binds"):
        s, _ = run(w, RouterConfig(policy="oracle", horizon=600, budget=5.0, m_max=2))
    with pytest.warns(UserWarning, match="never binds"):
        free, _ = run(w, RouterConfig(policy="oracle", horizon=600, budget=1e9, m_max=2))
    assert float(s.spent) == float(free.spent) and float(s.reward) == float(free.reward)  # the budget changed nothing

    # relative: b = c_min + 0.2 (c_max - c_min) over the models' mean costs, computed here from the table itself
    means = [df[f"{m}|total_cost"].mean() for m in w.models]
    b = min(means) + 0.2 * (max(means) - min(means))
    cfg = RouterConfig(policy="oracle", horizon=600, budget=0.2, m_max=2, budget_mode="relative")
    router = Router(w, cfg)
    assert router.budget == pytest.approx(b)
    s, _ = run(w, cfg)
    spent_usd = float(s.spent) * router.scale
    assert spent_usd <= b * 600 + 1e-9 and spent_usd < 0.5 * float(free.spent) * router.scale


def test_relative_budget_is_a_fraction():
    with pytest.raises(ConfigError, match="in \\[0, 1\\]"):
        RouterConfig(budget=5.0, budget_mode="relative")
    with pytest.raises(ConfigError, match="budget_mode"):
        RouterConfig(budget_mode="dollars")
