"""Scale disentangling on the lat-lon grid (STORM commitment 1): planetary -> local.

`laplacian`: x^(s+1) = Down(x^(s)), detail d^(s) = x^(s) - Up(x^(s+1)); the bands {d^(0), ..., d^(S-2), x^(S-1)} sum back
exactly: x = d^(0) + Up(d^(1) + Up(... + Up(x^(S-1)))). `spectral`: a band split of the 2-D spectrum (FFT along the
periodic longitude, cosine transform along latitude) into S dyadic wavenumber bands, band s pooled to resolution s.
Down is a 2x2 mean, area-weighted (cos latitude) when the row weights are given; Up is bilinear interpolation with the
sphere's wrap-around in longitude. Across a pole the grid's east/west and north/south directions reverse, so wind
components u and v change sign there (`pole_sign`, -1 on those channels).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def pad_sphere(x: torch.Tensor, p: int, periodic: bool, pole_sign: torch.Tensor | None = None) -> torch.Tensor:
    """Pad (..., H, W) by p: longitude wraps around on a global grid; latitude rows are continued across the pole
    (the row on the other side of the pole, half a turn away) on a global grid, replicated on a regional one.
    pole_sign (C,): multiplies the rows continued across the pole per channel (-1 for the wind components u, v, whose
    local east and north point the other way there); x is then (..., C, H, W)."""
    if p == 0:
        return x
    if periodic:
        W = x.shape[-1]
        south = torch.roll(x[..., :p, :].flip(-2), W // 2, -1)   # ascending latitude: row 0 is the southernmost
        north = torch.roll(x[..., -p:, :].flip(-2), W // 2, -1)
        if pole_sign is not None:
            sign = pole_sign.to(x.dtype)[:, None, None]
            south, north = south * sign, north * sign
        x = torch.cat([south, x, north], -2)
        return torch.cat([x[..., -p:], x, x[..., :p]], -1)
    shape = x.shape
    y = F.pad(x.reshape(-1, 1, *shape[-2:]), (p, p, p, p), mode="replicate")
    return y.reshape(*shape[:-2], *y.shape[-2:])


def coarser_weights(w: torch.Tensor) -> torch.Tensor:
    """Row area weights (H,) -> (H/2,): a coarse cell's area is the sum of its two rows' (kept as their mean)."""
    return w.reshape(-1, 2).mean(1)


def area_weights(w: torch.Tensor | None, num_scales: int) -> list[torch.Tensor | None]:
    """Row weights at every resolution, finest first ([None] * S when w is None: plain means)."""
    out = [w]
    for _ in range(num_scales - 1):
        out.append(None if out[-1] is None else coarser_weights(out[-1]))
    return out


def down(x: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    """2x2 coarsening, resolution s -> s+1: sum_i a_i x_i / sum_i a_i with a_i the cell area (cos latitude) of the
    row weights w (H,), or the plain mean when w is None."""
    shape = x.shape
    flat = x.reshape(-1, 1, *shape[-2:])
    if w is None:
        y = F.avg_pool2d(flat, 2)
    else:
        w = w.to(x.dtype)
        y = F.avg_pool2d(flat * w[:, None], 2) / coarser_weights(w)[:, None]
    return y.reshape(*shape[:-2], *y.shape[-2:])


def up(x: torch.Tensor, periodic: bool, pole_sign: torch.Tensor | None = None) -> torch.Tensor:
    """Bilinear x2 upsampling (cell-centred), wrapping in longitude on a global grid (pole_sign: see pad_sphere)."""
    shape = x.shape
    y = pad_sphere(x, 1, periodic, pole_sign)
    y = y.reshape(-1, 1, *y.shape[-2:])
    y = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)[..., 2:-2, 2:-2]
    return y.reshape(*shape[:-2], *y.shape[-2:])


def laplacian_bands(x: torch.Tensor, num_scales: int, periodic: bool, w: torch.Tensor | None = None,
                    pole_sign: torch.Tensor | None = None) -> list[torch.Tensor]:
    """[d^(0) (H, W), d^(1) (H/2, W/2), ..., x^(S-1) (H/2^(S-1), ...)]; `laplacian_merge` inverts it exactly."""
    bands, cur = [], x
    for ws in area_weights(w, num_scales)[:-1]:
        coarse = down(cur, ws)
        bands.append(cur - up(coarse, periodic, pole_sign))
        cur = coarse
    bands.append(cur)
    return bands


def laplacian_merge(bands: list[torch.Tensor], periodic: bool, pole_sign: torch.Tensor | None = None) -> torch.Tensor:
    cur = bands[-1]
    for d in reversed(bands[:-1]):
        cur = d + up(cur, periodic, pole_sign)
    return cur


def spectral_masks(H: int, W: int, num_scales: int, device=None) -> torch.Tensor:
    """(S, 2H, W//2+1) 0/1 masks partitioning the (lat-mirrored) 2-D spectrum into dyadic bands, coarsest last."""
    ky = torch.fft.fftfreq(2 * H, device=device).abs() * 2 * H / 2   # latitude wavenumber of the mirrored field
    kx = torch.fft.rfftfreq(W, device=device) * W                     # zonal wavenumber
    k = torch.sqrt((ky[:, None] / (H / 2)) ** 2 + (kx[None, :] / (W / 2)) ** 2)  # 1 at the finest resolvable scale
    edges = [2.0 ** -(s + 1) for s in range(num_scales - 1)]           # s-th band: (2^-(s+1), 2^-s]
    masks = []
    for s in range(num_scales):
        hi = 1e9 if s == 0 else edges[s - 1]
        lo = edges[s] if s < num_scales - 1 else -1.0
        masks.append(((k > lo) & (k <= hi)).float())
    return torch.stack(masks)


def spectral_bands(x: torch.Tensor, num_scales: int, periodic: bool, w: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Band-pass components (they sum to x at full resolution); band s is pooled to resolution s."""
    H, W = x.shape[-2:]
    mirrored = torch.cat([x, x.flip(-2)], -2)  # even extension in latitude: a cosine transform, no seam at the poles
    X = torch.fft.rfft2(mirrored, norm="ortho")
    masks = spectral_masks(H, W, num_scales, x.device)
    ws, out = area_weights(w, num_scales), []
    for s in range(num_scales):
        band = torch.fft.irfft2(X * masks[s], s=(2 * H, W), norm="ortho")[..., :H, :]
        for j in range(s):
            band = down(band, ws[j])
        out.append(band)
    return out


def decompose(x: torch.Tensor, num_scales: int, periodic: bool, method: str = "laplacian", w: torch.Tensor | None = None,
              pole_sign: torch.Tensor | None = None) -> list[torch.Tensor]:
    if method == "laplacian":
        return laplacian_bands(x, num_scales, periodic, w, pole_sign)
    if method == "spectral":
        return spectral_bands(x, num_scales, periodic, w)
    raise ValueError(f"decomposition must be 'laplacian' or 'spectral', got {method!r}")
