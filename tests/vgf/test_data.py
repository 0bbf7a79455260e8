"""Readers of the real formats (D4RL HDF5, OGBench npz), their error messages, and the resumable batch stream."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError
from lit_iclr.vgf.data import KEYS, TransitionLoader, read_d4rl_hdf5, read_ogbench_npz


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


def test_ogbench_reader_matches_ogbench_loader(ogbench_small):
    """Our reader and `ogbench.load_dataset` + `relabel_dataset` produce the same transitions and rewards."""
    import ogbench
    from ogbench.relabel_utils import relabel_dataset

    from lit_iclr.vgf.envs import make_env

    path, env_id = ogbench_small
    env = make_env(env_id)
    ours = read_ogbench_npz(path, env=env, env_name=env_id)
    ref = ogbench.load_dataset(str(path), add_info=True)
    relabel_dataset(env_id, env, ref)
    for k in ("observations", "actions", "next_observations", "rewards", "masks"):
        np.testing.assert_array_equal(ours[k], ref[k], err_msg=k)
    assert set(np.unique(ours["rewards"])) <= {-1.0, 0.0}


def test_generated_ogbench_file_has_the_benchmark_layout(ogbench_small):
    path, _ = ogbench_small
    with np.load(path) as f:
        assert {"observations", "actions", "terminals", "qpos", "qvel"} <= set(f.files)
        assert f["terminals"].dtype == bool and f["terminals"][-1]
        assert np.abs(f["actions"]).max() <= 1.0
    assert path.with_name(path.stem + "-val.npz").exists()


def test_transition_loader_continues_the_stream_from_the_models_step_count():
    data = {"x": torch.arange(1000.0)}
    steps = {"k": 0}
    loader = TransitionLoader(data, 4, 6, seed=3, position=lambda: steps["k"])
    full = []
    for _ in range(2):  # two epochs; the "model" counts consumed batches
        for b in loader:
            full.append(b["x"])
            steps["k"] += 1
    assert len(full) == 12
    # resumed after 8 consumed batches (mid-epoch 2): the remaining 4 batches of that epoch, identical to the full run
    resumed = TransitionLoader(data, 4, 6, seed=3, position=lambda: 8)
    rest = [b["x"] for b in resumed]
    assert len(rest) == 4
    for a, b in zip(rest, full[8:], strict=True):
        torch.testing.assert_close(a, b)
    assert not torch.equal(full[0], full[1])
    other_rank = TransitionLoader(data, 4, 6, seed=3, rank=1).batch(0)["x"]
    assert not torch.equal(other_rank, full[0])
