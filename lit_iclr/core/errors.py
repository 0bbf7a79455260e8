"""Errors that name the file, the problem and the fix, so a user never reads a traceback to learn what is wrong."""
from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path


class LitIclrError(Exception):
    """Base of the platform's user-facing errors: the CLI prints these as one clear message, not a traceback."""


class _PathError(LitIclrError):
    def __init__(self, path: str | Path, problem: str, fix: str):
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"{self.path}: {problem}\n  fix: {fix}")


class DatasetNotFoundError(_PathError, FileNotFoundError):
    """The data a config points at is not there."""


class DatasetFormatError(_PathError, ValueError):
    """The data is there but is not in the format the reader expects (missing key, NaN, wrong shape, bad line ...)."""


class CheckpointError(_PathError, ValueError):
    """A checkpoint that does not belong to the model it is loaded into, or is not a checkpoint at all."""


class ConfigError(LitIclrError, ValueError):
    """A configuration that cannot run (inconsistent values, a launch that does not match the trainer)."""


# errno values that mean "this place cannot be written" (not "this file is missing"): a read-only mount, permissions,
# a full disk or quota
_WRITE_PROBLEMS = {errno.EROFS: "is on a read-only file system", errno.EACCES: "is not writable (permission denied)",
                   errno.EPERM: "is not writable (operation not permitted)", errno.ENOSPC: "has no space left on its device",
                   errno.EDQUOT: "is over its disk quota"}


def write_problem(error: BaseException) -> str | None:
    """What an `OSError` raised by a write says about the place written to ("is on a read-only file system" ...), or
    None for any other error."""
    if isinstance(error, OSError) and error.errno in _WRITE_PROBLEMS:
        return _WRITE_PROBLEMS[error.errno]
    return None


def check_writable(folder: str | Path, fix: str, error: Callable[[Path, str, str], Exception] = DatasetNotFoundError) -> None:
    """Raise `error(folder, problem, fix)` unless a file can be created in `folder` (its nearest existing ancestor when
    it does not exist yet). A probe write, not `os.access`: root passes every permission check, but not a read-only
    mount or a full disk. The probe file is removed."""
    import tempfile

    folder = Path(folder)
    probe_in = folder
    while not probe_in.exists() and probe_in != probe_in.parent:
        probe_in = probe_in.parent
    try:
        fd, name = tempfile.mkstemp(prefix=".write-probe-", dir=probe_in)
    except OSError as e:
        problem = write_problem(e)
        if problem is None:
            raise
        raise error(folder, f"{problem if probe_in == folder else f'cannot be created: {probe_in} ' + problem}", fix) from None
    os.close(fd)
    os.unlink(name)


def run_folder_error(path: str | Path, problem: str, fix: str) -> ConfigError:
    """A `ConfigError` in the one-line shape of the path errors, for a run folder (`check_writable`'s `error`)."""
    return ConfigError(f"{path}: {problem}\n  fix: {fix}")
