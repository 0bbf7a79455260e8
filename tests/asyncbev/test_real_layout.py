"""The reader and the mmdet3d export on a small release written by hand in the published nuScenes layout
(`nusc_layout.py`, not the project's generator), with the published data's quirks."""
from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

from lit_iclr.asyncbev.data import NuScenesAsync
from lit_iclr.asyncbev.nusc import DETECTION_CLASSES, AsyncNuScenes
from lit_iclr.core.errors import DatasetFormatError

from .nusc_layout import LIDAR_CALIB, N_FAR, N_ORIGIN, OBJECTS, write_release


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return write_release(tmp_path_factory.mktemp("nuscenes_full"))


@pytest.fixture(scope="module")
def keyframes_only(tmp_path_factory):
    return write_release(tmp_path_factory.mktemp("nuscenes_keyframes"), keyframes_only=True)


@pytest.fixture(scope="module")
def reader(release):
    return AsyncNuScenes(release)


def test_no_return_and_roof_points_are_dropped_as_the_devkit_does(reader):
    """Every sweep holds N_ORIGIN no-return points at (0, 0, 0) and a few roof returns: the accumulated cloud equals the
    devkit's own `LidarPointCloud.from_file_multisweep` (which drops them with `remove_close(1.0)`)."""
    from nuscenes.utils.data_classes import LidarPointCloud

    nusc = reader.nusc
    sample = nusc.get("sample", reader.split_samples("mini_train")[-1])
    key = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
    ours = reader.lidar_points(key, 3)
    assert len(ours) == 3 * N_FAR  # before: 3 * (N_FAR + N_ORIGIN + N_ROOF), the origin ghosts moved by ego motion
    ref, times = LidarPointCloud.from_file_multisweep(nusc, sample, "LIDAR_TOP", "LIDAR_TOP", nsweeps=3)
    assert np.allclose(ours[:, :3], ref.points[:3].T, atol=1e-3)
    assert np.allclose(ours[:, 3] * 255, ref.points[3], atol=1e-3) and np.allclose(ours[:, 4], times[0], atol=1e-6)
    assert N_ORIGIN > 0 and not np.isclose(np.abs(ours[:, :3]).sum(1), 0).any()


def test_all_ten_detection_classes_are_read_and_a_subset_is_reported(release, reader):
    b = reader.boxes(reader.split_samples("mini_val")[0])
    names = [DETECTION_CLASSES[i] for i in b["label"]]
    assert sorted(names) == sorted(DETECTION_CLASSES)  # the animal is no detection class; before: 4 of these 10
    dm = NuScenesAsync(root=str(release), classes=["car", "pedestrian"])
    assert dm.num_classes == 2 and NuScenesAsync(root=str(release)).num_classes == 10
    dm.prepare_data()
    with pytest.warns(UserWarning, match=r"annotations of detection classes outside data.init_args.classes.*'truck': 8"):
        dm.setup("fit")
    assert {dm.reader.classes[i] for i in dm.reader.boxes(dm.val_tokens[0])["label"]} == {"car", "pedestrian"}
    assert NuScenesAsync().num_classes == 4  # the generated world's classes


@pytest.mark.parametrize("use_valid_flag, kept", [(True, 9), (False, 8)])
def test_boxes_no_sensor_saw_are_no_training_targets(release, use_valid_flag, kept):
    """The car has no LiDAR or radar point, the truck radar points only (mmdet3d's valid_flag keeps it)."""
    dm = NuScenesAsync(root=str(release), use_valid_flag=use_valid_flag, num_sweeps=1, max_points=1000)
    dm.prepare_data()
    dm.setup("fit")
    item = dm.dataset("train", 0.0)[0]
    rows = item["boxes"][item["boxes_mask"]]
    assert len(rows) == kept  # before: all 10 detection-class boxes
    sizes = {tuple(np.round(s, 2)) for s in rows[:, 3:6].tolist()}
    assert tuple(OBJECTS[0][1]) not in sizes  # the unseen car
    assert (tuple(OBJECTS[1][1]) in sizes) == use_valid_flag  # the radar-only truck


