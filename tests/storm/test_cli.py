"""The tiny twin through the CLI (generating its planet in the WB2 layout), and the real config parsed."""
from __future__ import annotations

from pathlib import Path

import pytest
import xarray as xr

from lit_iclr.cli import main
from tests.storm.test_reader import make_store
from tests.twin import fit_twin, metric_rows, print_config

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_twin_fits_through_the_cli(tmp_path):
    fit_twin("storm", tmp_path)
    rows = metric_rows(tmp_path)
    train = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    val = [r for r in rows if r.get("val/rmse_norm_6h/model")]
    assert train and all(0 < v < 10 for v in train)
    assert val and 0 < float(val[-1]["val/rmse_norm_6h/model"]) < 5
    assert 0 < float(val[-1]["val/rmse/geopotential_500/24h"]) < 5000  # physical units (m^2/s^2)
    for k in (1, 2):  # each coarse head next to its consistency baseline Down^k(finest forecast)
        assert 0 < float(val[-1][f"val/rmse_down_fine_s{k}"]) < 5 and 0 < float(val[-1][f"val/rmse_head_s{k}"]) < 5
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert list((tmp_path / "figures").glob("val_forecast*.png"))
    # the generated default is a WB2 Zarr store read back by the reader
    (store,) = (tmp_path / "data").glob("storm-planet-v1*/*.zarr")
    ds = xr.open_zarr(store)
    assert {"geopotential", "temperature", "2m_temperature", "land_sea_mask"} <= set(ds.data_vars)
    assert ds["geopotential"].dims == ("time", "level", "latitude", "longitude") and ds.sizes["time"] == 160
    assert list((tmp_path / "data" / "cache").glob("storm-stats-*.npz"))


def test_real_config_parses(capsys):
    out = print_config("configs/storm.yaml", capsys)
    assert "lit_iclr.storm.STORM" in out and "WB2WeatherData" in out and "consistency_weight" in out
    assert "num_channels" not in out  # linked from the data, never written in YAML


def test_missing_level_is_a_one_line_error(tmp_path, capsys):
    store = tmp_path / "era5.zarr"  # a real WB2 store with geopotential at 500 and 850 hPa only
    make_store(n_times=16).to_zarr(store, zarr_format=2, consolidated=True)
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--config", str(ROOT / "tests/configs/storm.yaml"), "--data.init_args.root", str(store),
              "--data.init_args.variables", "[geopotential@700]", "--data.init_args.static_variables", "[land_sea_mask]",
              "--data.init_args.data_dir", str(tmp_path / "data")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "lit-iclr: error:" in err and "Traceback" not in err and "fix:" in err
    assert "era5.zarr" in err and "'geopotential' has no level 700; levels there: [500, 850]" in err


def test_lead_not_multiple_of_step_is_a_config_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["prepare", "--config", str(ROOT / "tests/configs/storm.yaml"), "--data.init_args.lead_times", "[6, 9]"])
    assert e.value.code == 2
    assert "lead_times [6, 9] must be positive multiples of step_hours=6" in capsys.readouterr().err
