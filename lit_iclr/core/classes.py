"""The one allow-list for classes named inside files (a checkpoint, a hub config, a trajectory folder).

Importing a module runs its code, and calling a class named by a file runs whatever that class does (a checkpoint naming
`subprocess.Popen` with `{"args": ..., "shell": true}` runs a shell command). So a name read from a file is first
checked as a string, with nothing imported: it must be a dotted path under `lit_iclr.` (or a prefix the user trusts
through `LIT_ICLR_TRUSTED_MODULES`), and a `lit_iclr.<package>.` path must name a method package of the registry or
`core`. Only then is its module imported (inside the allowed prefix), and the object must be a class defined there
that subclasses the expected base. The CLI's `--ckpt_path` check, `hub load` and the trajectory sampler all use it.
"""
from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import CheckpointError

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
TRUST_FIX = "to trust another package, add its prefix to LIT_ICLR_TRUSTED_MODULES"


def trusted_prefixes() -> tuple[str, ...]:
    """`lit_iclr.` and the prefixes the user lists in LIT_ICLR_TRUSTED_MODULES (comma-separated)."""
    extra = [p.strip() for p in os.environ.get("LIT_ICLR_TRUSTED_MODULES", "").split(",") if p.strip()]
    return ("lit_iclr.", *(p if p.endswith(".") else p + "." for p in extra))


def refusal(name: Any) -> str | None:
    """Why the name may not be imported (None when it may), from the string alone: nothing is imported here."""
    if not isinstance(name, str) or not _DOTTED.fullmatch(name):
        return "not a dotted class path"
    prefixes = trusted_prefixes()
    if not name.startswith(prefixes):
        return "outside lit_iclr., and only lit-iclr classes are loaded from files"
    if name.startswith("lit_iclr.") and not any(name.startswith(p) for p in prefixes[1:]):
        from lit_iclr.registry import METHODS  # a tuple of names: importing it imports no method

        package = name.split(".")[1]
        if name.count(".") >= 2 and package not in (*METHODS, "core"):
            return f"lit_iclr.{package} is neither a method package of the registry nor lit_iclr.core"
    return None


def resolve_class(name: Any, base: type, source: str | Path, fix: str, what: str = "model") -> type:
    """The class `name` denotes, if it passes the allow-list and subclasses `base`; else a one-line `CheckpointError`
    naming `source` (the file that named it) and `fix`. Nothing outside the allowed prefixes is ever imported."""
    why = refusal(name)
    if why is not None:
        raise CheckpointError(source, f"names the class {name!r}, which is not a lit-iclr {what} ({why}; nothing was "
                              "imported)", f"{fix} ({TRUST_FIX})")
    module_name, _, attr = name.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attr, None)
    except ImportError as e:
        raise CheckpointError(source, f"names the class {name!r}, whose module cannot be imported ({e})", fix) from None
    if not (isinstance(obj, type) and issubclass(obj, base) and f"{obj.__module__}.".startswith(trusted_prefixes())):
        raise CheckpointError(source, f"names {name!r}, which is not a lit-iclr {what} (a {base.__name__} subclass)", fix)
    return obj


def checkpoint_class_names(ckpt: dict) -> Iterator[tuple[str, Any]]:
    """Every class a Lightning checkpoint names for its model: the platform's `lit_iclr_class` and the `_class_path`
    LightningCLI records in the hyperparameters (Lightning's CLI swaps the model for the latter on `--ckpt_path`)."""
    if ckpt.get("lit_iclr_class") is not None:
        yield "lit_iclr_class", ckpt["lit_iclr_class"]
    hp = ckpt.get("hyper_parameters")
    if isinstance(hp, dict) and hp.get("_class_path") is not None:
        yield "hyper_parameters._class_path", hp["_class_path"]
