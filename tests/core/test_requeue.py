"""`scripts/slurm/fit.sbatch` under a fake SLURM: SIGUSR1 to the job's process group in the middle of an epoch, then the
requeued job (a second launch with the same job id) lands in the same run folder and ends equal to a run never stopped.

The batch script runs with bash in a submit folder of its own (cli.py and configs/ linked from the repository; runs/
written there). `srun` and `scontrol` are shell scripts on PATH that record their calls; srun execs the command, as a
one-task step does. The toy method trains 3 epochs of 8 batches; the signal lands during step 11 (epoch 1's 4th batch).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.twin import final_checkpoint, run_differences

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "scripts" / "slurm" / "fit.sbatch"
TOY = """\
model:
  class_path: tests.core.toy.ToyRegression
  init_args: {lr_step: 3, num_features: 3}  # (the data-to-model link needs tests.core.toy imported first)
data:
  class_path: tests.core.toy.ToyData
  init_args: {data_dir: data}
"""
FAKE_SRUN = '#!/bin/bash\nprintf "%s\\n" "$*" >> "$FAKE_SLURM_LOG/srun"\nexec "$@"\n'
FAKE_SCONTROL = '#!/bin/bash\nprintf "%s\\n" "$*" >> "$FAKE_SLURM_LOG/scontrol"\n'


def _submit_dir(tmp_path: Path) -> Path:
    sub = tmp_path / "submit"
    sub.mkdir()
    (sub / "cli.py").symlink_to(ROOT / "cli.py")
    (sub / "configs").symlink_to(ROOT / "configs")
    (sub / "toy.yaml").write_text(TOY)
    return sub


def _fake_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _env(tmp_path: Path, job: str, fake_bin: Path | None) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PL_", "LOCAL_RANK", "WORLD_SIZE"))}
    path = [str(fake_bin)] if fake_bin else []
    path += [str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]
    return {**keep, "PATH": os.pathsep.join(path), "PYTHONPATH": str(ROOT), "FAKE_SLURM_LOG": str(tmp_path),
            "OMP_NUM_THREADS": "1", "SLURM_JOB_ID": job, "SLURM_JOB_NAME": "lit-iclr", "SLURM_NTASKS": "1",
            "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost", "SLURM_SUBMIT_DIR": "."}


def _launch(sub: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    args = ["--trainer.accelerator", "cpu", "--trainer.strategy", "auto", "--trainer.precision", "32-true",
            "--trainer.max_epochs", "3", "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0",
            "--trainer.enable_progress_bar", "false", "--trainer.log_every_n_steps", "1", *extra]
    return subprocess.Popen(["bash", str(SBATCH), "toy.yaml", *args], cwd=sub, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(p: subprocess.Popen, timeout: float = 120) -> str:
    out, _ = p.communicate(timeout=timeout)
    assert p.returncode == 0, out[-3000:]
    return out


def test_sigusr1_requeue_resumes_in_the_same_folder_equal_to_an_unstopped_run(tmp_path):
    sub, fake_bin = _submit_dir(tmp_path), _fake_bin(tmp_path)
    ready, release = tmp_path / "at-step-11", tmp_path / "go-on"
    pause = ["--trainer.callbacks+", json.dumps({"class_path": "tests.core.toy.PauseAtStep", "init_args": {
        "step": 11, "ready": str(ready), "release": str(release), "timeout": 120}})]

    # an unstopped run (job 2, no srun on PATH: the command runs directly) alongside the job to be stopped (job 1)
    full = _launch(sub, _env(tmp_path, "2", None), "--data.init_args.data_dir", "data-full")  # not generated twice at once
    job = _launch(sub, _env(tmp_path, "1", fake_bin), *pause)
    end = time.monotonic() + 120
    while not ready.exists() and job.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    assert ready.exists(), job.communicate()[0][-3000:]
    os.killpg(job.pid, signal.SIGUSR1)  # what `scancel --signal=USR1` / a process-group kill does: every process gets it
    release.touch()
    first = _finish(job)
    assert "SIGUSR1 received: saved" in first and "at step 12" in first, first[-3000:]
    run = sub / "runs" / "toy" / "1"
    ckpt = final_checkpoint(run)
    loop = ckpt["loops"]["fit_loop"]
    assert ckpt["global_step"] == 12 and loop["epoch_progress"]["current"]["processed"] == 1  # inside epoch 1
    assert loop["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": 4}]
    assert (tmp_path / "scontrol").read_text().splitlines() == ["requeue 1"]  # the job asked to be requeued

    # the requeued job: the same script, arguments and job id
    second = _finish(_launch(sub, _env(tmp_path, "1", fake_bin), *pause))
    assert "fit.sbatch: continuing runs/toy/1" in second, second[-3000:]
    calls = (tmp_path / "srun").read_text().splitlines()
    assert len(calls) == 2 and "--ckpt_path" not in calls[0] and "--ckpt_path last" in calls[1]
    assert sorted(p.name for p in (sub / "runs" / "toy").iterdir()) == ["1", "2"]  # no new folder for the requeue
    _finish(full)
    assert final_checkpoint(run)["global_step"] == 24
    assert run_differences(sub / "runs" / "toy" / "2", run) == []
