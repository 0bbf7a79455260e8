"""The networks whose exits the policies serve: a timm backbone with an exit head after every stage, and a cascade of
separately trained timm classifiers of growing size. Plain torch modules; `exit_training.py` trains them."""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lit_iclr.core.backbones import create_backbone, create_stage_features


class MultiExitNet(nn.Module):
    """(B, 1, H, W) -> (B, S, C) logits of an exit head (global average pool + linear) after each backbone stage."""

    def __init__(self, backbone: str = "test_resnet", num_classes: int = 10, in_chans: int = 1,
                 out_indices: tuple[int, ...] = (1, 2, 3, 4)):
        super().__init__()
        self.backbone_name, self.out_indices, self.in_chans = backbone, tuple(out_indices), in_chans
        self.features = create_stage_features(backbone, in_chans, out_indices=self.out_indices)
        self.heads = nn.ModuleList(nn.Linear(c, num_classes) for c in self.features.feature_info.channels())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.features(x)
        return torch.stack([h(f.mean((-2, -1))) for h, f in zip(self.heads, feats, strict=True)], 1)

    def stage_costs(self, image_shape: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Incremental FLOPs and seconds per query of reaching exit i from exit i-1 (its backbone blocks + its head).

        Prefix i is timed and counted as a truncated copy of the backbone (timm builds only the blocks up to the last
        requested stage), so exit i's cost is prefix(i) - prefix(i-1) plus its head.
        """
        x = torch.zeros(1, *image_shape)
        flops, secs = [], []
        for i, idx in enumerate(self.out_indices):
            prefix = create_stage_features(self.backbone_name, self.in_chans, out_indices=(idx,)).eval()
            head = self.heads[i]
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                head(prefix(x)[-1].mean((-2, -1)))
            flops.append(counter.get_total_flops())
            secs.append(_seconds(lambda p=prefix, h=head: h(p(x.expand(64, -1, -1, -1))[-1].mean((-2, -1)))) / 64)
        flops_t, secs_t = torch.tensor(flops, dtype=torch.float64), torch.tensor(secs, dtype=torch.float64)
        head_flops = torch.tensor([2.0 * h.in_features * h.out_features for h in self.heads], dtype=torch.float64)
        # prefix(i) includes head i; the incremental cost also pays head i but not head i-1
        inc = torch.cat([flops_t[:1], flops_t[1:] - flops_t[:-1] + head_flops[:-1]])
        inc_s = torch.cat([secs_t[:1], (secs_t[1:] - secs_t[:-1]).clamp_min(1e-7)])
        return inc, inc_s


class Classifier(nn.Module):
    """One cascade member: a timm backbone and a linear head."""

    def __init__(self, backbone: str, num_classes: int = 10, in_chans: int = 1):
        super().__init__()
        self.body = create_backbone(backbone, in_chans)
        self.head = nn.Linear(self.body.num_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def cost(self, image_shape: tuple[int, int, int]) -> tuple[float, float]:
        """(FLOPs, seconds) per query."""
        x = torch.zeros(1, *image_shape)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            self(x)
        return float(counter.get_total_flops()), _seconds(lambda: self(x.expand(64, -1, -1, -1))) / 64


@torch.no_grad()
def _seconds(fn, repeats: int = 3) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
