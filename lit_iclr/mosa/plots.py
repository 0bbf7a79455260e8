"""Figures and mp4s of generated videos: frames side by side per method, and a grid video of a batch."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lit_iclr.core.figures import plt

from .formats import write_mp4


def to_uint8(video: torch.Tensor) -> np.ndarray:
    """(B, T, 3, H, W) in [-1, 1] -> (B, T, H, W, 3) uint8."""
    return ((video.detach().float().clamp(-1, 1) + 1) * 127.5 + 0.5).to(torch.uint8).permute(0, 1, 3, 4, 2).cpu().numpy()


def frames_figure(videos: dict[str, torch.Tensor], index: int = 0, title: str | None = None):
    """One row of frames per named video batch (its `index`-th clip)."""
    rows = {k: to_uint8(v)[index] for k, v in videos.items()}
    T = max(len(v) for v in rows.values())
    fig, axes = plt.subplots(len(rows), T, figsize=(1.1 * T, 1.2 * len(rows)), squeeze=False)
    for r, (name, frames) in enumerate(rows.items()):
        for t in range(T):
            ax = axes[r, t]
            ax.axis("off")
            if t < len(frames):
                ax.imshow(frames[t])
        axes[r, 0].text(-2, frames.shape[1] / 2, name, ha="right", va="center", fontsize=7)  # centred on the frame height
    if title:
        fig.suptitle(title, fontsize=8)
    fig.subplots_adjust(left=0.22, wspace=0.05, hspace=0.05)
    return fig


def write_video_grid(path: Path, video: torch.Tensor, fps: int = 10) -> None:
    """The batch's clips side by side in one mp4."""
    v = to_uint8(video)  # (B, T, H, W, 3)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_mp4(path, np.concatenate(list(v), axis=2), fps)
