"""benchmarks/model_interactions.py's report side: the own + cross balance table (the paper's "best balance" claim) against
a hand computation of the paired t interval, and the --betas filter of the run list. No LM is trained."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tests.benchmark_script import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("model_interactions")


def _row(bench, alpha, beta, seed, own, cross):
    return {**bench.DEFAULTS, "alpha": alpha, "beta": beta, "seed": seed, "history": [{"own_ppl": own, "cross_ppl": cross}]}


def test_balance_table_matches_hand_interval(bench, capsys):
    own_cross = {0.0: [(18.0, 22.0), (18.5, 22.4), (18.1, 21.9)],
                 0.5: [(20.0, 22.5), (20.2, 23.1), (19.9, 22.4)],
                 1.0: [(31.0, 32.0), (30.0, 33.0), (32.0, 31.0)]}
    rows = [_row(bench, a, 0.5, s, *oc) for a, v in own_cross.items() for s, oc in enumerate(v)]
    bench.report_balance(rows)
    text = capsys.readouterr().out
    # hand computation: d_s = (log own + log cross)/2 of alpha 0.5 minus isolation's, t interval with n - 1 = 2 dof
    d = np.array([(math.log(o1) + math.log(c1) - math.log(o0) - math.log(c0)) / 2
                  for (o1, c1), (o0, c0) in zip(own_cross[0.5], own_cross[0.0], strict=True)])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    line = next(x for x in text.splitlines() if x.startswith("| 0.5 | 0.5 |"))
    assert f"{d.mean():+.3g} [{d.mean() - half:+.3g}, {d.mean() + half:+.3g}]" in line
    geo = [math.sqrt(o * c) for o, c in own_cross[0.5]]
    assert line.split(" | ")[3].startswith(f"{np.mean(geo):.4g}")
    assert "Best own + cross balance (lowest mean) at alpha = 0.0, beta = 0.5." in text


def test_betas_filter_keeps_only_those_cells(bench, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "_run_and_store", lambda t: ran.append(t[0]))
    bench.run_lm(["sweep"], [0], 3, tmp_path / "runs.jsonl", 1, betas=[0.5])
    cells = {(c["alpha"], c["beta"], c["sources"]) for c in ran}
    assert cells == {(0.0, 0.5, "all"), (0.5, 0.5, "all"), (1.0, 0.5, "all"), (0.5, 0.5, "own")}
