"""Readers on small files in the real formats (LRA ListOps tsv, IDX), malformed ones included; the generator."""
import gzip
import random
import struct

import numpy as np
import pytest
import torch

from lit_iclr.aire_prune import ListOpsData, SequentialImageData
from lit_iclr.aire_prune.data import pixel_sequences
from lit_iclr.aire_prune.listops import TOKEN_ID, generate_split_files, generate_tree, read_listops_tsv, to_string
from lit_iclr.core import DatasetFormatError, DatasetNotFoundError


def _evaluate_source(source: str) -> int:
    """Independent evaluator of a ListOps string: a stack machine over the tokens (parentheses ignored)."""
    stack: list = []
    for tok in source.split():
        if tok in ("(", ")"):
            continue
        if tok.startswith("["):
            stack.append([tok])
        elif tok == "]":
            op, *args = stack.pop()
            value = {"[MIN": min(args), "[MAX": max(args), "[SM": sum(args) % 10,
                     "[MED": int(np.median(args))}[op]
            if not stack:
                return value
            stack[-1].append(value)
        elif not stack:
            return int(tok)
        else:
            stack[-1].append(int(tok))
    raise AssertionError("unbalanced source")


def test_generated_listops_targets_match_an_independent_evaluator(tmp_path):
    generate_split_files(tmp_path, 60, 10, 10, max_depth=5, max_args=4, min_length=8, max_length=60, seed=3)
    rows = []
    for split in ("train", "val", "test"):
        lines = (tmp_path / f"basic_{split}.tsv").read_text().splitlines()
        assert lines[0] == "Source\tTarget"
        rows += [line.split("\t") for line in lines[1:]]
    assert len(rows) == 80 and len({r[0] for r in rows}) == 80  # unique, as LRA
    for source, target in rows:
        assert _evaluate_source(source) == int(target)
        n_tokens = sum(t not in ("(", ")") for t in source.split())
        assert 8 < n_tokens < 60
    # the same seed writes the same files
    other = tmp_path / "again"
    other.mkdir()
    generate_split_files(other, 60, 10, 10, max_depth=5, max_args=4, min_length=8, max_length=60, seed=3)
    assert (other / "basic_train.tsv").read_text() == (tmp_path / "basic_train.tsv").read_text()


def test_lra_rendering_and_official_rows_are_read(tmp_path):
    rng = random.Random(0)
    tree = None
    while not isinstance(tree, tuple):
        tree, _ = generate_tree(rng, 1, 3, 3)
    assert to_string(tree).startswith("( ")
    f = tmp_path / "basic_test.tsv"
    # Two rows exactly as in LRA's released basic_test.tsv style: parenthesised, tab, digit.
    f.write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n( ( ( ( [SM 4 ) ( ( [MIN 7 ) 3 ) ] ) ) 8 ) ] )\t5\n")
    seqs, y = read_listops_tsv(f)
    assert y.tolist() == [9, 5]
    assert seqs[0].tolist() == [TOKEN_ID[t] for t in ("[MAX", "2", "9", "]")]
    assert _evaluate_source("( ( ( ( [SM 4 ) ( ( [MIN 7 ) 3 ) ] ) ) 8 ) ] )") == 5


@pytest.mark.parametrize("row,problem", [
    ("( [MAX 2 ] )\t3\textra", "expected 2 tab-separated fields"),
    ("( [MAX 2 ] )\tx", "not a digit"),
    ("( [POW 2 ] )\t3", r"unknown token '\[POW'"),
])
def test_malformed_listops_rows_name_file_and_line(tmp_path, row, problem):
    f = tmp_path / "basic_train.tsv"
    f.write_text(f"Source\tTarget\n( [MIN 1 ] )\t1\n{row}\n")
    with pytest.raises(DatasetFormatError, match=problem) as err:
        read_listops_tsv(f)
    assert err.value.path == f"{f}:3"


def test_listops_bad_header_and_missing_files(tmp_path):
    f = tmp_path / "basic_train.tsv"
    f.write_text("input,label\n[MIN 1 ]\t1\n")
    with pytest.raises(DatasetFormatError, match="header"):
        read_listops_tsv(f)
    dm = ListOpsData(root=str(tmp_path / "nowhere"))
    with pytest.raises(DatasetNotFoundError):
        dm.prepare_data()


