"""Readers of the offline RL formats (D4RL HDF5, OGBench npz): layouts, the optional `costs` array, malformed files."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError
from lit_iclr.core.offline_rl import KEYS, d4rl_normalized_score, read_d4rl_hdf5, read_ogbench_npz


def write_h5(path, **arrays):
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)
    return path


def d4rl_arrays():
    """Three episodes: a terminal at row 2, a time-limit end at row 5, and an unfinished last episode (rows 6-7)."""
    obs = np.arange(8, dtype=np.float32)[:, None].repeat(3, 1)
    return dict(observations=obs, actions=np.full((8, 2), 0.5, np.float32),
                rewards=np.arange(8, dtype=np.float32) / 10,
                terminals=np.array([0, 0, 1, 0, 0, 0, 0, 0], bool), timeouts=np.array([0, 0, 0, 0, 0, 1, 0, 0], bool))


def test_d4rl_reader_derives_next_observations_within_episodes(tmp_path):
    data = read_d4rl_hdf5(write_h5(tmp_path / "d.hdf5", **d4rl_arrays()))
    # rows 5 (time-limit end) and 7 (file end) have no successor and are dropped; row 2 is terminal (mask 0)
    kept = [0, 1, 2, 3, 4, 6]
    np.testing.assert_array_equal(data["observations"][:, 0], kept)
    np.testing.assert_array_equal(data["next_observations"][:, 0], [1, 2, 2, 4, 5, 7])
    np.testing.assert_array_equal(data["masks"], [1, 1, 0, 1, 1, 1])
    np.testing.assert_allclose(data["rewards"], np.array(kept) / 10)
    assert set(data) == set(KEYS)


def test_d4rl_reader_uses_stored_next_observations(tmp_path):
    arrays = d4rl_arrays()
    arrays.pop("timeouts")
    arrays["next_observations"] = arrays["observations"] + 100
    data = read_d4rl_hdf5(write_h5(tmp_path / "d.hdf5", **arrays))
    np.testing.assert_array_equal(data["next_observations"][:, 0], np.arange(8) + 100)


@pytest.mark.parametrize("key", ["observations", "actions", "rewards", "terminals", "timeouts"])
def test_d4rl_missing_key_is_named(tmp_path, key):
    arrays = d4rl_arrays()
    arrays.pop(key)
    with pytest.raises(DatasetFormatError, match=f"missing key '{key}'"):
        read_d4rl_hdf5(write_h5(tmp_path / "d.hdf5", **arrays))


def test_d4rl_bad_values_are_named(tmp_path):
    arrays = d4rl_arrays()
    arrays["rewards"][3] = np.nan
    with pytest.raises(DatasetFormatError, match=r"key 'rewards' has 1 rows with NaN/inf \(first at row 3\)"):
        read_d4rl_hdf5(write_h5(tmp_path / "a.hdf5", **arrays))
    arrays = d4rl_arrays()
    arrays["actions"][4, 1] = 1.7
    with pytest.raises(DatasetFormatError, match=r"key 'actions' has values outside the action space .* row 4"):
        read_d4rl_hdf5(write_h5(tmp_path / "b.hdf5", **arrays))
    arrays = d4rl_arrays()
    arrays["rewards"] = arrays["rewards"][:-1]
    with pytest.raises(DatasetFormatError, match="key 'rewards' has 7 rows but 'observations' has 8"):
        read_d4rl_hdf5(write_h5(tmp_path / "c.hdf5", **arrays))
    with pytest.raises(DatasetNotFoundError):
        read_d4rl_hdf5(tmp_path / "absent.hdf5")
    (tmp_path / "junk.hdf5").write_text("not hdf5")
    with pytest.raises(DatasetFormatError, match="not a readable HDF5"):
        read_d4rl_hdf5(tmp_path / "junk.hdf5")


def ogbench_arrays():
    """Two trajectories of 4 and 3 rows; OGBench marks the last row of each with terminals = 1."""
    obs = np.arange(7, dtype=np.float32)[:, None].repeat(2, 1)
    return dict(observations=obs, actions=np.zeros((7, 2), np.float32),
                terminals=np.array([0, 0, 0, 1, 0, 0, 1], bool), rewards=np.arange(7, dtype=np.float32))


def test_ogbench_reader_pairs_rows_within_trajectories(tmp_path):
    np.savez(tmp_path / "o.npz", **ogbench_arrays())
    data = read_ogbench_npz(tmp_path / "o.npz")
    np.testing.assert_array_equal(data["observations"][:, 0], [0, 1, 2, 4, 5])
    np.testing.assert_array_equal(data["next_observations"][:, 0], [1, 2, 3, 5, 6])
    np.testing.assert_array_equal(data["rewards"], [0, 1, 2, 4, 5])


def test_ogbench_malformed_files_are_named(tmp_path):
    arrays = ogbench_arrays()
    arrays.pop("terminals")
    np.savez(tmp_path / "a.npz", **arrays)
    with pytest.raises(DatasetFormatError, match="missing key 'terminals'"):
        read_ogbench_npz(tmp_path / "a.npz")
    arrays = ogbench_arrays()
    arrays["terminals"][-1] = False
    np.savez(tmp_path / "b.npz", **arrays)
    with pytest.raises(DatasetFormatError, match="key 'terminals': the last row does not end a trajectory"):
        read_ogbench_npz(tmp_path / "b.npz")
    arrays = ogbench_arrays()
    arrays["observations"][2, 0] = np.inf
    np.savez(tmp_path / "c.npz", **arrays)
    with pytest.raises(DatasetFormatError, match="key 'observations' has 1 rows with NaN/inf"):
        read_ogbench_npz(tmp_path / "c.npz")
    np.savez(tmp_path / "d.npz", **ogbench_arrays())
    with pytest.raises(DatasetFormatError, match="missing key 'qpos'"):
        read_ogbench_npz(tmp_path / "d.npz", env=object(), env_name="cube-single-singletask-task2-v0")


def test_d4rl_costs_follow_the_kept_rows(tmp_path):
    arrays = d4rl_arrays()
    arrays["costs"] = np.arange(8, dtype=np.float32) * 2
    data = read_d4rl_hdf5(write_h5(tmp_path / "d.hdf5", **arrays), require_costs=True)
    np.testing.assert_array_equal(data["costs"], np.array([0, 1, 2, 3, 4, 6]) * 2)
    assert set(data) == set(KEYS) | {"costs"}
    # without `costs`: optional by default, an error naming the key when required
    arrays.pop("costs")
    path = write_h5(tmp_path / "e.hdf5", **arrays)
    assert "costs" not in read_d4rl_hdf5(path)
    with pytest.raises(DatasetFormatError, match="missing key 'costs'.*\n  fix: a constrained-RL dataset"):
        read_d4rl_hdf5(path, require_costs=True)


def test_d4rl_bad_costs_are_named(tmp_path):
    arrays = d4rl_arrays()
    arrays["costs"] = np.zeros(7, np.float32)
    with pytest.raises(DatasetFormatError, match="key 'costs' has 7 rows but 'observations' has 8"):
        read_d4rl_hdf5(write_h5(tmp_path / "a.hdf5", **arrays), require_costs=True)
    arrays["costs"] = np.zeros((8, 2), np.float32)
    with pytest.raises(DatasetFormatError, match=r"key 'costs' has shape \(8, 2\), expected one value per step"):
        read_d4rl_hdf5(write_h5(tmp_path / "b.hdf5", **arrays))
    arrays["costs"] = np.zeros(8, np.float32)
    arrays["costs"][5] = np.inf
    with pytest.raises(DatasetFormatError, match="key 'costs' has 1 rows with NaN/inf"):
        read_d4rl_hdf5(write_h5(tmp_path / "c.hdf5", **arrays))


def test_ogbench_costs_follow_the_paired_rows(tmp_path):
    arrays = ogbench_arrays()
    arrays["costs"] = np.arange(7, dtype=np.float32) + 10
    np.savez(tmp_path / "o.npz", **arrays)
    data = read_ogbench_npz(tmp_path / "o.npz", require_costs=True)
    np.testing.assert_array_equal(data["costs"], [10, 11, 12, 14, 15])
    np.savez(tmp_path / "p.npz", **ogbench_arrays())
    with pytest.raises(DatasetFormatError, match="missing key 'costs'"):
        read_ogbench_npz(tmp_path / "p.npz", require_costs=True)


def test_d4rl_normalized_score_is_the_papers_formula():
    np.testing.assert_allclose(d4rl_normalized_score([10.0, 55.0, 100.0], 10.0, 100.0), [0.0, 50.0, 100.0])