def test_camera_delay_is_seconds_from_timestamps_on_a_keyframe_only_chain(keyframes_only):
    """A chain of 2 Hz keyframes (no camera sweeps): 0.5 s back is the previous keyframe, not 6 chain steps (3 s)."""
    r = AsyncNuScenes(keyframes_only)
    nusc = r.nusc
    sample = nusc.get("sample", r.split_samples("mini_train")[-1])
    s = r.async_sample(sample["token"], 0.0, 0.5, 1)
    prev = nusc.get("sample", sample["prev"])
    want = (sample["timestamp"] - nusc.get("sample_data", nusc.get("sample_data", prev["data"]["CAM_FRONT"])["token"])
            ["timestamp"]) * 1e-6
    assert s["dt"] == pytest.approx(want, abs=1e-6) and abs(s["dt"] - 0.5) < 0.01
    s = r.async_sample(sample["token"], 0.35, 0.0, 1)  # LiDAR: the nearer of 0 and 0.5 s is 0.5 s
    assert abs(s["dt"] - 0.5) < 0.01


def test_delays_match_jittered_timestamps(reader):
    nusc = reader.nusc
    sample = nusc.get("sample", reader.split_samples("mini_train")[-1])
    for delay, period in ((0.25, 1 / 12), (0.5, 1 / 12)):
        s = reader.async_sample(sample["token"], 0.0, delay, 1)
        assert abs(s["dt"] - delay) < period / 2
    s = reader.async_sample(sample["token"], 0.3, 0.0, 1)
    assert abs(s["dt"] - 0.3) < 0.025  # the sweep nearest 0.3 s back
    dm = NuScenesAsync(root=str(reader.root), delayed="camera", val_offset=0.5, num_sweeps=1, max_points=1000)
    dm.prepare_data()
    dm.setup("validate")
    ds = dm.dataset("val", 0.5)
    assert abs(float(ds[len(ds) - 1]["dt"]) - 0.5) < 1 / 24


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_camera_jpeg_is_one_clear_line(release, tmp_path, damage):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(release, root)
    r = AsyncNuScenes(root)
    sample = r.nusc.get("sample", r.split_samples("mini_val")[0])
    f = root / r.nusc.get("sample_data", sample["data"]["CAM_BACK_LEFT"])["filename"]
    f.write_bytes(b"<html>503 Service Unavailable</html>" if damage == "garbage" else f.read_bytes()[:300])
    with pytest.raises(DatasetFormatError, match=re.escape(f.name) + r".*not a readable image.*\n  fix: re-extract"):
        r.async_sample(sample["token"], 0.0, 0.0, 1)


# ---------------------------------------------------------------- mmdetection3d 1.x infos
def mmdet3d_1x_corners(box: np.ndarray) -> np.ndarray:
    """Corners of an info `gt_boxes` row from mmdet3d 1.x's documented definitions, written out here: NuScenesDataset
    reads the row as LiDARInstance3DBoxes with origin (0.5, 0.5, 0.5), i.e. z is the centre, and the boxes keep the
    bottom centre (0.5, 0.5, 0); (x_size, y_size, z_size) lie along the box's x, y, z before the yaw rotation; yaw is 0
    along +x and grows towards +y. Order: x0y0z0, x0y0z1, x0y1z1, x0y1z0, x1y0z0, x1y0z1, x1y1z1, x1y1z0."""
    x, y, z, dx, dy, dz, yaw = box
    bottom = np.array([x, y, z - dz / 2])
    unit = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 1], [0, 1, 0], [1, 0, 0], [1, 0, 1], [1, 1, 1], [1, 1, 0]], float)
    local = (unit - [0.5, 0.5, 0.0]) * [dx, dy, dz]
    c, s = np.cos(yaw), np.sin(yaw)
    rot = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])
    return local @ rot.T + bottom


