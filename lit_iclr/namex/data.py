"""DataModules of NAMEx's settings.

`FashionMNISTData`: image classification on the real Fashion-MNIST IDX files (Debian `dataset-fashion-mnist`), read by
`lit_iclr.core.idx`, with a zero-shot corruption-robustness test set generated from the real test images
(`corruptions.py`, ImageNet-C style).

Language modelling uses the platform's `lit_iclr.core.corpus.CorpusDataModule` directly; `CorpusTopicData` serves the
same corpus as topic-classification batches (its 12 Wikipedia topics).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core import BaseDataModule, DatasetFormatError
from lit_iclr.core.corpus import CorpusDataModule
from lit_iclr.core.idx import FASHION_MNIST_CLASSES, FASHION_MNIST_DIR, load_fashion_mnist
from lit_iclr.core.loader import ResumableDataLoader

from .corruptions import CORRUPTIONS, SEVERITIES, corrupt


class ImageDataset(Dataset):
    """Dict samples {"x": (1, H, W) float in [0, 1], "y": label} from tensors already in memory."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.images[i], "y": self.labels[i]}


def to_float_images(images: np.ndarray, path: Path) -> torch.Tensor:
    """uint8 (N, H, W) -> float (N, 1, H, W) in [0, 1]; rejects empty or non-square image stacks."""
    if images.ndim != 3 or len(images) == 0 or images.shape[1] != images.shape[2]:
        raise DatasetFormatError(path, f"expected a non-empty stack of square images, got shape {images.shape}",
                                 "point `root` at Fashion-MNIST-style IDX image files (N, 28, 28)")
    return torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)


