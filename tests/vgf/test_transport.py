"""The value-gradient-flow math against independent computations (loops, finite differences, closed forms)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_iclr.vgf.model import ActionGradient, Critic, EnsembleLinear, FlowPolicy
from lit_iclr.vgf.transport import (
    ParticleAdam,
    critic_score,
    median_bandwidth,
    pairwise_sq_dists,
    select_best,
    svgd_direction,
    transport,
)


@pytest.mark.parametrize("n", [6, 5])  # 36 entries (mean of the two middle ones) and 25 (the middle one)
def test_median_bandwidth_is_numpy_median_over_all_pairs(n):
    x = torch.randn(3, n, 2, dtype=torch.float64)
    h = median_bandwidth(pairwise_sq_dists(x))
    for b in range(3):
        xb = x[b].numpy()
        d2 = ((xb[:, None] - xb[None]) ** 2).sum(-1)
        assert h[b, 0, 0].item() == pytest.approx(np.median(d2) / (2 * math.log(n + 1)), rel=1e-12)


def test_svgd_direction_matches_a_loop_with_finite_difference_kernel_gradients():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    score = torch.randn(2, 5, 3, dtype=torch.float64)
    alpha, n, eps = 0.7, 5, 1e-6
    phi = svgd_direction(x, score, alpha).numpy()
    for b in range(2):
        xb, sb = x[b].numpy(), score[b].numpy()
        h = np.median(((xb[:, None] - xb[None]) ** 2).sum(-1)) / (2 * math.log(n + 1))

        def k(u, v, h=h):
            return math.exp(-((u - v) ** 2).sum() / (2 * h))

        for i in range(n):
            expect = np.zeros(3)
            for j in range(n):
                grad_k = np.array([(k(xb[j] + eps * e, xb[i]) - k(xb[j] - eps * e, xb[i])) / (2 * eps)
                                   for e in np.eye(3)])
                expect += k(xb[j], xb[i]) * sb[j] / alpha + grad_k
            np.testing.assert_allclose(phi[b, i], expect / n, rtol=1e-6, atol=1e-8)


def test_critic_score_matches_finite_differences():
    torch.manual_seed(0)
    critic = Critic(4, 3, (16, 16)).double()
    obs = torch.randn(2, 5, 4, dtype=torch.float64)
    a = torch.rand(2, 5, 3, dtype=torch.float64) * 2 - 1
    q_fn = lambda act: critic.value(obs, act, "mean")
    g = critic_score(q_fn)(a)
    eps = 1e-6
    for d in range(3):
        e = torch.zeros_like(a)
        e[..., d] = eps
        fd = (q_fn(a + e) - q_fn(a - e)) / (2 * eps)
        torch.testing.assert_close(g[..., d], fd, rtol=1e-5, atol=1e-7)
    assert all(p.grad is None for p in critic.parameters())  # only particle gradients were taken


def test_svgd_transports_particles_to_the_boltzmann_target():
    """Q(a) = -||a - mu||^2 / 2 makes exp(Q / alpha) = N(mu, alpha I): particles match its mean and spread."""
    torch.manual_seed(0)
    mu, alpha = torch.tensor([0.3, -0.2]), 0.02
    x0 = torch.rand(1, 64, 2) * 1.6 - 0.8
    score = lambda a: -(a - mu)
    x, _ = transport(x0, score, steps=600, lr=0.01, alpha=alpha)
    torch.testing.assert_close(x.mean((0, 1)), mu, atol=0.03, rtol=0)
    std = x.std(dim=(0, 1))
    assert ((std > 0.5 * math.sqrt(alpha)) & (std < 1.5 * math.sqrt(alpha))).all(), std
    # without the kernel (plain ascent) the same particles collapse onto the mode: the repulsion is the entropy term
    y, _ = transport(x0, score, steps=600, lr=0.01, alpha=alpha, kernel=False)
    assert y.std(dim=(0, 1)).max() < 0.2 * math.sqrt(alpha)


def test_transport_budget_bounds_the_displacement():
    """Adam's normalised step moves each coordinate by at most ~eta per step, whatever the scale of Q."""
    torch.manual_seed(0)
    critic = Critic(3, 2, (32, 32))
    obs = torch.randn(8, 6, 3)
    x0 = torch.rand(8, 6, 2) * 1.6 - 0.8
    for scale in (1e-3, 1.0, 1e3):
        score = critic_score(lambda a, s=scale: s * critic.value(obs, a))
        for steps, lr in ((1, 0.05), (3, 0.05), (5, 0.02)):
            x, _ = transport(x0, score, steps=steps, lr=lr, alpha=0.5)
            assert (x - x0).abs().max() <= steps * lr * 1.01
    # the first Adam step is exactly lr * sign(direction)
    d = torch.randn(4, 3, 2)
    np.testing.assert_allclose(ParticleAdam(0.1).step(torch.zeros(4, 3, 2), d), 0.1 * torch.sign(d), atol=1e-6)


def test_snapshots_equal_separate_transports():
    torch.manual_seed(0)
    critic = Critic(3, 2, (16,))
    obs = torch.randn(4, 5, 3)
    x0 = torch.rand(4, 5, 2) * 2 - 1
    score = critic_score(lambda a: critic.value(obs, a))
    _, snaps = transport(x0, score, steps=3, lr=0.1, alpha=0.3, keep=(0, 1, 3))
    assert set(snaps) == {0, 1, 3}
    torch.testing.assert_close(snaps[0], x0)
    for steps in (1, 3):
        alone, _ = transport(x0, score, steps=steps, lr=0.1, alpha=0.3)
        torch.testing.assert_close(snaps[steps], alone)
        assert alone.abs().max() <= 1.0


