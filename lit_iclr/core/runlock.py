"""One writer per run folder: an exclusive `flock` on `<run>/.lock`, held while the process trains there.

Two concurrent `fit --ckpt_path last` of one config would otherwise both resume the newest folder (rows logged twice,
two event files, `last-v1.ckpt`). The lock belongs to the open file, so the OS releases it when the process ends,
however it ends (a crash or SIGKILL leaves no stale lock). The holder writes its pid and host into the file, so the
second process can say who has the folder. Only the first rank of a job locks (DDP's other ranks write into the
folder of their rank 0). Re-entrant within one process: a test or notebook may fit the same folder again.
"""
from __future__ import annotations

import fcntl
import os
import platform
from pathlib import Path

from .errors import ConfigError

LOCK = ".lock"
_held: dict[Path, int] = {}  # resolved run folder -> open file descriptor holding the lock


def is_first_rank(env: dict[str, str] | None = None) -> bool:
    """True unless this process is a non-zero rank of a distributed job (torchrun, SLURM srun, Lightning's launcher)."""
    env = os.environ if env is None else env
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK"):
        if env.get(key, "0").strip() not in ("", "0"):
            return False
    return True


def lock_run_dir(run: str | Path) -> None:
    """Take the exclusive lock on `run` for this process, or raise `ConfigError` naming the holder's pid."""
    if not is_first_rank():
        return
    run = Path(run).resolve()
    if run in _held:
        return
    run.mkdir(parents=True, exist_ok=True)
    fd = os.open(run / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown pid"
        os.close(fd)
        raise ConfigError(f"run folder {run} is in use by another process ({holder}); wait for it to end, or start a "
                          "new run (without --ckpt_path last) or pass another --trainer.default_root_dir") from None
    except OSError as e:  # a filesystem without locks: say so once and go on unlocked
        os.close(fd)
        print(f"lit-iclr: warning: cannot lock {run} ({e.strerror}); concurrent runs in it are not prevented")
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {platform.node()}\n".encode(), 0)
    _held[run] = fd


def unlock_run_dir(run: str | Path) -> None:
    """Release this process's lock on `run` (the OS does so anyway when the process ends)."""
    fd = _held.pop(Path(run).resolve(), None)
    if fd is not None:
        os.close(fd)
