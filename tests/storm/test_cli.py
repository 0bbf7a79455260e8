"""The tiny twin through the CLI (generating its planet in the WB2 layout), and the real config parsed."""
from __future__ import annotations

from pathlib import Path

import pytest
import xarray as xr
import yaml

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
    # learned: the fit's last validation error is below the same config's untrained model on the same validation data
    fit_twin("storm", tmp_path / "untrained", "--data.init_args.data_dir", str(tmp_path / "data"), subcommand="validate")
    untrained = [r for r in metric_rows(tmp_path / "untrained") if r.get("val/rmse_norm_6h/model")]
    trained_rmse, untrained_rmse = float(val[-1]["val/rmse_norm_6h/model"]), float(untrained[-1]["val/rmse_norm_6h/model"])
    assert trained_rmse < 0.95 * untrained_rmse, (trained_rmse, untrained_rmse)
    # the generated default is a WB2 Zarr store read back by the reader
    (store,) = (tmp_path / "data").glob("storm-planet-v2*/*.zarr")
    ds = xr.open_zarr(store)
    assert {"geopotential", "temperature", "2m_temperature", "land_sea_mask"} <= set(ds.data_vars)
    assert ds["geopotential"].dims == ("time", "level", "latitude", "longitude") and ds.sizes["time"] == 160
    assert list((tmp_path / "data" / "cache").glob("storm-stats-*.npz"))
    # it learned: on the two validation batches the run scored, the trained network's 6 h RMSE (computed here) is what
    # it logged and below the same network before training
    (trained, untrained), logged = val_rmse_6h(tmp_path), float(val[-1]["val/rmse_norm_6h/model"])
    assert abs(trained - logged) < 1e-4 * logged
    assert trained < untrained, (trained, untrained)


def val_rmse_6h(run: Path) -> tuple[float, float]:
    """Latitude-weighted 6 h RMSE (normalised units, channel mean of sqrt(time-mean spatial MSE)) of the run's final
    checkpoint and of the same network with fresh weights, over the first two validation batches of the twin."""
    import math

    import torch

    from lit_iclr.storm import STORM, WB2WeatherData

    cfg = yaml.safe_load((ROOT / "tests/configs/storm.yaml").read_text())
    dm = WB2WeatherData(**{**cfg["data"]["init_args"], "data_dir": str(run / "data")})
    dm.setup("validate")
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    hp = {k: v for k, v in ckpt["hyper_parameters"].items() if not k.startswith("_")}
    trained = STORM(**hp)
    trained.load_state_dict(ckpt["state_dict"])
    torch.manual_seed(1)
    fresh = STORM(**hp)
    fresh.load_state_dict({k: v for k, v in ckpt["state_dict"].items() if k.startswith(("norm_", "diff_"))},
                          strict=False)
    w = torch.cos(torch.deg2rad(torch.tensor(dm.latitudes, dtype=torch.float64)))
    w = (w / w.mean())[:, None]
    out = []
    for m in (trained, fresh):
        m.eval()
        sq, n = 0.0, 0
        with torch.no_grad():
            for i, b in enumerate(dm.val_dataloader()):
                if i == 2:  # limit_val_batches: 2
                    break
                pred = m(b["x"], b["static"], b["init_time"], 1)[:, 0].double()
                err = (pred - b["y"][:, 0].double()) ** 2  # lead index 0 is 6 h
                sq = sq + (err * w).mean((-2, -1)).sum(0)  # (C,) sum over samples of the spatial MSE
                n += pred.shape[0]
        out.append(float(torch.sqrt(sq / n).mean()))
    assert all(math.isfinite(v) for v in out)
    return out[0], out[1]


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
