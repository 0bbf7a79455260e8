"""Default data: a small driving world written in the exact nuScenes v1.0 layout (tables, sweeps, six cameras).

Scenes are named after the official v1.0-mini split (8 `mini_train` + 2 `mini_val` scenes), so the unmodified devkit
(`NuScenes`, `DetectionEval` on `mini_val`) loads and evaluates them. In each scene the ego drives along a gently curving
road; cars, trucks, pedestrians and cyclists stand or move at constant velocity (a set share of them moving at realistic
speeds). A 32-beam spinning LiDAR is ray cast against the boxes and the ground at 20 Hz (keyframes at 2 Hz), six pinhole
cameras render the boxes (class colour, face shading, occlusion) at 12 Hz, and every keyframe carries annotations with
instance tracks, point counts, visibility and attributes. Objects moving between LiDAR sweeps are what makes asynchrony
hurt: a 0.5 s old sweep shows a 10 m/s car 5 m behind where the camera sees it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from .geometry import CAM_AXES, quaternion, transform, yaw_matrix

MINI_TRAIN = ("scene-0061", "scene-0553", "scene-0655", "scene-0757", "scene-0796", "scene-1077", "scene-1094", "scene-1100")
MINI_VAL = ("scene-0103", "scene-0916")

# name -> (nuScenes category, size (w, l, h) m, speed range m/s when moving, RGB colour, LiDAR reflectivity)
CLASSES = {
    "car": ("vehicle.car", (1.9, 4.6, 1.7), (5.0, 12.0), (200, 40, 40), 0.5),
    "truck": ("vehicle.truck", (2.5, 8.0, 3.0), (4.0, 9.0), (40, 70, 210), 0.6),
    "pedestrian": ("human.pedestrian.adult", (0.7, 0.7, 1.75), (1.0, 1.8), (40, 190, 40), 0.3),
    "bicycle": ("vehicle.bicycle", (0.6, 1.8, 1.4), (3.0, 6.0), (230, 200, 40), 0.4),
}
ATTRIBUTES = ("vehicle.moving", "vehicle.parked", "vehicle.stopped", "pedestrian.moving", "pedestrian.standing",
              "pedestrian.sitting_lying_down", "cycle.with_rider", "cycle.without_rider")
CAMERAS = {  # channel -> yaw of the optical axis in the ego frame (degrees), as on the nuScenes car
    "CAM_FRONT": 0.0, "CAM_FRONT_RIGHT": -55.0, "CAM_FRONT_LEFT": 55.0,
    "CAM_BACK": 180.0, "CAM_BACK_LEFT": 110.0, "CAM_BACK_RIGHT": -110.0,
}
LIDAR_TRANSLATION = (0.94, 0.0, 1.84)
SWEEP_HZ, KEYFRAME_EVERY, CAMERA_HZ = 20, 10, 12  # 20 Hz sweeps, every 10th a 2 Hz keyframe, 12 Hz cameras
MAX_RANGE = 45.0
T0_US = 1532402927000000


@dataclass
class WorldConfig:
    """Knobs of the generated world (all seeded; see `generate_world`)."""

    num_train_scenes: int = 8
    num_val_scenes: int = 2
    scene_seconds: float = 4.0
    objects_per_scene: int = 24
    moving_share: float = 0.6
    meet_ego: bool = False
    beams: int = 32
    azimuth_steps: int = 90
    image_width: int = 64
    image_height: int = 40
    seed: int = 0


def _token(rng: np.random.Generator) -> str:
    return rng.bytes(16).hex()


def _ego_pose(t: np.ndarray, speed: float, yaw_rate: float, yaw0: float):
    """Ego x, y, yaw at times t (s) for a constant-speed, constant-yaw-rate path starting at the origin."""
    yaw = yaw0 + yaw_rate * t
    if abs(yaw_rate) < 1e-6:
        return speed * t * np.cos(yaw0), speed * t * np.sin(yaw0), yaw
    r = speed / yaw_rate
    return r * (np.sin(yaw) - np.sin(yaw0)), -r * (np.cos(yaw) - np.cos(yaw0)), yaw


def _objects(rng: np.random.Generator, cfg: WorldConfig, ego_speed: float, yaw_rate: float, yaw0: float):
    """Objects near the ego path: class, size, position at t=0, constant velocity, yaw."""
    names = list(CLASSES)
    probs = np.array([0.45, 0.15, 0.25, 0.15])
    out = []
    for _ in range(cfg.objects_per_scene):
        name = names[rng.choice(4, p=probs)]
        _, size, speeds, _, _ = CLASSES[name]
        # t_ref: the time at which the object sits at arc position s. With `meet_ego` a moving object is placed near the
        # ego at a random time of the scene (so long scenes keep moving objects in view instead of losing them early)
        moving = rng.random() < cfg.moving_share if cfg.meet_ego else None
        t_ref = 0.0
        if moving:
            t_ref = rng.uniform(0.0, cfg.scene_seconds)
            s = ego_speed * t_ref + rng.uniform(-15.0, 20.0)
        else:
            s = rng.uniform(-15.0, ego_speed * cfg.scene_seconds + 20.0)  # arc position along the ego path
        ex, ey, eyaw = _ego_pose(np.array(s / max(ego_speed, 1e-3)), ego_speed, yaw_rate, yaw0)
        side = rng.choice([-1.0, 1.0])
        lateral = side * (rng.uniform(2.5, 6.0) if name in ("car", "truck") else rng.uniform(5.0, 12.0))
        x = float(ex) - np.sin(eyaw) * lateral
        y = float(ey) + np.cos(eyaw) * lateral
        if moving is None:  # drawn here without meet_ego: the worlds generated before that option stay unchanged
            moving = rng.random() < cfg.moving_share
        if name in ("car", "truck"):
            heading = float(eyaw) + (0.0 if side < 0 else np.pi)  # drive on the right-hand lanes
        else:
            heading = float(eyaw) + rng.choice([0.0, np.pi, np.pi / 2, -np.pi / 2]) + rng.normal(0, 0.2)
        speed = rng.uniform(*speeds) if moving else 0.0
        vel = speed * np.array([np.cos(heading), np.sin(heading)])
        x, y = x - vel[0] * t_ref, y - vel[1] * t_ref  # position at t = 0
        out.append(dict(name=name, size=size, p0=np.array([x, y, size[2] / 2]), vel=vel, yaw=heading, moving=moving))
    return out


def _box_arrays(objects):
    """(position at t = 0 (K, 3), velocity (K, 3), yaw (K,), half size (l, w, h) / 2 (K, 3)) of the objects."""
    p0 = np.stack([o["p0"] for o in objects])
    vel = np.stack([np.array([*o["vel"], 0.0]) for o in objects])
    yaws = np.array([o["yaw"] for o in objects])
    half = np.array([[o["size"][1] / 2, o["size"][0] / 2, o["size"][2] / 2] for o in objects])
    return p0, vel, yaws, half


def _boxes_at(arrays, t: float):
    p0, vel, yaws, half = arrays
    return p0 + vel * t, yaws, half


def _yaw_quaternion(yaw: float) -> list[float]:
    """(w, x, y, z) of a rotation by `yaw` about z (closed form; the world's poses and boxes rotate about z only)."""
    yaw = float(np.arctan2(np.sin(yaw), np.cos(yaw)))  # (-pi, pi]: w >= 0
    return [float(np.cos(yaw / 2)), 0.0, 0.0, float(np.sin(yaw / 2))]


def ray_cast(origin: np.ndarray, dirs: np.ndarray, centers: np.ndarray, yaws: np.ndarray, half: np.ndarray,
             max_range: float = MAX_RANGE):
    """Nearest hit of rays (R, 3) from `origin` against oriented boxes and the ground plane z = 0.

    Returns distance (R,) (inf for no hit), the hit box index (R,) (-1 ground, -2 none), the hit face axis (R,) and,
    per box, how many rays pass through it ignoring occlusion (for visibility). Boxes out of range are culled first;
    the slab test (in each box's frame) runs only on the (ray, box) pairs that pass within the box's bounding sphere
    (a few percent of all pairs: the same hits as testing every pair, at a fifth of the cost).
    """
    n_rays = len(dirs)
    passes = np.zeros(len(yaws), dtype=np.int64)
    keep = np.flatnonzero(np.linalg.norm(centers[:, :2] - origin[None, :2], axis=1) < max_range + 6.0)
    with np.errstate(divide="ignore"):
        t_ground = np.where(dirs[:, 2] < -1e-6, -origin[2] / dirs[:, 2], np.inf)
    best, which, face_hit = t_ground.copy(), np.full(n_rays, -1), np.full(n_rays, -1)
    if len(keep):
        rel = origin[None] - centers[keep]  # (K, 3)
        # bounding-sphere cull: a ray can only enter a box if it passes within the box's half diagonal of its centre
        radius = np.linalg.norm(half[keep], axis=1) + 1e-3
        along = -(dirs @ rel.T)  # (R, K) ray parameter of the closest approach to each centre
        closest = (rel ** 2).sum(1)[None] - np.maximum(along, 0.0) ** 2
        ri, ki = np.nonzero((closest <= radius[None] ** 2) & (along > -radius[None]))
        if len(ri):
            c, s = np.cos(-yaws[keep]), np.sin(-yaws[keep])
            cb, sb = c[ki], s[ki]
            r = rel[ki]
            dx, dy, dz = dirs[ri, 0], dirs[ri, 1], dirs[ri, 2]
            local_o = (cb * r[:, 0] - sb * r[:, 1], sb * r[:, 0] + cb * r[:, 1], r[:, 2])
            local_d = (cb * dx - sb * dy, sb * dx + cb * dy, dz)
            hk = half[keep][ki]
            near = far = axis = None
            for a in range(3):
                d = np.where(np.abs(local_d[a]) < 1e-9, 1e-9, local_d[a])
                h, o = hk[:, a], local_o[a]
                t1, t2 = (-h - o) / d, (h - o) / d
                lo, hi = np.minimum(t1, t2), np.maximum(t1, t2)
                if near is None:
                    near, far, axis = lo, hi, np.zeros(lo.shape, dtype=np.int64)
                else:
                    axis = np.where(lo > near, a, axis)
                    near, far = np.maximum(near, lo), np.minimum(far, hi)
            hit = (near <= far) & (near > 0.05)
            passes[keep] = np.bincount(ki[hit], minlength=len(keep))
            ri, ki, t_hit, axis = ri[hit], ki[hit], near[hit], axis[hit]
            order = np.lexsort((ki, t_hit, ri))  # per ray: nearest hit first (ties: lowest box index)
            ri, ki, t_hit, axis = ri[order], ki[order], t_hit[order], axis[order]
            first = np.ones(len(ri), dtype=bool)
            first[1:] = ri[1:] != ri[:-1]
            ri, ki, t_hit, axis = ri[first], ki[first], t_hit[first], axis[first]
            closer = t_hit < best[ri]
            ri, ki, t_hit, axis = ri[closer], ki[closer], t_hit[closer], axis[closer]
            best[ri], which[ri], face_hit[ri] = t_hit, keep[ki], axis
    out = best > max_range
    return np.where(out, np.inf, best), np.where(out, -2, which), face_hit, passes


class _Writer:
    """Accumulates nuScenes table rows and writes them as `<version>/<table>.json`."""

    TABLES = ("category", "attribute", "visibility", "instance", "sensor", "calibrated_sensor", "ego_pose", "log", "scene",
              "sample", "sample_data", "sample_annotation", "map")

    def __init__(self):
        self.rows = {t: [] for t in self.TABLES}

    def add(self, table: str, **row) -> dict:
        self.rows[table].append(row)
        return row

    def write(self, root: Path, version: str) -> None:
        (root / version).mkdir(parents=True, exist_ok=True)
        for t, rows in self.rows.items():
            (root / version / f"{t}.json").write_text(json.dumps(rows))


def _link(rows: list[dict]) -> None:
    for a, b in zip(rows[:-1], rows[1:], strict=False):
        a["next"], b["prev"] = b["token"], a["token"]


def generate_world(root: str | Path, cfg: WorldConfig | None = None, version: str = "v1.0-mini") -> Path:
    """Write the world into `root` in the nuScenes layout; returns `root`."""
    cfg = cfg or WorldConfig()
    if cfg.num_train_scenes > len(MINI_TRAIN) or cfg.num_val_scenes > len(MINI_VAL):
        raise ValueError(f"at most {len(MINI_TRAIN)} train and {len(MINI_VAL)} val scenes (the v1.0-mini split names)")
    root = Path(root)
    rng = np.random.default_rng(cfg.seed)
    w = _Writer()
    cat_tok = {}
    for i, (name, (category, *_)) in enumerate(CLASSES.items()):
        cat_tok[name] = w.add("category", token=_token(rng), name=category, description=name, index=i)["token"]
    attr_tok = {a: w.add("attribute", token=_token(rng), name=a, description=a)["token"] for a in ATTRIBUTES}
    for i, level in enumerate(("v0-40", "v40-60", "v60-80", "v80-100")):
        w.add("visibility", token=str(i + 1), level=level, description=f"visibility {level}")

    # sensors and one calibration each (shared by all logs: one car)
    sensors = {"LIDAR_TOP": w.add("sensor", token=_token(rng), channel="LIDAR_TOP", modality="lidar")["token"]}
    l2e = transform(np.eye(3), LIDAR_TRANSLATION)
    calib = {"LIDAR_TOP": w.add("calibrated_sensor", token=_token(rng), sensor_token=sensors["LIDAR_TOP"],
                                translation=list(LIDAR_TRANSLATION), rotation=[1.0, 0.0, 0.0, 0.0], camera_intrinsic=[])}
    W, H = cfg.image_width, cfg.image_height
    f = W / 2 / np.tan(np.radians(35.0))  # ~70 degree horizontal field of view
    K = np.array([[f, 0, W / 2], [0, f, H / 2], [0, 0, 1.0]])
    cam_T = {}
    for ch, yaw in CAMERAS.items():
        sensors[ch] = w.add("sensor", token=_token(rng), channel=ch, modality="camera")["token"]
        R = yaw_matrix(np.radians(yaw)) @ CAM_AXES
        t = [1.0 * np.cos(np.radians(yaw)) + 0.5, 0.6 * np.sin(np.radians(yaw)), 1.55]
        cam_T[ch] = transform(R, t)
        calib[ch] = w.add("calibrated_sensor", token=_token(rng), sensor_token=sensors[ch], translation=[float(v) for v in t],
                          rotation=quaternion(R), camera_intrinsic=K.tolist())

    # LiDAR rays in the sensor frame: 32 beams from +10 to -30 degrees elevation, `azimuth_steps` columns
    elev = np.radians(np.linspace(10.0, -30.0, cfg.beams))
    az = np.linspace(-np.pi, np.pi, cfg.azimuth_steps, endpoint=False)
    ee, aa = np.meshgrid(elev, az, indexing="ij")
    lidar_dirs = np.stack([np.cos(ee) * np.cos(aa), np.cos(ee) * np.sin(aa), np.sin(ee)], -1).reshape(-1, 3)
    rings = np.repeat(np.arange(cfg.beams), cfg.azimuth_steps).astype(np.float32)
    # camera pixel rays in the camera frame
    u, v = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)
    pix_dirs = np.stack([(u - W / 2) / f, (v - H / 2) / f, np.ones_like(u)], -1).reshape(-1, 3)
    pix_dirs /= np.linalg.norm(pix_dirs, axis=1, keepdims=True)
    colours = np.array([CLASSES[n][3] for n in CLASSES], dtype=float)

    names = list(MINI_TRAIN[: cfg.num_train_scenes]) + list(MINI_VAL[: cfg.num_val_scenes])
    n_sweeps = int(round(cfg.scene_seconds * SWEEP_HZ))
    for si, scene_name in enumerate(names):
        log_name = f"n015-2018-07-{10 + si:02d}-11-22-45+0800"
        log = w.add("log", token=_token(rng), logfile=log_name, vehicle="n015", date_captured=f"2018-07-{10 + si:02d}",
                    location="singapore-onenorth")
        w.add("map", token=_token(rng), log_tokens=[log["token"]], category="semantic_prior", filename="")
        ego_speed = rng.uniform(3.0, 9.0)
        yaw_rate = rng.uniform(-0.06, 0.06)
        yaw0 = rng.uniform(-np.pi, np.pi)
        objects = _objects(rng, cfg, ego_speed, yaw_rate, yaw0)
        arrays = _box_arrays(objects)
        obj_class = np.array([list(CLASSES).index(o["name"]) for o in objects])
        reflect = np.array([CLASSES[o["name"]][4] for o in objects])
        base_us = T0_US + si * 100_000_000
        scene = w.add("scene", token=_token(rng), log_token=log["token"], nbr_samples=0, first_sample_token="",
                      last_sample_token="", name=scene_name, description="generated driving scene")
        samples = []
        for k in range(0, n_sweeps, KEYFRAME_EVERY):
            samples.append(w.add("sample", token=_token(rng), timestamp=base_us + k * 50_000, prev="", next="",
                                 scene_token=scene["token"]))
        _link(samples)
        scene.update(nbr_samples=len(samples), first_sample_token=samples[0]["token"], last_sample_token=samples[-1]["token"])

        def pose(t_s: float, ego_speed=ego_speed, yaw_rate=yaw_rate, yaw0=yaw0) -> tuple[np.ndarray, dict]:
            x, y, yaw = _ego_pose(np.array(t_s), ego_speed, yaw_rate, yaw0)
            T = transform(yaw_matrix(float(yaw)), [float(x), float(y), 0.0])
            return T, dict(translation=[float(x), float(y), 0.0], rotation=_yaw_quaternion(float(yaw)))

        # LiDAR sweeps
        lidar_rows, ann_stats = [], {}
        for k in range(n_sweeps):
            t_s = k / SWEEP_HZ
            ts = base_us + k * 50_000
            e2g, pose_rec = pose(t_s)
            ep = w.add("ego_pose", token=_token(rng), timestamp=ts, **pose_rec)
            l2g = e2g @ l2e
            centers, yaws, half = _boxes_at(arrays, t_s)
            dist, which, _, passes = ray_cast(l2g[:3, 3], lidar_dirs @ l2g[:3, :3].T, centers, yaws, half)
            ok = np.isfinite(dist)
            dist = dist + rng.normal(0, 0.02, dist.shape)  # range noise
            pts = lidar_dirs[ok] * dist[ok, None]
            inten = np.where(which[ok] >= 0, reflect[np.clip(which[ok], 0, None)] * 255, 25.0) + rng.normal(0, 3, ok.sum())
            cloud = np.concatenate([pts, np.clip(inten, 0, 255)[:, None], rings[ok, None]], 1).astype(np.float32)
            key = k % KEYFRAME_EVERY == 0
            folder = "samples" if key else "sweeps"
            fn = f"{folder}/LIDAR_TOP/{log_name}__LIDAR_TOP__{ts}.pcd.bin"
            (root / fn).parent.mkdir(parents=True, exist_ok=True)
            cloud.tofile(root / fn)
            sample = samples[min(-(-k // KEYFRAME_EVERY), len(samples) - 1)]  # a sweep belongs to the next keyframe
            lidar_rows.append(w.add("sample_data", token=_token(rng), sample_token=sample["token"], ego_pose_token=ep["token"],
                                    calibrated_sensor_token=calib["LIDAR_TOP"]["token"], timestamp=ts, fileformat="pcd",
                                    is_key_frame=key, height=0, width=0, filename=fn, prev="", next=""))
            if key:
                hits = np.bincount(which[ok & (which >= 0)], minlength=len(objects))
                ann_stats[k // KEYFRAME_EVERY] = (centers, yaws, hits, passes, e2g)
        _link(lidar_rows)

        # cameras at 12 Hz; every 6th frame coincides with a keyframe
        n_frames = int(round(cfg.scene_seconds * CAMERA_HZ))
        for ch in CAMERAS:
            rows = []
            for j in range(n_frames):
                t_s = j / CAMERA_HZ
                ts = base_us + int(round(t_s * 1e6))
                e2g, pose_rec = pose(t_s)
                ep = w.add("ego_pose", token=_token(rng), timestamp=ts, **pose_rec)
                c2g = e2g @ cam_T[ch]
                centers, yaws, half = _boxes_at(arrays, t_s)
                dist, which, face, _ = ray_cast(c2g[:3, 3], pix_dirs @ c2g[:3, :3].T, centers, yaws, half, max_range=80.0)
                img = np.empty((H * W, 3))
                img[:] = (135, 170, 215)  # sky
                ground = which == -1
                gd = np.clip(dist[ground] / 40.0, 0, 1)
                img[ground] = (95 + 40 * gd)[:, None] * np.ones(3)
                box = which >= 0
                shade = np.array([0.75, 0.9, 1.0])[face[box]]
                img[box] = colours[obj_class[which[box]]] * shade[:, None]
                img += rng.normal(0, 4, img.shape)
                key = j % (CAMERA_HZ // 2) == 0
                folder = "samples" if key else "sweeps"
                fn = f"{folder}/{ch}/{log_name}__{ch}__{ts}.jpg"
                (root / fn).parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.clip(img, 0, 255).astype(np.uint8).reshape(H, W, 3)).save(root / fn, quality=92)
                sample = samples[min(-(-j // (CAMERA_HZ // 2)), len(samples) - 1)]
                rows.append(w.add("sample_data", token=_token(rng), sample_token=sample["token"], ego_pose_token=ep["token"],
                                  calibrated_sensor_token=calib[ch]["token"], timestamp=ts, fileformat="jpg",
                                  is_key_frame=key, height=H, width=W, filename=fn, prev="", next=""))
            _link(rows)

        # annotations with instance tracks: every object within range at a keyframe
        tracks: dict[int, list[dict]] = {}
        for ki, sample in enumerate(samples):
            centers, yaws, hits, passes, e2g = ann_stats[ki]
            ego_xy = e2g[:2, 3]
            for oi, o in enumerate(objects):
                if np.linalg.norm(centers[oi, :2] - ego_xy) > 50.0:
                    continue
                vis = hits[oi] / max(passes[oi], 1)
                name = o["name"]
                if name in ("car", "truck"):
                    attr = "vehicle.moving" if o["moving"] else "vehicle.parked"
                elif name == "pedestrian":
                    attr = "pedestrian.moving" if o["moving"] else "pedestrian.standing"
                else:
                    attr = "cycle.with_rider" if o["moving"] else "cycle.without_rider"
                tracks.setdefault(oi, []).append(dict(
                    token=_token(rng), sample_token=sample["token"], instance_token="", visibility_token=str(
                        1 + int(np.digitize(vis, [0.4, 0.6, 0.8]))), attribute_tokens=[attr_tok[attr]],
                    translation=[float(v) for v in centers[oi]], size=list(o["size"]),
                    rotation=_yaw_quaternion(o["yaw"]), prev="", next="", num_lidar_pts=int(hits[oi]),
                    num_radar_pts=0))
        for oi, anns in tracks.items():
            inst = w.add("instance", token=_token(rng), category_token=cat_tok[objects[oi]["name"]], nbr_annotations=len(anns),
                         first_annotation_token=anns[0]["token"], last_annotation_token=anns[-1]["token"])
            for a in anns:
                a["instance_token"] = inst["token"]
                w.rows["sample_annotation"].append(a)
            _link(anns)

    # one small semantic-prior mask per map record (the devkit opens it lazily)
    (root / "maps").mkdir(parents=True, exist_ok=True)
    for m in w.rows["map"]:
        m["filename"] = f"maps/{m['token']}.png"
        Image.fromarray(np.full((64, 64), 255, np.uint8)).save(root / m["filename"])
    w.write(root, version)
    return root


__all__ = ["generate_world", "WorldConfig", "ray_cast"]
