"""Readers and writers of the predictor's training data, in formats a user can replace with real measurements.

- Boolean landscapes: `scores.csv` with a header `x,y`: a bit string of 0/1 and its score per line.
- Continuous landscapes: `scores.csv` with a header `x1,...,xd,y`.
- Sequence design (DNA-transcription-factor affinity): `sequences.fasta` (">id" lines, A/C/G/T sequences of one length)
  and `scores.tsv` (`id<TAB>score` with a header), as exported from binding assays (PBM, SELEX, MITOMI).

Every reader checks what it reads and raises `DatasetFormatError(path, problem, fix)` naming the line.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

import torch

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError

from .landscapes import ALPHABET


def _exists(path: Path, fix: str) -> Path:
    if not path.is_file():
        raise DatasetNotFoundError(path, "file not found", fix)
    return path


def _score(text: str, path: Path, line: int) -> float:
    try:
        v = float(text)
    except ValueError:
        raise DatasetFormatError(path, f"line {line}: score {text!r} is not a number",
                                 "write one numeric score per row") from None
    if not math.isfinite(v):
        raise DatasetFormatError(path, f"line {line}: score is {text}", "drop or repair rows with NaN/inf scores")
    return v


def write_bit_table(path: Path, x: torch.Tensor, y: torch.Tensor) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["x", "y"])
        for row, v in zip(x.to(torch.int64).tolist(), y.tolist(), strict=True):
            w.writerow(["".join(map(str, row)), f"{v:.6g}"])


def read_bit_table(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (N, n) float in {0,1}, y (N,)) from a `x,y` CSV of bit strings."""
    path = _exists(Path(path), "point `root` at a folder holding scores.csv (header x,y; bit strings and scores)")
    xs, ys = [], []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != ["x", "y"]:
            raise DatasetFormatError(path, f"header is {header}, expected ['x', 'y']", "start the file with the line x,y")
        for line, row in enumerate(reader, start=2):
            if len(row) != 2:
                raise DatasetFormatError(path, f"line {line}: {len(row)} fields, expected 2", "write `bits,score` per row")
            bits = row[0].strip()
            if not bits or set(bits) - {"0", "1"}:
                raise DatasetFormatError(path, f"line {line}: {bits!r} is not a string of 0/1", "write inputs as bit strings")
            if xs and len(bits) != len(xs[0]):
                raise DatasetFormatError(path, f"line {line}: {len(bits)} bits, earlier rows have {len(xs[0])}",
                                         "every input must have the same number of bits")
            xs.append([int(b) for b in bits])
            ys.append(_score(row[1], path, line))
    if not xs:
        raise DatasetFormatError(path, "no rows", "add at least one scored input")
    return torch.tensor(xs, dtype=torch.float32), torch.tensor(ys, dtype=torch.float32)


def write_point_table(path: Path, x: torch.Tensor, y: torch.Tensor) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"x{i + 1}" for i in range(x.shape[1])] + ["y"])
        for row, v in zip(x.tolist(), y.tolist(), strict=True):
            w.writerow([f"{u:.6g}" for u in row] + [f"{v:.6g}"])


def read_point_table(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(x (N, d), y (N,)) from a `x1,...,xd,y` CSV."""
    path = _exists(Path(path), "point `root` at a folder holding scores.csv (header x1,...,xd,y)")
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        d = len(header or []) - 1
        if d < 1 or header != [f"x{i + 1}" for i in range(d)] + ["y"]:
            raise DatasetFormatError(path, f"header is {header}, expected x1,...,xd,y", "name the columns x1,...,xd,y")
        rows = []
        for line, row in enumerate(reader, start=2):
            if len(row) != d + 1:
                raise DatasetFormatError(path, f"line {line}: {len(row)} fields, expected {d + 1}", "one value per column")
            rows.append([_score(v, path, line) for v in row])
    if not rows:
        raise DatasetFormatError(path, "no rows", "add at least one scored point")
    t = torch.tensor(rows, dtype=torch.float32)
    return t[:, :d], t[:, d]


def write_fasta(path: Path, ids: list[str], seqs: list[str]) -> None:
    with open(path, "w") as f:
        for i, s in zip(ids, seqs, strict=True):
            f.write(f">{i}\n{s}\n")


def read_fasta(path: Path) -> tuple[list[str], list[str]]:
    """Ids and upper-case A/C/G/T sequences of one length (multi-line records allowed)."""
    path = _exists(Path(path), "point `root` at a folder holding sequences.fasta and scores.tsv")
    ids, seqs = [], []
    with open(path) as f:
        for line, text in enumerate(f, start=1):
            text = text.strip()
            if not text:
                continue
            if text.startswith(">"):
                name = text[1:].split()[0] if text[1:].strip() else ""
                if not name:
                    raise DatasetFormatError(path, f"line {line}: header without an id", "write `>id` before each sequence")
                ids.append(name)
                seqs.append("")
            elif not ids:
                raise DatasetFormatError(path, f"line {line}: sequence before the first '>' header", "start with `>id`")
            else:
                s = text.upper()
                if set(s) - set(ALPHABET):
                    bad = sorted(set(s) - set(ALPHABET))
                    raise DatasetFormatError(path, f"line {line}: letters {bad} outside {ALPHABET}",
                                             "write DNA sequences over A, C, G, T only")
                seqs[-1] += s
    if not ids:
        raise DatasetFormatError(path, "no FASTA records", "write `>id` lines followed by sequences")
    if len(set(ids)) != len(ids):
        raise DatasetFormatError(path, "duplicate sequence ids", "give every record a unique id")
    lengths = {len(s) for s in seqs}
    if len(lengths) != 1 or 0 in lengths:
        raise DatasetFormatError(path, f"sequences have lengths {sorted(lengths)[:5]}", "align or trim them to one length")
    return ids, seqs


def write_scores(path: Path, ids: list[str], y: torch.Tensor) -> None:
    with open(path, "w") as f:
        f.write("id\tscore\n")
        for i, v in zip(ids, y.tolist(), strict=True):
            f.write(f"{i}\t{v:.6g}\n")


def read_scores(path: Path, ids: list[str]) -> torch.Tensor:
    """Scores (N,) in the order of `ids` from an `id<TAB>score` table; every id must be scored exactly once."""
    path = _exists(Path(path), "add scores.tsv (`id<TAB>score` with a header) next to sequences.fasta")
    table: dict[str, float] = {}
    with open(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        if header != ["id", "score"]:
            raise DatasetFormatError(path, f"header is {header}, expected id<TAB>score", "start the file with `id\\tscore`")
        for line, text in enumerate(f, start=2):
            if not text.strip():
                continue
            parts = text.rstrip("\n").split("\t")
            if len(parts) != 2:
                raise DatasetFormatError(path, f"line {line}: {len(parts)} tab-separated fields, expected 2",
                                         "write id<TAB>score")
            table[parts[0]] = _score(parts[1], path, line)
    missing = [i for i in ids if i not in table]
    if missing:
        raise DatasetFormatError(path, f"{len(missing)} FASTA ids have no score (e.g. {missing[:3]})", "score every sequence")
    return torch.tensor([table[i] for i in ids], dtype=torch.float32)


def one_hot_dna(seqs: list[str]) -> torch.Tensor:
    idx = torch.tensor([[ALPHABET.index(c) for c in s] for s in seqs])
    return torch.nn.functional.one_hot(idx, 4).float()
