"""Fashion-MNIST reader (real IDX format, malformed files) and the corruption generator."""
import gzip
import struct

import numpy as np
import pytest
import torch

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError
from lit_iclr.namex.corruptions import CORRUPTIONS, corrupt
from lit_iclr.namex.data import FashionMNISTData


def write_idx(path, array):
    codes = {np.uint8: 0x08}
    header = struct.pack(">BBBB", 0, 0, codes[array.dtype.type], array.ndim) + struct.pack(f">{array.ndim}I",
                                                                                         *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())


def fake_fashion(root, n_train=40, n_test=20, label_max=9, learnable=False):
    """Small IDX files in the real format: noise images with random labels, or (`learnable`) images whose brightness
    is their label (noise in 0..63 plus 20 y), so a short training run has something to learn."""
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, label_max + 1, n).astype(np.uint8)
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        if learnable:
            images = images // 4 + (20 * labels[:, None, None]).astype(np.uint8)
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels)


def test_reads_idx_files_and_builds_splits(tmp_path):
    fake_fashion(tmp_path)
    dm = FashionMNISTData(root=str(tmp_path), train_size=20, val_size=10, test_size=8, batch_size=4,
                          corruptions=["contrast", "gaussian_noise"], severities=[1, 5])
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    assert len(dm.train_set) == 20 and len(dm.val_set) == 10
    batch = next(iter(dm.train_dataloader()))
    assert batch["x"].shape == (4, 1, 28, 28) and batch["x"].max() <= 1.0 and batch["y"].dtype == torch.int64
    assert dm.test_names == ["clean", "contrast/1", "contrast/5", "gaussian_noise/1", "gaussian_noise/5"]
    assert len(dm.test_dataloader()) == 5
    clean, contrast5 = dm.test_sets[0].images, dm.test_sets[2].images
    assert contrast5.std() < 0.2 * clean.std()  # contrast 0.05 really applied


def test_missing_root_names_the_folder(tmp_path):
    dm = FashionMNISTData(root=str(tmp_path / "nope"))
    with pytest.raises(DatasetNotFoundError, match="nope"):
        dm.prepare_data()


def test_truncated_idx_file_names_the_file(tmp_path):
    fake_fashion(tmp_path)
    bad = tmp_path / "train-images-idx3-ubyte.gz"
    raw = gzip.decompress(bad.read_bytes())
    bad.write_bytes(gzip.compress(raw[:-100]))
    dm = FashionMNISTData(root=str(tmp_path))
    with pytest.raises(DatasetFormatError, match="train-images-idx3-ubyte"):
        dm.setup("fit")


def test_labels_out_of_range_are_rejected(tmp_path):
    fake_fashion(tmp_path, label_max=11)
    with pytest.raises(DatasetFormatError, match="outside 0..9"):
        FashionMNISTData(root=str(tmp_path), val_size=5).setup("fit")


def test_unknown_corruption_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown corruptions"):
        FashionMNISTData(corruptions=["fog"])


def test_corruptions_deterministic_clipped_and_monotone_in_severity():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(16, 1, 28, 28, generator=g)
    for name in CORRUPTIONS:
        a, b = corrupt(x, name, 3), corrupt(x, name, 3)
        torch.testing.assert_close(a, b)
        assert a.min() >= 0 and a.max() <= 1
        dist = [(corrupt(x, name, s) - x).abs().mean().item() for s in (1, 3, 5)]
        assert dist[0] < dist[1] < dist[2], name


def test_blur_keeps_constant_images_and_contrast_keeps_the_mean():
    flat = torch.full((2, 1, 28, 28), 0.4)
    torch.testing.assert_close(corrupt(flat, "gaussian_blur", 5), flat)
    x = torch.rand(2, 1, 28, 28)
    torch.testing.assert_close(corrupt(x, "contrast", 2).mean((-1, -2)), x.mean((-1, -2)))
