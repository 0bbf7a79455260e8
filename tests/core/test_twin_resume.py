"""Every method's twin config: a fit interrupted at step 2 and resumed with `--ckpt_path last` ends with the same weights
as an uninterrupted fit (same batches, same random draws, same optimizer state).

Twin configs are discovered in tests/configs/, so a new method is covered when it adds its twin. A representative
fast subset runs by default; the full sweep is marked slow.
"""
import json
from pathlib import Path

import pytest
import torch

import tests.core.toy as toy
from lit_iclr.core.trainer import Trainer
from tests.twin import final_checkpoint, fit_twin, run_differences

CONFIGS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
FAST = {"reimts", "aire_prune_listops"}  # a plain-DataLoader method before, and a token-sequence one
# Known not exact yet (found by this sweep); each reason names what to fix.
KNOWN: dict[str, str] = {}
# Not bit for bit: the tolerance (absolute, and relative above 1) and why
TOLERANCE: dict[str, tuple[float, str]] = {
    "reimts": (2e-3, "MKL's fp32 sgemm is not bit-reproducible across processes' allocation histories (its results "
                     "depend on the code path MKL picks at run time): 1e-8 weight differences after the resume, which "
                     "Adam (lr 1e-2) grows to 4e-4 in 3 steps; with MKL_CBWR=COMPATIBLE the resume is bit-equal"),
}


def _marks(name: str) -> list:
    marks = [] if name in FAST else [pytest.mark.slow]
    if name in KNOWN:
        marks.append(pytest.mark.xfail(reason=KNOWN[name], strict=False))
    return marks
STEPS, CRASH = 4, 2
# graceful stops: epochs of (at most) 4 batches, a 6-step run stopped after step 3, i.e. inside the first epoch
STOP_STEPS, STOP_AT = 6, 3
STOP_OVERRIDES = ["--trainer.max_epochs", "100", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "0",
                  "--trainer.num_sanity_val_steps", "0", "--trainer.enable_progress_bar", "false",
                  "--trainer.log_every_n_steps", "1"]
OVERRIDES = ["--trainer.max_steps", str(STEPS), "--trainer.max_epochs", "100", "--trainer.limit_val_batches", "0",
             "--trainer.val_check_interval", "1.0", "--trainer.check_val_every_n_epoch", "1",
             "--trainer.num_sanity_val_steps", "0", "--trainer.enable_progress_bar", "false",
             "--checkpoint.every_n_train_steps", "1"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in CONFIGS])
def test_interrupted_and_resumed_fit_equals_uninterrupted(tmp_path, name):
    data = ["--data.init_args.data_dir", str(tmp_path / "data")]
    try:
        full = fit_twin(name, tmp_path / "full", *OVERRIDES, *data)
    except ImportError as e:  # an optional package of that method is not installed here
        pytest.skip(f"{name}: {e}")
    except Exception as e:
        if "No `training_step()`" in str(e):  # a predict-only twin (sampling from a trained model)
            pytest.skip(f"{name} does not train")
        if "leaves no room for a document" in str(e):  # its own tests point data.root at a small corpus
            pytest.skip(f"{name}: the twin needs the small test corpus as data.root")
        raise
    if full is None or full.trainer.global_step != STEPS:
        pytest.skip(f"{name} does not train for {STEPS} steps (a sampling/eval twin)")
    crash = f'{{"class_path": "tests.core.toy.CrashAtStep", "init_args": {{"step": {CRASH}}}}}'
    with pytest.raises(toy.Crash):
        fit_twin(name, tmp_path / "part", *OVERRIDES, *data, "--trainer.callbacks+", crash)
    resumed = fit_twin(name, tmp_path / "part", *OVERRIDES, *data, "--ckpt_path", "last")
    assert resumed.trainer.global_step == STEPS
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys()
    tol = max(1e-5, TOLERANCE.get(name, (0.0, ""))[0])  # the same run-to-run tolerance as the graceful stop below
    for k in a:
        if a[k].is_floating_point():
            # equal_nan: a buffer filled only by a validation pass the twin skips (VEA's layer profile) stays NaN
            torch.testing.assert_close(a[k], b[k], atol=tol, rtol=tol, equal_nan=True,
                                       msg=lambda m, k=k: f"{name}: {k}: {m}")
        else:
            assert torch.equal(a[k], b[k]), f"{name}: {k}"


def _sized_for(max_steps: int):
    """`Trainer.estimated_stepping_batches` as a run given `max_steps` would compute it."""
    estimate = Trainer.estimated_stepping_batches.fget

    def sized(trainer):
        loop = trainer.fit_loop.epoch_loop
        saved, loop.max_steps = loop.max_steps, max_steps
        try:
            return estimate(trainer)
        finally:
            loop.max_steps = saved
    return sized


