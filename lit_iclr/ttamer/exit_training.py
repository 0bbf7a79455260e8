"""Training the exit networks with Lightning on Fashion-MNIST and writing their exit tables (the default data).

Images are standardised and zero-padded to 32 x 32. Splits: the networks train on the first `train_images` images
of the Fashion-MNIST training set; the 10,000 test images are split in half into the calibration table (policies and
temperatures are fitted there) and the test table.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_iclr.core.idx import load_fashion_mnist

from .exits import ExitTable
from .networks import Classifier, MultiExitNet


class _Fit(L.LightningModule):
    """Sum of the cross-entropies of every exit (deep supervision, as multi-exit networks are trained)."""

    def __init__(self, net: torch.nn.Module, lr: float):
        super().__init__()
        self.net, self.lr = net, lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        logits = logits if logits.dim() == 3 else logits[:, None]
        return torch.nn.functional.cross_entropy(logits.permute(0, 2, 1), y[:, None].expand(-1, logits.shape[1]))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.net.parameters(), lr=self.lr)


def fashion_tensors(split: str, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = load_fashion_mnist(split=split)
    if n is not None:
        images, labels = images[:n], labels[:n]
    x = torch.from_numpy(images.astype(np.float32) / 255.0)[:, None]
    x = torch.nn.functional.pad((x - 0.286) / 0.353, (2, 2, 2, 2))  # 32 x 32: every timm stage keeps >= 1 x 1 maps
    return x, torch.from_numpy(labels.astype(np.int64))


def train(build: Callable[[], torch.nn.Module], x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, seed: int
          ) -> torch.nn.Module:
    L.seed_everything(seed, verbose=False)
    net = build()  # built after seeding: the initial weights follow `seed`, not the process's global RNG state
    loader = DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(_Fit(net, lr), loader)
    return net.eval()


@torch.no_grad()
def logits_of(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = torch.cat([net(x[i:i + 512]) for i in range(0, len(x), 512)])
    return out if out.dim() == 3 else out[:, None]


def make_tables(kind: str, backbones: list[str], train_images: int, epochs: int, lr: float, seed: int
                ) -> tuple[ExitTable, ExitTable]:
    """(calibration, test) exit tables of a trained multi-exit network (`nested`) or cascade (`cascade`)."""
    x, y = fashion_tensors("train", train_images)
    xt, yt = fashion_tensors("test")
    shape = tuple(x.shape[1:])
    if kind == "nested":
        net = train(partial(MultiExitNet, backbones[0]), x, y, epochs, lr, seed)
        logits = logits_of(net, xt)
        cost, latency = net.stage_costs(shape)
    else:
        members = [train(partial(Classifier, b), x, y, epochs, lr, seed + i) for i, b in enumerate(backbones)]
        logits = torch.cat([logits_of(m, xt) for m in members], 1)
        costs = [m.cost(shape) for m in members]
        cost = torch.tensor([c[0] for c in costs], dtype=torch.float64)
        latency = torch.tensor([c[1] for c in costs], dtype=torch.float64)
    half = len(yt) // 2
    make = lambda sl: ExitTable(logits[sl].float(), yt[sl], cost / cost[0], kind, latency)  # noqa: E731
    return make(slice(0, half)), make(slice(half, None))
