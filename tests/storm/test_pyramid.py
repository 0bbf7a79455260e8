"""Scale decomposition: exact inversion, band partition, sphere padding, consistency of Down/Up."""
from __future__ import annotations

import torch

from lit_iclr.storm.pyramid import (
    coarser_weights,
    down,
    laplacian_bands,
    laplacian_merge,
    pad_sphere,
    spectral_bands,
    spectral_masks,
    up,
)


def test_laplacian_pyramid_is_exactly_invertible():
    x = torch.randn(2, 3, 32, 64, dtype=torch.float64)
    for periodic in (True, False):
        bands = laplacian_bands(x, 4, periodic)
        assert [b.shape[-2:] for b in bands] == [(32, 64), (16, 32), (8, 16), (4, 8)]
        torch.testing.assert_close(laplacian_merge(bands, periodic), x, rtol=0, atol=1e-12)
    # the coarsest band is the 2^3 block mean
    torch.testing.assert_close(bands[-1], x.reshape(2, 3, 4, 8, 8, 8).mean((3, 5)))


def test_spectral_bands_partition_the_spectrum():
    masks = spectral_masks(16, 32, 3)
    torch.testing.assert_close(masks.sum(0), torch.ones_like(masks[0]))  # every wavenumber in exactly one band
    x = torch.randn(1, 16, 32, dtype=torch.float64)
    full = torch.zeros_like(x)
    X = torch.fft.rfft2(torch.cat([x, x.flip(-2)], -2), norm="ortho")
    for m in masks.double():
        full += torch.fft.irfft2(X * m, s=(32, 32), norm="ortho")[..., :16, :]
    torch.testing.assert_close(full, x)
    # a planetary wave (zonal wavenumber 1) lands in the coarsest band, a grid-scale wave in the finest
    lon = torch.arange(32) * 2 * torch.pi / 32
    slow = torch.cos(lon).expand(1, 16, 32).double()
    fast = torch.cos(14 * lon).expand(1, 16, 32).double()
    b_slow, b_fast = spectral_bands(slow, 3, True), spectral_bands(fast, 3, True)
    assert b_slow[0].abs().max() < 1e-6 and b_slow[2].abs().max() > 0.5
    assert b_fast[0].abs().max() > 0.9 and b_fast[2].abs().max() < 1e-6


def test_pad_sphere_wraps_longitude_and_crosses_the_poles():
    x = torch.arange(4 * 8, dtype=torch.float64).reshape(4, 8)
    p = pad_sphere(x, 1, periodic=True)
    assert p.shape == (6, 10)
    torch.testing.assert_close(p[1:-1, 0], x[:, -1])          # west of column 0 is the last column
    torch.testing.assert_close(p[1:-1, -1], x[:, 0])
    # beyond the southern row (ascending latitude) is the same row half a turn away
    torch.testing.assert_close(p[0, 1:-1], torch.roll(x[0], 4))
    torch.testing.assert_close(p[-1, 1:-1], torch.roll(x[-1], 4))
    r = pad_sphere(x, 1, periodic=False)
    torch.testing.assert_close(r[0, 1:-1], x[0])               # regional box: replicate


def test_down_of_up_preserves_smooth_fields_and_constants():
    c = torch.full((1, 8, 16), 3.0)
    torch.testing.assert_close(up(c, True), torch.full((1, 16, 32), 3.0))
    torch.testing.assert_close(down(up(c, True)), c)
    x = torch.randn(1, 8, 16)
    assert (down(up(x, True)) - x).abs().max() < x.abs().max()  # bilinear: close, not the identity


def _solid_wind(lat_deg: torch.Tensor, lon_deg: torch.Tensor) -> torch.Tensor:
    """(3, H, W): u, v of a uniform 3-D flow a (east/north components at each point) and the scalar a . r, written as
    the smooth functions of (lat, lon) they are, so they can be evaluated past the pole (lat > 90 or < -90)."""
    a = torch.tensor([0.3, -0.7, 0.2], dtype=torch.float64)
    la, lo = torch.deg2rad(lat_deg)[:, None], torch.deg2rad(lon_deg)[None, :]
    east = torch.stack([-torch.sin(lo).expand_as(la * lo), torch.cos(lo).expand_as(la * lo), torch.zeros_like(la * lo)])
    north = torch.stack([-torch.sin(la) * torch.cos(lo), -torch.sin(la) * torch.sin(lo), torch.cos(la).expand_as(la * lo)])
    r = torch.stack([torch.cos(la) * torch.cos(lo), torch.cos(la) * torch.sin(lo), torch.sin(la).expand_as(la * lo)])
    dot = lambda e: (a[:, None, None] * e).sum(0)
    return torch.stack([dot(east), dot(north), dot(r)])


