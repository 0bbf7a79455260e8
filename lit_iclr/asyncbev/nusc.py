"""Reader of the real nuScenes layout through `nuscenes-devkit`, with asynchronous sensor access.

`AsyncNuScenes(root, version)` opens `root/<version>/*.json` with the unmodified `NuScenes` class and answers, for a
keyframe: the LiDAR sweep a delay (seconds) before it accumulated with its own previous sweeps, the camera frames the
same delay before their keyframe frames, their projections, the ego-motion transform between the delayed sensor time t0
and the keyframe time t1, and the annotated boxes in the keyframe LiDAR frame.

Quirks of the published data and what the reader does with them:
- delays are seconds, matched on `sample_data.timestamp` (the record of the sensor's `prev` chain nearest to the
  requested time), never counted in chain steps: a chain may hold only keyframes (2 Hz) or drop frames;
- each `.pcd.bin` holds no-return points at the sensor origin and returns off the ego's roof: points with |x| and |y|
  below `min_distance` (1 m) in the sweep's own frame are dropped, as the devkit's `LidarPointCloud.remove_close` in
  `from_file_multisweep` does;
- all ten nuScenes detection classes are read (or the subset `classes` names; the others are counted and reported once);
- annotations carry `num_lidar_pts` and `num_radar_pts`, so training can drop boxes no sensor saw (mmdet3d's valid_flag);
- missing tables or files, truncated `.pcd.bin` files, unreadable JPEGs and inconsistent calibration raise one clear
  error naming the file.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lit_iclr.core.errors import ConfigError, DatasetFormatError, DatasetNotFoundError

from .geometry import apply, async_to_sync, record_transform

TABLES = ("category", "attribute", "visibility", "instance", "sensor", "calibrated_sensor", "ego_pose", "log", "scene",
          "sample", "sample_data", "sample_annotation", "map")
CAMERAS = ("CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT")
# the ten nuScenes detection classes (devkit names), in the order of mmdet3d's / CMT's `class_names`
DETECTION_CLASSES = ("car", "truck", "trailer", "bus", "construction_vehicle", "bicycle", "motorcycle", "pedestrian",
                     "traffic_cone", "barrier")
MIN_DISTANCE = 1.0  # m; the devkit's `from_file_multisweep(min_distance=1.0)`
PCD_COLUMNS = 5  # x, y, z, intensity, ring (float32)


def load_pcd_bin(path: str | Path) -> np.ndarray:
    """(N, 5) float32 points of a nuScenes `.pcd.bin`; missing or truncated files raise a clear error."""
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "LiDAR file listed in sample_data.json is missing",
                                   "copy the complete samples/ and sweeps/ folders of the release into the data root")
    raw = np.fromfile(path, dtype=np.float32)
    if raw.size == 0 or raw.size % PCD_COLUMNS:
        raise DatasetFormatError(path, f"holds {raw.size} float32 values, not a multiple of {PCD_COLUMNS} (truncated file?)",
                                 "re-extract this file from the nuScenes archive")
    pts = raw.reshape(-1, PCD_COLUMNS)
    if not np.isfinite(pts[:, :4]).all():
        raise DatasetFormatError(path, "contains NaN or inf coordinates", "re-extract this file from the nuScenes archive")
    return pts


def load_image(path: Path) -> np.ndarray:
    """(3, H, W) uint8 RGB of a camera JPEG, channels first as the model takes them; a missing, corrupt or truncated
    file raises one clear error naming it.

    Decoded by torchvision (libjpeg-turbo) straight into channels-first memory: PIL's decode, its RGB copy, the array
    export and the HWC -> CHW transpose took about twice as long for a 1600 x 900 frame (benchmarks/scale.py)."""
    from torchvision.io import ImageReadMode, decode_image, read_file

    if not path.exists():
        raise DatasetNotFoundError(path, "camera image listed in sample_data.json is missing",
                                   "copy the complete samples/ and sweeps/ folders of the release into the data root")
    try:
        return decode_image(read_file(str(path)), mode=ImageReadMode.RGB).numpy()
    except RuntimeError as e:  # torchvision: not an image / corrupt or truncated JPEG data
        problem = str(e).splitlines()[0].split(", ")[-1][:120]
        raise DatasetFormatError(path, f"is not a readable image ({problem})",
                                 "re-extract this file from the nuScenes archive (or re-download that camera's blob)") from e


class AsyncNuScenes:
    """nuScenes through the devkit, with the LiDAR/camera chains needed to build asynchronous inputs."""

    def __init__(self, root: str | Path, version: str = "v1.0-mini", classes: tuple[str, ...] | list[str] = DETECTION_CLASSES,
                 min_distance: float = MIN_DISTANCE):
        self.root = Path(root)
        unknown = [c for c in classes if c not in DETECTION_CLASSES]
        if unknown or not classes:
            raise ConfigError(f"classes must be nuScenes detection classes among {DETECTION_CLASSES}, got {list(classes)}")
        self.classes, self.min_distance = tuple(classes), float(min_distance)
        table_dir = self.root / version
        if not table_dir.is_dir():
            raise DatasetNotFoundError(table_dir, f"no nuScenes table folder for version {version!r}",
                                       "set data.init_args.root to the nuScenes folder holding v1.0-mini/ or "
                                       "v1.0-trainval/ and data.init_args.version to match")
        for t in TABLES:
            p = table_dir / f"{t}.json"
            if not p.exists():
                raise DatasetNotFoundError(p, f"nuScenes table {t!r} is missing",
                                           "extract the complete metadata archive of this version into the data root")
            try:
                json.loads(p.read_text()) if t in ("calibrated_sensor", "sensor", "map") else None
            except json.JSONDecodeError as e:
                raise DatasetFormatError(p, f"is not valid JSON ({e.msg} at line {e.lineno})",
                                         "re-extract the metadata archive") from e
        from nuscenes.nuscenes import NuScenes

        try:
            self.nusc = NuScenes(version=version, dataroot=str(self.root), verbose=False)
        except (json.JSONDecodeError, KeyError) as e:
            raise DatasetFormatError(table_dir, f"tables could not be indexed by nuscenes-devkit ({e!r})",
                                     "re-extract the metadata archive of this version") from e
        except AssertionError as e:  # the devkit asserts that every map mask of map.json exists
            if "map mask" not in str(e):
                raise
            raise DatasetNotFoundError(self.root / "maps", f"nuscenes-devkit: {e}",
                                       "extract the release's maps/ folder (part of the metadata archive) into the "
                                       "data root") from e
        self.version = version
        self._check_calibration(table_dir / "calibrated_sensor.json")

    def _check_calibration(self, path: Path) -> None:
        for cs in self.nusc.calibrated_sensor:
            sensor = self.nusc.get("sensor", cs["sensor_token"])
            q = np.asarray(cs["rotation"], dtype=float)
            if q.shape != (4,) or abs(np.linalg.norm(q) - 1) > 1e-3 or len(cs["translation"]) != 3:
                raise DatasetFormatError(path, f"record {cs['token']} ({sensor['channel']}) has no unit quaternion rotation "
                                         "and 3-vector translation", "restore calibrated_sensor.json from the release")
            if sensor["modality"] == "camera":
                K = np.asarray(cs["camera_intrinsic"], dtype=float)
                if K.shape != (3, 3) or K[0, 0] <= 0 or K[1, 1] <= 0 or K[2, 2] != 1:
                    raise DatasetFormatError(path, f"camera {sensor['channel']} (record {cs['token']}) has intrinsics "
                                             f"{cs['camera_intrinsic']!r}, not a 3x3 pinhole matrix",
                                             "restore calibrated_sensor.json from the release")

    # ---------------------------------------------------------------- samples and chains
    def split_samples(self, split: str) -> list[str]:
        """Sample tokens of the scenes of an official split (`mini_train`, `mini_val`, `train`, `val`)."""
        from nuscenes.utils.splits import create_splits_scenes

        names = set(create_splits_scenes()[split])
        scenes = {s["token"] for s in self.nusc.scene if s["name"] in names}
        return [s["token"] for s in self.nusc.sample if s["scene_token"] in scenes]

    def back(self, sd_token: str, steps: int) -> dict:
        """The sample_data record `steps` earlier on the same sensor (clamped at the first of the scene)."""
        sd = self.nusc.get("sample_data", sd_token)
        for _ in range(steps):
            if not sd["prev"]:
                break
            sd = self.nusc.get("sample_data", sd["prev"])
        return sd

    def at_delay(self, sd_token: str, delay: float) -> dict:
        """The record of the same sensor's chain whose timestamp is nearest to `delay` seconds before `sd_token`'s
        (clamped at the first of the scene). Timestamps decide, not chain steps: nuScenes chains run at each sensor's
        own, jittered rate, and a chain may hold only keyframes."""
        sd = best = self.nusc.get("sample_data", sd_token)
        target = sd["timestamp"] - delay * 1e6
        while sd["prev"] and sd["timestamp"] > target:
            sd = self.nusc.get("sample_data", sd["prev"])
            if abs(sd["timestamp"] - target) < abs(best["timestamp"] - target):
                best = sd
        return best

    def ignored_annotations(self) -> dict[str, int]:
        """Annotations per detection class left out by `classes` (from the instance table; nothing is read per sample)."""
        from nuscenes.eval.detection.utils import category_to_detection_name

        out: dict[str, int] = {}
        for inst in self.nusc.instance:
            name = category_to_detection_name(self.nusc.get("category", inst["category_token"])["name"])
            if name is not None and name not in self.classes:
                out[name] = out.get(name, 0) + int(inst["nbr_annotations"])
        return out

    def pose(self, sd: dict) -> np.ndarray:
        return record_transform(self.nusc.get("ego_pose", sd["ego_pose_token"]))

    def calib(self, sd: dict) -> dict:
        return self.nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])

    # ---------------------------------------------------------------- LiDAR
    def lidar_points(self, sd: dict, num_sweeps: int) -> np.ndarray:
        """(N, 5) x, y, z, intensity / 255, time lag (s) of `sd` and its `num_sweeps - 1` previous sweeps, in `sd`'s
        LiDAR frame (the standard nuScenes multi-sweep input: older sweeps moved with their ego poses). As the devkit's
        `from_file_multisweep`, each sweep first loses its points within `min_distance` of its sensor in x and y
        (no-return points at the origin and the ego's own roof), the rule of the devkit's `remove_close`."""
        l2e = record_transform(self.calib(sd))
        ref_from_global = np.linalg.inv(self.pose(sd) @ l2e)
        sweeps, cur = [], sd
        for _ in range(num_sweeps):
            pts = load_pcd_bin(self.root / cur["filename"])
            r = self.min_distance  # the devkit's `remove_close(radius)`: a square in the sweep's own x-y
            pts = pts[~((np.abs(pts[:, 0]) < r) & (np.abs(pts[:, 1]) < r))]
            T = ref_from_global @ self.pose(cur) @ record_transform(self.calib(cur))
            sweeps.append((pts, T, (sd["timestamp"] - cur["timestamp"]) * 1e-6))
            if not cur["prev"]:
                break
            cur = self.nusc.get("sample_data", cur["prev"])
        # written in place, in float32 (the sweep-to-keyframe transforms are metres: float32 keeps them to about 1e-5 m):
        # float64 products, per-sweep concatenations and a final cast cost more than reading the ten files
        out = np.empty((sum(len(p) for p, _, _ in sweeps), 5), np.float32)
        o = 0
        for pts, T, lag in sweeps:
            rows = out[o:o + len(pts)]
            np.matmul(pts[:, :3], T[:3, :3].T.astype(np.float32), out=rows[:, :3])
            rows[:, :3] += T[:3, 3].astype(np.float32)
            np.multiply(pts[:, 3], np.float32(1 / 255.0), out=rows[:, 3])
            rows[:, 4] = lag
            o += len(pts)
        return out

    # ---------------------------------------------------------------- cameras
    def camera_frames(self, sample: dict, delay: float, ref_lidar2global: np.ndarray):
        """Images (6, 3, H, W) uint8 of each camera's frame nearest to `delay` seconds before its keyframe frame and
        their (6, 3, 4) projections from the reference LiDAR frame (given by `ref_lidar2global`) to pixels, through each
        frame's own ego pose."""
        images, projs = [], []
        for ch in CAMERAS:
            sd = self.at_delay(sample["data"][ch], delay)
            path = self.root / sd["filename"]
            img = load_image(path)
            if sd["height"] and img.shape[1:] != (sd["height"], sd["width"]):
                raise DatasetFormatError(path, f"is {img.shape[2]}x{img.shape[1]} but sample_data.json says "
                                         f"{sd['width']}x{sd['height']}", "re-extract the image or the metadata")
            cs = self.calib(sd)
            cam2global = self.pose(sd) @ record_transform(cs)
            K = np.asarray(cs["camera_intrinsic"], dtype=float)
            projs.append(K @ (np.linalg.inv(cam2global) @ ref_lidar2global)[:3])
            images.append(img)
        shapes = {im.shape for im in images}
        if len(shapes) != 1:
            raise DatasetFormatError(self.root / sample["token"], f"camera images of one sample differ in size: {shapes}",
                                     "use the release's images (all six cameras share one resolution)")
        return np.stack(images), np.stack(projs).astype(np.float32)

    # ---------------------------------------------------------------- one asynchronous sample
    def async_sample(self, sample_token: str, lidar_delay: float, camera_delay: float, num_sweeps: int) -> dict:
        """Inputs of one keyframe with the LiDAR `lidar_delay` seconds and the cameras `camera_delay` seconds old (each
        the nearest recorded frame; `dt` is what the timestamps give).

        The delayed modality is expressed in its own sensor frame at t0 (`*_from`), the other at t1; `emc` is the
        3x3 BEV affine mapping a cell of the keyframe LiDAR frame (t1) to the delayed frame (t0), and `dt` = t1 - t0.
        """
        sample = self.nusc.get("sample", sample_token)
        key = self.nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
        l2e = record_transform(self.calib(key))
        e2g_1 = self.pose(key)
        lidar_sd = self.at_delay(key["token"], lidar_delay)
        points = self.lidar_points(lidar_sd, num_sweeps)
        cam_key = self.at_delay(sample["data"]["CAM_FRONT"], camera_delay)
        cam_late = cam_key["token"] != sample["data"]["CAM_FRONT"]
        # the delayed camera's frame: the LiDAR frame at the front camera's time (calibration plus that frame's ego pose)
        cam_ref = self.pose(cam_key) @ l2e if cam_late else e2g_1 @ l2e
        images, projs = self.camera_frames(sample, camera_delay, cam_ref)
        if lidar_sd["token"] != key["token"]:
            t0_sd, e2g_0 = lidar_sd, self.pose(lidar_sd)
        else:
            t0_sd, e2g_0 = (cam_key, self.pose(cam_key)) if cam_late else (key, e2g_1)
        T = async_to_sync(l2e, e2g_0, e2g_1)  # t0 frame -> t1 frame
        sync_to_async = np.linalg.inv(T)
        emc = np.eye(3)
        emc[:2, :2], emc[:2, 2] = sync_to_async[:2, :2], sync_to_async[:2, 3]
        return dict(points=points, images=images, lidar2img=projs, emc=emc.astype(np.float32),
                    dt=np.float32((key["timestamp"] - t0_sd["timestamp"]) * 1e-6), lidar2global=(e2g_1 @ l2e))

    def boxes(self, sample_token: str) -> dict:
        """Annotated boxes of a keyframe in its LiDAR frame: center (M, 3), size wlh (M, 3), yaw (M,), velocity (M, 2),
        class index (M,) into `classes` (annotations of other classes left out; `ignored_annotations` counts them),
        num_lidar_pts (M,), num_radar_pts (M,)."""
        from nuscenes.eval.detection.utils import category_to_detection_name
        from pyquaternion import Quaternion

        sample = self.nusc.get("sample", sample_token)
        key = self.nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
        g2l = np.linalg.inv(self.pose(key) @ record_transform(self.calib(key)))
        rows = []
        for tok in sample["anns"]:
            a = self.nusc.get("sample_annotation", tok)
            name = category_to_detection_name(a["category_name"])
            if name not in self.classes:
                continue
            center = apply(g2l, np.asarray(a["translation"], dtype=float))
            R = g2l[:3, :3] @ Quaternion(a["rotation"]).rotation_matrix
            vel = np.nan_to_num(self.nusc.box_velocity(tok))
            v = g2l[:3, :3] @ vel
            rows.append([*center, *a["size"], np.arctan2(R[1, 0], R[0, 0]), v[0], v[1], self.classes.index(name),
                         a["num_lidar_pts"], a["num_radar_pts"]])
        arr = np.asarray(rows, dtype=np.float64).reshape(-1, 12)
        return dict(center=arr[:, :3].astype(np.float32), size=arr[:, 3:6].astype(np.float32), yaw=arr[:, 6].astype(np.float32),
                    velocity=arr[:, 7:9].astype(np.float32), label=arr[:, 9].astype(np.int64),
                    num_lidar_pts=arr[:, 10].astype(np.int64), num_radar_pts=arr[:, 11].astype(np.int64))
