"""Reader of the real nuScenes layout through `nuscenes-devkit`, with asynchronous sensor access.

`AsyncNuScenes(root, version)` opens `root/<version>/*.json` with the unmodified `NuScenes` class and answers, for a
keyframe: the LiDAR sweep `d` sweeps before it (20 Hz chain of `sample_data.prev`) accumulated with its own previous
sweeps, the camera frames `d` frames before it (12 Hz chains), their projections, the ego-motion transform between
the delayed sensor time t0 and the keyframe time t1, and the annotated boxes in the keyframe LiDAR frame.
Missing tables or files, truncated `.pcd.bin` files and inconsistent calibration raise one clear error naming the file.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError

from .geometry import apply, async_to_sync, record_transform

TABLES = ("category", "attribute", "visibility", "instance", "sensor", "calibrated_sensor", "ego_pose", "log", "scene",
          "sample", "sample_data", "sample_annotation", "map")
CAMERAS = ("CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT")
# nuScenes detection classes this detector predicts (devkit names); others are ignored
DETECTION_CLASSES = ("car", "truck", "pedestrian", "bicycle")
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


class AsyncNuScenes:
    """nuScenes through the devkit, with the LiDAR/camera chains needed to build asynchronous inputs."""

    def __init__(self, root: str | Path, version: str = "v1.0-mini"):
        self.root = Path(root)
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

    def pose(self, sd: dict) -> np.ndarray:
        return record_transform(self.nusc.get("ego_pose", sd["ego_pose_token"]))

    def calib(self, sd: dict) -> dict:
        return self.nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])

    # ---------------------------------------------------------------- LiDAR
    def lidar_points(self, sd: dict, num_sweeps: int) -> np.ndarray:
        """(N, 5) x, y, z, intensity / 255, time lag (s) of `sd` and its `num_sweeps - 1` previous sweeps, in `sd`'s
        LiDAR frame (the standard nuScenes multi-sweep input: older sweeps moved with their ego poses)."""
        l2e = record_transform(self.calib(sd))
        ref_from_global = np.linalg.inv(self.pose(sd) @ l2e)
        out, cur = [], sd
        for _ in range(num_sweeps):
            pts = load_pcd_bin(self.root / cur["filename"])
            T = ref_from_global @ self.pose(cur) @ record_transform(self.calib(cur))
            lag = (sd["timestamp"] - cur["timestamp"]) * 1e-6
            out.append(np.concatenate([apply(T, pts[:, :3]), pts[:, 3:4] / 255.0, np.full((len(pts), 1), lag)], 1))
            if not cur["prev"]:
                break
            cur = self.nusc.get("sample_data", cur["prev"])
        return np.concatenate(out).astype(np.float32)

    # ---------------------------------------------------------------- cameras
    def camera_frames(self, sample: dict, delay: int, ref_lidar2global: np.ndarray):
        """Images (6, H, W, 3) uint8 `delay` frames before the keyframe and their (6, 3, 4) projections from the
        reference LiDAR frame (given by `ref_lidar2global`) to pixels, through each frame's own ego pose."""
        images, projs = [], []
        for ch in CAMERAS:
            sd = self.back(sample["data"][ch], delay)
            path = self.root / sd["filename"]
            if not path.exists():
                raise DatasetNotFoundError(path, "camera image listed in sample_data.json is missing",
                                           "copy the complete samples/ and sweeps/ folders of the release into the data root")
            img = np.asarray(Image.open(path).convert("RGB"))
            if sd["height"] and img.shape[:2] != (sd["height"], sd["width"]):
                raise DatasetFormatError(path, f"is {img.shape[1]}x{img.shape[0]} but sample_data.json says "
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
    def async_sample(self, sample_token: str, lidar_delay: int, camera_delay: int, num_sweeps: int) -> dict:
        """Inputs of one keyframe with the LiDAR `lidar_delay` sweeps and the cameras `camera_delay` frames old.

        The delayed modality is expressed in its own sensor frame at t0 (`*_from`), the other at t1; `emc` is the
        3x3 BEV affine mapping a cell of the keyframe LiDAR frame (t1) to the delayed frame (t0), and `dt` = t1 - t0.
        """
        sample = self.nusc.get("sample", sample_token)
        key = self.nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
        l2e = record_transform(self.calib(key))
        e2g_1 = self.pose(key)
        lidar_sd = self.back(key["token"], lidar_delay)
        points = self.lidar_points(lidar_sd, num_sweeps)
        cam_key = self.back(sample["data"]["CAM_FRONT"], camera_delay)
        # the delayed camera's frame: the LiDAR frame at the front camera's time (calibration plus that frame's ego pose)
        cam_ref = self.pose(cam_key) @ l2e if camera_delay > 0 else e2g_1 @ l2e
        images, projs = self.camera_frames(sample, camera_delay, cam_ref)
        if lidar_delay > 0:
            t0_sd, e2g_0 = lidar_sd, self.pose(lidar_sd)
        else:
            t0_sd, e2g_0 = (cam_key, self.pose(cam_key)) if camera_delay > 0 else (key, e2g_1)
        T = async_to_sync(l2e, e2g_0, e2g_1)  # t0 frame -> t1 frame
        sync_to_async = np.linalg.inv(T)
        emc = np.eye(3)
        emc[:2, :2], emc[:2, 2] = sync_to_async[:2, :2], sync_to_async[:2, 3]
        return dict(points=points, images=images, lidar2img=projs, emc=emc.astype(np.float32),
                    dt=np.float32((key["timestamp"] - t0_sd["timestamp"]) * 1e-6), lidar2global=(e2g_1 @ l2e))

    def boxes(self, sample_token: str) -> dict:
        """Annotated boxes of a keyframe in its LiDAR frame: center (M, 3), size wlh (M, 3), yaw (M,), velocity (M, 2),
        class index (M,) into DETECTION_CLASSES (others dropped), num_lidar_pts (M,)."""
        from nuscenes.eval.detection.utils import category_to_detection_name
        from pyquaternion import Quaternion

        sample = self.nusc.get("sample", sample_token)
        key = self.nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
        g2l = np.linalg.inv(self.pose(key) @ record_transform(self.calib(key)))
        rows = []
        for tok in sample["anns"]:
            a = self.nusc.get("sample_annotation", tok)
            name = category_to_detection_name(a["category_name"])
            if name not in DETECTION_CLASSES:
                continue
            center = apply(g2l, np.asarray(a["translation"], dtype=float))
            R = g2l[:3, :3] @ Quaternion(a["rotation"]).rotation_matrix
            vel = np.nan_to_num(self.nusc.box_velocity(tok))
            v = g2l[:3, :3] @ vel
            rows.append([*center, *a["size"], np.arctan2(R[1, 0], R[0, 0]), v[0], v[1], DETECTION_CLASSES.index(name),
                         a["num_lidar_pts"]])
        arr = np.asarray(rows, dtype=np.float32).reshape(-1, 11)
        return dict(center=arr[:, :3], size=arr[:, 3:6], yaw=arr[:, 6], velocity=arr[:, 7:9], label=arr[:, 9].astype(np.int64),
                    num_lidar_pts=arr[:, 10].astype(np.int64))
