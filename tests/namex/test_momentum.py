"""Complex momentum: phase 0 is heavy ball, and the real-pair update equals complex arithmetic."""
import cmath

import torch

from lit_iclr.namex.propagation import complex_momentum_step


def run(deltas, beta_abs, beta_phase):
    re = im = None  # mu^1 = 0
    out = []
    for d in deltas:
        re, im = complex_momentum_step(re, im, d, beta_abs, beta_phase)
        out.append((re, torch.zeros_like(d) if im is None else im))
    return out


def test_zero_phase_equals_heavy_ball():
    deltas = torch.randn(6, 10, dtype=torch.float64)
    v = torch.zeros(10, dtype=torch.float64)
    for d, (re, im) in zip(deltas, run(deltas, 0.9, 0.0), strict=True):
        v = 0.9 * v + d  # heavy ball: v <- beta v + g
        torch.testing.assert_close(re, v)
        assert im.abs().max() == 0


def test_matches_complex_arithmetic():
    deltas = torch.randn(5, 7, dtype=torch.float64)
    beta = 0.8 * cmath.exp(1j * torch.pi / 8)
    mu = torch.zeros(7, dtype=torch.complex128)
    for d, (re, im) in zip(deltas, run(deltas, 0.8, torch.pi / 8), strict=True):
        mu = beta * mu + d
        torch.testing.assert_close(re, mu.real)
        torch.testing.assert_close(im, mu.imag)


def test_phase_changes_the_real_trajectory():
    """A non-zero phase must actually differ from heavy ball (otherwise the complex part would be dead code)."""
    deltas = torch.ones(4, 3, dtype=torch.float64)
    assert not torch.allclose(run(deltas, 0.9, 0.0)[-1][0], run(deltas, 0.9, 1.0)[-1][0])
