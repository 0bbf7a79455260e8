"""Reader of the PhysioNet/CinC Challenge 2012 record files, with a tensor cache.

Layout (https://physionet.org/content/challenge-2012/): `set-a/`, `set-b/`, `set-c/` folders of `<RecordID>.txt`
files, each starting with the header `Time,Parameter,Value`, then rows `HH:MM,<Parameter>,<Value>` where hours may
exceed 23 (records span 48 h). The first rows, at 00:00, are `RecordID` and the general descriptors (Age, Gender,
Height, ICUType, Weight); -1 marks a missing descriptor. The other rows are the 36 time-series variables below; Weight
also recurs after admission as a time series, which the reader keeps as a 37th series (`SERIES`), as the reference code
(PyOmniTS / tsdm) does; which series a benchmark forecasts is chosen in `protocol.records_to_samples`.
`Outcomes-a.txt` etc. hold `RecordID,SAPS-I,SOFA,Length_of_stay,Survival,In-hospital_death` per record.

Parsing thousands of text files is slow, so `load_records` caches the parsed observations as a `.pt` file keyed by a
hash of the file list, sizes and mtimes, written atomically and loaded back with `weights_only=True`.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError
from lit_iclr.core.data import clean_stale_tmp

DESCRIPTORS = ("Age", "Gender", "Height", "ICUType", "Weight")
# The 36 time-series variables of the tsdm / t-PatchGNN PhysioNet'12 benchmark (alphabetical as in the challenge docs).
VARIABLES = (
    "ALP", "ALT", "AST", "Albumin", "BUN", "Bilirubin", "Cholesterol", "Creatinine", "DiasABP", "FiO2", "GCS",
    "Glucose", "HCO3", "HCT", "HR", "K", "Lactate", "MAP", "MechVent", "Mg", "NIDiasABP", "NIMAP", "NISysABP", "Na",
    "PaCO2", "PaO2", "Platelets", "RespRate", "SaO2", "SysABP", "Temp", "TroponinI", "TroponinT", "Urine", "WBC", "pH",
)
# Every series the reader keeps: the 36 plus Weight measured after admission (its 00:00 row stays a descriptor).
SERIES = (*VARIABLES, "Weight")
VAR_INDEX = {name: i for i, name in enumerate(SERIES)}
# What the reference code (PyOmniTS) forecasts: the 37 series less MechVent, whose recorded value is always 1.
REFERENCE_VARIABLES = tuple(v for v in SERIES if v != "MechVent")
HEADER = "Time,Parameter,Value"
OUTCOME_HEADER = "RecordID,SAPS-I,SOFA,Length_of_stay,Survival,In-hospital_death"
SETS = ("set-a", "set-b", "set-c")
READER_VERSION = 2  # bump when what the cache stores changes


@dataclass
class Records:
    """Parsed observations of many records, flattened (one row per time-series observation).

    record_ids: (R,) int64 RecordIDs; descriptors: (R, 5) float32 (NaN = missing); obs_record: (N,) int64 row into
    record_ids; obs_minute: (N,) int64 minutes since admission; obs_var: (N,) int64 index into SERIES;
    obs_value: (N,) float32; files: (R,) the record files, for messages.
    """

    record_ids: torch.Tensor
    descriptors: torch.Tensor
    obs_record: torch.Tensor
    obs_minute: torch.Tensor
    obs_var: torch.Tensor
    obs_value: torch.Tensor
    files: list[str]

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("record_ids", "descriptors", "obs_record", "obs_minute", "obs_var",
                                              "obs_value")} | {"files": list(self.files)}


def parse_time(text: str) -> int:
    """`HH:MM` -> minutes; hours may exceed 23. Raises ValueError on anything else."""
    hh, sep, mm = text.partition(":")
    if not sep or not hh.isdigit() or not mm.isdigit() or len(mm) != 2 or int(mm) > 59:
        raise ValueError(f"time {text!r} is not HH:MM")
    return int(hh) * 60 + int(mm)


def parse_record(path: str | Path) -> tuple[int, np.ndarray, list[tuple[int, int, float]]]:
    """Parse one `<RecordID>.txt`: (RecordID, descriptors (5,) with NaN for -1/absent, [(minute, var, value)]).

    Every problem raises `DatasetFormatError` naming the file and line: a wrong header, a line without three fields, a
    bad time, an unknown parameter, a non-numeric or non-finite value, a RecordID that disagrees with the file name.
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetFormatError(path, f"cannot be read ({e})", "re-extract the record from the challenge archive") from e
    if not lines or lines[0].strip().lstrip("\ufeff") != HEADER:
        raise DatasetFormatError(path, f"line 1: expected the header {HEADER!r}, got {lines[0][:60]!r}" if lines
                                 else "empty file", "use the original PhysioNet 2012 record files")
    record_id = None
    desc = np.full(len(DESCRIPTORS), np.nan, dtype=np.float32)
    obs: list[tuple[int, int, float]] = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        parts = line.strip().split(",")
        where = f"line {n} ({line.strip()[:60]!r})"
        if len(parts) != 3:
            raise DatasetFormatError(path, f"{where}: expected 3 comma-separated fields Time,Parameter,Value",
                                     "fix or delete the malformed line")
        t_text, name, v_text = (p.strip() for p in parts)
        try:
            minute = parse_time(t_text)
        except ValueError as e:
            raise DatasetFormatError(path, f"{where}: {e}", "times must be HH:MM since ICU admission") from None
        try:
            value = float(v_text)
        except ValueError:
            raise DatasetFormatError(path, f"{where}: value {v_text!r} is not a number",
                                     "fix or delete the line (missing values are simply absent rows)") from None
        if not np.isfinite(value):
            raise DatasetFormatError(path, f"{where}: value {v_text!r} is not finite", "fix or delete the line")
        if name == "RecordID":
            record_id = int(value)
        elif name in DESCRIPTORS and minute == 0:
            # General descriptors: -1 means missing (challenge definition).
            desc[DESCRIPTORS.index(name)] = np.nan if value == -1 else value
        elif name in VAR_INDEX:
            obs.append((minute, VAR_INDEX[name], value))
        elif name in DESCRIPTORS:
            raise DatasetFormatError(path, f"{where}: general descriptor {name!r} after 00:00",
                                     "descriptors (Age, Gender, Height, ICUType) are recorded at 00:00 only")
        else:
            raise DatasetFormatError(path, f"{where}: unknown parameter {name!r}",
                                     f"PhysioNet 2012 parameters are RecordID, {', '.join(DESCRIPTORS)} and "
                                     f"{', '.join(VARIABLES)}; fix or delete the line")
    if record_id is None:
        raise DatasetFormatError(path, "no `00:00,RecordID,<id>` row", "use the original PhysioNet 2012 record files")
    if path.stem.isdigit() and int(path.stem) != record_id:
        raise DatasetFormatError(path, f"RecordID {record_id} differs from the file name",
                                 "rename the file to <RecordID>.txt or fix its RecordID row")
    return record_id, desc, obs


