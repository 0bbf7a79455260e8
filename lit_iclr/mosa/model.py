"""MoSA's networks in plain PyTorch: a text encoder, the 3-D structure transformer and the video diffusion transformer
with Human-Aware Dynamic Control (HADC)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .maps import human_region


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of flow time t in [0, 1] (scaled by 1000 as diffusion step indices are)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
    args = 1000 * t.float()[:, None] * freqs
    return torch.cat([args.cos(), args.sin()], -1)


class TextEncoder(nn.Module):
    """Trainable word-level transformer: token states (B, L, D) and a masked mean (B, D)."""

    def __init__(self, vocab_size: int, dim: int, layers: int = 2, heads: int = 4, max_len: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(self.embed(ids) + self.pos[: ids.shape[1]], src_key_padding_mask=~mask)
        w = mask.float()[..., None]
        return h, (h * w).sum(1) / w.sum(1).clamp_min(1)


class StructureTransformer(nn.Module):
    """Text -> structure sequence (T, J, c) denoiser (MDM-style, x0 prediction): frame tokens attend to each other and
    cross-attend to the text; c = 3 for the 3-D structure, 2 for the 2-D-skeleton-first baseline."""

    def __init__(self, vocab_size: int, num_frames: int, num_joints: int = 22, coords: int = 3, dim: int = 128,
                 layers: int = 3, heads: int = 4):
        super().__init__()
        self.shape = (num_frames, num_joints, coords)
        self.text = TextEncoder(vocab_size, dim, 2, heads)
        self.inp = nn.Linear(num_joints * coords, dim)
        self.pos = nn.Parameter(torch.randn(num_frames, dim) * 0.02)
        self.t_mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        layer = nn.TransformerDecoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerDecoder(layer, layers)
        self.out = nn.Linear(dim, num_joints * coords)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B = x_t.shape[0]
        tokens, pooled = self.text(ids, mask)
        h = self.inp(x_t.reshape(B, self.shape[0], -1)) + self.pos + self.t_mlp(timestep_embedding(t, self.pos.shape[1]))[:, None]
        h = self.blocks(h + pooled[:, None], tokens, memory_key_padding_mask=~mask)
        return self.out(h).reshape(B, *self.shape)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., L, D) attention over L
        *lead, L, D = x.shape
        q, k, v = self.qkv(x).reshape(-1, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(*lead, L, D))


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class STBlock(nn.Module):
    """DiT block with factorised spatio-temporal attention (spatial within a frame, temporal per location) and adaLN-Zero."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6) for _ in range(3))
        self.spatial, self.temporal = Attention(dim, heads), Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 9 * dim))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:  # h (B, T, N, D), c (B, D)
        mods = self.ada(c)[:, None, None].chunk(9, -1)
        h = h + mods[2] * self.spatial(modulate(self.norms[0](h), mods[0], mods[1]))
        ht = modulate(self.norms[1](h), mods[3], mods[4]).transpose(1, 2)  # (B, N, T, D)
        h = h + mods[5] * self.temporal(ht).transpose(1, 2)
        return h + mods[8] * self.mlp(modulate(self.norms[2](h), mods[6], mods[7]))


