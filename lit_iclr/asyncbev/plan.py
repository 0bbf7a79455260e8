"""`cli.py plan` hooks of AsyncBEV (see `lit_iclr/core/plan.py`).

One training batch at the config's real sizes: `max_points` LiDAR points (x, y, z, intensity, time lag), six camera
images of `image_size`, their lidar2img matrices, the EMC transform, the delay and up to `MAX_BOXES` boxes. The loss is
`AsyncBEV.losses`' (heatmap focal + weighted L1 + speed-bucketed flow EPE). The targets (Gaussian heatmaps, box indices,
the GT velocity field) are built from the boxes with data-dependent indexing that meta tensors cannot run; they carry no
gradient, so the plan gives them as tensors of their shapes and evaluates the same loss functions on them, with the
flow loss as one EPE mean (its buckets select cells by value; same products, same saved tensors up to the masks).
"""
from __future__ import annotations

import torch

from .data import MAX_BOXES
from .model import REG_DIM
from .targets import focal_loss, regression_loss

CAMERAS = 6  # nuScenes: six surround cameras


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    B, N, (H, W) = batch_size, datamodule.max_points, datamodule.image_size
    z = dict(device=device)
    eye = torch.eye(4, **z).expand(B, 4, 4)
    return {"points": torch.zeros(B, N, 5, **z), "points_mask": torch.ones(B, N, dtype=torch.bool, **z),
            "images": torch.zeros(B, CAMERAS, 3, H, W, dtype=torch.uint8, **z),
            "lidar2img": torch.zeros(B, CAMERAS, 4, 4, **z), "emc": torch.eye(3, **z).expand(B, 3, 3),
            "dt": torch.zeros(B, **z), "lidar_delayed": torch.ones(B, dtype=torch.bool, **z),
            "boxes": torch.zeros(B, MAX_BOXES, 10, **z), "boxes_mask": torch.ones(B, MAX_BOXES, dtype=torch.bool, **z),
            "lidar2global": eye}


def step_loss(module, batch) -> torch.Tensor:
    grid, B = module.net.grid, batch["dt"].shape[0]
    dev = batch["dt"].device
    gt_flow = torch.zeros(B, 2, grid.size, grid.size, device=dev)
    out = module.net(batch, module.compensation, gt_flow)
    heat_t = torch.zeros_like(out["heatmap"])
    ind = torch.zeros(B, MAX_BOXES, dtype=torch.long, device=dev)
    reg_t = torch.zeros(B, MAX_BOXES, REG_DIM, device=dev)
    loss = focal_loss(out["heatmap"], heat_t) + module.reg_loss_weight * regression_loss(out["reg"], ind, reg_t,
                                                                                         batch["boxes_mask"].float())
    if "velocity" in out:
        epe = (out["velocity"] * batch["dt"].view(-1, 1, 1, 1) - gt_flow).norm(dim=1)
        loss = loss + module.flow_loss_weight * epe.mean()
    return loss


DATASET = {"name": "nuScenes v1.0-trainval (samples + sweeps, LiDAR + 6 cameras)", "bytes": 3.0e11, "samples": 28_130,
           "source": "nuScenes: 700 train scenes, 28,130 keyframes; the trainval blobs are about 300 GB"}
PAPER = {"params": None, "params_source": "not stated (a plug-in on CMT / UniBEV)", "steps": None, "accelerator": "H100",
         "note": "12 epochs x 28,130 keyframes / (8 x 4); the frozen detector's forward runs every step"}
