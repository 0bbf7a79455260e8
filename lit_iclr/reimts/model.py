"""ReIMTS around an IMTS backbone, the backbone alone, and a resampling multi-scale baseline (plain PyTorch).

`ReIMTS` (periods [window, P_1, ..., P_L]): one backbone per level with its own parameters. Level 0 sees the whole
window (lookback observations; the forecast queries are the targets of every level); each deeper level sees the
sub-samples of `split.recursive_split`, keeping the real timestamps, and receives its parent's representation through
the backbone's gated fusion. Every sub-sample of the finest level predicts the forecast queries (targets repeated per
sub-sample, as in the reference implementation); `pred` is the finest sub-sample whose period covers the forecast start.
With `periods=[window]` it is exactly the backbone alone.

`Resampling`: the Warpformer / Hi-Patch way to get coarse scales. Each coarse level bins the lookback to a grid of
`bins[l]` hours and averages the observed values per bin (timestamps become bin centres, the within-bin sampling
pattern is lost); a backbone runs on the whole window at each scale, coarse to fine, passing its representation down
through the same fusion, and the finest level sees the original observations.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .backbones import BACKBONES
from .split import level_layout, recursive_split


def make_backbone(name: str, n_vars: int, fusion: bool, **kwargs) -> nn.Module:
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; choose one of {sorted(BACKBONES)}")
    return BACKBONES[name](n_vars, fusion=fusion, **kwargs)


class SkippedLevel(nn.Module):
    """A coarse level without fusion (r = 0): nothing of it reaches the finest forecast, so it has no parameters and
    is not run."""


def make_levels(name: str, n_vars: int, n_levels: int, fusion: bool, **kwargs) -> nn.ModuleList:
    """One backbone per level, coarse to fine; every level above the finest keeps only what feeds the finest forecast.

    With fusion a coarse level's forecast is never read, only its representation (`drop_decoder`); without fusion the
    coarse levels feed nothing (`SkippedLevel`). Every backbone is built first, so the kept parameters start from the
    same draws as when each level was whole. Parameters outside the loss's graph would get no gradient: DDP refuses them.
    """
    levels = nn.ModuleList(make_backbone(name, n_vars, fusion and lvl > 0, **kwargs) for lvl in range(n_levels))
    for lvl in range(n_levels - 1):
        if fusion:
            levels[lvl].drop_decoder()
        else:
            levels[lvl] = SkippedLevel()
    return levels


class ReIMTS(nn.Module):
    def __init__(self, backbone: str, n_vars: int, periods: list[float], lookback_hours: float, record_hours: float,
                 fusion: bool = True, backbone_kwargs: dict | None = None, align: str = "start",
                 static_slots: bool = False):
        """
        Args:
            backbone: `grafiti` or `mtan`.
            n_vars: Number of variables.
            periods: [window, P_1, ...] in hours; window = lookback + forecast. `[window]` is the backbone alone.
            align: Sub-sample grid of each parent: from its `start` or ending at its `end` (see `split.level_layout`).
            lookback_hours: Start of the forecast horizon (chooses the sub-sample used for the prediction).
            record_hours: Hours mapped to time 1 (timestamps are hours / record_hours).
            fusion: Pass the parent's representation down (False: r = 0, the ablation "without fusion").
            backbone_kwargs: Extra arguments of the backbone (d_model, n_layers, n_heads, n_ref ...).
            static_slots: Pad every sub-sample to the input's L slots (data-independent shapes, for `torch.compile`).
        """
        super().__init__()
        self.static_slots = static_slots
        self.periods = [float(p) for p in periods]
        self.record_hours = float(record_hours)
        self.fusion, self.align = fusion, align
        self.n_children, windows = level_layout(self.periods, align)
        # the finest sub-sample whose window holds the forecast start (the "horizon" sub-sample)
        self.horizon_index = next(i for i, (s, e) in enumerate(windows[-1]) if s <= lookback_hours < e)
        self.n_finest = len(windows[-1])
        kw = backbone_kwargs or {}
        self.levels = make_levels(backbone, n_vars, len(self.periods), fusion, **kw)

    def horizon_path(self) -> list[int]:
        """Per level, the sub-sample on the path from the whole window down to the horizon sub-sample."""
        path = [self.horizon_index]
        for n in reversed(self.n_children[1:]):
            path.insert(0, path[0] // n)
        return path

    def forward(self, x, x_mask, x_time, y_time, y_mask, horizon_only: bool = False) -> dict[str, Tensor]:
        """Returns `pred_all` (B, M_L, Q, V), every finest sub-sample's forecast, and `pred` (B, Q, V).

        `horizon_only` runs only the ancestors of the horizon sub-sample (one row per sample and level): `pred` is
        unchanged, since no other sub-sample feeds it, and `pred_all` is then just `pred` (B, 1, Q, V).
        """
        B = x.shape[0]
        subs = recursive_split(x, x_mask, x_time, self.periods, self.record_hours, self.align, self.static_slots)
        rep = prev = None
        for lvl, (net, sub) in enumerate(zip(self.levels, subs, strict=True)):
            if isinstance(net, SkippedLevel):
                continue
            M = sub["x"].shape[0] // B
            n = self.n_children[lvl]
            if horizon_only:
                rows = torch.arange(B, device=x.device) * M + self.horizon_path()[lvl]
                sub, M, n = {k: v[rows] for k, v in sub.items()}, 1, 1
            q_time = y_time.repeat_interleave(M, 0)  # forecast queries repeated for each sub-sample
            q_mask = y_mask.repeat_interleave(M, 0)
            parent = None
            if lvl > 0 and self.fusion:
                p_start, p_end = prev["start"].repeat_interleave(n), prev["end"].repeat_interleave(n)
                parent = net.pass_down(rep, n, sub["start"], sub["end"], p_start, p_end)
            out, rep = net(sub["x"], sub["x_mask"], sub["x_time"], q_time, q_mask, sub["start"], sub["end"], parent)
            prev = sub
        if horizon_only:
            return {"pred_all": out.unsqueeze(1), "pred": out}
        pred_all = out.view(B, self.n_finest, *out.shape[1:])
        return {"pred_all": pred_all, "pred": pred_all[:, self.horizon_index]}


def resample(x: Tensor, x_mask: Tensor, x_time: Tensor, bin_hours: float, window_hours: float,
             record_hours: float) -> tuple[Tensor, Tensor, Tensor]:
    """Average observations into bins of `bin_hours` on [0, window): (B, n_bins, V) values, mask, bin-centre times."""
    B, L, V = x.shape
    n_bins = int(-(-window_hours // bin_hours))
    b = (x_time * record_hours / bin_hours + 1e-6).floor().long().clamp(0, n_bins - 1)  # (B, L)
    idx = b.unsqueeze(-1).expand(B, L, V)
    total = x.new_zeros(B, n_bins, V).scatter_add_(1, idx, x * x_mask)
    count = x.new_zeros(B, n_bins, V).scatter_add_(1, idx, x_mask)
    mean = total / count.clamp_min(1)
    centre = ((torch.arange(n_bins, device=x.device, dtype=x.dtype) + 0.5) * bin_hours / record_hours).expand(B, -1)
    return mean, (count > 0).to(x.dtype), centre


class Resampling(nn.Module):
    def __init__(self, backbone: str, n_vars: int, bins: list[float], window_hours: float, record_hours: float,
                 fusion: bool = True, backbone_kwargs: dict | None = None):
        """
        Args:
            backbone: `grafiti` or `mtan`.
            n_vars: Number of variables.
            bins: Bin widths in hours of the coarse levels, coarsest first; the finest level is the original series.
            window_hours: Lookback + forecast hours (all levels span the whole window).
            record_hours: Hours mapped to time 1.
            fusion: Pass each level's representation to the next finer one.
            backbone_kwargs: Extra arguments of the backbone.
        """
        super().__init__()
        self.bins = [float(b) for b in bins]
        self.window_hours, self.record_hours, self.fusion = float(window_hours), float(record_hours), fusion
        kw = backbone_kwargs or {}
        self.levels = make_levels(backbone, n_vars, len(self.bins) + 1, fusion, **kw)

    def forward(self, x, x_mask, x_time, y_time, y_mask, horizon_only: bool = False) -> dict[str, Tensor]:
        B = x.shape[0]
        start = x.new_zeros(B)
        end = x.new_full((B,), self.window_hours / self.record_hours)
        inputs = [resample(x, x_mask, x_time, b, self.window_hours, self.record_hours) for b in self.bins]
        inputs.append((x, x_mask, x_time))
        rep = None
        for lvl, (net, (xi, mi, ti)) in enumerate(zip(self.levels, inputs, strict=True)):
            if isinstance(net, SkippedLevel):
                continue
            parent = net.pass_down(rep, 1, start, end, start, end) if lvl > 0 and self.fusion else None
            out, rep = net(xi, mi, ti, y_time, y_mask, start, end, parent)
        return {"pred_all": out.unsqueeze(1), "pred": out}
