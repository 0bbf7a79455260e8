"""Evaluation of generated human videos: foot penetration / skating, a video action classifier (Frechet distance of its
features, text agreement) and a per-frame pose regressor (joint error, bone-length error, warping error along tracks),
both trained on the real clips of the data set (they stand in for I3D / a pose estimator, which need downloads)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy import linalg
from torch import nn

from .skeleton import ACTIONS, BONE_LENGTHS, FOOT_JOINTS, NUM_JOINTS


def foot_penetration(joints: torch.Tensor) -> torch.Tensor:
    """Mean depth of the foot joints below the floor y = 0, in cm (joints (..., T, 22, 3) in metres)."""
    return F.relu(-joints[..., FOOT_JOINTS, 1]).mean() * 100


def foot_skating(joints: torch.Tensor, height: float = 0.05) -> torch.Tensor:
    """Mean horizontal foot displacement (cm / frame) over steps where the foot stays within `height` of the floor."""
    feet = joints[..., FOOT_JOINTS, :]
    low = (feet[..., 1:, :, 1] < height) & (feet[..., :-1, :, 1] < height)
    step = (feet[..., 1:, :, [0, 2]] - feet[..., :-1, :, [0, 2]]).norm(dim=-1)
    return (step * low).sum() / low.sum().clamp_min(1) * 100


def frechet_gaussians(mu_a: np.ndarray, sa: np.ndarray, mu_b: np.ndarray, sb: np.ndarray) -> float:
    """Frechet distance of two Gaussians: ||mu_a - mu_b||^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2))."""
    covmean = linalg.sqrtm(sa @ sb)
    covmean = covmean.real if np.iscomplexobj(covmean) else covmean
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(sa + sb - 2 * covmean))


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """FD of two feature sets (n, d), each summarised by its mean and sample covariance (FVD's form). Needs n well above
    d for a full-rank covariance: the benchmark uses n = 256 in d = 32; small sets are better compared by `kid`."""
    return frechet_gaussians(a.mean(0), np.cov(a, rowvar=False), b.mean(0), np.cov(b, rowvar=False))


def kid(a: np.ndarray, b: np.ndarray) -> float:
    """Kernel Inception Distance (Binkowski et al. 2018): the unbiased estimate of MMD^2 between feature sets a (m, d)
    and b (n, d) with the cubic polynomial kernel k(x, y) = (x . y / d + 1)^3. Unbiased at any sample size (the diagonal
    k(x_i, x_i) is left out of the within-set means), so it can be compared across set sizes, and it may be < 0."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    m, n, d = len(a), len(b), a.shape[1]
    kaa, kbb, kab = (a @ a.T / d + 1) ** 3, (b @ b.T / d + 1) ** 3, (a @ b.T / d + 1) ** 3
    return float((kaa.sum() - np.trace(kaa)) / (m * (m - 1)) + (kbb.sum() - np.trace(kbb)) / (n * (n - 1))
                 - 2 * kab.mean())


def joint_jerk(uv: torch.Tensor) -> torch.Tensor:
    """Mean norm of the third temporal difference of joint tracks uv (B, T, J, 2) (px / frame^3; needs T >= 4).

    The temporal-consistency measure the losses do not optimise: the tracking loss constrains colour along tracks and
    the contact loss the planned feet, while this reads the motion of the body a pose regressor sees in the frames.
    Jittering limbs, popping poses and frame-to-frame flicker of the figure all raise it; compare it with the same
    regressor on real clips (the floor), since the regressor's own noise adds to both."""
    return (uv[:, 3:] - 3 * uv[:, 2:-1] + 3 * uv[:, 1:-2] - uv[:, :-3]).norm(dim=-1).mean()


def flicker(video: torch.Tensor) -> torch.Tensor:
    """Mean |x_{t+1} - 2 x_t + x_{t-1}| of videos (B, T, C, H, W) in [-1, 1], on the 0..255 scale: pixel acceleration,
    high for frame-to-frame flicker, near zero for steady motion (reported beside the real clips' own)."""
    return (video[:, 2:] - 2 * video[:, 1:-1] + video[:, :-2]).abs().mean() * 127.5


class VideoClassifier(nn.Module):
    """3-D CNN over (B, T, 3, H, W) -> action logits; `features` is the penultimate layer (the FVD feature)."""

    def __init__(self, n_classes: int = len(ACTIONS), width: int = 16, feat: int = 32):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv3d(3, width, 3, padding=1), nn.GELU(), nn.MaxPool3d((1, 2, 2)),
            nn.Conv3d(width, width, 3, padding=1), nn.GELU(), nn.MaxPool3d(2),
            nn.Conv3d(width, 2 * width, 3, padding=1), nn.GELU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(),
            nn.Linear(2 * width, feat), nn.GELU())
        self.head = nn.Linear(feat, n_classes)

    def features(self, video: torch.Tensor) -> torch.Tensor:
        return self.body(video.transpose(1, 2))

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(video))


