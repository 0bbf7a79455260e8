"""A graceful stop (SIGTERM, SIGUSR1, max_steps) inside an epoch saves the position, and resuming equals never stopping.

Before, the stop ended the epoch first: last.ckpt said the epoch was finished with an empty loader position, so the
resume skipped the rest of that epoch (a 30-epoch VGF run stopped at step 12 ended at step 18 instead of 27).
The toy epoch has 8 batches; the LR halves every 3 steps, so the schedule is compared too.
"""
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

import tests.core.toy as toy  # registers the toy classes with the CLI
from lit_iclr.cli import main
from lit_iclr.core.atomic import AtomicCheckpointIO, atomic_torch_save
from tests.twin import final_checkpoint, run_differences, training_rows

BASE = ["--model", "ToyRegression", "--data", "ToyData", "--trainer.accelerator", "cpu",
        "--trainer.enable_progress_bar", "false", "--trainer.num_sanity_val_steps", "0",
        "--trainer.log_every_n_steps", "1", "--model.init_args.lr_step", "3"]
NO_VAL = ["--trainer.limit_val_batches", "0"]


def fit(root: Path, data: Path, *extra: str):
    return main(["fit", *BASE, "--trainer.default_root_dir", str(root), "--data.init_args.data_dir", str(data), *extra])


def send(step: int, sig: str = "SIGTERM") -> list[str]:
    return ["--trainer.callbacks+", json.dumps({"class_path": "tests.core.toy.SignalAtStep",
                                                "init_args": {"step": step, "signal": sig}})]


def fit_loop_state(ckpt: dict) -> tuple[int, int, list]:
    loop = ckpt["loops"]["fit_loop"]
    return (loop["epoch_progress"]["current"]["processed"], loop["epoch_loop.state_dict"]["_batches_that_stepped"],
            loop["state_dict"].get("combined_loader", []))


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_signal_mid_epoch_resumes_the_same_epoch(tmp_path, sig):
    """The issue's reproduction in small: epochs of 8 batches, stopped at step 12 of a 3-epoch run, resumed to the
    same length: 24 steps and the same weights, optimizer, schedule, RNG and metric rows as a run never stopped."""
    data, limit = tmp_path / "d", ["--trainer.max_epochs", "3", *NO_VAL]
    full = fit(tmp_path / "full", data, *limit)
    assert full.trainer.global_step == 24
    part = fit(tmp_path / "part", data, *limit, *send(11, sig))  # arrives during step 11; saved after it
    assert part.trainer.global_step == 12
    processed, _, loader = fit_loop_state(final_checkpoint(tmp_path / "part"))
    assert processed == 1 and loader == [{"epoch": 1, "batches": 4}]  # epoch 1 not finished, 4 of its batches done
    resumed = fit(tmp_path / "part", data, *limit, "--ckpt_path", "last")
    assert resumed.trainer.global_step == 24
    assert run_differences(tmp_path / "full", tmp_path / "part") == []


@pytest.mark.parametrize("stop", ["signal", "max_steps"])
def test_stop_then_resume_to_more_steps_equals_one_run(tmp_path, stop):
    data, steps = tmp_path / "d", ["--trainer.max_epochs", "100", *NO_VAL]
    fit(tmp_path / "full", data, *steps, "--trainer.max_steps", "20")
    how = send(4) if stop == "signal" else ["--trainer.max_steps", "5"]
    part = fit(tmp_path / "part", data, *steps, *(["--trainer.max_steps", "20"] if stop == "signal" else []), *how)
    assert part.trainer.global_step == 5
    ckpt = final_checkpoint(tmp_path / "part")
    # epoch 0 unfinished, 5 batches consumed; Lightning counts the 5th stepped batch when it resumes
    assert ckpt["global_step"] == 5 and fit_loop_state(ckpt) == (0, 4, [{"epoch": 0, "batches": 5}])
    resumed = fit(tmp_path / "part", data, *steps, "--trainer.max_steps", "20", "--ckpt_path", "last")
    assert resumed.trainer.global_step == 20
    assert run_differences(tmp_path / "full", tmp_path / "part") == []


def test_signal_at_the_last_batch_ends_the_epoch_first(tmp_path):
    data, steps = tmp_path / "d", ["--trainer.max_epochs", "100", "--trainer.max_steps", "16", *NO_VAL]
    fit(tmp_path / "full", data, *steps)
    fit(tmp_path / "part", data, *steps, *send(7))  # step 7 is the epoch's 8th batch
    processed, _, loader = fit_loop_state(final_checkpoint(tmp_path / "part"))
    assert final_checkpoint(tmp_path / "part")["global_step"] == 8 and processed == 1 and loader[0]["batches"] == 0
    resumed = fit(tmp_path / "part", data, *steps, "--ckpt_path", "last")
    assert resumed.trainer.global_step == 16 and run_differences(tmp_path / "full", tmp_path / "part") == []


