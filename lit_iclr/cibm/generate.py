"""Generator of the default dataset: a small CUB-200-2011 in its real file layout, made of Fashion-MNIST scenes.

Each image (32x32 grey JPEG) shows one real Fashion-MNIST item whose visible attributes are the annotated concepts, in
CUB-style groups (`has_<group>::<value>`, one-hot within a group):

    has_shape        t-shirt | trouser | sneaker | bag      (which Fashion-MNIST class the item is drawn from)
    has_size         small | large                          (item box 14 or 22 px)
    has_horizontal_position, has_vertical_position  left | right, top | bottom
    has_pattern      solid | striped | checkered            (multiplicative texture)
    has_brightness   dark | bright                          (item intensity 0.55 or 1)

Classes are attribute combinations, like CUB species: class k has a prototype value per group (prototypes at least
`min_distance` groups apart). An image of class k renders each group's prototype value with probability 1 - `p_deviate`,
another value otherwise, so - as in CUB, where the class-level attributes Koh et al. train on are not all visible in
every photo - the class-level concept labels are sometimes wrong for the image. Per-image annotations
(`image_attribute_labels.txt`) are the rendered values with annotation noise `p_annot_flip` and CUB's certainty ids.

Leakage channel: the background grey level is one of four levels keyed to the class (class mod 4) with probability
`p_leak`, random otherwise. No concept describes it, yet it carries class information: a model whose soft concepts
encode it predicts the class through the bottleneck beyond what the concepts say, which the leakage metrics measure.
With `classes_per_prototype` r > 1, r consecutive classes share one concept prototype (class k has prototype k // r), so
within a prototype the class is told only by the background level: the concepts cannot carry it, the leakage channel
can (the r classes of a prototype have distinct levels, r <= 4).

Written: attributes.txt, CUB_200_2011/{images.txt, image_class_labels.txt, train_test_split.txt, classes.txt,
attributes/image_attribute_labels.txt, attributes/certainties.txt, images/...}, and Koh et al.'s
class_attr_data_10/{train,val,test}.pkl (class-level concepts, 20% of the training images as validation).
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
from PIL import Image

from lit_iclr.core.idx import FASHION_MNIST_DIR, load_fashion_mnist
from lit_iclr.core.scenes import compose_scene, texture, to_uint8

GROUPS: dict[str, tuple[str, ...]] = {
    "has_shape": ("t-shirt", "trouser", "sneaker", "bag"),
    "has_size": ("small", "large"),
    "has_horizontal_position": ("left", "right"),
    "has_vertical_position": ("top", "bottom"),
    "has_pattern": ("solid", "striped", "checkered"),
    "has_brightness": ("dark", "bright"),
}
SHAPE_FMNIST_CLASS = {"t-shirt": 0, "trouser": 1, "sneaker": 7, "bag": 8}
SIZES = {"small": 14, "large": 22}
BRIGHTNESS = {"dark": 0.55, "bright": 1.0}
PATTERNS = {"solid": "solid", "striped": "stripes", "checkered": "checker"}
BACKGROUND_LEVELS = (0.0, 0.06, 0.12, 0.18)
CANVAS = 32
CERTAINTIES = ("not visible", "guessing", "probably", "definitely")


def concept_names() -> list[str]:
    return [f"{g}::{v}" for g, values in GROUPS.items() for v in values]


def class_prototypes(num_classes: int, min_distance: int, rng: np.random.Generator) -> np.ndarray:
    """(num_classes, n_groups) value indices, pairwise differing in at least `min_distance` groups (rejection draw)."""
    sizes = [len(v) for v in GROUPS.values()]
    protos: list[np.ndarray] = []
    for _ in range(100000):
        cand = np.array([rng.integers(s) for s in sizes])
        if all((cand != p).sum() >= min_distance for p in protos):
            protos.append(cand)
            if len(protos) == num_classes:
                return np.stack(protos)
    raise ValueError(f"cannot draw {num_classes} classes {min_distance} groups apart; lower num_classes or min_distance")


def one_hot(values: np.ndarray) -> np.ndarray:
    """(..., n_groups) value indices -> (..., K) one-hot concept vector in the order of `concept_names()`."""
    parts = [np.eye(len(v), dtype=np.int64)[values[..., g]] for g, v in enumerate(GROUPS.values())]
    return np.concatenate(parts, axis=-1)


def render(values: np.ndarray, item: np.ndarray, background: float, rng: np.random.Generator) -> np.ndarray:
    """One 32x32 scene from group value indices (shape, size, h-pos, v-pos, pattern, brightness); uint8."""
    names = [v[i] for v, i in zip(GROUPS.values(), values, strict=True)]
    _, size, hpos, vpos, pattern, bright = names
    s = SIZES[size]
    half = CANVAS // 2
    # left/top: the box centre lies in the first half of the canvas, right/bottom in the second
    lo, hi = (0, half - s // 2) if hpos == "left" else (half - s // 2 + 1, CANVAS - s)
    left = int(rng.integers(max(lo, 0), max(hi, lo) + 1))
    lo, hi = (0, half - s // 2) if vpos == "top" else (half - s // 2 + 1, CANVAS - s)
    top = int(rng.integers(max(lo, 0), max(hi, lo) + 1))
    tex = texture(PATTERNS[pattern], s, s, period=4, phase=int(rng.integers(4)))
    scene = compose_scene(CANVAS, [item], boxes=[(top, left, s, s)], intensities=[BRIGHTNESS[bright]], textures=[tex],
                          background=background)
    scene = scene + rng.normal(0.0, 0.02, scene.shape)
    return to_uint8(scene)


def generate_cub(out_dir: Path, num_images: int = 3600, num_classes: int = 16, train_fraction: float = 0.6,
                 val_fraction: float = 0.2, p_deviate: float = 0.12, p_annot_flip: float = 0.05, p_leak: float = 0.85,
                 min_distance: int = 2, seed: int = 0, classes_per_prototype: int = 1,
                 fashion_mnist_root: str | Path = FASHION_MNIST_DIR) -> None:
    """Write the dataset described in the module docstring into `out_dir` (the folder that will hold CUB_200_2011/)."""
    r = classes_per_prototype
    if r < 1 or num_classes % r or r > len(BACKGROUND_LEVELS):
        raise ValueError(f"classes_per_prototype must divide num_classes ({num_classes}) and be 1..{len(BACKGROUND_LEVELS)}"
                         f" (one background level per class of a prototype), got {r}")
    rng = np.random.default_rng(seed)
    out_dir = Path(out_dir)
    cub = out_dir / "CUB_200_2011"
    (cub / "attributes").mkdir(parents=True)
    names = concept_names()
    (out_dir / "attributes.txt").write_text("".join(f"{i} {n}\n" for i, n in enumerate(names, 1)))
    (cub / "attributes" / "certainties.txt").write_text("".join(f"{i} {c}\n" for i, c in enumerate(CERTAINTIES, 1)))
    protos = class_prototypes(num_classes // r, min_distance, rng)
    if r > 1:  # class k shows prototype k // r; classes k, k + 1 of one prototype have background levels k % 4 apart
        protos = np.repeat(protos, r, axis=0)
    class_dirs = [f"{k + 1:03d}.Class_{k + 1:02d}" for k in range(num_classes)]
    (cub / "classes.txt").write_text("".join(f"{k + 1} {d}\n" for k, d in enumerate(class_dirs)))
    items = {s: load_fashion_mnist(fashion_mnist_root, s) for s in ("train", "test")}
    by_class = {s: {c: np.flatnonzero(labels == c) for c in SHAPE_FMNIST_CLASS.values()} for s, (_, labels) in items.items()}

    labels = rng.permutation(np.arange(num_images) % num_classes)
    is_train = rng.random(num_images) < train_fraction
    n_values = np.array([len(v) for v in GROUPS.values()])
    deviate = rng.random((num_images, len(GROUPS))) < p_deviate
    other = (protos[labels] + rng.integers(1, n_values, size=(num_images, len(GROUPS)))) % n_values
    rendered = np.where(deviate, other, protos[labels])
    leak = np.where(rng.random(num_images) < p_leak, labels % len(BACKGROUND_LEVELS),
                    rng.integers(len(BACKGROUND_LEVELS), size=num_images))

    image_lines, class_lines, split_lines, attr_lines, paths = [], [], [], [], []
    for i in range(num_images):
        split = "train" if is_train[i] else "test"  # items of test images come from Fashion-MNIST's test split
        images, _ = items[split]
        shape = GROUPS["has_shape"][rendered[i, 0]]
        item = images[rng.choice(by_class[split][SHAPE_FMNIST_CLASS[shape]])]
        img = render(rendered[i], item, BACKGROUND_LEVELS[leak[i]], rng)
        rel = f"{class_dirs[labels[i]]}/Class_{labels[i] + 1:02d}_{i + 1:05d}.jpg"
        (cub / "images" / class_dirs[labels[i]]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(cub / "images" / rel, quality=95)
        paths.append(rel)
        image_lines.append(f"{i + 1} {rel}\n")
        class_lines.append(f"{i + 1} {labels[i] + 1}\n")
        split_lines.append(f"{i + 1} {int(is_train[i])}\n")
    shown = one_hot(rendered)
    flips = rng.random(shown.shape) < p_annot_flip
    annotated = np.where(flips, 1 - shown, shown)
    certainty = np.where(flips, rng.integers(1, 3, size=shown.shape), rng.integers(3, 5, size=shown.shape))
    times = rng.uniform(1.0, 20.0, size=shown.shape)
    for i in range(num_images):
        attr_lines.extend(f"{i + 1} {a + 1} {annotated[i, a]} {certainty[i, a]} {times[i, a]:.3f}\n" for a in range(len(names)))
    (cub / "images.txt").write_text("".join(image_lines))
    (cub / "image_class_labels.txt").write_text("".join(class_lines))
    (cub / "train_test_split.txt").write_text("".join(split_lines))
    (cub / "attributes" / "image_attribute_labels.txt").write_text("".join(attr_lines))

    # Koh et al.'s processed splits: class-level concepts (here the prototypes), 20% of train held out for validation
    class_concepts = one_hot(protos)
    train_idx = np.flatnonzero(is_train)
    val_set = set(rng.choice(train_idx, size=int(round(val_fraction * len(train_idx))), replace=False).tolist())
    pkl_dir = out_dir / "class_attr_data_10"
    pkl_dir.mkdir()
    records: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for i in range(num_images):
        split = "test" if not is_train[i] else ("val" if i in val_set else "train")
        records[split].append({
            "id": i + 1,
            "img_path": f"/data/CUB_200_2011/images/{paths[i]}",
            "class_label": int(labels[i]),
            "attribute_label": class_concepts[labels[i]].tolist(),
            "attribute_certainty": certainty[i].tolist(),
        })
    for split, recs in records.items():
        with open(pkl_dir / f"{split}.pkl", "wb") as f:
            pickle.dump(recs, f)
