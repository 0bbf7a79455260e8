"""The evidence-VQA reader on small files in the real layout (good and malformed), and the default generator."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from lit_iclr.core.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from lit_iclr.vea.data import ANSWER, BOS, POSITION_WORDS, EvidenceVQA, read_split, tokenize


def write_root(root, records, size=(40, 20)):
    (root / "images").mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros(size[::-1], np.uint8)).save(root / "images" / "a.png")
    for split in ("train", "val", "test"):
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


GOOD = {"image": "images/a.png", "question": "What is it?", "answers": ["Bag", "a bag"], "evidence_bboxes": [[0, 0, 40, 10]]}


def test_reader_reads_a_real_layout_and_scales_boxes(tmp_path):
    write_root(tmp_path, [GOOD])
    dm = EvidenceVQA(root=str(tmp_path), image_size=32, batch_size=2)
    assert dm.answer_vocab == ["a bag", "bag"] and dm.num_answers == 2  # from train.jsonl, normalised and sorted
    dm.setup()
    item = dm.datasets["test"][0]
    torch.testing.assert_close(item["boxes"][0], torch.tensor([0.0, 0.0, 32.0, 16.0]))  # 40x20 image -> 32x32
    assert item["gold"].tolist() == [True, True] and item["y"].item() == 1
    assert item["q"][-1].item() == ANSWER and BOS in item["q"].tolist()


@pytest.mark.parametrize("bad, problem", [
    ({"evidence_bboxes": [[0, 0, 41, 10]]}, "not inside the 40x20 image"),
    ({"evidence_bboxes": [[5, 5, 5, 10]]}, "not inside"),
    ({"evidence_bboxes": []}, "no evidence_bboxes"),
    ({"answers": []}, "empty answers"),
    ({"answers": ["  "]}, "empty answers"),
    ({"image": "images/missing.png"}, "not found"),
])
def test_reader_rejects_malformed_records_naming_file_and_line(tmp_path, bad, problem):
    write_root(tmp_path, [GOOD, {**GOOD, **bad}])
    with pytest.raises(DatasetFormatError, match=rf"train\.jsonl:2.*{problem}"):
        read_split(tmp_path, "train")


def test_reader_rejects_bad_json_missing_fields_and_missing_split(tmp_path):
    write_root(tmp_path, [GOOD])
    (tmp_path / "val.jsonl").write_text("{not json\n")
    with pytest.raises(DatasetFormatError, match="val.jsonl:1.*not valid JSON"):
        read_split(tmp_path, "val")
    (tmp_path / "val.jsonl").write_text(json.dumps({"image": "images/a.png"}) + "\n")
    with pytest.raises(DatasetFormatError, match="missing field"):
        read_split(tmp_path, "val")
    (tmp_path / "test.jsonl").unlink()
    with pytest.raises(DatasetNotFoundError, match="test.jsonl"):
        read_split(tmp_path, "test")


def test_tokenize_is_stable_left_to_right_and_bounded():
    a, b = tokenize("What is in the top left ?", 64, 8), tokenize("what is in the top left?", 64, 8)
    assert a == b and a[0] == BOS and a[-1] == ANSWER and len(a) == 8 and all(0 <= t < 64 for t in a)


def test_generated_default_puts_the_answer_item_in_its_evidence_box(tmp_path):
    dm = EvidenceVQA(data_dir=str(tmp_path), num_train=8, num_val=4, num_test=12, batch_size=4)
    dm.prepare_data()
    dm.setup()
    recs = read_split(dm.path, "test")
    assert len(recs) == 12
    for r in recs:
        img = np.asarray(Image.open(r["image"]), dtype=np.float32) / 255
        x0, y0, x1, y1 = (int(v) for v in r["evidence_bboxes"][0])
        assert (x1 - x0, y1 - y0) == (16, 16) and img[y0:y1, x0:x1].mean() > 0.05  # a drawn item
        cell = (y0 >= 8) * 2 + (x0 >= 8)  # jitter is at most 2 px, so the box's cell is its top-left quadrant
        assert POSITION_WORDS[cell] in r["question"]
        assert r["answers"][0] in dm.answer_vocab
    # the generator is seeded: a second folder holds the same images
    dm2 = EvidenceVQA(data_dir=str(tmp_path / "again"), num_train=8, num_val=4, num_test=12)
    dm2.prepare_data()
    first = read_split(dm2.path, "test")[0]
    assert np.array_equal(np.asarray(Image.open(first["image"])), np.asarray(Image.open(recs[0]["image"])))


def count_items(path):
    """Cells of the 2x2 grid whose centre holds an item (jitter moves items at most 2 px into a neighbour cell)."""
    img = np.asarray(Image.open(path))
    return sum(int(img[r * 16 + 3:r * 16 + 13, c * 16 + 3:c * 16 + 13].max() > 0) for r in range(2) for c in range(2))


def test_training_scenes_hold_a_range_of_items_and_test_scenes_more(tmp_path):
    dm = EvidenceVQA(data_dir=str(tmp_path), num_train=40, num_val=6, num_test=10, num_items=2, min_items=1,
                     eval_num_items=4)
    dm.prepare_data()
    train = {count_items(r["image"]) for r in read_split(dm.path, "train")}
    assert train == {1, 2}
    assert {count_items(r["image"]) for s in ("val", "test") for r in read_split(dm.path, s)} == {4}
    other = EvidenceVQA(data_dir=str(tmp_path), num_train=40, num_val=6, num_test=10, num_items=2, min_items=1)
    assert other.path != dm.path  # the clutter options key the generated folder


def test_item_count_options_are_checked():
    with pytest.raises(ConfigError, match="min_items"):
        EvidenceVQA(num_items=2, min_items=3)
    with pytest.raises(ConfigError, match="eval_num_items"):
        EvidenceVQA(eval_num_items=5)


def test_a_question_longer_than_max_question_len_is_an_error(tmp_path):
    write_root(tmp_path, [{**GOOD, "question": "which garment is at the top left ?"}])  # BOS + 8 words + ANSWER
    with pytest.raises(ConfigError, match="question of 10 tokens.*max_question_len >= 10"):
        EvidenceVQA(root=str(tmp_path), max_question_len=8).setup()
    EvidenceVQA(root=str(tmp_path), max_question_len=10).setup()
