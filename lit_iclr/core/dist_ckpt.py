"""Distributed (sharded) checkpoints written by FSDP2 runs (Lightning's ModelParallelStrategy, torch.distributed.checkpoint).

Such a checkpoint is a folder (named like a file, e.g. `last.ckpt/`) holding one shard file per rank, DCP's `.metadata`
and Lightning's `meta.pt` (everything but the weights and optimizer state: step, loops, callbacks, hyperparameters).
`read_distributed_checkpoint(path)` consolidates it, in one process and without a process group, into the same
dictionary `hub.read_checkpoint` returns for a `.ckpt` file (full, unsharded tensors under `state_dict`), so hub export
writes one consolidated safetensors file. Nothing is unpickled beyond `weights_only=True`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError

META = "meta.pt"


def is_distributed_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / ".metadata").is_file() and (path / META).is_file()


def read_distributed_checkpoint(path: str | Path, optimizer: bool = False) -> dict[str, Any]:
    """The consolidated checkpoint: `meta.pt`'s entries plus `state_dict` of full tensors (and `optimizer_states`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = Path(path)
    if not is_distributed_checkpoint(path):
        raise CheckpointError(path, "is not a distributed checkpoint folder (no .metadata and meta.pt)",
                              "pass a folder written by a run with configs/trainer/fsdp.yaml, or a .ckpt file")
    try:
        meta = torch.load(path / META, map_location="cpu", weights_only=True)
        layout = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as e:  # noqa: BLE001 - any failure to read means the same thing to the user
        raise CheckpointError(path, f"cannot be read safely ({type(e).__name__}: {str(e).splitlines()[0][:200]})",
                              "re-save the checkpoint; only tensors and plain values are accepted") from e
    wanted = ("state_dict.",) + (("optimizer_",) if optimizer else ())
    flat = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in layout.items()
            if isinstance(m, TensorStorageMetadata) and k.startswith(wanted)}
    if not any(k.startswith("state_dict.") for k in flat):
        raise CheckpointError(path, "holds no model weights (no state_dict.* tensors)", "pass a checkpoint written by fit")
    dcp.load(flat, checkpoint_id=str(path), no_dist=True) if _accepts_no_dist(dcp.load) else dcp.load(
        flat, checkpoint_id=str(path))
    meta["state_dict"] = {k[len("state_dict."):]: v for k, v in flat.items() if k.startswith("state_dict.")}
    if optimizer:
        meta["optimizer_states"] = {k: v for k, v in flat.items() if k.startswith("optimizer_")}
    return meta


def _accepts_no_dist(fn) -> bool:
    import inspect

    return "no_dist" in inspect.signature(fn).parameters
