"""Plain torch modules: a grid-based LiDAR-camera BEV detector (UniBEV style) and the AsyncBEV flow module.

BEV tensors are (B, C, H, W) with rows along y and columns along x of the keyframe LiDAR frame; cell (i, j) has its
centre at (x_min + (j + 0.5) * res, y_min + (i + 0.5) * res).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

REG_DIM = 10  # offset x, y | z | log w, l, h | sin, cos yaw | vx, vy  (CenterPoint's regression targets)


class BEVGrid:
    """Metric coordinates of the BEV grid and their normalisation for `grid_sample` (align_corners=False)."""

    def __init__(self, half_range: float, size: int):
        self.half_range, self.size = half_range, size
        self.res = 2 * half_range / size

    def centres(self, device=None) -> torch.Tensor:
        """(H, W, 2) x, y of every cell centre."""
        c = -self.half_range + (torch.arange(self.size, device=device, dtype=torch.float32) + 0.5) * self.res
        yy, xx = torch.meshgrid(c, c, indexing="ij")
        return torch.stack([xx, yy], -1)

    def normalise(self, xy: torch.Tensor) -> torch.Tensor:
        return xy / self.half_range


def sample_bev(bev: torch.Tensor, grid: BEVGrid, xy: torch.Tensor) -> torch.Tensor:
    """Bilinearly read `bev` at metric positions `xy` (B, H, W, 2); outside the grid reads zero."""
    return F.grid_sample(bev, grid.normalise(xy), mode="bilinear", padding_mode="zeros", align_corners=False)


def emc_warp(bev: torch.Tensor, grid: BEVGrid, sync_to_async: torch.Tensor) -> torch.Tensor:
    """Ego-motion compensation: F_emc(p1) = F_async(A p1), A = (T_async->sync)^-1 in BEV (B, 3, 3)."""
    p1 = grid.centres(bev.device).expand(bev.shape[0], -1, -1, -1)
    p0 = torch.einsum("bij,bhwj->bhwi", sync_to_async[:, :2, :2], p1) + sync_to_async[:, None, None, :2, 2]
    return sample_bev(bev, grid, p0)


def flow_warp(bev: torch.Tensor, grid: BEVGrid, flow: torch.Tensor) -> torch.Tensor:
    """Backward warping: F_aligned(p) = F(p - f(p)) with the flow f (B, 2, H, W) in metres from t0 to t1."""
    p = grid.centres(bev.device)[None] - flow.permute(0, 2, 3, 1)
    return sample_bev(bev, grid, p)


def conv_block(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class PillarEncoder(nn.Module):
    """PointPillars-style LiDAR branch: per-point MLP on (x, y, z, intensity, time lag, offsets to the pillar centre),
    max over the points of each pillar (scatter), then a small conv stack."""

    def __init__(self, grid: BEVGrid, channels: int, z_range: tuple[float, float] = (-3.0, 2.0)):
        super().__init__()
        self.grid, self.z_range = grid, z_range
        self.point_mlp = nn.Sequential(nn.Linear(7, channels), nn.ReLU(), nn.Linear(channels, channels))
        self.convs = nn.Sequential(conv_block(channels, channels), conv_block(channels, channels))

    def forward(self, points: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, N, _ = points.shape
        g = self.grid
        ij = torch.floor((points[..., :2] + g.half_range) / g.res).long()  # (B, N, 2) column, row
        inside = mask & (ij >= 0).all(-1) & (ij < g.size).all(-1)
        inside &= (points[..., 2] > self.z_range[0]) & (points[..., 2] < self.z_range[1])
        ij = ij.clamp(0, g.size - 1)
        centre = -g.half_range + (ij.float() + 0.5) * g.res
        feats = torch.cat([points, points[..., :2] - centre], -1)
        f = self.point_mlp(feats)  # (B, N, C)
        C = f.shape[-1]
        flat = (torch.arange(B, device=points.device)[:, None] * g.size + ij[..., 1]) * g.size + ij[..., 0]
        flat = torch.where(inside, flat, B * g.size * g.size)  # a dump slot for padded / out-of-range points
        bev = torch.full((B * g.size * g.size + 1, C), -1e4, device=points.device, dtype=f.dtype)
        bev = bev.scatter_reduce(0, flat.reshape(-1, 1).expand(-1, C), f.reshape(-1, C), reduce="amax")
        bev = bev[:-1].clamp_min(0.0)  # empty pillars read zero; pillar features are max-pooled (PointPillars)
        bev = bev.view(B, g.size, g.size, C).permute(0, 3, 1, 2)
        return self.convs(bev)


class CameraLift(nn.Module):
    """Camera branch: timm image features lifted to BEV. Reference points at `heights` above every cell are projected
    with each camera's lidar2img, bilinearly sampled and averaged over valid hits; then Conv3x3 + InstanceNorm + GELU
    (the SimpleBEVEncoder of the official code)."""

    def __init__(self, grid: BEVGrid, channels: int, backbone: str = "test_resnet", heights: tuple[float, ...] = (-1.3, -0.6,
                 0.1), image_size: tuple[int, int] = (40, 64)):
        super().__init__()
        from lit_iclr.core.backbones import create_stage_features

        self.grid, self.image_size = grid, image_size
        self.backbone = create_stage_features(backbone, in_chans=3, out_indices=(2,))  # stride 8
        self.reduce = nn.Conv2d(self.backbone.feature_info.channels()[-1], channels, 1)
        self.register_buffer("heights", torch.tensor(heights, dtype=torch.float32), persistent=False)
        self.out = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.InstanceNorm2d(channels), nn.GELU())
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor, lidar2img: torch.Tensor) -> torch.Tensor:
        B, V, _, H_img, W_img = images.shape
        x = (images.flatten(0, 1).float() / 255.0 - self.mean) / self.std
        feats = self.reduce(self.backbone(x)[-1])  # (B V, C, h, w)
        g = self.grid
        xy = g.centres(images.device)  # (H, W, 2)
        Z = len(self.heights)
        pts = torch.cat([xy[:, :, None].expand(-1, -1, Z, -1), self.heights.view(1, 1, Z, 1).expand(g.size, g.size, Z, 1),
                         torch.ones(g.size, g.size, Z, 1, device=images.device)], -1).view(-1, 4)  # (H W Z, 4)
        uvw = torch.einsum("bvij,nj->bvni", lidar2img, pts)  # (B, V, N, 3)
        depth = uvw[..., 2]
        uv = uvw[..., :2] / depth.clamp_min(1e-3)[..., None]
        valid = (depth > 0.1) & (uv[..., 0] >= 0) & (uv[..., 0] < W_img) & (uv[..., 1] >= 0) & (uv[..., 1] < H_img)
        norm = torch.stack([uv[..., 0] / W_img * 2 - 1, uv[..., 1] / H_img * 2 - 1], -1)
        sampled = F.grid_sample(feats, norm.flatten(0, 1)[:, :, None], align_corners=False)  # (B V, C, N, 1)
        sampled = sampled.view(B, V, -1, pts.shape[0]) * valid[:, :, None].float()
        count = valid.float().sum(1).view(B, g.size, g.size, Z).sum(-1)
        bev = sampled.sum(1).view(B, -1, g.size, g.size, Z).sum(-1) / count.clamp_min(1.0)[:, None]
        return self.out(bev)


class CenterHead(nn.Module):
    """CenterPoint head: class heatmaps and the 10 regression channels per BEV cell."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.shared = conv_block(channels, channels)
        self.heatmap = nn.Sequential(conv_block(channels, channels), nn.Conv2d(channels, num_classes, 1))
        self.reg = nn.Sequential(conv_block(channels, channels), nn.Conv2d(channels, REG_DIM, 1))
        nn.init.constant_(self.heatmap[-1].bias, -2.19)  # prior 0.1 (CenterNet)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.shared(x)
        return self.heatmap(x), self.reg(x)


