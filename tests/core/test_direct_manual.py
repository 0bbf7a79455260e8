"""`DirectManualOptimization`: manual optimisation straight to PyTorch gives the same weights and step counts as
Lightning's wrapped path, and steps aside when a hook is in use."""
from __future__ import annotations

import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from lit_iclr.core.direct import DirectManualOptimization
from lit_iclr.core.module import BaseModule
from lit_iclr.core.trainer import Trainer


class TwoOptimizers(BaseModule):
    """A GAN-like step: two optimizers, one backward through both parameter sets, one `inputs=` backward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)
        self.automatic_optimization = False
        self.calls = {"backward": 0, "step": 0}

    def training_step(self, batch, batch_idx):
        opt_a, opt_b = self.optimizers()
        (x,) = batch
        opt_a.zero_grad()
        opt_b.zero_grad()
        self.manual_backward(self.b(torch.tanh(self.a(x))).pow(2).mean())
        opt_a.step()
        opt_b.zero_grad()
        self.manual_backward(self.b(x @ torch.ones(3, 4)).abs().mean(), inputs=list(self.b.parameters()))
        opt_b.step()

    def configure_optimizers(self):
        return [torch.optim.Adam(self.a.parameters(), lr=1e-2), torch.optim.SGD(self.b.parameters(), lr=1e-2, momentum=0.9)]


class CountsHooks(Callback):
    def __init__(self):
        self.before_step = self.after_backward = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.before_step += 1

    def on_after_backward(self, trainer, pl_module):
        self.after_backward += 1


def fit(*callbacks, steps: int = 7):
    torch.manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randn(steps * 4, 3)), batch_size=4)
    model = TwoOptimizers()
    trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False, callbacks=list(callbacks))
    trainer.fit(model, loader)
    direct = next(c for c in trainer.callbacks if isinstance(c, DirectManualOptimization))
    return model, trainer, direct


def test_direct_path_equals_lightnings_wrapped_path():
    fast, fast_trainer, fast_direct = fit()
    hooks = CountsHooks()
    slow, slow_trainer, slow_direct = fit(hooks)
    assert fast_direct.reason is None  # the direct path ran
    assert slow_direct.reason == "callback CountsHooks overrides on_after_backward"  # Lightning's path ran
    assert hooks.before_step == 14 and hooks.after_backward == 14  # so the hooks still see every call
    assert fast_trainer.global_step == slow_trainer.global_step == 14  # 2 optimizer steps per batch, as Lightning counts
    for p, q in zip(fast.parameters(), slow.parameters(), strict=True):
        assert torch.equal(p, q)
    assert not any(p.equal(q) for p, q in zip(fast.parameters(), TwoOptimizers().parameters(), strict=True))  # it trained
    # after the fit the wrappers are Lightning's again
    assert "step" not in fast_trainer.strategy._lightning_optimizers[0].__dict__
    assert fast.__dict__["_direct_manual"] is False


def test_automatic_optimisation_keeps_lightnings_path():
    class Auto(BaseModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return self.w(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Auto(), DataLoader(TensorDataset(torch.randn(8, 3)), batch_size=4))
    direct = next(c for c in trainer.callbacks if isinstance(c, DirectManualOptimization))
    assert direct.reason == "automatic optimisation"
