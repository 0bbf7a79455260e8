"""ListOps as in the Long Range Arena (Tay et al. 2021): the generator and a reader of LRA's tsv files.

The generator follows LRA's `lra_benchmarks/data/listops.py`: a random tree of operators [MIN, [MAX, [MED (median,
truncated to int), [SM (sum mod 10) over digits 0-9, each node a digit with probability 0.75 (VALUE_P = 0.25 for an
operator) until `max_depth`, 2..max_args arguments per operator, kept when its length (digits + operators + closing
brackets) lies strictly between `min_length` and `max_length`, duplicates dropped. Files are tab-separated with the
header `Source<TAB>Target`; sources are written with LRA's parentheses, e.g.
`( ( ( [MAX 2 ) 9 ) ] )` for [MAX 2 9 ]. LRA's own defaults (depth 10, 10 args, lengths 500-2000, 96k/2k/2k) are the
`LRA_*` constants; the DataModule's defaults are shorter so a CPU can train on them. One deliberate difference: LRA
iterates a Python set, whose order depends on string hashing; we keep insertion order so a seed fixes the files.

The reader, like the S4/S5 loaders, drops the parentheses and maps each remaining token through a fixed vocabulary.
"""
from __future__ import annotations

import csv
import io
import random
from pathlib import Path

import numpy as np

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError

