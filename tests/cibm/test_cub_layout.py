"""CUB-200-2011 in its published layout, written here by hand (not by the project's generator): Koh et al.'s 0-based
concept indices, their majority vote that skips "not visible" zeros, and class ids outside the listed classes."""
from __future__ import annotations

import pickle
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from lit_iclr.cibm.cub import KOH_CONCEPT_INDICES, read_cub
from lit_iclr.core.errors import DatasetFormatError

# CUB-200-2011's attributes.txt, group by group in file order (312 lines, 28 groups; has_eye_color has no iridescent)
COLOURS = "blue brown iridescent purple rufous grey yellow olive green pink orange black white red buff".split()
PATTERN = "solid spotted striped multi-colored".split()
CUB_GROUPS = [
    ("has_bill_shape", "curved_(up_or_down) dagger hooked needle hooked_seabird spatulate all-purpose cone specialized".split()),
    ("has_wing_color", COLOURS), ("has_upperparts_color", COLOURS), ("has_underparts_color", COLOURS),
    ("has_breast_pattern", PATTERN), ("has_back_color", COLOURS),
    ("has_tail_shape", "forked_tail rounded_tail notched_tail fan-shaped_tail pointed_tail squared_tail".split()),
    ("has_upper_tail_color", COLOURS),
    ("has_head_pattern", "spotted malar crested masked unique_pattern eyebrow eyering plain eyeline striped capped".split()),
    ("has_breast_color", COLOURS), ("has_throat_color", COLOURS),
    ("has_eye_color", [c for c in COLOURS if c != "iridescent"]),
    ("has_bill_length", "about_the_same_as_head longer_than_head shorter_than_head".split()),
    ("has_forehead_color", COLOURS), ("has_under_tail_color", COLOURS), ("has_nape_color", COLOURS),
    ("has_belly_color", COLOURS),
    ("has_wing_shape", "rounded-wings pointed-wings broad-wings tapered-wings long-wings".split()),
    ("has_size", "large_(16_-_32_in) small_(5_-_9_in) very_large_(32_-_72_in) medium_(9_-_16_in) very_small_(3_-_5_in)".split()),
    ("has_shape", ("upright-perching_water-like chicken-like-marsh long-legged-like duck-like owl-like gull-like "
                   "hummingbird-like pigeon-like tree-clinging-like hawk-like sandpiper-like upland-ground-like "
                   "swallow-like perching-like").split()),
    ("has_back_pattern", PATTERN), ("has_tail_pattern", PATTERN), ("has_belly_pattern", PATTERN),
    ("has_primary_color", COLOURS), ("has_leg_color", COLOURS), ("has_bill_color", COLOURS),
    ("has_crown_color", COLOURS), ("has_wing_pattern", PATTERN),
]
CUB_NAMES = [f"{g}::{v}" for g, values in CUB_GROUPS for v in values]


def write_cub(root: Path, classes: list[int], is_train: list[int], annotations: dict[tuple[int, int], tuple[int, int]],
              names: list[str], class_names: list[str] | None = None) -> Path:
    """The tarball's layout: attributes.txt beside CUB_200_2011/, 1-based ids everywhere, 5-field annotation lines
    (`annotations[(image id, attr id)] = (is_present, certainty)`; absent pairs are written as 0 with certainty 4)."""
    cub = root / "CUB_200_2011"
    (cub / "attributes").mkdir(parents=True)
    (root / "attributes.txt").write_text("".join(f"{i} {n}\n" for i, n in enumerate(names, 1)))
    folders = class_names or [f"{c:03d}.Bird_{c}" for c in sorted(set(classes))]
    (cub / "classes.txt").write_text("".join(f"{i} {f}\n" for i, f in enumerate(folders, 1)))
    img, lab, split, att = [], [], [], []
    for i, (c, t) in enumerate(zip(classes, is_train, strict=True), 1):
        folder = folders[c - 1] if c <= len(folders) else f"{c:03d}.Unknown"
        rel = f"{folder}/Bird_{c}_{i:04d}_{1000 + i}.jpg"
        (cub / "images" / folder).mkdir(parents=True, exist_ok=True)
        (cub / "images" / rel).write_bytes(b"\xff\xd8\xff\xd9")  # the reader lists images here; it opens none
        img.append(f"{i} {rel}\n")
        lab.append(f"{i} {c}\n")
        split.append(f"{i} {t}\n")
        for a in range(1, len(names) + 1):
            present, certainty = annotations.get((i, a), (0, 4))
            extra = " 0" if (i, a) == (1, 1) else ""  # CUB has a few 6-field lines
            att.append(f"{i} {a} {present} {certainty} {7.5 + a:.3f}{extra}\n")
    (cub / "images.txt").write_text("".join(img))
    (cub / "image_class_labels.txt").write_text("".join(lab))
    (cub / "train_test_split.txt").write_text("".join(split))
    (cub / "attributes" / "image_attribute_labels.txt").write_text("".join(att))
    return cub


