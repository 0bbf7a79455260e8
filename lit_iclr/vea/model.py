"""A compact LLaVA-shaped VLM: timm ViT patch encoder -> MLP projector -> small causal decoder over [image; question]
(LLaVA's order) or [question; image; ANSWER] (`question_first`: the question is read before the image, so the lookup of
the asked item can only happen at the ANSWER position, which is where the paper reads attention).

The decoder's attention is computed explicitly (softmax(QK^T / sqrt(d) + causal mask)), so the forward pass can return, for
every layer, the head-averaged attention row of the last position (the ANSWER query token, where the answer is read out)
over all positions: the quantity the paper's analysis and VEA use. The answer is a classification over the answer
vocabulary from the last position's hidden state (the first answer token of a LM restricted to that vocabulary).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .data import PAD


@dataclass
class VLMOutput:
    logits: torch.Tensor           # (B, num_answers)
    answer_attention: torch.Tensor | None  # (B, L, T): layer l's head-mean attention of the last position over T tokens
    num_image_tokens: int


class DecoderLayer(nn.Module):
    """Pre-norm transformer block with explicit attention probabilities (the 'eager' path of HF models)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5 + mask  # (B, H, T, T)
        probs = scores.softmax(-1)
        h = h + self.proj((probs @ v).transpose(1, 2).reshape(b, t, d))
        h = h + self.mlp(self.norm2(h))
        return h, probs


class CompactVLM(nn.Module):
    def __init__(self, num_answers: int, vocab_size: int, image_size: int = 32, patch_size: int = 8, in_chans: int = 3,
                 vision_dim: int = 48, vision_depth: int = 1, vision_heads: int = 2, dim: int = 64, depth: int = 4,
                 heads: int = 4, mlp_ratio: int = 2, max_question_len: int = 8, question_first: bool = False):
        """
        Args:
            num_answers: Answer classes.
            vocab_size: Question vocabulary (hashed word ids).
            image_size: Square input side in pixels.
            patch_size: ViT patch side; the image gives (image_size / patch_size)^2 image tokens.
            in_chans: Image channels (3: the RGB images of the data).
            vision_dim / vision_depth / vision_heads: timm VisionTransformer width, blocks and heads.
            dim / depth / heads: decoder width, layers and heads.
            mlp_ratio: decoder MLP width / dim.
            max_question_len: Longest question (position embeddings).
            question_first: Sequence [question; image; ANSWER] ("<question> <image>" prompts) instead of
                [image; question; ANSWER]: image tokens then see the question and the question tokens cannot see the
                image, so the lookup of the asked item happens at the ANSWER position, where the analysis reads attention.
        """
        super().__init__()
        import timm

        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} must be a multiple of patch_size {patch_size}")
        self.grid = image_size // patch_size
        self.num_image_tokens = self.grid**2
        # timm ViT without class token or pooling: forward_features gives one token per patch, like LLaVA's CLIP tower
        self.vision = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, global_pool="",
                                        class_token=False, img_size=image_size, patch_size=patch_size, in_chans=in_chans,
                                        embed_dim=vision_dim, depth=vision_depth, num_heads=vision_heads, mlp_ratio=2.0)
        self.projector = nn.Sequential(nn.Linear(vision_dim, dim), nn.GELU(), nn.Linear(dim, dim))  # LLaVA-1.5 MLP
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=PAD)
        self.pos = nn.Parameter(torch.zeros(1, self.num_image_tokens + max_question_len, dim))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.layers = nn.ModuleList(DecoderLayer(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_answers)
        self.question_first = question_first

    def forward(self, x: torch.Tensor, q: torch.Tensor, return_attention: bool = False) -> VLMOutput:
        img = self.projector(self.vision.forward_features(x))  # (B, N, dim)
        n, lq = img.shape[1], q.shape[1]
        # `order`: sequence position -> index in [image; question] (the layout of the returned attention rows)
        if self.question_first:
            order = torch.cat([torch.arange(n, n + lq - 1), torch.arange(n), torch.tensor([n + lq - 1])]).to(x.device)
        else:
            order = torch.arange(n + lq, device=x.device)
        h = torch.cat([img, self.embed(q)], dim=1)[:, order]
        t = h.shape[1]
        h = h + self.pos[:, :t]
        # causal mask, plus: no query attends to left padding of the question
        causal = torch.full((t, t), float("-inf"), device=h.device).triu(1)
        pad = torch.cat([q.new_zeros(q.shape[0], n, dtype=torch.bool), q == PAD], 1)[:, order]
        mask = causal[None, None] + torch.where(pad, float("-inf"), 0.0)[:, None, None, :]
        mask = mask.masked_fill(torch.eye(t, dtype=torch.bool, device=h.device), 0.0)  # every row keeps itself
        rows = []
        for layer in self.layers:
            h, probs = layer(h, mask)
            if return_attention:
                row = probs[:, :, -1].mean(1)  # last position, mean over heads: (B, T), sequence order
                rows.append(torch.empty_like(row).index_copy_(1, order, row))  # -> [image; question] order
        logits = self.head(self.norm(h[:, -1]))
        att = torch.stack(rows, 1) if return_attention else None
        return VLMOutput(logits, att, self.num_image_tokens)