def stop_batch(trainer) -> int:
    """The 0-based batch during which the signal is sent: the batch of step `STOP_AT` where each batch is one optimizer
    step, else the middle batch of the full run. VGF's modules take 2 or 3 optimizer steps per batch (critic, actor,
    value), so its 6-step run is 2 or 3 batches: a signal during batch `STOP_AT - 1` would land at the run's last batch,
    where `max_steps` ends the fit anyway, and nothing would be resumed."""
    batches = trainer.fit_loop.epoch_loop.batch_progress.total.completed
    return min(STOP_AT, -(-batches // 2)) - 1


@pytest.mark.parametrize("stop", ["signal", "max_steps"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in CONFIGS])
def test_graceful_stop_and_resume_equals_uninterrupted(tmp_path, monkeypatch, name, stop):
    """Stopped after step 3 by SIGTERM (sent during step 3) or by `max_steps 3`, resumed to 6 steps: the final weights,
    optimizer state, LR schedule, RNG state and metrics.csv rows are those of a 6-step run never stopped."""
    data = ["--data.init_args.data_dir", str(tmp_path / "data")]
    run = [*STOP_OVERRIDES, *data]
    try:
        full = fit_twin(name, tmp_path / "full", *run, "--trainer.max_steps", str(STOP_STEPS))
    except ImportError as e:
        pytest.skip(f"{name}: {e}")
    except Exception as e:
        if "No `training_step()`" in str(e):
            pytest.skip(f"{name} does not train")
        if "leaves no room for a document" in str(e):
            pytest.skip(f"{name}: the twin needs the small test corpus as data.root")
        raise
    if full is None or full.trainer.global_step != STOP_STEPS:
        pytest.skip(f"{name} does not train for {STOP_STEPS} steps (a sampling/eval twin)")
    if stop == "signal":
        send = json.dumps({"class_path": "tests.twin.SignalAtBatch", "init_args": {"batch": stop_batch(full.trainer)}})
        part = fit_twin(name, tmp_path / "part", *run, "--trainer.max_steps", str(STOP_STEPS), "--trainer.callbacks+", send)
    else:
        # A stop by `max_steps` is a shorter run: a schedule sized from `trainer.estimated_stepping_batches` (AIRE-Prune,
        # NAMEx, HEAPr, STORM, VEA: their LR warm-up/cosine length) is fitted to it and cannot equal the full run's. As
        # a stop (the case this checks), the first part is given the full run's schedule length.
        with monkeypatch.context() as m:
            m.setattr(Trainer, "estimated_stepping_batches", property(_sized_for(STOP_STEPS)))
            part = fit_twin(name, tmp_path / "part", *run, "--trainer.max_steps", str(STOP_AT))
    # stopped inside the run (VGF counts 2 or 3 optimizer steps per batch: global_step 3 or 4 after the stop)
    assert 0 < part.trainer.global_step < STOP_STEPS
    ckpt = final_checkpoint(tmp_path / "part")
    assert ckpt["global_step"] == part.trainer.global_step
    resumed = fit_twin(name, tmp_path / "part", *run, "--trainer.max_steps", str(STOP_STEPS), "--ckpt_path", "last")
    assert resumed.trainer.global_step == STOP_STEPS
    atol = TOLERANCE.get(name, (0.0, ""))[0]
    assert run_differences(tmp_path / "full", tmp_path / "part", atol=atol)[:8] == []


# Twins whose `global_step` is not one optimizer step per batch, so the 6-step run above skips them: SOOPER takes ~14
# optimizer steps per batch (actor, critics, dynamics ensemble), StageRoute's and T-Tamer's fits take none (a bandit's
# statistics, a pass of exit-table statistics). They are stopped by a signal at the middle batch of a 2-epoch run and
# resumed to its end; `max_steps` has no meaning for them.
BATCH_UNITS = ("sooper", "stageroute", "ttamer")
# Found by this test, not fixed yet; each reason names what to fix.
BATCH_KNOWN: dict[str, str] = {}


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.xfail(reason=BATCH_KNOWN[n], strict=False)]
                                               if n in BATCH_KNOWN else []) for n in BATCH_UNITS])
def test_graceful_stop_by_batch_and_resume_equals_uninterrupted(tmp_path, name):
    run = [*STOP_OVERRIDES, "--data.init_args.data_dir", str(tmp_path / "data"), "--trainer.max_epochs", "2"]
    full = fit_twin(name, tmp_path / "full", *run)
    batches = full.trainer.fit_loop.epoch_loop.batch_progress.total.completed
    if batches < 2:
        pytest.skip(f"{name}: its fit is {batches} batch(es), nothing to stop inside")
    send = json.dumps({"class_path": "tests.twin.SignalAtBatch", "init_args": {"batch": (batches - 1) // 2}})
    part = fit_twin(name, tmp_path / "part", *run, "--trainer.callbacks+", send)
    assert part.trainer.fit_loop.epoch_loop.batch_progress.total.completed < batches  # stopped inside the run
    resumed = fit_twin(name, tmp_path / "part", *run, "--ckpt_path", "last")
    assert resumed.trainer.global_step == full.trainer.global_step
    assert run_differences(tmp_path / "full", tmp_path / "part")[:8] == []
