"""Readers on files in the real formats (generated default, hand-written HumanML3D files) and on malformed ones."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError
from lit_iclr.mosa import HumanMotionVideo
from lit_iclr.mosa.formats import read_joints, read_mp4, read_texts, read_video_labels, write_mp4
from lit_iclr.mosa.maps import control_maps, project


def test_generated_default_is_humanml3d_layout_read_back(small_data):
    root = small_data.path
    ids = (root / "train.txt").read_text().split()
    assert len(ids) == 10 and (root / "val.txt").exists() and (root / "test.txt").exists()
    j = np.load(root / "new_joints" / f"{ids[0]}.npy")
    assert j.shape == (8, 22, 3) and j.dtype == np.float32  # 20 fps motion, 2 motion frames per video frame
    line = (root / "texts" / f"{ids[0]}.txt").read_text().splitlines()[0]
    caption, tokens, start, end = line.split("#")
    assert caption.split()[0] + "/" in tokens and (start, end) == ("0.0", "0.0")
    batch = next(iter(small_data.train_dataloader()))
    assert batch["video"].shape == (4, 4, 3, 16, 16) and batch["video"].min() >= -1 and batch["video"].max() <= 1
    # stored 2-D keypoints are the projection of the stored 3-D joints by the stored camera
    uv, _ = project(batch["joints3d"], batch["K"], batch["extrinsics"])
    torch.testing.assert_close(uv, batch["keypoints2d"], atol=1e-3, rtol=0)
    # the precomputed maps are the maps of that structure
    depth = project(batch["joints3d"], batch["K"], batch["extrinsics"])[1]
    torch.testing.assert_close(batch["maps"], control_maps(uv, 16, depth), atol=2e-3, rtol=0)
    assert set(batch["action"].tolist()) <= set(range(7))


def test_mp4_roundtrip_is_near_lossless(tmp_path):
    rng = np.random.default_rng(0)
    frames = np.repeat(np.repeat(rng.integers(0, 255, (5, 8, 8, 3), dtype=np.uint8), 4, 1), 4, 2)  # 32 px blocks
    write_mp4(tmp_path / "a.mp4", frames, 10)
    back = read_mp4(tmp_path / "a.mp4")
    assert back.shape == frames.shape
    assert np.abs(back.astype(int) - frames).mean() < 6


def test_malformed_inputs_raise_clear_errors(tmp_path):
    np.save(tmp_path / "vec.npy", np.zeros((10, 263), np.float32))  # new_joint_vecs instead of new_joints
    with pytest.raises(DatasetFormatError, match="expected \\(T, 22, 3\\)"):
        read_joints(tmp_path / "vec.npy")
    np.save(tmp_path / "nan.npy", np.full((10, 22, 3), np.nan, np.float32))
    with pytest.raises(DatasetFormatError, match="NaN"):
        read_joints(tmp_path / "nan.npy")
    (tmp_path / "t.txt").write_text("a person walks forward.\n")  # caption without tokens and timing
    with pytest.raises(DatasetFormatError, match="caption#tokens#start#end"):
        read_texts(tmp_path / "t.txt")
    (tmp_path / "u.txt").write_text("a man runs#a/DET man/NOUN runs/VERB#start#end\n")
    with pytest.raises(DatasetFormatError, match="not numbers"):
        read_texts(tmp_path / "u.txt")
    (tmp_path / "bad.mp4").write_bytes(b"not a video at all" * 10)
    with pytest.raises(DatasetFormatError, match="unreadable video"):
        read_mp4(tmp_path / "bad.mp4")
    with pytest.raises(DatasetNotFoundError):
        read_mp4(tmp_path / "missing.mp4")
    np.savez(tmp_path / "lab.npz", keypoints2d=np.zeros((4, 22, 2)))
    with pytest.raises(DatasetFormatError, match="missing arrays"):
        read_video_labels(tmp_path / "lab.npz", 4)


def test_humanml3d_motion_shorter_than_the_clip_is_rejected(small_data, tmp_path):
    root = tmp_path / "real"
    shutil.copytree(small_data.path, root)
    cid = (root / "train.txt").read_text().split()[0]
    np.save(root / "new_joints" / f"{cid}.npy", np.zeros((3, 22, 3), np.float32))
    dm = HumanMotionVideo(root=str(root), num_frames=4, image_size=16, batch_size=2)
    dm.prepare_data()
    with pytest.raises(DatasetFormatError, match="3 frames, need at least 8"):
        dm.setup("fit")
