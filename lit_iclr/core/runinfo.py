"""What a run was: the command, git commit, package versions. Written to <run>/run_info.json for model cards."""
from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from .runlock import unlock_run_dir

PACKAGES = ("lit-iclr", "torch", "lightning", "torchmetrics", "jsonargparse", "timm", "transformers", "xarray",
            "ogbench", "gymnasium", "torch-harmonics", "safetensors", "huggingface_hub")


def git_sha(cwd: str | Path = ".") -> str:
    """HEAD's commit, with `-dirty` when tracked files differ; `unknown` outside a git checkout."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def run_info(argv: list[str] | None = None) -> dict:
    argv = sys.argv if argv is None else argv
    return {
        "command": " ".join(shlex.quote(a) for a in ["python", "cli.py", *argv[1:]]),
        "git_sha": git_sha(),
        "versions": package_versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
    }


class RunInfo(Callback):
    """Writes run_info.json into the run folder on rank 0 when a fit/validate/test starts (kept across requeues), and
    releases the run folder's lock (`core/runlock.py`) when it ends."""

    def __init__(self, run_dir: str, argv: list[str] | None = None, config_changes: dict | None = None):
        """
        Args:
            run_dir: The run folder.
            argv: The command line (default: sys.argv).
            config_changes: When resuming, {option: [saved, now]} of the tolerated changes to the saved config.
        """
        self.run_dir = Path(run_dir)
        self.argv = argv
        self.config_changes = config_changes

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "run_info.json"
        history = json.loads(path.read_text())["history"] if path.exists() else []
        info = run_info(self.argv)
        info["stage"] = stage
        if self.config_changes is not None:  # a resume of this folder: what differs from its config.yaml
            info["resume"] = {"config_changes": self.config_changes}
        path.write_text(json.dumps({**info, "history": [*history, info]}, indent=2))

    def teardown(self, trainer, pl_module, stage: str) -> None:
        unlock_run_dir(self.run_dir)
