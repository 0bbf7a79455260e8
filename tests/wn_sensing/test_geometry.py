"""The Stiefel geometry and the optimizer: orthonormality after every retraction, tangent gradients, generic use."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.wn_sensing.manifold import random_stiefel, retract, tangent_project
from lit_iclr.wn_sensing.optim import ScaledGD, StiefelRGD, mark_stiefel

G = lambda s=0: torch.Generator().manual_seed(s)  # noqa: E731


@pytest.mark.parametrize("method", ["qr", "polar"])
def test_retraction_is_orthonormal_and_first_order(method):
    x = random_stiefel(30, 7, G(1))
    v = tangent_project(x, torch.randn(30, 7, generator=G(2), dtype=torch.float64))
    for t in (1e-1, 1e-3):
        y = retract(x + t * v, method)
        assert torch.allclose(y.T @ y, torch.eye(7, dtype=torch.float64), atol=1e-12)
        # a retraction agrees with the straight step to first order: ||R(x + tv) - (x + tv)|| = O(t^2)
        assert (y - (x + t * v)).norm() < 5 * t**2 * v.norm() ** 2 + 1e-12
    assert torch.allclose(retract(x, method), x, atol=1e-12)  # R_x(0) = x (the QR sign fix makes this hold)


def test_polar_is_the_closest_orthonormal_matrix():
    y = torch.randn(10, 4, generator=G(3), dtype=torch.float64)
    p = retract(y, "polar")
    for s in range(20):  # no other orthonormal matrix is closer to y
        q = random_stiefel(10, 4, G(100 + s))
        assert (p - y).norm() <= (q - y).norm() + 1e-12


def test_riemannian_gradient_lies_in_the_tangent_space():
    x = random_stiefel(20, 5, G(4))
    g = tangent_project(x, torch.randn(20, 5, generator=G(5), dtype=torch.float64))
    skew = x.T @ g + g.T @ x
    assert skew.abs().max() < 1e-12
    # projecting twice changes nothing (a projection), and a tangent vector is kept
    assert torch.allclose(tangent_project(x, g), g, atol=1e-12)


def test_stiefel_rgd_keeps_x_orthonormal_and_theta_symmetric_every_step():
    torch.manual_seed(0)
    x = mark_stiefel(torch.nn.Parameter(random_stiefel(15, 4, G(6))))
    theta = torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
    target = torch.randn(15, 15, dtype=torch.float64)
    target = target + target.T
    opt = StiefelRGD([x, theta], lr=0.05, lr_euclidean=0.05, symmetric=True)
    first = None
    for _ in range(50):
        opt.zero_grad()
        f = (x @ theta @ x.T - target).pow(2).sum()
        first = first if first is not None else float(f.detach())
        f.backward()
        opt.step()
        assert (x.T @ x - torch.eye(4, dtype=torch.float64)).abs().max() < 1e-10
        assert torch.equal(theta, theta.T)
    assert float(f) < first


def test_stiefel_rgd_trains_a_direction_magnitude_linear_layer():
    """The same optimizer on a DoRA-style layer: W = X Theta with X (out x r) on the Stiefel manifold."""
    torch.manual_seed(1)
    w_true = torch.randn(8, 3, dtype=torch.float64)
    inputs = torch.randn(200, 3, dtype=torch.float64)
    x = mark_stiefel(torch.nn.Parameter(random_stiefel(8, 3, G(7))))
    mag = torch.nn.Parameter(torch.eye(3, dtype=torch.float64))
    opt = StiefelRGD([x, mag], lr=0.1, lr_euclidean=0.1)
    for _ in range(400):
        opt.zero_grad()
        f = (inputs @ (x @ mag).T - inputs @ w_true.T).pow(2).mean()
        f.backward()
        opt.step()
    assert float(f) < 1e-3 and (x.T @ x - torch.eye(3, dtype=torch.float64)).abs().max() < 1e-10


def test_mark_stiefel_refuses_wide_matrices():
    with pytest.raises(ValueError, match="m >= r"):
        mark_stiefel(torch.nn.Parameter(torch.zeros(3, 5)))


def test_scaled_gd_step_is_the_preconditioned_formula():
    y0 = torch.randn(9, 3, generator=G(8), dtype=torch.float64)
    grad = torch.randn(9, 3, generator=G(9), dtype=torch.float64)
    p = torch.nn.Parameter(y0.clone())
    p.grad = grad.clone()
    ScaledGD([p], lr=0.3, damping="fixed", damping_value=0.1).step()
    expected = y0 - 0.3 * grad @ torch.linalg.inv(y0.T @ y0 + 0.1 * torch.eye(3, dtype=torch.float64))
    assert torch.allclose(p.detach(), expected, atol=1e-12)
