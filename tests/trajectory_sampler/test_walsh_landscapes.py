"""Walsh-Fourier transform against the brute-force sum, and the landscapes against their definitions."""
from __future__ import annotations

import math

import torch

from lit_iclr.trajectory_sampler.landscapes import BooleanLandscape, GaussianModes2D, MotifLandscape, all_binary
from lit_iclr.trajectory_sampler.walsh import degrees, energy_per_degree, recovered_per_degree, walsh_coefficients


def test_walsh_matches_the_brute_force_definition():
    n = 5
    X = all_binary(n)
    f = torch.randn(2**n, dtype=torch.float64)
    S = 2 * X.double() - 1
    T = all_binary(n).bool()
    chi = torch.stack([torch.where(t, S, torch.ones_like(S)).prod(-1) for t in T])  # chi_T(x)
    brute = (chi * f).mean(-1)
    assert torch.allclose(walsh_coefficients(f), brute, atol=1e-12)
    assert torch.allclose((chi.T @ brute), f, atol=1e-10)  # f = sum_T fhat(T) chi_T
    e = energy_per_degree(f)
    assert torch.isclose(e.sum(), (f**2).mean())  # Parseval
    assert torch.allclose(e[2], (brute[degrees(n) == 2] ** 2).sum())


def test_a_monomial_lives_in_its_degree_and_the_needle_spreads_over_all_degrees():
    n = 6
    X = all_binary(n)
    s = 2 * X - 1
    e = energy_per_degree(s[:, 0] * s[:, 2] * s[:, 5])
    assert torch.isclose(e[3], torch.tensor(1.0, dtype=e.dtype)) and e.sum() - e[3] < 1e-12
    needle = X[:, :4].prod(-1)  # prod x_i = 2^-4 sum_{T subset S} s_T: binom(4, d) / 2^8 per degree d
    e = energy_per_degree(needle)
    expected = torch.tensor([math.comb(4, d) / 256 for d in range(5)] + [0, 0], dtype=e.dtype)
    assert torch.allclose(e, expected)
    r = recovered_per_degree(0.5 * needle, needle)
    assert torch.allclose(r[:5], torch.full((5,), 0.75, dtype=r.dtype))


def test_boolean_landscape_definition():
    f = BooleanLandscape.generate(n=8, needle_size=3, needle_height=5.0, deception=1.0, seed=1)
    X = all_binary(8)
    s = 2 * X - 1
    h, J = torch.tensor(f.h), torch.tensor(f.J)
    brute = torch.stack([s[i] @ h + sum(J[a, b] * s[i, a] * s[i, b] for a in range(8) for b in range(a + 1, 8))
                         for i in range(0, 256, 17)])
    xs = X[::17][:, f.needle]
    brute = brute + 5.0 * xs.prod(-1) - xs.sum(-1)
    assert torch.allclose(f(X[::17]), brute, atol=1e-5)
    assert int(f.in_needle(X).sum()) == 2 ** (8 - 3)


def test_motif_landscape_definition():
    f = MotifLandscape.generate(length=10, motifs=2, width=3, pairs=3, seed=2)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 4, (5, 10), generator=g)
    x = torch.nn.functional.one_hot(idx, 4).float()
    pwms = torch.tensor(f.pwms)
    brute = []
    for row in idx:
        total = 0.0
        for m in range(2):
            per = torch.tensor([sum(float(pwms[m, j, row[p + j]]) for j in range(3)) for p in range(8)])
            total += float(torch.logsumexp(per, 0))
        for (i, j), (a, b), w in zip(f.pair_pos, f.pair_letters, f.pair_weight, strict=True):
            total += w * float(row[i] == a and row[j] == b)
        brute.append(total)
    assert torch.allclose(f(x), torch.tensor(brute), atol=1e-4)


def test_gaussian_modes_density_integrates_to_one_and_is_floored():
    f = GaussianModes2D.generate(modes=4, radius=2.0, sigma=0.3, floor=-50.0)
    grid = torch.linspace(-4, 4, 401)
    xy = torch.stack(torch.meshgrid(grid, grid, indexing="ij"), -1).reshape(-1, 2)
    mass = f(xy).exp().sum() * (grid[1] - grid[0]) ** 2
    assert abs(float(mass) - 1) < 1e-3
    assert float(GaussianModes2D.generate(floor=-12.0)(torch.tensor([[0.0, 0.0]]))) == -12.0
