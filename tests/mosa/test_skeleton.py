"""The procedural motions: rigid bones, feet on the floor, no sliding in contact; the renderer's camera and tracks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_iclr.mosa.maps import project as project_torch
from lit_iclr.mosa.metrics import foot_penetration, foot_skating, unproject
from lit_iclr.mosa.render import extrinsics, intrinsics, project, render_clip
from lit_iclr.mosa.skeleton import ACTIONS, BONE_LENGTHS, BONES, FOOT_JOINTS, foot_contacts, sample_motion


@pytest.mark.parametrize("action", ACTIONS)
def test_motion_is_rigid_grounded_and_captioned(action):
    joints, caption, act, _ = sample_motion(np.random.default_rng(3), 16, action=action)
    assert joints.shape == (16, 22, 3) and act == action and len(caption.split()) >= 2
    lengths = np.linalg.norm(joints[:, [c for _, c in BONES]] - joints[:, [p for p, _ in BONES]], axis=-1)
    np.testing.assert_allclose(lengths, np.broadcast_to(BONE_LENGTHS, lengths.shape), atol=1e-5)  # rigid bones
    feet_y = joints[:, FOOT_JOINTS, 1]
    assert feet_y.min() > -1e-5  # no penetration
    if action != "jump":
        np.testing.assert_allclose(feet_y.min(1), 0, atol=1e-5)  # some foot on the floor every frame


def test_locomotion_is_foot_locked_and_goes_where_the_caption_says():
    rng = np.random.default_rng(0)
    for _ in range(6):
        joints, caption, _, style = sample_motion(rng, 16, action="walk")
        step = np.linalg.norm(np.diff(joints[:, FOOT_JOINTS][..., [0, 2]], axis=0), axis=-1)
        contact = foot_contacts(joints)[:-1]
        assert step[contact].mean() < 0.01  # < 1 cm per frame while in contact (foot locking)
        d = joints[-1, 0] - joints[0, 0]
        want = {"to the right": (0, 1), "to the left": (0, -1), "toward the camera": (2, 1), "away from the camera": (2, -1)}
        axis, sign = want[style["direction"]]
        assert style["direction"] in caption and np.sign(d[axis]) == sign and abs(d[axis]) > 0.1


def test_metrics_of_feet_match_brute_force():
    rng = np.random.default_rng(1)
    j = torch.tensor(rng.normal(0, 0.05, (2, 5, 22, 3)))
    pen = np.mean([max(0.0, -float(j[b, t, f, 1])) for b in range(2) for t in range(5) for f in FOOT_JOINTS]) * 100
    steps = [float(torch.linalg.norm(j[b, t + 1, f, [0, 2]] - j[b, t, f, [0, 2]])) for b in range(2) for t in range(4)
             for f in FOOT_JOINTS if j[b, t + 1, f, 1] < 0.05 and j[b, t, f, 1] < 0.05]
    assert float(foot_penetration(j)) == pytest.approx(pen)
    assert float(foot_skating(j)) == pytest.approx(np.mean(steps) * 100)


def test_projection_numpy_torch_and_unprojection_agree():
    rng = np.random.default_rng(2)
    pts = rng.normal(0, 0.5, (4, 22, 3)) + [0, 1, 0]
    centres = np.stack([rng.uniform(-1, 1, 4), np.full(4, 1.0), np.full(4, 5.0)], -1)
    K, E = intrinsics(32), extrinsics(centres)
    uv, z = project(pts, K, E)
    # pinhole by hand: camera looks down -z from c, so depth = c_z - z and u = cx + f (x - c_x) / depth
    depth = centres[:, None, 2] - pts[..., 2]
    np.testing.assert_allclose(z, depth, rtol=1e-6)
    np.testing.assert_allclose(uv[..., 0], 16 + 64 * (pts[..., 0] - centres[:, None, 0]) / depth, atol=1e-4)
    np.testing.assert_allclose(uv[..., 1], 16 - 64 * (pts[..., 1] - 1.0) / depth, atol=1e-4)
    Kt, Et = torch.tensor(K)[None], torch.tensor(E)[None]
    uvt, zt = project_torch(torch.tensor(pts, dtype=torch.float32)[None], Kt, Et)
    np.testing.assert_allclose(uvt[0].numpy(), uv, atol=1e-3)
    back = unproject(uvt, zt, Kt, Et)[0].numpy()
    np.testing.assert_allclose(back, pts, atol=1e-4)


def test_rendered_tracks_keep_their_colour():
    """A visible track point shows the same surface colour in every frame (texture is attached to the bones)."""
    joints, *_ = sample_motion(np.random.default_rng(4), 16, action="walk")
    clip = render_clip(joints[::2], np.random.default_rng(5), 64, 10.0)
    video, tracks, vis = clip["video"].astype(float), clip["tracks"], clip["track_visible"]
    px = np.floor(tracks).astype(int).clip(0, 63)
    col = video[np.arange(8)[None], px[..., 1], px[..., 0]]  # (N, T, 3), nearest pixel
    both = vis.T[:, 1:] & vis.T[:, :-1]
    along = np.abs(col[:, 1:] - col[:, :-1]).mean(-1)[both]
    rng = np.random.default_rng(0)  # against random pixel pairs of consecutive frames
    rand = np.abs(video[1:, rng.integers(0, 64, 500), rng.integers(0, 64, 500)] - video[:-1, rng.integers(0, 64, 500),
                                                                                        rng.integers(0, 64, 500)]).mean()
    assert both.mean() > 0.2 and np.median(along) < 0.2 * rand


def test_plain_scene_is_a_still_camera_on_a_grey_backdrop_with_the_same_motion_stream():
    """`plain` keeps the room's random draws (same motion, same pixels where the body is) but fixes the camera and look."""
    from lit_iclr.mosa.render import CAM_DIST, CAM_HEIGHT, PLAIN_BACKGROUND

    joints, *_ = sample_motion(np.random.default_rng(4), 16, action="walk")
    room = render_clip(joints[::2], np.random.default_rng(5), 32, 10.0, "room")
    plain = render_clip(joints[::2], np.random.default_rng(5), 32, 10.0, "plain")
    centre = -np.einsum("tji,tj->ti", plain["extrinsics"][..., :3], plain["extrinsics"][..., 3])  # c = -R^T t
    np.testing.assert_allclose(centre, np.broadcast_to([0, CAM_HEIGHT, CAM_DIST], centre.shape), atol=1e-5)
    assert not np.allclose(room["extrinsics"], plain["extrinsics"])  # the room camera follows and drifts
    # background pixels: the body's z-buffer is independent of the look, so background = pixels far from every joint
    uv = plain["keypoints2d"]
    ys, xs = np.mgrid[0:32, 0:32] + 0.5
    far = (np.hypot(xs[None, :, :, None] - uv[:, None, None, :, 0], ys[None, :, :, None] - uv[:, None, None, :, 1])
           .min(-1) > 5)
    assert far.mean() > 0.5
    np.testing.assert_array_equal(plain["video"][far], round(PLAIN_BACKGROUND * 255))


def test_generator_rejects_unknown_actions_and_draws_only_the_chosen_ones(tmp_path):
    from lit_iclr.core import ConfigError
    from lit_iclr.mosa.data import generate

    with pytest.raises(ConfigError, match="actions"):
        generate(tmp_path / "bad", 4, 4, 16, 0, actions=("walk", "fly"))
    generate(tmp_path / "ok", 6, 4, 16, 0, actions=("jump", "wave"), scene="plain")
    drawn = {str(np.load(p)["action"]) for p in (tmp_path / "ok" / "videos").glob("*.npz")}
    assert drawn and drawn <= {"jump", "wave"}
