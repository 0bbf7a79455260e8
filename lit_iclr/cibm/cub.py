"""Reader of CUB-200-2011 as the concept-bottleneck line uses it (Koh et al. 2020), with errors that name the file.

Layout (`root` is the folder holding `CUB_200_2011/`, or that folder itself):

    attributes.txt                                   "<attr id> <group>::<value>", 1-based (the official tarball puts it
                                                     next to CUB_200_2011/; CUB_200_2011/attributes.txt is accepted too)
    CUB_200_2011/images.txt                          "<image id> <relative path under images/>"
    CUB_200_2011/image_class_labels.txt              "<image id> <class id>", classes 1-based
    CUB_200_2011/train_test_split.txt                "<image id> <is_training_image>"
    CUB_200_2011/attributes/image_attribute_labels.txt  "<image id> <attr id> <is_present> <certainty id> <time>"
    CUB_200_2011/images/<class folder>/<file>        the images (JPEG in CUB)
    [class_attr_data_10/ or CUB_200_2011/]{train,val,test}.pkl
                                                     Koh et al.'s splits: lists of dicts with `img_path` (its tail after
                                                     "CUB_200_2011/" is used), `class_label` (0-based) and
                                                     `attribute_label` (the filtered, class-level majority-voted concepts)

Quirks of the published files and what the reader does with them:

- Koh et al.'s 112 concepts (`KOH_CONCEPT_INDICES`) are 0-based positions in the 312-long per-image attribute list,
  i.e. line k + 1 of attributes.txt (their `generate_new_data.py` enumerates `attribute_label` from 0). Reading them as
  1-based ids would shift every name by one, move 9 concepts to the wrong group and lose one of the 28 groups.
- `attribute_label` vectors of the full length of attributes.txt (312) are taken as all attributes, in file order.
- Raw files: Koh et al.'s majority vote. Per class, over the images of the training split (after the validation draw),
  a 0 annotated with certainty 1 ("not visible") is not counted; the class has the attribute when its 1s are at least
  its counted 0s (a tie, including no counted image at all, gives 1). Attributes with the value 1 in at least
  `min_class_count` classes are kept (10 on CUB: 112 attributes), and every image gets its class-level labels.
  20% of the training images (seeded) become the validation split.
- Class ids of image_class_labels.txt are 1-based; with CUB_200_2011/classes.txt present they must lie in 1..(its
  count), else in 1..N with every class used; pkl `class_label`s are 0-based and checked the same way.
- attributes.txt ships next to CUB_200_2011/ in the official tarball; CUB_200_2011/attributes.txt and
  CUB_200_2011/attributes/attributes.txt are accepted too. image_attribute_labels.txt has a few 6-field lines (extra
  time column); only the first 4 fields are read.

Concept groups are the attribute-name prefixes before "::" (28 on Koh et al.'s 112).

The pkl files are read with an unpickler that resolves no global except numpy's scalar/array reconstructors: plain
lists, dicts, numbers and strings load, anything that could run code is refused.
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError

# The 112 attributes Koh et al. keep (min_class_count 10), as 0-based positions in the 312 CUB attributes: index i is
# attribute id i + 1 of attributes.txt (ConceptBottleneck, CUB/generate_new_data.py, get_class_attributes_data).
KOH_CONCEPT_INDICES = (
    1, 4, 6, 7, 10, 14, 15, 20, 21, 23, 25, 29, 30, 35, 36, 38, 40, 44, 45, 50, 51, 53, 54, 56, 57, 59, 63, 64, 69, 70, 72,
    75, 80, 84, 90, 91, 93, 99, 101, 106, 110, 111, 116, 117, 119, 125, 126, 131, 132, 134, 145, 149, 151, 152, 153, 157,
    158, 163, 164, 168, 172, 178, 179, 181, 183, 187, 188, 193, 194, 196, 198, 202, 203, 208, 209, 211, 212, 213, 218, 220,
    221, 225, 235, 236, 238, 239, 240, 242, 243, 244, 249, 253, 254, 259, 260, 262, 268, 274, 277, 283, 289, 292, 293, 294,
    298, 299, 304, 305, 308, 309, 310, 311,
)
SPLITS = ("train", "val", "test")
_NUMPY_GLOBALS = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"), ("numpy", "dtype"),
                  ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                  ("numpy", "ndarray")}


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _NUMPY_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load the global {module}.{name}")


def load_split_pkl(path: Path) -> list[dict]:
    """One of Koh et al.'s split files: a list of dicts, loaded without running any code."""
    try:
        data = _DataOnlyUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise DatasetFormatError(path, f"not a plain-data pickle of split records ({e})",
                                 "use the train/val/test.pkl files of Koh et al.'s CUB_processed/class_attr_data_10") from e
    if not isinstance(data, list) or not data or not all(isinstance(d, dict) for d in data):
        raise DatasetFormatError(path, "expected a non-empty list of dicts", "use Koh et al.'s split files")
    for key in ("img_path", "class_label", "attribute_label"):
        if key not in data[0]:
            raise DatasetFormatError(path, f"records lack the key {key!r}", "use Koh et al.'s split files")
    return data


