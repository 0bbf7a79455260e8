"""AsyncBEV math against independent computation: warps in closed form, the oracle warp on rendered boxes, the
bucketed flow loss against numpy, finite-difference gradients, and CenterPoint targets -> decode round trip."""
from __future__ import annotations

import math

import numpy as np
import torch

from lit_iclr.asyncbev.model import BEVFusionDetector, BEVGrid, emc_warp, flow_warp
from lit_iclr.asyncbev.targets import build_targets, decode, flow_loss, gt_velocity_field, uncompensated_flow

torch.set_num_threads(1)
GRID = BEVGrid(8.0, 16)  # 1 m cells


def peak(bev: torch.Tensor) -> tuple[int, int]:
    i = int(bev.flatten().argmax())
    return divmod(i, bev.shape[-1])


def test_emc_warp_moves_content_by_the_ego_motion():
    bev = torch.zeros(1, 1, 16, 16)
    bev[0, 0, 5, 9] = 1.0
    A = torch.eye(3)[None]
    A[0, 0, 2] = 2.0  # sync cell p1 reads the async map at p1 + (2, 0) m: content moves 2 cells towards -x
    out = emc_warp(bev, GRID, A)
    assert peak(out[0, 0]) == (5, 7) and out.max() == torch.tensor(1.0)
    R = torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])[None]  # 90 degree rotation about the origin
    out = emc_warp(bev, GRID, R)
    # content at async (x, y) = (1.5, -2.5) appears at the sync cell p1 with R p1 = (1.5, -2.5): p1 = (-2.5, -1.5)
    assert peak(out[0, 0]) == (6, 5)


def test_flow_warp_is_backward_warping():
    bev = torch.zeros(1, 1, 16, 16)
    bev[0, 0, 4, 4] = 1.0
    flow = torch.zeros(1, 2, 16, 16)
    flow[:, 0] = 3.0  # +3 m in x
    flow[:, 1] = -1.0
    out = flow_warp(bev, GRID, flow)
    assert peak(out[0, 0]) == (3, 7) and torch.isclose(out.max(), torch.tensor(1.0))


def _occupancy(center, size_lw, yaw, grid):
    xy = grid.centres().numpy()
    d = xy - np.asarray(center)
    c, s = math.cos(yaw), math.sin(yaw)
    along, across = c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1]
    return torch.tensor((np.abs(along) <= size_lw[0] / 2) & (np.abs(across) <= size_lw[1] / 2), dtype=torch.float32)


def test_oracle_warp_moves_a_moving_box_without_ghost():
    grid = BEVGrid(16.0, 64)  # 0.5 m cells
    v, dt, yaw = np.array([8.0, 0.0]), 0.5, 0.0
    c1 = np.array([3.0, 2.0])
    before = _occupancy(c1 - v * dt, (4.5, 1.9), yaw, grid)
    after = _occupancy(c1, (4.5, 1.9), yaw, grid)
    boxes = torch.tensor([[*c1, 0.8, 1.9, 4.5, 1.6, yaw, *v, 0.0]], dtype=torch.float32)[None]
    vel = gt_velocity_field(boxes, torch.ones(1, 1, dtype=torch.bool), torch.tensor([dt]), grid)
    warped = flow_warp(before[None, None], grid, vel * dt)[0, 0]
    iou = ((warped > 0.5) & (after > 0.5)).sum() / ((warped > 0.5) | (after > 0.5)).sum()
    assert iou > 0.85
    ghost = (before > 0.5) & (after < 0.5)
    assert warped[ghost].max() < 0.5  # the place the car left is background again
    assert torch.allclose(vel[0, :, 0, 0], torch.zeros(2))  # static background has zero flow


def test_flow_loss_equals_bucket_means():
    g = torch.Generator().manual_seed(0)
    pred, gt = torch.randn(2, 2, 8, 8, generator=g), torch.randn(2, 2, 8, 8, generator=g)
    speed = torch.rand(2, 2, 8, 8, generator=g) * 2.0
    loss = flow_loss(pred, gt, speed)
    epe = np.linalg.norm((pred - gt).numpy(), axis=1)
    s = np.linalg.norm(speed.numpy(), axis=1)
    ref = sum(epe[m].mean() for m in (s < 0.4, (s >= 0.4) & (s <= 1.0), s > 1.0) if m.any())
    assert np.isclose(float(loss), ref, rtol=1e-5)
    # an empty bucket is skipped, not counted as zero
    assert np.isclose(float(flow_loss(pred, gt, torch.zeros_like(speed))), epe.mean(), rtol=1e-5)


def test_flow_warp_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(1)
    bev = torch.rand(1, 2, 16, 16, generator=g, dtype=torch.float64)
    flow = (torch.rand(1, 2, 16, 16, generator=g, dtype=torch.float64) * 0.6 + 0.2).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda f: flow_warp(bev, GRID, f), (flow,), eps=1e-6, atol=1e-4)


