"""Camera, renderer and dense tracks of the default data: a textured body of limb volumes over a scrolling scene.

Each of the 21 bones is a capsule (radius in metres, `RADII`) coloured by its clothing group with stripes attached to the
bone, so a surface point keeps its colour while the body moves; a z-buffer resolves which bone a pixel shows. The camera
follows the subject (pan and dolly) and adds its own drift, which moves the ground checkerboard and the back wall.
Tracks are points at fixed bone coordinates (s along the bone, u across its silhouette): their pixel positions per frame
are exact and their visibility is the z-buffer's answer.
"""
from __future__ import annotations

import numpy as np

from .skeleton import BONES

# capsule radius (m) per bone (child joint order 1..21) and its clothing group: 0 trousers, 1 shirt, 2 skin, 3 shoes
RADII = np.array([0.09, 0.09, 0.14, 0.08, 0.08, 0.15, 0.06, 0.06, 0.15, 0.05, 0.05, 0.07, 0.09, 0.09, 0.12, 0.07, 0.07,
                  0.055, 0.055, 0.045, 0.045])
GROUP = np.array([0, 0, 1, 0, 0, 1, 3, 3, 1, 3, 3, 2, 1, 1, 2, 1, 1, 1, 1, 2, 2])
FOCAL, CAM_HEIGHT, CAM_DIST = 2.0, 1.0, 5.0  # focal length in image widths; camera height and distance (m)
TRACK_S = np.array([0.2, 0.5, 0.8])
TRACK_U = np.array([-0.5, 0.0, 0.5])


def camera_path(root: np.ndarray, rng: np.random.Generator, fps: float) -> np.ndarray:
    """(T, 3) camera centres: follow the root (pan x, dolly z) by a random fraction, plus a random drift."""
    T = len(root)
    t = np.arange(T) / fps
    follow = rng.uniform(0.6, 0.95)
    c = np.zeros((T, 3))
    c[:, 0] = follow * root[:, 0] + rng.uniform(-0.2, 0.2) + rng.uniform(-0.4, 0.4) * t
    c[:, 1] = CAM_HEIGHT
    c[:, 2] = CAM_DIST + follow * root[:, 2]
    return c


def intrinsics(size: int) -> np.ndarray:
    f = FOCAL * size
    return np.array([[f, 0, size / 2], [0, f, size / 2], [0, 0, 1]], dtype=np.float32)


def extrinsics(centres: np.ndarray) -> np.ndarray:
    """(T, 3, 4) world-to-camera [R | -R c] of a camera looking down -z with y up (R = diag(1, -1, -1))."""
    R = np.diag([1.0, -1.0, -1.0])
    return np.concatenate([np.broadcast_to(R, (len(centres), 3, 3)), (-(R @ centres[..., None]))], -1).astype(np.float32)


