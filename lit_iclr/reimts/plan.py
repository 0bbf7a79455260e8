"""Paper-scale plan hooks of ReIMTS (`cli.py plan`, see `lit_iclr/core/plan.py`).

A batch is what `PhysioNet2012` yields at the tsdm protocol: hourly bins, so at most `lookback_hours` observation slots
(36) and `forecast_hours` query slots (3) per record, each over the `n_vars` series; times scaled by the record length.
The plan fills every slot (the densest record), which bounds the real, padded-to-the-batch-maximum batches.

GraFITi's graph has one edge per observation, found with `nonzero` (data-dependent, impossible on meta tensors): on
the meta device `step_loss` first runs the same step on a CPU twin of the module (the edges depend on the masks and
times only, which the plan batch fixes), records every call's edges, and replays them on meta, so the meta step has
exactly the real step's edges and shapes.
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager

import torch

from lit_iclr.core.plan_step import training_loss

DATASET = {
    "name": "PhysioNet/CinC Challenge 2012 (set-a, set-b, set-c)",
    "bytes": 3 * 4000 * 12e3,  # 12,000 record files of about 12 kB of "Time,Parameter,Value" text
    "samples": 9_704,  # 81 % of the 11,981 usable records (sequential 81 / 9 / 10 split)
    "source": "ReIMTS research notes (11,981 samples, 81/9/10); record files of the challenge release",
}

PAPER = {"params": None, "params_source": None, "steps": None, "accelerator": "H100",
         "note": "300 epochs at most; the official runs stop early (patience 10)"}


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    dm = datamodule
    bins = 60.0 / dm.resolution_minutes
    return _batch(batch_size, int(dm.lookback_hours * bins), int(dm.forecast_hours * bins), dm.n_vars, bins,
                  dm.record_hours, device)


def _batch(B: int, L: int, Q: int, V: int, bins: float, record_hours: float, device) -> dict[str, torch.Tensor]:
    """Every hourly slot of the lookback (L) and the forecast (Q) observed, for all V series."""
    x_time = (torch.arange(L, device=device, dtype=torch.float32) / bins / record_hours).expand(B, L)
    y_time = ((L + torch.arange(Q, device=device, dtype=torch.float32)) / bins / record_hours).expand(B, Q)
    return {"x": torch.zeros(B, L, V, device=device), "x_mask": torch.ones(B, L, V, device=device),
            "x_time": x_time.contiguous(), "y": torch.zeros(B, Q, V, device=device),
            "y_mask": torch.ones(B, Q, V, device=device), "y_time": y_time.contiguous()}


def step_loss(module, batch) -> torch.Tensor:
    """The masked MSE of the finest sub-samples `training_step` returns, without logging."""
    if batch["x"].device.type != "meta":
        return training_loss(module, batch)
    key = (id(module), tuple(batch["x"].shape), tuple(batch["y"].shape))
    if key not in _RECORDED:  # one CPU twin run per module and batch shape
        _RECORDED.clear()
        _RECORDED[key] = _cpu_calls(module, batch)
    recorded = _RECORDED[key]
    with _replaced({name: (lambda it: lambda *a, **k: next(it))(iter(_to_meta(recorded[name]))) for name in _DATA_DEPENDENT}):
        return training_loss(module, batch)


_RECORDED: dict[tuple, dict[str, list]] = {}

# functions whose output shapes depend on the data (`nonzero`, slot counts read on the host): (module, name)
_DATA_DEPENDENT = {"split": ("lit_iclr.reimts.model", "recursive_split"),
                   "edges": ("lit_iclr.reimts.backbones", "graph_edges")}


@contextmanager
def _replaced(fns: dict):
    saved = {}
    for key, fn in fns.items():
        mod, name = _DATA_DEPENDENT[key]
        m = importlib.import_module(mod)
        saved[key] = getattr(m, name)
        setattr(m, name, fn)
    try:
        yield
    finally:
        for key, fn in saved.items():
            mod, name = _DATA_DEPENDENT[key]
            setattr(importlib.import_module(mod), name, fn)


def _to_meta(calls: list):
    def meta(v):
        if isinstance(v, torch.Tensor):
            return v.to("meta")
        if isinstance(v, dict):
            return {k: meta(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(meta(x) for x in v)
        return v

    return [meta(c) for c in calls]


def _cpu_calls(module, batch) -> dict[str, list]:
    """The outputs of every data-dependent call of the same step run on a CPU twin (uninitialised weights: the split
    and the edges depend on the masks and times only, which the plan batch fixes)."""
    import copy

    B, L, V = batch["x"].shape
    Q = batch["y"].shape[1]
    h = module.hparams
    twin = copy.deepcopy(module).to_empty(device="cpu")
    cpu = _batch(B, L, Q, V, L / h.lookback_hours, h.record_hours, "cpu")
    found: dict[str, list] = {k: [] for k in _DATA_DEPENDENT}

    def recorder(key):
        mod, name = _DATA_DEPENDENT[key]
        real = getattr(importlib.import_module(mod), name)

        def record(*a, **k):
            found[key].append(real(*a, **k))
            return found[key][-1]
        return record

    with _replaced({k: recorder(k) for k in _DATA_DEPENDENT}), torch.no_grad():
        training_loss(twin, cpu)
    return found
