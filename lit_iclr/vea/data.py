"""Evidence-annotated VQA in the TextVQA/DocVQA-style layout users have, its reader, and the embedded default generator.

Layout (one folder):

    <root>/images/<name>.png                      any image PIL reads
    <root>/{train,val,test}.jsonl                 one JSON object a line:
        {"image": "images/000001.png", "question": "what is the striped item ?", "answers": ["Shirt"],
         "evidence_bboxes": [[x0, y0, x1, y1], ...]}  # pixels of the stored image, x0 < x1 <= width, y0 < y1 <= height

`val.jsonl` is the calibration split of VEA's layer profiling. The reader checks every record (missing image, empty
answers, boxes outside the image or degenerate) and raises `DatasetFormatError` naming the file and line.

Default data (generated once into `data/`): 32x32 grey scenes of 16x16 Fashion-MNIST items in the cells of a 2x2 grid
(small jitter), each drawn with one of core's four textures (solid, stripes, checker, dots). The question names the
item by its cell ("what is in the top left ?", `question_key: position`, the document-style lookup) or its texture
(`texture`), or either (`mixed`); the answer is the item's class; its box is the evidence. The other items are
distractors, with probability `p_same_group` from the target's confusable class group (tops: T-shirt/Pullover/Dress/
Coat/Shirt, footwear: Sandal/Sneaker/Ankle boot, or Trouser/Bag). Training scenes hold `min_items`..`num_items` items
(configs/vea.yaml: 1-2), calibration and test scenes `eval_num_items` (configs/vea.yaml: 4): a test more cluttered than
training, where a model that recognises items can still be distracted by their neighbours ("seeing but not believing").
Items come from Fashion-MNIST's own train (train split) and test (val/test splits) images.
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core import BaseDataModule
from lit_iclr.core.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from lit_iclr.core.idx import FASHION_MNIST_CLASSES, FASHION_MNIST_DIR, load_fashion_mnist
from lit_iclr.core.loader import ResumableDataLoader
from lit_iclr.core.scenes import compose_scene, texture, to_uint8

SPLITS = ("train", "val", "test")
TEXTURE_WORDS = {"solid": "plain", "stripes": "striped", "checker": "checkered", "dots": "dotted"}
# confusable class groups: the distractors of a scene come from the target's group
CLASS_GROUPS = ((0, 2, 3, 4, 6), (5, 7, 9), (1, 8))
TEMPLATES = {"texture": ("what is the {t} item ?", "which garment is {t} ?", "name the {t} one ?"),
             "position": ("what is in the {t} ?", "which garment is at the {t} ?", "name the {t} one ?")}
POSITION_WORDS = ("top left", "top right", "bottom left", "bottom right")  # cells of the 2x2 grid, row-major
PAD, BOS, ANSWER = 0, 1, 2  # special token ids; words hash into [3, vocab_size)


def tokenize(question: str, vocab_size: int, max_len: int) -> list[int]:
    """Word ids by a stable hash (crc32) into [3, vocab_size), after BOS, ending with the ANSWER query token.

    Hashing keeps the vocabulary size fixed without reading the data (it is linked to the model at instantiation);
    collisions are rare at the default size and harmless for the question templates of the default data.
    """
    words = question.lower().replace("?", " ?").split()
    ids = [3 + zlib.crc32(w.encode()) % (vocab_size - 3) for w in words][: max_len - 2]
    return [BOS, *ids, ANSWER]


def normalize_answer(a: str) -> str:
    return " ".join(str(a).lower().strip().split())


def read_split(root: Path, split: str) -> list[dict]:
    """Records of `<root>/<split>.jsonl`, each checked against its image (size, boxes) and with non-empty answers."""
    path = root / f"{split}.jsonl"
    if not path.exists():
        raise DatasetNotFoundError(path, f"split file {split}.jsonl not found",
                                   "write train/val/test jsonl files of {image, question, answers, evidence_bboxes}")
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetFormatError(where, f"not valid JSON ({e.msg})", "write one JSON object per line") from e
            missing = [k for k in ("image", "question", "answers", "evidence_bboxes") if k not in r]
            if missing:
                raise DatasetFormatError(where, f"missing field(s) {missing}",
                                         "give every record image, question, answers and evidence_bboxes")
            answers = [normalize_answer(a) for a in r["answers"]] if isinstance(r["answers"], list) else []
            if not answers or not all(answers):
                raise DatasetFormatError(where, "empty answers", "give at least one non-empty answer string per question")
            image = root / r["image"]
            if not image.exists():
                raise DatasetFormatError(where, f"image {image} not found", "put the image under the data root or fix the path")
            with Image.open(image) as im:
                width, height = im.size
            boxes = r["evidence_bboxes"]
            if not isinstance(boxes, list) or not boxes:
                raise DatasetFormatError(where, "no evidence_bboxes", "give at least one [x0, y0, x1, y1] evidence box")
            for b in boxes:
                ok = isinstance(b, list) and len(b) == 4 and all(isinstance(v, (int, float)) for v in b)
                if not ok or not (0 <= b[0] < b[2] <= width and 0 <= b[1] < b[3] <= height):
                    raise DatasetFormatError(where, f"evidence box {b} is not inside the {width}x{height} image",
                                             "boxes are [x0, y0, x1, y1] pixels, 0 <= x0 < x1 <= width, 0 <= y0 < y1 <= height")
            records.append({"image": str(image), "question": str(r["question"]), "answers": answers,
                            "evidence_bboxes": [[float(v) for v in b] for b in boxes]})
    if not records:
        raise DatasetFormatError(path, "holds no records", "write one JSON object per line")
    return records


class EvidenceVQADataset(Dataset):
    """Images as (1, S, S) floats in [0, 1] (resized to `image_size`), question ids, answer index, boxes in that grid."""

    def __init__(self, records: list[dict], answer_vocab: list[str], image_size: int, vocab_size: int, max_len: int):
        self.records, self.image_size = records, image_size
        self.answer_index = {a: i for i, a in enumerate(answer_vocab)}
        self.vocab_size, self.max_len = vocab_size, max_len

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        r = self.records[i]
        with Image.open(r["image"]) as im:
            w, h = im.size
            im = im.convert("L").resize((self.image_size, self.image_size), Image.Resampling.BILINEAR)
            x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0)[None]
        ids = tokenize(r["question"], self.vocab_size, self.max_len)
        q = torch.full((self.max_len,), PAD, dtype=torch.long)
        q[-len(ids):] = torch.tensor(ids)  # left-padded, so the ANSWER token is always last
        scale = torch.tensor([self.image_size / w, self.image_size / h] * 2)
        boxes = torch.tensor(r["evidence_bboxes"][:4]) * scale  # at most 4 boxes per record in a batch
        box = torch.full((4, 4), -1.0)
        box[: len(boxes)] = boxes
        y = self.answer_index.get(r["answers"][0], -1)  # -1: answer outside the vocabulary (always counted wrong)
        gold = torch.zeros(len(self.answer_index), dtype=torch.bool)
        for a in r["answers"]:
            if a in self.answer_index:
                gold[self.answer_index[a]] = True
        return {"x": x, "q": q, "y": torch.tensor(y), "gold": gold, "boxes": box}


def draw_scene(images: np.ndarray, by_class: list[np.ndarray], rng: np.random.Generator, size: int = 32,
               cell: int = 16, num_items: int = 3, p_same_group: float = 0.5) -> dict:
    """One scene: `num_items` items in distinct cells of a (size // cell)^2 grid, each with its own texture.

    Item 0 is the target; with probability `p_same_group` the others (distractors) come from its confusable class group,
    else from any class. Returns the uint8 image and, per item, its texture kind, grid cell, class and box
    (top, left, height, width), items in drawing order (a later item occludes an earlier one where jitter overlaps).
    """
    grid = size // cell
    cells = rng.choice(grid * grid, size=num_items, replace=False)
    kinds = rng.permutation(list(TEXTURE_WORDS))[:num_items]
    target = int(rng.integers(len(FASHION_MNIST_CLASSES)))
    group = next(g for g in CLASS_GROUPS if target in g)
    pool = group if rng.random() < p_same_group else range(len(FASHION_MNIST_CLASSES))
    classes = [target, *(int(c) for c in rng.choice(list(pool), size=num_items - 1))]
    items, boxes, textures_ = [], [], []
    for c, k, where in zip(classes, kinds, cells, strict=True):
        items.append(images[rng.choice(by_class[c])])
        top, left = divmod(int(where), grid)
        jitter = rng.integers(0, max(1, cell // 8) + 1, size=2)  # small offsets so items do not sit on patch edges
        top, left = min(top * cell + int(jitter[0]), size - cell), min(left * cell + int(jitter[1]), size - cell)
        boxes.append((top, left, cell, cell))
        textures_.append(texture(k, cell, cell, period=4, phase=int(rng.integers(2))))
    scene = compose_scene(size, items, boxes, intensities=rng.uniform(0.7, 1.0, num_items), textures=textures_)
    return {"image": to_uint8(scene), "kinds": [str(k) for k in kinds], "cells": [int(c) for c in cells],
            "classes": classes, "boxes": boxes}


def make_scene(images: np.ndarray, by_class: list[np.ndarray], rng: np.random.Generator, size: int = 32, cell: int = 16,
               num_items: int = 3, p_same_group: float = 0.5) -> tuple[np.ndarray, str, int, int, list[int]]:
    """`draw_scene` seen from its target: (uint8 image, texture kind, grid cell, class, box [x0, y0, x1, y1])."""
    s = draw_scene(images, by_class, rng, size, cell, num_items, p_same_group)
    top, left, bh, bw = s["boxes"][0]
    return s["image"], s["kinds"][0], s["cells"][0], s["classes"][0], [left, top, left + bw, top + bh]


def generate(out_dir: Path, sizes: dict[str, int], seed: int, image_size: int = 32, num_items: int = 3,
             p_same_group: float = 0.5, question_key: str = "position", fashion_root: str | Path = FASHION_MNIST_DIR,
             min_items: int | None = None, eval_num_items: int | None = None) -> None:
    """Write the default evidence-VQA folder (images/*.png + {train,val,test}.jsonl) into `out_dir`.

    Training scenes hold between `min_items` (default: `num_items`) and `num_items` items, uniformly; calibration and
    test scenes hold `eval_num_items` (default: the training range), so the test split can be more cluttered than training.
    """
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    sources = {}
    for split, n in sizes.items():
        source = "train" if split == "train" else "test"
        if source not in sources:
            images, labels = load_fashion_mnist(fashion_root, source)
            sources[source] = images, [np.flatnonzero(labels == c) for c in range(len(FASHION_MNIST_CLASSES))]
        images, by_class = sources[source]
        rng = np.random.default_rng([seed, SPLITS.index(split)])
        lo, hi = (min_items or num_items, num_items)
        if split != "train" and eval_num_items is not None:
            lo = hi = eval_num_items
        with open(out_dir / f"{split}.jsonl", "w") as f:
            for i in range(n):
                k = hi if lo == hi else int(rng.integers(lo, hi + 1))  # no extra draw for a fixed count
                img, kind, cell, cls, box = make_scene(images, by_class, rng, image_size, image_size // 2, k, p_same_group)
                name = f"images/{split}_{i:06d}.png"
                Image.fromarray(img, mode="L").save(out_dir / name)
                key = question_key if question_key != "mixed" else ("texture", "position")[int(rng.integers(2))]
                word = TEXTURE_WORDS[kind] if key == "texture" else POSITION_WORDS[cell]
                question = TEMPLATES[key][int(rng.integers(len(TEMPLATES[key])))].format(t=word)
                f.write(json.dumps({"image": name, "question": question, "answers": [FASHION_MNIST_CLASSES[cls]],
                                    "evidence_bboxes": [box]}) + "\n")


class EvidenceVQA(BaseDataModule):
    """Evidence-annotated VQA (`image`, `question`, `answers`, `evidence_bboxes` jsonl + image folder)."""

    default_name = "vea_evidence_vqa"
    default_version = 2
    content_options = ("num_train", "num_val", "num_test", "generator_seed", "num_items", "p_same_group", "image_size",
                       "question_key", "min_items", "eval_num_items")
    model_links = {"num_answers": "num_answers", "vocab_size": "vocab_size", "model_image_size": "image_size",
                   "max_question_len": "max_question_len"}

    @property
    def model_image_size(self):
        """`image_size` as linked into the model: a source name of its own, so that DataModules with an `image_size` of
        their own whose model takes none (IB-CBM's) are not linked (the links are declared for every DataModule)."""
        return self.image_size

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 64, num_workers: int = 0,
                 image_size: int = 32, vocab_size: int = 512, max_question_len: int = 12,
                 answer_vocab: list[str] | None = None, num_train: int = 6000, num_val: int = 500, num_test: int = 1000,
                 num_items: int = 3, p_same_group: float = 0.5, question_key: str = "position", generator_seed: int = 0,
                 min_items: int | None = None, eval_num_items: int | None = None):
        """
        Args:
            root: Folder with images/ and train/val/test.jsonl; null: the generated default.
            data_dir: Cache folder of the generated default.
            batch_size: Questions per batch.
            num_workers: DataLoader workers.
            image_size: Side the images are resized to (a multiple of the model's patch size).
            vocab_size: Question words hash into this many ids.
            max_question_len: Question tokens (BOS + words + ANSWER, left-padded); a longer question is an error.
            answer_vocab: Answer classes; null: Fashion-MNIST's class names for the default data, or the answers of
                train.jsonl (sorted) for a real root.
            num_train: Generated training questions (default data only).
            num_val: Generated calibration questions (VEA layer profiling).
            num_test: Generated test questions.
            num_items: Items per generated scene (the target and num_items - 1 distractors, at most 4).
            p_same_group: Probability that the distractors come from the target's confusable class group.
            question_key: How a generated question names its item: position (its cell, document-style), texture, or mixed.
            generator_seed: Seed of the generated default.
            min_items: Fewest items in a generated training scene (uniform in [min_items, num_items]); null: num_items.
            eval_num_items: Items per generated calibration / test scene (more than in training: a cluttered test);
                null: the training range.
        """
        super().__init__(root=root, data_dir=data_dir, batch_size=batch_size, num_workers=num_workers)
        if vocab_size < 8 or max_question_len < 3:
            raise ConfigError("vocab_size must be >= 8 and max_question_len >= 3")
        self.image_size, self.vocab_size, self.max_question_len = image_size, vocab_size, max_question_len
        self.num_train, self.num_val, self.num_test, self.generator_seed = num_train, num_val, num_test, generator_seed
        for name, n in (("num_items", num_items), ("min_items", min_items), ("eval_num_items", eval_num_items)):
            if n is not None and not 1 <= n <= 4:
                raise ConfigError(f"{name} must be 1..4 (one texture and one cell each), got {n}")
        if min_items is not None and min_items > num_items:
            raise ConfigError(f"min_items ({min_items}) must not exceed num_items ({num_items})")
        self.min_items, self.eval_num_items = min_items, eval_num_items
        self.num_items, self.p_same_group, self.question_key = num_items, p_same_group, question_key
        if question_key not in ("position", "texture", "mixed"):
            raise ConfigError(f"question_key must be position | texture | mixed, got {question_key!r}")
        if answer_vocab is None and root is None:
            answer_vocab = list(FASHION_MNIST_CLASSES)
        elif answer_vocab is None:  # a real root: its training answers (one pass over a jsonl, no images read)
            answer_vocab = self._train_answers(Path(root).expanduser())
        self.answer_vocab = [normalize_answer(a) for a in answer_vocab]
        self.num_answers = len(self.answer_vocab)

    @staticmethod
    def _train_answers(root: Path) -> list[str]:
        path = root / "train.jsonl"
        if not path.exists():
            raise DatasetNotFoundError(path, "train.jsonl not found", "point data.init_args.root at an evidence-VQA folder")
        answers = set()
        with open(path) as f:
            for line in f:
                if line.strip():
                    answers.update(normalize_answer(a) for a in json.loads(line).get("answers", []))
        return sorted(a for a in answers if a)

    def generate_default(self, out_dir: Path) -> None:
        generate(out_dir, {"train": self.num_train, "val": self.num_val, "test": self.num_test}, self.generator_seed,
                 self.image_size, self.num_items, self.p_same_group, self.question_key, min_items=self.min_items,
                 eval_num_items=self.eval_num_items)

    def setup(self, stage: str | None = None) -> None:
        records = {s: read_split(self.path, s) for s in SPLITS}
        for s, recs in records.items():
            longest = max(len(tokenize(r["question"], self.vocab_size, 10**6)) for r in recs)
            if longest > self.max_question_len:  # cutting words could drop the one that names the item
                raise ConfigError(f"{self.path / s}.jsonl holds a question of {longest} tokens (BOS + words + ANSWER) but "
                                  f"max_question_len is {self.max_question_len}; set data.init_args.max_question_len "
                                  f">= {longest}")
        self.datasets = {s: EvidenceVQADataset(recs, self.answer_vocab, self.image_size, self.vocab_size,
                                               self.max_question_len) for s, recs in records.items()}

    def train_dataloader(self):
        return ResumableDataLoader(self.datasets["train"], batch_size=self.batch_size, shuffle=True,
                                   num_workers=self.num_workers)

    def val_dataloader(self):
        return DataLoader(self.datasets["val"], batch_size=self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self):
        return DataLoader(self.datasets["test"], batch_size=self.batch_size, num_workers=self.num_workers)

    def describe(self) -> str:
        return (f"EvidenceVQA: {self.path} (images/ + train/val/test.jsonl of image, question, answers, evidence_bboxes; "
                f"{self.num_answers} answer classes; val is VEA's calibration split)")
