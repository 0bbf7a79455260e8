"""SOOPER runs on one process: asked for two, it is refused before any process starts, naming why and the fix."""
import lightning as L
import pytest

from lit_iclr.core.ddp import check_process_count
from lit_iclr.core.errors import ConfigError
from lit_iclr.sooper.module import SOOPER


def test_two_processes_are_refused_before_launch_and_one_runs():
    model = SOOPER(obs_dim=4, action_dim=2, model_hidden=[8], actor_hidden=[8], critic_hidden=[8])
    two = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False)
    with pytest.raises(ConfigError, match=r"SOOPER runs on one process only \(online RL on one stream.*--trainer.devices 1"):
        check_process_count(two, model)
    check_process_count(L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False), model)