class FashionMNISTData(BaseDataModule):
    """Fashion-MNIST (real IDX files) with a held-out validation split and ImageNet-C-style corrupted test sets."""

    default_name = "fashion-mnist"
    model_links = {"num_classes": "num_classes", "img_size": "img_size"}

    def __init__(self, root: str | None = str(FASHION_MNIST_DIR), data_dir: str = "data", batch_size: int = 64,
                 num_workers: int = 0, train_size: int | None = 10000, val_size: int = 2000,
                 test_size: int | None = 2000, corruptions: list[str] | None = None,
                 severities: list[int] | None = None, split_seed: int = 0):
        """
        Args:
            root: Folder with the four Fashion-MNIST IDX files (`*-idx3-ubyte[.gz]`); Debian installs them here.
            data_dir: Unused (the data ships with the system package); kept for the common DataModule interface.
            batch_size: Images per batch.
            num_workers: DataLoader workers.
            train_size: Training images drawn (seeded) from the 60k training split (null: all but the validation ones).
            val_size: Training-split images held out for validation.
            test_size: Test images used, clean and under every corruption (null: all 10k).
            corruptions: Corruption names for the zero-shot robustness test (null: all of corruptions.CORRUPTIONS).
            severities: Severities 1-5 evaluated per corruption (null: 1, 3, 5).
            split_seed: Seed of the train/validation/test subset draw.
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.train_size, self.val_size, self.test_size, self.split_seed = train_size, val_size, test_size, split_seed
        self.corruptions = list(corruptions if corruptions is not None else CORRUPTIONS)
        self.severities = list(severities if severities is not None else (1, 3, 5))
        unknown = [c for c in self.corruptions if c not in CORRUPTIONS]
        bad = [s for s in self.severities if s not in SEVERITIES]
        if unknown or bad:
            raise ValueError(f"unknown corruptions {unknown} or severities {bad}; known: {list(CORRUPTIONS)}, 1-5")
        self.num_classes, self.img_size = len(FASHION_MNIST_CLASSES), 28
        self.test_names: list[str] = []

    def setup(self, stage: str) -> None:
        rng = np.random.default_rng(self.split_seed)
        if stage in ("fit", "validate"):
            images, labels = load_fashion_mnist(self.path, "train")
            x, y = to_float_images(images, self.path), torch.from_numpy(labels)
            self._check(x, y)
            order = torch.from_numpy(rng.permutation(len(y)))
            val, rest = order[: self.val_size], order[self.val_size:]
            train = rest if self.train_size is None else rest[: self.train_size]
            self.train_set, self.val_set = ImageDataset(x[train], y[train]), ImageDataset(x[val], y[val])
        if stage in ("test", "predict"):
            images, labels = load_fashion_mnist(self.path, "test")
            x, y = to_float_images(images, self.path), torch.from_numpy(labels)
            self._check(x, y)
            keep = torch.from_numpy(rng.permutation(len(y))[: self.test_size or len(y)])
            x, y = x[keep], y[keep]
            self.test_names = ["clean"] + [f"{c}/{s}" for c in self.corruptions for s in self.severities]
            self.test_sets = [ImageDataset(x, y)] + [ImageDataset(corrupt(x, c, s, self.split_seed), y)
                                                     for c in self.corruptions for s in self.severities]

    def _check(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if tuple(x.shape[-2:]) != (self.img_size, self.img_size):
            raise DatasetFormatError(self.path, f"images are {tuple(x.shape[-2:])}, expected 28 x 28",
                                     "use Fashion-MNIST IDX files (or set the model's img_size accordingly)")
        if y.min() < 0 or y.max() >= self.num_classes:
            raise DatasetFormatError(self.path, f"labels outside 0..{self.num_classes - 1}",
                                     "check that the label files belong to Fashion-MNIST")

    def _loader(self, ds: Dataset) -> DataLoader:
        return DataLoader(ds, batch_size=self.batch_size, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return ResumableDataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, seed=self.split_seed,
                                   num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def test_dataloader(self) -> list[DataLoader]:
        return [self._loader(ds) for ds in self.test_sets]

    def describe(self) -> str:
        return (f"Fashion-MNIST IDX files in {self.path}: {self.train_size or 'all'} training / {self.val_size} "
                f"validation images; test on {self.test_size or 10000} images, clean and under "
                f"{len(self.corruptions)} corruptions x severities {self.severities} (zero-shot).")


class CorpusTopicData(CorpusDataModule):
    """The platform's offline Wikipedia corpus (`lit_iclr.core.corpus`) served as topic-classification batches.

    Train / validation / test are the corpus' own hash splits; `train_per_class` caps the training documents per topic
    (the 12 topics are unbalanced and the CPU budget small), evaluation uses every labelled document of its split.
    """

    # Linked from an attribute only this class has: `num_topics` itself also exists on CorpusDataModule, whose link
    # would then reach language models, which have no such argument.
    model_links = {"vocab_size": "vocab_size", "topic_label_count": "num_topics"}

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 32, num_workers: int = 0,
                 seq_len: int = 128, vocab_size: int = 4096, sources: list[str] | None = None,
                 train_per_class: int | None = 150, eval_per_class: int | None = None, seed: int = 0):
        """
        Args:
            root: Your own corpus folder (see CorpusDataModule); null: the installed Wikipedia leads.
            data_dir: Cache folder of the tokenised corpus.
            batch_size: Documents per batch.
            num_workers: DataLoader workers (unused: documents are tokenised in memory).
            seq_len: Tokens kept per document.
            vocab_size: BPE vocabulary size (linked to the model).
            sources: Installed corpora (only "wikipedia" has topics).
            train_per_class: Training documents per topic (null: all).
            eval_per_class: Validation/test documents per topic (null: all).
            seed: Shuffle seed.
        """
        super().__init__(root, data_dir, batch_size, num_workers, seq_len, vocab_size, sources, seed=seed)
        self.train_per_class, self.eval_per_class = train_per_class, eval_per_class

    @property
    def topic_label_count(self) -> int:
        """Number of topic labels (reads the corpus cache's topics.json, building the cache on first use)."""
        return self.num_topics

    def train_dataloader(self) -> DataLoader:
        return self.topic_dataloader("train", per_class=self.train_per_class, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.topic_dataloader("validation", per_class=self.eval_per_class, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.topic_dataloader("test", per_class=self.eval_per_class, shuffle=False)