def test_targets_decode_round_trip():
    grid = BEVGrid(25.6, 64)
    boxes = torch.tensor([[[3.3, -7.1, -0.9, 1.9, 4.6, 1.7, 0.4, 6.0, -1.0, 0.0],
                           [-12.2, 5.5, -1.0, 0.7, 0.7, 1.75, -2.0, 1.2, 0.3, 2.0]]])
    heat, ind, reg, mask = build_targets(boxes, torch.ones(1, 2, dtype=torch.bool), grid, 4)
    assert heat.max() == 1.0 and int((heat == 1).sum()) == 2
    logits = torch.logit(heat.clamp(1e-4, 1 - 1e-4))
    reg_map = torch.zeros(1, 10, 64 * 64)
    reg_map[0, :, ind[0]] = reg[0].T
    dets = decode(logits, reg_map.view(1, 10, 64, 64), grid, top_k=2)[0]
    order = dets["label"].argsort()
    assert torch.equal(dets["label"][order], torch.tensor([0, 2]))
    assert torch.allclose(dets["center"][order], boxes[0, :, :3], atol=1e-4)
    assert torch.allclose(dets["size"][order], boxes[0, :, 3:6], atol=1e-4)
    assert torch.allclose(dets["yaw"][order], boxes[0, :, 6], atol=1e-4)
    assert torch.allclose(dets["velocity"][order], boxes[0, :, 7:9], atol=1e-4)


def test_pillars_take_the_max_over_points():
    det = BEVFusionDetector(grid_size=16, half_range=8.0, channels=4, image_size=(32, 48))
    enc = det.lidar
    pts = torch.tensor([[[0.2, 0.3, -1.0, 0.5, 0.0], [0.7, 0.9, -0.5, 0.1, 0.05], [-3.0, 4.0, -1.0, 0.2, 0.0]]])
    mask = torch.tensor([[True, True, False]])  # the third point is padding
    feats = torch.cat([pts, pts[..., :2] - torch.tensor([0.5, 0.5])], -1)
    ref = enc.point_mlp(feats)[0, :2].max(0).values.clamp_min(0)
    captured = {}
    enc.convs.register_forward_hook(lambda m, i, o: captured.setdefault("bev", i[0]))
    enc(pts, mask)
    bev = captured["bev"][0]
    assert torch.allclose(bev[:, 8, 8], ref, atol=1e-6)
    assert bev[:, 12, 5].abs().sum() == 0  # padded point ignored


def test_uncompensated_flow_is_ego_plus_object_motion():
    t = torch.tensor([1.5, -0.5])
    A = torch.eye(3)[None].clone()
    A[0, :2, 2] = t  # the delayed frame sees cell p1 at p1 + t
    f = torch.zeros(1, 2, 16, 16)
    f[0, :, 3, 4] = torch.tensor([2.0, 1.0])  # one moving cell
    g = uncompensated_flow(f, A, GRID)
    assert torch.allclose(g[0, :, 0, 0], -t)  # static: only the ego motion
    assert torch.allclose(g[0, :, 3, 4], f[0, :, 3, 4] - t)  # moving: object flow minus ego translation
    th = 0.3  # pure rotation about the sensor: |p - R p| = 2 |p| sin(th / 2)
    R = torch.tensor([[math.cos(th), -math.sin(th), 0.0], [math.sin(th), math.cos(th), 0.0], [0.0, 0.0, 1.0]])[None]
    norm = uncompensated_flow(torch.zeros(1, 2, 16, 16), R, GRID).norm(dim=1)[0]
    assert torch.allclose(norm, 2 * GRID.centres().norm(dim=-1) * math.sin(th / 2), atol=1e-5)


def test_asyncbev_starts_as_emc_and_flows_from_the_emc_inputs():
    torch.manual_seed(0)
    det = BEVFusionDetector(grid_size=16, half_range=8.0, channels=4, image_size=(32, 48)).eval()
    K = torch.tensor([[24.0, 0, 24, 0], [0, 24.0, 16, 0], [0, 0, 1.0, 0]])
    A = torch.eye(3)[None].clone()
    A[0, 0, 2] = 2.0
    batch = dict(points=torch.rand(1, 200, 5) * 10 - 5, points_mask=torch.ones(1, 200, dtype=torch.bool),
                 images=torch.randint(0, 255, (1, 6, 3, 32, 48), dtype=torch.uint8), lidar2img=K.expand(1, 6, 3, 4),
                 lidar_delayed=torch.tensor([True]), emc=A, dt=torch.tensor([0.5]))
    with torch.no_grad():
        f_l, f_c = det.encode(batch)
        cam, lid = det.flow_inputs(f_l, f_c, batch)
        assert torch.equal(cam, f_c) and torch.allclose(lid, emc_warp(f_l, det.grid, A))
        assert torch.equal(det(batch, "asyncbev")["heatmap"], det(batch, "emc")["heatmap"])  # zero-initialised flow
        assert not torch.allclose(det(batch, "none")["heatmap"], det(batch, "emc")["heatmap"])
