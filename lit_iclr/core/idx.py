"""Reader for the IDX format of (Fashion-)MNIST, gzipped or not, with errors that name the file.

The Debian package `dataset-fashion-mnist` installs the four Fashion-MNIST files under `FASHION_MNIST_DIR`.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from .errors import DatasetFormatError, DatasetNotFoundError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"),
           0x0E: np.dtype(">f8")}


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (magic 0x0000TTNN: type TT, NN dimensions, big-endian uint32 sizes, then the data)."""
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "IDX file not found",
                                   "install Debian's `dataset-fashion-mnist` or point `root` at a folder of IDX files")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DatasetFormatError(path, f"cannot be read ({e})", "re-download or reinstall the file") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise DatasetFormatError(path, "not an IDX file (bad magic number)", "check that the path names an IDX file")
    dtype, ndim = np.dtype(_DTYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetFormatError(path, "truncated IDX header", "re-download or reinstall the file")
    shape = tuple(int(s) for s in np.frombuffer(raw[4:header], dtype=">u4"))
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DatasetFormatError(
            path, f"truncated or padded IDX data: header says shape {shape} ({expected} bytes), file has "
            f"{len(raw) - header} bytes", "re-download or reinstall the file")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def load_fashion_mnist(root: str | Path = FASHION_MNIST_DIR, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and labels (N,) int64 in 0..9 of the `train` or `test` split, from `.gz` or plain IDX
    files."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    prefix = "train" if split == "train" else "t10k"
    root = Path(root)

    def find(stem: str) -> Path:
        for name in (f"{stem}.gz", stem):
            if (root / name).exists():
                return root / name
        raise DatasetNotFoundError(root / f"{stem}.gz", "Fashion-MNIST file not found",
                                   "`apt-get install dataset-fashion-mnist` (the setup command does this) or set `root`")

    images = read_idx(find(f"{prefix}-images-idx3-ubyte"))
    label_file = find(f"{prefix}-labels-idx1-ubyte")
    labels = read_idx(label_file)
    if labels.size and (labels.min() < 0 or labels.max() >= len(FASHION_MNIST_CLASSES)):
        bad = int(np.flatnonzero((labels < 0) | (labels >= len(FASHION_MNIST_CLASSES)))[0])
        raise DatasetFormatError(label_file, f"label {int(labels[bad])} at index {bad} is outside 0..9 (the 10 classes)",
                                 "use Fashion-MNIST's label file (or re-download it)")
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DatasetFormatError(root, f"images {images.shape} and labels {labels.shape} do not match",
                                 "use the image and label files of the same split")
    return images, labels.astype(np.int64)
