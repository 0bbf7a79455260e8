"""Scale decomposition: exact inversion, band partition, sphere padding, consistency of Down/Up."""
from __future__ import annotations

import torch

from lit_iclr.storm.pyramid import down, laplacian_bands, laplacian_merge, pad_sphere, spectral_bands, spectral_masks, up


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
