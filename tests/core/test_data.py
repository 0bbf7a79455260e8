"""Data core: atomic generation, clear errors, the IDX reader on real and malformed files, resumable loader."""
import gzip
import struct

import numpy as np
import pytest
import torch

from lit_iclr.core.data import atomic_dir, ensure_generated
from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError
from lit_iclr.core.idx import FASHION_MNIST_DIR, load_fashion_mnist, read_idx
from lit_iclr.core.loader import EpochShuffleSampler, ResumableDataLoader
from tests.core.toy import ToyData


def test_interrupted_generation_leaves_no_dataset(tmp_path):
    target = tmp_path / "ds-v1"

    def crash(out):
        (out / "half.npz").write_bytes(b"partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_generated(target, crash)
    assert not target.exists() and list(tmp_path.iterdir()) == []
    calls = []
    ensure_generated(target, lambda out: calls.append((out / "ok.txt").write_text("done")))
    ensure_generated(target, lambda out: calls.append("again"))  # complete: not regenerated
    assert (target / "ok.txt").read_text() == "done" and len(calls) == 1


def test_atomic_dir_renames_only_on_success(tmp_path):
    with atomic_dir(tmp_path / "x") as tmp:
        assert tmp != tmp_path / "x" and tmp.exists()
        (tmp / "f").write_text("1")
        assert not (tmp_path / "x").exists()
    assert (tmp_path / "x" / "f").read_text() == "1"


def test_missing_root_error_names_path_and_fix(tmp_path):
    dm = ToyData(root=str(tmp_path / "absent"))
    with pytest.raises(DatasetNotFoundError) as e:
        dm.prepare_data()
    assert str(tmp_path / "absent") in str(e.value) and "fix:" in str(e.value)


def _write_idx(path, array, dtype_code=0x08, truncate=0):
    header = struct.pack(">BBBB", 0, 0, dtype_code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(">u1" if dtype_code == 0x08 else ">i4").tobytes()
    path.write_bytes(data[: len(data) - truncate])


def test_idx_reader_round_trip_and_malformed(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a-idx3-ubyte", arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a-idx3-ubyte"), arr)
    ints = np.array([1, -2, 300], dtype=np.int32)
    _write_idx(tmp_path / "i", ints, dtype_code=0x0C)
    np.testing.assert_array_equal(read_idx(tmp_path / "i"), ints)
    with gzip.open(tmp_path / "g.gz", "wb") as f:
        f.write((tmp_path / "a-idx3-ubyte").read_bytes())
    np.testing.assert_array_equal(read_idx(tmp_path / "g.gz"), arr)

    _write_idx(tmp_path / "t", arr, truncate=5)
    with pytest.raises(DatasetFormatError, match="truncated") as e:
        read_idx(tmp_path / "t")
    assert str(tmp_path / "t") in str(e.value)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(DatasetFormatError, match="bad magic"):
        read_idx(tmp_path / "bad")


@pytest.mark.skipif(not FASHION_MNIST_DIR.exists(), reason="Debian dataset-fashion-mnist not installed")
def test_fashion_mnist_from_debian_package():
    x, y = load_fashion_mnist(split="test")
    assert x.shape == (10000, 28, 28) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == [1000] * 10  # the test split is balanced


def test_epoch_sampler_is_seeded_by_epoch_and_skips():
    s = EpochShuffleSampler(10, shuffle=True, seed=3)
    first = list(s)
    assert sorted(first) == list(range(10)) and list(s) == first
    s.set_epoch(1)
    assert list(s) != first
    s.set_epoch(0)
    s.skip = 4
    assert list(s) == first[4:]
    assert list(s) == first  # skip applies once
    ds = torch.utils.data.TensorDataset(torch.arange(10))
    loader = ResumableDataLoader(ds, batch_size=3, shuffle=False)
    loader.consumed = 2
    fresh = ResumableDataLoader(ds, batch_size=3, shuffle=False)
    fresh.load_state_dict(loader.state_dict())
    assert [b[0].tolist() for b in fresh] == [[6, 7, 8], [9]]


def test_tensor_dict_batches_equal_the_per_sample_collate_in_the_resumable_order():
    from torch.utils.data import default_collate

    from lit_iclr.core.loader import TensorDictDataset, collate_batched

    g = torch.Generator().manual_seed(0)
    tensors = {"x": torch.randn(20, 4, 3, generator=g), "mask": torch.rand(20, 4, generator=g) > 0.5,
               "id": torch.arange(100, 120)}
    ds = TensorDictDataset(tensors, torch.arange(3, 17))
    assert len(ds) == 14 and ds[0]["id"].item() == 103
    fast = ResumableDataLoader(ds, batch_size=4, shuffle=True, seed=5, collate_fn=collate_batched)
    rows = [ds[i] for i in range(len(ds))]  # per-sample dicts (no __getitems__) + default_collate
    slow = ResumableDataLoader(rows, batch_size=4, shuffle=True, seed=5)
    order = list(EpochShuffleSampler(14, shuffle=True, seed=5))
    fast_batches, slow_batches = list(fast), list(slow)
    assert len(fast_batches) == len(slow_batches) == 4
    for k, (a, b) in enumerate(zip(fast_batches, slow_batches, strict=True)):
        assert a.keys() == b.keys() and all(a[n].dtype == b[n].dtype and torch.equal(a[n], b[n]) for n in a)
        assert a["id"].tolist() == [103 + i for i in order[4 * k:4 * k + 4]]
    assert collate_batched([{"x": torch.ones(2)}, {"x": torch.zeros(2)}])["x"].shape == (2, 2)
    assert torch.equal(default_collate([ds[0], ds[1]])["x"], ds.__getitems__([0, 1])["x"])
    with pytest.raises(ValueError, match="different lengths"):
        TensorDictDataset({"a": torch.zeros(3), "b": torch.zeros(4)})
