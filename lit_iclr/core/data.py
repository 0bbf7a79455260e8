"""Base DataModule: a `root` for real data, or a seeded default generated into `data/` atomically on first use."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import lightning as L

from .errors import ConfigError, DatasetNotFoundError, write_problem
from .loader import random_state_kept

STALE_FOREIGN_SECONDS = 24 * 3600  # a temporary folder of another host is removed only when this old


def _tmp_tag() -> str:
    return f"{socket.gethostname().split('.')[0]}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def clean_stale_tmp(final: str | Path) -> list[Path]:
    """Remove `.<name>.tmp-[<host>-]<pid>` siblings of `final` left by a killed process (SIGKILL runs no cleanup).

    A folder of this host is stale when its process is gone; one of another host (shared file system) when it is older
    than a day. Returns what was removed.
    """
    final = Path(final)
    pattern = re.compile(rf"^\.{re.escape(final.name)}\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)$")
    here = socket.gethostname().split(".")[0]
    removed = []
    if not final.parent.is_dir():
        return removed
    for p in final.parent.iterdir():
        m = pattern.match(p.name)
        if m is None:
            continue
        host, pid = m.group("host") or here, int(m.group("pid"))
        if host == here:
            stale = pid != os.getpid() and not _alive(pid)
        else:
            try:
                stale = time.time() - p.stat().st_mtime > STALE_FOREIGN_SECONDS
            except FileNotFoundError:
                continue
        if stale:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            removed.append(p)
    return removed


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; rename it to `final` only when the block finishes without error.

    An interrupted generation (crash, Ctrl-C, pre-empted job) leaves no folder at `final`, so a later run never loads a
    half-written dataset: it regenerates instead.
    """
    final = Path(final)
    clean_stale_tmp(final)
    tmp = final.with_name(f".{final.name}.tmp-{_tmp_tag()}")
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
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_dir(path) as tmp, random_state_kept():  # generating leaves the training's random stream as is
                generate(tmp)
        except OSError as e:  # a read-only data/ (or a full disk): one line, and atomic_dir left nothing behind
            problem = write_problem(e)
            if problem is None:
                raise
            raise DatasetNotFoundError(path, f"cannot be generated: {e.filename or path.parent} {problem}",
                                       "set `data.init_args.data_dir` to a writable folder, or `data.init_args.root` "
                                       "to data that is already there") from None
    return path


class BaseDataModule(L.LightningDataModule):
    """Base of every method's DataModule (the CLI's `data` root class).

    Subclasses set `default_name` (folder under `data_dir`), bump `default_version` whenever the generator's output
    changes, list in `content_options` every init argument that changes what the generator writes (the folder name
    carries a hash of their values, so two configs sharing a `data_dir` never read each other's data), and implement
    `generate_default(out_dir)`, which writes the default dataset in the paper's real format.
    Sizes the model needs (number of variables, action dim ...) are attributes set in `__init__` (cheaply, without reading
    the data when possible) and named in `model_links`, never written twice in YAML.
    """

    default_name: ClassVar[str] = ""
    default_version: ClassVar[int] = 1
    # init arguments (attributes of the same name) that shape the generated default's content
    content_options: ClassVar[tuple[str, ...]] = ()
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
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ConfigError(f"data.init_args.batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"data.init_args.num_workers must be >= 0, got {num_workers!r}")
        self.root = root
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.num_workers = num_workers

    @property
    def path(self) -> Path:
        """Where the data is read from: `root`, or the versioned default under `data_dir`."""
        if self.root is not None:
            return Path(self.root).expanduser()
        return self.generated_path(f"{self.default_name}-v{self.default_version}")

    def content_key(self) -> str:
        """Hash of the class, `default_version` and every `content_options` value (10 hex digits)."""
        values: dict[str, Any] = {name: getattr(self, name) for name in self.content_options}
        blob = json.dumps({"class": f"{type(self).__module__}.{type(self).__qualname__}",
                           "version": self.default_version, "options": values}, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:10]

    def generated_path(self, stem: str) -> Path:
        """`data_dir/<stem>-<content_key>`: a readable stem, keyed by everything that shapes the content."""
        return Path(self.data_dir) / (f"{stem}-{self.content_key()}" if self.content_options else stem)

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
