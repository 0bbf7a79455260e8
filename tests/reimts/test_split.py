"""The timestamp-preserving recursive split and the resampling baseline, against brute-force loops."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.reimts.model import resample
from lit_iclr.reimts.split import level_layout, recursive_split


def test_layout_of_the_paper_periods():
    n, win = level_layout([39, 24, 12])
    assert n == [1, 2, 2]
    assert win == [[(0, 39)], [(0, 24), (24, 39)], [(0, 12), (12, 24), (24, 36), (36, 39)]]
    n, win = level_layout([39, 10])  # children clipped to the parent's end
    assert n == [1, 4] and win[1][-1] == (30, 39)
    with pytest.raises(ValueError):
        level_layout([24, 39])
    with pytest.raises(ValueError):
        level_layout([39, 24], align="middle")


def test_end_aligned_layout_puts_recent_hours_in_the_horizon_subsample():
    # children end at the parent's end: the sub-sample holding the forecast start (36 h) also holds hours 27..36
    n, win = level_layout([39, 24, 12], align="end")
    assert n == [1, 2, 2]
    assert win == [[(0, 39)], [(0, 15), (15, 39)], [(0, 3), (3, 15), (15, 27), (27, 39)]]


def random_batch(B=5, L=14, V=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    hours = torch.sort(torch.rand(B, L, generator=g) * 36, dim=1).values.floor()  # hourly slots, sorted
    x = torch.randn(B, L, V, generator=g)
    mask = (torch.rand(B, L, V, generator=g) < 0.5).float()
    n_valid = torch.randint(3, L + 1, (B,), generator=g)
    mask[torch.arange(L) >= n_valid[:, None]] = 0  # right padding
    return x * mask, mask, hours / 48


@pytest.mark.parametrize("align, periods, static", [("start", [39, 24, 12], False), ("end", [39, 24, 12], False),
                                                    ("end", [39, 10, 4], False), ("end", [39, 24, 12], True)])
def test_split_matches_brute_force(align, periods, static):
    x, mask, t = random_batch()
    levels = recursive_split(x, mask, t, periods, 48.0, align, static_slots=static)
    if static:  # padded to the input's L slots at every level, whatever the data
        assert all(sub["x"].shape[1] == x.shape[1] for sub in levels)
    _, windows = level_layout(periods, align)
    B = x.shape[0]
    for sub, win in zip(levels, windows, strict=True):
        M = len(win)
        assert sub["x"].shape[0] == B * M
        for b in range(B):
            for m, (s, e) in enumerate(win):
                row = b * M + m
                # brute force: the real slots whose hour lies in [s, e), in time order
                want = [i for i in range(x.shape[1]) if mask[b, i].any() and s <= t[b, i] * 48 < e]
                got = int(sub["x_mask"][row].amax(-1).sum())
                assert got == len(want)
                assert torch.equal(sub["x"][row, :got], x[b, want])
                assert torch.equal(sub["x_mask"][row, :got], mask[b, want])
                assert torch.equal(sub["x_time"][row, :got], t[b, want])  # timestamps unchanged
                assert sub["x_mask"][row, got:].sum() == 0
                assert sub["start"][row] == pytest.approx(s / 48) and sub["end"][row] == pytest.approx(e / 48)


def test_resample_bins_average_brute_force():
    x, mask, t = random_batch(seed=1)
    mean, m, centre = resample(x, mask, t, 12.0, 39.0, 48.0)
    assert mean.shape[1] == 4
    for b in range(x.shape[0]):
        for k in range(4):
            sel = (t[b] * 48 >= 12 * k) & (t[b] * 48 < 12 * (k + 1))
            for v in range(x.shape[2]):
                obs = x[b, sel, v][mask[b, sel, v] > 0]
                assert m[b, k, v] == (len(obs) > 0)
                assert mean[b, k, v] == pytest.approx(float(obs.mean()) if len(obs) else 0.0, abs=1e-6)
            assert centre[b, k] == pytest.approx((12 * k + 6) / 48)
