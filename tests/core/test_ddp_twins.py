"""Every twin config on 2 CPU processes (gloo): one optimiser step of 2 x batch/2 equals 1 x batch, the validation
metrics of the stepped model equal one process's (each sample counted once, reduced over ranks), or the method refuses
several processes in one line (`single_process_reason`) before any process starts.

Each config costs three process starts (about 30 s on an idle 2-core machine, 2-5 minutes on a loaded one): the
default run covers a gradient method (STORM), a bandit (StageRoute, refused in one line), JULI's phase-ordered stream
and model interactions; every other twin is `slow`. The table in seeds/platform.md ("Data-parallel, every method")
comes from `pytest -m "slow or not slow"` of this file with LIT_ICLR_DDP_SWEEP_LOG set (a JSON row per config).
"""
import json
import os
from pathlib import Path

import pytest

from tests.core.ddp_worker import compare, first_step, measured

CONFIGS = sorted(p.stem for p in (Path(__file__).parents[1] / "configs").glob("*.yaml"))
# Adam's first step is lr * g / (|g| + eps): a parameter whose true gradient is 0 gets float noise (~1e-10) normalised
# to a step of up to lr that differs between process counts. MoSA's and ReIMTS's attention key biases (softmax is
# invariant to them) and AsyncBEV's camera-head convolution bias (BatchNorm after it removes it) are such parameters:
# under Adam(W) their twins step 1.5e-4, 8.2e-4 and 3.6e-3 (2 x lr, a sign flip) apart, under SGD (lr x g itself) 3e-8,
# 4e-8 and 5e-7. Their first steps are compared with SGD, the reference that shows whether the gradients agree.
SGD = ["--model.init_args.optimizer", "torch.optim.SGD", "--model.init_args.optimizer.init_args.lr", "0.1"]
# HEAPr prunes at the end of a one-process fit and skips it after a multi-process one (its card: prune the checkpoint
# with `lit_iclr.heapr.streaming`), so the comparison is of the trained models, before pruning, on both sides.
FIRST_STEP_ARGS = {"mosa": SGD, "asyncbev": SGD, "reimts": SGD,
                   "heapr": ["--model.init_args.prune_at_fit_end", "false"]}
FAST = {"storm", "stageroute", "juli", "model_interactions"}


def _param(name: str):
    return pytest.param(name, marks=() if name in FAST else pytest.mark.slow, id=name)


@pytest.mark.parametrize("config", [_param(c) for c in CONFIGS])
def test_twin_under_ddp(config, tmp_path):
    result = first_step(Path(__file__).parents[1] / "configs" / f"{config}.yaml", tmp_path,
                        *FIRST_STEP_ARGS.get(config, []))
    log = os.environ.get("LIT_ICLR_DDP_SWEEP_LOG")  # the sweep behind seeds/platform.md's table appends a row here
    if log:
        row = {"config": config, "status": result["status"], "reason": result["reason"][:300],
               **(measured(result) if result["status"] == "ok" else {}),
               "problems": compare(result)[:5] if result["status"] == "ok" else []}
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\n")
    if "No `training_step()`" in result["reason"]:  # a predict-only twin (sampling from a trained model's checkpoints)
        pytest.skip(f"{config} does not train")
    if result["status"] == "one process":  # refused in one line that names the method, the reason and the fix
        assert "runs on one process only (" in result["reason"] and "--trainer.devices 1" in result["reason"]
        return
    assert result["status"] == "ok", result["reason"] + "\n" + result.get("stderr", "")[-2000:]
    # one training batch: global_step counts every optimiser's step (VGF: 3, TD3+BC and FQL: 2), the same on both sides
    steps = result["single"]["global_step"]
    assert steps >= 1 and all(r["global_step"] == steps for r in result["ranks"]), steps
    assert not compare(result), compare(result)[:5]


def test_compare_catches_a_wrong_step_and_an_unreduced_metric():
    """The harness's comparison fails on a parameter off by more than float noise and on a rank-0-only metric."""
    import torch

    one = {"state": {"w": torch.ones(3)}, "metrics": {"val/loss": 1.0}, "world": 1}
    good = {"state": {"w": torch.ones(3) + 1e-6}, "metrics": {"val/loss": 1.0 + 1e-6}, "world": 2}
    bad = {"state": {"w": torch.ones(3) * 1.01}, "metrics": {"val/loss": 0.9}, "world": 2}
    assert compare({"single": one, "ranks": [good, good]}) == []
    problems = compare({"single": one, "ranks": [good, bad]})
    assert any("rank 1: parameter w" in p for p in problems) and any("rank 1: val/loss" in p for p in problems)
