"""A tiny nuScenes release written by hand in the published v1.0 layout, with the published data's quirks.

Independent of the project's generator (`lit_iclr.asyncbev.world`): the tables follow the nuScenes schema
(https://www.nuscenes.org/nuscenes#data-format) and carry what real releases carry:
- LIDAR_TOP calibrated about -90 deg in yaw (x right, y forward, as on the nuScenes car), cameras looking along +z;
- jittered timestamps (sweeps about 20 Hz, cameras about 12 Hz), or, with `keyframes_only`, chains of 2 Hz keyframes;
- `.pcd.bin` sweeps (x, y, z, intensity, ring float32) holding no-return points at the origin and roof returns;
- annotations of all ten detection classes plus a non-detection category (animal), one seen by no sensor and one seen
  by radar only;
- real JPEG camera images.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image
from pyquaternion import Quaternion

CAMS = {"CAM_FRONT": 0.0, "CAM_FRONT_RIGHT": -55.0, "CAM_FRONT_LEFT": 55.0, "CAM_BACK": 180.0, "CAM_BACK_LEFT": 110.0,
        "CAM_BACK_RIGHT": -110.0}
# category, size (w, l, h), yaw (global, rad), velocity (m/s, global xy), num_lidar_pts, num_radar_pts
OBJECTS = [
    ("vehicle.car", (1.9, 4.6, 1.6), 0.4, (6.0, 2.0), 0, 0),  # seen by no sensor
    ("vehicle.truck", (2.5, 7.0, 3.0), -1.2, (0.0, 0.0), 0, 3),  # seen by radar only
    ("vehicle.trailer", (2.5, 10.0, 3.8), 2.5, (1.0, -0.5), 40, 1),
    ("vehicle.bus.rigid", (2.9, 11.0, 3.5), -2.8, (4.0, 0.0), 120, 4),
    ("vehicle.construction", (2.8, 6.5, 3.2), 1.0, (0.0, 0.0), 30, 0),
    ("vehicle.bicycle", (0.6, 1.8, 1.3), 0.0, (3.0, 0.5), 12, 0),
    ("vehicle.motorcycle", (0.8, 2.1, 1.5), -0.7, (5.0, -4.0), 15, 1),
    ("human.pedestrian.adult", (0.7, 0.6, 1.75), 1.9, (0.8, 0.9), 25, 0),
    ("movable_object.trafficcone", (0.4, 0.45, 1.0), 0.2, (0.0, 0.0), 8, 0),
    ("movable_object.barrier", (2.5, 0.5, 1.0), -0.3, (0.0, 0.0), 20, 0),
    ("animal", (0.5, 1.0, 0.6), 0.9, (1.0, 0.0), 6, 0),
]
CATEGORIES = [o[0] for o in OBJECTS]
N_FAR, N_ORIGIN, N_ROOF = 200, 20, 6  # points per sweep: real returns, no-return (0, 0, 0), ego roof
K = np.array([[120.0, 0.0, 24.0], [0.0, 120.0, 16.0], [0.0, 0.0, 1.0]])
W, H = 48, 32
LIDAR_CALIB = dict(translation=[0.943713, 0.0, 1.84023], rotation=list(Quaternion(axis=[0, 0, 1], angle=-np.pi / 2).elements))


class _Tok:
    def __init__(self):
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"{self.n:032x}"


def _ego(t: float) -> dict:
    yaw = 0.3 + 0.05 * t
    return dict(translation=[400.0 + 5.0 * t * np.cos(0.3), 1100.0 + 5.0 * t * np.sin(0.3), 0.0],
                rotation=list(Quaternion(axis=[0, 0, 1], angle=yaw).elements))


def _pcd(rng: np.random.Generator) -> np.ndarray:
    ang, r = rng.uniform(-np.pi, np.pi, N_FAR), rng.uniform(3.0, 30.0, N_FAR)
    far = np.stack([r * np.cos(ang), r * np.sin(ang), rng.uniform(-1.8, 1.0, N_FAR), rng.uniform(1, 100, N_FAR),
                    rng.integers(0, 32, N_FAR)], 1)
    origin = np.zeros((N_ORIGIN, 5))
    origin[:, 4] = rng.integers(0, 32, N_ORIGIN)
    roof = np.stack([rng.uniform(-0.9, 0.9, N_ROOF), rng.uniform(-0.9, 0.9, N_ROOF), rng.uniform(-0.3, 0.0, N_ROOF),
                     rng.uniform(1, 10, N_ROOF), rng.integers(0, 32, N_ROOF)], 1)
    pts = np.concatenate([far, origin, roof])
    return pts[rng.permutation(len(pts))].astype(np.float32)


def write_release(root: str | Path, keyframes_only: bool = False, n_keyframes: int = 4, seed: int = 0) -> Path:
    root = Path(root)
    rng = np.random.default_rng(seed)
    tok = _Tok()
    T: dict[str, list[dict]] = {t: [] for t in ("category", "attribute", "visibility", "instance", "sensor",
                                                "calibrated_sensor", "ego_pose", "log", "scene", "sample", "sample_data",
                                                "sample_annotation", "map")}
    cat = {}
    for i, name in enumerate(dict.fromkeys(CATEGORIES)):
        cat[name] = tok()
        T["category"].append(dict(token=cat[name], name=name, description=name, index=i))
    for name in ("vehicle.moving", "vehicle.parked", "cycle.with_rider", "pedestrian.moving"):
        T["attribute"].append(dict(token=tok(), name=name, description=name))
    for i, level in enumerate(("v0-40", "v40-60", "v60-80", "v80-100")):
        T["visibility"].append(dict(token=str(i + 1), level=level, description=level))
    calib = {}
    for ch in ("LIDAR_TOP", *CAMS):
        s = dict(token=tok(), channel=ch, modality="lidar" if ch == "LIDAR_TOP" else "camera")
        T["sensor"].append(s)
        if ch == "LIDAR_TOP":
            c = dict(token=tok(), sensor_token=s["token"], camera_intrinsic=[], **LIDAR_CALIB)
        else:  # camera axes (x right, y down, z forward) in the ego frame, turned to the camera's heading
            yaw = np.deg2rad(CAMS[ch])
            R = Quaternion(axis=[0, 0, 1], angle=yaw).rotation_matrix @ np.array([[0, 0, 1], [-1, 0, 0], [0, -1, 0.0]])
            c = dict(token=tok(), sensor_token=s["token"], translation=[1.5 * np.cos(yaw), 0.5 * np.sin(yaw), 1.5],
                     rotation=list(Quaternion(matrix=R).elements), camera_intrinsic=K.tolist())
        T["calibrated_sensor"].append(c)
        calib[ch] = c["token"]
    for si, name in enumerate(("scene-0061", "scene-0103")):  # one mini_train and one mini_val scene
        logfile = f"n015-2018-07-{18 + si}-11-07-57+0800"
        log = dict(token=tok(), logfile=logfile, vehicle="n015", date_captured=f"2018-07-{18 + si}",
                   location="singapore-onenorth")
        T["log"].append(log)
        T["map"].append(dict(token=tok(), log_tokens=[log["token"]], category="semantic_prior",
                             filename=f"maps/{si:032x}.png"))
        (root / "maps").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((20, 20), 255, np.uint8)).save(root / T["map"][-1]["filename"])
        t0 = 1531883530_000000 + si * 100_000_000
        samples = [dict(token=tok(), timestamp=0, prev="", next="", scene_token="") for _ in range(n_keyframes)]
        scene = dict(token=tok(), log_token=log["token"], nbr_samples=n_keyframes, first_sample_token=samples[0]["token"],
                     last_sample_token=samples[-1]["token"], name=name, description="written by the test")
        T["scene"].append(scene)
        for ch, period, per_key in (("LIDAR_TOP", 50_000, 10), *((c, 83_333, 6) for c in CAMS)):
            rows = []
            for j in range(per_key * (n_keyframes - 1) + 1):
                key = j % per_key == 0
                if keyframes_only and not key:
                    continue
                ts = t0 + j * period + (0 if j == 0 else int(rng.integers(-3000, 3000)))
                ki = -(-j // per_key)
                pose = dict(token=tok(), timestamp=ts, **_ego((ts - t0) * 1e-6))
                T["ego_pose"].append(pose)
                folder = "samples" if key else "sweeps"
                ext = "pcd.bin" if ch == "LIDAR_TOP" else "jpg"
                fn = f"{folder}/{ch}/{logfile}__{ch}__{ts}.{ext}"
                (root / fn).parent.mkdir(parents=True, exist_ok=True)
                if ch == "LIDAR_TOP":
                    _pcd(rng).tofile(root / fn)
                else:
                    Image.fromarray(rng.integers(0, 255, (H, W, 3), dtype=np.uint8)).save(root / fn, quality=90)
                rows.append(dict(token=tok(), sample_token=samples[ki]["token"], ego_pose_token=pose["token"],
                                 calibrated_sensor_token=calib[ch], timestamp=ts, fileformat=ext.split(".")[0],
                                 is_key_frame=key, height=0 if ch == "LIDAR_TOP" else H, width=0 if ch == "LIDAR_TOP" else W,
                                 filename=fn, prev="", next=""))
                if ch == "LIDAR_TOP" and key:
                    samples[ki]["timestamp"] = ts
            for a, b in zip(rows, rows[1:], strict=False):
                a["next"], b["prev"] = b["token"], a["token"]
            T["sample_data"] += rows
        for a, b in zip(samples, samples[1:], strict=False):
            a["next"], b["prev"] = b["token"], a["token"]
        for s in samples:
            s["scene_token"] = scene["token"]
        T["sample"] += samples
        ego0 = np.asarray(_ego(0.0)["translation"])
        for oi, (category, size, yaw, vel, n_lidar, n_radar) in enumerate(OBJECTS):
            ang = 2 * np.pi * oi / len(OBJECTS)
            p0 = ego0 + np.array([12.0 * np.cos(ang), 12.0 * np.sin(ang), size[2] / 2 - 1.0])
            inst = dict(token=tok(), category_token=cat[category], nbr_annotations=n_keyframes)
            anns = []
            for s in samples:
                t = (s["timestamp"] - t0) * 1e-6
                anns.append(dict(token=tok(), sample_token=s["token"], instance_token=inst["token"], visibility_token="4",
                                 attribute_tokens=[], translation=list(p0 + np.array([vel[0], vel[1], 0.0]) * t),
                                 size=list(size), rotation=list(Quaternion(axis=[0, 0, 1], angle=yaw).elements),
                                 prev="", next="", num_lidar_pts=n_lidar, num_radar_pts=n_radar))
            for a, b in zip(anns, anns[1:], strict=False):
                a["next"], b["prev"] = b["token"], a["token"]
            inst["first_annotation_token"], inst["last_annotation_token"] = anns[0]["token"], anns[-1]["token"]
            T["instance"].append(inst)
            T["sample_annotation"] += anns
    (root / "v1.0-mini").mkdir(parents=True, exist_ok=True)
    for name, rows in T.items():
        (root / "v1.0-mini" / f"{name}.json").write_text(json.dumps(rows, indent=0, default=float))
    return root
