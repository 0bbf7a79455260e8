"""Reader of AwA2 / aPY in the xlsa17 format (Xian et al.'s "proposed splits"), as the paper uses them.

    <root>/res101.mat      `features` (2048, N) ResNet-101 features, `labels` (N, 1) 1-based classes
    <root>/att_splits.mat  `att` (A, C) class attributes, L2-normalised per class; `original_att` (A, C) the same
                           before normalisation (AwA2: 0-100 association strengths; aPY: 0-1 shares of annotated
                           images; -1 where a value is missing in some releases); `trainval_loc`, `test_seen_loc`,
                           `test_unseen_loc` (1-based image indices); `allclasses_names` (C,) class names
    [<root>/predicates.txt]  AwA2's "<id> <name>" attribute list, which names the concept groups (colour, pattern ...)
    [<root>/predicate-matrix-binary.txt, <root>/classes.txt]  AwA2's own binary class x attribute matrix (50 x 85 of
                           0/1, rows in classes.txt order: "<id> <name>")

Concepts are the binarised class attributes of each image's class. Quirks and what the reader does with them:

- `att` is L2-normalised and non-negative on AwA2, so `att > 0` (the reference code's rule) marks 99.8% of the entries
  present and concept accuracy is trivially ~0.999. It is never binarised here.
- `concepts: auto` uses the release's binary matrix where there is one (AwA2's predicate-matrix-binary.txt beside the
  .mat files; rows matched to att's classes by `allclasses_names` when classes.txt is there, else taken in order),
  else `original_att`; `binary` / `original_att` force one source.
- `original_att` is binarised at `att_threshold` (default: half its scale, 50 on a 0-100 scale such as AwA2's, 0.5 on
  a 0-1 scale such as aPY's): present when the value is >= the threshold.
- Missing entries (-1 in `original_att`, any negative value) become 0, absent; their count is in `data["missing"]`.

As in the reference experiments, the images of `trainval_loc`, `test_seen_loc` and `test_unseen_loc` are pooled and split
at random (seeded) into train / val / test (val 20% of all, test 40% of the rest): a supervised concept task, not
zero-shot learning.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError

AWA2_GROUPS = {
    "color": "black white blue brown gray orange red yellow",
    "pattern": "patches spots stripes",
    "hair": "furry hairless",
    "skin": "toughskin",
    "size": "big small",
    "fat": "bulbous lean",
    "hand": "flippers hands hooves pads paws",
    "leg": "longleg",
    "neck": "longneck",
    "tail": "tail",
    "horns": "horns",
    "claws": "claws",
    "tusk": "tusks",
    "walk": "bipedal quadrapedal",
    "live": "arctic coastal desert bush plains forest fields jungle mountains ocean ground water tree cave",
}


def _load_mat(path: Path) -> dict:
    from scipy import io

    if not path.exists():
        raise DatasetNotFoundError(path, "xlsa17 file not found", "point `root` at xlsa17/data/<AWA2|APY>/")
    try:
        return io.loadmat(str(path))
    except Exception as e:  # scipy raises several types for a damaged .mat
        raise DatasetFormatError(path, f"not a readable MATLAB file ({e.__class__.__name__})", "re-download xlsa17") from e


def _need(mat: dict, key: str, path: Path) -> np.ndarray:
    if key not in mat:
        raise DatasetFormatError(path, f"missing variable {key!r}", "use the xlsa17 res101.mat / att_splits.mat files")
    return np.asarray(mat[key])


CONCEPT_SOURCES = ("auto", "binary", "original_att")


def _mat_strings(value) -> list[str]:
    """A MATLAB cell array of strings as loaded by scipy (object array of 1-element string arrays) -> list of str."""
    out = []
    for v in np.asarray(value, dtype=object).reshape(-1):
        v = np.asarray(v).reshape(-1)
        out.append(str(v[0]).strip() if v.size else "")
    return out


def _binary_matrix(root: Path, am: dict, att: Path, n_classes: int, n_attr: int) -> np.ndarray:
    """AwA2's predicate-matrix-binary.txt as (C, A) in att's class order."""
    path = root / "predicate-matrix-binary.txt"
    try:
        mat = np.loadtxt(path, ndmin=2)
    except ValueError as e:
        raise DatasetFormatError(path, f"not a whitespace table of numbers ({e})",
                                 "use AwA2's predicate-matrix-binary.txt") from e
    if mat.shape != (n_classes, n_attr):
        raise DatasetFormatError(path, f"shape {mat.shape}, but att_splits.mat has {n_classes} classes x {n_attr} attributes",
                                 "use the binary matrix of the same dataset as att_splits.mat")
    if not np.isin(mat, (0, 1)).all():
        raise DatasetFormatError(path, "values other than 0 and 1", "use AwA2's predicate-matrix-binary.txt unchanged")
    classes = root / "classes.txt"
    if classes.exists() and "allclasses_names" in am:
        listed = [line.split()[1].strip() for line in classes.read_text().splitlines() if line.strip()]
        ours = _mat_strings(am["allclasses_names"])
        missing = sorted(set(ours) - set(listed))
        if len(listed) != n_classes or missing:
            raise DatasetFormatError(classes, f"classes {missing[:3]} of att_splits.mat's allclasses_names are not listed"
                                     if missing else f"{len(listed)} classes, att_splits.mat has {n_classes}",
                                     "use AwA2's classes.txt with AwA2's att_splits.mat")
        mat = mat[[listed.index(c) for c in ours]]
    return mat.astype(np.float32)


def read_xlsa17(root: str | Path, split_seed: int = 0, concepts: str = "auto", att_threshold: float | None = None) -> dict:
    """{"splits": {split: (features (n, 2048) float32, concepts (n, K) float32, labels (n,) int64)}, "names", "groups",
    "num_classes", "source" (where the binary concepts came from), "threshold", "missing" (entries missing -> 0)}.

    Args:
        root: xlsa17/data/<AWA2|APY> (res101.mat, att_splits.mat; AwA2's predicates.txt, binary matrix optional).
        split_seed: Seed of the random train/val/test split.
        concepts: `auto` (the release's binary matrix when present, else `original_att`), `binary` or `original_att`.
        att_threshold: `original_att` values >= this are present; None: half the scale (50 on 0-100, 0.5 on 0-1).
    """
    if concepts not in CONCEPT_SOURCES:
        raise ValueError(f"concepts must be one of {CONCEPT_SOURCES}, got {concepts!r}")
    root = Path(root)
    res, att = root / "res101.mat", root / "att_splits.mat"
    rm, am = _load_mat(res), _load_mat(att)
    feats = _need(rm, "features", res).astype(np.float32).T
    labels = _need(rm, "labels", res).reshape(-1).astype(np.int64) - 1
    n_attr, n_cls = _need(am, "att", att).shape  # att is (A, C), L2-normalised: used for its shape only
    binary_file = root / "predicate-matrix-binary.txt"
    source = "binary" if concepts == "binary" or (concepts == "auto" and binary_file.exists()) else "original_att"
    threshold, missing = None, 0
    if source == "binary":
        if not binary_file.exists():
            raise DatasetNotFoundError(binary_file, "no binary attribute matrix beside att_splits.mat",
                                       "copy AwA2's predicate-matrix-binary.txt (and classes.txt) here, "
                                       "or set concepts: original_att")
        attrs = _binary_matrix(root, am, att, n_cls, n_attr)
    else:
        if "original_att" not in am:
            raise DatasetFormatError(att, "no original_att (the unnormalised class attributes) to binarise; att is "
                                     "L2-normalised and att > 0 would mark nearly every concept present",
                                     "use xlsa17's att_splits.mat, or put the release's binary matrix beside it")
        orig = np.asarray(am["original_att"], dtype=np.float64)
        if orig.shape != (n_attr, n_cls) or not np.isfinite(orig).all():
            raise DatasetFormatError(att, f"original_att has shape {orig.shape} (att: {(n_attr, n_cls)}) or NaNs",
                                     "re-download xlsa17")
        absent = orig < 0  # -1 marks a missing value
        missing = int(absent.sum())
        threshold = float(att_threshold) if att_threshold is not None else (50.0 if orig.max() > 1 else 0.5)
        attrs = ((orig >= threshold) & ~absent).astype(np.float32).T  # (C, A)
    if len(feats) != len(labels) or len(labels) == 0:
        raise DatasetFormatError(res, f"{len(feats)} feature columns but {len(labels)} labels", "use an unmodified res101.mat")
    if not np.isfinite(feats).all():
        raise DatasetFormatError(res, "features contain NaN or inf", "re-download xlsa17")
    if labels.min() < 0 or labels.max() >= n_cls:
        raise DatasetFormatError(res, f"labels span 1..{labels.max() + 1} but att has {n_cls} classes",
                                 "use res101.mat and att_splits.mat of the same dataset")
    idx = []
    for key in ("trainval_loc", "test_seen_loc", "test_unseen_loc"):
        loc = _need(am, key, att).reshape(-1).astype(np.int64) - 1
        if len(loc) and (loc.min() < 0 or loc.max() >= len(labels)):
            raise DatasetFormatError(att, f"{key} indexes image {loc.max() + 1} of {len(labels)}", "use matching files")
        idx.append(loc)
    idx = np.concatenate(idx)
    concept_table = attrs
    names = [f"a{k}" for k in range(concept_table.shape[1])]
    groups = {n: [k] for k, n in enumerate(names)}
    pred = root / "predicates.txt"
    if pred.exists():
        names = [line.split()[1].lower() for line in pred.read_text().splitlines() if line.strip()]
        if len(names) != concept_table.shape[1]:
            raise DatasetFormatError(pred, f"{len(names)} predicates but att has {concept_table.shape[1]} attributes",
                                     "use AwA2's predicates.txt with AwA2's att_splits.mat")
        keep = [k for k, n in enumerate(names) if any(n in g.split() for g in AWA2_GROUPS.values())]
        concept_table, names = concept_table[:, keep], [names[k] for k in keep]
        groups = {g: [k for k, n in enumerate(names) if n in members.split()] for g, members in AWA2_GROUPS.items()}
    rng = np.random.default_rng(split_seed)
    order = rng.permutation(idx)
    n_val = int(round(0.2 * len(order)))
    rest = order[n_val:]
    n_test = int(round(0.4 * len(rest)))
    parts = {"train": rest[n_test:], "val": order[:n_val], "test": rest[:n_test]}
    splits = {s: (feats[i], concept_table[labels[i]], labels[i]) for s, i in parts.items()}
    return {"splits": splits, "names": names, "groups": groups, "num_classes": n_cls, "source": source,
            "threshold": threshold, "missing": missing}
