"""STORM LightningModule: multi-resolution loss with the consistency term, autoregressive rollout, WB2 metrics."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable

from lit_iclr.core.module import BaseModule
from lit_iclr.core.summary import CardValue, Headline
from lit_iclr.core.threads import CpuThreads

from .metrics import WB2Scores, lat_weights, spatial_mse
from .model import STORMNet
from .pyramid import area_weights, down

FORCINGS = 4  # cos/sin of the year fraction, cos/sin of the local solar time
WIND = ("u_component_of_wind", "v_component_of_wind")  # vector components: their sign flips across the pole
# single-scale networks (they need a training run of their own): test RMSE by lead (hours) from seeds/storm.md, the 3-seed
# benchmark (240-day planet, 100 steps x batch 4, measured with carry_state true); shown after `test` only, marked as card
SINGLE_SCALE_CARD: dict[int, dict[str, float]] = {
    6: {"params (width 50)": 0.0576, "FLOPs (width 24)": 0.0572},
    24: {"params (width 50)": 0.1944, "FLOPs (width 24)": 0.1966},
    72: {"params (width 50)": 0.4214, "FLOPs (width 24)": 0.4325},
    120: {"params (width 50)": 0.5059, "FLOPs (width 24)": 0.5236},
}


class STORM(BaseModule):
    def __init__(self, num_channels: int = 6, num_static: int = 2, history: int = 2,
                 latitudes: list[float] | None = None, longitudes: list[float] | None = None, periodic: bool = True,
                 channel_names: list[str] | None = None, step_hours: int = 6,
                 num_scales: int = 3, hidden: list[int] | None = None, num_blocks: int = 2, cross_scale: bool = True,
                 decomposition: str = "laplacian", encoder: str = "convgru", consistency_weight: float = 0.1,
                 scale_weights: list[float] | None = None, detach_rollout: bool = False, carry_state: bool = False,
                 coarsen: int = 0, compile_step: bool = False, compile_options: dict | None = None,
                 optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=2e-3, weight_decay=1e-4),
                 warmup_steps: int = 100, plot_channel: int = 0, headline_lead: int = 72, num_threads: int | None = 1):
        """
        Args:
            num_channels: Forecast channels C (linked from the data).
            num_static: Static input fields (linked).
            history: Input time steps (linked).
            latitudes: Grid latitudes in degrees, ascending (linked).
            longitudes: Grid longitudes in degrees (linked).
            periodic: Global grid that wraps around (linked; False for a regional box).
            channel_names: Names used in the logged metrics (linked).
            step_hours: Hours per model step (linked).
            num_scales: S, scale bands = forecast resolutions (1: single-scale baseline).
            hidden: Width per scale, finest first (default 32, 48, 64, ... truncated to num_scales).
            num_blocks: Rounds of per-scale blocks + cross-scale exchange.
            cross_scale: Cross-scale exchange on (False: ablation without synergy).
            decomposition: `laplacian` (invertible pyramid) or `spectral` (wavenumber bands).
            encoder: Per-scale temporal encoder: `convgru` or `attention`.
            consistency_weight: lambda_c of ||Down(y_hat^(s)) - y_hat^(s+1)||^2.
            scale_weights: w_s of the per-resolution losses (default 1 for every scale).
            detach_rollout: Stop gradients between rollout steps (cheaper, shorter memory).
            carry_state: Carry the encoders' state through the rollout (each step encodes only the newest frame);
                False (default) re-encodes the history window at every step. Trained on a 2-step rollout, a carried
                ConvGRU state meets states at 5 days it never saw in training: the default fit's 72 h RMSE was 0.435
                carried against 0.354 re-encoded (seeds/storm.md, "Why the default fit regressed").
            coarsen: Train and evaluate on the grid coarsened 2^coarsen times (separately trained resolutions).
            compile_step: `torch.compile` the model step (forcings, encoders, exchange, heads, synthesis), the hot function
                of the rollout, forward and backward; compiled on first use (one graph for the first step's window,
                one for the carried single-frame steps). The numbers equal the eager ones.
            compile_options: Keyword arguments of `torch.compile` (e.g. `{backend: aot_eager}`, `{mode: max-autotune}`).
            optimizer: Optimizer factory.
            warmup_steps: Linear warm-up steps before the cosine decay of the learning rate.
            plot_channel: Channel shown in the forecast-vs-truth figure logged at validation.
            headline_lead: Lead time (hours, one of the data's eval_lead_times) of the run summary's headline RMSE.
            num_threads: torch intra-op CPU threads while this module fits, validates or tests (restored after; None:
                torch's setting). Default 1: the convolutions are small, and on the shared 2-core machine a training step
                with 2 threads took 4.6x the CPU time of one thread (seeds/storm.md, "Default run time").
        """
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer"])
        self._threads = CpuThreads(num_threads)
        self.optimizer = optimizer
        latitudes = latitudes if latitudes is not None else [-87.1875 + 5.625 * i for i in range(32)]
        longitudes = longitudes if longitudes is not None else [5.625 * i for i in range(64)]
        self.channel_names = list(channel_names or [f"ch{i}" for i in range(num_channels)])
        hidden = list(hidden or [32 * 3 ** s // 2 ** s for s in range(num_scales)])[:num_scales]
        self.S, self.periodic, self.coarsen = num_scales, periodic, coarsen
        lat = torch.tensor(latitudes, dtype=torch.float64)
        lon = torch.tensor(longitudes, dtype=torch.float64)
        for _ in range(coarsen):
            lat, lon = lat.reshape(-1, 2).mean(1), lon.reshape(-1, 2).mean(1)
        mult = 2 ** (num_scales - 1)
        H, W = lat.numel(), lon.numel()
        self.pad = (-H % mult, -W % mult)  # grids not divisible by 2^(S-1) are padded (zero loss weight there)
        w = lat_weights(lat)[:, None].expand(H, W)
        self.register_buffer("w", F.pad(w, (0, self.pad[1], 0, self.pad[0])).contiguous(), persistent=False)
        self.register_buffer("lon_rad", torch.deg2rad(F.pad(lon[None], (0, self.pad[1]), mode="replicate")[0]
                                                      if self.pad[1] else lon).float(), persistent=False)
        # normalisation (physical = normalised * std + mean) and 6-h tendency scale: set from the data at fit time,
        # stored in checkpoints so forecasts can be made without the data module
        self.register_buffer("norm_mean", torch.zeros(num_channels))
        self.register_buffer("norm_std", torch.ones(num_channels))
        self.register_buffer("diff_scale", torch.ones(num_channels))
        self.scale_weights = list(scale_weights or [1.0] * num_scales)
        # cell areas (cos latitude) per row of the model grid (padded rows repeat the last one, as _grid pads them)
        area = torch.cos(torch.deg2rad(lat))
        area = torch.cat([area, area[-1:].expand(self.pad[0])])
        self.register_buffer("area", area.float(), persistent=False)
        is_wind = [any(v in n for v in WIND) for n in self.channel_names]
        pole_sign = torch.tensor([-1.0 if f else 1.0 for f in is_wind]) \
            if periodic and any(is_wind) and len(is_wind) == num_channels else None  # None: no vector field, no flip
        self.net = STORMNet(num_channels, num_static, FORCINGS, history, num_scales, hidden, num_blocks, cross_scale,
                            decomposition, encoder, periodic, area, pole_sign)
        self._compiled_step = None  # torch.compile(self._step), made on first use when `compile_step` is set

    # ---------------------------------------------------------------- data
    def setup(self, stage: str) -> None:
        self._threads.enter(self)  # core/threads.py: restored in teardown
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "setup"):
            dm.setup(stage)
            # a checkpoint restored after this overwrites them with the values it was trained with
            if hasattr(dm, "stats") and self.global_step == 0:
                self.norm_mean.copy_(torch.as_tensor(dm.stats["mean"]))
                self.norm_std.copy_(torch.as_tensor(dm.stats["std"]))
                self.diff_scale.copy_(torch.as_tensor(dm.stats["diff_std"] / dm.stats["std"]))

    def teardown(self, stage: str) -> None:
        self._threads.exit()

    def _grid(self, t: torch.Tensor) -> torch.Tensor:
        """Coarsen and pad (..., H, W) fields to the model grid."""
        for _ in range(self.coarsen):
            t = down(t)
        if any(self.pad):
            shape = t.shape
            flat = t.reshape(-1, 1, *shape[-2:])
            flat = F.pad(flat, (0, 0, 0, self.pad[0]), mode="replicate")
            flat = F.pad(flat, (0, self.pad[1], 0, 0), mode="circular" if self.periodic else "replicate")
            t = flat.reshape(*shape[:-2], *flat.shape[-2:])
        return t

    def forcings(self, hours: torch.Tensor) -> torch.Tensor:
        """(B, n) hours since 1970 -> (B, n, 4, H, W): season and local solar time (what the sun does)."""
        year = 2 * math.pi * torch.remainder(hours / 24.0 / 365.2425, 1.0)
        solar = 2 * math.pi * torch.remainder(hours / 24.0, 1.0)
        local = solar[..., None].float() + self.lon_rad  # (B, n, W)
        H = self.w.shape[0]
        season = torch.stack([torch.cos(year), torch.sin(year)], -1).float()[..., None, None]  # (B, n, 2, 1, 1)
        season = season.expand(*season.shape[:3], H, local.shape[-1])
        day = torch.stack([torch.cos(local), torch.sin(local)], 2)[..., None, :].expand(-1, -1, -1, H, -1)
        return torch.cat([season, day], 2)

    # ------------------------------------------------------------ forecast
    def step(self, window: torch.Tensor, static: torch.Tensor, init_hours: torch.Tensor, state: list | None = None
             ) -> tuple[list[torch.Tensor], list]:
        """One model step: window (B, T, C, H, W) ending at `init_hours` (with `state`: the new frames only) ->
        (forecasts at every resolution, finest first, y_hat^(s) = Down^s(x_t) + inc^(s) * tendency scale; encoder state)."""
        if not self.hparams.get("compile_step", False):
            return self._step(window, static, init_hours, state)
        if self._compiled_step is None:
            self._compiled_step = torch.compile(self._step, **(self.hparams.get("compile_options") or {}))
        return self._compiled_step(window, static, init_hours, state)

    def _step(self, window: torch.Tensor, static: torch.Tensor, init_hours: torch.Tensor, state: list | None = None
              ) -> tuple[list[torch.Tensor], list]:
        T = window.shape[1]
        hours = init_hours[:, None] + self.hparams.step_hours * torch.arange(-T + 1, 2, device=window.device)
        inc, state = self.net.advance(window, static, self.forcings(hours), state)
        scale = self.diff_scale[:, None, None]
        base, out, ws = window[:, -1], [], area_weights(self.area, self.S)
        for s in range(self.S):
            if s:
                base = down(base, ws[s - 1])
            out.append(base + inc[s] * scale)
        return out, state

    def rollout(self, x: torch.Tensor, static: torch.Tensor, init_hours: torch.Tensor, n_steps: int,
                detach: bool = False) -> list[list[torch.Tensor]]:
        """Autoregressive forecasts for steps 1..n_steps; each entry lists the resolutions (finest first)."""
        preds, window, t, state = [], x, init_hours, None
        carry = self.hparams.get("carry_state", False)
        for _ in range(n_steps):
            out, new_state = self.step(window if state is None else window[:, -1:], static, t, state)
            preds.append(out)
            nxt = out[0].detach() if detach else out[0]
            window = torch.cat([window[:, 1:], nxt[:, None]], 1)
            if carry:  # the next step encodes only `nxt`, continuing from the state after the frames before it
                state = [st.detach() for st in new_state] if detach else new_state
            t = t + self.hparams.step_hours
        return preds

    def forward(self, x: torch.Tensor, static: torch.Tensor, init_hours: torch.Tensor, n_steps: int = 1):
        """Finest-resolution forecasts (B, n_steps, C, H, W) in normalised units."""
        H, W = x.shape[-2:]
        preds = self.rollout(self._grid(x), self._grid(static), init_hours, n_steps)
        return torch.stack([p[0] for p in preds], 1)[..., : H // 2 ** self.coarsen, : W // 2 ** self.coarsen]

    # ---------------------------------------------------------------- loss
    def multires_loss(self, preds: list[torch.Tensor], y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """sum_s w_s LatMSE(y_hat^(s), Down^s y) and lambda_c's term sum_s LatMSE(Down y_hat^(s), y_hat^(s+1))."""
        fit, cons, target, w, ws = 0.0, 0.0, y, self.w, area_weights(self.area, self.S)
        for s, p in enumerate(preds):
            if s:
                target, w = down(target, ws[s - 1]), down(w)
            fit = fit + self.scale_weights[s] * spatial_mse(p, target, w).mean()
            if s + 1 < len(preds):
                cons = cons + spatial_mse(down(p, ws[s]), preds[s + 1], down(w)).mean()
        return fit, torch.as_tensor(cons, device=y.device)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        x, y, static = self._grid(batch["x"]), self._grid(batch["y"]), self._grid(batch["static"])
        leads = batch["lead_steps"][0].tolist()
        preds = self.rollout(x, static, batch["init_time"], max(leads), self.hparams.detach_rollout)
        fit = cons = 0.0
        for j, k in enumerate(leads):
            f, c = self.multires_loss(preds[k - 1], y[:, j])
            fit, cons = fit + f / len(leads), cons + c / len(leads)
        loss = fit + self.hparams.consistency_weight * cons
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/fit", fit)
        self.log("train/consistency", cons)
        return loss

    # ---------------------------------------------------------- evaluation
    def on_validation_epoch_start(self) -> None:
        self._scores = None

    on_test_epoch_start = on_validation_epoch_start

    def coarse_rmse(self, preds: list[torch.Tensor], y: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per coarse resolution k >= 1: (RMSE of head k, RMSE of Down^k of the finest head) against Down^k(y),
        latitude-weighted, normalised units, averaged over channels (model grid: padded rows carry zero weight)."""
        ws = area_weights(self.area, self.S)
        target, fine, w, out = y, preds[0], self.w, []
        for k in range(1, self.S):
            target, fine, w = down(target, ws[k - 1]), down(fine, ws[k - 1]), down(w)
            out.append((spatial_mse(preds[k], target, w).mean().sqrt(), spatial_mse(fine, target, w).mean().sqrt()))
        return out

    def _evaluate(self, batch: dict, batch_idx: int, prefix: str) -> None:
        y = y_all = batch["y"]
        H, W = y.shape[-2:]
        leads = batch["lead_steps"][0].tolist()
        preds = self.rollout(self._grid(batch["x"]), self._grid(batch["static"]), batch["init_time"], max(leads))
        crop = lambda t: t[..., : H // 2 ** self.coarsen, : W // 2 ** self.coarsen]
        pred = crop(torch.stack([preds[k - 1][0] for k in leads], 1))
        y, clim = self._grid(y), self._grid(batch["y_clim"])
        y, clim = crop(y), crop(clim)
        last = crop(self._grid(batch["x"][:, -1]))[:, None].expand_as(y)
        w = crop(self.w)
        if self._scores is None:
            mk = lambda: WB2Scores(len(leads), y.shape[2], w).to(self.device)
            self._scores = {"model": mk(), "persistence": mk(), "climatology": mk()}
            self._leads = leads
        self._scores["model"].update(pred, y, clim)
        self._scores["persistence"].update(last, y, clim)
        self._scores["climatology"].update(clim, y, clim)
        # consistency of the heads at the longest lead: ||Down(y_hat^(s)) - y_hat^(s+1)|| (normalised units)
        if self.S > 1:
            p, wl, errs = preds[max(leads) - 1], self.w, []
            ws = area_weights(self.area, self.S)
            for s in range(self.S - 1):
                wl = down(wl)
                errs.append(spatial_mse(down(p[s], ws[s]), p[s + 1], wl).mean().sqrt())
            cons = torch.stack(errs).mean()
            self.log(f"{prefix}/consistency_rmse", cons, sync_dist=True, batch_size=y.shape[0])
            for k, (head, down_fine) in enumerate(self.coarse_rmse(p, self._grid(y_all[:, leads.index(max(leads))])), 1):
                # head s=k against Down^k(finest forecast), the baseline a coarse head has to beat to add anything
                self.log(f"{prefix}/rmse_head_s{k}", head, sync_dist=True, batch_size=y.shape[0])
                self.log(f"{prefix}/rmse_down_fine_s{k}", down_fine, sync_dist=True, batch_size=y.shape[0])
        self.log(f"{prefix}/loss", spatial_mse(pred[:, 0], y[:, 0], w).mean(), sync_dist=True, prog_bar=True,
                 batch_size=y.shape[0])
        if batch_idx == 0 and prefix == "val" and not self.trainer.sanity_checking:
            self._figure(pred[0], y[0], leads)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, batch_idx, "test")

    def _log_scores(self, prefix: str) -> None:
        if not self._scores:
            return
        std = self.norm_std.cpu()
        for who, metric in self._scores.items():
            r, a = metric.compute()
            r, a = r.cpu(), a.cpu()
            for j, lead in enumerate(self._leads):
                hours = lead * self.hparams.step_hours
                # normalised RMSE averaged over channels: the one number per lead to compare forecasters
                self.log(f"{prefix}/rmse_norm_{hours}h/{who}", r[j].mean(), sync_dist=False)
                self.log(f"{prefix}/acc_{hours}h/{who}", a[j].mean(), sync_dist=False)
                if who == "model":
                    for c, name in enumerate(self.channel_names):
                        self.log(f"{prefix}/rmse/{name}/{hours}h", r[j, c] * std[c], sync_dist=False)
                        self.log(f"{prefix}/acc/{name}/{hours}h", a[j, c], sync_dist=False)

    def on_validation_epoch_end(self) -> None:
        self._log_scores("val")

    def on_test_epoch_end(self) -> None:
        self._log_scores("test")

    def headline(self) -> Headline:
        """Latitude-weighted RMSE (normalised units, mean over channels) at `headline_lead` hours against persistence
        and climatology scored on the same initialisations; the single-scale networks need their own training, so
        they come from the card (its 3-seed benchmark on a shorter planet, test split: not the same data as this run)."""
        h = self.hparams.get("headline_lead", 72)
        key = f"{{stage}}/rmse_norm_{h}h"
        card = {f"single-scale, same {what}": CardValue(
                    value, f"seeds/storm.md, 3-seed benchmark, 240-day planet, 100 x 4 steps, test {h} h RMSE", "test")
                for what, value in SINGLE_SCALE_CARD.get(h, {}).items()}
        return Headline(
            metric=f"{key}/model", higher_is_better=False, method="STORM",
            baselines={"persistence": f"{key}/persistence", "climatology": f"{key}/climatology"},
            card=card,
            claim=f"the multi-scale forecast has the lower {h} h RMSE than persistence and single-scale networks",
            extra=tuple(f"{{stage}}/rmse_norm_{lead}h/{who}" for lead in (6, 24, 120) if lead != h
                        for who in ("model", "persistence")))

    def _figure(self, pred: torch.Tensor, y: torch.Tensor, leads: list[int]) -> None:
        from lit_iclr.core.figures import log_figure

        fig = forecast_figure(pred, y, leads, self.hparams.plot_channel, self.channel_names,
                              self.norm_mean.cpu(), self.norm_std.cpu(), self.hparams.step_hours)
        log_figure(self, "val/forecast", fig)

    # ----------------------------------------------------------- optimiser
    def configure_optimizers(self):
        opt = self.optimizer(self.parameters())
        total = max(int(self.trainer.estimated_stepping_batches), 1) if self._trainer is not None else 1000
        warm = min(self.hparams.warmup_steps, max(total // 10, 1))

        def schedule(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(total - warm, 1))))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def forecast_figure(pred: torch.Tensor, y: torch.Tensor, leads: list[int], channel: int, names: list[str],
                    mean: torch.Tensor, std: torch.Tensor, step_hours: int):
    """Rows: truth, forecast, error for each lead (columns), in physical units."""
    import matplotlib.pyplot as plt

    c = channel
    to_phys = lambda t: (t[:, c].detach().float().cpu() * std[c] + mean[c]).numpy()
    P, Y = to_phys(pred), to_phys(y)
    fig, axes = plt.subplots(3, len(leads), figsize=(3.2 * len(leads), 6.0), squeeze=False)
    lo, hi = Y.min(), Y.max()
    err = max(abs(P - Y).max(), 1e-6)
    for j, lead in enumerate(leads):
        for i, (field, kw) in enumerate([(Y[j], dict(vmin=lo, vmax=hi, cmap="viridis")),
                                         (P[j], dict(vmin=lo, vmax=hi, cmap="viridis")),
                                         (P[j] - Y[j], dict(vmin=-err, vmax=err, cmap="RdBu_r"))]):
            ax = axes[i, j]
            im = ax.imshow(field, origin="lower", **kw)
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(["truth", "STORM", "error"][i])
            if i == 0:
                ax.set_title(f"{names[c]} +{lead * step_hours} h", fontsize=9)
    fig.colorbar(axes[0, -1].images[0], ax=axes[:2, :].ravel().tolist(), shrink=0.8)
    fig.colorbar(im, ax=axes[2, :].tolist(), shrink=0.8)
    return fig
