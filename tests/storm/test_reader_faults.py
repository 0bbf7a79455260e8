"""Damaged WB2 stores and caches: one clear error (or a warning with a count), never a NaN loss or a traceback."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lit_iclr.core.errors import DatasetFormatError
from lit_iclr.storm import wb2
from tests.storm.test_reader import make_store


def _chunked_store(tmp_path):
    path = tmp_path / "s.zarr"
    make_store(n_times=16).chunk({"time": 4}).to_zarr(path, zarr_format=2, consolidated=True)
    return path


def _chunk_files(path, variable):
    return sorted(p for p in (path / variable).iterdir() if not p.name.startswith("."))


def test_truncated_chunk_names_variable_and_times(tmp_path):
    path = _chunked_store(tmp_path)
    f = _chunk_files(path, "2m_temperature")[1]  # times 4..7
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    r = wb2.WB2Reader(path, ["2m_temperature"])
    r.read(np.arange(4))  # intact chunk
    with pytest.raises(DatasetFormatError, match=r"(?s)s.zarr: cannot read 2m_temperature at .*truncated or corrupt"):
        r.read(np.arange(4, 8))


def test_missing_chunk_is_reported_as_missing_not_nan(tmp_path):
    path = _chunked_store(tmp_path)
    _chunk_files(path, "2m_temperature")[2].unlink()  # times 8..11
    r = wb2.WB2Reader(path, ["2m_temperature"])
    with pytest.raises(DatasetFormatError, match=r"chunk of 2m_temperature holding 2000-01-03T00.* is missing"):
        r.read(np.arange(6, 10))


def test_foreign_store_lists_every_problem_at_once(tmp_path):
    make_store().to_zarr(tmp_path / "s.zarr", zarr_format=2)
    with pytest.raises(DatasetFormatError) as e:
        wb2.WB2Reader(tmp_path / "s.zarr", ["temperature@850", "geopotential@700", "2m_temperature@500"],
                      static_variables=["soil_type", "land_sea_mask"])
    msg = str(e.value)
    assert msg.count("\n") == 1 and "4 problem(s)" in msg  # one message, one fix line
    for part in ("'temperature' not found", "no level 700", "surface variable", "'soil_type' not found"):
        assert part in msg


def test_gaps_warn_how_many_windows_were_dropped():
    times = np.delete(pd.date_range("2000-01-01", periods=12, freq="6h").values, 5)
    with pytest.warns(UserWarning, match=r"2 of 9 forecast windows dropped"):
        starts = wb2.window_starts(times, np.array([0, 6, 12]))
    assert starts.tolist() == [0, 1, 2, 5, 6, 7, 8]
    uniform = pd.date_range("2000-01-01", periods=12, freq="6h").values
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wb2.window_starts(uniform, np.array([0, 6, 12]))  # no gap: no warning


def test_corrupt_statistics_cache_is_recomputed(tmp_path):
    make_store(n_times=48).to_zarr(tmp_path / "s.zarr", zarr_format=2)
    r = wb2.WB2Reader(tmp_path / "s.zarr", ["geopotential@500"])
    idx = np.arange(40)
    good = wb2.cached_stats(r, idx, [2000], 1, tmp_path / "cache")
    (cache,) = (tmp_path / "cache").glob("storm-stats-*.npz")
    cache.write_bytes(cache.read_bytes()[:100])  # truncated by a killed job
    with pytest.warns(UserWarning, match="recomputing"):
        again = wb2.cached_stats(r, idx, [2000], 1, tmp_path / "cache")
    np.testing.assert_allclose(again["mean"], good["mean"])
    with np.load(cache) as z:  # rewritten whole
        np.testing.assert_allclose(z["std"], good["std"])