class FlowUNet(nn.Module):
    """AsyncBEV's flow network: conv encoder (3 stride-2 levels, channels x2, x4, x8) and a bilinear-upsampling decoder
    with skips; outputs a 2-channel BEV velocity field (m/s)."""

    def __init__(self, in_channels: int = 16, base: int = 16, depth: int = 1):
        super().__init__()
        chans = [base, base * 2, base * 4, base * 8]
        self.stem = conv_block(in_channels, chans[0])
        self.down = nn.ModuleList(nn.Sequential(conv_block(chans[i], chans[i + 1], 2),
                                                *[conv_block(chans[i + 1], chans[i + 1]) for _ in range(depth - 1)])
                                  for i in range(3))
        self.up = nn.ModuleList(conv_block(chans[i + 1] + chans[i], chans[i]) for i in reversed(range(3)))
        self.out = nn.Conv2d(chans[0], 2, 1)
        nn.init.zeros_(self.out.weight)  # start from "no motion": AsyncBEV then equals EMC
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.stem(x)]
        for d in self.down:
            skips.append(d(skips[-1]))
        y = skips.pop()
        for u in self.up:
            s = skips.pop()
            y = u(torch.cat([F.interpolate(y, size=s.shape[-2:], mode="bilinear", align_corners=False), s], 1))
        return self.out(y)