def test_koh_pkl_concepts_are_0_based_positions_of_attributes_txt(tmp_path):
    assert len(CUB_NAMES) == 312 and len(CUB_GROUPS) == 28
    cub = write_cub(tmp_path, [1, 2, 2], [1, 1, 0], {}, CUB_NAMES)
    pkl = tmp_path / "CUB_processed" / "class_attr_data_10"
    pkl.mkdir(parents=True)
    rels = [line.split()[1] for line in (cub / "images.txt").read_text().splitlines()]
    for split, idx in (("train", [0]), ("val", [1]), ("test", [2])):
        recs = [{"id": i + 1, "img_path": f"/juice/scr/CUB_200_2011/images/{rels[i]}", "class_label": [0, 1, 1][i],
                 "attribute_label": [int(k % 3 == 0) for k in range(112)], "attribute_certainty": [4] * 312}
                for i in idx]
        (pkl / f"{split}.pkl").write_bytes(pickle.dumps(recs))
    data = read_cub(tmp_path)
    # Koh et al. index their 312-long attribute_label lists from 0: position i is line i + 1 of attributes.txt
    lines = (tmp_path / "attributes.txt").read_text().splitlines()
    assert data.concept_names == [lines[i].split(" ", 1)[1] for i in KOH_CONCEPT_INDICES]
    assert data.concept_names[0] == "has_bill_shape::dagger" and data.concept_names[-1] == "has_wing_pattern::multi-colored"
    assert data.concept_names[KOH_CONCEPT_INDICES.index(54)] == "has_breast_pattern::solid"  # id 54 would be underparts::buff
    assert len(data.groups) == 28 and list(data.groups) == [g for g, _ in CUB_GROUPS]
    assert data.groups["has_breast_pattern"] == [KOH_CONCEPT_INDICES.index(i) for i in (54, 55, 56, 57)
                                                 if i in KOH_CONCEPT_INDICES]
    assert data.num_classes == 2 and data.splits["val"].labels.tolist() == [1]


def koh_vote(per_image: dict[int, list[tuple[int, int]]], labels: dict[int, int], train: set[int], n_attr: int,
             min_class_count: int) -> tuple[list[int], dict[int, list[int]]]:
    """Koh et al.'s get_class_attributes_data, loop for loop: (kept 0-based attributes, class -> labels of those)."""
    counts: dict = defaultdict(lambda: [[0, 0] for _ in range(n_attr)])
    for img in sorted(train):
        for a, (present, certainty) in enumerate(per_image[img]):
            if present == 0 and certainty == 1:  # not visible
                continue
            counts[labels[img]][a][present] += 1
    class_label = {c: [1 if v[1] >= v[0] else 0 for v in counts[c]] for c in set(labels.values())}  # tie -> 1
    keep = [a for a in range(n_attr) if sum(class_label[c][a] for c in class_label) >= min_class_count]
    return keep, {c: [v[a] for a in keep] for c, v in class_label.items()}