def test_listops_datamodule_generates_reads_and_pads(tmp_path):
    dm = ListOpsData(data_dir=str(tmp_path), batch_size=8, num_train=40, num_val=8, num_test=8, max_depth=4,
                     max_args=4, min_length=6, max_length=40)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.path.is_dir() and len(dm.train_set) == 40
    batch = next(iter(dm.train_dataloader()))
    assert batch["x"].shape == batch["x_mask"].shape and batch["x"].dtype.is_floating_point is False
    assert ((batch["x"] == 0) == ~batch["x_mask"]).all()  # padding is id 0, never a real token
    assert "10 classes" in dm.describe()


def _write_idx(path, array, truncate=0):
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    with gzip.open(path, "wb") as f:
        f.write(raw[:len(raw) - truncate])


def test_fashion_mnist_idx_files_and_truncation(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 30), ("t10k", 10)):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    dm = SequentialImageData(root=str(tmp_path), batch_size=4, val_size=6, downsample=4)
    dm.prepare_data()
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (24, 6, 10)
    assert next(iter(dm.train_dataloader()))["x"].shape == (4, 49, 1)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (10, 28, 28)), truncate=100)
    with pytest.raises(DatasetFormatError, match="truncated") as err:
        SequentialImageData(root=str(tmp_path)).setup("fit")
    assert "t10k-images-idx3-ubyte.gz" in str(err.value)


def test_pixel_sequences_pool_row_major():
    img = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    seq = pixel_sequences(img, 2, mean=0.0, std=1.0)
    # 2x2 means of the blocks, read row by row
    np.testing.assert_allclose(seq[0, :, 0], [2.5, 4.5, 10.5, 12.5])


def test_digits_sequences():
    dm = SequentialImageData(dataset="digits", downsample=1, batch_size=16)
    dm.setup("fit")
    assert dm.seq_len == 64
    assert len(dm.train_set) + len(dm.val_set) == 1437 and len(dm.test_set) == 360
    batch = next(iter(dm.val_dataloader()))
    assert batch["x"].shape == (16, 64, 1) and batch["y"].max() < 10


def test_row_sequences_read_one_pooled_row_per_step():
    img = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    seq = pixel_sequences(img, 2, mean=1.0, std=2.0, read_by="row")
    np.testing.assert_allclose(seq[0], (np.array([[2.5, 4.5], [10.5, 12.5]]) - 1.0) / 2.0)
    np.testing.assert_allclose(pixel_sequences(img, 1, 0.0, 1.0, "row")[0], img[0])
    with pytest.raises(ValueError, match="read_by"):
        pixel_sequences(img, 1, 0.0, 1.0, "column")
    dm = SequentialImageData(dataset="digits", downsample=1, batch_size=16, read_by="row")
    dm.setup("fit")
    assert (dm.seq_len, dm.d_input) == (8, 8)
    assert next(iter(dm.val_dataloader()))["x"].shape == (16, 8, 8)


def test_listops_logits_of_a_sample_do_not_depend_on_its_batch(tmp_path):
    """A bidirectional S4D's backward scan reaches a token from the padding after it, so padding to the batch's longest
    gave a sample other logits next to a longer sequence (and, under DDP, a rank's half of the global batch other
    gradients than one process: 8e-3 apart after one Adam step). Padded to the dataset's longest sequence (S5's fixed
    seq_len), its logits are those it has alone."""
    from lit_iclr.aire_prune.data import collate_tokens
    from lit_iclr.aire_prune.model import SSMClassifier

    dm = ListOpsData(data_dir=str(tmp_path), batch_size=8, num_train=40, num_val=8, num_test=8, max_depth=4,
                     max_args=4, min_length=6, max_length=40)
    dm.prepare_data()
    dm.setup("fit")
    items = sorted((dm.train_set[i] for i in range(len(dm.train_set))), key=lambda it: len(it[0]))
    short, long = items[0], items[-1]
    assert len(short[0]) < len(long[0]) <= dm.seq_len
    torch.manual_seed(0)
    model = SSMClassifier("s4d", vocab_size=dm.vocab_size, d_model=8, n_layers=2, state_size=4, bidirectional=True,
                          dropout=0.0).eval()
    for p in model.parameters():  # trained-like LayerNorm biases: padded steps are not zero after the first norm
        p.data.add_(0.1 * torch.randn_like(p))

    def logits(batch):
        return model(batch["x"], batch["x_mask"])[0]

    alone, beside = logits(dm.collate([short])), logits(dm.collate([short, long]))
    torch.testing.assert_close(alone, beside, rtol=1e-5, atol=1e-6)
    assert dm.collate([short])["x"].shape[1] == dm.seq_len
    # padded to each batch's longest (the old collate), the same sample's logits differ
    assert (logits(collate_tokens([short])) - logits(collate_tokens([short, long]))).abs().max() > 1e-4
