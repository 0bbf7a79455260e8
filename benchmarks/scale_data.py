"""Synthetic files of the *real shapes and layouts* of each method's large dataset, written with plain libraries.

Independent of the methods' own default generators: each writer follows the published layout (file names, keys,
dims, dtypes, chunking) so that the project's real reader reads it, at the real per-sample size. Where the real
length would not fit on a laptop disk, fewer records of the real size are written (`SIZES` says how many; the
`scale` argument of each writer shrinks the count for tests, never the per-record shape).

| data | real release | written here |
|---|---|---|
| ERA5 WB2 Zarr 1.40625 deg | 256 x 128 grid, 13 levels, 6-hourly, 1959-2023 | 12 days, same grid/levels/chunks |
| ERA5 WB2 Zarr 5.625 deg | 64 x 32 grid (STORM's paper config), 13 levels | 12 days, same grid/levels/chunks |
| PhysioNet 2012 | set-a/b/c, 12,000 `<RecordID>.txt` | 12,000 records |
| D4RL HDF5 | halfcheetah-medium-v2: 1M transitions, obs 17, act 6 | 1M transitions |
| OGBench npz | cube-single-play-v0: 1000 x 1001 steps, obs 28, act 5 | 1000 x 1001 steps |
| nuScenes v1.0-mini | 10 scenes x ~40 keyframes; LiDAR 20 Hz ~34.7k pts; 6 x 1600x900 JPEG 12 Hz | 10 x 3 keyframes, real sizes |
| HumanML3D | 14,616 motions (+ mirrors), 40-196 frames at 20 fps | 2,000 motions, same shapes |
| RouterBench | routerbench_0shot.pkl: 36,497 prompts x 11 models | 36,497 x 11 |
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

ROOT = Path("data/scale")

# real sizes (what `scale=1` writes); per-record shapes never change with `scale`
SIZES = {
    "era5": dict(days=12, nlat=128, nlon=256, levels=(50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000)),
    "era5_5625": dict(days=12, nlat=32, nlon=64),  # the paper config's 5.625 deg grid (WB2 64 x 32), same levels
    "physionet": dict(records=12_000),
    "d4rl": dict(transitions=1_000_000, obs_dim=17, act_dim=6),
    "ogbench": dict(episodes=1000, length=1001, obs_dim=28, act_dim=5, nq=21, nv=20),
    "nuscenes": dict(scenes=10, keyframes=3, points=34_720, width=1600, height=900),
    "humanml3d": dict(motions=2000),
    "routerbench": dict(prompts=36_497),
}


def _done(out: Path) -> bool:
    return (out / ".complete").exists()


def _atomic(out: Path, write) -> Path:
    """Write into `<out>.tmp-<pid>` and rename when complete (no partial dataset is ever left under `out`)."""
    out = Path(out)
    if _done(out):
        return out
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / ".complete").write_text(json.dumps({"seconds": round(time.perf_counter() - t0, 1)}))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# ------------------------------------------------------------------------------------------------------------ ERA5
ERA5_LEVEL_VARS = ("geopotential", "temperature", "u_component_of_wind", "v_component_of_wind", "specific_humidity")
ERA5_SURFACE_VARS = ("2m_temperature", "10m_u_component_of_wind", "10m_v_component_of_wind", "mean_sea_level_pressure")


def era5_grid(nlat: int, nlon: int) -> tuple[np.ndarray, np.ndarray]:
    """WB2 equiangular grid without poles: 1.40625 deg is 256 x 128, latitudes -89.296875 .. 89.296875."""
    d = 180.0 / nlat
    return -90.0 + d / 2 + d * np.arange(nlat), 360.0 / nlon * np.arange(nlon)


def write_era5(out: Path, days: int | None = None, nlat: int | None = None, nlon: int | None = None,
               levels: tuple[int, ...] | None = None) -> Path:
    """A WB2 Zarr store (zarr v2, consolidated): dims time, level, latitude, longitude; WB2 variable names; chunks of one
    time step holding every level and the whole grid (WB2's chunking); 6-hourly from 2000-01-01."""
    s = SIZES["era5"]
    days, nlat, nlon = days or s["days"], nlat or s["nlat"], nlon or s["nlon"]
    levels = tuple(levels or s["levels"])

    def write(tmp: Path):
        import xarray as xr

        lat, lon = era5_grid(nlat, nlon)
        times = np.datetime64("2000-01-01T00", "ns") + np.arange(days * 4) * np.timedelta64(6, "h")
        rng = np.random.default_rng(0)
        la, lo = np.deg2rad(lat)[:, None], np.deg2rad(lon)[None, :]
        lev = np.asarray(levels, float)
        store = tmp / f"era5_wb2_{180 / nlat:g}deg.zarr"  # WB2's names: 1.40625deg (256 x 128), 5.625deg (64 x 32)
        block = 8
        for b in range(0, times.size, block):
            tb = times[b:b + block]
            ph = (np.arange(b, b + tb.size) * 0.3)[:, None, None, None]
            wave = np.cos(la)[None, None] * np.sin(3 * lo[None, None] - ph) + 0.1 * rng.standard_normal((tb.size, 1, nlat, nlon))
            data = {}
            for k, name in enumerate(ERA5_LEVEL_VARS):
                base = {"geopotential": 9.81 * 7000 * np.log(1000 / lev), "temperature": 288 - 60 * np.log(1000 / lev) / 3,
                        "specific_humidity": 0.01 * lev / 1000}.get(name, np.zeros_like(lev))
                amp = {"geopotential": 800.0, "temperature": 8.0, "specific_humidity": 0.002}.get(name, 10.0)
                arr = base[None, :, None, None] + amp * (wave + 0.05 * k)
                data[name] = (("time", "level", "latitude", "longitude"), arr.astype(np.float32))
            for k, name in enumerate(ERA5_SURFACE_VARS):
                base, amp = {"2m_temperature": (285.0, 10.0), "mean_sea_level_pressure": (101325.0, 800.0)}.get(name, (0.0, 5.0))
                data[name] = (("time", "latitude", "longitude"), (base + amp * (wave[:, 0] + 0.05 * k)).astype(np.float32))
            ds = xr.Dataset(data, coords={"time": tb, "level": np.asarray(levels, np.int64), "latitude": lat,
                                          "longitude": lon})
            enc = {v: {"chunks": (1, len(levels), nlat, nlon) if v in ERA5_LEVEL_VARS else (1, nlat, nlon)}
                   for v in data}
            if b == 0:
                ds["land_sea_mask"] = (("latitude", "longitude"), (np.sin(2 * lo) * np.cos(la) > 0.2).astype(np.float32))
                ds["geopotential_at_surface"] = (("latitude", "longitude"),
                                                 (9.81 * 500 * np.clip(np.sin(2 * lo) * np.cos(la), 0, None)).astype(np.float32))
                ds.to_zarr(store, zarr_format=2, consolidated=True, encoding=enc, mode="w")
            else:
                ds.to_zarr(store, zarr_format=2, consolidated=True, append_dim="time")

    return _atomic(out, write)


def write_era5_5625(out: Path, days: int | None = None) -> Path:
    """`write_era5` on the 5.625 deg grid (64 x 32) of the STORM paper config, WB2's chunks and levels."""
    s = SIZES["era5_5625"]
    return write_era5(out, days or s["days"], s["nlat"], s["nlon"])


def era5_store(out: Path) -> Path:
    """The Zarr store a `write_era5*` folder holds."""
    return next(Path(out).glob("era5_wb2_*deg.zarr"))


# ------------------------------------------------------------------------------------------------------- PhysioNet
VITALS = ("HR", "MAP", "SysABP", "DiasABP", "NIMAP", "NISysABP", "NIDiasABP", "RespRate", "Temp", "Urine", "GCS",
          "FiO2", "SaO2", "MechVent")
LABS = ("ALP", "ALT", "AST", "Albumin", "BUN", "Bilirubin", "Cholesterol", "Creatinine", "Glucose", "HCO3", "HCT",
        "K", "Lactate", "Mg", "Na", "PaCO2", "PaO2", "Platelets", "TroponinI", "TroponinT", "WBC", "pH", "Weight")


def write_physionet(out: Path, records: int | None = None) -> Path:
    """PhysioNet/CinC 2012 `set-a/`, `set-b/`, `set-c/` of `<RecordID>.txt` (a third each, RecordIDs from 132539 as the
    challenge's), `Time,Parameter,Value` rows: 00:00 RecordID + descriptors, vitals about hourly, labs every ~12 h
    over 48 h (about 400 rows a record, the challenge's average)."""
    n = records or SIZES["physionet"]["records"]

    def write(tmp: Path):
        rng = np.random.default_rng(0)
        sets = ("set-a", "set-b", "set-c")
        for s in sets:
            (tmp / s).mkdir()
        for i in range(n):
            rid = 132539 + i
            rows = ["Time,Parameter,Value", f"00:00,RecordID,{rid}", f"00:00,Age,{rng.integers(16, 90)}",
                    f"00:00,Gender,{rng.integers(0, 2)}", f"00:00,Height,{-1 if rng.random() < 0.5 else rng.integers(150, 195)}",
                    f"00:00,ICUType,{rng.integers(1, 5)}", f"00:00,Weight,{rng.uniform(50, 110):.1f}"]
            obs = []
            for name in VITALS:
                m = np.sort(rng.choice(2880, size=rng.integers(10, 48), replace=False))
                obs += [(t, name, rng.normal(80, 10)) for t in m]
            for name in LABS:
                if rng.random() < 0.6:
                    m = np.sort(rng.choice(2880, size=rng.integers(1, 5), replace=False))
                    obs += [(t, name, abs(rng.normal(20, 5))) for t in m]
            obs.sort(key=lambda r: r[0])
            rows += [f"{t // 60:02d}:{t % 60:02d},{name},{v:.2f}" for t, name, v in obs]
            (tmp / sets[i * len(sets) // n] / f"{rid}.txt").write_text("\n".join(rows) + "\n")

    return _atomic(out, write)


# ---------------------------------------------------------------------------------------------------- D4RL / OGBench
def write_d4rl(out: Path, transitions: int | None = None) -> Path:
    """A D4RL `-v2` HDF5 file (halfcheetah-medium-v2's keys and shapes): observations, next_observations, actions,
    rewards, terminals, timeouts (every 1000 steps), metadata/ref_*_score."""
    s = SIZES["d4rl"]
    n = transitions or s["transitions"]

    def write(tmp: Path):
        import h5py

        rng = np.random.default_rng(0)
        obs = np.cumsum(rng.standard_normal((n, s["obs_dim"]), dtype=np.float32) * 0.05, 0, dtype=np.float32)
        nxt = np.concatenate([obs[1:], obs[-1:]])
        timeouts = (np.arange(n) % 1000) == 999
        with h5py.File(tmp / "halfcheetah-medium-v2.hdf5", "w") as f:
            f["observations"], f["next_observations"] = obs, nxt
            f["actions"] = rng.uniform(-1, 1, (n, s["act_dim"])).astype(np.float32)
            f["rewards"] = rng.normal(4.0, 1.0, n).astype(np.float32)
            f["terminals"], f["timeouts"] = np.zeros(n, bool), timeouts
            f["metadata/ref_min_score"], f["metadata/ref_max_score"] = -280.178953, 12135.0

    return _atomic(out, write)


def write_ogbench(out: Path, episodes: int | None = None) -> Path:
    """OGBench `cube-single-play-v0.npz` (np.savez_compressed, as OGBench ships): observations (N, 28), actions (N, 5),
    terminals (1 on each trajectory's last row), qpos (N, 21), qvel (N, 20); 1000 trajectories of 1001 rows."""
    s = SIZES["ogbench"]
    e = episodes or s["episodes"]
    n = e * s["length"]

    def write(tmp: Path):
        rng = np.random.default_rng(0)
        terminals = np.zeros(n, np.float32)
        terminals[s["length"] - 1::s["length"]] = 1
        qpos = rng.normal(0, 0.1, (n, s["nq"])).astype(np.float32)
        qpos[:, 14:17] = rng.uniform([0.3, -0.2, 0.02], [0.5, 0.2, 0.03], (n, 3))  # the cube's position
        qpos[:, 17:21] = [1, 0, 0, 0]
        np.savez_compressed(tmp / "cube-single-play-v0.npz",
                            observations=rng.normal(0, 1, (n, s["obs_dim"])).astype(np.float32),
                            actions=rng.uniform(-1, 1, (n, s["act_dim"])).astype(np.float32), terminals=terminals,
                            qpos=qpos, qvel=rng.normal(0, 0.1, (n, s["nv"])).astype(np.float32))

    return _atomic(out, write)


# ------------------------------------------------------------------------------------------------------- nuScenes
CAMS = {"CAM_FRONT": 0.0, "CAM_FRONT_RIGHT": -55.0, "CAM_FRONT_LEFT": 55.0, "CAM_BACK": 180.0, "CAM_BACK_LEFT": 110.0,
        "CAM_BACK_RIGHT": -110.0}
NUSC_OBJECTS = [("vehicle.car", (1.9, 4.6, 1.6), (6.0, 2.0)), ("vehicle.truck", (2.5, 7.0, 3.0), (0.0, 0.0)),
                ("vehicle.bus.rigid", (2.9, 11.0, 3.5), (4.0, 0.0)), ("vehicle.bicycle", (0.6, 1.8, 1.3), (3.0, 0.5)),
                ("human.pedestrian.adult", (0.7, 0.6, 1.75), (0.8, 0.9)), ("movable_object.barrier", (2.5, 0.5, 1.0), (0, 0))]


def write_nuscenes(out: Path, scenes: int | None = None, keyframes: int | None = None, points: int | None = None,
                   width: int | None = None, height: int | None = None) -> Path:
    """nuScenes v1.0-mini layout: the 13 tables, `samples/` and `sweeps/` of LIDAR_TOP `.pcd.bin` (x, y, z, intensity,
    ring float32; about 34.7k points, 20 Hz, 10 sweeps per keyframe interval) and six cameras' JPEGs (1600 x 900, 12 Hz),
    for the ten mini scenes (the devkit's mini_train / mini_val names)."""
    s = SIZES["nuscenes"]
    scenes, keyframes = scenes or s["scenes"], keyframes or s["keyframes"]
    points, width, height = points or s["points"], width or s["width"], height or s["height"]

    def write(tmp: Path):
        from nuscenes.utils.splits import mini_train, mini_val
        from PIL import Image
        from pyquaternion import Quaternion

        rng = np.random.default_rng(0)
        count = [0]

        def tok() -> str:
            count[0] += 1
            return f"{count[0]:032x}"

        names = (list(mini_train) + list(mini_val))[:scenes]
        T: dict[str, list[dict]] = {t: [] for t in ("category", "attribute", "visibility", "instance", "sensor",
                                                    "calibrated_sensor", "ego_pose", "log", "scene", "sample",
                                                    "sample_data", "sample_annotation", "map")}
        cat = {}
        for i, (name, _, _) in enumerate(NUSC_OBJECTS):
            cat[name] = tok()
            T["category"].append(dict(token=cat[name], name=name, description=name, index=i))
        T["attribute"].append(dict(token=tok(), name="vehicle.moving", description="moving"))
        T["visibility"].append(dict(token="4", level="v80-100", description="visible"))
        K = np.array([[1266.4, 0.0, width / 2], [0.0, 1266.4, height / 2], [0.0, 0.0, 1.0]])
        calib = {}
        for ch in ("LIDAR_TOP", *CAMS):
            sensor = dict(token=tok(), channel=ch, modality="lidar" if ch == "LIDAR_TOP" else "camera")
            T["sensor"].append(sensor)
            if ch == "LIDAR_TOP":
                c = dict(token=tok(), sensor_token=sensor["token"], translation=[0.943713, 0.0, 1.84023],
                         rotation=list(Quaternion(axis=[0, 0, 1], angle=-np.pi / 2).elements), camera_intrinsic=[])
            else:
                yaw = np.deg2rad(CAMS[ch])
                R = Quaternion(axis=[0, 0, 1], angle=yaw).rotation_matrix @ np.array([[0, 0, 1], [-1, 0, 0], [0, -1, 0.0]])
                c = dict(token=tok(), sensor_token=sensor["token"], translation=[1.5 * np.cos(yaw), 0.5 * np.sin(yaw), 1.5],
                         rotation=list(Quaternion(matrix=R).elements), camera_intrinsic=K.tolist())
            T["calibrated_sensor"].append(c)
            calib[ch] = c["token"]
        # a few camera textures (smooth shading + grain, compressing like road scenes), shifted per frame
        yy, xx = np.mgrid[0:height, 0:width]
        textures = [np.clip(np.stack([110 + 60 * np.sin(xx / (60 + 9 * k) + k) + 30 * np.cos(yy / 45),
                                      120 + 50 * np.cos(xx / 80 - k) * np.sin(yy / (70 + k)),
                                      100 + 40 * np.sin((xx + yy) / 90 + k)], -1)
                            + rng.normal(0, 6, (height, width, 3)), 0, 255).astype(np.uint8) for k in range(4)]

        def ego(t: float) -> dict:
            return dict(translation=[400.0 + 5.0 * t, 1100.0 + 1.5 * t, 0.0],
                        rotation=list(Quaternion(axis=[0, 0, 1], angle=0.3 + 0.02 * t).elements))

        for si, name in enumerate(names):
            logfile = f"n015-2018-07-{11 + si:02d}-11-07-57+0800"
            log = dict(token=tok(), logfile=logfile, vehicle="n015", date_captured="2018-07-18", location="singapore-onenorth")
            T["log"].append(log)
            T["map"].append(dict(token=tok(), log_tokens=[log["token"]], category="semantic_prior",
                                 filename=f"maps/{si:032x}.png"))
            (tmp / "maps").mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((20, 20), 255, np.uint8)).save(tmp / T["map"][-1]["filename"])
            t0 = 1531883530_000000 + si * 100_000_000
            samples = [dict(token=tok(), timestamp=0, prev="", next="", scene_token="") for _ in range(keyframes)]
            scene = dict(token=tok(), log_token=log["token"], nbr_samples=keyframes, first_sample_token=samples[0]["token"],
                         last_sample_token=samples[-1]["token"], name=name, description="real-shape synthetic scene")
            T["scene"].append(scene)
            for ch, period, per_key in (("LIDAR_TOP", 50_000, 10), *((c, 83_333, 6) for c in CAMS)):
                rows = []
                for j in range(per_key * (keyframes - 1) + 1):
                    key = j % per_key == 0
                    ts = t0 + j * period + (0 if j == 0 else int(rng.integers(-3000, 3000)))
                    ki = -(-j // per_key)
                    pose = dict(token=tok(), timestamp=ts, **ego((ts - t0) * 1e-6))
                    T["ego_pose"].append(pose)
                    ext = "pcd.bin" if ch == "LIDAR_TOP" else "jpg"
                    fn = f"{'samples' if key else 'sweeps'}/{ch}/{logfile}__{ch}__{ts}.{ext}"
                    (tmp / fn).parent.mkdir(parents=True, exist_ok=True)
                    if ch == "LIDAR_TOP":
                        ang, r = rng.uniform(-np.pi, np.pi, points), rng.uniform(1.0, 70.0, points)
                        pts = np.stack([r * np.cos(ang), r * np.sin(ang), rng.uniform(-2, 2, points),
                                        rng.uniform(0, 255, points), rng.integers(0, 32, points)], 1).astype(np.float32)
                        pts.tofile(tmp / fn)
                    else:
                        img = np.roll(textures[j % len(textures)], 7 * j, axis=1)
                        Image.fromarray(img).save(tmp / fn, quality=90)
                    rows.append(dict(token=tok(), sample_token=samples[ki]["token"], ego_pose_token=pose["token"],
                                     calibrated_sensor_token=calib[ch], timestamp=ts, fileformat=ext.split(".")[0],
                                     is_key_frame=key, height=0 if ch == "LIDAR_TOP" else height,
                                     width=0 if ch == "LIDAR_TOP" else width, filename=fn, prev="", next=""))
                    if ch == "LIDAR_TOP" and key:
                        samples[ki]["timestamp"] = ts
                for a, b in zip(rows, rows[1:], strict=False):
                    a["next"], b["prev"] = b["token"], a["token"]
                T["sample_data"] += rows
            for a, b in zip(samples, samples[1:], strict=False):
                a["next"], b["prev"] = b["token"], a["token"]
            for smp in samples:
                smp["scene_token"] = scene["token"]
            T["sample"] += samples
            ego0 = np.asarray(ego(0.0)["translation"])
            for oi in range(36):  # ~ the per-keyframe annotation count of nuScenes (about 40 boxes)
                category, size, vel = NUSC_OBJECTS[oi % len(NUSC_OBJECTS)]
                ang, dist = 2 * np.pi * rng.random(), rng.uniform(5, 45)
                p0 = ego0 + np.array([dist * np.cos(ang), dist * np.sin(ang), size[2] / 2 - 1.0])
                inst = dict(token=tok(), category_token=cat[category], nbr_annotations=keyframes)
                anns = []
                for smp in samples:
                    t = (smp["timestamp"] - t0) * 1e-6
                    anns.append(dict(token=tok(), sample_token=smp["token"], instance_token=inst["token"],
                                     visibility_token="4", attribute_tokens=[],
                                     translation=list(p0 + np.array([vel[0], vel[1], 0.0]) * t), size=list(size),
                                     rotation=list(Quaternion(axis=[0, 0, 1], angle=ang).elements), prev="", next="",
                                     num_lidar_pts=int(rng.integers(1, 200)), num_radar_pts=int(rng.integers(0, 5))))
                for a, b in zip(anns, anns[1:], strict=False):
                    a["next"], b["prev"] = b["token"], a["token"]
                inst["first_annotation_token"], inst["last_annotation_token"] = anns[0]["token"], anns[-1]["token"]
                T["instance"].append(inst)
                T["sample_annotation"] += anns
        (tmp / "v1.0-mini").mkdir()
        for name, rows in T.items():
            (tmp / "v1.0-mini" / f"{name}.json").write_text(json.dumps(rows, default=float))

    return _atomic(out, write)


# ------------------------------------------------------------------------------------------------------ HumanML3D
def write_humanml3d(out: Path, motions: int | None = None) -> Path:
    """HumanML3D: new_joints/<id>.npy (T, 22, 3), new_joint_vecs/<id>.npy (T, 263), Mean.npy / Std.npy (263,),
    texts/<id>.txt (3 captions `caption#word/POS ...#start#end`), train/val/test.txt (80/5/15 as the release);
    T uniform in 40..196 frames at 20 fps (the release's range); ids as the release's six digits."""
    n = motions or SIZES["humanml3d"]["motions"]

    def write(tmp: Path):
        rng = np.random.default_rng(0)
        for d in ("new_joints", "new_joint_vecs", "texts"):
            (tmp / d).mkdir()
        ids = [f"{i:06d}" for i in range(n)]
        offsets = rng.normal(0, 0.3, (22, 3)).astype(np.float32)
        offsets[:, 1] = np.linspace(0.1, 1.7, 22)
        for cid in ids:
            T = int(rng.integers(40, 197))
            t = np.arange(T, dtype=np.float32)[:, None, None] / 20.0
            joints = offsets[None] + 0.1 * np.sin(2 * np.pi * t * rng.uniform(0.5, 2) + offsets[None])
            joints[..., 0] += 0.8 * t[..., 0]
            np.save(tmp / "new_joints" / f"{cid}.npy", joints.astype(np.float32))
            vecs = rng.normal(0, 1, (T, 263)).astype(np.float32)
            vecs[:, -4:] = rng.random((T, 4)) < 0.5
            np.save(tmp / "new_joint_vecs" / f"{cid}.npy", vecs)
            lines = []
            for c, a, b in (("a person walks forward.", 0.0, 0.0), ("someone walks ahead slowly.", 0.0, 0.0),
                            ("a man steps forward.", 0.0, T / 40.0)):
                pos = " ".join(f"{w}/{'VERB' if w.endswith('s') else 'NOUN'}" for w in c.rstrip(".").split())
                lines.append(f"{c}#{pos}#{a}#{b}")
            (tmp / "texts" / f"{cid}.txt").write_text("\n".join(lines) + "\n")
        np.save(tmp / "Mean.npy", np.zeros(263, np.float32))
        np.save(tmp / "Std.npy", np.ones(263, np.float32))
        a, b = int(0.8 * n), int(0.85 * n)
        for name, part in (("train", ids[:a]), ("val", ids[a:b]), ("test", ids[b:])):
            (tmp / f"{name}.txt").write_text("\n".join(part) + "\n")

    return _atomic(out, write)


# ---------------------------------------------------------------------------------------------------- RouterBench
ROUTERBENCH_MODELS = ("WizardLM/WizardLM-13B-V1.2", "claude-instant-v1", "claude-v1", "claude-v2", "gpt-3.5-turbo-1106",
                      "gpt-4-1106-preview", "meta/code-llama-instruct-34b-chat", "meta/llama-2-70b-chat",
                      "mistralai/mistral-7b-chat", "mistralai/mixtral-8x7b-chat", "zero-one-ai/Yi-34B-Chat")


def write_routerbench(out: Path, prompts: int | None = None) -> Path:
    """RouterBench's wide table `routerbench_0shot.pkl` (pandas pickle): sample_id, prompt, eval_name, per model
    `<model>` (quality in [0, 1]), `<model>|model_response`, `<model>|total_cost` (US dollars), and
    oracle_model_to_route_to; 36,497 prompts x 11 models."""
    n = prompts or SIZES["routerbench"]["prompts"]

    def write(tmp: Path):
        import pandas as pd

        rng = np.random.default_rng(0)
        evals = np.array(["mmlu-astronomy", "hellaswag", "gsm8k", "mbpp", "winogrande", "arc-challenge", "mt-bench"])
        words = np.array("the of a to in is what which how many given find answer question compute".split())
        cols: dict = {"sample_id": [f"s{i}" for i in range(n)],
                      "prompt": [" ".join(rng.choice(words, rng.integers(20, 160))) for _ in range(n)],
                      "eval_name": rng.choice(evals, n)}
        price = np.geomspace(2e-5, 3e-3, len(ROUTERBENCH_MODELS))
        quality = np.empty((n, len(ROUTERBENCH_MODELS)))
        for k, m in enumerate(ROUTERBENCH_MODELS):
            quality[:, k] = (rng.random(n) < 0.4 + 0.4 * k / len(ROUTERBENCH_MODELS)).astype(float)
            cols[m] = quality[:, k]
            cols[f"{m}|model_response"] = [" ".join(rng.choice(words, 12)) for _ in range(n)]
            cols[f"{m}|total_cost"] = price[k] * rng.uniform(0.5, 1.5, n)
        cols["oracle_model_to_route_to"] = np.asarray(ROUTERBENCH_MODELS)[quality.argmax(1)]
        pd.DataFrame(cols).to_pickle(tmp / "routerbench_0shot.pkl")

    return _atomic(out, write)


WRITERS = {"era5": write_era5, "era5_5625": write_era5_5625, "physionet": write_physionet, "d4rl": write_d4rl,
           "ogbench": write_ogbench, "nuscenes": write_nuscenes, "humanml3d": write_humanml3d, "routerbench": write_routerbench}


if __name__ == "__main__":
    import sys

    for key in sys.argv[1:] or WRITERS:
        t = time.perf_counter()
        p = WRITERS[key](ROOT / key)
        print(f"{key}: {p} {disk_bytes(p) / 1e6:.0f} MB ({time.perf_counter() - t:.0f} s)", flush=True)
