"""StageRoute runs on one process: asked for two, it is refused before any process starts, naming why and the fix."""
import lightning as L
import pytest

from lit_iclr.core.ddp import check_process_count
from lit_iclr.core.errors import ConfigError
from lit_iclr.stageroute import StageRoute


def test_two_processes_are_refused_before_launch_and_one_runs():
    model = StageRoute(num_models=3, horizon=10)
    two = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False)
    with pytest.raises(ConfigError, match=r"StageRoute runs on one process only \(a bandit stream.*--trainer.devices 1"):
        check_process_count(two, model)
    check_process_count(L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False), model)
