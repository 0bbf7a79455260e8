"""Frozen image embeddings for the concept layer, as the paper's default runs on precomputed backbone features.

The paper embeds CUB with a frozen ImageNet-pretrained network and trains the stochastic concept heads on the features.
Nothing downloads here, so the default backbone (timm, via `lit_iclr.core.backbones`) is pretrained briefly on the real
Fashion-MNIST item classes (`pretrain_on_fashion_mnist`): a generic grey-image feature extractor trained on another task,
never on the scenes or their concepts. A local weight file (`checkpoint`) replaces that step for real data.

The embedding of an image is each chosen stage's feature map average-pooled to a `grid` x `grid` layout and concatenated
(the coarse layout keeps where things are, which globally pooled features would lose).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lit_iclr.core.backbones import create_backbone, create_stage_features
from lit_iclr.core.idx import FASHION_MNIST_DIR, load_fashion_mnist


def pretrain_on_fashion_mnist(name: str, steps: int, out_path: Path, batch_size: int = 128, lr: float = 2e-3, seed: int = 0,
                              canvas: int = 32, root: str | Path = FASHION_MNIST_DIR) -> Path:
    """Train `name` (1 channel) + a linear head on Fashion-MNIST items at random places/scales; save the backbone weights."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    images, labels = load_fashion_mnist(root, "train")
    x_all, y_all = torch.from_numpy(images), torch.from_numpy(labels)
    net = create_backbone(name, in_chans=1)
    head = torch.nn.Linear(net.num_features, 10)
    opt = torch.optim.Adam([*net.parameters(), *head.parameters()], lr=lr)
    net.train()
    for _ in range(steps):
        idx = torch.randint(len(x_all), (batch_size,), generator=gen)
        size = int(torch.randint(14, canvas + 1, (1,), generator=gen))
        x = F.interpolate(x_all[idx].unsqueeze(1).float() / 255.0, size=(size, size), mode="bilinear", align_corners=False)
        top, left = (int(v) for v in torch.randint(0, canvas - size + 1, (2,), generator=gen))
        x = F.pad(x, (left, canvas - size - left, top, canvas - size - top))
        x = x * torch.empty(batch_size, 1, 1, 1).uniform_(0.5, 1.0, generator=gen)  # brightness varies, as in scenes
        x = x + torch.empty(batch_size, 1, 1, 1).uniform_(0.0, 0.2, generator=gen)
        loss = F.cross_entropy(head(net(normalize(x))), y_all[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp))
    tmp.replace(out_path)
    return out_path


def normalize(x: torch.Tensor) -> torch.Tensor:
    """[0, 1] images -> zero-centred inputs ((x - 0.5) / 0.5), the same for pretraining, embedding and end-to-end runs."""
    return (x - 0.5) / 0.5


def embedding_dim(name: str, in_chans: int, stages: list[int], grid: int) -> int:
    net = create_stage_features(name, in_chans=in_chans, out_indices=tuple(stages))
    return sum(net.feature_info.channels()) * grid * grid


@torch.no_grad()
def embed_images(images: np.ndarray, name: str, in_chans: int, stages: list[int], grid: int,
                 checkpoint: str | Path | None = None, batch_size: int = 256) -> torch.Tensor:
    """(N, H, W[, C]) uint8 images -> (N, D) float32 features of the frozen backbone (stages pooled to grid x grid)."""
    net = create_stage_features(name, in_chans=in_chans, out_indices=tuple(stages),
                                checkpoint_path=None if checkpoint is None else str(checkpoint))
    net.eval()
    out = []
    for start in range(0, len(images), batch_size):
        x = torch.from_numpy(images[start:start + batch_size]).float() / 255.0
        x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
        maps = net(normalize(x))
        out.append(torch.cat([F.adaptive_avg_pool2d(m, grid).flatten(1) for m in maps], dim=1))
    return torch.cat(out)
