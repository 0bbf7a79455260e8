"""SOOPER's pieces against independent computations: the batched ensemble, the filters, the planning MDP,
the pessimistic cost target and SAC's tanh-Gaussian log-density."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lit_iclr.sooper.module import pessimistic_cost_target
from lit_iclr.sooper.nets import Critics, DeterministicPolicy, DynamicsEnsemble, EnsembleMLP, TanhGaussianActor
from lit_iclr.sooper.planning import PlanningConfig, advantage_unsafe, aggregate_cost, imagine, sooper_unsafe, unsafe_mask

OBS, ACT = 4, 2


def test_ensemble_mlp_is_one_mlp_per_member():
    torch.manual_seed(0)
    net = EnsembleMLP(3, 5, 2, [7, 6])
    x = torch.randn(3, 11, 5)
    out = net(x)
    for e in range(3):  # member e alone, with F.linear and its own weights
        h = x[e]
        for layer in net.hidden:
            h = F.silu(F.linear(h, layer.weight[e].T, layer.bias[e, 0]))
        torch.testing.assert_close(out[e], F.linear(h, net.out.weight[e].T, net.out.bias[e, 0]))
    torch.testing.assert_close(net(x[0])[1], net(x[0].expand(3, -1, -1))[1])  # a shared input goes to every member


def test_filters_against_their_definitions():
    c = torch.tensor([0.0, 2.0, 4.0, 4.0])
    disc = torch.tensor([1.0, 0.5, 0.5, 0.9])
    q = torch.tensor([4.9, 5.0, 2.0, 1.2])
    # Phi = C + gamma^t Q_c vs d = 5: 4.9 | 4.5 | 5.0 | 5.08
    assert sooper_unsafe(c, disc, q, 5.0).tolist() == [False, False, True, True]
    assert advantage_unsafe(torch.tensor([1.0, 1.2]), torch.tensor([1.0, 1.0]), 0.1).tolist() == [False, True]
    heads = torch.tensor([[1.0, 2.0], [3.0, 2.0]])
    torch.testing.assert_close(aggregate_cost(heads, 1.0), torch.tensor([2.0 + 2**0.5, 2.0]))


def nets(members: int = 3):
    torch.manual_seed(0)
    return (DynamicsEnsemble(OBS, ACT, [8], members), TanhGaussianActor(OBS, ACT, [8]), DeterministicPolicy(OBS, ACT, [8]),
            Critics(OBS, ACT, [8]), Critics(OBS, ACT, [8]))


def cfg(**kw):
    base = dict(horizon=4, optimism=0.5, pessimism=2.0, cost_discount=0.9, filter="sooper", budget=1e9,
                advantage_threshold=0.1, cost_kappa=0.0)
    return PlanningConfig(**{**base, **kw})


def test_undiscounted_phi_adds_the_cost_to_go_without_gamma_t():
    _, _, prior, _, q_c = nets()
    s, a = torch.randn(5, OBS), torch.rand(5, ACT) * 2 - 1
    q = q_c(s, a).mean(0)
    cum, disc = torch.full((5,), 1.0), torch.full((5,), 0.5)
    budget = float((cum + 0.75 * q).median())  # between the discounted and undiscounted Phi of some rows
    got = unsafe_mask(cfg(budget=budget), s, a, cum, disc, prior, q_c)
    got_u = unsafe_mask(cfg(budget=budget, undiscounted_phi=True), s, a, cum, disc, prior, q_c)
    assert got.tolist() == (cum + 0.5 * q >= budget).tolist()
    assert got_u.tolist() == (cum + q >= budget).tolist()


def test_rollouts_terminate_where_the_shield_intervenes_with_the_priors_value():
    model, actor, prior, q_r, q_c = nets()
    s = torch.randn(6, OBS)
    zero = torch.zeros(6)
    out = imagine(cfg(budget=-1e9), model, actor, prior, q_r, q_c, s, zero, torch.ones(6))  # always unsafe
    assert len(out["reward"]) == 6 and out["terminated"] == 6 and out["done"].tolist() == [1.0] * 6
    torch.testing.assert_close(out["reward"], q_r(s, prior(s)).min(0).values)  # terminal reward Q_r(s, pi_hat(s))
    never = imagine(cfg(), model, actor, prior, q_r, q_c, s, zero, torch.ones(6))
    assert len(never["reward"]) == 6 * 4 and never["terminated"] == 0 and never["done"].sum() == 0


def test_rollout_step_uses_one_member_per_rollout_and_the_disagreement_bonus():
    model, actor, prior, q_r, q_c = nets()
    s = torch.randn(5, OBS)
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(7)
    out = imagine(cfg(horizon=1), model, actor, prior, q_r, q_c, s, torch.zeros(5), torch.ones(5), g)
    torch.manual_seed(7)
    a, _ = actor(s)  # the same action draw
    pred = model.predict(s, a)
    member = torch.randint(3, (5,), generator=torch.Generator().manual_seed(1))
    u = pred[..., :OBS].std(0).mean(-1)
    chosen = pred[member, torch.arange(5)]
    torch.testing.assert_close(out["action"], a)
    torch.testing.assert_close(out["next_obs"], chosen[:, :OBS])
    torch.testing.assert_close(out["reward"], chosen[:, -2] + 0.5 * u)


def test_accumulated_cost_makes_later_steps_unsafe():
    """With zero reward/cost heads except a constant model cost, C grows by gamma^t (c + lambda u) until C >= d."""
    model, actor, prior, q_r, q_c = nets(members=1)
    with torch.no_grad():
        for p in list(model.net.parameters()) + list(q_c.parameters()):
            p.zero_()
        model.net.out.bias[..., OBS + 1] = 1.0  # mean cost 1 per step (out_std 1), no disagreement with one member
    s = torch.zeros(2, OBS)
    out = imagine(cfg(horizon=6, budget=2.5), model, actor, prior, q_r, q_c, s, torch.zeros(2), torch.ones(2))
    # C after steps: 1, 1.9, 2.71 -> the 4th step sees C = 2.71 >= 2.5 and terminates
    assert len(out["reward"]) == 2 * 4 and out["done"].view(4, 2)[:, 0].tolist() == [0, 0, 0, 1]


def test_cost_target_is_the_authors_min_by_hand():
    """PessimisticCostUpdate (yardenas/safe-sim2real, ss2r/algorithms/sac/q_transforms.py): min(c + gamma Q', Q_old)
    with positive costs: real data can lower the conservative estimate, never raise it."""
    c, q_next, q_old = torch.tensor([1.0, 0.0, 0.5]), torch.tensor([2.0, 1.0, 5.0]), torch.tensor([5.0, 0.5, 3.0])
    # backups 1 + 0.9 * 2 = 2.8, 0 + 0.9 * 1 = 0.9, 0.5 + 0.9 * 5 = 5.0 against the old 5.0, 0.5, 3.0:
    # min -> 2.8 (lowered: the data show the action is cheaper), 0.5 (kept), 3.0 (kept: not raised to 5.0)
    torch.testing.assert_close(pessimistic_cost_target(c, q_next, q_old, 0.9), torch.tensor([2.8, 0.5, 3.0]))
    torch.testing.assert_close(pessimistic_cost_target(c, q_next, q_old, 0.9, "max"), torch.tensor([5.0, 0.9, 5.0]))


def _constant_cost_critic(value: float, **kw):
    """A SOOPER whose prior cost critic (and its target) outputs `value` everywhere: every weight zero but the output
    bias, so one SGD step moves only that bias, by hand-computable amounts."""
    from lit_iclr.sooper.module import SOOPER

    model = SOOPER(obs_dim=OBS, action_dim=ACT, cost_discount=0.5, critic_hidden=[8], actor_hidden=[8], critic_heads=2,
                   prior_cost_updates=1, tau=0.5, **kw)
    with torch.no_grad():
        for net in (model.prior_cost, model.prior_cost_target):
            for p in net.parameters():
                p.zero_()
            net.net.out.bias.fill_(value)
    model.manual_backward = lambda loss: loss.backward()  # no Trainer attached
    model.batch_size = 16
    return model


def test_online_cost_update_against_the_authors_rule_by_hand():
    """One update of Q_c on real transitions, Q_c = 3 everywhere, gamma_c = 0.5, SGD lr 0.1, 2 heads, tau 0.5.
    Backup y' = c + 0.5 * 3. Cost 0: y' = 1.5; cost 4: y' = 5.5. Authors' min: target min(y', 3) = 1.5 or 3;
    max: max(y', 3) = 3 or 5.5. Loss = mean over heads and batch of (b_k - y)^2, so d loss / d b_k = (b_k - y) (2 / K = 1)
    and b_k <- 3 - 0.1 (3 - y); target bias <- 3 + 0.5 (b_k - 3)."""
    n = 16
    expected = {("min", 0.0): 2.85, ("min", 4.0): 3.0, ("max", 0.0): 3.0, ("max", 4.0): 3.25}
    for (rule, cost), q_after in expected.items():
        model = _constant_cost_critic(3.0, cost_update=rule)
        s, s2 = torch.randn(n, OBS), torch.randn(n, OBS)
        model.replay = {"observations": s, "actions": torch.rand(n, ACT) * 2 - 1, "next_observations": s2,
                        "costs": torch.full((n,), cost), "rewards": torch.zeros(n)}
        model.update_prior_cost(torch.optim.SGD(model.prior_cost.parameters(), lr=0.1))
        with torch.no_grad():
            q, q_target = model.prior_cost(s, model.prior(s)), model.prior_cost_target(s, model.prior(s))
        torch.testing.assert_close(q, torch.full_like(q, q_after), msg=f"{rule}, cost {cost}")
        torch.testing.assert_close(q_target, torch.full_like(q, 3.0 + 0.5 * (q_after - 3.0)), msg=f"{rule}, cost {cost}")


def test_unknown_cost_update_is_refused():
    import pytest

    from lit_iclr.core.errors import ConfigError
    from lit_iclr.sooper.module import SOOPER

    with pytest.raises(ConfigError, match="cost_update"):
        SOOPER(obs_dim=OBS, action_dim=ACT, cost_update="mean")


def test_cost_margin_shifts_the_aggregate_and_kappa_one_covers_both_heads():
    heads = torch.tensor([[1.0, 4.0, 2.0], [3.0, 0.0, 2.0]])
    agg = aggregate_cost(heads, 1.0, margin=0.5)
    torch.testing.assert_close(agg, heads.mean(0) + heads.std(0) + 0.5)
    assert bool((aggregate_cost(heads, 1.0) >= heads.max(0).values).all())  # K = 2: std = |q1 - q2| / sqrt 2 >= half gap


def test_tanh_gaussian_log_density_matches_torch_distributions():
    torch.manual_seed(0)
    actor = TanhGaussianActor(OBS, ACT, [8])
    s = torch.randn(64, OBS)
    torch.manual_seed(1)
    a, logp = actor(s)
    mu, log_std = actor.net(s)[0].chunk(2, -1)
    lo, hi = actor.log_std_range
    std = (lo + 0.5 * (hi - lo) * (torch.tanh(log_std) + 1)).exp()
    dist = torch.distributions.TransformedDistribution(torch.distributions.Normal(mu, std),
                                                       [torch.distributions.TanhTransform()])
    torch.testing.assert_close(logp, dist.log_prob(a.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1), atol=2e-3, rtol=1e-3)


def test_dynamics_model_learns_a_linear_system():
    torch.manual_seed(0)
    model = DynamicsEnsemble(OBS, ACT, [32], members=2)
    s, a = torch.randn(512, OBS), torch.rand(512, ACT) * 2 - 1
    A = torch.randn(OBS + ACT, OBS + 2) * 0.3
    y = torch.cat([s, a], -1) @ A
    model.set_normalizer(torch.cat([s, a], -1), y)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    for _ in range(400):
        loss = model.loss(s, a, y.expand(2, -1, -1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    pred = model.predict(s[:50], a[:50])
    truth = torch.cat([s[:50] + y[:50, :OBS], y[:50, OBS:]], -1)
    assert (pred - truth).abs().mean() < 0.1 * truth.abs().mean()
