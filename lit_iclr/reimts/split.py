"""Timestamp-preserving recursive split of IMTS samples into sub-samples over shorter and shorter periods (ReIMTS §3).

Level 0 covers the whole window [0, P_0); each level-l sub-sample [s, e) is split into N_l = ceil(P_{l-1} / P_l)
children of period P_l laid from an origin o: [max(o + k P_l, s), min(o + (k+1) P_l, e)), k = 0..N_l-1. With
`align="start"`, o = s (the last child is the short one); with `align="end"`, o = e - N_l P_l (the first child is the
short one, so the child that holds the forecast start also holds the most recent lookback hours). An observation
goes to the child whose period holds its *real* timestamp: nothing is resampled or interpolated. Children are ordered
parent-major, so row `b * M_l + m` of a level is sub-sample m of sample b and its parent is row `b * M_{l-1} + m // N_l`.

Everything here is tensor ops over the whole batch (no per-sample loop): bucket ids by floor division, the slot of an
observation inside its bucket by a cumulative count, and one scatter into a (B * M_l, K_l, V) block.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def _check_align(align: str) -> None:
    if align not in ("start", "end"):
        raise ValueError(f"align must be 'start' or 'end', got {align!r}")


def level_layout(periods: list[float], align: str = "start") -> tuple[list[int], list[list[tuple[float, float]]]]:
    """Children per level N_l and each level's sub-sample windows [(start, end)] (same units as `periods`).

    `periods[0]` is the whole window (lookback + forecast); the rest are the shorter periods, longest first.
    """
    _check_align(align)
    if any(p <= 0 for p in periods) or any(b > a for a, b in zip(periods, periods[1:], strict=False)):
        raise ValueError(f"periods must be positive and non-increasing, got {periods}")
    n_children = [1] + [math.ceil(round(a / b, 9)) for a, b in zip(periods, periods[1:], strict=False)]
    windows = [[(0.0, float(periods[0]))]]
    for p, n in zip(periods[1:], n_children[1:], strict=True):
        level = []
        for s, e in windows[-1]:
            o = s if align == "start" else e - n * p  # origin of the children's grid
            level += [(max(o + k * p, s), min(o + (k + 1) * p, e)) for k in range(n)]
        windows.append(level)
    return n_children, windows


def bucket_index(t: Tensor, periods: list[float], n_children: list[int], align: str = "start") -> list[Tensor]:
    """Per level, the sub-sample (0..M_l-1) holding each timestamp `t` (any shape, same units as periods)."""
    _check_align(align)
    idx = torch.zeros_like(t, dtype=torch.long)
    start, end = torch.zeros_like(t), torch.full_like(t, float(periods[0]))
    out = [idx]
    for p, n in zip(periods[1:], n_children[1:], strict=True):
        # k = floor((t - o) / P_l) on the parent's grid origin o, kept inside the parent (one child may be short)
        origin = start if align == "start" else end - n * p
        k = torch.floor((t - origin) / p + 1e-6).long().clamp(0, n - 1)
        idx = idx * n + k
        start, end = torch.maximum(origin + k * p, start), torch.minimum(origin + (k + 1) * p, end)
        out.append(idx)
    return out


def scatter_to_buckets(bucket: Tensor, valid: Tensor, n_buckets: int, tensors: dict[str, Tensor],
                       min_slots: int = 1, slots: int | None = None) -> dict[str, Tensor]:
    """Move each valid time slot of (B, L, ...) tensors into (B * n_buckets, K, ...).

    `bucket` (B, L) is the sub-sample of each slot and `valid` (B, L) marks real (not padding) slots. Within a bucket
    the slots keep their time order; unused slots are zeros (so masks are 0 there). K is the most slots in one bucket
    (read from the data: one host sync), or `slots` when given: a static size (e.g. L, which no bucket can exceed), so
    the whole split has shapes known before the data and no host sync (what `torch.compile` needs).
    """
    B, L = bucket.shape
    onehot = torch.nn.functional.one_hot(bucket, n_buckets) * valid.unsqueeze(-1).long()  # (B, L, M)
    rank = (onehot.cumsum(1) * onehot).sum(-1) - 1  # position of the slot inside its bucket, -1 for padding
    K = slots if slots is not None else max(int(onehot.sum(1).max()) if L else 0, min_slots)
    b = torch.arange(B, device=bucket.device).unsqueeze(1).expand(B, L)
    keep = valid & (rank >= 0)
    # flat destination row of every slot; padding slots go to one extra dump row that is dropped (no boolean indexing,
    # so the shapes do not depend on the data)
    dump = B * n_buckets * K
    dest = torch.where(keep, (b * n_buckets + bucket) * K + rank, dump).reshape(-1)
    out = {}
    for name, x in tensors.items():
        flat = x.new_zeros((dump + 1, *x.shape[2:])).index_copy(0, dest, x.reshape(B * L, *x.shape[2:]))
        out[name] = flat[:dump].view(B * n_buckets, K, *x.shape[2:])
    return out


def recursive_split(x: Tensor, x_mask: Tensor, x_time: Tensor, periods: list[float], time_scale: float,
                    align: str = "start", static_slots: bool = False) -> list[dict[str, Tensor]]:
    """Split a batch into the sub-samples of every level.

    Args:
        x, x_mask: (B, L, V) values and observed flags; x_time: (B, L) timestamps in [0, 1] (hours / time_scale).
        periods: [window, P_1, P_2, ...] in hours. time_scale: hours that map to time 1 (record length).
        align: where each parent's children grid starts: at the parent's `start` or so that it ends at its `end`.
        static_slots: pad every sub-sample to L slots (shapes independent of the data; for `torch.compile`) instead of
            to the most slots any sub-sample of the batch holds.
    Returns:
        One dict per level with `x`, `x_mask`, `x_time` of shape (B * M_l, K_l, ...) and `start`, `end` (B * M_l,) in
        the scaled time of each sub-sample's window.
    """
    n_children, windows = level_layout(periods, align)
    t_hours = x_time * time_scale
    valid = x_mask.amax(-1) > 0
    levels = []
    for bucket, win in zip(bucket_index(t_hours, periods, n_children, align), windows, strict=True):
        M = len(win)
        sub = scatter_to_buckets(bucket, valid, M, {"x": x, "x_mask": x_mask, "x_time": x_time},
                                 slots=max(x.shape[1], 1) if static_slots else None)
        w = torch.tensor(win, dtype=x_time.dtype, device=x.device) / time_scale  # (M, 2)
        sub["start"] = w[:, 0].repeat(x.shape[0])
        sub["end"] = w[:, 1].repeat(x.shape[0])
        levels.append(sub)
    return levels
