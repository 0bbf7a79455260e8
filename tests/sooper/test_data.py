"""The generated offline dataset: D4RL layout with costs, costs consistent with the task, read back by the core reader;
malformed files give one clear error."""
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
    with pytest.raises(DatasetFormatError, match="cartpole_swingup has 5/1"):
        dm = SafeOfflineData(task="cartpole_swingup", root=str(small_file))
        dm.setup("fit")


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