@dataclass
class CUBSplit:
    """One split: image files, class labels (0-based), concept labels (N, K) in {0, 1}."""

    paths: list[Path]
    labels: np.ndarray
    concepts: np.ndarray


@dataclass
class CUBData:
    splits: dict[str, CUBSplit]
    concept_names: list[str]
    groups: dict[str, list[int]] = field(default_factory=dict)  # group name -> concept indices
    num_classes: int = 0


def _read_table(path: Path, ncols: int) -> np.ndarray:
    """Whitespace table of integers with at least `ncols` columns (CUB's attribute file has a few 6-column lines)."""
    if not path.exists():
        raise DatasetNotFoundError(path, "CUB file not found", "point `root` at the folder holding CUB_200_2011/")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < ncols:
            raise DatasetFormatError(path, f"line {n} has {len(parts)} fields, expected {ncols}", "re-extract CUB_200_2011.tgz")
        try:
            rows.append([int(p) for p in parts[:ncols]])
        except ValueError as e:
            raise DatasetFormatError(path, f"line {n} is not numeric ({line.strip()!r})", "re-extract CUB_200_2011.tgz") from e
    if not rows:
        raise DatasetFormatError(path, "empty file", "re-extract CUB_200_2011.tgz")
    return np.asarray(rows, dtype=np.int64)


def _read_id_strings(path: Path) -> dict[int, str]:
    if not path.exists():
        raise DatasetNotFoundError(path, "CUB file not found", "point `root` at the folder holding CUB_200_2011/")
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        key, _, value = line.strip().partition(" ")
        if not key.isdigit() or not value:
            raise DatasetFormatError(path, f"line {n} is not '<id> <name>' ({line.strip()!r})", "re-extract CUB_200_2011.tgz")
        out[int(key)] = value.strip()
    return out


def cub_folder(root: Path) -> Path:
    root = Path(root)
    cub = root if (root / "images.txt").exists() else root / "CUB_200_2011"
    if not (cub / "images.txt").exists():
        raise DatasetNotFoundError(cub / "images.txt", "no CUB_200_2011 folder here",
                                   "point `root` at the folder holding CUB_200_2011/ (or at CUB_200_2011/ itself)")
    return cub


def _attributes_file(cub: Path) -> Path:
    for p in (cub.parent / "attributes.txt", cub / "attributes.txt", cub / "attributes" / "attributes.txt"):
        if p.exists():
            return p
    raise DatasetNotFoundError(cub.parent / "attributes.txt", "CUB attribute names not found",
                               "put attributes.txt (from the CUB_200_2011 tarball) next to CUB_200_2011/")


def _pkl_dir(cub: Path) -> Path | None:
    for d in (cub.parent / "class_attr_data_10", cub.parent / "CUB_processed" / "class_attr_data_10", cub):
        if all((d / f"{s}.pkl").exists() for s in SPLITS):
            return d
    return None


