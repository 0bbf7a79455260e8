"""Sequence-classification data for AIRE-Prune: pixel sequences (Fashion-MNIST, sklearn digits) and LRA ListOps.

Batches are dicts: `x` (B, L, 1) float pixels or (B, L) int64 tokens, `x_mask` (B, L) bool for padded token
sequences, `y` (B,) int64.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core import BaseDataModule, DatasetNotFoundError
from lit_iclr.core.idx import FASHION_MNIST_DIR, load_fashion_mnist
from lit_iclr.core.loader import ResumableDataLoader

from .listops import NUM_CLASSES, VOCAB, generate_split_files, read_listops_tsv


class _Seqs(Dataset):
    def __init__(self, x: list[np.ndarray] | np.ndarray, y: np.ndarray):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def collate_pixels(items) -> dict[str, torch.Tensor]:
    x = torch.from_numpy(np.stack([a for a, _ in items]))
    return {"x": x, "y": torch.tensor([b for _, b in items], dtype=torch.long)}


def collate_tokens(items, length: int | None = None) -> dict[str, torch.Tensor]:
    """Pad token sequences at the end with id 0 to `length` (default: the batch's longest); x_mask marks the real tokens.

    A bidirectional SSM's backward scan reaches a real token from the padding after it (in every layer after the
    first, where the padded steps are no longer zero), so a sample's logits depend on how far its batch is padded.
    `ListOpsData` pads every batch to the dataset's longest sequence, as S5 pads every batch to the fixed `seq_len`
    (lindermanlab/S5 `s5/train_helpers.py`, `prep_batch`): a sample's logits are then the same in any batch, and under
    DDP a rank's share of the global batch is padded as the whole batch is on one process.
    """
    longest = max(len(a) for a, _ in items)
    length = longest if length is None else length
    if longest > length:
        raise ValueError(f"a sequence of {longest} tokens does not fit the padded length {length}")
    x = torch.zeros(len(items), length, dtype=torch.long)
    mask = torch.zeros(len(items), length, dtype=torch.bool)
    for i, (a, _) in enumerate(items):
        x[i, :len(a)] = torch.from_numpy(a)
        mask[i, :len(a)] = True
    return {"x": x, "x_mask": mask, "y": torch.tensor([b for _, b in items], dtype=torch.long)}


def pixel_sequences(images: np.ndarray, downsample: int, mean: float, std: float, read_by: str = "pixel") -> np.ndarray:
    """(N, S, S) images -> float32 sequences, d x d average-pooled and standardised: `pixel` reads them pixel by pixel,
    row-major, (N, (S/d)^2, 1); `row` reads one row per step, (N, S/d, S/d)."""
    n, s, _ = images.shape
    if s % downsample:
        raise ValueError(f"downsample {downsample} does not divide the image size {s}")
    if read_by not in ("pixel", "row"):
        raise ValueError(f"read_by must be 'pixel' or 'row', got {read_by!r}")
    im = images.astype(np.float32).reshape(n, s // downsample, downsample, s // downsample, downsample).mean((2, 4))
    seq = im.reshape(n, -1, 1) if read_by == "pixel" else im
    return ((seq - mean) / std).astype(np.float32)


class _SeqDataModule(BaseDataModule):
    # One map for both DataModules: the CLI merges every DataModule's links.
    model_links = {"d_input": "d_input", "vocab_size": "vocab_size", "num_classes": "num_classes"}

    def _loader(self, ds: Dataset, shuffle: bool) -> DataLoader:
        return DataLoader(ds, batch_size=self.batch_size, shuffle=shuffle, num_workers=self.num_workers,
                          collate_fn=self.collate)

    def train_dataloader(self) -> DataLoader:
        # resumable: `--ckpt_path last` continues mid-epoch on the same batches (seeded by seed_everything)
        return ResumableDataLoader(self.train_set, batch_size=self.batch_size, shuffle=True,
                                   num_workers=self.num_workers, collate_fn=self.collate)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, False)


class SequentialImageData(_SeqDataModule):
    """Images read pixel by pixel: sequential Fashion-MNIST (Debian's IDX files) or sklearn's 8x8 digits."""

    default_name = "fashion-mnist"

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 64, num_workers: int = 0,
                 dataset: str = "fashion_mnist", downsample: int = 2, train_size: int | None = None,
                 val_size: int = 5000, test_size: int | None = None, seed: int = 0, read_by: str = "pixel"):
        """
        Args:
            root: Folder of the four Fashion-MNIST IDX files (.gz or plain); null: Debian's /usr/share/datasets/fashion-mnist.
            data_dir: Unused (the data ships with Debian or sklearn); kept for the common DataModule signature.
            batch_size: Sequences per batch.
            num_workers: DataLoader workers.
            dataset: "fashion_mnist" (28x28, 60k/10k) or "digits" (sklearn, 8x8, 1797 images).
            downsample: Average-pool factor d: sequences have (28/d)^2 steps (2 -> 196). Digits use 1 (64 steps).
            train_size: Use only the first N shuffled training images (null: all but the validation ones).
            val_size: Images held out of the training split for validation (digits: a fifth of its training part).
            test_size: Use only the first N test images (null: the whole test split).
            seed: Seed of the train/validation split.
            read_by: "pixel": one pixel per step ((S/d)^2 steps of 1 feature); "row": one image row per step
                (S/d steps of S/d features, sequential row-wise images).
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        if dataset not in ("fashion_mnist", "digits"):
            raise ValueError(f"dataset must be 'fashion_mnist' or 'digits', got {dataset!r}")
        if read_by not in ("pixel", "row"):
            raise ValueError(f"read_by must be 'pixel' or 'row', got {read_by!r}")
        self.dataset, self.downsample, self.read_by = dataset, downsample, read_by
        self.train_size, self.val_size, self.test_size, self.seed = train_size, val_size, test_size, seed
        side = (28 if dataset == "fashion_mnist" else 8) // downsample
        self.d_input, self.vocab_size, self.num_classes = (1 if read_by == "pixel" else side), 0, 10
        self.collate = collate_pixels

    @property
    def path(self) -> Path:
        return Path(self.root).expanduser() if self.root is not None else FASHION_MNIST_DIR

    @property
    def seq_len(self) -> int:
        side = (28 if self.dataset == "fashion_mnist" else 8) // self.downsample
        return side**2 if self.read_by == "pixel" else side

    def prepare_data(self) -> None:
        if self.dataset == "fashion_mnist" and not self.path.exists():
            raise DatasetNotFoundError(self.path, "Fashion-MNIST folder not found",
                                       "`apt-get install dataset-fashion-mnist` or set `data.init_args.root`")

    def _load(self):
        if self.dataset == "digits":
            from sklearn.datasets import load_digits

            d = load_digits()
            images, labels = (d.images * (255.0 / 16.0)).astype(np.float32), d.target.astype(np.int64)
            perm = np.random.default_rng(1234).permutation(len(labels))  # fixed train/test split: 1437 / 360
            tr, te = perm[:1437], perm[1437:]
            return images[tr], labels[tr], images[te], labels[te]
        xtr, ytr = load_fashion_mnist(self.path, "train")
        xte, yte = load_fashion_mnist(self.path, "test")
        return xtr, ytr, xte, yte

    def setup(self, stage: str | None = None) -> None:
        if getattr(self, "train_set", None) is not None:
            return
        xtr, ytr, xte, yte = self._load()
        mean, std = 0.2860 * 255, 0.3530 * 255  # Fashion-MNIST pixel statistics (digits use the same scaling)
        xtr = pixel_sequences(xtr, self.downsample, mean, std, self.read_by)
        xte = pixel_sequences(xte, self.downsample, mean, std, self.read_by)
        perm = np.random.default_rng(self.seed).permutation(len(ytr))
        n_val = len(ytr) // 5 if self.dataset == "digits" else self.val_size
        val, train = perm[:n_val], perm[n_val:]
        if self.train_size is not None:
            train = train[:self.train_size]
        n_test = len(yte) if self.test_size is None else self.test_size
        self.train_set = _Seqs(xtr[train], ytr[train])
        self.val_set = _Seqs(xtr[val], ytr[val])
        self.test_set = _Seqs(xte[:n_test], yte[:n_test])

    def describe(self) -> str:
        sizes = f"{len(self.train_set)}/{len(self.val_set)}/{len(self.test_set)} train/val/test"
        where = "sklearn.datasets.load_digits" if self.dataset == "digits" else str(self.path)
        return (f"Sequential {self.dataset} from {where}: {sizes} sequences of {self.seq_len} "
                f"{'pixels' if self.read_by == 'pixel' else 'rows'} "
                f"(downsample {self.downsample}), 10 classes.")


class ListOpsData(_SeqDataModule):
    """LRA ListOps: reads `basic_{train,val,test}.tsv` from `root`, or generates them with LRA's generator."""

    default_name = "listops"
    default_version = 1
    content_options = ("num_train", "num_val", "num_test", "max_depth", "max_args", "min_length", "max_length", "seed")

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 64, num_workers: int = 0,
                 num_train: int = 10000, num_val: int = 1000, num_test: int = 1000, max_depth: int = 6,
                 max_args: int = 5, min_length: int = 20, max_length: int = 100, max_len: int | None = 2048,
                 seed: int = 0):
        """
        Args:
            root: Folder with LRA's basic_{train,val,test}.tsv; null: the generated default under data_dir.
            data_dir: Cache folder of the generated default.
            batch_size: Sequences per batch.
            num_workers: DataLoader workers.
            num_train: Generated training examples (LRA: 96000).
            num_val: Generated validation examples (LRA: 2000).
            num_test: Generated test examples (LRA: 2000).
            max_depth: Tree depth limit of the generator (LRA: 10).
            max_args: Arguments per operator at most (LRA: 10).
            min_length: Examples must be longer than this many tokens (LRA: 500).
            max_length: ... and shorter than this (LRA: 2000).
            max_len: Truncate sources read from files to this many tokens (LRA models use 2048; null: no limit).
            seed: Generator seed.
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.num_train, self.num_val, self.num_test = num_train, num_val, num_test
        self.max_depth, self.max_args, self.min_length, self.max_length = max_depth, max_args, min_length, max_length
        self.max_len, self.seed = max_len, seed
        self.d_input, self.vocab_size, self.num_classes = 1, len(VOCAB), NUM_CLASSES
        self.collate = collate_tokens

    @property
    def path(self) -> Path:
        if self.root is not None:
            return Path(self.root).expanduser()
        # The generator's settings are part of the folder name, so changing them never reads stale files.
        tag = (f"{self.num_train}-{self.num_val}-{self.num_test}-d{self.max_depth}-a{self.max_args}"
               f"-l{self.min_length}-{self.max_length}-s{self.seed}")
        return self.generated_path(f"{self.default_name}-v{self.default_version}-{tag}")

    def generate_default(self, out_dir: Path) -> None:
        generate_split_files(out_dir, self.num_train, self.num_val, self.num_test, self.max_depth, self.max_args,
                             self.min_length, self.max_length, self.seed)

    def setup(self, stage: str | None = None) -> None:
        if getattr(self, "train_set", None) is not None:
            return
        sets = {}
        for split in ("train", "val", "test"):
            x, y = read_listops_tsv(self.path / f"basic_{split}.tsv", self.max_len)
            sets[split] = _Seqs(x, y)
        self.train_set, self.val_set, self.test_set = sets["train"], sets["val"], sets["test"]
        # every batch padded to the longest sequence of all splits (S5's fixed seq_len; see `collate_tokens`)
        self.seq_len = max(len(a) for split in sets.values() for a in split.x)
        self.collate = partial(collate_tokens, length=self.seq_len)

    def describe(self) -> str:
        lengths = [len(s) for s in self.train_set.x]
        return (f"LRA ListOps from {self.path}: {len(self.train_set)}/{len(self.val_set)}/{len(self.test_set)} "
                f"train/val/test, {min(lengths)}-{max(lengths)} tokens (median {int(np.median(lengths))}), "
                f"vocabulary {len(VOCAB)}, 10 classes.")
