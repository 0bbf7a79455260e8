"""Readers of the offline RL formats (D4RL HDF5, OGBench npz, Minari datasets): layouts, the optional `costs` array,
malformed files."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError
from lit_iclr.core.offline_rl import KEYS, d4rl_normalized_score, minari_data_dir, read_d4rl_hdf5, read_minari, read_ogbench_npz


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


def test_d4rl_next_observations_with_other_columns_and_negative_costs_are_named(tmp_path):
    arrays = d4rl_arrays()
    arrays["next_observations"] = np.zeros((8, 2), np.float32)  # obs have 3 columns
    with pytest.raises(DatasetFormatError, match=r"d.hdf5: key 'next_observations' has shape \(8, 2\) but "
                       r"'observations' has \(8, 3\)\n  fix: store next_observations with the columns"):
        read_d4rl_hdf5(write_h5(tmp_path / "d.hdf5", **arrays))
    arrays = d4rl_arrays()
    arrays["costs"] = np.zeros(8, np.float32)
    arrays["costs"][3] = -1.0
    with pytest.raises(DatasetFormatError, match=r"e.hdf5: key 'costs' has 1 negative values \(first at row 3: -1\)"
                       r"\n  fix: costs must be >= 0"):
        read_d4rl_hdf5(write_h5(tmp_path / "e.hdf5", **arrays), require_costs=True)


# ----------------------------------------------------------------------------------------------------------- Minari
def write_minari(datasets_path, dataset_id, episodes, env=None, **kwargs):
    """A Minari dataset written by minari's own writer (`create_dataset_from_buffers`, no jax needed), offline, into
    `datasets_path` (MINARI_DATASETS_PATH). `episodes`: dicts of observations [T + 1], actions, rewards,
    terminations, truncations [T] and optional infos {key: [T + 1] or [T]}."""
    minari = pytest.importorskip("minari")
    from minari.data_collector import EpisodeBuffer

    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(datasets_path))
    try:
        buffers = [EpisodeBuffer(id=i, observations=e["observations"], actions=e["actions"], rewards=list(e["rewards"]),
                                 terminations=list(e["terminations"]), truncations=list(e["truncations"]),
                                 infos=e.get("infos")) for i, e in enumerate(episodes)]
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # minari's advice to record author, permalink, description
            minari.create_dataset_from_buffers(dataset_id, buffers, env=env, algorithm_name="scripted", **kwargs)
    finally:
        mp.undo()
    return Path(datasets_path) / dataset_id


def reacher_episodes(n=3, steps=5, seed=0, cost_rows_with_reset=True):
    """Random-action Reacher-v5 episodes: episode 0 ends in a (declared) termination, the others are truncated."""
    import gymnasium as gym

    env, rng, out = gym.make("Reacher-v5"), np.random.default_rng(seed), []
    for ep in range(n):
        obs = [env.reset(seed=seed + ep)[0]]
        acts, rews = [], []
        for _ in range(steps):
            a = rng.uniform(-1, 1, 2).astype(np.float32)
            o, r, *_ = env.step(a)
            obs.append(o), acts.append(a), rews.append(r)
        cost = rng.integers(0, 2, steps + 1).astype(np.float32)
        out.append(dict(observations=np.array(obs), actions=np.array(acts), rewards=np.array(rews),
                        terminations=np.eye(steps, dtype=bool)[-1] & (ep == 0), truncations=np.eye(steps, dtype=bool)[-1]
                        & (ep != 0), infos={"cost": cost if cost_rows_with_reset else cost[1:]}))
    env.close()
    return out


def test_minari_dataset_written_by_minari_is_read_step_by_step(tmp_path):
    eps = reacher_episodes()
    root = write_minari(tmp_path, "mujoco/reacher/tiny-v0", eps, env="Reacher-v5", ref_min_score=-40.0,
                        ref_max_score=-4.0)
    assert (root / "data" / "main_data.hdf5").is_file() and (root / "data" / "metadata.json").is_file()
    data, meta = read_minari(root, require_costs=True)
    # independent: every step t of every episode pairs obs[t] with obs[t + 1] (the T + 1 rows), nothing dropped
    np.testing.assert_allclose(data["observations"], np.concatenate([e["observations"][:-1] for e in eps]), rtol=1e-6)
    np.testing.assert_allclose(data["next_observations"], np.concatenate([e["observations"][1:] for e in eps]), rtol=1e-6)
    np.testing.assert_allclose(data["rewards"], np.concatenate([e["rewards"] for e in eps]), rtol=1e-6)
    # only the termination zeroes the mask; truncated last steps bootstrap
    np.testing.assert_array_equal(data["masks"], 1.0 - np.concatenate([e["terminations"] for e in eps]))
    assert data["masks"].sum() == 14
    # DataCollector's infos have the reset info first: the step costs are rows 1..T
    np.testing.assert_array_equal(data["costs"], np.concatenate([e["infos"]["cost"][1:] for e in eps]))
    assert meta["ref_min_score"] == -40.0 and meta["ref_max_score"] == -4.0
    assert meta["env_spec"]["id"] == "Reacher-v5" and meta["dataset_id"] == "mujoco/reacher/tiny-v0"
    np.testing.assert_allclose(meta["episode_returns"], [e["rewards"].sum() for e in eps], rtol=1e-6)
    # the dataset folder, its data/ folder and main_data.hdf5 all name the same dataset
    assert minari_data_dir(root) == minari_data_dir(root / "data") == minari_data_dir(root / "data" / "main_data.hdf5")
    assert minari_data_dir(tmp_path) is None


def test_minari_step_costs_t_rows_dict_spaces_and_bad_rows_are_named(tmp_path):
    import gymnasium as gym

    eps = reacher_episodes(n=2, cost_rows_with_reset=False)
    data, _ = read_minari(write_minari(tmp_path, "tiny/steps-v0", eps, env="Reacher-v5"), require_costs=True)
    np.testing.assert_array_equal(data["costs"], np.concatenate([e["infos"]["cost"] for e in eps]))

    no_cost = [{k: v for k, v in e.items() if k != "infos"} for e in eps]
    root = write_minari(tmp_path, "tiny/nocost-v0", no_cost, env="Reacher-v5")
    assert "costs" not in read_minari(root)[0]
    with pytest.raises(DatasetFormatError, match="episode_0 has no infos/cost"):
        read_minari(root, require_costs=True)

    with h5py.File(root / "data" / "main_data.hdf5", "a") as f:  # a broken copy: one observation row too few
        obs = f["episode_1/observations"][()]
        del f["episode_1/observations"]
        f["episode_1/observations"] = obs[:-1]
    with pytest.raises(DatasetFormatError, match="episode_1/observations has 5 rows for 5 steps"):
        read_minari(root)

    space = gym.spaces.Dict({"observation": gym.spaces.Box(-np.inf, np.inf, (2,)),
                             "desired_goal": gym.spaces.Box(-np.inf, np.inf, (2,))})
    dict_eps = [dict(observations={"observation": np.zeros((4, 2)), "desired_goal": np.ones((4, 2))},
                     actions=np.zeros((3, 2), np.float32), rewards=np.zeros(3), terminations=np.zeros(3, bool),
                     truncations=np.eye(3, dtype=bool)[-1])]
    root = write_minari(tmp_path, "tiny/dict-v0", dict_eps, observation_space=space,
                        action_space=gym.spaces.Box(-1, 1, (2,)))
    with pytest.raises(DatasetFormatError, match=r"episode_0/observations is a group \['desired_goal', 'observation'\]"
                       r"[\s\S]*FlattenObservation"):
        read_minari(root)
    with pytest.raises(DatasetNotFoundError, match="no Minari dataset here"):
        read_minari(tmp_path / "nothing")
