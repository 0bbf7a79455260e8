"""Reader of AwA2 / aPY in the xlsa17 format (Xian et al.'s "proposed splits"), as the paper uses them.

    <root>/res101.mat      `features` (2048, N) ResNet-101 features, `labels` (N, 1) 1-based classes
    <root>/att_splits.mat  `att` (A, C) class attributes (continuous; present where > 0), `trainval_loc`,
                           `test_seen_loc`, `test_unseen_loc` (1-based image indices), optional `allclasses_names`
    [<root>/predicates.txt]  AwA2's "<id> <name>" attribute list, which names the concept groups (colour, pattern ...)

Concepts are the binarised class attributes of each image's class. As in the reference experiments, the images of
`trainval_loc`, `test_seen_loc` and `test_unseen_loc` are pooled and split at random (seeded) into train / val / test
(val 20% of all, test 40% of the rest): a supervised concept task, not zero-shot learning.
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


def read_xlsa17(root: str | Path, split_seed: int = 0) -> dict:
    """{"splits": {split: (features (n, 2048) float32, concepts (n, K) float32, labels (n,) int64)}, "names", "groups",
    "num_classes"}."""
    root = Path(root)
    res, att = root / "res101.mat", root / "att_splits.mat"
    rm, am = _load_mat(res), _load_mat(att)
    feats = _need(rm, "features", res).astype(np.float32).T
    labels = _need(rm, "labels", res).reshape(-1).astype(np.int64) - 1
    attrs = _need(am, "att", att).astype(np.float32).T  # (C, A)
    if len(feats) != len(labels) or len(labels) == 0:
        raise DatasetFormatError(res, f"{len(feats)} feature columns but {len(labels)} labels", "use an unmodified res101.mat")
    if not np.isfinite(feats).all():
        raise DatasetFormatError(res, "features contain NaN or inf", "re-download xlsa17")
    if labels.min() < 0 or labels.max() >= len(attrs):
        raise DatasetFormatError(res, f"labels span 1..{labels.max() + 1} but att has {len(attrs)} classes",
                                 "use res101.mat and att_splits.mat of the same dataset")
    idx = []
    for key in ("trainval_loc", "test_seen_loc", "test_unseen_loc"):
        loc = _need(am, key, att).reshape(-1).astype(np.int64) - 1
        if len(loc) and (loc.min() < 0 or loc.max() >= len(labels)):
            raise DatasetFormatError(att, f"{key} indexes image {loc.max() + 1} of {len(labels)}", "use matching files")
        idx.append(loc)
    idx = np.concatenate(idx)
    concepts = (attrs > 0).astype(np.float32)
    names = [f"a{k}" for k in range(concepts.shape[1])]
    groups = {n: [k] for k, n in enumerate(names)}
    pred = root / "predicates.txt"
    if pred.exists():
        names = [line.split()[1].lower() for line in pred.read_text().splitlines() if line.strip()]
        if len(names) != concepts.shape[1]:
            raise DatasetFormatError(pred, f"{len(names)} predicates but att has {concepts.shape[1]} attributes",
                                     "use AwA2's predicates.txt with AwA2's att_splits.mat")
        keep = [k for k, n in enumerate(names) if any(n in g.split() for g in AWA2_GROUPS.values())]
        concepts, names = concepts[:, keep], [names[k] for k in keep]
        groups = {g: [k for k, n in enumerate(names) if n in members.split()] for g, members in AWA2_GROUPS.items()}
    rng = np.random.default_rng(split_seed)
    order = rng.permutation(idx)
    n_val = int(round(0.2 * len(order)))
    rest = order[n_val:]
    n_test = int(round(0.4 * len(rest)))
    parts = {"train": rest[n_test:], "val": order[:n_val], "test": rest[:n_test]}
    splits = {s: (feats[i], concepts[labels[i]], labels[i]) for s, i in parts.items()}
    return {"splits": splits, "names": names, "groups": groups, "num_classes": len(attrs)}
