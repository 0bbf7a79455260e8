"""PhysioNet 2012 reader, tensor cache and forecasting protocol, on small files written in the real format."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError
from lit_iclr.reimts import physionet
from lit_iclr.reimts.physionet import VAR_INDEX, load_records, parse_record, read_outcomes
from lit_iclr.reimts.protocol import records_to_samples, standardise

REC_A = """Time,Parameter,Value
00:00,RecordID,132539
00:00,Age,54
00:00,Gender,0
00:00,Height,-1
00:00,ICUType,4
00:00,Weight,-1
00:07,GCS,15
00:37,HR,73
00:52,HR,77
01:10,HR,80
12:00,Weight,80.5
35:59,Temp,37.5
36:00,HR,90
38:59,Temp,38.1
39:00,HR,120
47:30,pH,7.4
"""
REC_B = """Time,Parameter,Value
00:00,RecordID,132540
00:00,Age,76
00:00,Gender,1
00:00,Height,175.3
00:00,ICUType,2
00:00,Weight,76
02:30,NIMAP,70
37:15,NIMAP,72
"""
REC_EMPTY_LOOKBACK = """Time,Parameter,Value
00:00,RecordID,132541
00:00,Age,60
37:00,HR,70
"""


def write(root: Path, folder: str, rid: int, text: str) -> Path:
    (root / folder).mkdir(parents=True, exist_ok=True)
    path = root / folder / f"{rid}.txt"
    path.write_text(text)
    return path


def test_parse_record_values_descriptors_and_times(tmp_path):
    rid, desc, obs = parse_record(write(tmp_path, "set-a", 132539, REC_A))
    assert rid == 132539
    assert desc[0] == 54 and desc[1] == 0 and desc[3] == 4
    assert math.isnan(desc[2]) and math.isnan(desc[4])  # -1 = missing descriptor
    # Weight after admission is kept as the 37th series (its 00:00 row is a descriptor); hours beyond 23 parse
    assert (35 * 60 + 59, VAR_INDEX["Temp"], 37.5) in obs and (47 * 60 + 30, VAR_INDEX["pH"], 7.4) in obs
    assert (12 * 60, VAR_INDEX["Weight"], 80.5) in obs and VAR_INDEX["Weight"] == 36
    assert len(obs) == 10


@pytest.mark.parametrize("line, problem", [
    ("01:00,HR", "expected 3 comma-separated fields"),
    ("1:0,HR,80", "not HH:MM"),
    ("01:75,HR,80", "not HH:MM"),
    ("01:00,HeartRate,80", "unknown parameter 'HeartRate'"),
    ("01:00,HR,eighty", "'eighty' is not a number"),
    ("01:00,HR,nan", "not finite"),
    ("01:00,Age,54", "descriptor 'Age' after 00:00"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, problem):
    path = write(tmp_path, "set-a", 132540, REC_B + line + "\n")
    with pytest.raises(DatasetFormatError) as e:
        parse_record(path)
    msg = str(e.value)
    assert str(path) in msg and "line 10" in msg and problem in msg


def test_bad_header_missing_id_and_mismatched_id(tmp_path):
    with pytest.raises(DatasetFormatError, match="header"):
        parse_record(write(tmp_path, "set-a", 1, "Time;Parameter;Value\n00:00;RecordID;1\n"))
    with pytest.raises(DatasetFormatError, match="RecordID"):
        parse_record(write(tmp_path, "set-a", 2, "Time,Parameter,Value\n00:10,HR,80\n"))
    with pytest.raises(DatasetFormatError, match="differs from the file name"):
        parse_record(write(tmp_path, "set-a", 3, REC_B))


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="no PhysioNet 2012 record files"):
        load_records(tmp_path)


def test_outcomes(tmp_path):
    (tmp_path / "Outcomes-a.txt").write_text(physionet.OUTCOME_HEADER + "\n132539,6,1,5,-1,0\n")
    assert read_outcomes(tmp_path) == {132539: [6.0, 1.0, 5.0, -1.0, 0.0]}
    (tmp_path / "Outcomes-b.txt").write_text(physionet.OUTCOME_HEADER + "\n132540,6,x\n")
    with pytest.raises(DatasetFormatError, match="Outcomes-b.txt.*line 2"):
        read_outcomes(tmp_path)


def test_cache_is_used_and_invalidated(tmp_path, monkeypatch):
    write(tmp_path, "set-a", 132539, REC_A)
    p = write(tmp_path, "set-b", 132540, REC_B)
    first = load_records(tmp_path, tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 1
    calls = []
    real = physionet.parse_files
    monkeypatch.setattr(physionet, "parse_files", lambda files: calls.append(1) or real(files))
    again = load_records(tmp_path, tmp_path / "cache")
    assert not calls  # served from the cache
    for k in ("obs_value", "obs_minute", "obs_var", "obs_record", "record_ids"):
        assert torch.equal(getattr(first, k), getattr(again, k))
    p.write_text(REC_B + "40:00,NIMAP,75\n")  # edited record: new size/mtime -> new key, parsed again
    changed = load_records(tmp_path, tmp_path / "cache")
    assert calls and len(changed.obs_value) == len(first.obs_value) + 1


def test_protocol_hourly_mean_windows_and_dropped_records(tmp_path):
    write(tmp_path, "set-a", 132539, REC_A)
    write(tmp_path, "set-a", 132540, REC_B)
    write(tmp_path, "set-c", 132541, REC_EMPTY_LOOKBACK)
    s, dropped = records_to_samples(load_records(tmp_path))
    assert dropped == [str(tmp_path / "set-c" / "132541.txt")]  # no lookback observation: reported, left out
    assert s["record_id"].tolist() == [132539, 132540]
    hr, gcs, temp = VAR_INDEX["HR"], VAR_INDEX["GCS"], VAR_INDEX["Temp"]
    # record A lookback slots: hour 0 (GCS 15, HR mean(73, 77)), hour 1 (HR 80), hour 35 (Temp 37.5)
    np.testing.assert_allclose(s["x_time"][0, :3], np.array([0, 1, 35]) / 48)
    assert s["x"][0, 0, hr] == pytest.approx(75.0) and s["x"][0, 0, gcs] == 15 and s["x"][0, 1, hr] == 80
    assert s["x"][0, 2, temp] == pytest.approx(37.5)
    assert s["x_mask"][0].sum() == 4
    # forecast window [36, 39) h: HR at 36:00 and Temp at 38:59; HR at 39:00 and pH at 47:30 are outside
    np.testing.assert_allclose(s["y_time"][0, :2], np.array([36, 38]) / 48)
    assert s["y"][0, 0, hr] == 90 and s["y"][0, 1, temp] == pytest.approx(38.1) and s["y_mask"][0].sum() == 2
    # record B: one lookback slot, padding after it has mask 0
    assert s["x_mask"][1, 0].sum() == 1 and s["x_mask"][1, 1:].sum() == 0


def test_standardise_matches_numpy(tmp_path):
    g = torch.Generator().manual_seed(0)
    s = {"x": torch.randn(5, 4, 3, generator=g) * 3 + 1, "y": torch.randn(5, 2, 3, generator=g),
         "x_mask": (torch.rand(5, 4, 3, generator=g) < 0.6).float(), "y_mask": torch.ones(5, 2, 3)}
    x0, y0, xm = s["x"].clone(), s["y"].clone(), s["x_mask"].clone()
    train = torch.tensor([0, 2, 3])
    mean, std = standardise(s, train)
    for v in range(3):
        vals = np.concatenate([x0[train][..., v][xm[train][..., v] > 0].numpy(), y0[train][..., v].numpy().ravel()])
        assert mean[v] == pytest.approx(vals.mean(), rel=1e-5) and std[v] == pytest.approx(vals.std(), rel=1e-4)
    assert torch.all(s["x"][xm == 0] == 0)  # unobserved stays 0, never NaN


def test_protocol_variable_selection_keeps_weight_and_drops_the_rest(tmp_path):
    write(tmp_path, "set-a", 132539, REC_A)
    s, _ = records_to_samples(load_records(tmp_path), variables=("Weight", "HR"))
    # columns in the asked order; GCS and Temp are not forecast, so hour 35 (Temp only) is no slot
    assert s["x"].shape[-1] == 2
    np.testing.assert_allclose(s["x_time"][0, :3], np.array([0, 1, 12]) / 48)
    assert s["x"][0, 2, 0] == pytest.approx(80.5) and s["x"][0, 0, 1] == pytest.approx(75.0)
    assert s["x_mask"][0].sum() == 3 and s["y_mask"][0].sum() == 1  # y: HR at 36:00 only
    with pytest.raises(ValueError, match="unknown variables"):
        records_to_samples(load_records(tmp_path), variables=("Pulse",))
