"""The real default workload: timm image classifiers of different sizes and training lengths on Fashion-MNIST.

Each classifier is trained (AdamW, plain PyTorch) on the first `train_images` training images; every test image is a
query, its quality the classifier's correctness (0/1) and its cost the classifier's measured forward FLOPs per image
(MFLOPs, counted by torch.utils.flop_counter). Models are released in order of test accuracy (better models arrive
later, spread over the first 60% of the stream); capacity falls with cost (the big model takes less traffic).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lit_iclr.core.backbones import create_backbone
from lit_iclr.core.idx import load_fashion_mnist

from .workload import Workload

DEFAULT_CLASSIFIERS = (("test_convnext", 1), ("test_resnet", 1), ("test_convnext", 3), ("test_resnet", 3))


def _images(x: np.ndarray) -> torch.Tensor:
    """Normalised (N, 1, 32, 32): padded by 2 pixels so every timm stage (stride 32) keeps a spatial cell."""
    x = torch.from_numpy(x).float().div_(255.0).sub_(0.286).div_(0.353).unsqueeze(1)
    return nn.functional.pad(x, (2, 2, 2, 2), value=-0.286 / 0.353)


def _classifier(arch: str) -> nn.Module:
    backbone = create_backbone(arch, in_chans=1)
    return nn.Sequential(backbone, nn.Linear(backbone.num_features, 10))


def train_classifier(arch: str, epochs: int, x: torch.Tensor, y: torch.Tensor, seed: int, lr: float = 3e-3,
                     batch_size: int = 64) -> nn.Module:
    torch.manual_seed(seed)
    model = _classifier(arch)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=g).split(batch_size):
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def flops_per_image(model: nn.Module) -> float:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(torch.zeros(1, 1, 32, 32))
    return float(counter.get_total_flops())


def classifier_workload(classifiers=DEFAULT_CLASSIFIERS, train_images: int = 2000, queries: int = 2000,
                        seed: int = 0) -> Workload:
    xtr, ytr = load_fashion_mnist(split="train")
    xte, yte = load_fashion_mnist(split="test")
    x, y = _images(xtr[:train_images]), torch.from_numpy(ytr[:train_images])
    xq, yq = _images(xte[:queries]), torch.from_numpy(yte[:queries])
    names, correct, mflops = [], [], []
    for i, (arch, epochs) in enumerate(classifiers):
        model = train_classifier(arch, int(epochs), x, y, seed + i)
        with torch.no_grad():
            pred = torch.cat([model(b).argmax(1) for b in xq.split(500)])
        names.append(f"{arch}-e{epochs}")
        correct.append((pred == yq).numpy().astype(float))
        mflops.append(flops_per_image(model) / 1e6)
    quality = np.stack(correct, 1)
    order = np.argsort(quality.mean(0), kind="stable")  # release order: worst first
    k = len(names)
    release = np.empty(k)
    release[order] = np.linspace(0.0, 0.6, k)
    cost_rank = np.argsort(np.argsort(mflops)) / max(k - 1, 1)
    capacity = np.round(1.0 - 0.6 * cost_rank, 3)  # cheapest 1.0 ... dearest 0.4
    cost = np.broadcast_to(np.asarray(mflops), quality.shape).copy()
    return Workload(names, quality, cost, release, np.full(k, np.inf), capacity)
