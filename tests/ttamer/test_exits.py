"""Exit tables: the reader refuses malformed files in one line; calibration and overthinking against hand values."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError
from lit_iclr.ttamer.calibrate import fit_temperatures
from lit_iclr.ttamer.exits import ExitTable, overthinking_rate, read_exit_table


def table_arrays(n=20, s=3, c=4, seed=0):
    rng = np.random.default_rng(seed)
    return {"logits": rng.normal(size=(n, s, c)).astype(np.float32), "labels": rng.integers(0, c, n),
            "cost": np.array([1.0, 2.0, 3.0]), "kind": np.array("nested")}


def test_round_trip(tmp_path):
    t = ExitTable(torch.randn(5, 3, 4), torch.tensor([0, 1, 2, 3, 0]), torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64),
                  "cascade", torch.tensor([0.1, 0.1, 0.2], dtype=torch.float64))
    t.save(tmp_path / "t.npz")
    r = read_exit_table(tmp_path / "t.npz")
    assert torch.equal(r.logits, t.logits) and torch.equal(r.labels, t.labels) and r.kind == "cascade"
    assert torch.equal(r.latency, t.latency)


@pytest.mark.parametrize("mutate, message", [
    (lambda a: a.update(logits=a["logits"][:, :, 0]), "expected \\(N, stages, classes\\)"),
    (lambda a: a.update(labels=a["labels"][:-1]), "labels have shape"),
    (lambda a: a.update(cost=a["cost"][:2]), "one cost per stage"),
    (lambda a: a["logits"].__setitem__((0, 0, 0), np.inf), "NaN or infinite"),
    (lambda a: a.update(labels=a["labels"] + 10), "labels must be integers"),
    (lambda a: a.update(cost=np.array([1.0, -1.0, 2.0])), "positive"),
    (lambda a: a.update(kind=np.array("tree")), "kind is 'tree'"),
    (lambda a: a.pop("cost"), "missing arrays"),
])
def test_malformed_tables_are_refused(tmp_path, mutate, message):
    arrays = table_arrays()
    mutate(arrays)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DatasetFormatError, match=message) as e:
        read_exit_table(tmp_path / "bad.npz")
    assert "bad.npz" in str(e.value)


def test_missing_table(tmp_path):
    with pytest.raises(DatasetNotFoundError):
        read_exit_table(tmp_path / "calibration.npz")


def test_temperature_scaling_recovers_the_generating_temperature():
    """Labels drawn from softmax(z / T0): the fitted temperature of logits z is close to T0, per stage."""
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(20000, 2, 5, generator=g)
    t0 = torch.tensor([2.0, 0.5])
    labels = torch.multinomial(torch.softmax(z[:, 0] / t0[0], -1), 1, generator=g)[:, 0]
    labels1 = torch.multinomial(torch.softmax(z[:, 1] / t0[1], -1), 1, generator=g)[:, 0]
    t_a = fit_temperatures(z[:, :1], labels)
    t_b = fit_temperatures(z[:, 1:], labels1)
    assert float(t_a) == pytest.approx(2.0, rel=0.05) and float(t_b) == pytest.approx(0.5, rel=0.05)


def test_overthinking_rate_counts_right_then_wrong():
    labels = torch.tensor([0, 0, 0, 0])
    pred = torch.tensor([[0, 1, 0], [0, 0, 0], [1, 1, 0], [1, 0, 1]])   # overthinks: query 0 and query 3
    logits = torch.nn.functional.one_hot(pred, 2).float()
    t = ExitTable(logits, labels, torch.ones(3, dtype=torch.float64), "nested")
    assert overthinking_rate(t) == pytest.approx(0.5)
