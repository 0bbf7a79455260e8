"""The tiny twin through the CLI, the real config parsed, and the generated default read back by the real reader."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lit_iclr.cli import main
from lit_iclr.reimts import PhysioNet2012
from lit_iclr.reimts.physionet import REFERENCE_VARIABLES, VARIABLES, parse_record
from tests.twin import fit_twin, metric_rows, print_config

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_twin_fits_through_the_cli(tmp_path):
    fit_twin("reimts", tmp_path, "--trainer.max_epochs", "4")  # 12 steps: enough to beat the untrained model
    rows = metric_rows(tmp_path)
    val = [float(r["val/mse"]) for r in rows if r.get("val/mse")]
    train = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert val and all(0 < v < 10 for v in val) and train and all(torch.isfinite(torch.tensor(train)))
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    # learned: the fit's last validation MSE is below the same config's untrained model on the same validation data
    fit_twin("reimts", tmp_path / "untrained", "--data.init_args.data_dir", str(tmp_path / "data"), subcommand="validate")
    untrained = [float(r["val/mse"]) for r in metric_rows(tmp_path / "untrained") if r.get("val/mse")]
    assert untrained and val[-1] < 0.95 * untrained[-1], (val[-1], untrained[-1])
    assert list((tmp_path / "figures").glob("val_forecast*.png"))  # forecast figure logged at validation
    # the parsed-record cache goes to <data_dir>/cache, never inside the data folder
    assert list((tmp_path / "data" / "cache").glob("physionet2012-*.pt"))
    assert not list((tmp_path / "data").glob("physionet2012-*/.cache"))


def test_real_config_parses(capsys):
    out = print_config("configs/reimts.yaml", capsys)
    assert "IMTSForecaster" in out and "PhysioNet2012" in out and "periods:" in out
    assert "n_vars" not in out  # linked from the data, never written in YAML


def test_bad_backbone_is_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(ROOT / "tests/configs/reimts.yaml"), "--model.init_args.backbone", "lstm",
              "--trainer.default_root_dir", str(tmp_path), "--data.init_args.data_dir", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "backbone" in err and err.count("\n") == 1  # rejected at parse time, one line


def test_generated_default_is_real_format_irregular_and_clean(tmp_path):
    dm = PhysioNet2012(data_dir=str(tmp_path), num_patients=40, batch_size=8)
    dm.prepare_data()
    files = sorted((dm.path / "set-a").glob("*.txt"))
    assert len(files) == 40 and (dm.path / "Outcomes-a.txt").exists()
    assert files[0].read_text().startswith("Time,Parameter,Value\n00:00,RecordID,")
    for f in files[:5]:
        parse_record(f)  # the real parser accepts every generated file
    dm.setup("fit")
    # the reference code's series: the 36 + post-admission Weight, less the constant MechVent
    assert dm.n_vars == len(REFERENCE_VARIABLES) == 36 and "Weight" in dm.variable_names
    assert "MechVent" not in dm.variable_names and set(dm.variable_names) - {"Weight"} < set(VARIABLES)
    # sequential split (reference code): RecordID order, train | val | test = 32 | 4 | 4 of the usable records
    ids = {k: v.tensors["record_id"] for k, v in dm.splits.items()}
    assert ids["train"].max() < ids["val"].min() and ids["val"].max() < ids["test"].min()
    assert len(ids["test"]) == math.ceil(0.1 * sum(map(len, ids.values())))
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) >= {"x", "x_mask", "x_time", "y", "y_mask", "y_time"}
    for k in ("x", "x_mask", "x_time", "y", "y_mask", "y_time"):
        assert torch.isfinite(batch[k]).all(), k
    density = float(batch["x_mask"].mean())
    assert 0.03 < density < 0.35  # most of the (slot x variable) grid is missing, as in PhysioNet 2012
    y_time = batch["y_time"][batch["y_mask"].amax(-1) > 0]  # real forecast slots (padding has mask 0)
    assert batch["x_time"].max() < 36 / 48 and y_time.min() >= 36 / 48 and y_time.max() < 39 / 48
    # informative sampling: per-variable observation counts vary widely across patients
    counts = batch["x_mask"].sum(1)  # (B, V)
    assert float(counts.std(0).max()) > 2.0


def test_multiscale_generator_has_events_and_v2_is_unchanged(tmp_path):
    """Data v3 (`dynamics: multiscale`) puts recurring events at a patient-specific 8-12 h period on the fast component;
    `dynamics: v2` writes the records of data version 2 (same draws); the components returned are those the values
    were drawn from (the oracle table relies on it)."""
    import numpy as np

    from lit_iclr.reimts.generator import GROUPS, SPECS, generate_patient, generator_components

    rng = np.random.default_rng(3)
    text, _, comp = generate_patient(rng, 7, "multiscale")
    fast = comp["HR"][1]  # HR loads 0.9 on the fast component
    peaks = np.flatnonzero((fast[1:-1] > fast[:-2]) & (fast[1:-1] >= fast[2:]) & (fast[1:-1] > 0.5)) + 1
    gaps = np.diff(peaks)
    assert len(peaks) >= 4 and gaps.min() >= 7 and gaps.max() <= 13 and np.ptp(gaps) <= 2  # a regular schedule
    # the recorded HR values follow slow + fast: correlation of the hourly means with the components
    rows = [r.split(",") for r in text.splitlines()[1:] if ",HR," in r]
    hours = np.array([int(r[0][:2]) for r in rows])
    vals = np.array([float(r[2]) for r in rows])
    mean, std = SPECS["HR"][:2]
    z = (vals - mean) / std
    assert np.corrcoef(z, comp["HR"][0][hours] + comp["HR"][1][hours])[0, 1] > 0.5
    assert GROUPS["haemo"][1] > 0.5
    # components regenerated in memory match the written records' draws
    got = generator_components(2, seed=5, dynamics="v2")
    rng = np.random.default_rng(5)
    for rid in (132539, 132540):
        _, _, want = generate_patient(rng, rid, "v2")
        assert got[rid].keys() == want.keys() and all(np.array_equal(got[rid][k], want[k]) for k in want)
    # v2 and multiscale records differ, and the data version is part of the folder name
    dm2 = PhysioNet2012(data_dir=str(tmp_path), num_patients=5, dynamics="v2")
    dm3 = PhysioNet2012(data_dir=str(tmp_path), num_patients=5)
    assert dm3.dynamics == "multiscale" and dm2.path != dm3.path and "-v3-" in dm3.path.name
    with pytest.raises(ValueError, match="dynamics"):
        PhysioNet2012(dynamics="v4")
