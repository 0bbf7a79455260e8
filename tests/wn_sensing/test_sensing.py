"""The sensing operator, its adjoint, the objective's gradients, and the solvers' rates on a small problem."""
from __future__ import annotations

import math

import pytest
import torch

from lit_iclr.wn_sensing.algorithms import SolverConfig, solve
from lit_iclr.wn_sensing.manifold import random_stiefel
from lit_iclr.wn_sensing.problem import synthetic_target
from lit_iclr.wn_sensing.sensing import SensingOperator, loss, sample_operator

G = lambda s=0: torch.Generator().manual_seed(s)  # noqa: E731


def sym_rand(m, seed):
    z = torch.randn(m, m, generator=G(seed), dtype=torch.float64)
    return (z + z.T) / 2


@pytest.mark.parametrize("kind", ["gaussian", "rank_one"])
def test_adjoint_identity_and_factored_form(kind):
    m, n = 7, 50
    op = SensingOperator(kind, sample_operator(kind, n, m, G(1)), m)
    z, r = sym_rand(m, 2), torch.randn(n, generator=G(3), dtype=torch.float64)
    assert torch.allclose(op(z) @ r, (z * op.adjoint(r)).sum(), atol=1e-10)  # <M(Z), r> = <Z, M*(r)>
    # against the explicit measurement matrices M_i
    mats = op.tensor.reshape(n, m, m) if kind == "gaussian" else torch.einsum("ij,ik->ijk", op.tensor, op.tensor)
    assert torch.allclose(op(z), torch.einsum("ijk,jk->i", mats, z), atol=1e-10)
    x, theta = random_stiefel(m, 3, G(4)), sym_rand(3, 5)
    assert torch.allclose(op.factored(x, theta), torch.einsum("ijk,jk->i", mats, x @ theta @ x.T), atol=1e-10)


def test_gaussian_operator_is_isotropic_on_average():
    """E ||M(Z)||^2 = ||Z||_F^2 for symmetric Z (the normalisation behind RIP): Monte Carlo over many measurements."""
    m, n = 6, 20000
    op = SensingOperator("gaussian", sample_operator("gaussian", n, m, G(6)), m)
    z = sym_rand(m, 7)
    assert math.isclose(float(op(z).pow(2).sum()), float(z.pow(2).sum()), rel_tol=0.03)


@pytest.mark.parametrize("kind", ["gaussian", "rank_one"])
def test_gradients_match_closed_form_and_finite_differences(kind):
    m, r, n = 6, 3, 40
    op = SensingOperator(kind, sample_operator(kind, n, m, G(8)), m)
    y = torch.randn(n, generator=G(9), dtype=torch.float64)
    x = random_stiefel(m, r, G(10)).requires_grad_()
    theta = sym_rand(r, 11).requires_grad_()
    f = loss(op, y, x, theta)
    gx, gt = torch.autograd.grad(f, (x, theta))
    s = op.adjoint(op.factored(x, theta) - y).detach()       # S = M*(M(X Theta X^T) - y)
    assert torch.allclose(gx, s @ x.detach() @ theta.detach(), atol=1e-10)   # grad_X f = S X Theta
    assert torch.allclose(gt, 0.5 * x.detach().T @ s @ x.detach(), atol=1e-10)  # grad_Theta f = 1/2 X^T S X
    assert torch.autograd.gradcheck(lambda a, b: loss(op, y, a, b), (x, theta))


def small_problem(seed=0, m=20, ra=2, per_dof=10):
    g = G(seed)
    a = synthetic_target(m, ra, 2.0, g)
    n = per_dof * (m * ra - ra * (ra - 1) // 2)
    op = SensingOperator("gaussian", sample_operator("gaussian", n, m, g), m)
    return op, op(a), a


def test_wn_rgd_converges_linearly_where_overparameterised_gd_stalls():
    op, y, a = small_problem()
    wn = solve(SolverConfig(method="wn_rgd", rank=6, lr=1.0, lr_theta=1.0), op, y, a, 400, tol=1e-9)["errors"]
    gd = solve(SolverConfig(method="gd", rank=6, lr=0.5), op, y, a, 400)["errors"]
    assert wn[-1] < 1e-9 and len(wn) < 400
    assert gd[-1] > 1e-5  # sublinear: far from converged after the same number of iterations
    # linear phase: the log-error drops by about the same amount in each of the last stretches
    tail = torch.log10(wn[len(wn) // 2:])
    drops = (tail[:-20] - tail[20:])
    assert drops.min() > 0.3 * drops.mean()


def test_exact_rank_gd_converges():
    op, y, a = small_problem(1)
    gd = solve(SolverConfig(method="gd", rank=2, lr=0.5), op, y, a, 600, tol=1e-8)["errors"]
    assert gd[-1] < 1e-8
