"""JULI under DDP: the phase-ordered stream is one of global batches, so on 2 CPU processes every rank is in the same
phase at every step, and the alignment + attack steps equal one process's with the same global batch."""
import pytest

from tests.ddp_steps import fit_steps, max_abs_diff

SGD = ["--model.init_args.policy_optimizer", "torch.optim.SGD", "--model.init_args.policy_optimizer.init_args.lr", "0.1",
       "--model.init_args.optimizer", "torch.optim.SGD", "--model.init_args.optimizer.init_args.lr", "0.1"]


@pytest.mark.slow  # 2 CLI runs, one with 2 processes, each building the tiny target: about 2 minutes on 2 cores
def test_two_processes_step_as_one_with_the_global_batch(tmp_path):
    # 3 alignment steps (LoRA) then 1 attack step (BiasNet): before, rank 1's second batch mixed the phases
    # ("a batch mixes phases"), the stream being cut into per-device batches; and each phase's backward reaches one
    # of the two networks, which DDP's reducer refused
    ddp = fit_steps(tmp_path / "ddp", "juli", 2, 2, *SGD, steps=4)
    one = fit_steps(tmp_path / "one", "juli", 1, 4, *SGD, steps=4)
    diff, where = max_abs_diff(ddp, one)
    assert diff < 1e-5, (diff, where)
