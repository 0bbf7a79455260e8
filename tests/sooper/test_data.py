"""The offline dataset: the generated D4RL layout with costs, consistent with the task, read back by the core reader;
DSRL-layout and Minari files written here; a file of another task and malformed files give one clear error."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from lit_iclr.core import DatasetFormatError
from lit_iclr.sooper.data import KEYS, SafeOfflineData
from lit_iclr.sooper.generate import generate_safe_d4rl


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("safe") / "point_goal.hdf5"
    return generate_safe_d4rl(path, "point_goal", num_episodes=3, p_expert=0.9, seed=1, task_kwargs={"max_steps": 40},
                              p_reckless=0.5)


def test_generated_file_has_the_d4rl_layout_with_costs(small_file):
    with h5py.File(small_file, "r") as f:
        assert {"observations", "actions", "rewards", "costs", "terminals", "timeouts", "next_observations"} <= set(f)
        assert f["observations"].shape == (120, 4) and f["costs"].shape == (120,)
        assert f["timeouts"][()].sum() == 3 and f["timeouts"][39] and not f["terminals"][()].any()
        nxt = f["next_observations"][()]
        # the task's rules, recomputed from the stored next states: hazard cost and negative goal distance
        np.testing.assert_array_equal(f["costs"][()], (np.linalg.norm(nxt[:, :2], axis=1) < 0.4).astype(np.float32))
        np.testing.assert_allclose(f["rewards"][()], -np.linalg.norm(nxt[:, :2] - [1.0, 0.0], axis=1), rtol=1e-5)


def test_datamodule_reads_the_default_back(tmp_path):
    dm = SafeOfflineData(task_kwargs={"max_steps": 30}, data_dir=str(tmp_path), num_episodes=2)
    dm.prepare_data()
    dm.setup("fit")
    assert set(dm.transitions) == set(KEYS)
    assert len(dm.transitions["costs"]) == 60 and (dm.obs_dim, dm.action_dim) == (4, 2)
    with h5py.File(dm.data_file, "r") as f:
        np.testing.assert_array_equal(dm.transitions["costs"].numpy(), f["costs"][()])


def copy_without(src, dst, drop=(), replace=None):
    with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
        for k in f:
            if k not in drop and isinstance(f[k], h5py.Dataset):
                g.create_dataset(k, data=(replace or {}).get(k, f[k][()]))
    return dst


def test_missing_costs_mismatched_lengths_and_wrong_task_are_named(small_file, tmp_path):
    def setup(path, **kw):
        dm = SafeOfflineData(root=str(path), task_kwargs={"max_steps": 40}, **kw)
        dm.setup("fit")

    with pytest.raises(DatasetFormatError, match="missing key 'costs'"):
        setup(copy_without(small_file, tmp_path / "a.hdf5", drop=("costs",)))
    with h5py.File(small_file, "r") as f:
        short = f["costs"][()][:-5]
    with pytest.raises(DatasetFormatError, match="key 'costs' has 115 rows but 'observations' has 120"):
        setup(copy_without(small_file, tmp_path / "b.hdf5", replace={"costs": short}))
    with pytest.raises(DatasetFormatError, match="recorded on task 'point_goal' but data.task is 'cartpole_swingup'"):
        SafeOfflineData(task="cartpole_swingup", root=str(small_file)).setup("fit")
    # a file that records no task (DSRL's own files: arrays only) is checked on its dimensions, with a warning
    bare = copy_without(small_file, tmp_path / "c.hdf5")
    with pytest.raises(DatasetFormatError, match="cartpole_swingup has 5/1"), pytest.warns(UserWarning, match="no task"):
        SafeOfflineData(task="cartpole_swingup", root=str(bare)).setup("fit")


def test_safe_episode_flags_match_the_files_episodes(small_file):
    """BC-Safe's flag: recomputed per episode from the file's timeouts (3 episodes of 40 steps)."""
    from lit_iclr.core.offline_rl import read_d4rl_hdf5
    from lit_iclr.sooper.data import safe_episodes

    data = read_d4rl_hdf5(small_file, require_costs=True)
    with h5py.File(small_file, "r") as f:
        per_episode = f["costs"][()].reshape(3, 40).sum(1)
    flags = safe_episodes(data, max_cost=0.0)
    assert 0 < flags.mean() < 1  # this file holds safe and costly episodes
    np.testing.assert_array_equal(flags, np.repeat(per_episode <= 0.0, 40).astype(np.float32))
    np.testing.assert_array_equal(safe_episodes(data, max_cost=1e9), np.ones(120, np.float32))


def test_a_file_recorded_on_another_task_is_refused_in_one_line(tmp_path):
    """Same dimensions, other rules: a hazard of radius 0.6 or another goal must not train the 0.4-hazard task."""
    other = generate_safe_d4rl(tmp_path / "r06.hdf5", "point_goal", num_episodes=1, seed=2,
                               task_kwargs={"max_steps": 20, "hazard_radius": 0.6})
    with pytest.raises(DatasetFormatError, match=r"r06.hdf5: the dataset was recorded on point_goal with "
                       r"hazard_radius=0.6 \(config: 0.4\)\n  fix: point root at a dataset recorded on this task"):
        SafeOfflineData(root=str(other), task_kwargs={"max_steps": 20}).setup("fit")
    with pytest.raises(DatasetFormatError, match=r"goal=\[1.0, 0.0\] \(config: \[1.0, 0.5\]\), hazard_radius=0.6"):
        SafeOfflineData(root=str(other), task_kwargs={"goal": (1.0, 0.5)}).setup("fit")
    dm = SafeOfflineData(root=str(other), task_kwargs={"hazard_radius": 0.6, "max_steps": 50})  # episode length may differ
    dm.setup("fit")
    assert len(dm.transitions["costs"]) == 20


def write_dsrl(path, obs_cols=4, next_cols=4, costs=None, n=6):
    """A file in DSRL/OSRL's published layout (arrays only, no metadata), written with h5py."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["observations"] = rng.normal(size=(n, obs_cols)).astype(np.float32)
        f["next_observations"] = rng.normal(size=(n, next_cols)).astype(np.float32)
        f["actions"] = rng.uniform(-1, 1, (n, 2)).astype(np.float32)
        f["rewards"] = rng.normal(size=n).astype(np.float32)
        f["costs"] = np.zeros(n, np.float32) if costs is None else np.asarray(costs, np.float32)
        f["terminals"] = np.zeros(n, bool)
        f["timeouts"] = np.eye(n, dtype=bool)[-1]
    return path


