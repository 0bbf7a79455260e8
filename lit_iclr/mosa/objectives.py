"""MoSA's objectives: flow matching, the contact and bone-length constraints of the 3-D structure, the dense-tracking loss,
and the Euler samplers. Total loss: L = L_FM(video) + L_struct + lambda_track L_track (paper: diffusion loss
+ lambda_track L_track + lambda_contact L_contact; the weights are not published, they are config options here)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from lit_iclr.core.global_batch import rank_denominator

from .skeleton import BONES, FOOT_JOINTS

_PAR = [p for p, _ in BONES]
_CHI = [c for _, c in BONES]


def interpolate(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Rectified-flow path x_t = (1 - t) x0 + t eps; its velocity is eps - x0."""
    tt = t.view(-1, *[1] * (x0.dim() - 1))
    return (1 - tt) * x0 + tt * noise


def x0_from_velocity(x_t: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x0_hat = x_t - t v_hat (exact for the linear path)."""
    return x_t - t.view(-1, *[1] * (x_t.dim() - 1)) * v


def bone_lengths(joints: torch.Tensor) -> torch.Tensor:
    return (joints[..., _CHI, :] - joints[..., _PAR, :]).norm(dim=-1)


def bone_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Bone-length consistency: |l_b(pred) - l_b(target)| per frame and bone."""
    return (bone_lengths(pred) - bone_lengths(target)).abs().mean()


def contact_loss(pred: torch.Tensor, contacts: torch.Tensor, sync: bool = False) -> torch.Tensor:
    """Contact constraint on 3-D joints (B, T, 22, 3): no foot below the floor, relu(-y_f); no sliding while the foot is
    in contact, |p_f(t+1) - p_f(t)|^2 masked by the contact flags c_f(t) (B, T, 4), as MDM's foot-contact loss.
    `sync`: the sliding term's contact count is the global batch's (`core.global_batch.rank_denominator`)."""
    feet = pred[..., FOOT_JOINTS, :]
    penetration = F.relu(-feet[..., 1]).mean()
    vel = feet[:, 1:] - feet[:, :-1]
    sliding = ((vel**2).sum(-1) * contacts[:, :-1]).sum() / rank_denominator(contacts[:, :-1].sum(), sync, 1.0)
    return penetration + sliding


def sample_points(video: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """Bilinear colours (B, T, N, 3) of video (B, T, 3, H, W) at pixel positions points (B, N, T, 2)."""
    B, T, C, H, W = video.shape
    grid = points.transpose(1, 2).reshape(B * T, -1, 1, 2) / torch.tensor([W, H], device=points.device) * 2 - 1
    out = F.grid_sample(video.reshape(B * T, C, H, W), grid, align_corners=False)  # (BT, C, N, 1)
    return out[..., 0].permute(0, 2, 1).reshape(B, T, -1, C)


def tracking_loss(video: torch.Tensor, tracks: torch.Tensor, visible: torch.Tensor, sync: bool = False) -> torch.Tensor:
    """Dense tracking constraint: L1 change of the video's colour along each track between consecutive frames where the
    point is visible in both (visible (B, T, N)); zero for a video that moves exactly with the tracked surface.
    `sync`: the count of visible pairs is the global batch's (`core.global_batch.rank_denominator`)."""
    col = sample_points(video, tracks)
    both = (visible[:, 1:] * visible[:, :-1])[..., None]
    return ((col[:, 1:] - col[:, :-1]).abs() * both).sum() / rank_denominator(both.sum() * col.shape[-1], sync, 1.0)


@torch.no_grad()
def euler_sample(velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], shape: tuple[int, ...], steps: int,
                 generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """Integrate dx/dt = v(x, t) from t = 1 (noise) to t = 0 in `steps` uniform Euler steps."""
    x = torch.randn(shape, generator=generator, device=device)
    ts = torch.linspace(1.0, 0.0, steps + 1, device=device)
    for i in range(steps):  # the loop over solver steps is inherent to sampling
        t = ts[i].expand(shape[0])
        x = x + (ts[i + 1] - ts[i]) * velocity(x, t)
    return x


def x0_velocity(model_x0: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """Velocity of an x0-predicting network on the linear path: v = (x_t - x0_hat) / t."""
    def v(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return (x - model_x0(x, t)) / t.clamp_min(1e-3).view(-1, *[1] * (x.dim() - 1))
    return v
