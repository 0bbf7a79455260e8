"""benchmarks/scale.py: the real-shape writers are read back by the project's readers with the real shapes, and the
measurement path runs on a tiny size."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import scale  # noqa: E402
import scale_data  # noqa: E402


def test_era5_writer_is_the_wb2_grid_at_1_40625_degrees(tmp_path):
    from lit_iclr.storm import wb2

    folder = scale_data.write_era5(tmp_path / "era5", days=1)
    r = wb2.WB2Reader(scale_data.era5_store(folder), ["geopotential@500", "temperature", "2m_temperature"],
                      static_variables=["land_sea_mask"])
    x = r.read(np.arange(4))
    assert x.shape == (4, 1 + 13 + 1, 128, 256)  # 13 pressure levels of temperature, 256 x 128 grid
    assert r.periodic and np.allclose(np.diff(r.lat), 1.40625) and np.allclose(np.diff(r.lon), 1.40625)
    assert r.lat[0] == pytest.approx(-89.296875) and r.time_step_hours() == 6.0
    assert np.isfinite(x).all() and x[:, 0].std() > 0


def test_physionet_and_d4rl_writers_read_back_by_the_readers(tmp_path):
    from lit_iclr.core.offline_rl import read_d4rl_hdf5
    from lit_iclr.reimts.physionet import load_records

    rec = load_records(scale_data.write_physionet(tmp_path / "p", records=30), None)
    assert len(rec.record_ids) == 30 and rec.record_ids[0] == 132539
    assert {Path(f).parent.name for f in rec.files} == {"set-a", "set-b", "set-c"}
    d = read_d4rl_hdf5(scale_data.write_d4rl(tmp_path / "d", transitions=3000) / "halfcheetah-medium-v2.hdf5")
    assert d["observations"].shape == (3000, 17) and d["actions"].shape == (3000, 6)  # next_observations stored: none dropped


def test_quick_path_measures_a_reader_on_a_tiny_size(tmp_path):
    sizes = {"physionet": dict(records=150)}
    r = scale.measure(scale.SPECS["reimts"], tmp_path, sizes, batches=2, reps=1, workers=(0,), growth=False,
                      paper=False)
    assert r["batch"] == 32 and r["rate_w0"] > 0 and r["setup_s"] > 0
    assert r["shapes"]["x"][0] == 32 and r["flops"] > 0 and r["consume"] > 0
    assert r["gpu_step_s"] >= 1e-3  # the launch floor
    table = scale.tables([r | {"rate_w2": r["rate_w0"]}], "H100", 0.4)
    assert "| reimts | physionet" in table


@pytest.mark.slow
def test_storm_lazy_loader_with_workers_after_a_main_process_read(tmp_path):
    """Workers forked after dask's threaded scheduler ran in the main process (statistics in setup) used to wait on
    the inherited pool forever."""
    folder = scale_data.write_era5(tmp_path / "era5", days=6)
    spec = scale.SPECS["storm"]
    module, dm = scale.build(spec, scale_data.era5_store(folder), ["--data.init_args.batch_size=2"])
    scale.setup(dm, module)
    dm.num_workers = 2
    t0 = time.perf_counter()
    batch = next(iter(dm.train_dataloader()))
    assert batch["x"].shape == (2, 2, 8, 128, 256) and time.perf_counter() - t0 < 120