MIN, MAX, MED, FIRST, LAST, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[FIRST", "[LAST", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)  # LRA leaves FIRST and LAST out of the task
VALUE_P = 0.25
LRA_MAX_DEPTH, LRA_MAX_ARGS, LRA_MIN_LENGTH, LRA_MAX_LENGTH = 10, 10, 500, 2000

# Token ids: 0 is padding; every token an LRA file can hold has a fixed id.
VOCAB = ("<pad>", *[str(d) for d in range(10)], MIN, MAX, MED, SUM_MOD, FIRST, LAST, END)
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
NUM_CLASSES = 10


def generate_tree(rng: random.Random, depth: int, max_depth: int, max_args: int):
    """A random equation tree in LRA's nested-pair form, and its length in tokens (without parentheses)."""
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        return rng.choice(range(10)), 1
    length = 2  # the operator and its closing bracket
    values = []
    for _ in range(rng.randint(2, max_args)):
        sub, sub_len = generate_tree(rng, depth + 1, max_depth, max_args)
        values.append(sub)
        length += sub_len
    t = (rng.choice(OPERATORS), values[0])
    for v in values[1:]:
        t = (t, v)
    return (t, END), length


def to_string(t) -> str:
    """LRA's rendering: every pair in parentheses."""
    if isinstance(t, str):
        return t
    if isinstance(t, int):
        return str(t)
    return "( " + to_string(t[0]) + " " + to_string(t[1]) + " )"


def apply_op(op: str, args: list[int]) -> int:
    if op == MIN:
        return min(args)
    if op == MAX:
        return max(args)
    if op == MED:
        return int(np.median(args))
    if op == SUM_MOD:
        return sum(args) % 10
    if op == FIRST:
        return args[0]
    if op == LAST:
        return args[-1]
    raise ValueError(f"unknown ListOps operator {op!r}")


def to_value(t):
    """Evaluate a tree (LRA's `to_value`: an operator absorbs arguments until its closing bracket)."""
    if not isinstance(t, tuple):
        return t
    left, right = to_value(t[0]), to_value(t[1])
    if isinstance(left, str) and left in OPERATORS:
        return (left, [right])
    if right == END:
        return apply_op(left[0], left[1])
    return (left[0], left[1] + [right])


def generate_split_files(out_dir: Path, num_train: int, num_val: int, num_test: int, max_depth: int = LRA_MAX_DEPTH,
                         max_args: int = LRA_MAX_ARGS, min_length: int = LRA_MIN_LENGTH,
                         max_length: int = LRA_MAX_LENGTH, seed: int = 0, task: str = "basic") -> None:
    """Write `{task}_{train,val,test}.tsv` as LRA does (unique trees, lengths in (min_length, max_length))."""
    rng = random.Random(seed)
    trees: dict = {}
    total = num_train + num_val + num_test
    tries = 0
    while len(trees) < total:
        tree, length = generate_tree(rng, 1, max_depth, max_args)
        tries += 1
        if min_length < length < max_length:
            trees.setdefault(tree, None)
        if tries > 200 * total + 10_000:
            raise RuntimeError(f"ListOps: only {len(trees)} of {total} trees in ({min_length}, {max_length}) after "
                               f"{tries} draws; widen the length range or raise max_depth/max_args")
    rows = [[to_string(t), to_value(t)] for t in trees]
    splits = {"train": rows[:num_train], "val": rows[num_train:num_train + num_val],
              "test": rows[num_train + num_val:]}
    for name, data in splits.items():
        with open(Path(out_dir) / f"{task}_{name}.tsv", "w", newline="") as f:
            writer = csv.writer(f, delimiter="\t")
            writer.writerow(["Source", "Target"])
            writer.writerows(data)


def tokenize(source: str) -> list[str]:
    """Source string -> tokens without LRA's parentheses."""
    return [t for t in source.split() if t not in ("(", ")")]


def read_listops_tsv(path: str | Path, max_len: int | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """Read one LRA ListOps tsv: token-id arrays (int64) and targets (int64).

    Accepts the official files (`basic_{train,val,test}.tsv`) and ours. A row that is not `source<TAB>digit`, a token
    outside the ListOps vocabulary, or an empty file raises `DatasetFormatError` naming the file and line.
    `max_len` truncates sources (LRA models use 2048) instead of failing on longer ones.
    """
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "ListOps tsv not found",
                                   "set `root` to the folder holding basic_{train,val,test}.tsv, or null to generate")
    seqs, targets = [], []
    raw = path.read_bytes()
    if b"\0" in raw[:4096]:  # gzip, npz, a model file ...: decoding would fail with a traceback or read garbage
        raise DatasetFormatError(path, "is a binary file, not a ListOps tsv",
                                 "point `root` at LRA's basic_{train,val,test}.tsv (decompress .gz files first)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetFormatError(path, f"is not UTF-8 text ({e.reason} at byte {e.start})",
                                 "point `root` at LRA's ListOps tsv files") from e
    with io.StringIO(text, newline="") as f:
        header = f.readline().rstrip("\r\n")
        if header.split("\t") != ["Source", "Target"]:
            raise DatasetFormatError(f"{path}:1", f"header is {header[:60]!r}, expected 'Source<TAB>Target'",
                                     "use LRA's ListOps tsv format")
        for lineno, line in enumerate(f, start=2):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise DatasetFormatError(f"{path}:{lineno}", f"expected 2 tab-separated fields, found {len(fields)}",
                                         "each row must be `<source><TAB><target digit>`")
            source, target = fields
            if not target.strip().isdigit() or not 0 <= int(target) < NUM_CLASSES:
                raise DatasetFormatError(f"{path}:{lineno}", f"target {target!r} is not a digit 0-9",
                                         "each row must be `<source><TAB><target digit>`")
            tokens = tokenize(source)
            unknown = [t for t in tokens if t not in TOKEN_ID]
            if unknown or not tokens:
                problem = f"unknown token {unknown[0]!r}" if unknown else "empty source"
                raise DatasetFormatError(f"{path}:{lineno}", problem,
                                         f"sources hold digits, {', '.join(VOCAB[11:])} and parentheses")
            ids = np.array([TOKEN_ID[t] for t in tokens], dtype=np.int64)
            seqs.append(ids[:max_len] if max_len else ids)
            targets.append(int(target))
    if not seqs:
        raise DatasetFormatError(path, "no examples", "regenerate the file or point `root` at LRA's ListOps files")
    return seqs, np.array(targets, dtype=np.int64)
