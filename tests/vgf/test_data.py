"""VGF's data: the OGBench reader against OGBench's own loader, the generated layout, and the resumable batch stream.

The format readers' own tests (layouts, malformed files) live in tests/core/test_offline_rl.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_iclr.core import ConfigError
from lit_iclr.vgf.data import D4RLData, TransitionLoader, read_ogbench_npz


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


def test_updates_per_batch_groups_the_same_stream_and_resumes_inside_it():
    data = {"x": torch.arange(1000.0)}
    single = [b["x"] for b in TransitionLoader(data, 4, 7, seed=3)]
    grouped = TransitionLoader(data, 4, 7, seed=3, updates_per_batch=3)
    items = list(grouped)
    assert len(grouped) == len(items) == 3 and [len(i) for i in items] == [3, 3, 1]  # 7 steps: 3 + 3 + 1
    for a, b in zip([m["x"] for item in items for m in item], single, strict=True):
        torch.testing.assert_close(a, b)
    resumed = [m["x"] for item in TransitionLoader(data, 4, 7, seed=3, position=lambda: 9, updates_per_batch=3)
               for m in item]  # 9 steps taken: epoch 2 has 5 left, the stream's steps 9..13
    expected = [TransitionLoader(data, 4, 7, seed=3).batch(k)["x"] for k in range(9, 14)]
    assert len(resumed) == 5
    for a, b in zip(resumed, expected, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_updates_per_batch_must_be_a_positive_integer(bad, tmp_path):
    with pytest.raises(ConfigError, match="updates_per_batch"):
        TransitionLoader({"x": torch.arange(10.0)}, 2, 3, updates_per_batch=bad)
    with pytest.raises(ConfigError, match="updates_per_batch"):  # already when the DataModule is made
        D4RLData(data_dir=str(tmp_path), updates_per_batch=bad)
