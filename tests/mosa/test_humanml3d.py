"""HumanML3D alone (no videos/): a folder written here in HumanML3D's published layout, read, trained and tested."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_iclr.core import ConfigError, DatasetFormatError, DatasetNotFoundError
from lit_iclr.mosa import HumanMotionVideo, MoSA
from lit_iclr.mosa.formats import caption_frames, read_mp4, read_texts
from lit_iclr.mosa.skeleton import FOOT_JOINTS, foot_contacts
from tests.twin import fit_twin, metric_rows

T = 100  # motion frames (5 s at 20 fps)


def motion(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A walk-like joint array (T, 22, 3) whose joint 3 height encodes the frame index, and its (T, 263) features with
    contact labels in the last 4 dims that the 5 cm height rule would not give (the feet are 20 cm up)."""
    rng = np.random.default_rng(seed)
    j = rng.normal(0, 0.05, (T, 22, 3)).astype(np.float32) + np.array([0.0, 1.0, 0.0], np.float32)
    j[:, 0, 0] += np.arange(T) * 0.05 + 3.0  # the root walks along x, far from the origin
    j[:, 0, 2] += 7.0
    j[:, 3, 1] = np.arange(T) / 1000  # frame index, readable after subsampling
    j[:, FOOT_JOINTS, 1] = 0.2
    vec = rng.normal(0, 1, (T, 263)).astype(np.float32)
    vec[:, -4:] = (np.arange(T)[:, None] + np.arange(4)) % 3 == 0  # feet_l (ankle, foot), feet_r (ankle, foot)
    return j, vec


