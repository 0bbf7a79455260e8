"""LightningModule for deep SSM classifiers with AIRE-Prune applied at test time (no retraining)."""
from __future__ import annotations

import math

import torch
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lit_iclr.core import BaseModule, ConfigError
from lit_iclr.core.summary import CardValue, Headline

from . import aire
from .model import SSMClassifier

# Parameters of the SSM itself (Lambda, B, Delta) train with their own small learning rate and no weight decay (S5).
SSM_PARAMS = ("Lambda_re", "Lambda_im", "B", "log_step", "log_A_real", "A_imag")


class AIREPruneClassifier(BaseModule):
    def __init__(self, layer_type: str = "s5", d_input: int = 1, vocab_size: int = 0, num_classes: int = 10,
                 d_model: int = 64, n_layers: int = 4, state_size: int = 32, blocks: int = 1, conj_sym: bool = True,
                 bidirectional: bool = False, ssm_init: str = "hippo", norm: str = "layer", glu: str = "half_glu2",
                 dropout: float = 0.1, dt_min: float = 1e-3, dt_max: float = 1e-1, clip_eigs: bool = True,
                 mode: str = "fft", state_counts: list[int] | None = None, seed: int = 0,
                 optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=4e-3, weight_decay=0.05),
                 ssm_lr: float = 1e-3, warmup_steps: int = 100,
                 prune_ratio: float = 0.0, prune_method: str = "aire", prune_bidir: str = "intended",
                 prune_seed: int = 0, headline_ratio: float = 0.7,
                 headline_methods: tuple[str, ...] = ("aire", "last", "modal", "random")):
        """
        Args:
            layer_type: "s5" (MIMO S5 layers) or "s4d" (SISO S4D layers).
            d_input: Features per step of real-valued input (linked from the data).
            vocab_size: Token vocabulary, 0 for real-valued input (linked from the data).
            num_classes: Classes (linked from the data).
            d_model: H, the model width.
            n_layers: SSM blocks.
            state_size: P per layer (S5) or N per channel (S4D), before pruning.
            blocks: S5's J blocks of the HiPPO initialisation.
            conj_sym: S5: store one state per conjugate pair.
            bidirectional: Forward and backward scans (separate C).
            ssm_init: "hippo" (diagonalised HiPPO-LegS) or "s4d_lin".
            norm: "layer" or "batch" normalisation before each SSM.
            glu: Gate after the SSM: "half_glu1", "half_glu2", "full_glu" or "gelu".
            dropout: Dropout rate.
            dt_min: Smallest initial step Delta.
            dt_max: Largest initial step Delta.
            clip_eigs: S5: keep Re(Lambda) <= -1e-4 (stable, finite AIRE energy).
            mode: "fft" convolution or parallel "scan".
            state_counts: States kept per layer by an earlier pruning (null: unpruned), to reload a pruned model.
            seed: Seed of the SSM initialisations.
            optimizer: Optimizer factory; SSM parameters get lr=ssm_lr and no weight decay.
            ssm_lr: Learning rate of Lambda, B and Delta.
            warmup_steps: Linear warm-up steps before cosine decay to 0 over the run.
            prune_ratio: Fraction of states pruned when `test` starts (0: none), by slicing the model.
            prune_method: "aire", "last", "magnitude", "random" or "modal" (modal truncation, same order per layer).
            prune_bidir: Bidirectional AIRE/LAST: "intended" (mean of squared C norms) or "quirk" (official code).
            prune_seed: Seed of the random baseline.
            headline_ratio: Every validation and test of an unpruned model also scores copies pruned at this ratio
                (no retraining), one per method in `headline_methods`, logged as `<stage>/pruned_acc/<method>`: the
                run's headline, AIRE against LAST, modal truncation and random on the same model (0: off).
            headline_methods: The pruning methods scored at `headline_ratio`.
        """
        super().__init__()
        # The pruning settings stay out of the checkpoint's hyperparameters: `test --ckpt_path` copies those over the
        # command line, which would silently reset `--model.init_args.prune_ratio` to the value used in `fit`.
        self.save_hyperparameters(ignore=["optimizer", "prune_ratio", "prune_method", "prune_bidir", "prune_seed",
                                          "headline_ratio", "headline_methods"])
        self.prune_ratio, self.prune_method, self.prune_bidir, self.prune_seed = (
            prune_ratio, prune_method, prune_bidir, prune_seed)
        if not 0.0 <= prune_ratio < 1.0:
            raise ConfigError(f"prune_ratio must be in [0, 1), got {prune_ratio}")
        if prune_method not in aire.METHODS:
            raise ConfigError(f"prune_method must be one of {aire.METHODS}, got {prune_method!r}")
        if not 0.0 <= headline_ratio < 1.0:
            raise ConfigError(f"headline_ratio must be in [0, 1), got {headline_ratio}")
        unknown = [m for m in headline_methods if m not in aire.METHODS]
        if unknown:
            raise ConfigError(f"headline_methods {unknown} are not pruning methods; choose from {aire.METHODS}")
        self.headline_ratio, self.headline_methods = headline_ratio, tuple(headline_methods)
        # pruned copies of the model scored beside it during one validation / test epoch (plain dict: not submodules,
        # so never in the checkpoint)
        self._pruned: dict[str, nn.Module] = {}
        self.optimizer = optimizer
        self.model = SSMClassifier(layer_type, d_input, vocab_size, num_classes, d_model, n_layers, state_size,
                                   blocks, conj_sym, bidirectional, ssm_init, norm, glu, dropout, dt_min, dt_max,
                                   clip_eigs, mode, state_counts, seed)
        self.prune_plan: aire.PrunePlan | None = None

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(x, x_mask)

    def _step(self, batch: dict[str, torch.Tensor], stage: str) -> torch.Tensor:
        logits = self(batch["x"], batch.get("x_mask"))
        loss = nn.functional.cross_entropy(logits, batch["y"])
        acc = (logits.argmax(-1) == batch["y"]).float().mean()
        on_step = stage == "train"
        self.log(f"{stage}/loss", loss, prog_bar=True, on_step=on_step, on_epoch=True, sync_dist=not on_step,
                 batch_size=len(batch["y"]))
        self.log(f"{stage}/acc", acc, prog_bar=True, on_step=on_step, on_epoch=True, sync_dist=not on_step,
                 batch_size=len(batch["y"]))
        for method, net in self._pruned.items():
            hit = (net(batch["x"], batch.get("x_mask")).argmax(-1) == batch["y"]).float().mean()
            self.log(f"{stage}/pruned_acc/{method}", hit, on_epoch=True, sync_dist=True, batch_size=len(batch["y"]))
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def predict_step(self, batch, batch_idx):
        return self(batch["x"], batch.get("x_mask")).argmax(-1)

    # ---- pruning (post-training, no retraining) -------------------------------------------------------------------

    def prune_(self, ratio: float, method: str = "aire", bidir: str = "intended", seed: int = 0) -> aire.PrunePlan:
        """Slice the model in place to keep the states AIRE (or a baseline) selects at pruning ratio `ratio`."""
        self.model, self.prune_plan = aire.prune(self.model, ratio, method, bidir, seed)
        self.hparams.state_counts = self.model.state_counts()
        return self.prune_plan

    def _prune_copies(self) -> None:
        """Pruned copies of the unpruned model, one per headline method (post-training pruning is the method, so every
        evaluation shows what it keeps at the headline ratio next to the baselines on the same weights)."""
        self._pruned = {}
        if self.headline_ratio <= 0 or self.prune_plan is not None or self.hparams.state_counts is not None:
            return
        for method in self.headline_methods:
            net, _ = aire.prune(self.model, self.headline_ratio, method, self.prune_bidir, self.prune_seed)
            self._pruned[method] = net.eval()

    def on_validation_epoch_start(self) -> None:
        self._prune_copies()

    def on_validation_epoch_end(self) -> None:
        self._pruned = {}

    def on_test_epoch_start(self) -> None:
        self._prune_copies()

    def headline(self) -> Headline:
        r = f"{self.headline_ratio:.0%}"
        names = {"last": "LAST", "modal": "modal truncation", "random": "random", "magnitude": "magnitude"}
        baselines = {f"{names[m]} at {r}": f"{{stage}}/pruned_acc/{m}" for m in self.headline_methods if m != "aire"}
        baselines["unpruned"] = "{stage}/acc"
        return Headline(
            metric="{stage}/pruned_acc/aire", higher_is_better=True, baselines=baselines,
            card={"AIRE at 70%, 3 trained S5 seeds, 10k test": CardValue(
                76.7 / 100, "seeds/aire_prune.md, 'Three seeds' table", stage="test")},
            claim=f"pruned to {r} of its states with no retraining, AIRE keeps more accuracy than LAST, modal "
                  "truncation and random on the same weights",
            method=f"AIRE at {r}", extra=("{stage}/pruned_fraction",))

    def on_test_start(self) -> None:
        if self.prune_ratio <= 0 or self.prune_plan is not None:
            return
        before = self.model.state_macs_per_step()
        p = self.prune_(self.prune_ratio, self.prune_method, self.prune_bidir, self.prune_seed)
        per_layer = ", ".join(f"{k}/{n}" for k, n in zip(p.kept_counts, p.sizes, strict=True))
        rank_zero_info(f"AIRE-Prune: {self.prune_method} pruned {p.pruned_fraction:.1%} of the states "
                       f"(kept per layer {per_layer}); state compute {self.model.state_macs_per_step() / before:.1%} "
                       "of the unpruned model")
        if self.trainer is not None and self.trainer.loggers:
            from lit_iclr.core.figures import log_figure

            from .plots import layer_fraction_figure

            log_figure(self, f"test/{self.prune_method}_layer_fractions", layer_fraction_figure(p))

    def on_test_epoch_end(self) -> None:
        self._pruned = {}
        if self.prune_plan is not None:
            self.log("test/pruned_fraction", self.prune_plan.pruned_fraction)
            for i, f in enumerate(self.prune_plan.layer_fractions):
                self.log(f"test/pruned_fraction_layer{i}", f)

    # ---- optimisation ---------------------------------------------------------------------------------------------

    def configure_optimizers(self):
        ssm, other = [], []
        for name, param in self.model.named_parameters():
            (ssm if name.rsplit(".", 1)[-1] in SSM_PARAMS else other).append(param)
        opt = self.optimizer([{"params": other}, {"params": ssm, "lr": self.hparams.ssm_lr, "weight_decay": 0.0}])
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warm = min(self.hparams.warmup_steps, total // 2)

        def schedule(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(total - warm, 1))))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
