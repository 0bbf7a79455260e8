"""Evidence-annotated VQA: its two real layouts (a TextVQA/DocVQA-style jsonl folder, TextVQA's own files), the reader,
VQA's answer normalisation and accuracy, and the embedded default generator.

Layout 1, jsonl (one folder):

    <root>/images/<name>.png                      any image PIL reads (grey, palette, RGBA, CMYK: read as RGB)
    <root>/{train,val,test}.jsonl                 one JSON object a line:
        {"image": "images/000001.png", "question": "what is the striped item ?", "answers": ["Shirt"],
         "evidence_bboxes": [[x0, y0, x1, y1], ...]}  # pixels of the stored image, x0 < x1 <= width, y0 < y1 <= height

Layout 2, TextVQA as published (`read_textvqa_split`): TextVQA_0.5.1_{train,val,test}.json, the Rosetta OCR files
TextVQA_Rosetta_OCR_v0.2_{train,val,test}.json and the images train_images/<image_id>.jpg (test: test_images/); the
evidence boxes are the OCR tokens that spell an answer.

`val` is the calibration split of VEA's layer profiling (`splits` maps each to a file split). Images are RGB, resized
to `image_size`. The label is the majority answer; accuracy is VQA's (`answer_scores`: min(#humans / 3, 1) over the
10-choose-9 subsets for 10-answer records, exact match otherwise). The reader checks every record (missing or
unreadable image, empty answers, boxes outside the image or degenerate) and raises `DatasetFormatError` naming the
file and line.

Default data (generated once into `data/`): 32x32 RGB scenes of 16x16 Fashion-MNIST items in the cells of a 2x2 grid
(small jitter), each drawn with one of core's four textures (solid, stripes, checker, dots) and one of four colours
(red, green, blue, yellow). The question names the item by its cell ("what is in the top left ?", `question_key:
position`, the document-style lookup), its texture (`texture`), its colour (`colour`), or position or texture (`mixed`);
the answer is the item's class; its box is the evidence. The other items are
distractors, with probability `p_same_group` from the target's confusable class group (tops: T-shirt/Pullover/Dress/
Coat/Shirt, footwear: Sandal/Sneaker/Ankle boot, or Trouser/Bag). Training scenes hold `min_items`..`num_items` items
(configs/vea.yaml: 1-2), calibration and test scenes `eval_num_items` (configs/vea.yaml: 4): a test more cluttered than
training, where a model that recognises items can still be distracted by their neighbours ("seeing but not believing").
Items come from Fashion-MNIST's own train (train split) and test (val/test splits) images.
"""
from __future__ import annotations

