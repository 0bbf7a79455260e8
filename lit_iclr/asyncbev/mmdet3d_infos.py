"""Export mmdetection3d-style `nuscenes_infos_{train,val}.pkl` from the reader, so mmdet3d users train on the same data.

The infos follow mmdet3d's (v0.x / CMT / AsyncBEV) `create_nuscenes_infos` layout: per keyframe `lidar_path`, `token`,
`sweeps` (earlier LiDAR sweeps with `sensor2lidar_rotation/translation`), `cams` (six cameras with `cam_intrinsic` and
`sensor2lidar_*`), `lidar2ego_*`, `ego2global_*`, `timestamp`, and `gt_boxes` (x, y, z, w, l, h, yaw in the LiDAR frame),
`gt_names`, `gt_velocity`, `num_lidar_pts`, `valid_flag`. mmdet3d itself is not needed to write them. Pickle is the format
mmdet3d reads; the files are written here, never loaded from outside.

    python -m lit_iclr.asyncbev.mmdet3d_infos <nuscenes root> <out dir> [--version v1.0-mini]
"""
from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import numpy as np

from .geometry import record_transform
from .nusc import CAMERAS, AsyncNuScenes


def _sensor_to_lidar(r: AsyncNuScenes, sd: dict, key: dict) -> tuple[np.ndarray, np.ndarray]:
    """Rotation / translation from a sensor frame at its own time to the keyframe LiDAR frame (through the ego poses)."""
    key_l2g = r.pose(key) @ record_transform(r.calib(key))
    s2g = r.pose(sd) @ record_transform(r.calib(sd))
    T = np.linalg.inv(key_l2g) @ s2g
    return T[:3, :3], T[:3, 3]


def sample_info(r: AsyncNuScenes, token: str, max_sweeps: int = 10) -> dict:
    nusc = r.nusc
    sample = nusc.get("sample", token)
    key = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
    cs, pose = r.calib(key), nusc.get("ego_pose", key["ego_pose_token"])
    info = dict(lidar_path=str(r.root / key["filename"]), token=token, sweeps=[], cams={},
                lidar2ego_translation=cs["translation"], lidar2ego_rotation=cs["rotation"],
                ego2global_translation=pose["translation"], ego2global_rotation=pose["rotation"],
                timestamp=sample["timestamp"])
    sd = key
    while len(info["sweeps"]) < max_sweeps and sd["prev"]:
        sd = nusc.get("sample_data", sd["prev"])
        R, t = _sensor_to_lidar(r, sd, key)
        info["sweeps"].append(dict(data_path=str(r.root / sd["filename"]), type="lidar", sample_data_token=sd["token"],
                                   timestamp=sd["timestamp"], sensor2lidar_rotation=R, sensor2lidar_translation=t))
    for ch in CAMERAS:
        cam = nusc.get("sample_data", sample["data"][ch])
        R, t = _sensor_to_lidar(r, cam, key)
        info["cams"][ch] = dict(data_path=str(r.root / cam["filename"]), type=ch, sample_data_token=cam["token"],
                                timestamp=cam["timestamp"], sensor2lidar_rotation=R, sensor2lidar_translation=t,
                                cam_intrinsic=np.asarray(r.calib(cam)["camera_intrinsic"]))
    b = r.boxes(token)
    names = np.array(["car", "truck", "pedestrian", "bicycle"])[b["label"]]
    info.update(gt_boxes=np.concatenate([b["center"], b["size"], b["yaw"][:, None]], 1), gt_names=names,
                gt_velocity=b["velocity"], num_lidar_pts=b["num_lidar_pts"], valid_flag=b["num_lidar_pts"] > 0)
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
        with open(p, "wb") as f:
            pickle.dump(dict(infos=infos, metadata=dict(version=version)), f)
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
