"""One writer per run folder: a second process that would train in a folder another process is training in fails in
one line naming the folder and the holder's pid; the lock goes when the holder ends, even by SIGKILL.

Before, two concurrent `fit --ckpt_path last` of one config both resumed the same folder (duplicated metric rows, two
TensorBoard event files, `last-v1.ckpt`).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.runlock import is_first_rank, lock_run_dir, unlock_run_dir

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp: Path) -> Path:
    cfg = tmp / "toy.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": {"class_path": "tests.core.toy.ToyRegression"},
        "data": {"class_path": "tests.core.toy.ToyData", "init_args": {"data_dir": str(tmp / "d")}},
        "trainer": {"max_steps": 6, "accelerator": "cpu", "limit_val_batches": 0, "num_sanity_val_steps": 0,
                    "enable_progress_bar": False},
        "checkpoint": {"every_n_train_steps": 1}}))
    return cfg


def cli(tmp: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_JOB_ID", "NODE_RANK"):
        env.pop(key, None)
    # `cli.py`, with the toy classes imported first (as the tests' conftest does) so their size links apply
    code = "import tests.core.toy\nfrom lit_iclr.cli import main\nmain()"
    return subprocess.Popen([sys.executable, "-c", code, "fit", *args], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the first run ended early: {proc.communicate()[1][-2000:]}")
        assert time.monotonic() < end, "the first run never reached its pause"
        time.sleep(0.1)


@pytest.mark.parametrize("holder_ends", ["normally", "by SIGKILL"])
def test_second_resume_of_a_running_run_fails_naming_the_holder(tmp_path, holder_ends):
    cfg = write_config(tmp_path)
    ready, release = tmp_path / "ready", tmp_path / "release"
    pause = json.dumps({"class_path": "tests.core.toy.PauseAtStep",
                        "init_args": {"step": 3, "ready": str(ready), "release": str(release)}})
    first = cli(tmp_path, "--config", str(cfg), "--trainer.callbacks+", pause)
    try:
        wait_for(ready, first)
        (run,) = (tmp_path / "runs" / "toy").iterdir()
        second = cli(tmp_path, "--config", str(cfg), "--ckpt_path", "last")
        out, err = second.communicate(timeout=300)
        assert second.returncode == 2, err[-2000:]
        lines = [ln for ln in err.splitlines() if ln.startswith("lit-iclr: error:")]
        assert len(lines) == 1 and "Traceback" not in err
        assert str(run.resolve()) in lines[0] and f"pid {first.pid}" in lines[0] and "in use by another process" in lines[0]
        assert len(list(run.glob("events.out.tfevents.*"))) == 1  # the refused process wrote nothing there
        if holder_ends == "by SIGKILL":
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=60)
        else:
            release.touch()
            assert first.wait(timeout=300) == 0
    finally:
        release.touch()
        if first.poll() is None:
            first.kill()
    # the folder is free again: the resume takes it and finishes the run
    third = cli(tmp_path, "--config", str(cfg), "--ckpt_path", "last")
    out, err = third.communicate(timeout=300)
    assert third.returncode == 0, err[-2000:]
    assert len(list((tmp_path / "runs" / "toy").iterdir())) == 1
    assert not list((run / "checkpoints").glob("last-v*.ckpt"))  # no second writer's versioned checkpoints


def test_lock_in_one_process_is_reentrant_and_released(tmp_path):
    lock_run_dir(tmp_path / "r")
    lock_run_dir(tmp_path / "r")  # the same process fitting the folder again
    code = ("import sys\nfrom lit_iclr.core.runlock import lock_run_dir\n"
            f"lock_run_dir({str(tmp_path / 'r')!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "SLURM_PROCID")}
    busy = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert busy.returncode != 0 and f"pid {os.getpid()}" in busy.stderr
    unlock_run_dir(tmp_path / "r")
    free = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    assert free.returncode == 0, free.stderr


def test_only_the_first_rank_locks():
    assert is_first_rank({}) and is_first_rank({"RANK": "0", "LOCAL_RANK": "0"})
    assert not is_first_rank({"LOCAL_RANK": "1"}) and not is_first_rank({"SLURM_PROCID": "3"})


def test_error_names_folder_and_pid(tmp_path):
    lock_run_dir(tmp_path / "r")
    try:
        code = f"from lit_iclr.core.runlock import lock_run_dir\nlock_run_dir({str(tmp_path / 'r')!r})"
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
        assert ConfigError.__name__ in p.stderr and str((tmp_path / "r").resolve()) in p.stderr
    finally:
        unlock_run_dir(tmp_path / "r")