import json
import re
import zlib
from collections import Counter
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
# item colours of the generated scenes (RGB gains): a colour question is answerable only from the colour channels
COLOURS = {"red": (1.0, 0.2, 0.2), "green": (0.2, 1.0, 0.2), "blue": (0.25, 0.4, 1.0), "yellow": (1.0, 1.0, 0.2)}
TEMPLATES = {"texture": ("what is the {t} item ?", "which garment is {t} ?", "name the {t} one ?"),
             "colour": ("what is the {t} item ?", "which garment is {t} ?", "name the {t} one ?"),
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


# ---- answers: VQA's normalisation and accuracy (TextVQA's evaluator uses the same) ----
# the VQA evaluation's contraction table (apostrophe-less spellings -> the spelling with apostrophes)
CONTRACTIONS = dict(pair.split(":") for pair in (
    "aint:ain't arent:aren't cant:can't couldve:could've couldnt:couldn't couldn'tve:couldn't've couldnt've:couldn't've "
    "didnt:didn't doesnt:doesn't dont:don't hadnt:hadn't hadnt've:hadn't've hadn'tve:hadn't've hasnt:hasn't "
    "havent:haven't hed:he'd hed've:he'd've he'dve:he'd've hes:he's howd:how'd howll:how'll hows:how's Id've:I'd've "
    "I'dve:I'd've Im:I'm Ive:I've isnt:isn't itd:it'd itd've:it'd've it'dve:it'd've itll:it'll let's:let's maam:ma'am "
    "mightnt:mightn't mightnt've:mightn't've mightn'tve:mightn't've mightve:might've mustnt:mustn't mustve:must've "
    "neednt:needn't notve:not've oclock:o'clock oughtnt:oughtn't ow's'at:'ow's'at 'ows'at:'ow's'at 'ow'sat:'ow's'at "
    "shant:shan't shed've:she'd've she'dve:she'd've she's:she's shouldve:should've shouldnt:shouldn't "
    "shouldnt've:shouldn't've shouldn'tve:shouldn't've somebody'd:somebodyd somebodyd've:somebody'd've "
    "somebody'dve:somebody'd've somebodyll:somebody'll somebodys:somebody's someoned:someone'd someoned've:someone'd've "
    "someone'dve:someone'd've someonell:someone'll someones:someone's somethingd:something'd "
    "somethingd've:something'd've something'dve:something'd've somethingll:something'll thats:that's thered:there'd "
    "thered've:there'd've there'dve:there'd've therere:there're theres:there's theyd:they'd theyd've:they'd've "
    "they'dve:they'd've theyll:they'll theyre:they're theyve:they've twas:'twas wasnt:wasn't wed've:we'd've "
    "we'dve:we'd've weve:we've werent:weren't whatll:what'll whatre:what're whats:what's whatve:what've whens:when's "
    "whered:where'd wheres:where's whereve:where've whod:who'd whod've:who'd've who'dve:who'd've wholl:who'll "
    "whos:who's whove:who've whyll:why'll whyre:why're whys:why's wont:won't wouldve:would've wouldnt:wouldn't "
    "wouldnt've:wouldn't've wouldn'tve:wouldn't've yall:y'all yall'll:y'all'll y'allll:y'all'll yall'd've:y'all'd've "
    "y'alld've:y'all'd've y'all'dve:y'all'd've youd:you'd youd've:you'd've you'dve:you'd've youll:you'll "
    "youre:you're youve:you've").split())
NUMBERS = {w: str(i) for i, w in enumerate("zero one two three four five six seven eight nine ten".split())} | {"none": "0"}
ARTICLES = {"a", "an", "the"}
PUNCTUATION = ";/[]\"{}()=+\\_->< @`,?!".replace(" ", "")
_PERIOD = re.compile(r"(?!<=\d)(\.)(?!\d)")  # the evaluator's pattern (its look-behind is a literal; kept as published)
_DIGIT_COMMA = re.compile(r"(\d)(,)(\d)")


def normalize_answer(a: str) -> str:
    """VQA's answer normalisation (the EvalAI / TextVQA evaluator): lower case, punctuation removed next to spaces (else
    turned into a space), periods not inside numbers dropped, number words as digits, articles dropped, contractions
    spelled with their apostrophe."""
    text = " ".join(str(a).replace("\n", " ").replace("\t", " ").lower().split())
    text = text.replace(",", "").replace("?", "").replace("'s", " 's")
    out = text
    for p in PUNCTUATION:
        if p + " " in text or " " + p in text or _DIGIT_COMMA.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    out = _PERIOD.sub("", out)
    words = [NUMBERS.get(w, w) for w in out.split()]
    return " ".join(CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES)


def answer_scores(answers: list[str]) -> dict[str, float]:
    """Accuracy of predicting each distinct (normalised) answer.

    With the VQA / TextVQA protocol's 10 human answers: the official form, min(#other humans giving it / 3, 1) averaged
    over the 10 leave-one-out subsets of 9 (so 1 human scores 0.3, 2 humans 0.6, 3 humans 0.9, 4 or more 1.0). With another number
    of answers (DocVQA-style or hand-made single answers) an answer is right when it is one of them (score 1).
    """
    if len(answers) != 10:
        return dict.fromkeys(answers, 1.0)
    counts = Counter(answers)
    # leaving out a human who gave `a` leaves counts[a] - 1 matches, any other human leaves counts[a]
    return {a: (n * min((n - 1) / 3, 1.0) + (10 - n) * min(n / 3, 1.0)) / 10 for a, n in counts.items()}


def majority_answer(answers: list[str]) -> str:
    """The most frequent answer (ties: the one given first): the training label."""
    counts = Counter(answers)
    return max(answers, key=lambda a: (counts[a], -answers.index(a)))


def open_rgb(path: Path, where: str | Path) -> Image.Image:
    """The image as RGB (any mode PIL reads: grey, palette, RGBA, CMYK), or one error naming the image and the record."""
    try:
        with Image.open(path) as im:
            im.load()
            return im.convert("RGB")
    except FileNotFoundError:
        raise DatasetFormatError(where, f"image {path} not found", "put the image under the data root or fix the path") from None
    except (OSError, ValueError) as e:  # UnidentifiedImageError, truncated or corrupt files
        raise DatasetFormatError(where, f"image {path} cannot be read ({type(e).__name__}: {e})",
                                 "re-save the image (PNG or JPEG) or drop the record") from None


def image_size_of(path: Path, where: str | Path) -> tuple[int, int]:
    """(width, height) from the image header, with the same clear errors as `open_rgb`."""
    try:
        with Image.open(path) as im:
            return im.size
    except FileNotFoundError:
        raise DatasetFormatError(where, f"image {path} not found", "put the image under the data root or fix the path") from None
    except (OSError, ValueError) as e:
        raise DatasetFormatError(where, f"image {path} cannot be read ({type(e).__name__}: {e})",
                                 "re-save the image (PNG or JPEG) or drop the record") from None


# ---- layouts ----
def layout(root: Path) -> str:
    """`jsonl` (<split>.jsonl + images) or `textvqa` (TextVQA_0.5.1_<split>.json + Rosetta OCR + train_images/)."""
    if (root / "train.jsonl").exists():
        return "jsonl"
    if (root / "TextVQA_0.5.1_train.json").exists():
        return "textvqa"
    raise DatasetNotFoundError(root / "train.jsonl", "neither train.jsonl nor TextVQA_0.5.1_train.json found",
                               "point data.init_args.root at a folder with {train,val,test}.jsonl + images, or at "
                               "TextVQA's TextVQA_0.5.1_*.json + TextVQA_Rosetta_OCR_v0.2_*.json + train_images/")


def jsonl_lines(path: Path):
    """(where, record) for each non-empty line of a jsonl file; a broken line is one error naming the file and line."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetFormatError(where, f"not valid JSON ({e.msg} at column {e.colno})",
                                         "write one JSON object per line (a line cut short or two objects on one line)") from None
            if not isinstance(r, dict):
                raise DatasetFormatError(where, f"a JSON {type(r).__name__}, not an object", "write one JSON object per line")
            yield where, r


def checked_answers(raw, where: str) -> list[str]:
    answers = [normalize_answer(a) for a in raw] if isinstance(raw, list) else []
    if not answers or not all(answers):
        raise DatasetFormatError(where, "empty answers", "give at least one non-empty answer string per question")
    return answers


def read_jsonl_split(root: Path, split: str) -> list[dict]:
    """Records of `<root>/<split>.jsonl`, each checked against its image (size, boxes) and with non-empty answers.

    `evidence_bboxes: []` is a question without annotated evidence (kept; it counts for accuracy, not for the evidence
    metrics); a missing field is an error."""
    path = root / f"{split}.jsonl"
    if not path.exists():
        raise DatasetNotFoundError(path, f"split file {split}.jsonl not found",
                                   "write train/val/test jsonl files of {image, question, answers, evidence_bboxes}")
    records = []
    for where, r in jsonl_lines(path):
        missing = [k for k in ("image", "question", "answers", "evidence_bboxes") if k not in r]
        if missing:
            raise DatasetFormatError(where, f"missing field(s) {missing}",
                                     "give every record image, question, answers and evidence_bboxes ([] for none)")
        answers = checked_answers(r["answers"], where)
        image = root / r["image"]
        width, height = image_size_of(image, where)
        boxes = r["evidence_bboxes"]
        if not isinstance(boxes, list):
            raise DatasetFormatError(where, "evidence_bboxes is not a list",
                                     "give a list of [x0, y0, x1, y1] boxes ([] for none)")
        for b in boxes:
            ok = isinstance(b, list) and len(b) == 4 and all(isinstance(v, (int, float)) for v in b)
            if not ok or not (0 <= b[0] < b[2] <= width and 0 <= b[1] < b[3] <= height):
                raise DatasetFormatError(where, f"evidence box {b} is not inside the {width}x{height} image",
                                         "boxes are [x0, y0, x1, y1] pixels, 0 <= x0 < x1 <= width, 0 <= y0 < y1 <= height")
        records.append({"image": str(image), "question": str(r["question"]), "answers": answers,
                        "evidence_bboxes": [[float(v) for v in b] for b in boxes], "box_size": [width, height]})
    if not records:
        raise DatasetFormatError(path, "holds no records", "write one JSON object per line")
    return records


def load_json(path: Path, what: str) -> dict:
    if not path.exists():
        raise DatasetNotFoundError(path, f"{what} not found", f"download {path.name} from textvqa.org next to the others")
    try:
        with open(path) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise DatasetFormatError(f"{path}:{e.lineno}", f"not valid JSON ({e.msg})", f"download {path.name} again") from None
    if not isinstance(d, dict) or not isinstance(d.get("data"), list):
        raise DatasetFormatError(path, "no top-level \"data\" list", f"use TextVQA's own {path.name}")
    return d


def ocr_boxes(info: list, width: int, height: int) -> list[tuple[str, list[float]]]:
    """Rosetta `ocr_info` -> (normalised word, [x0, y0, x1, y1] pixels): boxes are stored as fractions of the image
    (top_left_x/y, width, height in [0, 1]), clipped to it; `rotation`/`yaw`/`pitch`/`roll` are ignored (the
    axis-aligned box of the stored corner and size); tokens whose box is empty after clipping are dropped."""
    out = []
    for t in info:
        b = t.get("bounding_box") or {}
        try:
            x, y, w, h = (float(b[k]) for k in ("top_left_x", "top_left_y", "width", "height"))
        except (KeyError, TypeError, ValueError):
            continue
        x0, y0 = min(max(x, 0.0), 1.0) * width, min(max(y, 0.0), 1.0) * height
        x1, y1 = min(max(x + w, 0.0), 1.0) * width, min(max(y + h, 0.0), 1.0) * height
        word = normalize_answer(t.get("word", ""))
        if word and x1 > x0 and y1 > y0:
            out.append((word, [x0, y0, x1, y1]))
    return out


def evidence_from_ocr(tokens: list[tuple[str, list[float]]], answers: list[str]) -> list[list[float]]:
    """Boxes of the OCR tokens that spell an answer: runs of consecutive tokens (reading order) whose words, joined by
    spaces, equal the answer. The answers matched are those at least 3 humans gave (min(n / 3, 1) = 1), else the
    majority one."""
    targets = {a for a, n in Counter(answers).items() if n >= 3} or {majority_answer(answers)}
    boxes: list[list[float]] = []
    for a in targets:
        k = len(a.split())
        for i in range(len(tokens) - k + 1):
            run = tokens[i:i + k]
            if " ".join(w for w, _ in run) == a:
                boxes.extend(b for _, b in run if b not in boxes)
    return boxes


def read_textvqa_split(root: Path, split: str) -> list[dict]:
    """TextVQA as published: `TextVQA_0.5.1_<split>.json` (questions, 10 answers) with `TextVQA_Rosetta_OCR_v0.2_<split>.json`
    (OCR tokens and normalised boxes per image), images `train_images/<image_id>.jpg` (train and val) or
    `test_images/<image_id>.jpg` (test). Evidence boxes: the OCR tokens that spell an answer (`evidence_from_ocr`); a
    question without such tokens (about a quarter of TextVQA: answers OCR missed, "unanswerable", yes/no) is kept
    with no evidence. Image sizes are the json's `image_width`/`image_height` (no image is opened here)."""
    qpath, opath = root / f"TextVQA_0.5.1_{split}.json", root / f"TextVQA_Rosetta_OCR_v0.2_{split}.json"
    questions = load_json(qpath, f"TextVQA question file for the {split} split")["data"]
    ocr = {}
    for r in load_json(opath, f"Rosetta OCR file for the {split} split")["data"]:
        if isinstance(r, dict) and "image_id" in r:
            ocr[r["image_id"]] = r.get("ocr_info") or []
    records = []
    for i, q in enumerate(questions):
        where = f"{qpath}: data[{i}]"
        if not isinstance(q, dict):
            raise DatasetFormatError(where, "not an object", f"use TextVQA's own {qpath.name}")
        missing = [k for k in ("question", "image_id", "image_width", "image_height") if k not in q]
        if missing:
            raise DatasetFormatError(where, f"missing field(s) {missing}", f"use TextVQA's own {qpath.name}")
        if "answers" not in q:
            raise DatasetFormatError(where, "no answers (TextVQA's test answers are not published)",
                                     "evaluate on the val split: data.init_args.splits: {train: train, val: train, test: val}")
        answers = checked_answers(q["answers"], where)
        folder = "test_images" if q.get("set_name", split) == "test" else "train_images"
        image = root / folder / f"{q['image_id']}.jpg"
        if not image.exists():
            raise DatasetFormatError(where, f"image {image} not found",
                                     f"unzip TextVQA's images so that {folder}/<image_id>.jpg lies under {root}")
        if q["image_id"] not in ocr:
            raise DatasetFormatError(opath, f"no OCR entry for image {q['image_id']} (data[{i}] of {qpath.name})",
                                     f"use the Rosetta OCR file of the same split as {qpath.name}")
        width, height = int(q["image_width"]), int(q["image_height"])
        boxes = evidence_from_ocr(ocr_boxes(ocr[q["image_id"]], width, height), answers)
        records.append({"image": str(image), "question": str(q["question"]), "answers": answers,
                        "evidence_bboxes": boxes, "box_size": [width, height]})
    if not records:
        raise DatasetFormatError(qpath, "holds no questions", f"use TextVQA's own {qpath.name}")
    return records


def read_split(root: Path, split: str, source: str | None = None) -> list[dict]:
    """Records of one split in either layout (`layout`); `source` names the file's split (default: `split`)."""
    source = source or split
    if layout(root) == "textvqa":
        return read_textvqa_split(root, source)
    return read_jsonl_split(root, source)


MAX_BOXES = 8  # evidence boxes kept per record in a batch (their union labels the evidence patches)


class EvidenceVQADataset(Dataset):
    """Images as (3, S, S) RGB floats in [0, 1] (resized to `image_size`), question ids, the majority answer's index
    (`y`, -1 when outside the vocabulary), the VQA score of every answer class (`gold`), boxes in that grid, and the
    record's `index` in the split (per-question random draws and the calibration / evaluation halves of validation)."""

    def __init__(self, records: list[dict], answer_vocab: list[str], image_size: int, vocab_size: int, max_len: int):
        self.records, self.image_size = records, image_size
        self.answer_index = {a: i for i, a in enumerate(answer_vocab)}
        self.vocab_size, self.max_len = vocab_size, max_len

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        r = self.records[i]
        im = open_rgb(Path(r["image"]), r["image"]).resize((self.image_size, self.image_size), Image.Resampling.BILINEAR)
        x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()
        ids = tokenize(r["question"], self.vocab_size, self.max_len)
        q = torch.full((self.max_len,), PAD, dtype=torch.long)
        q[-len(ids):] = torch.tensor(ids)  # left-padded, so the ANSWER token is always last
        w, h = r["box_size"]
        scale = torch.tensor([self.image_size / w, self.image_size / h] * 2)
        box = torch.full((MAX_BOXES, 4), -1.0)
        if r["evidence_bboxes"]:
            boxes = torch.tensor(r["evidence_bboxes"][:MAX_BOXES]) * scale
            box[: len(boxes)] = boxes
        y = self.answer_index.get(majority_answer(r["answers"]), -1)
        gold = torch.zeros(len(self.answer_index))
        for a, s in answer_scores(r["answers"]).items():
            if a in self.answer_index:
                gold[self.answer_index[a]] = s
        return {"x": x, "q": q, "y": torch.tensor(y), "gold": gold, "boxes": box, "index": torch.tensor(i)}


def draw_scene(images: np.ndarray, by_class: list[np.ndarray], rng: np.random.Generator, size: int = 32,
               cell: int = 16, num_items: int = 3, p_same_group: float = 0.5) -> dict:
    """One scene: `num_items` items in distinct cells of a (size // cell)^2 grid, each with its own texture and colour.

    Item 0 is the target; with probability `p_same_group` the others (distractors) come from its confusable class group,
    else from any class. Returns the (size, size, 3) uint8 RGB image and, per item, its texture kind, colour name, grid
    cell, class and box (top, left, height, width), items in drawing order (a later item occludes an earlier one where
    jitter overlaps).
    """
    grid = size // cell
    cells = rng.choice(grid * grid, size=num_items, replace=False)
    kinds = rng.permutation(list(TEXTURE_WORDS))[:num_items]
    colours = rng.permutation(list(COLOURS))[:num_items]
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
    gain = rng.uniform(0.7, 1.0, num_items)
    # one composition per channel, each item's brightness scaled by its colour: occlusion stays that of the grey scene
    rgb = [compose_scene(size, items, boxes, intensities=gain * np.array([COLOURS[c][ch] for c in colours]),
                         textures=textures_) for ch in range(3)]
    return {"image": to_uint8(np.stack(rgb, -1)), "kinds": [str(k) for k in kinds], "colours": [str(c) for c in colours],
            "cells": [int(c) for c in cells], "classes": classes, "boxes": boxes}


def make_scene(images: np.ndarray, by_class: list[np.ndarray], rng: np.random.Generator, size: int = 32, cell: int = 16,
               num_items: int = 3, p_same_group: float = 0.5) -> tuple[np.ndarray, dict[str, str], int, list[int]]:
    """`draw_scene` seen from its target: (uint8 RGB image, {question key: word naming the target}, class,
    box [x0, y0, x1, y1])."""
    s = draw_scene(images, by_class, rng, size, cell, num_items, p_same_group)
    top, left, bh, bw = s["boxes"][0]
    words = {"texture": TEXTURE_WORDS[s["kinds"][0]], "position": POSITION_WORDS[s["cells"][0]], "colour": s["colours"][0]}
    return s["image"], words, s["classes"][0], [left, top, left + bw, top + bh]


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
                img, words, cls, box = make_scene(images, by_class, rng, image_size, image_size // 2, k, p_same_group)
                name = f"images/{split}_{i:06d}.png"
                Image.fromarray(img, mode="RGB").save(out_dir / name)
                key = question_key if question_key != "mixed" else ("texture", "position")[int(rng.integers(2))]
                question = TEMPLATES[key][int(rng.integers(len(TEMPLATES[key])))].format(t=words[key])
                f.write(json.dumps({"image": name, "question": question, "answers": [FASHION_MNIST_CLASSES[cls]],
                                    "evidence_bboxes": [box]}) + "\n")


class EvidenceVQA(BaseDataModule):
    """Evidence-annotated VQA: the jsonl layout (`image`, `question`, `answers`, `evidence_bboxes` + image folder) or
    TextVQA's own files (questions + Rosetta OCR + train_images/)."""

    default_name = "vea_evidence_vqa"
    default_version = 3  # 3: RGB scenes with coloured items (2: grey)
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
                 answer_vocab: list[str] | None = None, max_answers: int | None = None,
                 splits: dict[str, str] | None = None, num_train: int = 6000, num_val: int = 500, num_test: int = 1000,
                 num_items: int = 3, p_same_group: float = 0.5, question_key: str = "position", generator_seed: int = 0,
                 min_items: int | None = None, eval_num_items: int | None = None):
        """
        Args:
            root: Folder with images/ and train/val/test.jsonl, or TextVQA's TextVQA_0.5.1_*.json,
                TextVQA_Rosetta_OCR_v0.2_*.json and train_images/; null: the generated default.
            data_dir: Cache folder of the generated default.
            batch_size: Questions per batch.
            num_workers: DataLoader workers.
            image_size: Side the RGB images are resized to (a multiple of the model's patch size).
            vocab_size: Question words hash into this many ids.
            max_question_len: Question tokens (BOS + words + ANSWER, left-padded); a longer question is an error.
            answer_vocab: Answer classes; null: Fashion-MNIST's class names for the default data, or the training
                split's majority answers for a real root (most frequent first), all normalised as VQA does.
            max_answers: Keep only this many of those (the most frequent; TextVQA's long tail); null: all.
            splits: Which file split each of train / val (VEA's calibration) / test reads, e.g. {train: train, val: train,
                test: val} for TextVQA, whose test answers are not published; null: each its own.
            num_train: Generated training questions (default data only).
            num_val: Generated calibration questions (VEA layer profiling).
            num_test: Generated test questions.
            num_items: Items per generated scene (the target and num_items - 1 distractors, at most 4).
            p_same_group: Probability that the distractors come from the target's confusable class group.
            question_key: How a generated question names its item: position (its cell, document-style), texture, colour
                (answerable from the colour channels only), or mixed (position or texture).
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
        if question_key not in ("position", "texture", "colour", "mixed"):
            raise ConfigError(f"question_key must be position | texture | colour | mixed, got {question_key!r}")
        bad = set(splits or {}) - set(SPLITS)
        if bad:
            raise ConfigError(f"data.init_args.splits has keys {sorted(bad)}; use train, val, test")
        self.splits = {s: (splits or {}).get(s, s) for s in SPLITS}
        if answer_vocab is None and root is None:
            answer_vocab = list(FASHION_MNIST_CLASSES)
        elif answer_vocab is None and not Path(root).expanduser().exists():
            # a root that is not here (a cluster path under `cli.py plan`): max_answers placeholder classes for the
            # sizes; prepare_data says the root is missing before anything trains or tests
            answer_vocab = [f"answer {i}" for i in range(max_answers or 1)]
        elif answer_vocab is None:  # a real root: its training labels (the jsonl or json only; no image is read)
            answer_vocab = self._train_answers(Path(root).expanduser(), self.splits["train"])
        vocab = list(dict.fromkeys(normalize_answer(a) for a in answer_vocab))
        self.answer_vocab = vocab[:max_answers] if max_answers else vocab
        self.num_answers = len(self.answer_vocab)

    @staticmethod
    def _train_answers(root: Path, source: str) -> list[str]:
        """The majority answers of the training split, most frequent first (ties alphabetical)."""
        if layout(root) == "textvqa":
            path = root / f"TextVQA_0.5.1_{source}.json"
            raw = [q.get("answers", []) for q in load_json(path, "TextVQA question file")["data"] if isinstance(q, dict)]
        else:
            path = root / f"{source}.jsonl"
            if not path.exists():
                raise DatasetNotFoundError(path, f"{source}.jsonl not found",
                                           "point data.init_args.root at an evidence-VQA folder")
            raw = [r.get("answers", []) for _, r in jsonl_lines(path)]
        labels = Counter()
        for answers in raw:
            norm = [normalize_answer(a) for a in answers] if isinstance(answers, list) else []
            if norm and all(norm):
                labels[majority_answer(norm)] += 1
        if not labels:
            raise DatasetFormatError(path, "no answers in the training split", "give every training question its answers")
        return sorted(labels, key=lambda a: (-labels[a], a))

    def generate_default(self, out_dir: Path) -> None:
        generate(out_dir, {"train": self.num_train, "val": self.num_val, "test": self.num_test}, self.generator_seed,
                 self.image_size, self.num_items, self.p_same_group, self.question_key, min_items=self.min_items,
                 eval_num_items=self.eval_num_items)

    def setup(self, stage: str | None = None) -> None:
        records = {s: read_split(self.path, s, self.splits[s]) for s in SPLITS}
        for s, recs in records.items():
            longest = max(len(tokenize(r["question"], self.vocab_size, 10**6)) for r in recs)
            if longest > self.max_question_len:  # cutting words could drop the one that names the item
                raise ConfigError(f"{self.path} ({self.splits[s]} split) holds a question of {longest} tokens (BOS + words "
                                  f"+ ANSWER) but max_question_len is {self.max_question_len}; set "
                                  f"data.init_args.max_question_len >= {longest}")
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
        return (f"EvidenceVQA: {self.path} ({layout(self.path) if self.path.exists() else 'jsonl'} layout: images/ + "
                f"train/val/test.jsonl of image, question, answers, evidence_bboxes, or TextVQA's json + Rosetta OCR; "
                f"{self.num_answers} answer classes; RGB at {self.image_size} px; val is VEA's calibration split)")