class HADC(nn.Module):
    """Human-Aware Dynamic Control.

    (i) encode the patchified structure maps into control features f; (ii) spread them from the sparse skeleton tokens
    over the human region with depthwise convolutions on the token grid, restricted to the dilated region mask M;
    (iii) per DiT block l, a gate g_l = sigmoid(W_l [f, e(t)]) per token and diffusion time step scales a zero-initialised
    projection: h_l <- h_l + g_l * M * P_l f.
    """

    def __init__(self, in_ch: int, dim: int, patch: int, grid: int, n_blocks: int, spread_steps: int = 2,
                 region_dilate: int = 1):
        super().__init__()
        self.patch, self.grid, self.region_dilate = patch, grid, region_dilate
        self.encode = nn.Sequential(nn.Linear(in_ch * patch * patch, dim), nn.GELU(), nn.Linear(dim, dim))
        self.spread = nn.ModuleList(nn.Conv2d(dim, dim, 3, padding=1, groups=dim) for _ in range(spread_steps))
        self.gates = nn.ModuleList(nn.Linear(2 * dim, 1) for _ in range(n_blocks))
        self.projs = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_blocks))
        for p in self.projs:
            nn.init.zeros_(p.weight)
            nn.init.zeros_(p.bias)

    def features(self, maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T = maps.shape[:2]
        region = human_region(maps, self.patch, self.region_dilate)  # (B, T, N, 1)
        f = self.encode(patchify(maps, self.patch))  # (B, T, N, D)
        g = f.reshape(B * T, self.grid, self.grid, -1).permute(0, 3, 1, 2)
        m = region.reshape(B * T, 1, self.grid, self.grid)
        for conv in self.spread:
            g = g + F.gelu(conv(g)) * m  # spread sparse skeleton features to the neighbouring human-region tokens
        return g.permute(0, 2, 3, 1).reshape(f.shape), region

    def inject(self, i: int, h: torch.Tensor, f: torch.Tensor, region: torch.Tensor, t_emb: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.gates[i](torch.cat([f, t_emb[:, None, None].expand_as(f)], -1)))
        return h + gate * region * self.projs[i](f)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """(B, T, C, H, W) -> (B, T, N, C p p) with N = (H / p)(W / p)."""
    B, T, C, H, W = x.shape
    x = x.reshape(B, T, C, H // p, p, W // p, p).permute(0, 1, 3, 5, 2, 4, 6)
    return x.reshape(B, T, (H // p) * (W // p), C * p * p)


def unpatchify(x: torch.Tensor, p: int, C: int, H: int) -> torch.Tensor:
    B, T, N, _ = x.shape
    g = H // p
    return x.reshape(B, T, g, g, C, p, p).permute(0, 1, 4, 2, 5, 3, 6).reshape(B, T, C, H, H)


class VideoDiT(nn.Module):
    """Text-to-video flow-matching transformer; `control`: `hadc` (HADC injection), `concat` (structure maps stacked on
    the noisy input channels, plain control) or `none` (direct text-to-video)."""

    def __init__(self, vocab_size: int, num_frames: int, image_size: int, control: str = "hadc", control_channels: int = 6,
                 dim: int = 96, depth: int = 4, heads: int = 4, patch: int = 4, spread_steps: int = 2, region_dilate: int = 1):
        super().__init__()
        self.control, self.patch, self.image_size = control, patch, image_size
        self.grid = image_size // patch
        in_ch = 3 + (control_channels if control == "concat" else 0)
        self.text = TextEncoder(vocab_size, dim, 2, heads)
        self.inp = nn.Linear(in_ch * patch * patch, dim)
        self.pos_s = nn.Parameter(torch.randn(self.grid**2, dim) * 0.02)
        self.pos_t = nn.Parameter(torch.randn(num_frames, 1, dim) * 0.02)
        self.t_mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(STBlock(dim, heads) for _ in range(depth))
        self.hadc = None
        if control == "hadc":
            self.hadc = HADC(control_channels, dim, patch, self.grid, depth, spread_steps, region_dilate)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.out = nn.Linear(dim, 3 * patch * patch)
        for m in (self.final_ada[1], self.out):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
                maps: torch.Tensor | None = None) -> torch.Tensor:
        """Velocity (B, T, 3, H, W) of noisy video x_t at flow time t, given the caption and (optionally) structure maps."""
        x = torch.cat([x_t, maps], 2) if self.control == "concat" else x_t
        h = self.inp(patchify(x, self.patch)) + self.pos_s + self.pos_t
        t_emb = self.t_mlp(timestep_embedding(t, h.shape[-1]))
        c = t_emb + self.text(ids, mask)[1]
        f = region = None
        if self.hadc is not None:
            f, region = self.hadc.features(maps)
        for i, block in enumerate(self.blocks):
            if f is not None:
                h = self.hadc.inject(i, h, f, region, t_emb)
            h = block(h, c)
        shift, scale = self.final_ada(c)[:, None, None].chunk(2, -1)
        return unpatchify(self.out(modulate(self.norm(h), shift, scale)), self.patch, 3, self.image_size)
