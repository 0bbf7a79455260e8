"""CenterPoint targets, losses and decoding, the ground-truth BEV flow and AsyncBEV's speed-bucketed flow loss.

Boxes are (B, M, 10) rows `x, y, z, w, l, h, yaw, vx, vy, label` in the keyframe LiDAR frame with a (B, M) mask.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lit_iclr.core.global_batch import rank_denominator

from .model import REG_DIM, BEVGrid

SPEED_BUCKETS = (0.4, 1.0)  # m/s: the three EPE buckets of the flow loss (<0.4, 0.4-1.0, >1.0)
REG_WEIGHTS = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.2, 0.2)  # CenterPoint's code weights (velocity 0.2)


def gaussian_radius(h: torch.Tensor, w: torch.Tensor, min_overlap: float = 0.1) -> torch.Tensor:
    """CenterNet/CenterPoint radius (in cells) so that a box shifted by it still has IoU >= min_overlap."""
    b1, c1 = h + w, w * h * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + torch.sqrt(b1**2 - 4 * c1)) / 2
    b2, c2 = 2 * (h + w), (1 - min_overlap) * w * h
    r2 = (b2 + torch.sqrt(b2**2 - 16 * c2)) / 2
    a3, b3, c3 = 4 * min_overlap, -2 * min_overlap * (h + w), (min_overlap - 1) * w * h
    r3 = (b3 + torch.sqrt(b3**2 - 4 * a3 * c3)) / 2
    return torch.minimum(torch.minimum(r1, r2), r3)


def build_targets(boxes: torch.Tensor, mask: torch.Tensor, grid: BEVGrid, num_classes: int, min_radius: int = 2):
    """Heatmap (B, C, H, W) with a Gaussian per object (sigma = (2 r + 1) / 6), the flat centre index (B, M),
    the regression targets (B, M, 10) and their mask (B, M)."""
    B, M, _ = boxes.shape
    g = grid
    cx = (boxes[..., 0] + g.half_range) / g.res  # continuous column / row
    cy = (boxes[..., 1] + g.half_range) / g.res
    inside = mask & (cx >= 0) & (cx < g.size) & (cy >= 0) & (cy < g.size)
    ci, cj = cy.floor().clamp(0, g.size - 1), cx.floor().clamp(0, g.size - 1)
    radius = gaussian_radius(boxes[..., 4] / g.res, boxes[..., 3] / g.res).floor().clamp_min(min_radius)
    sigma = (2 * radius + 1) / 6
    idx = torch.arange(g.size, device=boxes.device, dtype=torch.float32)
    d2 = (idx.view(1, 1, -1, 1) - ci[..., None, None]) ** 2 + (idx.view(1, 1, 1, -1) - cj[..., None, None]) ** 2
    gauss = torch.exp(-d2 / (2 * sigma[..., None, None] ** 2)) * inside[..., None, None]  # (B, M, H, W)
    onehot = F.one_hot(boxes[..., 9].long().clamp(0, num_classes - 1), num_classes).float() * inside[..., None]
    heatmap = torch.amax(gauss[:, :, None] * onehot[..., None, None], dim=1)  # (B, C, H, W): max over objects
    ind = (ci * g.size + cj).long()
    reg = torch.stack([cx - cj, cy - ci, boxes[..., 2], *torch.log(boxes[..., 3:6].clamp_min(1e-3)).unbind(-1),
                       torch.sin(boxes[..., 6]), torch.cos(boxes[..., 6]), boxes[..., 7], boxes[..., 8]], -1)
    return heatmap, ind, reg, inside


def focal_loss(logits: torch.Tensor, target: torch.Tensor, sync: bool = False) -> torch.Tensor:
    """CenterNet's Gaussian focal loss (alpha 2, beta 4), normalised by the number of peaks (`sync`: of the global
    batch under DDP, `core.global_batch.rank_denominator`)."""
    p = torch.sigmoid(logits).clamp(1e-4, 1 - 1e-4)
    pos = target.eq(1).float()
    pos_loss = -(torch.log(p) * (1 - p) ** 2 * pos).sum()
    neg_loss = -(torch.log(1 - p) * p**2 * (1 - target) ** 4 * (1 - pos)).sum()
    return (pos_loss + neg_loss) / rank_denominator(pos.sum(), sync, 1.0)


def regression_loss(reg: torch.Tensor, ind: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                    sync: bool = False) -> torch.Tensor:
    """Weighted L1 of the regression map read at the object centres."""
    pred = reg.flatten(2).gather(2, ind[:, None].expand(-1, REG_DIM, -1)).transpose(1, 2)  # (B, M, 10)
    w = torch.tensor(REG_WEIGHTS, device=reg.device)
    l1 = (pred - target).abs() * w * mask[..., None]
    return l1.sum() / rank_denominator(mask.sum(), sync, 1.0)  # boxes of the global batch under `sync`


def _in_box(xy: torch.Tensor, centre: torch.Tensor, half_lw: torch.Tensor, yaw: torch.Tensor) -> torch.Tensor:
    """(B, M, H, W): cell centres `xy` (H, W, 2) inside the rotated rectangles."""
    d = xy[None, None] - centre[:, :, None, None]
    c, s = torch.cos(yaw)[..., None, None], torch.sin(yaw)[..., None, None]
    along, across = c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1]
    return (along.abs() <= half_lw[..., 0, None, None]) & (across.abs() <= half_lw[..., 1, None, None])


def gt_velocity_field(boxes: torch.Tensor, mask: torch.Tensor, dt: torch.Tensor, grid: BEVGrid) -> torch.Tensor:
    """Ground-truth BEV velocity (B, 2, H, W) from the annotated box tracks, defined on the cells a moving box covers at
    t1 or covered at t0 = t1 - dt (its swept footprint). Backward warping with f = v dt then pulls the object from its
    old place into its new one and pulls background into the place it left, so no ghost remains."""
    xy = grid.centres(boxes.device)
    vel = boxes[..., 7:9]
    half = boxes[..., [4, 3]] / 2 + grid.res / 2  # half length, half width (+ half a cell so small objects get a cell)
    now = _in_box(xy, boxes[..., :2], half, boxes[..., 6])
    before = _in_box(xy, boxes[..., :2] - vel * dt.view(-1, 1, 1), half, boxes[..., 6])
    cover = (now | before) & mask[..., None, None]  # (B, M, H, W)
    speed = vel.norm(dim=-1)[..., None, None] * cover
    owner = speed.argmax(1)  # the fastest covering object (overlaps are rare)
    any_cover = cover.any(1)
    v = torch.gather(vel, 1, owner.flatten(1)[..., None].expand(-1, -1, 2))  # (B, H W, 2)
    v = v.view(*owner.shape, 2) * any_cover[..., None]
    return v.permute(0, 3, 1, 2)


def flow_loss(pred_flow: torch.Tensor, gt_flow: torch.Tensor, gt_velocity: torch.Tensor,
              sync: bool = False) -> torch.Tensor:
    """Speed-bucketed end-point error (DeFlow-style `VoxelFlowLoss`): mean EPE per bucket of GT speed
    (<0.4, 0.4-1.0, >1.0 m/s), summed over the non-empty buckets."""
    epe = (pred_flow - gt_flow).norm(dim=1)  # (B, H, W)
    speed = gt_velocity.norm(dim=1)
    lo, hi = SPEED_BUCKETS
    total = pred_flow.new_zeros(())
    for m in (speed < lo, (speed >= lo) & (speed <= hi), speed > hi):
        # a bucket empty here but not on another rank adds 0 / its global count: the global batch's mean
        total = total + (epe * m).sum() / rank_denominator(m.sum(), sync, 1.0)
    return total


def epe_by_bucket(pred_flow: torch.Tensor, gt_flow: torch.Tensor, gt_velocity: torch.Tensor) -> dict[str, tuple[float, int]]:
    """Sum of EPE and cell count per speed bucket (for averaging over a dataset)."""
    epe = (pred_flow - gt_flow).norm(dim=1)
    speed = gt_velocity.norm(dim=1)
    lo, hi = SPEED_BUCKETS
    masks = {"<0.4": speed < lo, "0.4-1.0": (speed >= lo) & (speed <= hi), ">1.0": speed > hi}
    return {k: (float((epe * m).sum()), int(m.sum())) for k, m in masks.items()}


def decode(heatmap: torch.Tensor, reg: torch.Tensor, grid: BEVGrid, top_k: int = 100) -> list[dict[str, torch.Tensor]]:
    """Boxes per sample (keyframe LiDAR frame): 3x3 max-pool NMS on the heatmap, top-k peaks, regression at the peaks."""
    B, C, H, W = heatmap.shape
    p = torch.sigmoid(heatmap)
    peaks = p * (F.max_pool2d(p, 3, 1, 1) == p)
    scores, flat = peaks.flatten(1).topk(min(top_k, C * H * W))
    label, cell = flat // (H * W), flat % (H * W)
    r = reg.flatten(2).gather(2, cell[:, None].expand(-1, REG_DIM, -1)).transpose(1, 2)  # (B, K, 10)
    i, j = (cell // W).float(), (cell % W).float()
    x = -grid.half_range + (j + r[..., 0]) * grid.res
    y = -grid.half_range + (i + r[..., 1]) * grid.res
    size = torch.exp(r[..., 3:6].clamp(max=math.log(20.0)))
    yaw = torch.atan2(r[..., 6], r[..., 7])
    return [dict(center=torch.stack([x[b], y[b], r[b, :, 2]], -1), size=size[b], yaw=yaw[b], velocity=r[b, :, 8:10],
                 label=label[b], score=scores[b]) for b in range(B)]


def uncompensated_flow(gt_flow: torch.Tensor, sync_to_async: torch.Tensor, grid: BEVGrid) -> torch.Tensor:
    """The displacement g (B, 2, H, W) that aligns the delayed map with no compensation at all: the aligned map reads
    the delayed map at A (p - f(p)) (EMC with A, then the object flow f), the uncompensated one at p, so
    g(p) = p - A (p - f(p)); its norm is the end-point error of using the delayed map as it is."""
    p = grid.centres(gt_flow.device).expand(gt_flow.shape[0], -1, -1, -1)
    q = p - gt_flow.permute(0, 2, 3, 1)
    src = torch.einsum("bij,bhwj->bhwi", sync_to_async[:, :2, :2], q) + sync_to_async[:, None, None, :2, 2]
    return (p - src).permute(0, 3, 1, 2)