def test_signal_at_a_validation_batch(tmp_path):
    """Validation every 2 batches; the stop lands on one: no extra or missing validation rows, same state."""
    data = tmp_path / "d"
    steps = ["--trainer.max_epochs", "100", "--trainer.max_steps", "14", "--trainer.val_check_interval", "2",
             "--trainer.limit_val_batches", "2"]
    fit(tmp_path / "full", data, *steps)
    fit(tmp_path / "part", data, *steps, *send(5))
    assert final_checkpoint(tmp_path / "part")["global_step"] == 6
    fit(tmp_path / "part", data, *steps, "--ckpt_path", "last")
    assert run_differences(tmp_path / "full", tmp_path / "part") == []
    assert sum("val/loss" in r for r in training_rows(tmp_path / "part")) == 7


class EpochLoggedToy(toy.ToyRegression):
    """The toy logging epoch aggregates in training (a mean and a max over the epoch's batches)."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train/epoch_loss", loss, on_step=False, on_epoch=True)
        self.log("train/epoch_max", loss, on_step=False, on_epoch=True, reduce_fx="max")
        return loss


def test_epoch_aggregates_cover_the_batches_before_the_resume(tmp_path):
    """Lightning does not checkpoint the running epoch aggregates: before, epoch 1's mean and max after a stop at its
    4th batch covered only its last 4 batches. Checked against the mean and max of the per-step losses of the run."""
    data, limit = tmp_path / "d", ["--trainer.max_epochs", "3", *NO_VAL]
    model = ["--model", f"{__name__}.EpochLoggedToy"]
    fit(tmp_path / "full", data, *model, *limit)
    fit(tmp_path / "part", data, *model, *limit, *send(11, "SIGUSR1"))
    fit(tmp_path / "part", data, *model, *limit, "--ckpt_path", "last")
    assert run_differences(tmp_path / "full", tmp_path / "part") == []
    rows = training_rows(tmp_path / "part")
    steps = [float(r["train/loss"]) for r in rows if "train/loss" in r and r["epoch"] == "1"]
    epoch = next(r for r in rows if "train/epoch_loss" in r and r["epoch"] == "1")
    assert len(steps) == 8  # every batch of epoch 1 logged one loss (equal batch sizes: the mean is the plain mean)
    assert float(epoch["train/epoch_loss"]) == pytest.approx(sum(steps) / 8, rel=1e-5)
    assert float(epoch["train/epoch_max"]) == pytest.approx(max(steps), rel=1e-6)


def test_the_comparison_can_fail(tmp_path):
    """Guard: the old behaviour (resume after the epoch was marked finished) is caught by `run_differences`."""
    data, steps = tmp_path / "d", ["--trainer.max_epochs", "3", *NO_VAL]
    fit(tmp_path / "full", data, *steps)
    fit(tmp_path / "part", data, *steps, *send(11))
    ckpt_path = tmp_path / "part" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    loop = ckpt["loops"]["fit_loop"]  # what the old code saved: the epoch ended, the loader position emptied
    loop["epoch_progress"]["current"]["processed"] += 1
    loop["epoch_progress"]["total"]["processed"] += 1
    loop["state_dict"]["combined_loader"] = [{"epoch": 1, "batches": 0}]
    torch.save(ckpt, ckpt_path)
    resumed = fit(tmp_path / "part", data, *steps, "--ckpt_path", "last")
    assert resumed.trainer.global_step == 20  # the rest of epoch 1 was skipped
    assert run_differences(tmp_path / "full", tmp_path / "part") != []


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    """A kill during the write leaves the previous last.ckpt whole and no file under the final name half-written."""
    target = tmp_path / "checkpoints" / "last.ckpt"
    atomic_torch_save({"step": 1, "w": torch.ones(3)}, target)

    def killed(obj, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # SIGINT / a kill arriving in the middle of torch.save

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        AtomicCheckpointIO().save_checkpoint({"step": 2}, target)
    monkeypatch.undo()
    assert torch.load(target, weights_only=True)["step"] == 1
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]  # the temporary file is gone


def test_a_sigkill_during_the_save_leaves_the_old_checkpoint(tmp_path):
    """A process SIGKILLed while it writes (in a child, mid-write): last.ckpt is the earlier, complete one."""
    import subprocess
    import sys

    target = tmp_path / "last.ckpt"
    atomic_torch_save({"step": 1}, target)
    code = ("import os, signal, torch, sys\nfrom lit_iclr.core.atomic import atomic_torch_save\n"
            "class Big:\n    def __reduce__(self):\n        os.kill(os.getpid(), signal.SIGKILL)\n"
            f"atomic_torch_save({{'step': 2, 'x': Big()}}, {str(target)!r})\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == -signal.SIGKILL
    assert torch.load(target, weights_only=True) == {"step": 1}
    leftovers = [q.name for q in tmp_path.iterdir() if q.name != "last.ckpt"]
    assert all(".tmp-" in n for n in leftovers)  # at most the dead writer's temporary file, never under the real name
    assert os.path.getsize(target) > 0


def test_the_trainer_writes_checkpoints_atomically(tmp_path):
    cli = fit(tmp_path / "r", tmp_path / "d", "--trainer.max_steps", "2", *NO_VAL)
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_a_max_steps_stop_without_checkpointing_writes_no_file(tmp_path, monkeypatch):
    """`Trainer(enable_checkpointing=False, max_steps=3)` on epochs of 4 batches: the max_steps stop saved
    `<default_root_dir>/checkpoints/last.ckpt` anyway, the working directory when no root is given (a default test
    left `checkpoints/last.ckpt` in the repository)."""
    from torch.utils.data import DataLoader

    from lit_iclr.core.trainer import Trainer

    monkeypatch.chdir(tmp_path)
    trainer = Trainer(max_steps=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False)
    data = [{"x": torch.randn(3), "y": torch.randn(())} for _ in range(16)]
    trainer.fit(toy.ToyRegression(num_features=3), DataLoader(data, batch_size=4))
    assert trainer.global_step == 3
    assert list(tmp_path.rglob("*.ckpt")) == []


class StepsPerBatchToy(toy.ToyRegression):
    """The toy with `steps` optimizer steps a batch (manual optimization): 0 as a bandit's fit takes, 2 as an actor and
    a critic do; it logs a row every batch and one at every epoch's end."""

    def __init__(self, steps: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self(batch["x"]), batch["y"])
        opt = self.optimizers()
        for _ in range(self.hparams.steps):
            opt.zero_grad()
            self.manual_backward(nn.functional.mse_loss(self(batch["x"]), batch["y"]))
            opt.step()
        self.log("train/loss", loss)

    def on_train_epoch_end(self):
        self.log("train/epoch_weight", self.net[0].weight.detach().sum())

    def configure_optimizers(self):
        return self.optimizer(self.parameters())