def test_per_state_norm_clipping_makes_states_independent():
    d = torch.randn(2, 3, 2) * 10
    a = ParticleAdam(0.1, max_norm=1.0)
    a.step(torch.zeros(2, 3, 2), d)
    b = ParticleAdam(0.1, max_norm=1.0)
    b.step(torch.zeros(1, 3, 2), d[:1])
    torch.testing.assert_close(a.m[:1], b.m)
    assert a.m.flatten(1).norm(dim=-1).max() <= 0.1 * 1.0 + 1e-6  # (1 - beta1) * clipped norm


def test_select_best_takes_the_argmax_particle():
    particles = torch.arange(12.0).reshape(2, 3, 2)
    q = torch.tensor([[0.0, 2.0, 1.0], [5.0, -1.0, 0.0]])
    torch.testing.assert_close(select_best(particles, q), torch.tensor([[2.0, 3.0], [6.0, 7.0]]))


@pytest.mark.parametrize("out_dim", [3, 1])  # 1: the Q head, computed as a product and sum instead of a matmul
def test_ensemble_linear_equals_separate_linears(out_dim):
    torch.manual_seed(0)
    layer = EnsembleLinear(2, 4, out_dim)
    x = torch.randn(2, 7, 5, 4)
    y = layer(x)
    assert y.shape == (2, 7, 5, out_dim)
    for k in range(2):
        torch.testing.assert_close(y[k], x[k] @ layer.weight[k] + layer.bias[k, 0])


def test_networks_with_broadcast_states_equal_the_concatenated_input():
    """The first layer applied in parts (the state part once per state) against the plain layers on cat(s, a) with
    the states repeated for every particle: values, grad w.r.t. the particles, and the parameters' gradients."""
    torch.manual_seed(0)
    obs, x = torch.randn(3, 1, 4), torch.randn(3, 5, 2, requires_grad=True)
    rep = obs.expand(-1, 5, -1)
    critic = Critic(4, 2, (8, 6), layer_norm=True)
    ref = torch.stack([_ensemble_member(critic, k, torch.cat([rep, x], -1)) for k in range(2)])  # [2, 3, 5]
    q = critic(obs, x)
    torch.testing.assert_close(q, ref)
    torch.testing.assert_close(critic.value_from_features(critic.state_features(obs), x, "min"), ref.min(0).values)
    g, g_ref = torch.autograd.grad(q.sum(), [x, critic.net[0].weight]), torch.autograd.grad(ref.sum(), [x, critic.net[0].weight])
    torch.testing.assert_close(g[0], g_ref[0])
    torch.testing.assert_close(g[1], g_ref[1])

    policy = FlowPolicy(4, 2, (8, 8))
    t = torch.rand(3, 5, 1)
    v_ref = policy.net(torch.cat([rep, x, t], -1))
    torch.testing.assert_close(policy.velocity(obs, x, t), v_ref)
    torch.testing.assert_close(policy.velocity(obs, x, 0.4), policy.net(torch.cat([rep, x, torch.full_like(t, 0.4)], -1)))
    w = policy.net[0].weight
    torch.testing.assert_close(torch.autograd.grad(policy.velocity(obs, x, t).sum(), w)[0],
                               torch.autograd.grad(v_ref.sum(), w)[0])
    noise = torch.randn(3, 5, 2)
    sampled, plain = policy.sample(obs, steps=3, noise=noise), noise
    for i in range(3):  # Euler steps of the plain network on the repeated states
        plain = plain + policy.net(torch.cat([rep, plain, torch.full_like(t, i / 3)], -1)) / 3
    torch.testing.assert_close(sampled, plain.clamp(-1, 1))

    grad_net = ActionGradient(4, 2, (8,))
    torch.testing.assert_close(grad_net(obs, x), grad_net.net(torch.cat([rep, x], -1)))


def _ensemble_member(critic: Critic, k: int, inp: torch.Tensor) -> torch.Tensor:
    """Member k of the critic as plain layer-by-layer math on the concatenated input."""
    h = inp
    for layer in critic.net:
        if isinstance(layer, EnsembleLinear):
            h = h @ layer.weight[k] + layer.bias[k, 0]
        elif isinstance(layer, torch.nn.ReLU):
            h = h.relu()
        else:  # EnsembleLayerNorm
            h = torch.nn.functional.layer_norm(h, h.shape[-1:]) * layer.weight[k, 0] + layer.bias[k, 0]
    return h.squeeze(-1)


def test_euler_sampler_integrates_a_constant_velocity():
    policy = FlowPolicy(3, 2, (8,))
    last = policy.net[-1]
    with torch.no_grad():
        for p in policy.net.parameters():
            p.zero_()
        last.bias.copy_(torch.tensor([0.25, -3.0]))
    noise = torch.randn(5, 2) * 0.1
    out = policy.sample(torch.randn(5, 3), steps=7, noise=noise)
    torch.testing.assert_close(out, (noise + torch.tensor([0.25, -3.0])).clamp(-1, 1))


def test_flow_matching_policy_learns_both_modes_of_the_behaviour():
    """A bimodal action distribution (+-0.6) is cloned as bimodal, not averaged to 0 as a Gaussian would be."""
    torch.manual_seed(0)
    policy = FlowPolicy(1, 1, (64, 64))
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    obs = torch.zeros(256, 1)
    for _ in range(400):
        actions = (torch.randint(0, 2, (256, 1)) * 1.2 - 0.6) + 0.05 * torch.randn(256, 1)
        loss = policy.flow_matching_loss(obs, actions)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        a = policy.sample(torch.zeros(2000, 1), steps=10).squeeze(-1)
    assert 0.3 < (a > 0.3).float().mean() < 0.7 and 0.3 < (a < -0.3).float().mean() < 0.7
    assert (a.abs() < 0.15).float().mean() < 0.1
