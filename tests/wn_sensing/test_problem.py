"""The problem file: generated default read back, malformed files refused in one line, bad sizes refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_iclr.core.errors import ConfigError, DatasetFormatError, DatasetNotFoundError
from lit_iclr.wn_sensing import MatrixSensing, SensingData
from lit_iclr.wn_sensing.problem import degrees_of_freedom, generate, image_target, read_problem


def write(path, **arrays):
    np.savez(path, **arrays)
    return path


@pytest.fixture
def good():
    return generate(10, 2, 3.0, 6.0, 0.0, "gaussian", "synthetic", "china.jpg", 0)


def test_generated_problem_reads_back_consistently(tmp_path, good):
    p = read_problem(write(tmp_path / "problem.npz", **good))
    assert p.dim == 10 and p.op.n == int(np.ceil(6.0 * degrees_of_freedom(10, 2)))
    assert torch.allclose(p.op(p.target), p.y, atol=1e-12)  # y_i = <M_i, A> exactly without noise
    eig = torch.linalg.eigvalsh(p.target)
    assert (eig[-2:] > 0.3).all() and eig[:-2].abs().max() < 1e-12  # rank 2, PSD
    assert np.isclose(float(eig[-1] / eig[-2]), 3.0)  # the requested condition number


def test_image_target_is_psd_low_rank_from_the_photograph():
    a = image_target(24, 4)
    eig = torch.linalg.eigvalsh(a)
    assert np.isclose(float(eig[-1]), 1.0) and (eig[-4:] > 0).all() and eig[:-4].abs().max() < 1e-10


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("y"), "missing arrays"),
    (lambda d: d.update(y=d["y"][:-1]), "do not match"),
    (lambda d: d.update(operator=np.array("fourier")), "operator is 'fourier'"),
    (lambda d: d.update(sensing=d["sensing"][:, :-1]), "not a square"),
    (lambda d: d["y"].__setitem__(0, np.nan), "NaN"),
    (lambda d: d.update(target=-d["target"]), "not PSD"),
    (lambda d: d.update(target=d["target"] + np.triu(np.ones_like(d["target"]), 1)), "not symmetric"),
])
def test_malformed_problem_files_are_refused(tmp_path, good, mutate, message):
    arrays = {k: np.array(v, copy=True) for k, v in good.items()}
    mutate(arrays)
    path = write(tmp_path / "problem.npz", **arrays)
    with pytest.raises(DatasetFormatError, match=message) as e:
        read_problem(path)
    assert str(path) in str(e.value)


def test_missing_and_garbled_files(tmp_path):
    with pytest.raises(DatasetNotFoundError):
        read_problem(tmp_path / "nothing.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(DatasetFormatError, match="not a readable npz"):
        read_problem(tmp_path / "bad.npz")


def test_rank_below_target_rank_is_a_config_error():
    with pytest.raises(ConfigError, match="below the target's rank 3"):
        MatrixSensing(dim=10, true_rank=3, rank=2)


def test_too_few_measurements_warns_what_happens(tmp_path):
    dm = SensingData(data_dir=str(tmp_path), dim=10, true_rank=2, measurements_per_dof=0.5)
    dm.prepare_data()
    with pytest.warns(UserWarning, match="not identifiable"):
        dm.setup("fit")


def test_options_that_shape_the_problem_key_the_cache(tmp_path):
    a = SensingData(data_dir=str(tmp_path), dim=10, true_rank=2)
    b = SensingData(data_dir=str(tmp_path), dim=10, true_rank=2, operator="rank_one")
    assert a.path != b.path