class AsyncBEVFlow(nn.Module):
    """The AsyncBEV module: conditioning codes -> FlowUNet -> velocity v; flow f = v * dt.

    feature code e_f = MLP(concat(F_C, F_L)) (8 ch), position code e_p = MLP(EMC-transformed cell xy) (4 ch),
    time code e_t = MLP(dt) (4 ch, broadcast): 16 channels in, as in the official `temporal_bev_warping`.
    """

    def __init__(self, grid: BEVGrid, channels: int, base: int = 16, depth: int = 1, use_time_code: bool = True,
                 use_position_code: bool = True):
        super().__init__()
        self.grid, self.use_time_code, self.use_position_code = grid, use_time_code, use_position_code
        self.feature_code = nn.Sequential(nn.Conv2d(2 * channels, 32, 1), nn.ReLU(), nn.Conv2d(32, 8, 1))
        self.position_code = nn.Sequential(nn.Conv2d(2, 16, 1), nn.ReLU(), nn.Conv2d(16, 4, 1))
        self.time_code = nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 4))
        self.unet = FlowUNet(16, base, depth)

    def forward(self, f_cam: torch.Tensor, f_lidar: torch.Tensor, sync_to_async: torch.Tensor, dt: torch.Tensor):
        """Returns the velocity field v (B, 2, H, W) in m/s and the flow f = v * dt in metres."""
        B, _, H, W = f_lidar.shape
        e_f = self.feature_code(torch.cat([f_cam, f_lidar], 1))
        p1 = self.grid.centres(f_lidar.device).expand(B, -1, -1, -1)
        p0 = torch.einsum("bij,bhwj->bhwi", sync_to_async[:, :2, :2], p1) + sync_to_async[:, None, None, :2, 2]
        e_p = self.position_code(self.grid.normalise(p0).permute(0, 3, 1, 2))
        e_p = e_p if self.use_position_code else torch.zeros_like(e_p)
        e_t = self.time_code(dt.view(B, 1)).view(B, 4, 1, 1).expand(-1, -1, H, W)
        e_t = e_t if self.use_time_code else torch.zeros_like(e_t)
        v = self.unet(torch.cat([e_f, e_p, e_t], 1))
        return v, v * dt.view(B, 1, 1, 1)


class BEVFusionDetector(nn.Module):
    """LiDAR pillars + camera lift -> fusion -> (asynchrony compensation of the delayed modality) -> CenterPoint head."""

    def __init__(self, num_classes: int = 4, half_range: float = 25.6, grid_size: int = 64, channels: int = 32,
                 image_backbone: str = "test_resnet", image_size: tuple[int, int] = (40, 64), flow_base: int = 16,
                 flow_depth: int = 1, use_time_code: bool = True, use_position_code: bool = True):
        super().__init__()
        self.grid = BEVGrid(half_range, grid_size)
        self.lidar = PillarEncoder(self.grid, channels)
        self.camera = CameraLift(self.grid, channels, image_backbone, image_size=image_size)
        self.flow = AsyncBEVFlow(self.grid, channels, flow_base, flow_depth, use_time_code, use_position_code)
        self.fuse = nn.Sequential(conv_block(2 * channels, channels), conv_block(channels, channels))
        self.head = CenterHead(channels, num_classes)

    def encode(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """BEV maps of both branches, each in its own sensor frame: LiDAR F_L and camera F_C."""
        return self.lidar(batch["points"], batch["points_mask"]), self.camera(batch["images"], batch["lidar2img"])

    def flow_inputs(self, f_l: torch.Tensor, f_c: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(F_C, F_L) with the delayed one ego-motion compensated (step 1): the inputs of the AsyncBEV module."""
        lidar_delayed = batch["lidar_delayed"].view(-1, 1, 1, 1)
        delayed = emc_warp(torch.where(lidar_delayed, f_l, f_c), self.grid, batch["emc"])
        return torch.where(lidar_delayed, f_c, delayed), torch.where(lidar_delayed, delayed, f_l)

    def forward(self, batch: dict, compensation: str = "asyncbev", gt_flow: torch.Tensor | None = None) -> dict:
        """compensation: none | emc | asyncbev | oracle (EMC + warp by `gt_flow`). The delayed modality per sample is
        `batch['lidar_delayed']` (bool); the other one is at the keyframe time."""
        f_l, f_c = self.encode(batch)
        out = {}
        if compensation != "none":
            lidar_delayed = batch["lidar_delayed"].view(-1, 1, 1, 1)
            cam, lid = self.flow_inputs(f_l, f_c, batch)  # (1) EMC of the delayed modality
            delayed = torch.where(lidar_delayed, lid, cam)
            if compensation == "asyncbev":
                out["velocity"], flow = self.flow(cam, lid, batch["emc"], batch["dt"])  # (2) v, f = v dt
                delayed = flow_warp(delayed, self.grid, flow)  # (3) backward warping
            elif compensation == "oracle":
                delayed = flow_warp(delayed, self.grid, gt_flow)
            elif compensation != "emc":
                raise ValueError(f"unknown compensation {compensation!r}: none | emc | asyncbev | oracle")
            f_l = torch.where(lidar_delayed, delayed, f_l)
            f_c = torch.where(lidar_delayed, f_c, delayed)
        out["heatmap"], out["reg"] = self.head(self.fuse(torch.cat([f_l, f_c], 1)))
        return out
