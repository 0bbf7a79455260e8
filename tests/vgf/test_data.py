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


# ---------------------------------------------------------------------------------------------------------- Minari
def test_minari_dataset_trains_vgf_and_its_reference_returns_normalise_the_score(tmp_path):
    from tests.core.test_offline_rl import reacher_episodes, write_minari

    eps = reacher_episodes(n=3, steps=6)
    root = write_minari(tmp_path / "minari", "mujoco/reacher/tiny-v0", eps, env="Reacher-v5", ref_min_score=-40.0,
                        ref_max_score=-4.0)
    dm = D4RLData(root=str(root), data_dir=str(tmp_path), normalize_rewards=True)  # detected by its layout
    dm.prepare_data()
    dm.setup("fit")
    assert dm.data_file == root / "data" / "main_data.hdf5"
    rewards = np.concatenate([e["rewards"] for e in eps])
    returns = np.array([e["rewards"].sum() for e in eps])
    # FQL's normalisation over the dataset's episode returns, the episodes being Minari's own
    np.testing.assert_allclose(dm.transitions["rewards"].numpy(), rewards * 1000 / (returns.max() - returns.min()),
                               rtol=1e-5)
    np.testing.assert_allclose(dm.transitions["next_observations"].numpy(),
                               np.concatenate([e["observations"][1:] for e in eps]), rtol=1e-6)
    # D4RL's score with the reference returns Minari records: 100 (R - ref_min) / (ref_max - ref_min)
    np.testing.assert_allclose(dm.score(np.array([-40.0, -22.0, -4.0]), np.zeros(3)), [0.0, 50.0, 100.0])
    explicit = D4RLData(root=str(root / "data"), data_format="minari", ref_min_score=-30.0, ref_max_score=-10.0)
    explicit.setup("fit")
    np.testing.assert_allclose(explicit.score(np.array([-20.0]), np.zeros(1)), [50.0])  # arguments win


def test_minari_dataset_of_another_environment_or_missing_is_refused(tmp_path):
    import pytest

    from lit_iclr.core import ConfigError, DatasetFormatError, DatasetNotFoundError
    from tests.core.test_offline_rl import reacher_episodes, write_minari

    root = write_minari(tmp_path, "mujoco/reacher/tiny-v0", reacher_episodes(n=2), env="Reacher-v5")
    with pytest.raises(DatasetFormatError, match="recorded in Reacher-v5 but data.env_id is HalfCheetah-v5[\\s\\S]*"
                       "set data.init_args.env_id: Reacher-v5"):
        D4RLData(env_id="HalfCheetah-v5", root=str(root)).setup("fit")
    with pytest.raises(DatasetNotFoundError, match="no Minari dataset here"):
        D4RLData(root=str(tmp_path / "mujoco"), data_format="minari").setup("fit")
    with pytest.raises(ConfigError, match="data_format: minari needs data.init_args.root"):
        D4RLData(data_format="minari")


def test_a_minari_folder_is_reachable_from_the_config(tmp_path):
    """`data.init_args.root` at a Minari dataset trains the tiny twin through the CLI (the score with its references is
    checked above, so evaluation is skipped here)."""
    from pathlib import Path

    from lit_iclr.cli import main
    from tests.core.test_offline_rl import reacher_episodes, write_minari

    root = write_minari(tmp_path / "minari", "mujoco/reacher/tiny-v0", reacher_episodes(n=2, steps=6), env="Reacher-v5",
                        ref_min_score=-40.0, ref_max_score=-4.0)
    cfg = Path(__file__).resolve().parents[2] / "tests" / "configs" / "vgf.yaml"
    cli = main(["fit", "--config", str(cfg), "--trainer.default_root_dir", str(tmp_path / "run"),
                "--data.init_args.data_dir", str(tmp_path / "data"), "--data.init_args.root", str(root),
                "--trainer.limit_val_batches", "0"])
    dm = cli.datamodule
    assert len(dm.transitions["rewards"]) == 12 and (dm.ref_min_score, dm.ref_max_score) == (-40.0, -4.0)
    assert not (tmp_path / "data").exists() or not list((tmp_path / "data").glob("d4rl-*"))  # nothing generated
    assert int(cli.model.updates) > 0 and torch.isfinite(cli.trainer.callback_metrics["train/critic_loss"])
