"""DataModule of exit tables: `calibration.npz` (policies are fitted on it) and `test.npz` (they are scored on it).

The default is made by real trained networks (`exit_training.py`): a multi-exit timm network (`source: nested`) or a
cascade of timm classifiers of growing size (`source: cascade`) trained with Lightning on Fashion-MNIST.
"""
from __future__ import annotations

from pathlib import Path

from torch.utils.data import DataLoader, Dataset

from lit_iclr.core.data import BaseDataModule
from lit_iclr.core.errors import ConfigError
from lit_iclr.core.loader import ResumableDataLoader

from .exits import KINDS, ExitTable, check_pair, read_exit_table


class _Whole(Dataset):
    """One item: the whole table as a dict of tensors (policies are fitted and scored on a split at once)."""

    def __init__(self, table: ExitTable):
        self.table = table

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> dict:
        t = self.table
        return {"logits": t.logits, "labels": t.labels, "cost": t.cost}


def _first(batch: list[dict]) -> dict:
    return batch[0]


class ExitTableData(BaseDataModule):
    """Exit tables of a multi-exit network or a cascade (real format: see `exits.py`)."""

    default_name = "ttamer-exits"
    default_version = 2  # 2: tables say cost_convention (v1 caches lack it; a rising cost column is refused without it)
    content_options = ("source", "backbones", "train_images", "epochs", "lr", "seed")
    model_links = {"stages": "stages"}

    def __init__(self, root: str | None = None, data_dir: str = "data", source: str = "nested",
                 backbones: list[str] | None = None, train_images: int = 8000, epochs: int = 2, lr: float = 2e-3,
                 seed: int = 0):
        """
        Args:
            root: Folder with `calibration.npz` and `test.npz` exit tables; null trains the default networks.
            data_dir: Cache folder for the generated tables.
            source: `nested` (one timm backbone with an exit after every stage) or `cascade` (separate timm models).
            backbones: timm names: one for `nested` (default test_resnet), the cascade members in order of size for
                `cascade` (default test_convnext, test_resnet, resnet10t).
            train_images: Fashion-MNIST training images the networks learn from.
            epochs: Training epochs of every network.
            lr: AdamW learning rate of every network.
            seed: Seed of the networks' initialisation and data order.
        """
        super().__init__(root, data_dir, batch_size=1, num_workers=0)
        if source not in KINDS:
            raise ConfigError(f"data.init_args.source must be one of {KINDS}, got {source!r}")
        default = ["test_resnet"] if source == "nested" else ["test_convnext", "test_resnet", "resnet10t"]
        self.source, self.backbones = source, list(backbones or default)
        if source == "nested" and len(self.backbones) != 1:
            raise ConfigError("a nested multi-exit network has one backbone; give one name in data.init_args.backbones")
        self.train_images, self.epochs, self.lr, self.seed = train_images, epochs, lr, seed
        # stages, known before anything is generated: 4 exits of the default multi-exit network, one per cascade member,
        # or the user's table (its header only)
        # (a root that is not here, e.g. a cluster path under `cli.py plan`, counts as the source's stages)
        self.stages = (read_exit_table(Path(root) / "calibration.npz").stages
                       if root is not None and Path(root).exists()
                       else 4 if source == "nested" else len(self.backbones))
        self.calibration: ExitTable | None = None
        self.test: ExitTable | None = None

    def generate_default(self, out_dir: Path) -> None:
        from .exit_training import make_tables  # trains networks: imported only when the default is built

        cal, test = make_tables(self.source, self.backbones, self.train_images, self.epochs, self.lr, self.seed)
        cal.save(out_dir / "calibration.npz")
        test.save(out_dir / "test.npz")

    def setup(self, stage: str | None = None) -> None:
        if self.calibration is None:
            self.calibration = read_exit_table(self.path / "calibration.npz")
            self.test = read_exit_table(self.path / "test.npz")
            check_pair(self.calibration, self.test, self.path)

    def train_dataloader(self) -> ResumableDataLoader:
        return ResumableDataLoader(_Whole(self.calibration), batch_size=1, collate_fn=_first)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_Whole(self.test), batch_size=1, collate_fn=_first)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def describe(self) -> str:
        return f"ExitTableData: {self.path} ({self.source}: {', '.join(self.backbones)}; Fashion-MNIST exits)"
