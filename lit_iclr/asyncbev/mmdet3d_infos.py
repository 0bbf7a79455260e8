"""Export mmdetection3d `nuscenes_infos_{train,val}.pkl` from the reader, so mmdet3d users train on the same data.

One convention, written completely: mmdetection3d 1.x (from v1.0.0rc0 on, the coordinate refactor; also what CMT and
the official AsyncBEV plugin read), as `tools/dataset_converters/nuscenes_converter.py:create_nuscenes_infos` writes
it. Per keyframe: `lidar_path`, `token`, `sweeps` and `cams` (each with `data_path`, `type`, `sample_data_token`,
`sensor2ego_*`, `ego2global_*`, `timestamp` and `sensor2lidar_rotation/translation`, the cameras also `cam_intrinsic`),
`lidar2ego_*`, `ego2global_*`, `timestamp` (us), and every annotation of the sample:

- `gt_boxes` (N, 7): x, y, z of the box *centre* (the devkit's `Box.center`; mmdet3d's NuScenesDataset reads it with
  `origin=(0.5, 0.5, 0.5)`), then x_size, y_size, z_size = l, w, h, then yaw = `Box.orientation.yaw_pitch_roll[0]`
  in the LiDAR frame (0 along +x, counter-clockwise). The v0.x files held (w, l, h) and -yaw - pi/2 instead.
- `gt_names`: category names mapped with mmdet3d's `NuScenesNameMapping` to the ten detection classes; categories
  outside it (animal, debris, ...) keep their nuScenes name (mmdet3d labels them -1).
- `gt_velocity` (N, 2) in the LiDAR frame (NaN where the devkit cannot compute one), `num_lidar_pts`, `num_radar_pts`,
  `valid_flag` = num_lidar_pts + num_radar_pts > 0.

mmdet3d >= 1.1 reads its v2 layout; its own `tools/create_data.py` makes that from these files with
`tools/dataset_converters/update_infos_to_v2.py`, which reads exactly the keys above. mmdet3d itself is not needed to
write them. Pickle is the format mmdet3d reads; the files are written here, never loaded from outside.

    python -m lit_iclr.asyncbev.mmdet3d_infos <nuscenes root> <out dir> [--version v1.0-mini]
"""
from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path

import numpy as np

from .geometry import record_transform
from .nusc import CAMERAS, AsyncNuScenes

# mmdet3d/datasets/convert_utils.py (1.x): nuScenes category -> detection class
NAME_MAPPING = {
    "movable_object.barrier": "barrier", "vehicle.bicycle": "bicycle", "vehicle.bus.bendy": "bus",
    "vehicle.bus.rigid": "bus", "vehicle.car": "car", "vehicle.construction": "construction_vehicle",
    "vehicle.motorcycle": "motorcycle", "human.pedestrian.adult": "pedestrian", "human.pedestrian.child": "pedestrian",
    "human.pedestrian.construction_worker": "pedestrian", "human.pedestrian.police_officer": "pedestrian",
    "movable_object.trafficcone": "traffic_cone", "vehicle.trailer": "trailer", "vehicle.truck": "truck",
}


def _sensor_info(r: AsyncNuScenes, sd: dict, key: dict, sensor_type: str) -> dict:
    """mmdet3d's `obtain_sensor2top`: the record's own calibration and pose, and its transform to the keyframe LiDAR
    frame (sensor -> ego -> global at its own time -> ego' -> LiDAR at the keyframe; points @ R.T + t)."""
    cs, pose = r.calib(sd), r.nusc.get("ego_pose", sd["ego_pose_token"])
    key_l2g = r.pose(key) @ record_transform(r.calib(key))
    T = np.linalg.inv(key_l2g) @ record_transform(pose) @ record_transform(cs)
    return dict(data_path=str(r.root / sd["filename"]), type=sensor_type, sample_data_token=sd["token"],
                sensor2ego_translation=cs["translation"], sensor2ego_rotation=cs["rotation"],
                ego2global_translation=pose["translation"], ego2global_rotation=pose["rotation"],
                timestamp=sd["timestamp"], sensor2lidar_rotation=T[:3, :3], sensor2lidar_translation=T[:3, 3])


def sample_info(r: AsyncNuScenes, token: str, max_sweeps: int = 10) -> dict:
    nusc = r.nusc
    sample = nusc.get("sample", token)
    key = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
    cs, pose = r.calib(key), nusc.get("ego_pose", key["ego_pose_token"])
    info = dict(lidar_path=str(r.root / key["filename"]), token=token, sweeps=[], cams={},
                lidar2ego_translation=cs["translation"], lidar2ego_rotation=cs["rotation"],
                ego2global_translation=pose["translation"], ego2global_rotation=pose["rotation"],
                timestamp=sample["timestamp"])
    for ch in CAMERAS:
        cam = nusc.get("sample_data", sample["data"][ch])
        info["cams"][ch] = dict(_sensor_info(r, cam, key, ch), cam_intrinsic=np.asarray(r.calib(cam)["camera_intrinsic"]))
    sd = key
    while len(info["sweeps"]) < max_sweeps and sd["prev"]:
        sd = nusc.get("sample_data", sd["prev"])
        info["sweeps"].append(_sensor_info(r, sd, key, "lidar"))
    # annotations: the devkit's boxes in the keyframe LiDAR frame, in sample["anns"] order
    _, boxes, _ = nusc.get_sample_data(key["token"])
    anns = [nusc.get("sample_annotation", t) for t in sample["anns"]]
    locs = np.array([b.center for b in boxes], dtype=float).reshape(-1, 3)
    dims = np.array([b.wlh for b in boxes], dtype=float).reshape(-1, 3)
    rots = np.array([b.orientation.yaw_pitch_roll[0] for b in boxes], dtype=float).reshape(-1, 1)
    g2l = np.linalg.inv(r.pose(key)[:3, :3] @ record_transform(cs)[:3, :3])
    vel = np.array([(g2l @ np.array([*nusc.box_velocity(t)[:2], 0.0]))[:2] for t in sample["anns"]]).reshape(-1, 2)
    info.update(gt_boxes=np.concatenate([locs, dims[:, [1, 0, 2]], rots], 1),  # (x, y, z, l, w, h, yaw)
                gt_names=np.array([NAME_MAPPING.get(b.name, b.name) for b in boxes]), gt_velocity=vel,
                num_lidar_pts=np.array([a["num_lidar_pts"] for a in anns]),
                num_radar_pts=np.array([a["num_radar_pts"] for a in anns]),
                valid_flag=np.array([a["num_lidar_pts"] + a["num_radar_pts"] > 0 for a in anns], dtype=bool))
    return info


def export_infos(root: str | Path, out_dir: str | Path, version: str = "v1.0-mini", max_sweeps: int = 10) -> list[Path]:
    r = AsyncNuScenes(root, version)
    splits = ("mini_train", "mini_val") if version.endswith("mini") else ("train", "val")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, name in zip(splits, ("train", "val"), strict=True):
        infos = [sample_info(r, tok, max_sweeps) for tok in r.split_samples(split)]
        p = out_dir / f"nuscenes_infos_{name}.pkl"
        tmp = p.with_name(p.name + ".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(dict(infos=infos, metadata=dict(version=version)), f)
        os.replace(tmp, p)  # no partial file on failure
        paths.append(p)
    return paths


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("out_dir")
    ap.add_argument("--version", default="v1.0-mini")
    ap.add_argument("--max-sweeps", type=int, default=10)
    a = ap.parse_args()
    print(*export_infos(a.root, a.out_dir, a.version, a.max_sweeps), sep="\n")