def record_files(root: str | Path) -> list[Path]:
    """The `<id>.txt` files under root's set-a/, set-b/, set-c/ folders (or root itself if it holds records)."""
    root = Path(root)
    folders = [root / s for s in SETS if (root / s).is_dir()] or ([root] if root.is_dir() else [])
    files = sorted(p for f in folders for p in f.glob("*.txt") if not p.name.startswith("Outcomes"))
    if not files:
        raise DatasetNotFoundError(root, "no PhysioNet 2012 record files (set-a/<RecordID>.txt ...) found",
                                   "extract set-a.tar.gz (and set-b, set-c) from physionet.org/content/challenge-2012 "
                                   "into this folder, or set `root: null` for the generated default")
    return files


def read_outcomes(root: str | Path) -> dict[int, list[float]]:
    """RecordID -> [SAPS-I, SOFA, Length_of_stay, Survival, In-hospital_death] from every `Outcomes-*.txt` in root."""
    out: dict[int, list[float]] = {}
    for path in sorted(Path(root).glob("Outcomes-*.txt")):
        lines = path.read_text().splitlines()
        if not lines or lines[0].strip() != OUTCOME_HEADER:
            raise DatasetFormatError(path, f"line 1: expected the header {OUTCOME_HEADER!r}",
                                     "use the original Outcomes-*.txt file")
        for n, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            parts = line.strip().split(",")
            try:
                if len(parts) != 6:
                    raise ValueError
                out[int(parts[0])] = [float(p) for p in parts[1:]]
            except ValueError:
                raise DatasetFormatError(path, f"line {n} ({line.strip()[:60]!r}): expected 6 numbers",
                                         "fix or delete the line") from None
    return out


def _fingerprint(files: list[Path]) -> str:
    h = hashlib.sha256(f"reader-v{READER_VERSION}".encode())
    for p in files:
        st = p.stat()
        h.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def parse_files(files: list[Path]) -> Records:
    """Parse every record file (no cache)."""
    ids, descs, rec, minute, var, val = [], [], [], [], [], []
    for r, path in enumerate(files):
        record_id, desc, obs = parse_record(path)
        ids.append(record_id)
        descs.append(desc)
        if obs:
            m, v, x = zip(*obs, strict=True)
            rec.append(np.full(len(m), r, dtype=np.int64))
            minute.append(np.asarray(m, dtype=np.int64))
            var.append(np.asarray(v, dtype=np.int64))
            val.append(np.asarray(x, dtype=np.float32))
    cat = lambda parts, dt: torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=dt))
    return Records(
        record_ids=torch.tensor(ids, dtype=torch.int64), descriptors=torch.from_numpy(np.stack(descs)),
        obs_record=cat(rec, np.int64), obs_minute=cat(minute, np.int64), obs_var=cat(var, np.int64),
        obs_value=cat(val, np.float32), files=[str(p) for p in files])


def load_records(root: str | Path, cache_dir: str | Path | None = None) -> Records:
    """Parse root's record files, or load them from `cache_dir/physionet2012-<hash>.pt` when nothing changed.

    The cache key hashes every file's path, size and mtime (and the reader version), so an edited or added record
    invalidates it. It is written to a temporary file and renamed, so an interrupted run never leaves a partial cache.
    """
    files = record_files(root)
    if cache_dir is None:
        return parse_files(files)
    cache = Path(cache_dir) / f"physionet2012-{_fingerprint(files)}.pt"
    if cache.exists():
        try:
            return Records(**torch.load(cache, weights_only=True))
        except Exception:  # corrupt or from another torch: parse again and overwrite
            pass
    records = parse_files(files)
    cache.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp(cache)  # temporary files of killed runs
    tmp = cache.with_name(f".{cache.name}.tmp-{os.getpid()}")
    torch.save(records.as_dict(), tmp)
    os.replace(tmp, cache)
    return records
