"""CUB / xlsa17 readers on small files in the real formats (including malformed ones), and the generated default."""
from __future__ import annotations

import pickle
import re
import shutil

import numpy as np
import pytest

from lit_iclr.cibm.cub import KOH_CONCEPT_INDICES, load_split_pkl, read_cub
from lit_iclr.cibm.generate import GROUPS, concept_names, generate_cub, one_hot
from lit_iclr.cibm.xlsa17 import read_xlsa17
from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError


@pytest.fixture(scope="module")
def cub(tmp_path_factory):
    out = tmp_path_factory.mktemp("cub") / "data"
    generate_cub(out, num_images=160, num_classes=4, p_deviate=0.0, p_annot_flip=0.0, seed=1)
    return out


def test_generated_default_is_cub_format_and_both_readers_agree(cub):
    data = read_cub(cub)  # Koh et al.'s pkl splits
    first = (cub / "CUB_200_2011" / "images.txt").read_text().splitlines()[0]
    assert re.fullmatch(r"1 (\d{3})\.Class_(\d{2})/Class_\2_00001\.jpg", first)  # CUB's "<id> <class folder>/<file>"
    assert data.concept_names == concept_names() and data.num_classes == 4
    assert list(data.groups) == list(GROUPS) and data.groups["has_pattern"] == [10, 11, 12]
    sizes = {s: len(sp.labels) for s, sp in data.splits.items()}
    assert sum(sizes.values()) == 160 and sizes["val"] > 0
    for sp in data.splits.values():  # one value per group: a one-hot block per group
        for idx in data.groups.values():
            assert (sp.concepts[:, idx].sum(1) == 1).all()
    # raw files + Koh's processing (majority vote per class) give the same class-level concepts, without annotation noise
    raw = read_cub(cub, splits="raw", min_class_count=1)
    kept = [data.concept_names.index(n) for n in raw.concept_names]  # values no class has are filtered out (Koh et al.)
    class_level = data.splits["train"].concepts
    assert sorted(kept) == kept and set(range(15)) - set(kept) == {k for k in range(15) if class_level[:, k].max() == 0}
    test_pkl = dict(zip([p.name for p in data.splits["test"].paths], data.splits["test"].concepts, strict=True))
    for p, c in zip(raw.splits["test"].paths, raw.splits["test"].concepts, strict=True):
        np.testing.assert_array_equal(c, test_pkl[p.name][kept])


def test_class_concepts_determine_the_class_and_labels_are_the_rendered_ones(cub):
    data = read_cub(cub)
    sp = data.splits["train"]
    proto = {}
    for c, y in zip(sp.concepts, sp.labels, strict=True):
        proto.setdefault(int(y), c)
        np.testing.assert_array_equal(proto[int(y)], c)  # class-level, as Koh et al.'s labels
    lines = (cub / "CUB_200_2011" / "attributes" / "image_attribute_labels.txt").read_text().splitlines()
    assert len(lines) == 160 * len(concept_names()) and len(lines[0].split()) == 5
    assert one_hot(np.array([[1, 0, 1, 0, 2, 1]])).tolist() == [[0, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1]]


def _copy(cub, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(cub, dst)
    return dst


def test_bad_cub_inputs_raise_clear_errors(cub, tmp_path):
    with pytest.raises(DatasetNotFoundError, match="CUB_200_2011"):
        read_cub(tmp_path)
    bad = _copy(cub, tmp_path)
    lab = bad / "CUB_200_2011" / "attributes" / "image_attribute_labels.txt"
    lab.write_text(lab.read_text() + "1 99 1 4 1.0\n")
    with pytest.raises(DatasetFormatError, match="attribute id 99 out of range"):
        read_cub(bad, splits="raw", min_class_count=1)
    first = bad / "CUB_200_2011" / "images" / (bad / "CUB_200_2011" / "images.txt").read_text().split()[1]
    first.write_bytes(b"not a jpeg")
    from lit_iclr.cibm.data import CUBConcepts

    dm = CUBConcepts(root=str(bad), data_dir=str(tmp_path / "d"), embed_backbone=None, num_classes=4)
    with pytest.raises(DatasetFormatError, match="image does not open"):
        dm._load_images([first])
    (bad / "class_attr_data_10" / "train.pkl").unlink()
    (bad / "CUB_200_2011" / "image_class_labels.txt").unlink()
    with pytest.raises(DatasetNotFoundError, match="image_class_labels"):
        read_cub(bad)  # no pkl any more: the raw reader needs the class file


def test_split_pickles_load_without_running_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    p = tmp_path / "train.pkl"
    p.write_bytes(pickle.dumps([{"img_path": "a", "class_label": 0, "attribute_label": [0, 1], "x": Evil()}]))
    with pytest.raises(DatasetFormatError, match="refusing to load the global builtins.print"):
        load_split_pkl(p)
    p.write_bytes(pickle.dumps([{"img_path": "a", "class_label": np.int64(3), "attribute_label": np.array([0, 1])}]))
    assert int(load_split_pkl(p)[0]["class_label"]) == 3  # numpy scalars and arrays are data, allowed
    assert len(KOH_CONCEPT_INDICES) == 112 and KOH_CONCEPT_INDICES[-1] == 311


def test_xlsa17_reader(tmp_path):
    from scipy import io

    rng = np.random.default_rng(0)
    n, classes, attrs = 50, 5, 6
    labels = rng.integers(1, classes + 1, n)
    io.savemat(tmp_path / "res101.mat", {"features": rng.random((2048, n)), "labels": labels[:, None]})
    original = rng.uniform(0, 100, size=(attrs, classes))
    att = original / np.linalg.norm(original, axis=0)
    io.savemat(tmp_path / "att_splits.mat", {"att": att, "original_att": original, "trainval_loc": np.arange(1, 31)[:, None],
                                             "test_seen_loc": np.arange(31, 41)[:, None],
                                             "test_unseen_loc": np.arange(41, 51)[:, None]})
    d = read_xlsa17(tmp_path)
    x, c, y = d["splits"]["train"]
    assert x.shape[1] == 2048 and sum(len(s[2]) for s in d["splits"].values()) == n
    np.testing.assert_array_equal(c, (original.T >= 50)[y].astype(np.float32))  # class-level, original_att >= 50
    io.savemat(tmp_path / "att_splits.mat", {"att": att, "original_att": original, "trainval_loc": np.array([[99]]),
                                             "test_seen_loc": np.array([[1]]), "test_unseen_loc": np.array([[2]])})
    with pytest.raises(DatasetFormatError, match="trainval_loc indexes image 99"):
        read_xlsa17(tmp_path)
    with pytest.raises(DatasetNotFoundError):
        read_xlsa17(tmp_path / "nope")
