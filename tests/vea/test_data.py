"""The evidence-VQA reader on small files in the real layout (good and malformed), and the default generator."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from PIL import Image

from lit_iclr.core.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from lit_iclr.vea.data import (
    ANSWER,
    BOS,
    COLOURS,
    POSITION_WORDS,
    EvidenceVQA,
    answer_scores,
    majority_answer,
    normalize_answer,
    read_split,
    tokenize,
)


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
    assert dm.answer_vocab == ["bag"] and dm.num_answers == 1  # VQA normalisation drops the article
    dm.setup()
    item = dm.datasets["test"][0]
    torch.testing.assert_close(item["boxes"][0], torch.tensor([0.0, 0.0, 32.0, 16.0]))  # 40x20 image -> 32x32
    assert item["gold"].tolist() == [1.0] and item["y"].item() == 0
    assert item["q"][-1].item() == ANSWER and BOS in item["q"].tolist()
    assert item["x"].shape == (3, 32, 32)  # grey files are read as RGB


def test_images_keep_their_colour_and_the_configured_resolution(tmp_path):
    write_root(tmp_path, [GOOD])
    rgb = np.zeros((20, 40, 3), np.uint8)
    rgb[:, :20, 0] = 255  # left half red, right half green
    rgb[:, 20:, 1] = 255
    Image.fromarray(rgb).save(tmp_path / "images" / "a.png")
    dm = EvidenceVQA(root=str(tmp_path), image_size=48)
    dm.setup()
    x = dm.datasets["train"][0]["x"]
    assert x.shape == (3, 48, 48)
    assert x[0, :, :20].min() > 0.99 and x[1, :, :20].max() < 0.01  # red stays red
    assert x[1, :, 28:].min() > 0.99 and x[0, :, 28:].max() < 0.01  # green stays green


def brute_force_vqa_accuracy(pred, answers):
    """The official definition written out: mean over the 10 subsets of 9 humans of min(#matches / 3, 1)."""
    subsets = list(itertools.combinations(range(10), 9))
    return sum(min(sum(answers[i] == pred for i in s) / 3, 1.0) for s in subsets) / len(subsets)


def test_vqa_accuracy_is_the_official_leave_one_out_form():
    raw = ["purse", "Purse.", "a purse", "PURSE", "purse", "purse", "purse", "bag", "Bag", "handbag"]
    answers = [normalize_answer(a) for a in raw]
    assert answers.count("purse") == 7 and answers.count("bag") == 2
    scores = answer_scores(answers)
    # by hand: 1 human -> (9 * 1/3 + 1 * 0) / 10 = 0.3; 2 -> (8 * 2/3 + 2 * 1/3) / 10 = 0.6; 7 -> 1.0
    assert scores["handbag"] == pytest.approx(0.3) and scores["bag"] == pytest.approx(0.6) and scores["purse"] == 1.0
    three = ["red"] * 3 + ["blue"] * 7  # 3 humans: (3 * 2/3 + 7 * 1) / 10 = 0.9, not min(3/3, 1) = 1
    assert answer_scores(three)["red"] == pytest.approx(0.9)
    for a in set(answers) | {"wallet"}:
        assert answer_scores(answers).get(a, 0.0) == pytest.approx(brute_force_vqa_accuracy(a, answers))
    assert majority_answer(answers) == "purse" and majority_answer(["b", "a", "a", "b"]) == "b"  # ties: first given
    assert answer_scores(["shirt"]) == {"shirt": 1.0}  # a single-answer record: exact match


def test_vqa_answer_normalisation():
    assert normalize_answer("The Purse.") == "purse"
    assert normalize_answer("Two") == "2" and normalize_answer("dont") == "don't"
    assert normalize_answer("coca-cola") == "coca cola" and normalize_answer("T-shirt/top") == "t shirt top"
    assert normalize_answer("3.5") == "3.5" and normalize_answer("1,000") == "1000"


def test_label_is_the_majority_answer_and_gold_the_vqa_scores(tmp_path):
    answers = ["bag"] * 2 + ["purse"] * 7 + ["wallet"]
    write_root(tmp_path, [{**GOOD, "answers": answers}])
    dm = EvidenceVQA(root=str(tmp_path), answer_vocab=["bag", "purse", "shoe", "wallet"])
    dm.setup()
    item = dm.datasets["train"][0]
    assert item["y"].item() == 1  # "purse", not answers[0] ("bag")
    torch.testing.assert_close(item["gold"], torch.tensor([0.6, 1.0, 0.0, 0.3]))
    # the vocabulary of a real root: the training split's majority answers, most frequent first
    write_root(tmp_path, [{**GOOD, "answers": answers}, {**GOOD, "answers": ["shoe"]}, {**GOOD, "answers": ["shoe"]}])
    assert EvidenceVQA(root=str(tmp_path)).answer_vocab == ["shoe", "purse"]
    assert EvidenceVQA(root=str(tmp_path), max_answers=1).answer_vocab == ["shoe"]


@pytest.mark.parametrize("bad, problem", [
    ({"evidence_bboxes": [[0, 0, 41, 10]]}, "not inside the 40x20 image"),
    ({"evidence_bboxes": [[5, 5, 5, 10]]}, "not inside"),
    ({"evidence_bboxes": {"x": 1}}, "evidence_bboxes is not a list"),
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
    with pytest.raises(DatasetFormatError, match="val.jsonl:1: not valid JSON.*\n  fix: write one JSON object per line"):
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
        img = np.asarray(Image.open(r["image"]), dtype=np.float32).max(-1) / 255  # brightest channel of the RGB file
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


def test_colour_questions_name_the_colour_the_item_is_drawn_in(tmp_path):
    dm = EvidenceVQA(data_dir=str(tmp_path), num_train=4, num_val=4, num_test=16, question_key="colour", num_items=3)
    dm.prepare_data()
    for r in read_split(dm.path, "test"):
        colour = next(c for c in COLOURS if f" {c} " in f" {r['question']} ")
        img = np.asarray(Image.open(r["image"]).convert("RGB"), dtype=np.float32)
        x0, y0, x1, y1 = (int(v) for v in r["evidence_bboxes"][0])
        lit = img[y0:y1, x0:x1][img[y0:y1, x0:x1].max(-1) > 40]  # the item's drawn pixels
        mean = lit.mean(0) / lit.mean(0).max()
        np.testing.assert_allclose(mean, np.array(COLOURS[colour]) / max(COLOURS[colour]), atol=0.2)


# ---- TextVQA's own files, written here in the published layout ----
def textvqa_question(qid, image_id, question, answers, set_name="train"):
    return {"question": question, "image_id": image_id, "image_classes": ["Poster"], "flickr_original_url": "",
            "flickr_300k_url": "", "image_width": 200, "image_height": 100, "answers": answers,
            "question_tokens": question.split(), "question_id": qid, "set_name": set_name}


def rosetta_token(word, x, y, w, h):
    return {"word": word, "bounding_box": {"top_left_x": x, "top_left_y": y, "width": w, "height": h, "rotation": 0,
                                           "roll": 0, "pitch": 0, "yaw": 0}}


def write_textvqa(root, splits=("train", "val")):
    (root / "train_images").mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((100, 200, 3), 128, np.uint8)).save(root / "train_images" / "abc123.jpg")
    questions = [
        textvqa_question(1, "abc123", "what brand is the drink?", ["coca cola"] * 6 + ["Coca-Cola"] * 2 + ["coke"] * 2),
        textvqa_question(2, "abc123", "what is the price?", ["$5"] * 2 + ["5 dollars"] * 8),  # OCR missed it
        textvqa_question(3, "abc123", "what does the sign say?", ["STOP"] * 10),
    ]
    ocr = {"image_id": "abc123", "ocr_tokens": ["Coca", "Cola", "stop", "x"],
           "ocr_info": [rosetta_token("Coca", 0.1, 0.2, 0.2, 0.1), rosetta_token("Cola", 0.3, 0.2, 0.15, 0.1),
                        rosetta_token("stop", 0.5, 0.5, 0.1, 0.2), rosetta_token("x", 0.9, 0.9, 0.3, 0.3)]}
    for split in splits:
        (root / f"TextVQA_0.5.1_{split}.json").write_text(json.dumps(
            {"dataset_type": split, "dataset_name": "textvqa", "dataset_version": "0.5.1",
             "data": [{**q, "set_name": split} for q in questions]}))
        (root / f"TextVQA_Rosetta_OCR_v0.2_{split}.json").write_text(json.dumps(
            {"dataset_name": "textvqa", "dataset_type": split, "data": [ocr]}))
    return root


def test_textvqa_files_are_read_with_ocr_evidence_and_unanswerable_questions_kept(tmp_path):
    write_textvqa(tmp_path)
    recs = read_split(tmp_path, "train")
    assert [r["question"] for r in recs] == ["what brand is the drink?", "what is the price?", "what does the sign say?"]
    assert recs[0]["image"].endswith("train_images/abc123.jpg") and recs[0]["box_size"] == [200, 100]
    # "coca cola" (8 humans, Coca-Cola normalised) is spelled by the OCR run Coca + Cola: both boxes, in pixels
    np.testing.assert_allclose(recs[0]["evidence_bboxes"], [[20, 20, 60, 30], [60, 20, 90, 30]])
    assert recs[1]["evidence_bboxes"] == []  # no OCR token spells the answers: kept, without evidence
    np.testing.assert_allclose(recs[2]["evidence_bboxes"], [[100, 50, 120, 70]])
    dm = EvidenceVQA(root=str(tmp_path), splits={"test": "val"}, image_size=32, max_question_len=12)
    assert dm.answer_vocab == ["5 dollars", "coca cola", "stop"]  # majority answers, ties alphabetical
    dm.setup()
    item = dm.datasets["test"][1]
    assert (item["boxes"] == -1).all() and item["y"].item() == 0 and item["x"].shape == (3, 32, 32)
    torch.testing.assert_close(item["gold"], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(dm.datasets["test"][0]["boxes"][0], torch.tensor([3.2, 6.4, 9.6, 9.6]))
    torch.testing.assert_close(dm.datasets["test"][0]["gold"], torch.tensor([0.0, 1.0, 0.0]))


def test_textvqa_test_split_without_answers_and_missing_files_are_clear_errors(tmp_path):
    write_textvqa(tmp_path, splits=("train", "val", "test"))
    data = json.loads((tmp_path / "TextVQA_0.5.1_test.json").read_text())
    for q in data["data"]:
        del q["answers"]
    (tmp_path / "TextVQA_0.5.1_test.json").write_text(json.dumps(data))
    with pytest.raises(DatasetFormatError, match=r"(?s)TextVQA_0.5.1_test.json: data\[0\]: no answers.*splits"):
        read_split(tmp_path, "test")
    (tmp_path / "TextVQA_Rosetta_OCR_v0.2_val.json").unlink()
    with pytest.raises(DatasetNotFoundError, match="TextVQA_Rosetta_OCR_v0.2_val.json"):
        read_split(tmp_path, "val")
    (tmp_path / "train_images" / "abc123.jpg").unlink()
    with pytest.raises(DatasetFormatError, match="train_images/abc123.jpg not found"):
        read_split(tmp_path, "train")


def run_cli_on(root, capsys):
    from lit_iclr.cli import main

    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", "tests/configs/vea.yaml", "--data.init_args.root", str(root),
              "--trainer.default_root_dir", str(root / "runs")])
    assert e.value.code == 2
    return capsys.readouterr().err


def test_a_broken_jsonl_line_or_a_corrupt_image_is_one_line_naming_the_file(tmp_path, capsys):
    write_root(tmp_path, [GOOD])
    (tmp_path / "train.jsonl").write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD)[:30] + "\n")
    err = run_cli_on(tmp_path, capsys)
    assert "train.jsonl:2: not valid JSON" in err and "fix: write one JSON object per line" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2  # the problem, then the fix
    write_root(tmp_path, [GOOD])
    (tmp_path / "images" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # a PNG header, no image
    err = run_cli_on(tmp_path, capsys)
    assert "train.jsonl:1: image" in err and "a.png cannot be read" in err and "re-save the image" in err
    assert "Traceback" not in err and "UnidentifiedImageError" in err.splitlines()[0]