def test_pad_sphere_flips_wind_components_across_the_pole():
    # Grid rows continued past the pole are the smooth continuation of the fields in (lat, lon): the halo row beyond
    # the northernmost latitude phi is the analytic field at latitude 180 - phi (and -180 - phi in the south).
    # For the scalar that equals the value half a turn away; for u and v it is minus that value.
    H, W, p = 8, 16, 2
    lat = -78.75 + 22.5 * torch.arange(H, dtype=torch.float64)   # ascending, no poles
    lon = 22.5 * torch.arange(W, dtype=torch.float64)
    x = _solid_wind(lat, lon)
    sign = torch.tensor([-1.0, -1.0, 1.0])
    padded = pad_sphere(x, p, True, sign)
    north = _solid_wind(180 - lat[-p:].flip(0), lon)           # halo rows H, H+1 continue past the north pole
    south = _solid_wind(-180 - lat[:p].flip(0), lon)           # halo rows -2, -1 continue past the south pole
    torch.testing.assert_close(padded[:, -p:, p:-p], north)
    torch.testing.assert_close(padded[:, :p, p:-p], south)
    torch.testing.assert_close(padded[:, p:-p, p:-p], x)
    # without the sign the wind halo is the negated truth (and the scalar halo is right either way)
    plain = pad_sphere(x, p, True)
    torch.testing.assert_close(plain[:2, -p:, p:-p], -north[:2])
    torch.testing.assert_close(plain[2, -p:, p:-p], north[2])
    # up() over the pole uses the same halo: bilinear upsampling of the smooth wind has no seam at the poles
    fine_lat = -84.375 + 11.25 * torch.arange(2 * H, dtype=torch.float64)
    fine = _solid_wind(fine_lat, 11.25 * torch.arange(2 * W, dtype=torch.float64))
    err_signed = (up(x, True, sign) - fine)[:, [0, -1]].abs().max()
    err_plain = (up(x, True) - fine)[:2, [0, -1]].abs().max()
    assert err_signed < 0.1 and err_plain > 3 * err_signed


def test_area_weighted_down_matches_brute_force_and_conserves_the_area_mean():
    H, W = 8, 6
    lat = -78.75 + 22.5 * torch.arange(H, dtype=torch.float64)
    a = torch.cos(torch.deg2rad(lat))
    x = torch.randn(2, H, W, dtype=torch.float64)
    got = down(x, a)
    want = torch.empty(2, H // 2, W // 2, dtype=torch.float64)
    for i in range(H // 2):
        for j in range(W // 2):
            rows = [2 * i, 2 * i + 1]
            num = sum(a[r] * x[:, r, 2 * j:2 * j + 2].sum(-1) for r in rows)
            want[:, i, j] = num / (2 * (a[rows[0]] + a[rows[1]]))
    torch.testing.assert_close(got, want)
    # the area-weighted global mean (a conserved quantity) is the same on both grids; the plain mean breaks it
    mean = lambda f, w: (f * w[:, None]).sum((-2, -1)) / (w.sum() * f.shape[-1])
    a2 = coarser_weights(a)
    torch.testing.assert_close(mean(got, a2), mean(x, a))
    assert (mean(down(x), a2) - mean(x, a)).abs().max() > 1e-3
    # the pyramid stays exactly invertible with area weights and the sign flip
    y = torch.randn(2, 3, 16, 32, dtype=torch.float64)
    w16 = torch.cos(torch.deg2rad(-84.375 + 11.25 * torch.arange(16, dtype=torch.float64)))
    sign = torch.tensor([1.0, -1.0, -1.0])
    bands = laplacian_bands(y, 3, True, w16, sign)
    torch.testing.assert_close(bands[-1], down(down(y, w16), coarser_weights(w16)))
    torch.testing.assert_close(laplacian_merge(bands, True, sign), y, rtol=0, atol=1e-12)
