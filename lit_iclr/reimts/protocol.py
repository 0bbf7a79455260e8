"""The tsdm / t-PatchGNN forecasting protocol on parsed PhysioNet 2012 records, as padded tensors.

Each record gives one sample: observations in the first `lookback_hours` are the input, the observed values in the next
`forecast_hours` are the targets. Observations are aggregated per `resolution_minutes` bin (hourly in the benchmark:
`minute // 60`, mean of repeated measurements), only bins holding at least one observation become time slots (the
series stays irregular), time is scaled to [0, 1] by `record_hours`, and slots are right-padded with mask 0.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .physionet import SERIES, VARIABLES, Records


def records_to_samples(records: Records, lookback_hours: float = 36, forecast_hours: float = 3,
                       record_hours: float = 48, resolution_minutes: int = 60,
                       variables: Sequence[str] = VARIABLES) -> tuple[dict, list[str]]:
    """Padded tensors {x, x_mask, x_time, y, y_mask, y_time, record_id} and the files of records that were dropped.

    `variables` (names from `SERIES`) are the forecast series, in that order; observations of other series are left out.

    A record is dropped (and reported) when it has no observation in the lookback window or none in the forecast
    window: there is nothing to condition on, or nothing to score.
    """
    unknown = sorted(set(variables) - set(SERIES))
    if unknown:
        raise ValueError(f"unknown variables {unknown}; PhysioNet 2012 series are {', '.join(SERIES)}")
    V = len(variables)
    column = np.full(len(SERIES), -1)  # SERIES index -> column of the sample tensors (-1: not forecast)
    column[[SERIES.index(v) for v in variables]] = np.arange(V)
    n_rec = len(records.record_ids)
    res = resolution_minutes
    minute, rec = records.obs_minute.numpy(), records.obs_record.numpy()
    var, val = column[records.obs_var.numpy()], records.obs_value.numpy()
    end = int(round((lookback_hours + forecast_hours) * 60))
    keep = (minute < end) & (var >= 0)
    minute, rec, var, val = minute[keep], rec[keep], var[keep], val[keep]
    n_bins = -(-end // res)
    bin_ = minute // res
    # mean of repeated measurements of one variable within one bin
    cell = (rec * n_bins + bin_) * V + var
    cells, inv = np.unique(cell, return_inverse=True)
    mean = np.bincount(inv, weights=val) / np.bincount(inv)
    c_rec, rem = np.divmod(cells, n_bins * V)
    c_bin, c_var = np.divmod(rem, V)
    lb_bins = int(round(lookback_hours * 60)) // res  # bins fully inside the lookback
    is_y = c_bin >= lb_bins
    has_x = np.bincount(c_rec[~is_y], minlength=n_rec) > 0
    has_y = np.bincount(c_rec[is_y], minlength=n_rec) > 0
    ok = has_x & has_y
    dropped = [records.files[i] for i in np.flatnonzero(~ok)]
    new_index = np.cumsum(ok) - 1
    sel = ok[c_rec]
    c_rec, c_bin, c_var, mean, is_y = new_index[c_rec[sel]], c_bin[sel], c_var[sel], mean[sel], is_y[sel]
    n = int(ok.sum())
    out = {"record_id": records.record_ids[torch.from_numpy(np.flatnonzero(ok))]}
    for part, m in (("x", ~is_y), ("y", is_y)):
        r, b, v, x = c_rec[m], c_bin[m], c_var[m], mean[m]
        # slots = distinct (record, bin) pairs, numbered 0.. within each record (cells are sorted by record, bin)
        slot_key = r * n_bins + b
        uniq, slot_inv = np.unique(slot_key, return_inverse=True)
        s_rec = uniq // n_bins
        first = np.searchsorted(s_rec, np.arange(n))
        slot_rank = np.arange(len(uniq)) - first[s_rec]
        L = int(slot_rank.max()) + 1
        vals = np.zeros((n, L, V), dtype=np.float32)
        mask = np.zeros((n, L, V), dtype=np.float32)
        time = np.zeros((n, L), dtype=np.float32)
        vals[r, slot_rank[slot_inv], v] = x
        mask[r, slot_rank[slot_inv], v] = 1.0
        time[s_rec, slot_rank] = (uniq % n_bins) * res / 60.0 / record_hours
        out[part], out[f"{part}_mask"], out[f"{part}_time"] = (torch.from_numpy(a) for a in (vals, mask, time))
    return out, dropped


def standardise(samples: dict, train_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-variable mean/std over the observed values of the training samples; applied in place to x and y.

    A variable with (near) zero spread, e.g. MechVent which is always 1, keeps std 1 so it is only centred.
    """
    xs = torch.cat([samples["x"][train_index].flatten(0, 1), samples["y"][train_index].flatten(0, 1)])
    ms = torch.cat([samples["x_mask"][train_index].flatten(0, 1), samples["y_mask"][train_index].flatten(0, 1)])
    count = ms.sum(0).clamp_min(1)
    mean = (xs * ms).sum(0) / count
    var = (((xs - mean) ** 2) * ms).sum(0) / count
    std = var.sqrt()
    std = torch.where(std < 1e-6, torch.ones_like(std), std)
    for part in ("x", "y"):
        samples[part] = (samples[part] - mean) / std * samples[f"{part}_mask"]
    return mean, std
