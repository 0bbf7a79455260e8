"""The generator's spectral transforms against torch-harmonics and calculus; a short run stays finite and conserves mass."""
from __future__ import annotations

import math

import torch
import torch_harmonics as th

from lit_iclr.storm.planet import A_EARTH, MoistShallowWater, PlanetConfig, SpectralTransforms


def test_fused_transforms_match_torch_harmonics():
    nlat, nlon, L = 16, 32, 11
    tr = SpectralTransforms(nlat, nlon, L)
    kw = dict(lmax=L, mmax=L, grid="legendre-gauss", csphase=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, nlat, nlon, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, nlat, nlon, generator=g, dtype=torch.float64)
    spec = tr.analysis(x, v)
    as_complex = lambda s: torch.view_as_complex(s.permute(1, 3, 0, 2).contiguous())  # (n, l, m)
    torch.testing.assert_close(as_complex(spec[:, :2]), th.RealSHT(nlat, nlon, **kw).double()(x))
    torch.testing.assert_close(as_complex(spec[:, 2:]), th.RealVectorSHT(nlat, nlon, **kw).double()(v[0]))
    grid, vec = tr.synthesis(spec, 2)
    torch.testing.assert_close(grid, th.InverseRealSHT(nlat, nlon, **kw).double()(as_complex(spec[:, :2])))


def test_vorticity_of_solid_body_rotation():
    model = MoistShallowWater(PlanetConfig())
    LAT = model.LAT
    u = torch.stack([20 * torch.cos(LAT), torch.zeros_like(LAT)])[None]
    spec = model.tr.analysis(torch.zeros(0, *LAT.shape, dtype=torch.float64), u)
    vort = model.tr.synthesis(-model.lam * A_EARTH * spec[:, :1], 1)[0][0]
    torch.testing.assert_close(vort, 2 * 20 * torch.sin(LAT) / A_EARTH, rtol=0, atol=1e-12)  # zeta = 2U sin(lat)/a


def test_short_integration_is_finite_and_keeps_its_mean_depth():
    model = MoistShallowWater(PlanetConfig(), seed=1)
    spec = model.initial_state()
    # global mean of phi' is the (l=0, m=0) coefficient: fluxes are divergences and the convective source has its
    # mean removed, so only the slow relaxation towards the equilibrium thickness moves it
    m0 = spec[0, 2, 0, 0].item()
    for _ in range(48):  # one day
        spec, cond = model.step(spec)
    grid, _ = model.tr.synthesis(spec, 6)
    assert torch.isfinite(grid).all() and (cond >= 0).all()
    assert abs(spec[0, 2, 0, 0].item() - m0) < 0.01 * abs(m0)
    assert grid[3].min() > 200 and grid[3].max() < 330  # temperature stays physical
    assert math.isfinite(model.t) and model.t == 48 * 1800.0
