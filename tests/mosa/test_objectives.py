"""The objectives against independent computations: loops, scipy interpolation, closed-form flows."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import ndimage

from lit_iclr.mosa.metrics import frechet_distance
from lit_iclr.mosa.objectives import (
    bone_lengths,
    contact_loss,
    euler_sample,
    interpolate,
    sample_points,
    tracking_loss,
    x0_from_velocity,
    x0_velocity,
)
from lit_iclr.mosa.skeleton import BONES, FOOT_JOINTS


def test_contact_loss_matches_loops():
    g = torch.Generator().manual_seed(0)
    j = torch.randn(2, 5, 22, 3, generator=g) * 0.1
    c = (torch.rand(2, 5, 4, generator=g) > 0.5).float()
    pen = np.mean([max(0.0, -float(j[b, t, f, 1])) for b in range(2) for t in range(5) for f in FOOT_JOINTS])
    num = den = 0.0
    for b in range(2):
        for t in range(4):
            for k, f in enumerate(FOOT_JOINTS):
                num += float(c[b, t, k]) * float(((j[b, t + 1, f] - j[b, t, f]) ** 2).sum())
                den += float(c[b, t, k])
    assert float(contact_loss(j, c)) == pytest.approx(pen + num / den, rel=1e-5)


def test_bone_lengths_match_loops():
    j = torch.randn(3, 22, 3)
    want = [[float(torch.linalg.norm(j[i, c] - j[i, p])) for p, c in BONES] for i in range(3)]
    np.testing.assert_allclose(bone_lengths(j).numpy(), want, rtol=1e-5)


def test_sample_points_is_bilinear_interpolation():
    g = torch.Generator().manual_seed(1)
    video = torch.rand(1, 2, 3, 8, 8, generator=g)
    pts = torch.rand(1, 5, 2, 2, generator=g) * 6 + 1  # pixel coordinates, pixel centres at i + 0.5
    got = sample_points(video, pts)  # (1, T, N, 3)
    for t in range(2):
        for n in range(5):
            x, y = (pts[0, n, t] - 0.5).tolist()
            want = [ndimage.map_coordinates(video[0, t, c].numpy(), [[y], [x]], order=1)[0] for c in range(3)]
            np.testing.assert_allclose(got[0, t, n].numpy(), want, atol=1e-5)


def test_tracking_loss_zero_for_motion_along_tracks_and_positive_otherwise():
    # a video whose pattern translates by one pixel a frame, tracked by points moving the same way
    H = 16
    xs = torch.arange(H).float()
    pattern = torch.sin(xs / 2)[None, :].expand(H, H)
    frames = torch.stack([torch.roll(pattern, t, dims=1) for t in range(4)])  # (T, H, W)
    video = frames[None, :, None].expand(1, 4, 3, H, H).contiguous()
    start = torch.tensor([[4.5, 6.5], [7.5, 3.5], [5.5, 9.5]])
    tracks = torch.stack([start + torch.tensor([t, 0.0]) for t in range(4)], 1)[None]  # (1, N, T, 2)
    vis = torch.ones(1, 4, 3)
    assert float(tracking_loss(video, tracks, vis)) < 1e-6
    still = start[None, :, None].expand(1, 3, 4, 2)
    assert float(tracking_loss(video, still, vis)) > 0.1
    vis[:, :, :] = 0  # invisible everywhere: nothing to constrain
    assert float(tracking_loss(video, still, vis)) == 0.0


def test_flow_path_and_euler_sampler_are_exact_for_a_point_mass():
    x0, noise, t = torch.randn(4, 3), torch.randn(4, 3), torch.rand(4)
    x_t = interpolate(x0, noise, t)
    torch.testing.assert_close(x0_from_velocity(x_t, noise - x0, t), x0)
    c = torch.tensor([0.3, -1.2, 2.0])  # data = a point mass at c: the x0-predictor is the constant c
    out = euler_sample(x0_velocity(lambda x, t: c.expand_as(x)), (5, 3), steps=7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, c.expand(5, 3), atol=1e-4, rtol=0)


def test_frechet_distance_closed_form_for_diagonal_gaussians():
    rng = np.random.default_rng(0)
    a = rng.normal(0, 1, (20000, 3)) * [1, 2, 3]
    b = rng.normal(1, 1, (20000, 3)) * [2, 2, 1] + [0, 0, 0]
    mu_a, mu_b = a.mean(0), b.mean(0)
    sa, sb = a.std(0, ddof=1), b.std(0, ddof=1)
    want = ((mu_a - mu_b) ** 2).sum() + ((sa - sb) ** 2).sum()  # exact for diagonal covariances
    assert frechet_distance(a, b) == pytest.approx(want, rel=0.02)