def test_raw_majority_vote_skips_not_visible_zeros_like_koh(tmp_path):
    names = ["has_wing_color::blue", "has_wing_color::red", "has_size::small", "has_size::large", "has_eye_color::red"]
    classes = [1, 1, 1, 2, 2, 2, 3, 3, 3, 1, 2, 3]
    train = [1] * 9 + [0] * 3
    ann = {}
    for img in (1, 4, 7):  # wing blue: one visible 1 per class, two not-visible 0s: Koh gives 1 (1 vs 0 counted)
        ann[(img, 1)] = (1, 3)
        ann[(img + 1, 1)] = ann[(img + 2, 1)] = (0, 1)
    for img in (1, 4):  # wing red: 1 vs 2 visible 0s in classes 1, 2 -> 0; class 3 all "not visible" 0s -> tie -> 1
        ann[(img, 2)] = (1, 2)
    for img in (7, 8, 9):
        ann[(img, 2)] = (0, 1)
    for img in range(1, 10):  # size small: present, certain, everywhere; size large: absent, visible
        ann[(img, 3)] = (1, 4)
    ann[(4, 5)], ann[(5, 5)], ann[(6, 5)] = (1, 4), (0, 1), (0, 2)  # eye red, class 2: 1 vs one counted 0 -> tie -> 1
    write_cub(tmp_path, classes, train, ann, names)
    data = read_cub(tmp_path, splits="raw", min_class_count=1, val_fraction=0.0)
    assert data.concept_names == ["has_wing_color::blue", "has_wing_color::red", "has_size::small", "has_eye_color::red"]
    by_class = {int(y): c.tolist() for y, c in zip(data.splits["test"].labels, data.splits["test"].concepts, strict=True)}
    assert by_class == {0: [1, 0, 1, 0], 1: [1, 0, 1, 1], 2: [1, 1, 1, 0]}
    # counting the not-visible zeros (the old reading) gives wing blue 0 in every class, so min_class_count 3 drops it
    assert read_cub(tmp_path, splits="raw", min_class_count=3, val_fraction=0.0).concept_names == [
        "has_wing_color::blue", "has_size::small"]

    # with a validation draw the vote runs on the remaining training images only; checked against Koh's loop
    rng = np.random.default_rng(4)
    n, n_attr = 60, len(names)
    classes = [1 + i % 3 for i in range(n)]
    train = [int(i < 45) for i in range(n)]
    ann = {(i, a): (int(rng.random() < 0.5), int(rng.integers(1, 5))) for i in range(1, n + 1) for a in range(1, n_attr + 1)}
    write_cub(tmp_path / "r", classes, train, ann, names)
    data = read_cub(tmp_path / "r", splits="raw", min_class_count=2, val_fraction=0.2, split_seed=3)
    ids = {line.split()[1]: int(line.split()[0])
           for line in (tmp_path / "r" / "CUB_200_2011" / "images.txt").read_text().splitlines()}
    train_ids = {ids["/".join(p.parts[-2:])] for p in data.splits["train"].paths}
    assert len(train_ids) == 36
    per_image = {i: [ann[(i, a)] for a in range(1, n_attr + 1)] for i in range(1, n + 1)}
    keep, class_label = koh_vote(per_image, {i: classes[i - 1] - 1 for i in range(1, n + 1)}, train_ids, n_attr, 2)
    assert data.concept_names == [names[a] for a in keep]
    for sp in data.splits.values():
        for y, c in zip(sp.labels, sp.concepts, strict=True):
            assert c.tolist() == class_label[int(y)]


def test_class_id_outside_the_listed_classes_is_named(tmp_path):
    write_cub(tmp_path, [1, 2, 4], [1, 1, 0], {}, ["has_size::small", "has_size::large"], ["001.A", "002.B", "003.C"])
    with pytest.raises(DatasetFormatError) as e:
        read_cub(tmp_path, splits="raw", min_class_count=1)
    msg = str(e.value)
    assert "image_class_labels.txt" in msg and "image 3 has class id 4, outside 1..3" in msg and "classes.txt" in msg
    assert "attribute" not in msg.split("fix:")[0]
    (tmp_path / "CUB_200_2011" / "classes.txt").unlink()
    lab = tmp_path / "CUB_200_2011" / "image_class_labels.txt"
    lab.write_text(lab.read_text().replace("3 4\n", "3 0\n"))
    with pytest.raises(DatasetFormatError, match="image 3 has class id 0, outside 1..N"):
        read_cub(tmp_path, splits="raw", min_class_count=1)
    lab.write_text(lab.read_text().replace("3 0\n", "3 5\n"))
    with pytest.raises(DatasetFormatError, match="no image has class id 3"):
        read_cub(tmp_path, splits="raw", min_class_count=1)
