"""WB2 latitude-weighted RMSE and ACC against a hand computation with explicit loops."""
from __future__ import annotations

import math

import numpy as np
import torch

from lit_iclr.storm.metrics import WB2Scores, acc, lat_weights, rmse


def _hand(pred, obs, clim, lat):
    """Loop-by-loop WB2 definitions on (N, H, W) numpy arrays."""
    N, H, W = pred.shape
    cos = [math.cos(math.radians(v)) for v in lat]
    w = [c / (sum(cos) / H) for c in cos]
    mse_t, acc_t = [], []
    for n in range(N):
        se = sum(w[i] * (pred[n, i, j] - obs[n, i, j]) ** 2 for i in range(H) for j in range(W)) / (H * W)
        mse_t.append(se)
        num = sum(w[i] * (pred[n, i, j] - clim[n, i, j]) * (obs[n, i, j] - clim[n, i, j]) for i in range(H) for j in range(W))
        ff = sum(w[i] * (pred[n, i, j] - clim[n, i, j]) ** 2 for i in range(H) for j in range(W))
        oo = sum(w[i] * (obs[n, i, j] - clim[n, i, j]) ** 2 for i in range(H) for j in range(W))
        acc_t.append(num / math.sqrt(ff * oo))
    return math.sqrt(sum(mse_t) / N), sum(acc_t) / N


def test_rmse_and_acc_match_hand_computation():
    rng = np.random.default_rng(0)
    lat = [-60.0, -20.0, 20.0, 60.0]
    pred, obs, clim = (rng.normal(size=(3, 4, 5)) for _ in range(3))
    want_rmse, want_acc = _hand(pred, obs, clim, lat)
    w = lat_weights(torch.tensor(lat))[:, None]
    t = lambda a: torch.tensor(a, dtype=torch.float32)
    assert abs(rmse(t(pred), t(obs), w).item() - want_rmse) < 1e-5
    assert abs(acc(t(pred), t(obs), t(clim), w).item() - want_acc) < 1e-5
    # the accumulating metric over two batches gives the same numbers, per (lead, channel)
    m = WB2Scores(1, 1, w.expand(4, 5))
    m.update(t(pred[:2])[:, None, None], t(obs[:2])[:, None, None], t(clim[:2])[:, None, None])
    m.update(t(pred[2:])[:, None, None], t(obs[2:])[:, None, None], t(clim[2:])[:, None, None])
    r, a = m.compute()
    assert abs(r.item() - want_rmse) < 1e-5 and abs(a.item() - want_acc) < 1e-5


def test_lat_weights_are_cosine_normalised_to_mean_one():
    w = lat_weights(torch.tensor([-80.0, 0.0, 45.0]))
    c = np.cos(np.radians([-80.0, 0.0, 45.0]))
    np.testing.assert_allclose(w.numpy(), c / c.mean(), rtol=1e-6)
    # a perfect forecast scores RMSE 0 and ACC 1; one of opposite anomaly ACC -1
    x, clim = torch.randn(2, 3, 4), torch.zeros(2, 3, 4)
    assert rmse(x, x, w[:, None]).item() == 0
    assert abs(acc(x, x, clim, w[:, None]).item() - 1) < 1e-6 and abs(acc(-x, x, clim, w[:, None]).item() + 1) < 1e-6
