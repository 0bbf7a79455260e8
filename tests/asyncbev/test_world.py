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


def _slab_hit(o: np.ndarray, d: np.ndarray, c: np.ndarray, yaw: float, h: np.ndarray):
    """Entry distance of one ray into one oriented box (None: missed), the plain slab method in the box's frame."""
    R = np.array([[np.cos(yaw), -np.sin(yaw), 0.0], [np.sin(yaw), np.cos(yaw), 0.0], [0.0, 0.0, 1.0]])
    lo_, ld = R.T @ (o - c), R.T @ d
    near, far = -np.inf, np.inf
    for a in range(3):
        if abs(ld[a]) < 1e-12:
            if abs(lo_[a]) > h[a]:
                return None
            continue
        t1, t2 = sorted(((-h[a] - lo_[a]) / ld[a], (h[a] - lo_[a]) / ld[a]))
        near, far = max(near, t1), min(far, t2)
    return near if near <= far and near > 0.05 else None


def test_ray_cast_equals_testing_every_ray_against_every_box():
    """The bounding-sphere cull drops only pairs that cannot hit: nearest hits, box ids and per-box pass counts equal
    a per-ray, per-box slab test (with the ground plane z = 0 and the range limit)."""
    from lit_iclr.asyncbev.world import ray_cast

    rng = np.random.default_rng(3)
    K = 12
    centers = np.c_[rng.uniform(-15, 15, (K, 2)), rng.uniform(0.3, 1.5, K)]
    yaws, half = rng.uniform(-3, 3, K), rng.uniform(0.3, 3.0, (K, 3))
    dirs = rng.normal(size=(400, 3))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    origin = np.array([0.5, -0.3, 1.8])
    dist, which, _, passes = ray_cast(origin, dirs, centers, yaws, half, max_range=30.0)
    ref_passes = np.zeros(K, dtype=int)
    for r, d in enumerate(dirs):
        hits = [(t, k) for k in range(K) if (t := _slab_hit(origin, d, centers[k], yaws[k], half[k])) is not None]
        for _, k in hits:
            ref_passes[k] += 1
        cand = [(-origin[2] / d[2], -1)] if d[2] < -1e-6 else []
        t, k = min(hits + cand, default=(np.inf, -2))
        if t > 30.0:
            t, k = np.inf, -2
        assert which[r] == k
        assert dist[r] == pytest.approx(t, rel=1e-9) if np.isfinite(t) else np.isinf(dist[r])
    np.testing.assert_array_equal(passes, ref_passes)
    assert (which >= 0).sum() > 20  # the test exercises box hits
