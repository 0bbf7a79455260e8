"""Base DataModule: a `root` for real data, or a seeded default generated into `data/` atomically on first use."""
from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import lightning as L

from .errors import DatasetNotFoundError


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; rename it to `final` only when the block finishes without error.

    An interrupted generation (crash, Ctrl-C, pre-empted job) leaves no folder at `final`, so a later run never loads a
    half-written dataset: it regenerates instead.
    """
    final = Path(final)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if final.exists():  # another process finished first; keep theirs
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_generated(path: str | Path, generate: Callable[[Path], None]) -> Path:
    """Run `generate(tmp_dir)` unless `path` already holds a complete dataset; return `path`."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_dir(path) as tmp:
            generate(tmp)
    return path


class BaseDataModule(L.LightningDataModule):
    """Base of every method's DataModule (the CLI's `data` root class).

    Subclasses set `default_name` (folder under `data_dir`), bump `default_version` whenever the generator's output
    changes, and implement `generate_default(out_dir)`, which writes the default dataset in the paper's real format.
    Sizes the model needs (number of variables, action dim ...) are attributes set in `__init__` (cheaply, without reading
    the data when possible) and named in `model_links`, never written twice in YAML.
    """

    default_name: ClassVar[str] = ""
    default_version: ClassVar[int] = 1
    # Sizes the data decides, passed to the model at instantiation: {datamodule attribute: model init argument}.
    model_links: ClassVar[dict[str, str]] = {}

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 32, num_workers: int = 0):
        """
        Args:
            root: Folder or file of real data in the paper's format; null uses the generated default.
            data_dir: Cache folder where the generated default dataset is written.
            batch_size: Samples per batch (per device).
            num_workers: DataLoader worker processes.
        """
        super().__init__()
        self.root = root
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.num_workers = num_workers

    @property
    def path(self) -> Path:
        """Where the data is read from: `root`, or the versioned default under `data_dir`."""
        if self.root is not None:
            return Path(self.root).expanduser()
        return Path(self.data_dir) / f"{self.default_name}-v{self.default_version}"

    def prepare_data(self) -> None:
        """Generate the default dataset (rank 0 only, atomically) or check that `root` exists."""
        if self.root is not None:
            if not self.path.exists():
                raise DatasetNotFoundError(
                    self.path,
                    "the data root does not exist",
                    "set `data.init_args.root` to the folder holding the real data, or to null for the generated default",
                )
            return
        ensure_generated(self.path, self.generate_default)

    def generate_default(self, out_dir: Path) -> None:
        """Write the default dataset into `out_dir` (a fresh folder renamed into place when this returns)."""
        raise NotImplementedError(f"{type(self).__name__} has no default generator; set `data.init_args.root`")

    def describe(self) -> str:
        """One paragraph for `cli.py prepare`: where the data is and what it holds."""
        return f"{type(self).__name__}: {self.path}"