def test_mmdet3d_1x_infos_boxes_land_on_the_annotated_corners(release, tmp_path):
    from nuscenes.utils.data_classes import Box
    from pyquaternion import Quaternion

    from lit_iclr.asyncbev.mmdet3d_infos import export_infos

    train, _ = export_infos(release, tmp_path)
    with open(train, "rb") as f:  # written by this test
        data = pickle.load(f)
    assert data["metadata"] == {"version": "v1.0-mini"}
    r = AsyncNuScenes(release)
    nusc = r.nusc
    info = data["infos"][-1]
    sample = nusc.get("sample", info["token"])
    key = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
    pose = nusc.get("ego_pose", key["ego_pose_token"])
    anns = [nusc.get("sample_annotation", t) for t in sample["anns"]]
    assert len(info["gt_boxes"]) == len(anns) == len(OBJECTS)  # every annotation, as mmdet3d writes them
    for row, ann in zip(info["gt_boxes"], anns, strict=True):
        box = Box(ann["translation"], ann["size"], Quaternion(ann["rotation"]))  # global -> ego -> LiDAR by hand
        box.translate(-np.array(pose["translation"]))
        box.rotate(Quaternion(pose["rotation"]).inverse)
        box.translate(-np.array(LIDAR_CALIB["translation"]))
        box.rotate(Quaternion(LIDAR_CALIB["rotation"]).inverse)
        ref = box.corners().T  # (8, 3); the first four are the front face
        ours = mmdet3d_1x_corners(row)
        # the same eight corners, and the x1 face of mmdet3d's box is the devkit's front face (heading, not yaw + pi)
        d = np.linalg.norm(ours[:, None] - ref[None], axis=2)
        assert d.min(1).max() < 1e-5, ann["size"]
        assert np.allclose(ours[4:].mean(0), ref[:4].mean(0), atol=1e-5)
    names = list(info["gt_names"])
    assert sorted(n for n in names if n != "animal") == sorted(DETECTION_CLASSES) and "animal" in names
    assert list(info["num_lidar_pts"]) == [o[4] for o in OBJECTS] and list(info["num_radar_pts"]) == [o[5] for o in OBJECTS]
    assert list(info["valid_flag"]) == [o[4] + o[5] > 0 for o in OBJECTS]
    moving = np.hypot(*info["gt_velocity"].T)
    assert np.allclose(moving, [np.hypot(*o[3]) for o in OBJECTS], atol=1e-3)  # a rotation of the global velocity
    # every key mmdet3d's update_infos_to_v2 reads from a sweep and a camera
    need = {"data_path", "type", "sample_data_token", "sensor2ego_translation", "sensor2ego_rotation",
            "ego2global_translation", "ego2global_rotation", "timestamp", "sensor2lidar_rotation",
            "sensor2lidar_translation"}
    assert info["sweeps"] and all(need <= set(sw) for sw in info["sweeps"])
    assert all(need | {"cam_intrinsic"} <= set(c) for c in info["cams"].values())
    # a camera's sensor2lidar maps its optical axis (+z) to its heading in the keyframe LiDAR frame (LiDAR x right,
    # y forward): CAM_FRONT looks along LiDAR +y
    front = info["cams"]["CAM_FRONT"]
    assert np.allclose(front["sensor2lidar_rotation"] @ [0, 0, 1.0], [0, 1, 0], atol=0.05)


def test_missing_map_mask_is_one_clear_line(release, tmp_path):
    """The devkit asserts on a map mask of map.json that is not on disk; the reader names the folder and the fix."""
    import shutil

    from lit_iclr.core.errors import DatasetNotFoundError

    root = tmp_path / "copy"
    shutil.copytree(release, root)
    shutil.rmtree(root / "maps")
    with pytest.raises(DatasetNotFoundError, match=r"maps: nuscenes-devkit: map mask .* does not exist\n  fix: extract"):
        AsyncNuScenes(root)
