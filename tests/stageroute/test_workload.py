"""Readers on small files in the real formats (long table, RouterBench wide pickle, model table), malformed ones too."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lit_iclr.core.errors import DatasetFormatError
from lit_iclr.stageroute.synthetic import synthetic_workload
from lit_iclr.stageroute.workload import read_workload, write_workload


def test_long_table_round_trip(tmp_path):
    w = synthetic_workload(5, 40, initial=2, seed=3)
    write_workload(tmp_path, w)
    r = read_workload(tmp_path)
    assert r.models == w.models
    np.testing.assert_array_equal(r.quality, w.quality)
    np.testing.assert_allclose(r.cost, w.cost)
    np.testing.assert_allclose(r.release, w.release)
    np.testing.assert_allclose(r.capacity, w.capacity)
    assert np.isinf(r.retire).all()


def _routerbench(path):
    df = pd.DataFrame({"sample_id": ["mmlu.0", "mmlu.1", "gsm8k.0"], "prompt": ["a", "b", "c"],
                       "eval_name": ["mmlu", "mmlu", "gsm8k"], "gpt-4": [1.0, 0.0, 1.0], "gpt-4|model_response": ["x"] * 3,
                       "gpt-4|total_cost": [0.03, 0.02, 0.04], "llama-70b": [0.0, 0.5, 1.0],
                       "llama-70b|model_response": ["y"] * 3, "llama-70b|total_cost": [0.001, 0.002, 0.001],
                       "oracle_model_to_route_to": ["gpt-4", "llama-70b", "llama-70b"]})
    df.to_pickle(path)
    return df


def test_routerbench_pickle_needs_opt_in_and_is_converted(tmp_path):
    path = tmp_path / "routerbench_0shot.pkl"
    _routerbench(path)
    with pytest.raises(DatasetFormatError, match="allow_pickle"):
        read_workload(path)
    w = read_workload(path, allow_pickle=True)
    assert w.models == ["gpt-4", "llama-70b"] and (tmp_path / "routerbench_0shot.parquet").exists()
    np.testing.assert_allclose(w.quality[:, 1], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(w.cost[:, 0], [0.03, 0.02, 0.04])
    assert read_workload(path).models == w.models  # the parquet conversion is read from then on, no pickle needed


@pytest.mark.parametrize("change, message", [
    (lambda q, m: q.assign(quality=q.quality + 2), "quality outside"),
    (lambda q, m: q.assign(cost=-q.cost), "negative cost"),
    (lambda q, m: q.iloc[1:], "lack a row"),
    (lambda q, m: q.drop(columns="cost"), "missing columns"),
])
def test_bad_quality_table(tmp_path, change, message):
    write_workload(tmp_path, synthetic_workload(3, 10, initial=1, seed=0))
    q = pd.read_parquet(tmp_path / "quality.parquet")
    change(q, None).to_parquet(tmp_path / "quality.parquet")
    with pytest.raises(DatasetFormatError, match=message):
        read_workload(tmp_path)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.assign(model=["model-00", "model-01", "nope"]), "unknown model ids"),
    (lambda m: m.assign(capacity=[0.5, 1.5, 1.0]), "capacity outside"),
    (lambda m: m.assign(release=[0.2, 0.3, 0.4]), "no model is available"),
])
def test_bad_model_table(tmp_path, edit, message):
    write_workload(tmp_path, synthetic_workload(3, 10, initial=1, seed=0))
    edit(pd.read_csv(tmp_path / "models.csv")).to_csv(tmp_path / "models.csv", index=False)
    with pytest.raises(DatasetFormatError, match=message):
        read_workload(tmp_path)
