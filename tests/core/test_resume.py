"""Stop a fit at step k, resume it with `--ckpt_path last`: the result equals an uninterrupted run."""
import json
from pathlib import Path

import pytest
import torch

import tests.core.toy as toy  # registers the toy classes with the CLI
from lit_iclr.cli import main

BASE = ["--model", "ToyRegression", "--data", "ToyData", "--trainer.accelerator", "cpu",
        "--trainer.enable_progress_bar", "false", "--trainer.num_sanity_val_steps", "0",
        "--trainer.limit_val_batches", "0", "--model.init_args.lr_step", "3"]


def fit(root: Path, data: Path, max_steps: int, *extra: str):
    return main(["fit", *BASE, "--trainer.default_root_dir", str(root), "--data.init_args.data_dir", str(data),
                 "--trainer.max_steps", str(max_steps), "--trainer.max_epochs", "100", *extra])


# mid-epoch (8 batches per epoch) and at an epoch boundary; with noise drawn in training_step, the boundary case is the
# step save Lightning writes at the epoch's last batch (core/step_checkpoint.py): resumed, it trained an extra batch
@pytest.mark.parametrize("k,noise", [(5, 0.0), (8, 0.0), (5, 0.3), (8, 0.3)])
def test_resume_equals_uninterrupted(tmp_path, k, noise):
    data = tmp_path / "data"
    model = ["--model.init_args.input_noise", str(noise)]
    full = fit(tmp_path / "full", data, 20, *model)
    crash = json.dumps({"class_path": "tests.core.toy.CrashAtStep", "init_args": {"step": k}})
    with pytest.raises(toy.Crash):  # pre-empted at step k; a checkpoint is written every step
        fit(tmp_path / "part", data, 20, *model, "--trainer.callbacks+", crash, "--checkpoint.every_n_train_steps", "1")
    ckpt = torch.load(tmp_path / "part" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == k
    resumed = fit(tmp_path / "part", data, 20, *model, "--ckpt_path", "last")

    assert resumed.trainer.global_step == full.trainer.global_step == 20
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)
    # optimizer moments and LR schedule restored, not restarted
    opt_full, opt_res = full.trainer.optimizers[0], resumed.trainer.optimizers[0]
    assert opt_full.param_groups[0]["lr"] == opt_res.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5 ** (20 // 3))
    for sa, sb in zip(opt_full.state.values(), opt_res.state.values(), strict=True):
        torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"], atol=1e-9, rtol=1e-6)
    assert full.trainer.current_epoch == resumed.trainer.current_epoch


def test_resume_changes_result_when_data_position_is_lost(tmp_path):
    """Guard that the test above can fail: restarting from scratch for the remaining steps differs."""
    data = tmp_path / "data"
    full = fit(tmp_path / "full", data, 12)
    part = fit(tmp_path / "p", data, 12, "--seed_everything", "1")
    pairs = zip(full.model.state_dict().values(), part.model.state_dict().values(), strict=True)
    diff = max((a - b).abs().max().item() for a, b in pairs)
    assert diff > 1e-4


def test_resume_keeps_earlier_metrics(tmp_path):
    data = tmp_path / "data"
    crash = '{"class_path": "tests.core.toy.CrashAtStep", "init_args": {"step": 6}}'
    extra = ["--trainer.log_every_n_steps", "1", "--checkpoint.every_n_train_steps", "1"]
    with pytest.raises(toy.Crash):
        fit(tmp_path / "run", data, 10, "--trainer.callbacks+", crash, *extra)
    fit(tmp_path / "run", data, 10, "--ckpt_path", "last", *extra)
    import csv

    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    steps = sorted({int(r["step"]) for r in rows if r.get("train/loss")})
    assert steps == list(range(10))  # rows from before the crash are kept, none duplicated
