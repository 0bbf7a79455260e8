"""WeatherBench 2 scores: latitude-weighted RMSE and ACC per variable, level and lead time.

w(lat) = cos(lat) / mean(cos(lat)).  RMSE = sqrt( mean_t  mean_ij w_i (f - o)^2 )  (WB2: time-mean of the spatial MSE,
then the square root).  ACC = mean_t  sum_ij w_i f' o' / sqrt(sum_ij w_i f'^2  sum_ij w_i o'^2), with anomalies
f' = f - c, o' = o - c against a climatology c of the training years.
"""
from __future__ import annotations

import torch
from torchmetrics import Metric


def lat_weights(lat_deg: torch.Tensor) -> torch.Tensor:
    w = torch.cos(torch.deg2rad(torch.as_tensor(lat_deg, dtype=torch.float64)))
    return (w / w.mean()).float()


def spatial_mse(pred: torch.Tensor, target: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Latitude-weighted mean over (H, W) of the squared error; `w` broadcasts against (H, W) (zeros mask points)."""
    return ((pred - target) ** 2 * w).sum((-2, -1)) / w.expand(pred.shape[-2:]).sum()


def rmse(pred: torch.Tensor, target: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(N, ..., H, W) -> (...): sqrt of the time-mean (dim 0) of the spatial MSE."""
    return spatial_mse(pred, target, w).mean(0).sqrt()


def acc_per_time(pred: torch.Tensor, target: torch.Tensor, clim: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    f, o = pred - clim, target - clim
    num = (w * f * o).sum((-2, -1))
    den = ((w * f * f).sum((-2, -1)) * (w * o * o).sum((-2, -1))).sqrt().clamp_min(1e-12)
    return num / den


def acc(pred: torch.Tensor, target: torch.Tensor, clim: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(N, ..., H, W) -> (...): time-mean of the per-time anomaly correlation."""
    return acc_per_time(pred, target, clim, w).mean(0)


class WB2Scores(Metric):
    """Accumulates (lead, channel) sums over batches (and DDP ranks): RMSE and ACC as in WB2."""

    full_state_update = False

    def __init__(self, n_leads: int, n_channels: int, weights: torch.Tensor):
        super().__init__()
        self.register_buffer("w", weights.clone(), persistent=False)
        self.add_state("sq", torch.zeros(n_leads, n_channels, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("acc", torch.zeros(n_leads, n_channels, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("n", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, target: torch.Tensor, clim: torch.Tensor) -> None:
        """pred/target/clim: (B, L, C, H, W)."""
        self.sq += spatial_mse(pred, target, self.w).sum(0).double()
        self.acc += acc_per_time(pred, target, clim, self.w).sum(0).double()
        self.n += pred.shape[0]

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.n.clamp_min(1)
        return (self.sq / n).sqrt().float(), (self.acc / n).float()