class PoseRegressor(nn.Module):
    """Per-frame CNN: image (B, 3, H, W) -> 2-D joints (B, 22, 2) in pixels and joint depths (B, 22) in metres."""

    def __init__(self, image_size: int = 32, width: int = 16):
        super().__init__()
        self.size = image_size
        self.body = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.GELU(), nn.Conv2d(width, width, 3, padding=1), nn.GELU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.GELU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.GELU(), nn.Flatten(),
            nn.Linear(2 * width * (image_size // 4) ** 2, 256), nn.GELU(), nn.Linear(256, NUM_JOINTS * 3))

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.body(img).view(-1, NUM_JOINTS, 3)
        return (out[..., :2] + 0.5) * self.size, out[..., 2] + 5.0  # centred on the image and the camera distance


def unproject(uv: torch.Tensor, z: torch.Tensor, K: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    """World joints (B, T, J, 3) from pixels (B, T, J, 2), depths (B, T, J) and cameras K (B, 3, 3), E (B, T, 3, 4)."""
    f, c = K[:, None, None, [0, 1], [0, 1]], K[:, None, None, :2, 2]
    cam = torch.cat([(uv - c) / f * z[..., None], z[..., None]], -1)
    R, tr = E[..., :3], E[..., 3]
    return torch.einsum("btji,btnj->btni", R, cam - tr[:, :, None])


def fit_evaluators(train: dict[str, torch.Tensor], epochs: int = 6, seed: int = 0, batch: int = 32):
    """Train the classifier (video -> action) and the pose regressor (frame -> joints) on real clips."""
    torch.manual_seed(seed)
    clf, reg = VideoClassifier(), PoseRegressor(train["video"].shape[-1])
    opt = torch.optim.AdamW([*clf.parameters(), *reg.parameters()], lr=1e-3)
    n = len(train["video"])
    for _ in range(epochs):
        for idx in torch.randperm(n).split(batch):
            v = train["video"][idx]
            frames = v.flatten(0, 1)
            uv, z = reg(frames)
            loss = F.cross_entropy(clf(v), train["action"][idx])
            loss = (loss + F.smooth_l1_loss(uv, train["keypoints2d"][idx].flatten(0, 1))
                    + F.mse_loss(z, train["depth"][idx].flatten(0, 1)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return clf.eval(), reg.eval()


def load_or_fit_evaluators(train: dict[str, torch.Tensor], path: Path, epochs: int = 15
                           ) -> tuple[VideoClassifier, PoseRegressor]:
    """The classifier and pose regressor of `fit_evaluators`, fit on the real training clips once and stored at `path`
    (like generated data: later runs on the same data read it back; delete the file to refit)."""
    clf, reg = VideoClassifier(), PoseRegressor(train["video"].shape[-1])
    if path.exists():
        saved = torch.load(path, weights_only=True)
        clf.load_state_dict(saved["clf"])
        reg.load_state_dict(saved["reg"])
        return clf.eval(), reg.eval()
    clf, reg = fit_evaluators(train, epochs=epochs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"clf": clf.state_dict(), "reg": reg.state_dict()}, tmp)
    tmp.replace(path)
    return clf, reg


@torch.no_grad()
def evaluate_videos(video: torch.Tensor, batch: dict, clf: VideoClassifier, reg: PoseRegressor,
                    real_features: np.ndarray, plan_uv: torch.Tensor | None = None) -> dict[str, float]:
    """Metrics of generated videos (B, T, 3, H, W) for the prompts / cameras of `batch`."""
    from .objectives import bone_lengths, sample_points
    from .render import rasterize, track_points

    B, T = video.shape[:2]
    feats = clf.features(video).numpy()
    uv, z = reg(video.flatten(0, 1))
    uv, z = uv.view(B, T, NUM_JOINTS, 2), z.view(B, T, NUM_JOINTS)
    world = unproject(uv, z, batch["K"], batch["extrinsics"])
    bones = torch.as_tensor(BONE_LENGTHS, dtype=world.dtype)
    out = {"fd": frechet_distance(feats, real_features), "kid": kid(feats, real_features),
           "jerk_px": float(joint_jerk(uv)), "flicker": float(flicker(video)),
           "text_acc": float((clf.head(torch.as_tensor(feats)).argmax(-1) == batch["action"]).float().mean()),
           "bone_err_cm": float((bone_lengths(world) - bones).abs().mean() * 100),
           "penetration_cm": float(foot_penetration(world)), "skating_cm": float(foot_skating(world))}
    # warping error along tracks of the skeleton seen in the generated video (fixed bone coordinates, z-buffer visible)
    K = batch["K"][0].numpy()
    errs = []
    for b in range(B):
        bone_map, _, _ = rasterize(uv[b].numpy().astype(np.float64), z[b].numpy().astype(np.float64), K, video.shape[-1])
        tracks, vis, _ = track_points(None, uv[b].numpy().astype(np.float64), z[b].numpy().astype(np.float64), K, bone_map)
        col = sample_points(video[b: b + 1], torch.as_tensor(tracks)[None])[0]
        both = torch.as_tensor(vis[1:] & vis[:-1], dtype=col.dtype)[..., None]
        errs.append(float(((col[1:] - col[:-1]).abs() * both).sum() / (both.sum() * 3).clamp_min(1)))
    out["warp_err"] = float(np.mean(errs)) * 127.5  # on the 0..255 colour scale
    if plan_uv is not None:
        out["joint_err_px"] = float((uv - plan_uv).norm(dim=-1).mean())
    return out
