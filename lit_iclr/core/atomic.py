"""Checkpoints written atomically in their own folder: a kill during the write never leaves a truncated `last.ckpt`.

Lightning's `TorchCheckpointIO` writes through an fsspec transaction, whose temporary file lies in the system's temp
folder: the final move crosses filesystems (a copy, not a rename) on a cluster whose run folders live on a shared disk,
and a job killed during that copy leaves a short `last.ckpt` under the final name. Here the bytes go to
`<name>.tmp-<pid>` beside the target, are flushed to the disk (fsync), and `os.replace` puts them under the final name
in one step; the folder is fsynced so the rename itself survives a power cut. Remote URLs keep Lightning's path.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO


def _is_local(path) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder that cannot be opened (some network filesystems): the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """`torch.save(obj, path)` through `<path>.tmp-<pid>`, fsync and `os.replace`; no partial file on failure."""
    path = Path(str(path).removeprefix("file://"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose local saves are atomic (see module docstring)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if not _is_local(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"`storage_options` is not supported by {type(self).__name__}")
        atomic_torch_save(checkpoint, path)
