"""The Nash solver against its optimality condition, closed forms and an independent convex solver."""
import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from lit_iclr.namex.nash import nash_residual, nash_weights, normalize_gram


def random_gram(batch, n, p, seed=0):
    g = torch.Generator().manual_seed(seed)
    tau = torch.randn(batch, n, p, generator=g, dtype=torch.float64)
    tau = tau * torch.rand(batch, n, 1, generator=g, dtype=torch.float64).add(0.1) * 5  # unequal norms
    return tau @ tau.transpose(-1, -2)


@pytest.mark.parametrize("n,p", [(2, 10), (3, 40), (7, 64)])
def test_residual_below_1e6_batched(n, p):
    G = random_gram(64, n, p)
    alpha = nash_weights(G)
    assert alpha.shape == (64, n)
    assert (alpha > 0).all()
    assert nash_residual(G, alpha).max() < 1e-6


def test_diagonal_gram_gives_inverse_sqrt():
    d = torch.tensor([[4.0, 1.0, 0.25], [9.0, 2.0, 100.0]], dtype=torch.float64)
    alpha = nash_weights(torch.diag_embed(d))
    torch.testing.assert_close(alpha, d.rsqrt(), rtol=1e-12, atol=0)


def test_orthogonal_domain_vectors_contribute_unit_norm():
    """alpha_i = 1/||tau_i|| for orthogonal tau: every expert contributes ||alpha_i tau_i|| = 1 (the balance claim)."""
    tau = torch.diag(torch.tensor([0.5, 3.0, 10.0], dtype=torch.float64))
    alpha = nash_weights(tau @ tau.T)
    torch.testing.assert_close((alpha[:, None] * tau).norm(dim=1), torch.ones(3, dtype=torch.float64))


def test_matches_independent_convex_solver():
    G = random_gram(1, 4, 12, seed=3)[0]
    Gn = G.numpy()

    def f(log_a):  # 1/2 a^T G a - sum log a, in log coordinates so a > 0
        a = np.exp(log_a)
        return 0.5 * a @ Gn @ a - log_a.sum(), (Gn @ a) * a - 1.0

    ref = np.exp(minimize(f, np.zeros(4), jac=True, method="BFGS", options={"gtol": 1e-12}).x)
    np.testing.assert_allclose(nash_weights(G).numpy(), ref, rtol=1e-5)


def test_scale_equivariance_and_normalisation():
    """alpha(cG) = alpha(G)/sqrt(c); after normalize_gram, alpha no longer depends on the scale of the experts."""
    G = random_gram(8, 3, 20, seed=1)
    torch.testing.assert_close(nash_weights(9.0 * G), nash_weights(G) / 3.0)
    torch.testing.assert_close(nash_weights(normalize_gram(100.0 * G, 0.0)), nash_weights(normalize_gram(G, 0.0)))


def test_float32_input_and_duplicate_vectors_stay_finite():
    tau = torch.randn(5, 3, 16)
    tau[:, 1] = tau[:, 0]  # two identical domain vectors: G singular, the ridge keeps a solution
    alpha = nash_weights(normalize_gram(tau @ tau.transpose(-1, -2)))
    assert alpha.dtype == torch.float32 and torch.isfinite(alpha).all() and (alpha > 0).all()
