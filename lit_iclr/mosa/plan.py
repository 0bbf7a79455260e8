"""`cli.py plan` hooks of MoSA (see `lit_iclr/core/plan.py`): one training batch of the HumanMotionVideo layout at the
config's frames/size (video clip, captions, SMPL joints + contacts, cameras, projected structure maps, dense tracks), and
the loss `training_step` backpropagates (flow matching + tracking + structure MSE + bone + contact)."""
from __future__ import annotations

import torch

from .skeleton import NUM_JOINTS

TRACKS = 1024  # reconstructed: dense point tracks per clip (a 32 x 32 CoTracker-style grid over the human region)


def example_batch(datamodule, batch_size: int, device: str | torch.device = "meta") -> dict[str, torch.Tensor]:
    B, T, S = batch_size, datamodule.num_frames, datamodule.image_size
    W = datamodule.tokenizer.max_len
    z = dict(device=device)
    K = torch.zeros(B, 3, 3, **z)
    return {
        "joints3d": torch.zeros(B, T, NUM_JOINTS, 3, **z), "contacts": torch.zeros(B, T, 4, **z),
        "keypoints2d": torch.zeros(B, T, NUM_JOINTS, 2, **z), "depth": torch.ones(B, T, NUM_JOINTS, **z),
        "K": K, "extrinsics": torch.zeros(B, T, 3, 4, **z),
        "tracks": torch.zeros(B, TRACKS, T, 2, **z), "track_visible": torch.ones(B, T, TRACKS, **z),
        "action": torch.zeros(B, dtype=torch.long, **z), "maps": torch.zeros(B, T, 6, S, S, **z),
        "video": torch.zeros(B, T, 3, S, S, **z),
        "text_ids": torch.zeros(B, W, dtype=torch.long, **z), "text_mask": torch.ones(B, W, dtype=torch.bool, **z),
    }


def step_loss(module, batch) -> torch.Tensor:
    parts = module.video_loss(batch) if module.video_net is not None else {}
    if module.structure_net is not None:
        parts |= module.structure_loss(batch)
    return module.total(parts)


DATASET = {"name": "MoVid (~30K human videos; HumanML3D layout + videos/)", "bytes": 30_000 * 5e6, "samples": 30_000,
           "source": "paper: about 30K clips; about 5 MB per clip of mp4 + joints + tracks (reconstructed)"}
PAPER = {"params": None, "params_source": "not stated (backbone not found)", "steps": None, "accelerator": "H100",
         "note": "DiT sizes, resolution and schedule reconstructed (configs/paper/mosa.yaml)"}
