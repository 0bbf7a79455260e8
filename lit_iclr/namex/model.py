"""Plain-torch models whose FFNs are the merging layers: a ViT for images and a small transformer for text.

Both are stacks of timm `Block`s with `mlp_layer=MergingFFN`; the FFNs of one network share a `Chain`, through which
EP-CAMEx / NAMEx propagate the base expert (and the momentum) from layer to layer.
"""
from __future__ import annotations

from functools import partial

import torch
from timm.layers import PatchEmbed
from timm.models.vision_transformer import Block
from torch import Tensor, nn

from lit_iclr.core.global_batch import convert_dropout

from .ffn import MergeOptions, MergingFFN
from .propagation import Chain


def merging_blocks(dim: int, depth: int, num_heads: int, mlp_ratio: float, options: MergeOptions,
                   drop: float = 0.0) -> nn.ModuleList:
    """`depth` timm blocks whose FFN is a `MergingFFN` (hidden = mlp_ratio * dim per expert), sharing one chain."""
    mlp = partial(MergingFFN, options=options, chain=Chain())
    # dropout masks drawn for the global batch: under DDP (in `step_rng`) each sample is dropped as on one process
    return convert_dropout(nn.ModuleList(Block(dim, num_heads, mlp_ratio, qkv_bias=True, proj_drop=drop, mlp_layer=mlp)
                                         for _ in range(depth)))


def merging_layers(model: nn.Module) -> list[MergingFFN]:
    return [m for m in model.modules() if isinstance(m, MergingFFN)]


def aux_loss(model: nn.Module) -> Tensor:
    """Sum of the routers' balancing losses of the last forward (0 for dense)."""
    losses = [m.aux_loss for m in merging_layers(model) if m.aux_loss is not None]
    return torch.stack(losses).sum() if losses else torch.zeros(())


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.trunc_normal_(module.weight, std=0.02)


class MoEViT(nn.Module):
    """Vision Transformer (class token, learned positions) with merging FFNs; one merge unit per image."""

    def __init__(self, num_classes: int = 10, img_size: int = 28, patch_size: int = 4, in_chans: int = 1, dim: int = 64,
                 depth: int = 4, num_heads: int = 4, mlp_ratio: float = 2.0, drop: float = 0.0,
                 merge: MergeOptions | None = None):
        super().__init__()
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, dim))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.blocks = merging_blocks(dim, depth, num_heads, mlp_ratio, merge or MergeOptions(), drop)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        for name, m in self.named_modules():
            if not isinstance(m, MergingFFN) and "mlp" not in name:
                _init_weights(m)

    def forward(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) -> logits (B, num_classes)."""
        x = self.patch_embed(images)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


class MoETextTransformer(nn.Module):
    """Small transformer over token ids with merging FFNs.

    task `lm`: causal attention, next-token logits; the FFN merges per segment of `merge.segment` tokens routed on the
    previous segment, so no token sees the future. task `topic`: bidirectional attention, mean-pooled topic logits, one
    merge unit per sequence.
    """

    def __init__(self, vocab_size: int, num_labels: int = 12, task: str = "lm", max_len: int = 128, dim: int = 64,
                 depth: int = 4, num_heads: int = 4, mlp_ratio: float = 2.0, drop: float = 0.0,
                 merge: MergeOptions | None = None):
        super().__init__()
        if task not in ("lm", "topic"):
            raise ValueError(f"task must be 'lm' or 'topic', got {task!r}")
        self.task = task
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.zeros(1, max_len, dim))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.blocks = merging_blocks(dim, depth, num_heads, mlp_ratio, merge or MergeOptions(), drop)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size if task == "lm" else num_labels, bias=task != "lm")
        for name, m in self.named_modules():
            if not isinstance(m, MergingFFN) and "mlp" not in name:
                _init_weights(m)
        if task == "lm":
            self.head.weight = self.tok.weight                  # tied input/output embeddings

    def forward(self, tokens: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens (B, T) -> (B, T, vocab) next-token logits (lm) or (B, num_labels) (topic; `mask` marks real tokens)."""
        if tokens.shape[1] > self.pos.shape[1]:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens is longer than max_len={self.pos.shape[1]}")
        x = self.tok(tokens) + self.pos[:, : tokens.shape[1]]
        causal = self.task == "lm"
        attn_mask = None if (causal or mask is None) else mask.bool()[:, None, None, :]  # keys: real tokens only
        for block in self.blocks:
            x = block(x, attn_mask=attn_mask, is_causal=causal)
        x = self.norm(x)
        if self.task == "lm":
            return self.head(x)
        if mask is None:
            return self.head(x.mean(1))
        m = mask.unsqueeze(-1).to(x.dtype)
        return self.head((x * m).sum(1) / m.sum(1).clamp_min(1.0))


def coefficient_of_variation(v: Tensor) -> Tensor:
    """std / mean along the last axis."""
    return v.std(-1, unbiased=False) / v.mean(-1).clamp_min(1e-12)


@torch.no_grad()
def contribution_spread(model: nn.Module) -> tuple[float, float] | None:
    """Spread of the experts' contributions in the last forward of NAMEx layers, averaged over layers and units.

    Returns (CV of ||alpha_i tau_i|| with the Nash weights, CV of ||tau_i|| with uniform weights) or None when no layer
    solved Nash weights. The paper's balance claim is that the first is lower.
    """
    nash, uniform = [], []
    for layer in merging_layers(model):
        m = layer.merger
        if m is None or m.last_alpha is None:
            continue
        nash.append(coefficient_of_variation(m.last_alpha * m.last_tau_norm).mean())
        uniform.append(coefficient_of_variation(m.last_tau_norm).mean())
    if not nash:
        return None
    return float(torch.stack(nash).mean()), float(torch.stack(uniform).mean())
