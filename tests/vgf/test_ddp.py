"""VGF and its baselines under DDP: the ranks' minibatches deal out one process's global minibatch, and 2 CPU
processes x batch/2 take the same optimiser steps as 1 process x batch."""
import pytest
import torch

from lit_iclr.vgf.data import TransitionLoader
from tests.ddp_steps import fit_steps, max_abs_diff


def test_ranks_deal_out_the_global_minibatch():
    data = {"x": torch.arange(1000.0), "y": -torch.arange(1000.0)}
    one = TransitionLoader(data, 8, steps_per_epoch=3, seed=5)
    ranks = [TransitionLoader(data, 4, steps_per_epoch=3, seed=5, rank=r, world=2) for r in (0, 1)]
    for k in range(3):
        glob, parts = one.batch(k), [r.batch(k) for r in ranks]
        dealt = torch.stack([parts[0]["x"], parts[1]["x"]], 1).reshape(-1)  # rows 0, 2, .. from rank 0; 1, 3, .. rank 1
        assert torch.equal(dealt, glob["x"]) and torch.equal(parts[1]["y"], glob["y"][1::2])
    assert not torch.equal(ranks[0].batch(0)["x"], ranks[1].batch(0)["x"])


SGD = [f"--model.init_args.{o}_optimizer{a}" for o in ("actor", "critic") for a in ("", ".init_args.lr")]
SGD = [x for pair in zip(SGD, ["torch.optim.SGD", "0.1"] * 2, strict=True) for x in pair]


@pytest.mark.slow  # 3 CLI runs per config, one of them with 2 processes: about 2 minutes each on 2 cores
@pytest.mark.parametrize("name", ["vgf", "vgf_td3bc", "vgf_fql"])
def test_two_processes_step_as_one_with_the_global_batch(tmp_path, name):
    # 2 updates (A-VGF: 3 backward passes each, over different networks; TD3+BC's actor every other update); SGD:
    # parameter differences are lr x gradient differences
    ddp = fit_steps(tmp_path / "ddp", name, 2, 4, *SGD, steps=4)
    one = fit_steps(tmp_path / "one", name, 1, 8, *SGD, steps=4)
    half = fit_steps(tmp_path / "half", name, 1, 4, *SGD, steps=4)  # rank 0's batches alone
    diff, where = max_abs_diff(ddp, one)
    assert diff < 1e-6, (diff, where)
    assert max_abs_diff(ddp, half)[0] > 1e-3  # the gradients were averaged over the ranks
