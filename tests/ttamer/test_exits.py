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
            "cost": np.array([1.0, 2.0, 3.0]), "kind": np.array("nested"), "cost_convention": np.array("incremental")}


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


def exported(tmp_path, cost, **extra):
    """An exit table as another framework's export writes it: numpy.savez of plain arrays, no platform code."""
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "calibration.npz", logits=rng.normal(size=(8, len(cost), 3)).astype(np.float32),
             labels=rng.integers(0, 3, 8), cost=np.asarray(cost, dtype=np.float64), kind=np.array("nested"), **extra)
    return tmp_path / "calibration.npz"


def test_cumulative_cost_column_is_converted_to_increments(tmp_path):
    # a profiler's cumulative FLOPs up to each exit (10, 25, 45, 80) and latency (2, 5, 9, 16) ms
    path = exported(tmp_path, [10.0, 25.0, 45.0, 80.0], cost_convention=np.array("cumulative"),
                    latency=np.array([2.0, 5.0, 9.0, 16.0]))
    t = read_exit_table(path)
    assert t.cost.tolist() == [10.0, 15.0, 20.0, 35.0] and t.latency.tolist() == [2.0, 3.0, 4.0, 7.0]
    # consulting exits 0..3 costs what the export says reaching exit 3 costs, not 10 + 25 + 45 + 80 = 160
    assert float(torch.cumsum(t.cost, 0)[-1]) == 80.0
    t.save(tmp_path / "again.npz")  # written back incremental, and read back the same
    assert torch.equal(read_exit_table(tmp_path / "again.npz").cost, t.cost)


def test_rising_cost_without_a_convention_is_refused(tmp_path):
    with pytest.raises(DatasetFormatError, match="rises at every stage") as e:
        read_exit_table(exported(tmp_path, [10.0, 25.0, 45.0, 80.0]))
    assert "calibration.npz" in str(e.value) and "cost_convention='cumulative'" in str(e.value)
    t = read_exit_table(exported(tmp_path, [10.0, 25.0, 45.0, 80.0], cost_convention=np.array("incremental")))
    assert t.cost.tolist() == [10.0, 25.0, 45.0, 80.0]
    assert read_exit_table(exported(tmp_path, [10.0, 15.0, 15.0, 35.0])).cost.tolist() == [10.0, 15.0, 15.0, 35.0]
    with pytest.raises(DatasetFormatError, match="does not rise at every stage"):
        read_exit_table(exported(tmp_path, [10.0, 15.0, 15.0], cost_convention=np.array("cumulative")))
    with pytest.raises(DatasetFormatError, match="cost_convention is 'total'"):
        read_exit_table(exported(tmp_path, [3.0, 1.0], cost_convention=np.array("total")))