def _groups(names: list[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for k, name in enumerate(names):
        groups.setdefault(name.split("::")[0], []).append(k)
    return groups


def _check_image(path: Path, source: Path) -> Path:
    if not path.exists():
        raise DatasetNotFoundError(path, f"image listed in {source.name} is missing", "re-extract the CUB images/ folder")
    return path


def read_cub(root: str | Path, splits: str = "auto", min_class_count: int = 10, val_fraction: float = 0.2,
             split_seed: int = 0) -> CUBData:
    """Read CUB-200-2011 with Koh et al.'s concepts and splits.

    Args:
        root: Folder holding CUB_200_2011/ (or the folder itself).
        splits: `pkl` (Koh et al.'s train/val/test.pkl), `raw` (the original files, processed as Koh et al. did) or
            `auto` (pkl when present).
        min_class_count: Raw processing: keep attributes present (by majority vote) in at least this many classes.
        val_fraction: Raw processing: share of the training images held out for validation.
        split_seed: Raw processing: seed of the validation draw.
    """
    cub = cub_folder(Path(root))
    attr_path = _attributes_file(cub)
    attr_names = _read_id_strings(attr_path)
    n_attr = len(attr_names)
    if sorted(attr_names) != list(range(1, n_attr + 1)):
        raise DatasetFormatError(attr_path, "attribute ids are not 1..N", "re-extract attributes.txt")
    pkl = _pkl_dir(cub)
    if splits == "pkl" and pkl is None:
        raise DatasetNotFoundError(cub / "train.pkl", "Koh et al.'s train/val/test.pkl not found",
                                   "put class_attr_data_10/{train,val,test}.pkl next to CUB_200_2011/, or set splits: raw")
    if splits not in ("auto", "pkl", "raw"):
        raise ValueError(f"splits must be auto, pkl or raw, got {splits!r}")
    if pkl is not None and splits != "raw":
        return _read_pkl_splits(cub, pkl, attr_names)
    return _read_raw(cub, attr_names, min_class_count, val_fraction, split_seed)


def _read_pkl_splits(cub: Path, pkl: Path, attr_names: dict[int, str]) -> CUBData:
    records = {s: load_split_pkl(pkl / f"{s}.pkl") for s in SPLITS}
    k = len(records["train"][0]["attribute_label"])
    if k == len(attr_names):
        positions = list(range(k))
    elif k == len(KOH_CONCEPT_INDICES) and len(attr_names) > max(KOH_CONCEPT_INDICES):
        positions = list(KOH_CONCEPT_INDICES)  # 0-based: position i is attribute id i + 1
    else:
        raise DatasetFormatError(pkl / "train.pkl", f"attribute_label has {k} entries; attributes.txt lists {len(attr_names)}",
                                 "use Koh et al.'s 112-concept splits with CUB's 312-attribute attributes.txt")
    names = [attr_names[i + 1] for i in positions]
    n_listed = _class_count(cub)
    out, n_classes = {}, 0
    for s in SPLITS:
        path = pkl / f"{s}.pkl"
        paths, labels, concepts = [], [], []
        for n, rec in enumerate(records[s]):
            c = np.asarray(rec["attribute_label"])
            if c.shape != (k,) or not np.isin(c, (0, 1)).all():
                raise DatasetFormatError(path, f"record {n}: attribute_label must be {k} values in {{0, 1}}",
                                         "use Koh et al.'s split files unchanged")
            tail = str(rec["img_path"]).replace("\\", "/").split("CUB_200_2011/")[-1]
            tail = tail[len("images/"):] if tail.startswith("images/") else tail
            paths.append(_check_image(cub / "images" / tail, path))
            labels.append(int(rec["class_label"]))
            concepts.append(c)
        labels_arr = np.asarray(labels, np.int64)
        hi = n_listed if n_listed is not None else None
        bad = (labels_arr < 0) | (labels_arr >= hi if hi is not None else False)
        if bad.any():
            n = int(np.flatnonzero(bad)[0])
            span = f"0..{hi - 1} (the {hi} classes of classes.txt)" if hi is not None else "0 or more"
            raise DatasetFormatError(path, f"record {n} has class_label {int(labels_arr[n])}, outside {span}",
                                     "class_label is the 0-based class index; use Koh et al.'s split files unchanged")
        n_classes = max(n_classes, int(labels_arr.max()) + 1)
        out[s] = CUBSplit(paths, labels_arr, np.stack(concepts).astype(np.float32))
    return CUBData(out, names, _groups(names), n_listed or n_classes)


def _class_count(cub: Path) -> int | None:
    """Number of classes listed in CUB_200_2011/classes.txt ("<class id> <folder>", 1-based), None without the file."""
    path = cub / "classes.txt"
    if not path.exists():
        return None
    ids = _read_id_strings(path)
    if sorted(ids) != list(range(1, len(ids) + 1)):
        raise DatasetFormatError(path, "class ids are not 1..N", "re-extract classes.txt from CUB_200_2011.tgz")
    return len(ids)


def _class_labels(cub: Path, cls: np.ndarray) -> np.ndarray:
    """0-based class of each row of image_class_labels.txt; ids outside the listed classes are refused by name."""
    path = cub / "image_class_labels.txt"
    n_listed = _class_count(cub)
    ids = cls[:, 1]
    if n_listed is not None:
        bad, span = (ids < 1) | (ids > n_listed), f"1..{n_listed} (the classes of classes.txt)"
    else:
        used = np.unique(ids)
        n = int(used.max()) if len(used) else 0
        bad, span = ids < 1, "1..N"
        if not bad.any() and len(used) != n:
            missing = sorted(set(range(1, n + 1)) - set(used.tolist()))
            raise DatasetFormatError(path, f"class ids run up to {n} but no image has class id {missing[0]} "
                                     f"({len(missing)} of 1..{n} unused)",
                                     "class ids are CUB's 1-based ids; put CUB_200_2011/classes.txt beside it "
                                     "or renumber the classes 1..N")
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DatasetFormatError(path, f"image {int(cls[row, 0])} has class id {int(ids[row])}, outside {span}",
                                 "class ids are 1-based ids of classes.txt; re-extract image_class_labels.txt and "
                                 "classes.txt from the same CUB release")
    return ids - 1


def _read_raw(cub: Path, attr_names: dict[int, str], min_class_count: int, val_fraction: float, seed: int) -> CUBData:
    images = _read_id_strings(cub / "images.txt")
    cls = _read_table(cub / "image_class_labels.txt", 2)
    split = _read_table(cub / "train_test_split.txt", 2)
    lab_path = cub / "attributes" / "image_attribute_labels.txt"
    lab = _read_table(lab_path, 4)
    ids = np.array(sorted(images))
    n, n_attr = len(ids), len(attr_names)
    pos = {int(i): k for k, i in enumerate(ids)}
    for path, table in ((cub / "image_class_labels.txt", cls), (cub / "train_test_split.txt", split)):
        if set(table[:, 0].tolist()) != set(pos):
            raise DatasetFormatError(path, "image ids differ from images.txt", "re-extract CUB_200_2011.tgz")
    bad = (lab[:, 1] < 1) | (lab[:, 1] > n_attr)
    if bad.any():
        raise DatasetFormatError(lab_path, f"attribute id {int(lab[bad][0, 1])} out of range 1..{n_attr}",
                                 "use the attributes.txt of the same CUB release")
    unknown = ~np.isin(lab[:, 0], ids)
    if unknown.any():
        raise DatasetFormatError(lab_path, f"image id {int(lab[unknown][0, 0])} is not in images.txt", "re-extract CUB")
    per_image = np.zeros((n, n_attr), np.float32)
    rows = np.array([pos[int(i)] for i in lab[:, 0]])
    per_image[rows, lab[:, 1] - 1] = (lab[:, 2] > 0).astype(np.float32)
    labels = np.zeros(n, np.int64)
    labels[[pos[int(i)] for i in cls[:, 0]]] = _class_labels(cub, cls)
    is_train = np.zeros(n, bool)
    is_train[[pos[int(i)] for i in split[:, 0]]] = split[:, 1] > 0
    n_classes = _class_count(cub) or int(labels.max()) + 1
    # validation draw first: Koh et al. vote over their train.pkl, the official training images minus validation
    rng = np.random.default_rng(seed)
    train_idx = np.flatnonzero(is_train)
    val_mask = np.zeros(n, bool)
    val_mask[rng.choice(train_idx, size=int(round(val_fraction * len(train_idx))), replace=False)] = True
    members = {"train": is_train & ~val_mask, "val": val_mask, "test": ~is_train}
    # Koh et al.'s majority vote (get_class_attributes_data): per class and attribute count the 1s and the 0s, except
    # 0s of certainty 1 ("not visible"); the class label is 1 when ones >= zeros (ties, even 0 = 0, give 1); keep the
    # attributes that are 1 in at least min_class_count classes
    counted = np.zeros((n, n_attr), bool)
    counted[rows, lab[:, 1] - 1] = (lab[:, 2] > 0) | (lab[:, 3] != 1)
    vote = members["train"]
    ones, zeros = np.zeros((n_classes, n_attr)), np.zeros((n_classes, n_attr))
    np.add.at(ones, labels[vote], per_image[vote] * counted[vote])
    np.add.at(zeros, labels[vote], (1 - per_image[vote]) * counted[vote])
    class_attr = (ones >= zeros).astype(np.float32)
    keep = np.flatnonzero(class_attr.sum(0) >= min_class_count)
    if len(keep) == 0:
        raise DatasetFormatError(lab_path, f"no attribute is present in {min_class_count} classes",
                                 "lower min_class_count (the data has few classes)")
    concepts = class_attr[labels][:, keep]
    names = [attr_names[int(i) + 1] for i in keep]
    out = {}
    for s, m in members.items():
        idx = np.flatnonzero(m)
        paths = [_check_image(cub / "images" / images[int(ids[i])], cub / "images.txt") for i in idx]
        out[s] = CUBSplit(paths, labels[idx], concepts[idx])
    return CUBData(out, names, _groups(names), n_classes)
