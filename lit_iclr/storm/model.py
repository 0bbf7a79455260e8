"""STORM network (plain PyTorch): per-scale spatio-temporal encoders, cross-scale exchange, a head at every resolution.

Forward: history window -> scale bands (pyramid.py) -> one encoder per scale over time (ConvGRU, or temporal attention)
-> `num_blocks` rounds of [per-scale residual conv block; fine-to-coarse then coarse-to-fine gated exchange]
-> per-scale heads r^(s) synthesised coarse to fine: inc^(S-1) = r^(S-1), inc^(s) = Up(inc^(s+1)) + r^(s).
inc^(s) is the forecast increment at resolution s, so every resolution has its own forecast (commitment 3).
"""
from __future__ import annotations

import torch
from torch import nn

from .pyramid import area_weights, decompose, down, pad_sphere, up


def _signs(pole_sign: torch.Tensor | None, cin: int) -> torch.Tensor | None:
    """Per-input-channel pole signs: the given ones first (the physical fields), +1 for the rest."""
    if pole_sign is None:
        return None
    return torch.cat([pole_sign.float(), torch.ones(cin - pole_sign.numel())])


class SphereConv(nn.Conv2d):
    """k x k convolution that pads like the sphere (wrap in longitude, across the poles) instead of with zeros.
    pole_sign (cin,): sign of each input channel across the pole (-1 for wind components; see pad_sphere)."""

    def __init__(self, cin: int, cout: int, k: int = 3, periodic: bool = True, pole_sign: torch.Tensor | None = None):
        super().__init__(cin, cout, k, padding=0)
        self.p, self.periodic = k // 2, periodic
        self.register_buffer("pole_sign", _signs(pole_sign, cin), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(pad_sphere(x, self.p, self.periodic, self.pole_sign))


class ConvGRU(nn.Module):
    """Convolutional GRU run over the history window (the CPU-light temporal encoder)."""

    def __init__(self, cin: int, ch: int, periodic: bool, pole_sign: torch.Tensor | None = None):
        super().__init__()
        self.ch = ch
        self.gates = SphereConv(cin + ch, 2 * ch, 3, periodic, pole_sign)
        self.cand = SphereConv(cin + ch, ch, 3, periodic, pole_sign)

    def forward(self, seq: torch.Tensor, h: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, cin, H, W) new frames, h the state after the frames before them (None: start from 0) ->
        (features, state), both the new state (B, ch, H, W)."""
        B, T, _, H, W = seq.shape
        if h is None:
            h = seq.new_zeros(B, self.ch, H, W)
        for t in range(T):  # T is the short history window (2-4 steps), or 1 when the state is carried
            z, r = torch.sigmoid(self.gates(torch.cat([seq[:, t], h], 1))).chunk(2, 1)
            h = (1 - z) * h + z * torch.tanh(self.cand(torch.cat([seq[:, t], r * h], 1)))
        return h, h


class TemporalAttention(nn.Module):
    """Per-pixel self-attention over the history steps (with a learned step embedding); returns the last step."""

    def __init__(self, cin: int, ch: int, periodic: bool, history: int, heads: int = 4,
                 pole_sign: torch.Tensor | None = None):
        super().__init__()
        self.embed = SphereConv(cin, ch, 3, periodic, pole_sign)
        self.pos = nn.Parameter(torch.zeros(history, ch))
        self.attn = nn.MultiheadAttention(ch, heads if ch % heads == 0 else 1, batch_first=True)
        self.norm = nn.LayerNorm(ch)

    def forward(self, seq: torch.Tensor, cache: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, cin, H, W) new frames and the cached embeddings of the frames before them -> (features of the
        last frame, embeddings of the last `history` frames: the state carried to the next step)."""
        B, T, _, H, W = seq.shape
        e = self.embed(seq.flatten(0, 1)).unflatten(0, (B, T))           # (B, T, ch, H, W)
        if cache is not None:  # only the new frame is embedded; the window slides over the cached ones
            e = torch.cat([cache, e], 1)[:, -self.pos.shape[0]:]
        B, T = e.shape[:2]
        tok = e.permute(0, 3, 4, 1, 2).reshape(B * H * W, T, -1) + self.pos[:T]
        q = self.norm(tok)
        out = tok + self.attn(q, q, q, need_weights=False)[0]
        return out[:, -1].reshape(B, H, W, -1).permute(0, 3, 1, 2), e


class ResBlock(nn.Module):
    def __init__(self, ch: int, periodic: bool):
        super().__init__()
        self.norm = nn.GroupNorm(1, ch)
        self.c1 = SphereConv(ch, ch, 3, periodic)
        self.c2 = SphereConv(ch, ch, 3, periodic)
        nn.init.zeros_(self.c2.weight)
        nn.init.zeros_(self.c2.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.c2(nn.functional.gelu(self.c1(self.norm(x))))


class CrossScaleExchange(nn.Module):
    """Fine-to-coarse then coarse-to-fine gated messages between neighbouring scales (the 'synergy')."""

    def __init__(self, widths: list[int], periodic: bool):
        super().__init__()
        self.periodic = periodic
        pairs = list(zip(widths[:-1], widths[1:], strict=True))
        self.f2c = nn.ModuleList(SphereConv(a, b, 3, periodic) for a, b in pairs)
        self.f2c_gate = nn.ModuleList(nn.Conv2d(2 * b, b, 1) for _, b in pairs)
        self.c2f = nn.ModuleList(SphereConv(b, a, 3, periodic) for a, b in pairs)
        self.c2f_gate = nn.ModuleList(nn.Conv2d(2 * a, a, 1) for a, _ in pairs)

    def forward(self, h: list[torch.Tensor]) -> list[torch.Tensor]:
        h = list(h)
        for s in range(len(h) - 1):  # fine -> coarse: local events feed the large-scale state
            m = self.f2c[s](down(h[s]))
            h[s + 1] = h[s + 1] + torch.sigmoid(self.f2c_gate[s](torch.cat([h[s + 1], m], 1))) * m
        for s in reversed(range(len(h) - 1)):  # coarse -> fine: the large-scale flow steers the small scales
            m = self.c2f[s](up(h[s + 1], self.periodic))
            h[s] = h[s] + torch.sigmoid(self.c2f_gate[s](torch.cat([h[s], m], 1))) * m
        return h


class STORMNet(nn.Module):
    def __init__(self, channels: int, static_channels: int, forcing_channels: int, history: int, num_scales: int = 3,
                 hidden: list[int] | tuple[int, ...] = (32, 48, 64), num_blocks: int = 2, cross_scale: bool = True,
                 decomposition: str = "laplacian", encoder: str = "convgru", periodic: bool = True,
                 area: torch.Tensor | None = None, pole_sign: torch.Tensor | None = None):
        """
        Args:
            channels: Forecast variables C (input and output).
            static_channels: Static input fields (land-sea mask, orography ...).
            forcing_channels: Calendar forcings per time step (season, local solar time).
            history: Input time steps.
            num_scales: S, the number of scale bands and forecast resolutions (1 = a single-scale network).
            hidden: Feature width per scale, finest first (length num_scales).
            num_blocks: Rounds of per-scale processing + cross-scale exchange.
            cross_scale: Exchange information between scales (False: the no-synergy ablation).
            decomposition: `laplacian` (exactly invertible pyramid) or `spectral` (dyadic wavenumber bands).
            encoder: Temporal encoder per scale: `convgru` or `attention`.
            periodic: Global grid (wrap in longitude, cross the poles) rather than a regional box.
            area: Row area weights (H,) (cos latitude) of the finest grid: Down is then area-weighted (None: plain mean).
            pole_sign: (channels,) sign of each forecast variable across the pole (-1 for wind u, v; None: all +1).
        """
        super().__init__()
        if len(hidden) != num_scales:
            raise ValueError(f"hidden needs one width per scale ({num_scales}), got {list(hidden)}")
        self.S, self.periodic, self.decomposition, self.cross_scale = num_scales, periodic, decomposition, cross_scale
        cin = channels + static_channels + forcing_channels
        self.register_buffer("area", None if area is None else torch.as_tensor(area).float(), persistent=False)
        self.register_buffer("pole_sign", None if pole_sign is None else torch.as_tensor(pole_sign).float(),
                             persistent=False)
        if encoder == "convgru":
            self.encoders = nn.ModuleList(ConvGRU(cin, w, periodic, pole_sign) for w in hidden)
        elif encoder == "attention":
            self.encoders = nn.ModuleList(TemporalAttention(cin, w, periodic, history, pole_sign=pole_sign)
                                          for w in hidden)
        else:
            raise ValueError(f"encoder must be 'convgru' or 'attention', got {encoder!r}")
        self.target_forcing = nn.ModuleList(nn.Conv2d(forcing_channels, w, 1) for w in hidden)
        self.blocks = nn.ModuleList(nn.ModuleList(ResBlock(w, periodic) for w in hidden) for _ in range(num_blocks))
        self.exchange = nn.ModuleList(CrossScaleExchange(list(hidden), periodic) for _ in range(num_blocks)) \
            if cross_scale and num_scales > 1 else None
        self.heads = nn.ModuleList(nn.Conv2d(w, channels, 1) for w in hidden)

    def forward(self, x: torch.Tensor, static: torch.Tensor, forcing: torch.Tensor) -> list[torch.Tensor]:
        """x (B, T, C, H, W), static (B, S_c, H, W), forcing (B, T+1, F, H, W) -> increments [inc^(0), ..., inc^(S-1)]
        with inc^(s) of shape (B, C, H / 2^s, W / 2^s)."""
        return self.advance(x, static, forcing)[0]

    def advance(self, x: torch.Tensor, static: torch.Tensor, forcing: torch.Tensor, state: list | None = None
                ) -> tuple[list[torch.Tensor], list]:
        """Like `forward`, continuing the per-scale encoder `state` of the frames before x (None: x is the whole
        history); returns (increments, new state). A rollout feeds only its newest forecast frame with the state of
        the previous step instead of re-encoding the whole window: the encoders' memory runs through the rollout."""
        T = x.shape[1]
        state = state or [None] * self.S
        new_state = []
        ws = area_weights(self.area, self.S)
        bands = decompose(x, self.S, self.periodic, self.decomposition, self.area, self.pole_sign)
        h = []
        st, fo = static, forcing
        for s in range(self.S):
            if s:
                st, fo = down(st, ws[s - 1]), down(fo, ws[s - 1])
            inp = torch.cat([bands[s], st[:, None].expand(-1, T, -1, -1, -1), fo[:, :T]], 2)
            feat, st_s = self.encoders[s](inp, state[s])
            new_state.append(st_s)
            h.append(feat + self.target_forcing[s](fo[:, T]))
        for k, blocks in enumerate(self.blocks):
            h = [blk(hs) for blk, hs in zip(blocks, h, strict=True)]
            if self.exchange is not None:
                h = self.exchange[k](h)
        r = [head(hs) for head, hs in zip(self.heads, h, strict=True)]
        inc = [r[-1]]
        for s in reversed(range(self.S - 1)):  # Laplacian synthesis, coarse to fine
            inc.insert(0, up(inc[0], self.periodic, self.pole_sign) + r[s])
        return inc, new_state
