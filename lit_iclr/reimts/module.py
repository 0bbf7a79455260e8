"""LightningModule for IMTS forecasting: a backbone alone, ReIMTS(backbone), ReIMTS without fusion, or resampling."""
from __future__ import annotations

from typing import Literal

import torch
from lightning.pytorch.cli import OptimizerCallable

from lit_iclr.core import BaseModule, ConfigError
from lit_iclr.core.figures import log_figure
from lit_iclr.core.summary import CardValue, Headline

from .model import ReIMTS, Resampling
from .plots import forecast_figure


def masked_errors(pred: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sums of squared and absolute errors over observed points, and their count (masked MSE/MAE = sum / count)."""
    err = (pred - y) * mask
    return (err**2).sum(), err.abs().sum(), mask.sum()


def naive_forecasts(batch: dict) -> dict[str, torch.Tensor]:
    """Two forecasts that need no training, on the batch's own lookback, for every target point: each variable's last
    observed value and its lookback mean (0, the standardised training mean, for a variable the lookback never saw)."""
    x, m = batch["x"], batch["x_mask"]
    seen = m.sum(1)
    t = torch.where(m > 0, batch["x_time"].unsqueeze(-1).expand_as(x), torch.full_like(x, -torch.inf))
    last = x.gather(1, t.argmax(1, keepdim=True)).squeeze(1) * (seen > 0)
    mean = (x * m).sum(1) / seen.clamp_min(1)
    horizon = batch["y"].shape[1]
    return {name: v.unsqueeze(1).expand(-1, horizon, -1) for name, v in (("last_value", last), ("lookback_mean", mean))}


NAIVE = ("last_value", "lookback_mean")


class IMTSForecaster(BaseModule):
    def __init__(
        self,
        n_vars: int = 36,
        lookback_hours: float = 36.0,
        forecast_hours: float = 3.0,
        record_hours: float = 48.0,
        backbone: Literal["grafiti", "mtan"] = "grafiti",
        variant: Literal["backbone", "reimts", "reimts_nofusion", "resampling"] = "reimts",
        periods: list[float] = (24.0, 12.0),
        resample_bins: list[float] = (12.0, 4.0),
        d_model: int = 32,
        n_layers: int = 2,
        n_heads: int = 4,
        n_ref: int = 16,
        finest_loss: Literal["all", "horizon"] = "horizon",
        align: Literal["start", "end"] = "end",
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-3),
        plot_every_n_epochs: int = 1,
        compile: bool = False,
        compile_options: dict | None = None,
    ):
        """
        Args:
            n_vars: Number of variables (linked from the data).
            lookback_hours: Lookback window in hours (linked from the data).
            forecast_hours: Forecast horizon in hours (linked from the data).
            record_hours: Hours mapped to time 1 by the data's time scaling (linked from the data).
            backbone: IMTS backbone: `grafiti` or `mtan`.
            variant: `backbone` (alone), `reimts`, `reimts_nofusion` (parent representation r = 0) or `resampling`.
            periods: ReIMTS shorter periods in hours after the whole window, e.g. [24, 12] gives 39 -> 24 -> 12 h.
            resample_bins: Coarse bin widths in hours of the `resampling` baseline, coarsest first.
            d_model: Backbone width.
            n_layers: GraFITi graph attention layers.
            n_heads: Attention heads (GraFITi; mTAN uses 1).
            n_ref: mTAN reference points per (sub-)sample.
            finest_loss: Train on the forecasts of `all` finest sub-samples (targets repeated per sub-sample, as the
                reference code does) or only on the `horizon` sub-sample used at test time.
            align: Sub-sample windows of each split: `end` (children end at the parent's end, so the sub-sample that
                holds the forecast start also holds the most recent lookback hours) or `start` (children start at the
                parent's start; with 39 -> 24 -> 12 h the horizon sub-sample [36, 39) then holds no observation).
            optimizer: Optimizer factory.
            plot_every_n_epochs: Log a forecast figure of one validation patient every this many epochs (0: never).
            compile: `torch.compile` the model's forward (the hot step: split, every level's backbone and fusion). The
                sub-samples are then padded to a static slot count (no data-dependent bucket size), and GraFITi's edge
                extraction (`nonzero`) stays an eager island with the edge count as a dynamic size. Off by default:
                see the card for the measured effect on CPU.
            compile_options: Keyword arguments of `torch.compile` (default `{dynamic: true}`; e.g. `{backend: aot_eager}`).
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self.optimizer = optimizer
        window = lookback_hours + forecast_hours
        kw = {"d_model": d_model}
        if backbone == "grafiti":
            kw |= {"n_layers": n_layers, "n_heads": n_heads}
        elif backbone == "mtan":
            kw |= {"n_ref": n_ref}
        else:
            raise ConfigError(f"model.backbone must be 'grafiti' or 'mtan', got {backbone!r}")
        if variant in ("backbone", "reimts", "reimts_nofusion"):
            levels = [window] + (list(periods) if variant != "backbone" else [])
            if any(p >= window for p in levels[1:]):
                raise ConfigError(f"model.periods {list(periods)} must be shorter than the {window} h window")
            self.net = ReIMTS(backbone, n_vars, levels, lookback_hours, record_hours,
                              fusion=variant == "reimts", backbone_kwargs=kw, align=align, static_slots=compile)
        elif variant == "resampling":
            self.net = Resampling(backbone, n_vars, list(resample_bins), window, record_hours, backbone_kwargs=kw)
        else:
            raise ConfigError(f"model.variant must be backbone, reimts, reimts_nofusion or resampling, got {variant!r}")
        self._sums: torch.Tensor | None = None  # running [sum sq err, sum abs err, n observed] of an eval epoch
        self._compiled_forward = None  # torch.compile(self.net.forward), made on first use when `compile` is set

    def forward(self, batch: dict, horizon_only: bool = True) -> dict:
        """`pred` (B, Q, V) is the forecast; with `horizon_only=False`, `pred_all` holds every finest sub-sample's."""
        fn = self.net
        if self.hparams.get("compile", False):
            if self._compiled_forward is None:  # a compiled bound method, so no second copy of the weights is registered
                self._compiled_forward = torch.compile(self.net.forward,
                                                       **({"dynamic": True} | (self.hparams.compile_options or {})))
            fn = self._compiled_forward
        return fn(batch["x"], batch["x_mask"], batch["x_time"], batch["y_time"], batch["y_mask"], horizon_only=horizon_only)

    def training_step(self, batch, batch_idx):
        # loss on the finest level: masked MSE of the finest sub-samples against the (repeated) forecast targets; with
        # finest_loss="horizon" only the horizon sub-sample and its ancestors are computed (nothing else feeds it)
        out = self(batch, horizon_only=self.hparams.finest_loss == "horizon")
        pred_all = out["pred_all"]
        se, _, n = masked_errors(pred_all, batch["y"].unsqueeze(1), batch["y_mask"].unsqueeze(1).expand_as(pred_all))
        # Data-parallel: the masked MSE is over the observed points of the whole (global) batch, whose count differs
        # between ranks; DDP averages the ranks' gradients, so each rank's loss is its squared errors over the global
        # count, times the number of ranks (one all-reduce of two scalars; on one process this is se / n).
        trainer = self._trainer  # None when the step is called directly (benchmarks/reimts.py times it so)
        sums = torch.stack([se.detach(), n])
        se_all, n_all = trainer.strategy.reduce(sums, reduce_op="sum") if trainer is not None else sums
        loss = se * (trainer.world_size if trainer is not None else 1) / n_all.clamp_min(1)
        self.log("train/loss", se_all / n_all.clamp_min(1), prog_bar=True, batch_size=len(batch["x"]))
        return loss

    def _eval_step(self, batch, stage: str, batch_idx: int):
        out = self(batch)
        se, ae, n = masked_errors(out["pred"], batch["y"], batch["y_mask"])
        naive = naive_forecasts(batch)
        naive_se = [masked_errors(naive[k], batch["y"], batch["y_mask"])[0] for k in NAIVE]
        # point-weighted masked MSE/MAE over the whole split (sum over batches / number of observed points)
        sums = torch.stack([se, ae, n, *naive_se]).detach()
        self._sums = sums if batch_idx == 0 or self._sums is None else self._sums + sums
        if stage == "val" and batch_idx == 0 and self._should_plot():
            dm = getattr(self.trainer, "datamodule", None)
            names = getattr(dm, "variable_names", None)
            log_figure(self, "val/forecast", forecast_figure(batch, out["pred"].detach(), 0, names))

    def _should_plot(self) -> bool:
        k = self.hparams.plot_every_n_epochs
        return bool(k) and self.trainer is not None and not self.trainer.sanity_checking and self.current_epoch % k == 0

    def _log_sums(self, stage: str):
        # every rank joins the reduction, also one whose share of the split was empty (else the others would wait)
        sums = self._sums if self._sums is not None else torch.zeros(3 + len(NAIVE), device=self.device)
        se, ae, n, *naive_se = self.trainer.strategy.reduce(sums, reduce_op="sum")
        self._sums = None
        if n == 0:
            return
        self.log(f"{stage}/mse", se / n, prog_bar=stage == "val")
        self.log(f"{stage}/mae", ae / n)
        for name, value in zip(NAIVE, naive_se, strict=True):
            self.log(f"{stage}/mse_{name}", value / n)

    def headline(self) -> Headline:
        return Headline(
            metric="{stage}/mse", higher_is_better=False, method=f"ReIMTS ({self.hparams.variant})",
            baselines={f"{name.replace('_', ' ')} (no training)": f"{{stage}}/mse_{name}" for name in NAIVE},
            # the backbone alone, same data and steps: benchmarks/reimts.py, 3 seeds (test MSE)
            card={"GraFITi backbone": CardValue(0.7488, "seeds/reimts.md, 'Rerun on data v3', test MSE", "test"),
                  "ReIMTS(GraFITi)": CardValue(0.7019, "seeds/reimts.md, 'Rerun on data v3', test MSE", "test"),
                  "GraFITi, 3 layers": CardValue(0.5280, "seeds/reimts.md, 'Rerun on data v3', test MSE", "test")},
            claim="the recursive multi-scale forecaster has the lower masked MSE (standardised units)")

    def on_validation_epoch_start(self):
        self._sums = None

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val", batch_idx)

    def on_validation_epoch_end(self):
        self._log_sums("val")

    def on_test_epoch_start(self):
        self._sums = None

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test", batch_idx)

    def on_test_epoch_end(self):
        self._log_sums("test")

    def configure_optimizers(self):
        return self.optimizer(self.parameters())
