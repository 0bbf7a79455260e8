"""`DirectOptimization`: manual and automatic optimisation straight to PyTorch give the same weights and step counts
as Lightning's wrapped path (gradient clipping, accumulation and schedulers included), and step aside when a hook is in
use; `DirectBatches` skips the batch-transfer hooks only where they do nothing."""
from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from lit_iclr.core.direct import DirectBatches, DirectOptimization
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
    direct = next(c for c in trainer.callbacks if isinstance(c, DirectOptimization))
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


class Auto(BaseModule):
    """One optimizer, a step-wise scheduler, a loss with an outlier so that clipping acts."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = (self.w(x) - 5 * x[:, :1]).pow(2).mean()
        self.log_train({"train/loss": loss})
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=0.05)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 2, 0.5),
                                                   "interval": "step"}}


class CountsZeroGrad(Callback):
    def __init__(self):
        self.calls = 0

    def on_before_zero_grad(self, trainer, pl_module, optimizer):
        self.calls += 1


def fit_auto(*callbacks, batches: int = 9, **trainer_args):
    torch.manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randn(batches * 4, 3)), batch_size=4)
    model = Auto()
    trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False, callbacks=list(callbacks),
                      **trainer_args)
    trainer.fit(model, loader)
    direct = next(c for c in trainer.callbacks if isinstance(c, DirectOptimization))
    return model, trainer, direct


@pytest.mark.parametrize("trainer_args", [
    {},
    {"gradient_clip_val": 0.05},
    {"gradient_clip_val": 0.01, "gradient_clip_algorithm": "value"},
    {"accumulate_grad_batches": 2, "gradient_clip_val": 0.05},
], ids=["plain", "clip-norm", "clip-value", "accumulate"])
def test_automatic_direct_path_equals_lightnings_wrapped_path(trainer_args):
    fast, fast_trainer, fast_direct = fit_auto(**trainer_args)
    hooks = CountsZeroGrad()
    slow, slow_trainer, slow_direct = fit_auto(hooks, **trainer_args)
    assert fast_direct.reason is None
    assert slow_direct.reason == "callback CountsZeroGrad overrides on_before_zero_grad"
    steps = -(-9 // trainer_args.get("accumulate_grad_batches", 1))  # the epoch's last, partial window steps too
    assert hooks.calls == steps
    assert fast_trainer.global_step == slow_trainer.global_step == steps
    progress = fast_trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer
    assert progress.zero_grad.total.completed == progress.step.total.completed == steps
    assert fast_trainer.optimizers[0].param_groups[0]["lr"] == slow_trainer.optimizers[0].param_groups[0]["lr"]
    for p, q in zip(fast.parameters(), slow.parameters(), strict=True):
        assert torch.equal(p, q)
    # clipping acted (a clipped and an unclipped run differ) and the model trained
    if "gradient_clip_val" in trainer_args:
        unclipped, *_ = fit_auto(**{k: v for k, v in trainer_args.items() if "clip" not in k})
        assert not all(torch.equal(p, q) for p, q in zip(fast.parameters(), unclipped.parameters(), strict=True))
    assert not any(p.equal(q) for p, q in zip(fast.parameters(), Auto().parameters(), strict=True))
    assert "_optimizer_step" not in fast_trainer.fit_loop.epoch_loop.automatic_optimization.__dict__  # restored


def test_a_module_hook_keeps_lightnings_path():
    class Hooked(Auto):
        def on_before_optimizer_step(self, optimizer):
            self.seen = getattr(self, "seen", 0) + 1

    trainer = Trainer(max_steps=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False)
    model = Hooked()
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(16, 3)), batch_size=4))
    direct = next(c for c in trainer.callbacks if isinstance(c, DirectOptimization))
    assert direct.reason == "module overrides on_before_optimizer_step"
    assert model.seen == 3


class Batches(L.LightningDataModule):
    def train_dataloader(self):
        torch.manual_seed(2)
        return DataLoader(TensorDataset(torch.randn(24, 3)), batch_size=4)


class CountsTransfers(Batches):
    calls = 0

    def on_before_batch_transfer(self, batch, dataloader_idx):
        CountsTransfers.calls += 1
        return batch


class NoBatchIdx(Auto):
    def training_step(self, batch):  # Lightning passes batch_idx only to steps that take it
        return super().training_step(batch, None)


@pytest.mark.parametrize("module", [Auto, NoBatchIdx])
def test_skipped_batch_hooks_give_the_same_training(module):
    def run(datamodule):
        trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                          enable_checkpointing=False, enable_model_summary=False)
        model = module()
        trainer.fit(model, datamodule=datamodule)
        batches = next(c for c in trainer.callbacks if isinstance(c, DirectBatches))
        return model, trainer, batches

    fast, fast_trainer, fast_batches = run(Batches())
    CountsTransfers.calls = 0
    slow, slow_trainer, slow_batches = run(CountsTransfers())
    assert fast_batches.reason is None
    assert slow_batches.reason == "datamodule overrides on_before_batch_transfer"
    assert CountsTransfers.calls == 6  # the hook still sees every batch where it is in use
    assert fast_trainer.global_step == slow_trainer.global_step == 6
    for p, q in zip(fast.parameters(), slow.parameters(), strict=True):
        assert torch.equal(p, q)
    assert not any(p.equal(q) for p, q in zip(fast.parameters(), Auto().parameters(), strict=True))
    assert "batch_to_device" not in fast_trainer.strategy.__dict__  # restored after the fit


def test_per_step_callback_hooks_reach_exactly_the_callbacks_that_use_them():
    class PerStep(Callback):
        def __init__(self):
            self.starts, self.ends = [], []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.starts.append(batch_idx)
            self.direct = "_direct_callback_hooks" in trainer.__dict__  # the direct dispatch is the one under test

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.ends.append(batch_idx)
            pl_module.log("seen", float(batch_idx))  # logging from a callback hook needs Lightning's hook name set

    per_step = PerStep()
    trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False, callbacks=[per_step])
    trainer.fit(Auto(), datamodule=Batches())
    assert per_step.direct and per_step.starts == per_step.ends == list(range(6))
    assert float(trainer.callback_metrics["seen"]) == 5.0
    assert "_direct_callback_hooks" not in trainer.__dict__  # Lightning's dispatch again after the fit