def test_dsrl_next_observations_of_other_width_and_negative_costs_give_one_line(tmp_path):
    import warnings

    warnings.simplefilter("ignore", UserWarning)  # "records no task"
    with pytest.raises(DatasetFormatError, match=r"wide.hdf5: key 'next_observations' has shape \(6, 3\) but "
                       r"'observations' has \(6, 4\)\n  fix: store next_observations with the columns of observations"):
        SafeOfflineData(root=str(write_dsrl(tmp_path / "wide.hdf5", next_cols=3))).setup("fit")
    with pytest.raises(DatasetFormatError, match=r"neg.hdf5: key 'costs' has 2 negative values \(first at row 1: -1\)"
                       r"\n  fix: costs must be >= 0"):
        SafeOfflineData(root=str(write_dsrl(tmp_path / "neg.hdf5", costs=[0, -1, 0, -1, 1, 0]))).setup("fit")
    dm = SafeOfflineData(root=str(write_dsrl(tmp_path / "ok.hdf5", costs=[0, 1, 0, 1, 1, 0])))
    dm.setup("fit")
    np.testing.assert_array_equal(dm.transitions["costs"].numpy(), [0, 1, 0, 1, 1, 0])


# ----------------------------------------------------------------------------------------------------------- Minari
@pytest.fixture
def registered_point_goal():
    """The point-goal task registered with gymnasium under a test id, so minari records its env_spec."""
    import gymnasium

    env_id = "LitIclrTestPointGoal-v0"
    gymnasium.register(env_id, entry_point="lit_iclr.sooper.envs:PointGoal", kwargs={"max_steps": 6})
    yield env_id
    del gymnasium.registry[env_id]


def point_goal_episodes(env, n=2, seed=0):
    """Episodes collected as minari.DataCollector(record_infos=True) stores them: T + 1 observations and infos (the
    reset's first), T actions / rewards / terminations / truncations."""
    rng, out = np.random.default_rng(seed), []
    for ep in range(n):
        o, info = env.reset(seed=seed + ep)
        obs, costs, acts, rews, terms, truncs = [o], [info["cost"]], [], [], [], []
        done = False
        while not done:
            a = rng.uniform(-1, 1, 2).astype(np.float32)
            o, r, te, tr, info = env.step(a)
            obs.append(o), costs.append(info["cost"]), acts.append(a), rews.append(r), terms.append(te), truncs.append(tr)
            done = te or tr
        out.append(dict(observations=np.array(obs), actions=np.array(acts), rewards=np.array(rews),
                        terminations=np.array(terms), truncations=np.array(truncs),
                        infos={"cost": np.array(costs, np.float32)}))
    return out


def test_minari_dataset_with_infos_cost_is_read_and_its_env_spec_compared(tmp_path, registered_point_goal):
    import gymnasium

    from lit_iclr.sooper.envs import PointGoal
    from tests.core.test_offline_rl import write_minari

    env = PointGoal(max_steps=6, hazard=(-1.0, 0.0), hazard_radius=0.3)  # starts inside the hazard: costs 1
    eps = point_goal_episodes(env)
    spec = gymnasium.spec(registered_point_goal)
    spec.kwargs = {"max_steps": 6, "hazard": [-1.0, 0.0], "hazard_radius": 0.3}
    root = write_minari(tmp_path, "sooper/point-goal/tiny-v0", eps, env=spec)
    dm = SafeOfflineData(root=str(root), task_kwargs={"hazard": (-1.0, 0.0), "hazard_radius": 0.3})
    dm.setup("fit")
    costs = np.concatenate([e["infos"]["cost"][1:] for e in eps])  # step costs, after the reset's info
    assert costs.sum() > 0
    np.testing.assert_array_equal(dm.transitions["costs"].numpy(), costs)
    np.testing.assert_allclose(dm.transitions["next_observations"].numpy(),
                               np.concatenate([e["observations"][1:] for e in eps]))
    assert dm.data_file == root / "data" / "main_data.hdf5"
    with pytest.raises(DatasetFormatError, match=r"recorded on point_goal with hazard=\[-1.0, 0.0\] \(config: \[0.0, "
                       r"0.0\]\), hazard_radius=0.3 \(config: 0.4\)"):
        SafeOfflineData(root=str(root)).setup("fit")
    with pytest.raises(DatasetFormatError, match="recorded on task 'point_goal' but data.task is 'cartpole_swingup'"):
        SafeOfflineData(root=str(root), task="cartpole_swingup").setup("fit")
