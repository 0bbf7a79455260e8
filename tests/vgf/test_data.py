"""VGF's data: the OGBench reader against OGBench's own loader, the generated layout, and the resumable batch stream.

The format readers' own tests (layouts, malformed files) live in tests/core/test_offline_rl.py.
"""
from __future__ import annotations

import numpy as np
import torch

from lit_iclr.vgf.data import TransitionLoader, read_ogbench_npz


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
