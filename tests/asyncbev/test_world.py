"""Generator options that shape the default world: moving objects that pass the ego (`meet_ego`), the evaluation
radius, and the datamodule's folder keyed by them."""
from __future__ import annotations

import numpy as np
import pytest

from lit_iclr.asyncbev.data import NuScenesAsync
from lit_iclr.asyncbev.evaluate import box_record, nuscenes_metrics, write_results
from lit_iclr.asyncbev.nusc import AsyncNuScenes
from lit_iclr.asyncbev.world import WorldConfig, _ego_pose, _objects


def _closest_approach(meet_ego: bool, seconds: float = 20.0, seed: int = 0) -> np.ndarray:
    """Smallest ego distance (m) over the scene of every moving object, from positions sampled every 0.05 s."""
    cfg = WorldConfig(scene_seconds=seconds, objects_per_scene=60, meet_ego=meet_ego)
    rng = np.random.default_rng(seed)
    ego_speed, yaw_rate, yaw0 = 6.0, 0.03, 0.4
    objects = [o for o in _objects(rng, cfg, ego_speed, yaw_rate, yaw0) if o["moving"]]
    t = np.arange(0.0, seconds, 0.05)
    ex, ey, _ = _ego_pose(t, ego_speed, yaw_rate, yaw0)
    return np.array([np.hypot(o["p0"][0] + o["vel"][0] * t - ex, o["p0"][1] + o["vel"][1] * t - ey).min()
                     for o in objects])


def test_meet_ego_brings_every_moving_object_past_the_ego():
    near = _closest_approach(True)
    # placed at most 20 m along and 12 m across the path from the ego at their reference time: <= 23.3 m on a
    # straight road, a little more on this gently curving one
    assert len(near) > 20 and near.max() < 25.0
    far = _closest_approach(False)  # placed along the whole 20 s path at t = 0: many never come close
    assert (far > 25.0).mean() > 0.1


def test_world_options_key_the_data_folder(tmp_path):
    a = NuScenesAsync(data_dir=str(tmp_path), scene_seconds=10.0, meet_ego=True)
    b = NuScenesAsync(data_dir=str(tmp_path), scene_seconds=10.0, meet_ego=False)
    c = NuScenesAsync(data_dir=str(tmp_path), scene_seconds=10.0, meet_ego=True, objects_per_scene=30)
    assert len({a.path, b.path, c.path}) == 3


def test_class_range_limits_the_scored_boxes(tiny_world, tmp_path):
    """Ground truth submitted only within 10 m of the ego: perfect at class_range 10, missed boxes beyond it at 50."""
    from nuscenes.eval.detection.utils import category_to_detection_name
    from pyquaternion import Quaternion

    nusc = AsyncNuScenes(tiny_world).nusc
    results, beyond = {}, 0
    for tok in [s["token"] for s in nusc.sample if nusc.get("scene", s["scene_token"])["name"] == "scene-0103"]:
        sample = nusc.get("sample", tok)
        ego = nusc.get("ego_pose", nusc.get("sample_data", sample["data"]["LIDAR_TOP"])["ego_pose_token"])
        boxes = []
        for a in map(lambda t: nusc.get("sample_annotation", t), sample["anns"]):
            if a["num_lidar_pts"] == 0:
                continue
            if np.hypot(*(np.subtract(a["translation"], ego["translation"])[:2])) > 10.0:
                beyond += 1
                continue
            name = category_to_detection_name(a["category_name"])
            boxes.append(box_record(tok, a["translation"], a["size"], Quaternion(a["rotation"]).yaw_pitch_roll[0],
                                    np.nan_to_num(nusc.box_velocity(a["token"]))[:2], name, 1.0))
        results[tok] = boxes
    path = write_results(tmp_path / "r.json", results)
    assert nuscenes_metrics(nusc, path, "mini_val", tmp_path, class_range=10.0)["all"]["mAP"] == pytest.approx(1.0)
    assert beyond > 0 and nuscenes_metrics(nusc, path, "mini_val", tmp_path, class_range=50.0)["all"]["mAP"] < 0.99
