"""Errors that name the file, the problem and the fix, so a user never reads a traceback to learn what is wrong."""
from __future__ import annotations

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
