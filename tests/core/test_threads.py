"""core/threads.py: a module's thread count holds between setup and teardown, and the process's own is restored."""
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.threads import CpuThreads, check_num_threads


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_a_count_that_is_not_a_positive_integer_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match="model.num_threads must be a positive integer"):
        check_num_threads(bad)


class _Seen(LightningModule):
    def __init__(self, num_threads):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self._threads = CpuThreads(num_threads)
        self.seen: list[int] = []

    def setup(self, stage):
        self._threads.enter(self)

    def teardown(self, stage):
        self._threads.exit()

    def training_step(self, batch, _):
        self.seen.append(torch.get_num_threads())
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("n", [1, None])
def test_the_count_holds_during_fit_and_the_previous_one_comes_back(tmp_path, n):
    before = torch.get_num_threads()
    other = 3 if before != 3 else 2
    torch.set_num_threads(other)
    try:
        m = _Seen(n)
        Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, default_root_dir=tmp_path).fit(
            m, DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4))
        assert m.seen == [n or other] * 2  # null: torch's own setting is left alone
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)


def test_entering_twice_restores_the_first_value():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        t = CpuThreads(1)
        t.enter()
        t.enter()  # e.g. setup("fit") then setup("validate") in one process
        assert torch.get_num_threads() == 1
        t.exit()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
