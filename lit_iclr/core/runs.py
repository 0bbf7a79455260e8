"""Run folders: runs/<config name>/<SLURM job id or timestamp>, so a requeued job finds its own checkpoints."""
from __future__ import annotations

import os
import time
from pathlib import Path


def config_name(config_files: list[str]) -> str:
    """The method config's stem: the first `--config` that is not a trainer overlay (configs/trainer/*.yaml)."""
    for f in config_files:
        if Path(f).parent.name != "trainer":
            return Path(f).stem
    return "cli"


def resolve_run_dir(default_root_dir: str | None, config_files: list[str], resume: bool = False,
                    runs_root: str = "runs") -> Path:
    """Where this run writes: an explicit `--trainer.default_root_dir`, else runs/<config>/<job id | timestamp>.

    Under SLURM the job id is stable across requeues. With `--ckpt_path last` outside SLURM the newest earlier run of the
    same config that holds `checkpoints/last.ckpt` is continued.
    """
    if default_root_dir and default_root_dir != os.getcwd() and default_root_dir != ".":
        return Path(default_root_dir)
    base = Path(runs_root) / config_name(config_files)
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        array = os.environ.get("SLURM_ARRAY_TASK_ID")
        return base / (f"{job}_{array}" if array else job)
    if resume:
        earlier = sorted(p.parent.parent for p in base.glob("*/checkpoints/last*.ckpt"))
        if earlier:
            return max(earlier, key=lambda p: p.stat().st_mtime)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = base / stamp
    n = 1
    while run.exists():  # two runs started in the same second
        run = base / f"{stamp}-{n}"
        n += 1
    return run
