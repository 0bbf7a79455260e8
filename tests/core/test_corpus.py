"""Corpus readers, cache build, LM/topic batches and zero-shot choice scoring, on small files in the real formats."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lit_iclr.core.corpus import (
    CorpusDataModule,
    Document,
    read_jsonl_documents,
    read_raw_text,
    render_lm,
    score_choices,
    split_of,
    wikipedia_documents,
    zero_shot_topic_accuracy,
)
from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError
from lit_iclr.core.tokenizer import EOS_ID, PAD_ID, load_tokenizer

TOPICS = ["Animals", "Music", "Space"]
WORDS = {"Animals": "cat dog horse fur tail bark", "Music": "song guitar piano melody rhythm chord",
         "Space": "star planet orbit comet galaxy rocket"}


def _docs(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        topic = TOPICS[i % 3]
        words = WORDS[topic].split()
        text = " ".join(rng.choice(words, size=30)) + "."
        out.append({"title": f"{topic} article {seed}-{i}", "text": text, "topic": topic})
    return out


def _write_root(root: Path) -> None:
    root.mkdir(parents=True)
    for split, n, seed in (("train", 60, 0), ("validation", 9, 1), ("test", 9, 2)):
        with (root / f"{split}.jsonl").open("w") as f:
            for d in _docs(n, seed):
                f.write(json.dumps(d) + "\n")


@pytest.fixture(scope="module")
def small_dm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    _write_root(tmp / "root")
    dm = CorpusDataModule(root=str(tmp / "root"), data_dir=str(tmp / "data"), batch_size=4, seq_len=64,
                          vocab_size=300, topic_docs_per_class=None)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_jsonl_reader_errors_name_file_and_line(tmp_path):
    good = tmp_path / "ok.jsonl"
    good.write_text('{"title": "A", "text": "hello", "topic": null}\n\n{"title": "B", "text": "x", "topic": "T"}\n')
    docs = read_jsonl_documents(good)
    assert [d.title for d in docs] == ["A", "B"] and docs[0].topic is None and docs[1].topic == "T"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "A", "text": "hello"}\n{oops\n')
    with pytest.raises(DatasetFormatError, match=r"bad.jsonl: line 2 is not JSON"):
        read_jsonl_documents(bad)
    notext = tmp_path / "notext.jsonl"
    notext.write_text('{"title": "A", "body": "hello"}\n')
    with pytest.raises(DatasetFormatError, match="line 1 has no string field 'text'"):
        read_jsonl_documents(notext)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DatasetFormatError, match="no documents"):
        read_jsonl_documents(empty)
    with pytest.raises(DatasetNotFoundError, match="missing.jsonl"):
        read_jsonl_documents(tmp_path / "missing.jsonl")


def test_raw_wikitext_reader_splits_articles_at_top_headings(tmp_path):
    raw = tmp_path / "wiki.train.raw"
    raw.write_text(" \n = Valkyria = \n \n First line . \n = = Plot = = \n More text . \n \n = Tower = \n Tall . \n")
    docs = read_raw_text(raw)
    assert [d.title for d in docs] == ["Valkyria", "Tower"]
    assert "= = Plot = =" in docs[0].text and "More text" in docs[0].text and docs[1].text == "Tall ."
    with pytest.raises(DatasetNotFoundError):
        read_raw_text(tmp_path / "wiki.valid.raw")


def test_cache_stream_matches_independent_encoding(small_dm):
    dm = small_dm
    tok = load_tokenizer(dm.path / "tokenizer.json")
    assert tok.get_vocab_size() == 300 and tok.token_to_id("<|endoftext|>") == EOS_ID
    for split in ("train", "test"):
        docs = dm.documents(split)
        expected = []
        for d in docs:
            expected += [EOS_ID, *tok.encode(render_lm(d), add_special_tokens=False).ids]
        stream = np.load(dm.path / f"tokens_{split}.npy")
        np.testing.assert_array_equal(stream, np.array(expected))
        offsets = np.load(dm.path / f"doc_offsets_{split}.npy")
        assert offsets[0, 0] == 0 and offsets[-1, 1] == len(stream) and (offsets[1:, 0] == offsets[:-1, 1]).all()
        assert tok.decode(stream[offsets[0, 0] + 1: offsets[0, 1]].tolist()) == render_lm(docs[0])
    # calib is carved out of train (every 50th document) and never overlaps it
    titles = {d.title for d in dm.documents("train")}
    assert dm.documents("calib") and not titles & {d.title for d in dm.documents("calib")}
    assert not list(dm.path.parent.glob(".*tmp*")), "atomic build left a temporary folder"


def test_lm_batches_are_contiguous_blocks(small_dm):
    dm = small_dm
    stream = np.load(dm.path / "tokens_validation.npy")
    batch = next(iter(dm.val_dataloader()))
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    assert torch.equal(batch["input_ids"], batch["labels"]) and batch["attention_mask"].all()
    np.testing.assert_array_equal(batch["input_ids"][1].numpy(), stream[64:128])
    calib = next(iter(dm.calibration_dataloader(num_sequences=2)))
    calib_stream = np.load(dm.path / "tokens_calib.npy")
    assert calib["input_ids"].shape == (min(2, len(calib_stream) // 64), 64)
    np.testing.assert_array_equal(calib["input_ids"][0].numpy(), calib_stream[:64])


def test_topic_batches_hide_the_topic_line(small_dm):
    dm = small_dm
    assert dm.topic_names == TOPICS and dm.num_topics == 3
    batch = next(iter(dm.topic_dataloader("validation", shuffle=False)))
    docs = dm.documents("validation")
    for i in range(len(batch["topic"])):
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        full = dm.tokenizer.encode(render_lm(docs[i], topic_in_text=False), add_special_tokens=False).ids
        assert ids == [EOS_ID, *full][:64]  # truncated to seq_len
        assert "Topic:" not in dm.tokenizer.decode(ids[1:])
        assert TOPICS[int(batch["topic"][i])] == docs[i].topic
        assert (batch["input_ids"][i][~batch["attention_mask"][i].bool()] == PAD_ID).all()


def test_choice_scoring_equals_explicit_loop(small_dm):
    dm = small_dm
    batch = next(iter(dm.topic_choice_dataloader("test", batch_size=2)))
    b, c, t = batch["input_ids"].shape
    assert c == 3
    docs = dm.documents("test")
    for j, name in enumerate(TOPICS):  # "Topic: <name>\n" then the document, whose tokens are the scored ones
        ids, m = batch["input_ids"][0, j], batch["choice_mask"][0, j].bool()
        first = int(m.nonzero()[0])
        assert ids[0] == EOS_ID and dm.tokenizer.decode(ids[1:first].tolist()) == f"Topic: {name}\n"
        assert render_lm(docs[0], topic_in_text=False).startswith(dm.tokenizer.decode(ids[m].tolist()))
    assert len({int(batch["choice_mask"][0, j].sum()) for j in range(c)}) == 1  # same tokens scored for every topic
    table = torch.randn(300, 300, generator=torch.Generator().manual_seed(0))  # a random bigram "model"

    def logits_fn(ids, mask):
        return table[ids]

    scores = score_choices(logits_fn, batch)
    for i in range(b):
        for j in range(c):
            ids, m = batch["input_ids"][i, j], batch["choice_mask"][i, j]
            ref = sum(float(torch.log_softmax(table[ids[p - 1]], -1)[ids[p]]) for p in range(t) if m[p])
            assert abs(float(scores[i, j]) - ref) < 1e-4

    loader = dm.topic_choice_dataloader("test", batch_size=4)
    assert 0.0 <= zero_shot_topic_accuracy(logits_fn, loader) <= 1.0
    # an "LM" that expects the named topic's keywords after a topic line classifies perfectly
    kw = {name: [dm.tokenizer.encode(f" {w}").ids[0] for w in WORDS[name].split()] for name in TOPICS}
    name_ids = {name: set(dm.tokenizer.encode(f"Topic: {name}\n").ids) for name in TOPICS}

    def keyword_lm(ids, mask):
        out = torch.zeros((*ids.shape, 300))
        for r in range(ids.shape[0]):
            head = set(ids[r, :12].tolist())
            named = max(TOPICS, key=lambda n: len(name_ids[n] & head) - len(name_ids[n]) * 1e-3)
            out[r, :, kw[named]] = 5.0
        return out

    assert zero_shot_topic_accuracy(keyword_lm, loader) == 1.0


def test_vocab_mismatch_and_missing_root_are_clear(small_dm, tmp_path):
    dm2 = CorpusDataModule(root=small_dm.root, data_dir=small_dm.data_dir, seq_len=64, vocab_size=300)
    meta = json.loads((dm2.path / "meta.json").read_text())
    assert meta["vocab_size"] == 300
    missing = CorpusDataModule(root=str(tmp_path / "nope"), data_dir=str(tmp_path))
    with pytest.raises(DatasetNotFoundError, match="corpus root does not exist"):
        missing.prepare_data()
    empty_root = tmp_path / "emptyroot"
    empty_root.mkdir()
    with pytest.raises(DatasetNotFoundError, match="no train.jsonl or wiki.train.raw"):
        CorpusDataModule(root=str(empty_root), data_dir=str(tmp_path / "d")).prepare_data()
    with pytest.raises(ValueError, match="unknown corpus source"):
        CorpusDataModule(sources=["nope"])


def test_installed_wikipedia_has_twelve_topics_and_stable_splits():
    docs = wikipedia_documents()
    assert len(docs) > 9000 and sum(len(d.text) for d in docs) > 4_000_000
    assert len({d.topic for d in docs}) == 12
    splits = [split_of(d.title, d.source) for d in docs]
    assert splits == [split_of(d.title, d.source) for d in docs]
    frac = {s: splits.count(s) / len(splits) for s in ("calib", "validation", "test")}
    assert abs(frac["calib"] - 0.02) < 0.01 and abs(frac["validation"] - 0.04) < 0.01 and abs(frac["test"] - 0.04) < 0.01
    assert isinstance(docs[0], Document)


def test_checkpoint_tokenizer_replaces_the_bpe(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    _write_root(tmp_path / "root")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    texts = [d["text"] for d in _docs(30, 5)]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=280, special_tokens=["<unk>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (tmp_path / "ckpt").mkdir()
    tok.save(str(tmp_path / "ckpt" / "tokenizer.json"))
    dm = CorpusDataModule(root=str(tmp_path / "root"), data_dir=str(tmp_path / "data"), seq_len=64,
                          tokenizer=str(tmp_path / "ckpt"))
    assert dm.vocab_size == tok.get_vocab_size()
    dm.prepare_data()
    dm.setup("fit")
    assert (dm.eos_id, dm.pad_id) == (1, 1)
    stream = np.load(dm.path / "tokens_train.npy")
    first = dm.documents("train")[0]
    assert stream[0] == 1 and list(stream[1: 6]) == tok.encode(render_lm(first)).ids[:5]
    batch = next(iter(dm.topic_dataloader("test", shuffle=False)))
    assert int(batch["input_ids"][0, 0]) == 1