@pytest.mark.parametrize("steps", [0, 2])
def test_a_stop_at_an_epochs_last_batch_keeps_its_epoch_row(tmp_path, steps):
    """Metric rows are kept by the batch they belong to, not by `global_step`: a fit without optimizer steps (a bandit)
    lost the row of the epoch in whose last batch it was stopped (its `global_step` stays 0)."""
    data, limit = tmp_path / "d", ["--trainer.max_epochs", "2", *NO_VAL, "--model.init_args.steps", str(steps)]
    model = ["--model", f"{__name__}.StepsPerBatchToy"]
    fit(tmp_path / "full", data, *model, *limit)
    stop = json.dumps({"class_path": "tests.twin.SignalAtBatch", "init_args": {"batch": 7}})  # epoch 0's 8th batch
    fit(tmp_path / "part", data, *model, *limit, "--trainer.callbacks+", stop)
    assert len([r for r in training_rows(tmp_path / "part") if "train/epoch_weight" in r]) == 1
    fit(tmp_path / "part", data, *model, *limit, "--ckpt_path", "last")
    assert run_differences(tmp_path / "full", tmp_path / "part") == []
    assert len([r for r in training_rows(tmp_path / "part") if "train/epoch_weight" in r]) == 2


def test_a_crash_resume_drops_the_rows_of_batches_trained_again(tmp_path):
    """Two optimizer steps a batch, checkpoints every 2 batches, a crash as batch 7 starts: the crashed run's row of
    batch 6 is trained again after the resume from batch 5's checkpoint. Kept by `global_step` (12), it stayed twice."""
    data, limit = tmp_path / "d", ["--trainer.max_epochs", "1", *NO_VAL, "--model.init_args.steps", "2"]
    model = ["--model", f"{__name__}.StepsPerBatchToy"]
    fit(tmp_path / "full", data, *model, *limit)
    every = ["--checkpoint.every_n_train_steps", "4"]  # global steps: every 2 batches
    with pytest.raises(toy.Crash):
        fit(tmp_path / "part", data, *model, *limit, *every, "--trainer.callbacks+",
            json.dumps({"class_path": "tests.core.toy.CrashAtStep", "init_args": {"step": 14}}))
    assert final_checkpoint(tmp_path / "part")["global_step"] == 12
    fit(tmp_path / "part", data, *model, *limit, *every, "--ckpt_path", "last")
    assert run_differences(tmp_path / "full", tmp_path / "part") == []
