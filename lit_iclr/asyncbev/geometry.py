"""Rigid transforms shared by the generator, the reader and the model (numpy, nuScenes conventions).

nuScenes stores rotations as quaternions (w, x, y, z) and translations in metres; a sensor's `calibrated_sensor` maps
sensor -> ego, an `ego_pose` maps ego -> global. Cameras look along +z with +x right and +y down.
"""
from __future__ import annotations

import numpy as np
from pyquaternion import Quaternion

# camera axes (x right, y down, z forward) expressed in a frame with x forward, y left, z up
CAM_AXES = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])


def yaw_matrix(yaw: float) -> np.ndarray:
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def transform(rotation, translation) -> np.ndarray:
    """4x4 homogeneous matrix from a nuScenes quaternion (w, x, y, z) or 3x3 matrix and a translation."""
    r = np.asarray(rotation, dtype=float)
    T = np.eye(4)
    T[:3, :3] = Quaternion(r).rotation_matrix if r.shape == (4,) else r
    T[:3, 3] = translation
    return T


def record_transform(record: dict) -> np.ndarray:
    """4x4 of a `calibrated_sensor` (sensor -> ego) or `ego_pose` (ego -> global) record."""
    return transform(record["rotation"], record["translation"])


def quaternion(matrix: np.ndarray) -> list[float]:
    """(w, x, y, z) of a rotation matrix, as nuScenes writes it."""
    return [float(v) for v in Quaternion(matrix=np.asarray(matrix, dtype=float), atol=1e-6).elements]


def apply(T: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply a 4x4 transform to (..., 3) points."""
    return points @ T[:3, :3].T + T[:3, 3]


def async_to_sync(l2e: np.ndarray, e2g_async: np.ndarray, e2g_sync: np.ndarray) -> np.ndarray:
    """EMC: T_async->sync = (T_l2e)^-1 (T_e2g(t1))^-1 T_e2g(t0) T_l2e (sensor frame at t0 -> sensor frame at t1)."""
    return np.linalg.inv(l2e) @ np.linalg.inv(e2g_sync) @ e2g_async @ l2e
