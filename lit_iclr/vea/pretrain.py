"""Pretraining the VLM's vision tower as a patch-level item classifier: the role CLIP pretraining plays for LLaVA.

A VLM can only "see but not believe" once it can recognise what it sees. The compact VLM trained end to end on a few
hundred VQA steps cannot (it confuses the items themselves), so its vision tower is first trained on item recognition:
scenes drawn by the evidence-VQA generator (`data.draw_scene`) from Fashion-MNIST's *train* images with 1..`max_items`
items, every patch token labelled with the class of the item covering at least half of it, or EMPTY; a linear head on
each token, cross-entropy over tokens. The projector and decoder then learn the VQA task on top (optionally with the
tower frozen, LLaVA's recipe). Weights are cached per (tower architecture, pretraining settings, seed) so seeds, reruns
and resumed runs pretrain once; the result depends only on those (the tower is re-initialised from the seed). The cache
is a generated dataset like any other (`core.data.ensure_generated`, folder `vision-v<version>-<hash>`).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lit_iclr.core.data import ensure_generated
from lit_iclr.core.errors import CheckpointError
from lit_iclr.core.idx import FASHION_MNIST_CLASSES, FASHION_MNIST_DIR, load_fashion_mnist

from . import vea
from .data import draw_scene

EMPTY = len(FASHION_MNIST_CLASSES)  # label of a patch no item covers
CACHE_VERSION = 2  # 2: RGB scenes with coloured items


def patch_targets(boxes: list[tuple[int, int, int, int]], classes: list[int], image_size: int, grid: int,
                  min_overlap: float = 0.5) -> np.ndarray:
    """(grid^2,) class of the item covering >= `min_overlap` of each patch (later items win, as they are drawn on top)."""
    out = np.full(grid * grid, EMPTY, dtype=np.int64)
    for (top, left, h, w), c in zip(boxes, classes, strict=True):
        box = torch.tensor([[[left, top, left + w, top + h]]], dtype=torch.float32)
        out[vea.patch_labels(box, image_size, grid, min_overlap)[0].numpy()] = c
    return out


def pretraining_scenes(n: int, seed: int, image_size: int, grid: int, max_items: int = 4, source: str = "train",
                       fashion_root: str | Path = FASHION_MNIST_DIR) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` generated RGB scenes (n, 3, S, S) in [0, 1] with their patch labels (n, grid^2), from Fashion-MNIST `source`."""
    images, labels = load_fashion_mnist(fashion_root, source)
    by_class = [np.flatnonzero(labels == c) for c in range(len(FASHION_MNIST_CLASSES))]
    rng = np.random.default_rng([seed, 7, int(source == "test")])
    x = np.empty((n, 3, image_size, image_size), dtype=np.float32)
    y = np.empty((n, grid * grid), dtype=np.int64)
    for i in range(n):
        s = draw_scene(images, by_class, rng, image_size, image_size // 2, int(rng.integers(1, max_items + 1)), 0.5)
        x[i] = s["image"].transpose(2, 0, 1) / 255.0
        y[i] = patch_targets(s["boxes"], s["classes"], image_size, grid)
    return torch.from_numpy(x), torch.from_numpy(y)


def item_accuracy(vision: nn.Module, head: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 256) -> float:
    """Accuracy of the token classifier on patches that hold an item (EMPTY patches left out: they are trivial)."""
    hits = total = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            pred = head(vision.forward_features(x[i:i + batch])).argmax(-1)
            item = y[i:i + batch] != EMPTY
            hits += int((pred == y[i:i + batch])[item].sum())
            total += int(item.sum())
    return hits / max(total, 1)


def pretrain_vision(vision: nn.Module, image_size: int, grid: int, steps: int, seed: int = 0, batch_size: int = 128,
                    lr: float = 3e-3, num_scenes: int = 12000, max_items: int = 4) -> dict[str, float]:
    """Train `vision` (timm ViT without class token: forward_features -> (B, grid^2, D)) in place as a token classifier.

    Returns the held-out item accuracy (scenes from Fashion-MNIST's test images). Global RNG state is left untouched.
    """
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        vision.init_weights()
        n = min(num_scenes, steps * batch_size)  # no more scenes than the steps draw
        x, y = pretraining_scenes(n, seed, image_size, grid, max_items)
        hx, hy = pretraining_scenes(min(1000, n), seed, image_size, grid, max_items, source="test")
        head = nn.Sequential(nn.LayerNorm(vision.embed_dim), nn.Linear(vision.embed_dim, EMPTY + 1))
        params = [*vision.parameters(), *head.parameters()]
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
        g = torch.Generator().manual_seed(seed)
        vision.train()
        for _ in range(steps):
            idx = torch.randint(len(x), (batch_size,), generator=g)
            loss = F.cross_entropy(head(vision.forward_features(x[idx])).flatten(0, 1), y[idx].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
        return {"item_acc": item_accuracy(vision, head, hx, hy)}


def cache_key(vision: nn.Module, **settings) -> str:
    """Hash of the tower's parameter names and shapes and of the pretraining settings."""
    shapes = [(k, list(v.shape)) for k, v in vision.state_dict().items()]
    blob = json.dumps({"version": CACHE_VERSION, "shapes": shapes, "settings": settings}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def cache_path(vision: nn.Module, cache_dir: str | Path, image_size: int, grid: int, steps: int, seed: int = 0,
               **kw) -> Path:
    """The cached tower's folder: `<cache_dir>/vision-v<version>-<key>/tower.pt`, keyed like a generated dataset (the
    version in the name, a hash of the architecture and every pretraining setting), so two configs never share one."""
    settings = {"image_size": image_size, "grid": grid, "steps": steps, "seed": seed, **kw}
    return Path(cache_dir) / f"vision-v{CACHE_VERSION}-{cache_key(vision, **settings)}"


def pretrained_vision(vision: nn.Module, cache_dir: str | Path | None, image_size: int, grid: int, steps: int,
                      seed: int = 0, **kw) -> dict[str, float]:
    """`pretrain_vision`, or its cached result. The pretrained tower is data: generated once by `ensure_generated`
    (written into a temporary folder renamed when complete, so an interrupted run leaves no partial cache; the training's
    random stream is left as it was), then loaded with `weights_only=True` by every later fit, seed or resume."""
    if cache_dir is None:
        return pretrain_vision(vision, image_size, grid, steps, seed, **kw)
    folder = cache_path(vision, cache_dir, image_size, grid, steps, seed, **kw)

    def generate(out: Path) -> None:
        result = pretrain_vision(vision, image_size, grid, steps, seed, **kw)
        torch.save({"state_dict": vision.state_dict(), "item_acc": result["item_acc"]}, out / "tower.pt")

    ensure_generated(folder, generate)
    path = folder / "tower.pt"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        vision.load_state_dict(saved["state_dict"])
    except Exception as e:  # a corrupt or foreign file
        raise CheckpointError(path, f"cached vision weights unreadable ({e.__class__.__name__})",
                              f"delete the folder {folder}; it is re-made by the next fit") from e
    return {"item_acc": float(saved["item_acc"])}
