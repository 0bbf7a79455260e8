"""xlsa17's att_splits.mat and AwA2's own files, written here with scipy.io.savemat / plain text in their published
layout: concepts come from the binary matrix or `original_att` at a stated threshold, never from `att > 0`."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import io

from lit_iclr.cibm.xlsa17 import read_xlsa17
from lit_iclr.core.errors import DatasetFormatError

CLASSES = ["antelope", "grizzly+bear", "killer+whale", "beaver", "dalmatian", "persian+cat"]
PREDICATES = ["black", "white", "stripes", "furry", "big", "flippers"]


def write_xlsa17(root, original, n_images=60, names=CLASSES, seed=0):
    """res101.mat + att_splits.mat as xlsa17 ships them: att is original_att with every class column L2-normalised."""
    rng = np.random.default_rng(seed)
    labels = 1 + np.arange(n_images) % len(names)
    io.savemat(root / "res101.mat", {"features": rng.random((2048, n_images)), "labels": labels[:, None]})
    pos = np.clip(original, 0, None)
    att = pos / np.linalg.norm(pos, axis=0, keepdims=True)
    loc = rng.permutation(np.arange(1, n_images + 1))
    io.savemat(root / "att_splits.mat", {
        "att": att, "original_att": original, "allclasses_names": np.array([[n] for n in names], dtype=object),
        "trainval_loc": loc[:30, None], "test_seen_loc": loc[30:40, None], "test_unseen_loc": loc[40:, None]})
    return att, labels - 1


def check_class_level(d, table):
    for x, c, y in d["splits"].values():
        assert len(x) == len(y)
        np.testing.assert_array_equal(c, table[y])


def test_awa2_binary_matrix_is_used_in_att_class_order(tmp_path):
    rng = np.random.default_rng(1)
    original = rng.uniform(0, 100, size=(len(PREDICATES), len(CLASSES)))  # (A, C): AwA2's 0-100 strengths
    att, _ = write_xlsa17(tmp_path, original)
    assert (att > 0).mean() == 1.0  # the L2-normalised matrix: `att > 0` would make every concept present
    (tmp_path / "predicates.txt").write_text("".join(f"{i}\t{p}\n" for i, p in enumerate(PREDICATES, 1)))
    order = [3, 0, 5, 1, 4, 2]  # classes.txt lists the classes in another order than allclasses_names
    (tmp_path / "classes.txt").write_text("".join(f"{i}\t{CLASSES[k]}\n" for i, k in enumerate(order, 1)))
    binary = rng.integers(0, 2, size=(len(CLASSES), len(PREDICATES)))  # rows in classes.txt order
    (tmp_path / "predicate-matrix-binary.txt").write_text("".join(" ".join(map(str, r)) + "\n" for r in binary))
    d = read_xlsa17(tmp_path)
    assert d["source"] == "binary" and d["names"] == PREDICATES  # all six are members of AwA2's concept groups
    table = np.zeros((len(CLASSES), len(PREDICATES)))
    for row, k in enumerate(order):  # row `row` of the file is class CLASSES[k] of att_splits.mat
        table[k] = binary[row]
    check_class_level(d, table)
    assert d["groups"]["color"] == [d["names"].index("black"), d["names"].index("white")]

    # the same files with concepts: original_att -> present where >= 50 (half of AwA2's 0-100 scale)
    d = read_xlsa17(tmp_path, concepts="original_att")
    assert d["source"] == "original_att" and d["threshold"] == 50.0
    check_class_level(d, original.T >= 50)
    (tmp_path / "predicate-matrix-binary.txt").write_text("0 1\n1 0\n")
    with pytest.raises(DatasetFormatError, match="predicate-matrix-binary.txt: shape \\(2, 2\\)"):
        read_xlsa17(tmp_path)


def test_original_att_threshold_and_missing_entries(tmp_path):
    rng = np.random.default_rng(2)
    original = rng.uniform(0, 1, size=(4, len(CLASSES)))  # aPY: 0-1 shares of annotated images
    original[1, 2] = original[3, 0] = -1.0                 # missing values
    original[0, 1] = 0.5                                   # on the threshold: present
    write_xlsa17(tmp_path, original)
    d = read_xlsa17(tmp_path)
    assert d["source"] == "original_att" and d["threshold"] == 0.5 and d["missing"] == 2
    expected = (original.T >= 0.5) & (original.T >= 0)
    assert expected[1, 0] and not expected[2, 1] and not expected[0, 3]
    check_class_level(d, expected)
    d = read_xlsa17(tmp_path, att_threshold=0.25)
    check_class_level(d, (original.T >= 0.25) & (original.T >= 0))
    with pytest.raises(FileNotFoundError, match="predicate-matrix-binary.txt"):
        read_xlsa17(tmp_path, concepts="binary")
    m = io.loadmat(tmp_path / "att_splits.mat")
    io.savemat(tmp_path / "att_splits.mat", {k: v for k, v in m.items() if not k.startswith("__") and k != "original_att"})
    with pytest.raises(DatasetFormatError, match="no original_att"):
        read_xlsa17(tmp_path)
