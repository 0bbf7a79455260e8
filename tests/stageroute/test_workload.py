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


def _routerbench(path, rows=3, seed=0):
    """RouterBench's released wide table (pandas pickle): prompts, a quality and a `|total_cost` (USD) per model."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"sample_id": [f"mmlu.{i}" for i in range(rows)], "prompt": [f"q{i}" for i in range(rows)],
                       "eval_name": ["mmlu"] * rows, "gpt-4": rng.integers(0, 2, rows).astype(float),
                       "gpt-4|model_response": ["x"] * rows, "gpt-4|total_cost": rng.uniform(0.01, 0.05, rows),
                       "llama-70b": rng.integers(0, 2, rows).astype(float), "llama-70b|model_response": ["y"] * rows,
                       "llama-70b|total_cost": rng.uniform(1e-4, 1e-3, rows),
                       "oracle_model_to_route_to": ["gpt-4"] * rows})
    if rows == 3:
        df["gpt-4"], df["gpt-4|total_cost"] = [1.0, 0.0, 1.0], [0.03, 0.02, 0.04]
        df["llama-70b"] = [0.0, 0.5, 1.0]
    df.to_pickle(path)
    return df


def test_routerbench_pickle_needs_opt_in_and_is_converted(tmp_path):
    path = tmp_path / "user" / "routerbench_0shot.pkl"
    path.parent.mkdir()
    _routerbench(path)
    cache = tmp_path / "data" / "cache"
    with pytest.raises(DatasetFormatError, match="allow_pickle"):
        read_workload(path, cache_dir=cache)
    w = read_workload(path, allow_pickle=True, cache_dir=cache)
    assert w.models == ["gpt-4", "llama-70b"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["routerbench_0shot.pkl"]  # nothing written beside it
    assert len(list(cache.glob("stageroute-routerbench_0shot-*.parquet"))) == 1
    np.testing.assert_allclose(w.quality[:, 1], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(w.cost[:, 0], [0.03, 0.02, 0.04])
    assert read_workload(path, cache_dir=cache).models == w.models  # the cached conversion is read, no pickle needed


def test_pickle_cache_is_keyed_by_content_not_by_a_parquet_beside_it(tmp_path):
    path = tmp_path / "routerbench_0shot.pkl"
    cache = tmp_path / "data" / "cache"
    _routerbench(path, rows=400, seed=1)
    assert read_workload(path, allow_pickle=True, cache_dir=cache).quality.shape == (400, 2)
    pd.read_pickle(path).to_parquet(path.with_suffix(".parquet"))  # an older 400-row conversion beside the pickle ...
    new = _routerbench(path, rows=100, seed=2)                     # ... and a new 100-row pickle in its place
    with pytest.raises(DatasetFormatError, match="allow_pickle"):  # new content: not converted yet, needs the opt-in
        read_workload(path, cache_dir=cache)
    w = read_workload(path, allow_pickle=True, cache_dir=cache)
    assert w.quality.shape == (100, 2)
    np.testing.assert_allclose(w.cost[:, 1], new["llama-70b|total_cost"])
    assert len(list(cache.glob("*.parquet"))) == 2 and not list(cache.glob("*.tmp"))


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


@pytest.mark.parametrize("value", ["", "nan", "inf", "n/a?"])
def test_a_nan_quality_names_the_row_not_a_missing_row(tmp_path, value):
    """A row whose quality is NaN was reported as "some queries lack a row for some model"."""
    (tmp_path / "quality.csv").write_text("query_id,model,quality,cost\n"
                                          "q0,a,1.0,0.1\nq0,b,0.0,0.2\n"
                                          f"q1,a,{value},0.1\nq1,b,1.0,0.2\n")
    with pytest.raises(DatasetFormatError, match=r"1 rows with a missing \(NaN\), non-numeric or infinite quality "
                                                 r"\(first: line 4, query_id 'q1', model 'a'") as e:
        read_workload(tmp_path)
    assert "lack a row" not in str(e.value) and str(e.value).startswith(str(tmp_path / "quality.csv"))
