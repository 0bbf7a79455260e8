"""Structure -> per-frame control maps (torch, differentiable, batched): projection, limb maps, depth map, human region."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .skeleton import BONES

# limb groups of the 21 bones (child joint order): torso+head, left leg, right leg, left arm, right arm
LIMB_GROUP = torch.tensor([1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 0, 0, 0, 3, 4, 3, 4, 3, 4])
NUM_LIMB_GROUPS = 5
_PAR = torch.tensor([p for p, _ in BONES])
_CHI = torch.tensor([c for _, c in BONES])


def project(joints: torch.Tensor, K: torch.Tensor, E: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixels (B, T, J, 2) and depths (B, T, J) of world joints (B, T, J, 3); K (B, 3, 3), E (B, T, 3, 4)."""
    cam = torch.einsum("btij,btnj->btni", E[..., :3], joints) + E[..., None, :, 3]
    z = cam[..., 2].clamp_min(1e-3)
    uv = torch.einsum("bij,btnj->btni", K[:, :2, :2], cam[..., :2] / z[..., None]) + K[:, None, None, :2, 2]
    return uv, z


def control_maps(uv: torch.Tensor, size: int, depth: torch.Tensor | None = None, sigma: float = 0.8,
                 depth_scale: float = 0.5) -> torch.Tensor:
    """(B, T, C, H, W) maps of a skeleton: one Gaussian limb map per limb group (C = 5) and, given joint depths, a depth
    channel holding the depth of the nearest limbs relative to the pelvis (what the 2-D skeleton lacks: who is in front)."""
    B, T = uv.shape[:2]
    ys, xs = torch.meshgrid(torch.arange(size, device=uv.device) + 0.5, torch.arange(size, device=uv.device) + 0.5,
                            indexing="ij")
    p = torch.stack([xs, ys], -1).view(1, 1, size * size, 1, 2)
    a, b = uv[:, :, _PAR][:, :, None], uv[:, :, _CHI][:, :, None]  # (B, T, 1, 21, 2)
    ab, ap = b - a, p - a
    s = ((ap * ab).sum(-1) / (ab * ab).sum(-1).clamp_min(1e-6)).clamp(0, 1)
    d2 = ((ap - s[..., None] * ab) ** 2).sum(-1)  # squared distance to each bone segment (B, T, HW, 21)
    m = torch.exp(-d2 / (2 * sigma**2))
    group = F.one_hot(LIMB_GROUP.to(uv.device), NUM_LIMB_GROUPS).to(m.dtype)  # (21, 5)
    limbs = torch.einsum("btpk,kg->btpg", m, group).clamp(max=1.0)
    chans = [limbs]
    if depth is not None:
        rel = (depth - depth[..., :1]) / depth_scale  # relative to the pelvis
        zb = rel[:, :, _PAR][:, :, None] + s * (rel[:, :, _CHI] - rel[:, :, _PAR])[:, :, None]
        near = torch.exp(-4 * rel)  # nearness weight at the joints, interpolated along each bone (one exp per joint)
        w = m * (near[:, :, _PAR][:, :, None] + s * (near[:, :, _CHI] - near[:, :, _PAR])[:, :, None])
        chans.append((w * zb).sum(-1, keepdim=True) / w.sum(-1, keepdim=True).clamp_min(1e-6) * m.amax(-1, keepdim=True))
    return torch.cat(chans, -1).permute(0, 1, 3, 2).reshape(B, T, -1, size, size)


def human_region(maps: torch.Tensor, patch: int, dilate: int = 1, threshold: float = 0.1) -> torch.Tensor:
    """(B, T, N, 1) token mask of the human region: patches touched by a limb map, dilated by `dilate` patches."""
    B, T, C, H, W = maps.shape
    limbs = maps[:, :, :NUM_LIMB_GROUPS].amax(2).reshape(B * T, 1, H, W)
    occ = (F.max_pool2d(limbs, patch) > threshold).float()
    occ = F.max_pool2d(occ, 2 * dilate + 1, stride=1, padding=dilate)
    return occ.reshape(B, T, -1, 1)