def write_humanml3d(root, ids=("000001", "M000001", "000002", "000003")):
    for d in ("new_joints", "new_joint_vecs", "texts"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for n, cid in enumerate(ids):
        j, vec = motion(n)
        np.save(root / "new_joints" / f"{cid}.npy", j)
        np.save(root / "new_joint_vecs" / f"{cid}.npy", vec)
        (root / "texts" / f"{cid}.txt").write_text(
            "a person walks forward.#a/DET person/NOUN walk/VERB forward/ADV#0.0#0.0\n"
            "the person waves.#the/DET person/NOUN wave/VERB#1.0#2.5\n"  # a sub-clip: frames 20 : 50
            "someone turns#someone/PRON turn/VERB#nan#nan\n"  # nan times: the whole clip, as text-to-motion reads them
            "a short step#a/DET short/ADJ step/NOUN#4.5#4.9\n")  # frames 90 : 98, shorter than a window: left out
    np.save(root / "Mean.npy", np.zeros(263, np.float32))
    np.save(root / "Std.npy", np.full(263, 2.0, np.float32))
    (root / "train.txt").write_text("000001\nM000001\n")
    (root / "val.txt").write_text("000002\n")
    (root / "test.txt").write_text("000003\n")
    return root


def test_caption_times_are_text_to_motions_crop():
    assert caption_frames(0.0, 0.0, 100) == (0, 100) and caption_frames(1.0, 2.5, 100) == (20, 50)
    assert caption_frames(4.0, 9.0, 100) == (80, 100)  # clipped to the motion


def test_nan_times_read_as_the_whole_clip(tmp_path):
    (tmp_path / "t.txt").write_text("a man jumps#a/DET man/NOUN jump/VERB#nan#nan\n")
    assert read_texts(tmp_path / "t.txt")[0][2:] == (0.0, 0.0)


def test_humanml3d_alone_reads_windows_over_the_whole_motion_with_its_own_contacts(tmp_path):
    root = write_humanml3d(tmp_path / "HumanML3D")
    dm = HumanMotionVideo(root=str(root), num_frames=8, motion_stride=2, batch_size=4, motion_features=True)
    assert dm.video_stage is False
    dm.prepare_data()
    dm.setup("fit")
    train, val = dm.splits["train"], dm.splits["val"]
    # 2 motions x 3 caption lines (the 8-frame sub-clip is shorter than the 16-frame window and left out)
    assert len(train) == 6 and train.skipped == 2
    # evaluation tiles every caption's (sub-)clip: 100 frames -> 6 windows (x2 whole-clip lines), 20:50 -> 1
    assert len(val) == 6 + 6 + 1
    starts = sorted({round(float(val[i]["joints3d"][0, 3, 1]) * 1000) for i in range(len(val))})
    assert starts == [0, 16, 20, 32, 48, 64, 80]  # the whole motion, not its first 16 frames
    j, vec = motion(2)
    item = val[6]  # after line 1's 6 windows: the sub-clip "the person waves" (frames 20 : 50), one window from 20
    np.testing.assert_allclose(item["joints3d"][:, 3, 1].numpy() * 1000, np.arange(20, 36, 2), atol=1e-3)
    np.testing.assert_allclose(item["joints3d"][0, 0, [0, 2]].numpy(), 0.0, atol=1e-6)  # window starts at the origin
    np.testing.assert_allclose(item["joints3d"][:, :, 1].numpy(), j[20:36:2, :, 1])  # heights kept
    np.testing.assert_array_equal(item["contacts"].numpy(), vec[20:36:2, -4:])  # HumanML3D's labels ...
    assert not np.array_equal(item["contacts"].numpy(), foot_contacts(j)[20:36:2])  # ... not the height rule
    np.testing.assert_allclose(item["motion_vecs"].numpy(), vec[20:36:2] / 2.0, atol=2e-3)  # (vec - Mean) / Std
    # training windows are random inside their (sub-)clip and cover all of it over epochs; within an epoch an item's
    # window is a function of (seed, epoch, index), the same whatever the process's RNG (DDP ranks, resume)
    torch.manual_seed(0)
    first = train[4]["joints3d"]
    torch.manual_seed(1)
    assert torch.equal(train[4]["joints3d"], first)
    seen = set()
    for epoch in range(200):
        train.epoch = epoch
        seen.add(round(float(train[4]["joints3d"][0, 3, 1]) * 1000))  # motion 1, the sub-clip
    assert min(seen) == 20 and max(seen) == 34 and len(seen) == 15


def test_humanml3d_alone_trains_and_tests_the_structure_stage_through_the_cli(tmp_path):
    root = write_humanml3d(tmp_path / "HumanML3D")
    args = ("--data.init_args.root", str(root), "--data.init_args.num_frames", "8", "--data.init_args.batch_size", "2")
    fit_twin("mosa", tmp_path, *args)
    rows = metric_rows(tmp_path)
    assert any(r.get("train/struct_mse") for r in rows) and not any(r.get("train/fm") for r in rows)
    assert any(r.get("val/plan_skating_cm") for r in rows) and (tmp_path / "checkpoints" / "last.ckpt").exists()
    fit_twin("mosa", tmp_path, *args, "--ckpt_path", str(tmp_path / "checkpoints" / "last.ckpt"), subcommand="test")
    last = {k: v for r in metric_rows(tmp_path) for k, v in r.items() if v}
    assert math.isfinite(float(last["test/struct_mse"])) and float(last["test/plan_penetration_cm"]) >= 0
    assert "test/fm" not in last  # no video stage


def test_structure_stage_alone_needs_the_3d_structure_and_a_videos_folder_needs_its_files(tmp_path):
    with pytest.raises(ConfigError, match="structure: 3d"):
        MoSA(structure="2d", video_stage=False)
    root = write_humanml3d(tmp_path / "HumanML3D")
    (root / "videos").mkdir()
    dm = HumanMotionVideo(root=str(root), num_frames=4, image_size=16)
    assert dm.video_stage is True
    with pytest.raises(DatasetNotFoundError, match="without a videos/ folder the root is read as HumanML3D alone"):
        dm.setup("fit")
    with pytest.raises(DatasetNotFoundError, match="videos/ folder"):
        read_mp4(tmp_path / "missing.mp4")


def test_mismatched_feature_files_are_clear_errors(tmp_path):
    root = write_humanml3d(tmp_path / "HumanML3D")
    np.save(root / "new_joint_vecs" / "000002.npy", np.zeros((T - 1, 263), np.float32))
    with pytest.raises(DatasetFormatError, match="99 frames but new_joints has 100"):
        HumanMotionVideo(root=str(root), num_frames=8).setup("validate")
    np.save(root / "Std.npy", np.zeros(263, np.float32))
    with pytest.raises(DatasetFormatError, match="Std <= 0"):
        HumanMotionVideo(root=str(root), num_frames=8, motion_features=True).setup("fit")
    with pytest.raises(DatasetFormatError, match="no caption"):
        HumanMotionVideo(root=str(root), num_frames=64, motion_stride=2).setup("fit")
