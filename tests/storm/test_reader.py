"""The WB2 reader on small stores written in the real layout (Zarr and netCDF), including malformed ones."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError
from lit_iclr.storm import wb2
from lit_iclr.storm.data import WB2WeatherData


def make_store(n_times=40, descending=True, lon180=True, nan=False, start="2000-01-01"):
    """An ERA5-like dataset: latitude descending (ERA5) and longitude -180..180, like many downloads."""
    lat = np.linspace(78.75, -78.75, 8) if descending else np.linspace(-78.75, 78.75, 8)
    lon = np.arange(-180, 180, 22.5) if lon180 else np.arange(0, 360, 22.5)
    time = pd.date_range(start, periods=n_times, freq="6h")
    rng = np.random.default_rng(0)
    LAT, LON = np.meshgrid(lat, lon, indexing="ij")
    z = 50000 + 100 * LAT[None, None] + rng.normal(size=(n_times, 2, 8, 16))
    t2m = 280 + np.cos(np.radians(LON))[None] + 0.01 * np.arange(n_times)[:, None, None]
    if nan:
        z[5, 0, 3, 3] = np.nan
    return xr.Dataset({"geopotential": (("time", "level", "latitude", "longitude"), z.astype(np.float32)),
                       "2m_temperature": (("time", "latitude", "longitude"), t2m.astype(np.float32)),
                       "land_sea_mask": (("latitude", "longitude"), (LAT > 0).astype(np.float32))},
                      coords={"time": time, "level": [500, 850], "latitude": lat, "longitude": lon})


def test_zarr_reader_canonicalises_grid_and_reads_channels(tmp_path):
    ds = make_store()
    ds.to_zarr(tmp_path / "era5.zarr", zarr_format=2, consolidated=True)
    r = wb2.WB2Reader(tmp_path / "era5.zarr", ["geopotential@850", "2m_temperature"], static_variables=["land_sea_mask"])
    assert r.channel_names == ["geopotential_850", "2m_temperature"]
    assert np.all(np.diff(r.lat) > 0) and r.lon.min() == 0 and np.all(np.diff(r.lon) > 0) and r.periodic
    x = r.read(np.array([3, 1]))
    # value at (lat 78.75, lon 0) of time 3: the input had lat row 0, lon column 8 (lon 0 in -180..180)
    assert x.shape == (2, 2, 8, 16)
    np.testing.assert_allclose(x[0, 0, -1, 0], ds["geopotential"].values[3, 1, 0, 8], rtol=1e-6)
    np.testing.assert_allclose(x[1, 1, 0, 4], ds["2m_temperature"].values[1, -1, 12], rtol=1e-6)
    assert r.time_step_hours() == 6.0


def test_netcdf_folder_and_region_crossing_greenwich(tmp_path):
    ds = make_store(lon180=False)
    (tmp_path / "nc").mkdir()
    ds[["geopotential"]].to_netcdf(tmp_path / "nc" / "geopotential.nc", engine="h5netcdf")
    ds[["2m_temperature"]].to_netcdf(tmp_path / "nc" / "2m_temperature.nc", engine="h5netcdf")
    r = wb2.WB2Reader(tmp_path / "nc", ["2m_temperature"], region=[-10, 80, 315, 45])  # 45 W .. 45 E
    np.testing.assert_allclose(r.lon, [315, 337.5, 0, 22.5, 45])
    assert r.lat.tolist() == [11.25, 33.75, 56.25, 78.75] and not r.periodic
    x = r.read(np.array([0]))
    want = ds["2m_temperature"].isel(time=0).sel(latitude=r.lat, longitude=r.lon).values
    np.testing.assert_allclose(x[0, 0], want, rtol=1e-6)


def test_missing_variable_and_level_name_what_is_there(tmp_path):
    make_store().to_zarr(tmp_path / "s.zarr", zarr_format=2)
    with pytest.raises(DatasetFormatError, match=r"'temperature' not found.*geopotential") as e:
        wb2.WB2Reader(tmp_path / "s.zarr", ["temperature@850"])
    assert "s.zarr" in str(e.value)
    with pytest.raises(DatasetFormatError, match=r"no level 700; levels there: \[500, 850\]"):
        wb2.WB2Reader(tmp_path / "s.zarr", ["geopotential@700"])
    with pytest.raises(DatasetNotFoundError):
        wb2.WB2Reader(tmp_path / "nope.zarr", ["geopotential"])


def test_nan_wrong_grid_and_too_few_steps_raise_format_errors(tmp_path):
    make_store(nan=True).to_zarr(tmp_path / "nan.zarr", zarr_format=2)
    r = wb2.WB2Reader(tmp_path / "nan.zarr", ["geopotential@500"])
    with pytest.raises(DatasetFormatError, match=r"nan.zarr.*NaN/inf in geopotential_500 at 2000-01-02T06"):
        r.read(np.arange(10))
    bad = make_store().rename({"latitude": "y"})
    bad.to_zarr(tmp_path / "grid.zarr", zarr_format=2)
    with pytest.raises(DatasetFormatError, match="no `latitude` dimension"):
        wb2.WB2Reader(tmp_path / "grid.zarr", ["geopotential"])
    make_store(n_times=6).to_zarr(tmp_path / "short.zarr", zarr_format=2)
    dm = WB2WeatherData(root=str(tmp_path / "short.zarr"), data_dir=str(tmp_path / "cache"),
                        variables=["geopotential@500"], static_variables=[], train_period=[2000], val_period=[2000],
                        test_period=[2000], lead_times=[6, 12, 18, 24, 30, 36])
    with pytest.raises(DatasetFormatError, match=r"short.zarr.*too few for history 2"):
        dm.setup("fit")


def test_windows_skip_gaps_and_follow_periods():
    times = pd.date_range("2000-01-01", periods=12, freq="6h").values
    times = np.delete(times, 5)  # a missing time stamp
    starts = wb2.window_starts(times, np.array([0, 6, 12]))
    # windows needing the missing 2000-01-02T06 (index 5 of the full range) are dropped
    assert starts.tolist() == [0, 1, 2, 5, 6, 7, 8]
    idx = wb2.select_times(pd.date_range("1999-12-31", periods=12, freq="12h").values, ["2000-01-02:2000-01-03"])
    assert idx.tolist() == [4, 5, 6, 7]


def test_stats_match_numpy_and_datamodule_batches(tmp_path):
    ds = make_store(n_times=48)
    ds.to_zarr(tmp_path / "s.zarr", zarr_format=2)
    r = wb2.WB2Reader(tmp_path / "s.zarr", ["geopotential@500", "2m_temperature"])
    idx = np.arange(40)
    st = wb2.compute_stats(r, idx, step=1, block=7)
    x = r.read(idx).astype(np.float64)
    np.testing.assert_allclose(st["mean"], x.mean((0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(st["std"], x.std((0, 2, 3)), rtol=1e-4)
    np.testing.assert_allclose(st["diff_std"], np.sqrt(((x[1:] - x[:-1]) ** 2).mean((0, 2, 3))), rtol=1e-4)
    # under a year of data the climatology is the per-hour-of-day mean
    clim = wb2.climatology(st, r.times[idx[:4]])
    np.testing.assert_allclose(clim[0], x[0::4].mean(0), rtol=1e-4)
    dm = eight_day_store(tmp_path, batch_size=3, variables=["geopotential@500", "2m_temperature"])
    dm.setup("fit")
    b = next(iter(dm.val_dataloader()))
    assert b["x"].shape == (3, 2, 2, 8, 16) and b["y"].shape == (3, 2, 2, 8, 16) and b["y_clim"].shape == b["y"].shape
    # the first val window: inputs 01-09 00,06 h; targets +6 h and +18 h, normalised with the training statistics
    full = r.read(np.array([32, 33, 34, 36]))
    norm = (full - dm.mean[:, None, None]) / dm.std[:, None, None]
    np.testing.assert_allclose(b["x"][0].numpy(), norm[:2], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b["y"][0].numpy(), norm[2:], rtol=1e-4, atol=1e-5)
    assert b["lead_steps"][0].tolist() == [1, 3]
    # lazy reads give the same samples as the in-memory arrays
    dm2 = eight_day_store(tmp_path, batch_size=3, variables=["geopotential@500", "2m_temperature"], in_memory=False)
    dm2.setup("fit")
    b2 = next(iter(dm2.val_dataloader()))
    np.testing.assert_allclose(b2["x"].numpy(), b["x"].numpy(), rtol=1e-5, atol=1e-6)


def test_every_period_problem_of_a_foreign_store_comes_in_one_message(tmp_path):
    """Period problems came one per launch (fix one, launch, read the next)."""
    make_store(n_times=40).to_zarr(tmp_path / "s.zarr", zarr_format=2)  # 2000-01-01 00h .. 2000-01-10 18h, 6-hourly
    dm = WB2WeatherData(root=str(tmp_path / "s.zarr"), data_dir=str(tmp_path / "cache"), variables=["geopotential@500"],
                        static_variables=[], train_period=[1999], val_period=["2000-01-01:2000-01-01"],
                        test_period=[2001], lead_times=[6], eval_lead_times=[6, 24])
    with pytest.raises(DatasetFormatError) as e:
        dm.setup("fit")
    msg = str(e.value)
    assert "3 problem(s) of the time axis" in msg and "no time steps in train_period [1999]" in msg
    assert "val_period ['2000-01-01:2000-01-01']: 4 time steps" in msg and "too few for history 2 x 6 h + lead 24 h" in msg
    assert "no time steps in test_period [2001]" in msg and "2000-01-10T18" in msg and not (tmp_path / "cache").exists()


def test_a_training_period_shorter_than_one_batch_is_refused_with_the_numbers(tmp_path):
    """The training loader drops the last incomplete batch: fewer windows than batch_size trained nothing, exit 0."""
    make_store(n_times=40).to_zarr(tmp_path / "s.zarr", zarr_format=2)
    kw = dict(root=str(tmp_path / "s.zarr"), data_dir=str(tmp_path / "cache"), variables=["geopotential@500"],
              static_variables=[], train_period=["2000-01-01:2000-01-05"], val_period=[2000], test_period=[2000],
              lead_times=[6, 12], eval_lead_times=[6])
    # 20 steps (5 days x 4), a window spans history (2 steps) + 12 h of lead (2 steps): 20 - 1 - 2 = 17 windows
    dm = WB2WeatherData(batch_size=18, **kw)
    with pytest.raises(DatasetFormatError, match=r"1 problem\(s\).*train_period \['2000-01-01:2000-01-05'\] gives 17 "
                                                 r"training windows, fewer than one batch of batch_size=18"):
        dm.setup("fit")
    dm = WB2WeatherData(batch_size=17, **kw)
    dm.setup("fit")
    assert len(dm.train_set) == 17 and len(dm.train_dataloader()) == 1


def eight_day_store(tmp_path, batch_size: int, variables: list[str], in_memory: bool | None = None) -> WB2WeatherData:
    """The DataModule over tmp_path/s.zarr: 8 training days, 4 evaluation days, leads 6/12 h (eval 6/18 h)."""
    return WB2WeatherData(root=str(tmp_path / "s.zarr"), data_dir=str(tmp_path / "cache"), batch_size=batch_size,
                          variables=variables, static_variables=["land_sea_mask"],
                          train_period=["2000-01-01:2000-01-08"], val_period=["2000-01-09:2000-01-12"],
                          test_period=["2000-01-09:2000-01-12"], lead_times=[6, 12], eval_lead_times=[6, 18],
                          eval_stride=1, in_memory=in_memory)


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_batch_read_at_once_equals_the_collated_samples(tmp_path, in_memory):
    from torch.utils.data import default_collate

    make_store(n_times=48).to_zarr(tmp_path / "s.zarr", zarr_format=2)
    dm = eight_day_store(tmp_path, batch_size=4, variables=["geopotential", "2m_temperature"], in_memory=in_memory)
    dm.setup("fit")
    assert isinstance(dm.train_set.source, np.ndarray) == in_memory
    for ds, idx in ((dm.train_set, [7, 0, 12, 7]), (dm.val_set, [2, 0, 1])):  # repeated and shared time steps
        batched = ds.__getitems__(idx)
        single = default_collate([ds[i] for i in idx])
        assert batched.keys() == single.keys() and ("y_clim" in batched) == (ds is dm.val_set)
        for k, v in single.items():
            assert batched[k].dtype == v.dtype and batched[k].shape == v.shape, k
            np.testing.assert_allclose(batched[k].numpy(), v.numpy(), rtol=1e-6, err_msg=k)
    b = next(iter(dm.train_dataloader()))  # the loader hands the batch through collate_batched
    assert b["x"].shape == (4, 2, 3, 8, 16) and b["y"].shape == (4, 2, 3, 8, 16) and b["static"].shape == (4, 1, 8, 16)
