"""T-Tamer runs on one process: asked for two, it is refused before any process starts, naming why and the fix."""
import lightning as L
import pytest

from lit_iclr.core.ddp import check_process_count
from lit_iclr.core.errors import ConfigError
from lit_iclr.ttamer import ExitPolicies


def test_two_processes_are_refused_before_launch_and_one_runs():
    model = ExitPolicies(stages=3)
    two = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False)
    with pytest.raises(ConfigError, match=r"ExitPolicies runs on one process only \(a cascade policy.*--trainer.devices 1"):
        check_process_count(two, model)
    check_process_count(L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False), model)
