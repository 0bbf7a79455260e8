"""The leakage testbed's generator option, the lazy CUB / xlsa17 readers, and the class-leakage probe on a hand case."""
from __future__ import annotations

import numpy as np
import pytest

from lit_iclr.cibm.cub import read_cub
from lit_iclr.cibm.data import CUBConcepts, XLSA17Concepts
from lit_iclr.cibm.generate import generate_cub
from lit_iclr.cibm.leakage import class_leakage
from lit_iclr.core.errors import DatasetFormatError


def test_classes_per_prototype_share_concepts_and_differ_by_background(tmp_path):
    generate_cub(tmp_path / "d", num_images=160, num_classes=4, classes_per_prototype=2, p_deviate=0.0, p_leak=1.0, seed=1)
    data = read_cub(tmp_path / "d")
    sp = data.splits["train"]
    proto = {int(y): c for c, y in zip(sp.concepts, sp.labels, strict=True)}
    np.testing.assert_array_equal(proto[0], proto[1])
    np.testing.assert_array_equal(proto[2], proto[3])
    assert not np.array_equal(proto[0], proto[2])
    from PIL import Image

    corner = {}
    for p, y in zip(sp.paths, sp.labels, strict=True):  # the background level (corner pixel) tells 0 from 1, 2 from 3
        with Image.open(p) as im:
            corner.setdefault(int(y), []).append(np.asarray(im, dtype=float)[[0, 0, -1, -1], [0, -1, 0, -1]].min())
    assert np.mean(corner[1]) - np.mean(corner[0]) > 8 and np.mean(corner[3]) - np.mean(corner[2]) > 8
    with pytest.raises(ValueError, match="classes_per_prototype"):
        generate_cub(tmp_path / "e", num_images=10, num_classes=4, classes_per_prototype=3)


def test_generator_settings_get_their_own_folder_and_the_default_keeps_its_name(tmp_path):
    default = CUBConcepts(data_dir=str(tmp_path), embed_backbone=None)
    leak = CUBConcepts(data_dir=str(tmp_path), embed_backbone=None, classes_per_prototype=2)
    assert default.path.name == "cibm-cub-scenes-v1" and leak.path.name.startswith("cibm-cub-scenes-v1-")


def test_cub_reader_is_lazy_and_checks_stated_sizes(tmp_path):
    missing = tmp_path / "no_such_cub"
    dm = CUBConcepts(root=str(missing), data_dir=str(tmp_path), embed_backbone=None, num_concepts=112, num_classes=200)
    assert (dm.num_concepts, dm.num_classes, dm.concept_groups) == (112, 200, None)  # nothing read
    generate_cub(tmp_path / "cub", num_images=80, num_classes=4, seed=1)
    wrong = CUBConcepts(root=str(tmp_path / "cub"), data_dir=str(tmp_path), embed_backbone=None, num_concepts=112,
                        num_classes=200)
    with pytest.raises(DatasetFormatError, match="15 concepts / 4 classes, but the config states 112 / 200"):
        wrong.setup("fit")
    read = CUBConcepts(root=str(tmp_path / "cub"), data_dir=str(tmp_path), embed_backbone=None, num_classes=None)
    assert read.num_concepts == 15 and read.num_classes == 4 and len(read.concept_groups) == 6


def test_xlsa17_reader_is_lazy(tmp_path):
    dm = XLSA17Concepts(root=str(tmp_path / "nope"), num_concepts=85, num_classes=50)
    assert (dm.num_concepts, dm.num_classes, dm.input_shape, dm.concept_groups) == (85, 50, [2048], None)
    with pytest.raises(Exception, match="res101.mat|att_splits.mat|nope"):
        _ = XLSA17Concepts(root=str(tmp_path / "nope")).num_concepts


def test_class_leakage_probe_sees_a_class_bit_in_soft_values_only():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 600)
    hard = np.stack([y // 2, 1 - y // 2], 1).astype(float)  # the concepts tell the pair {0, 1} from {2, 3}
    soft = np.clip(hard * 0.9 + 0.05 + 0.04 * (y % 2)[:, None], 0, 1)  # the bit y % 2 rides on the soft values
    out = class_leakage(soft, y)
    assert out["probe_hard"] == pytest.approx(0.5, abs=0.08)  # chance within each pair
    assert out["probe_soft"] > 0.9 and out["leakage"] > 0.35
    assert class_leakage(soft[:10], y[:10]) == {}  # too few points for a held-out probe
