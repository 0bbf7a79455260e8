"""The generated world in the real nuScenes layout, read by the unmodified devkit; malformed inputs give clear errors."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from lit_iclr.asyncbev.evaluate import box_record, nuscenes_metrics, write_results
from lit_iclr.asyncbev.nusc import CAMERAS, AsyncNuScenes, load_pcd_bin
from lit_iclr.asyncbev.world import CLASSES
from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError


@pytest.fixture(scope="module")
def reader(tiny_world):
    return AsyncNuScenes(tiny_world, "v1.0-mini")


def test_devkit_scores_ground_truth_as_perfect(reader, tmp_path):
    """Ground-truth boxes submitted as predictions: DetectionEval must give NDS = mAP = 1 (all and dynamic objects)."""
    from nuscenes.eval.detection.utils import category_to_detection_name
    from pyquaternion import Quaternion

    nusc = reader.nusc
    results = {}
    for tok in reader.split_samples("mini_val"):
        boxes = []
        for a in map(lambda t: nusc.get("sample_annotation", t), nusc.get("sample", tok)["anns"]):
            if a["num_lidar_pts"] == 0:  # the devkit drops such ground truth; submitting it would be a false positive
                continue
            name = category_to_detection_name(a["category_name"])
            boxes.append(box_record(tok, a["translation"], a["size"], Quaternion(a["rotation"]).yaw_pitch_roll[0],
                                    np.nan_to_num(nusc.box_velocity(a["token"]))[:2], name, 1.0))
        results[tok] = boxes
    m = nuscenes_metrics(nusc, write_results(tmp_path / "r.json", results), "mini_val", tmp_path)
    for split in ("all", "dynamic"):
        assert m[split]["mAP"] == pytest.approx(1.0) and m[split]["NDS"] == pytest.approx(1.0, abs=1e-6)
    # a one-metre shift of every box costs translation error and AP
    for boxes in results.values():
        for b in boxes:
            b["translation"][0] += 1.0
    shifted = nuscenes_metrics(nusc, write_results(tmp_path / "s.json", results), "mini_val", tmp_path)
    assert shifted["all"]["mATE"] == pytest.approx(1.0, abs=0.02) and shifted["all"]["NDS"] < 0.9


def test_sensor_chains_and_timing(reader):
    nusc = reader.nusc
    sample = nusc.sample[-1]
    key = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
    back = reader.back(key["token"], 4)
    assert key["timestamp"] - back["timestamp"] == 4 * 50_000  # 20 Hz sweeps
    cam = reader.back(sample["data"]["CAM_FRONT"], 3)
    assert abs(nusc.get("sample_data", sample["data"]["CAM_FRONT"])["timestamp"] - cam["timestamp"] - 250_000) <= 1
    s = reader.async_sample(sample["token"], 0.3, 0.0, num_sweeps=2)
    assert s["dt"] == pytest.approx(0.3) and s["images"].shape == (6, 3, 32, 48)
    assert np.allclose(np.unique(s["points"][:, 4]), [0.0, 0.05])  # time-lag channel of the two sweeps


def test_emc_matches_ego_poses(reader):
    """The EMC affine maps a keyframe-frame point to where a static world point sat in the delayed sensor frame."""
    from lit_iclr.asyncbev.geometry import record_transform

    nusc = reader.nusc
    sample = nusc.sample[-1]
    key = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
    old = reader.back(key["token"], 8)
    s = reader.async_sample(sample["token"], 0.4, 0.0, num_sweeps=1)
    l2e = record_transform(reader.calib(key))
    p_world = np.array([12.0, -5.0, 0.0, 1.0])
    p1 = np.linalg.inv(reader.pose(key) @ l2e) @ p_world
    p0 = np.linalg.inv(reader.pose(old) @ l2e) @ p_world
    assert np.allclose(s["emc"] @ np.array([p1[0], p1[1], 1.0]), [p0[0], p0[1], 1.0], atol=1e-4)


def test_cameras_see_boxes_where_calibration_projects_them(reader):
    """Project annotated box centres with the devkit's own camera geometry: the pixel shows the box's class colour."""
    from nuscenes.utils.geometry_utils import view_points

    nusc = reader.nusc
    hits = total = 0
    for sample in nusc.sample:
        for ch in CAMERAS:
            path, boxes, K = nusc.get_sample_data(sample["data"][ch])
            img = np.asarray(Image.open(path).convert("RGB")).astype(float)
            for box in boxes:
                if box.center[2] < 3 or box.center[2] > 25:
                    continue
                u, v = view_points(box.center[:, None], K, normalize=True)[:2, 0]
                if not (0 <= u < img.shape[1] and 0 <= v < img.shape[0]):
                    continue
                colour = np.array(next(c[3] for c in CLASSES.values() if c[0] == box.name), dtype=float)
                px = img[int(v), int(u)]
                total += 1
                hits += np.corrcoef(px, colour)[0, 1] > 0.9 if px.std() > 5 else 0
    assert total >= 5 and hits / total > 0.6  # the rest are occluded by nearer boxes


def test_lidar_hits_annotated_boxes(reader):
    """num_lidar_pts of each annotation equals the keyframe points inside its (slightly enlarged) box."""
    from nuscenes.utils.geometry_utils import points_in_box

    nusc = reader.nusc
    sample = nusc.sample[0]
    _, boxes, _ = nusc.get_sample_data(sample["data"]["LIDAR_TOP"])
    pts = load_pcd_bin(reader.root / nusc.get("sample_data", sample["data"]["LIDAR_TOP"])["filename"])
    pts = pts[pts[:, 2] > -1.84 + 0.15]  # drop ground returns (the LiDAR sits 1.84 m above the ground)
    for box, tok in zip(boxes, sample["anns"], strict=True):
        n = nusc.get("sample_annotation", tok)["num_lidar_pts"]
        inside = points_in_box(box, pts[:, :3].T, wlh_factor=1.1).sum()
        assert abs(int(inside) - n) <= max(2, 0.1 * n)


def _copy(world, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(world, dst)
    return dst


def test_missing_table_is_a_clear_error(tiny_world, tmp_path):
    root = _copy(tiny_world, tmp_path)
    (root / "v1.0-mini" / "ego_pose.json").unlink()
    with pytest.raises(DatasetNotFoundError, match="ego_pose.json"):
        AsyncNuScenes(root)


def test_truncated_and_missing_sweeps_are_clear_errors(tiny_world, tmp_path):
    root = _copy(tiny_world, tmp_path)
    r = AsyncNuScenes(root)
    sample = r.nusc.sample[-1]
    sd = r.back(sample["data"]["LIDAR_TOP"], 3)
    f = root / sd["filename"]
    f.write_bytes(f.read_bytes()[:-6])
    with pytest.raises(DatasetFormatError, match="truncated"):
        r.async_sample(sample["token"], 0.15, 0.0, 1)
    f.unlink()
    with pytest.raises(DatasetNotFoundError, match=re.escape(sd["filename"].split("/")[-1])):
        r.async_sample(sample["token"], 0.15, 0.0, 1)


def test_bad_calibration_is_a_clear_error(tiny_world, tmp_path):
    root = _copy(tiny_world, tmp_path)
    p = root / "v1.0-mini" / "calibrated_sensor.json"
    rows = json.loads(p.read_text())
    cam = next(r for r in rows if r["camera_intrinsic"])
    cam["camera_intrinsic"] = [[100.0, 0.0], [0.0, 100.0]]
    p.write_text(json.dumps(rows))
    with pytest.raises(DatasetFormatError, match="calibrated_sensor.json.*3x3"):
        AsyncNuScenes(root)


def test_mmdet3d_infos_put_sweeps_and_cameras_in_the_keyframe_lidar_frame(tiny_world, tmp_path):
    import pickle

    from lit_iclr.asyncbev.mmdet3d_infos import export_infos

    train, val = export_infos(tiny_world, tmp_path, max_sweeps=3)
    with open(val, "rb") as f:  # written by this test
        infos = pickle.load(f)["infos"]
    r = AsyncNuScenes(tiny_world)
    info = infos[-1]
    assert len(info["sweeps"]) == 3 and set(info["cams"]) == set(CAMERAS)
    # independent path: the reader's multi-sweep accumulation moved the previous sweep with the same transform
    sw = info["sweeps"][0]
    raw = load_pcd_bin(sw["data_path"])[:, :3] @ sw["sensor2lidar_rotation"].T + sw["sensor2lidar_translation"]
    key = r.nusc.get("sample_data", r.nusc.get("sample", info["token"])["data"]["LIDAR_TOP"])
    acc = r.lidar_points(key, 2)
    assert np.allclose(acc[acc[:, 4] > 0, :3], raw, atol=1e-3)
    assert info["gt_boxes"].shape[1] == 7 and len(info["gt_names"]) == len(info["gt_velocity"])
