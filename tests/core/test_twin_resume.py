"""Every method's twin config: a fit interrupted at step 2 and resumed with `--ckpt_path last` ends with the same weights
as an uninterrupted fit (same batches, same random draws, same optimizer state).

Twin configs are discovered in tests/configs/, so a new method is covered when it adds its twin. A representative
fast subset runs by default; the full sweep is marked slow.
"""
from pathlib import Path

import pytest
import torch

import tests.core.toy as toy
from tests.twin import fit_twin

CONFIGS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
FAST = {"reimts", "aire_prune_listops"}  # a plain-DataLoader method before, and a token-sequence one
# Known not exact yet (found by this sweep); each reason names what to fix.
KNOWN: dict[str, str] = {}


def _marks(name: str) -> list:
    marks = [] if name in FAST else [pytest.mark.slow]
    if name in KNOWN:
        marks.append(pytest.mark.xfail(reason=KNOWN[name], strict=False))
    return marks
STEPS, CRASH = 4, 2
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
    for k in a:
        if a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-5, msg=f"{name}: {k}")
        else:
            assert torch.equal(a[k], b[k]), f"{name}: {k}"