def project(points: np.ndarray, K: np.ndarray, E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates (T, N, 2) and depths (T, N) of world points (T, N, 3) under per-frame cameras E (T, 3, 4)."""
    cam = np.einsum("tij,tnj->tni", E[..., :3], points) + E[:, None, :, 3]
    z = cam[..., 2]
    uv = np.einsum("ij,tnj->tni", K[:2, :2], cam[..., :2] / z[..., None]) + K[:2, 2]
    return uv, z


def bone_geometry(uv: np.ndarray, z: np.ndarray, K: np.ndarray):
    """Per frame and bone: endpoints a, b (T, 21, 2), endpoint depths (T, 21, 2) and pixel radii (T, 21)."""
    par = np.array([p for p, _ in BONES])
    chi = np.array([c for _, c in BONES])
    a, b = uv[:, par], uv[:, chi]
    za, zb = z[:, par], z[:, chi]
    r = K[0, 0] * RADII / (0.5 * (za + zb))
    return a, b, np.stack([za, zb], -1), r


def rasterize(uv: np.ndarray, z: np.ndarray, K: np.ndarray, size: int):
    """Z-buffered capsules: bone id (T, H, W; -1 background), s along the bone, u across it (T, H, W)."""
    a, b, zab, r = bone_geometry(uv, z, K)
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    p = np.stack([xs, ys], -1)[None, :, :, None]  # (1, H, W, 1, 2)
    ab = (b - a)[:, None, None]  # (T, 1, 1, B, 2)
    ap = p - a[:, None, None]
    s = np.clip((ap * ab).sum(-1) / np.maximum((ab**2).sum(-1), 1e-6), 0, 1)  # (T, H, W, B)
    off = ap - s[..., None] * ab
    d = np.linalg.norm(off, axis=-1)
    cross = (ab[..., 0] * ap[..., 1] - ab[..., 1] * ap[..., 0]) / np.maximum(np.linalg.norm(ab, axis=-1), 1e-6)
    rr = r[:, None, None]
    depth = zab[:, None, None, :, 0] + s * (zab[:, None, None, :, 1] - zab[:, None, None, :, 0])
    depth = np.where(d < rr, depth, np.inf)
    bone = depth.argmin(-1)
    hit = np.isfinite(depth.min(-1))
    take = lambda x: np.take_along_axis(x, bone[..., None], -1)[..., 0]  # noqa: E731
    u = np.clip(take(cross) / np.maximum(take(np.broadcast_to(rr, d.shape)), 1e-6), -1, 1)
    return np.where(hit, bone, -1), take(s), u


def body_colour(bone: np.ndarray, s: np.ndarray, u: np.ndarray, palette: np.ndarray, stripes: float) -> np.ndarray:
    """Colour of a surface point from its bone coordinates: group colour x stripes along the bone x cylinder shading."""
    col = palette[GROUP[np.maximum(bone, 0)]]
    tex = 0.8 + 0.2 * np.sign(np.sin(2 * np.pi * stripes * s + 0.3))
    shade = 1.0 - 0.35 * u**2
    return col * (tex * shade)[..., None]


def scene(centres: np.ndarray, K: np.ndarray, size: int, look: dict) -> np.ndarray:
    """(T, H, W, 3) background: a back wall with vertical stripes and a checkered floor, both seen by the moving camera."""
    ys, xs = np.mgrid[0:size, 0:size] + 0.5
    f, cx, cy = K[0, 0], K[0, 2], K[1, 2]
    out = np.zeros((len(centres), size, size, 3))
    for_floor = ys > cy + 0.5
    zf = np.where(for_floor, f * CAM_HEIGHT / np.maximum(ys - cy, 1e-3), 1.0)  # floor depth of each row below the horizon
    for i, c in enumerate(centres):  # per frame: a dozen frames, each fully vectorised over pixels
        wall_x = (xs - cx) * look["wall_dist"] / f + c[0]
        stripes = 0.5 + 0.5 * np.sin(2 * np.pi * wall_x / look["wall_period"])
        wall = look["wall"][0] + (look["wall"][1] - look["wall"][0]) * stripes[..., None]
        fx = (xs - cx) * zf / f + c[0]
        fz = c[2] - zf
        check = (np.floor(fx / look["tile"]) + np.floor(fz / look["tile"])) % 2
        floor = look["floor"][0] + (look["floor"][1] - look["floor"][0]) * check[..., None]
        out[i] = np.where(for_floor[..., None], floor, wall)
    return out


def random_look(rng: np.random.Generator) -> dict:
    return {"palette": rng.uniform(0.05, 0.95, (4, 3)) * np.array([1, 1, 1]), "stripes": rng.uniform(2, 4),
            "wall": rng.uniform(0.3, 0.9, (2, 3)), "wall_period": rng.uniform(0.8, 2.0), "wall_dist": rng.uniform(8, 12),
            "floor": rng.uniform(0.1, 0.6, (2, 3)), "tile": rng.uniform(0.8, 1.4)}


def track_points(joints: np.ndarray, uv: np.ndarray, z: np.ndarray, K: np.ndarray, bone_map: np.ndarray):
    """Dense tracks (N, T, 2) at fixed bone coordinates (bone, s, u) and their visibility (T, N) under the z-buffer."""
    a, b, _, r = bone_geometry(uv, z, K)
    nb = a.shape[1]
    bi, si, ui = np.meshgrid(np.arange(nb), TRACK_S, TRACK_U, indexing="ij")
    bi, si, ui = bi.ravel(), si.ravel(), ui.ravel()
    ab = b[:, bi] - a[:, bi]
    normal = np.stack([-ab[..., 1], ab[..., 0]], -1) / np.maximum(np.linalg.norm(ab, axis=-1, keepdims=True), 1e-6)
    pts = a[:, bi] + si[:, None] * ab + (ui * r[:, bi])[..., None] * normal  # (T, N, 2)
    size = bone_map.shape[-1]
    px = np.clip(np.floor(pts).astype(int), 0, size - 1)
    inside = (pts >= 0).all(-1) & (pts < size).all(-1)
    shown = bone_map[np.arange(len(pts))[:, None], px[..., 1], px[..., 0]]
    return pts.transpose(1, 0, 2).astype(np.float32), inside & (shown == bi[None]), (bi, si, ui)


# `plain` scene: fixed clothing (trousers, shirt, skin, shoes) on a flat grey backdrop under a still camera
PLAIN_PALETTE = np.array([[0.15, 0.2, 0.6], [0.85, 0.2, 0.15], [0.9, 0.7, 0.55], [0.1, 0.1, 0.1]])
PLAIN_BACKGROUND = 0.8


def render_clip(joints: np.ndarray, rng: np.random.Generator, size: int, fps: float, style: str = "room") -> dict:
    """Video (T, H, W, 3) uint8 of a motion (T, 22, 3) with camera, exact 2-D/3-D joints, tracks and visibility.

    style `room`: random clothing, wall and floor under a following, drifting camera; `plain`: the fixed look above and a
    camera standing still at the origin (the random draws are made either way, so both styles share the motion stream)."""
    look = random_look(rng)
    centres = camera_path(joints[:, 0], rng, fps)
    if style == "plain":
        look = {**look, "palette": PLAIN_PALETTE, "stripes": 3.0}
        centres = np.broadcast_to(np.array([0.0, CAM_HEIGHT, CAM_DIST]), centres.shape).copy()
    K, E = intrinsics(size), extrinsics(centres)
    uv, z = project(joints.astype(np.float64), K, E)
    bone, s, u = rasterize(uv, z, K, size)
    body = body_colour(bone, s, u, look["palette"], look["stripes"])
    back = np.full((len(centres), size, size, 3), PLAIN_BACKGROUND) if style == "plain" else scene(centres, K, size, look)
    frames = np.where((bone >= 0)[..., None], body, back)
    tracks, visible, _ = track_points(joints, uv, z, K, bone)
    return {"video": np.clip(frames * 255 + 0.5, 0, 255).astype(np.uint8), "keypoints2d": uv.astype(np.float32),
            "depth": z.astype(np.float32), "K": K, "extrinsics": E, "tracks": tracks, "track_visible": visible}
