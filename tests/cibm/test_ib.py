"""The IB estimators against brute force and closed-form limits; the dual update's sign; IB_E's gradient routing."""
from __future__ import annotations

import math

import pytest
import torch

import lit_iclr.cibm.module as module_mod
from lit_iclr.cibm import CIBM
from lit_iclr.cibm.ib import dual_update, est_hc, est_mi, gaussian_log_prob, mi_cy


def test_gaussian_log_prob_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mu, sigma, z = torch.randn(5, 3, generator=g), torch.rand(5, 3, generator=g) + 0.1, torch.randn(5, 3, generator=g)
    ref = torch.distributions.Normal(mu, sigma).log_prob(z).sum(-1)
    torch.testing.assert_close(gaussian_log_prob(z, mu, sigma), ref)


def test_est_mi_equals_a_brute_force_double_loop():
    g = torch.Generator().manual_seed(1)
    m, d = 7, 4
    mu, sigma = torch.randn(m, d, generator=g), torch.rand(m, d, generator=g) + 0.2
    z = mu + sigma * torch.randn(m, d, generator=g)
    total = 0.0
    for i in range(m):
        own = torch.distributions.Normal(mu[i], sigma[i]).log_prob(z[i]).sum()
        dens = [torch.distributions.Normal(mu[j], sigma[j]).log_prob(z[i]).sum().exp() for j in range(m)]
        total += own - torch.log(torch.stack(dens).mean())
    torch.testing.assert_close(est_mi(mu, sigma, z=z), total / m, rtol=1e-5, atol=1e-5)
    jensen = sum(torch.distributions.Normal(mu[i], sigma[i]).log_prob(z[i]).sum()
                 - torch.stack([torch.distributions.Normal(mu[j], sigma[j]).log_prob(z[i]).sum() for j in range(m)]).mean()
                 for i in range(m)) / m
    torch.testing.assert_close(est_mi(mu, sigma, jensen=True, z=z), jensen, rtol=1e-5, atol=1e-5)


def test_est_mi_limits_zero_and_log_m():
    m = 16
    same = torch.zeros(m, 3)
    assert est_mi(same, torch.ones(m, 3)).abs() < 1e-5  # z independent of x: I = 0 exactly
    far = torch.arange(m, dtype=torch.float32)[:, None].repeat(1, 3) * 100  # every x its own far-away mode
    torch.testing.assert_close(est_mi(far, torch.full((m, 3), 0.1)), torch.tensor(math.log(m)))


def test_est_mi_tracks_closed_form_below_log_m_and_loses_its_gradient_at_the_ceiling():
    # mu ~ N(0, I_15), z = mu + sigma eps: I(X;Z) = 15/2 log(1 + 1/sigma^2) in closed form
    m, d = 400, 15
    g = torch.Generator().manual_seed(0)
    mu, eps = torch.randn(m, d, generator=g), torch.randn(m, d, generator=g)
    assert est_mi(mu, torch.full((m, d), 3.0), z=mu + 3.0 * eps).item() == pytest.approx(7.5 * math.log(1 + 1 / 9), abs=0.2)
    # sigma 0.1: true MI 34.6 nats >> log M = 5.99; the estimate sits at log M and its gradient is numerically zero,
    # so the IB_B term beta (I_c - I_hat) cannot move the encoder (seeds/cibm.md)
    mu_p, log_s = mu.clone().requires_grad_(), torch.full((m, d), math.log(0.1), requires_grad=True)
    mi = est_mi(mu_p, log_s.exp(), z=mu_p + log_s.exp() * eps)
    grads = torch.autograd.grad(mi, [mu_p, log_s])
    assert mi.item() == pytest.approx(math.log(m), abs=1e-3)
    assert max(gr.abs().max().item() for gr in grads) < 1e-6


def test_est_hc_and_mi_cy():
    sigma = torch.tensor([[0.5, 2.0], [1.0, 4.0]])
    torch.testing.assert_close(est_hc(sigma), torch.log(sigma + 1e-8).sum())
    y = torch.tensor([0, 1, 1, 1])
    logits = torch.tensor([[5.0, 0.0], [0.0, 5.0], [0.0, 5.0], [5.0, 0.0]])
    q = torch.softmax(logits, -1)[torch.arange(4), y]
    prior = torch.tensor([0.25, 0.75])[y]
    torch.testing.assert_close(mi_cy(logits, y, 2), (q.log() - prior.log()).mean())


def test_dual_update_sign_is_the_official_one():
    # official: beta += beta_lr * (I_c - I_hat) with beta_lr = -0.01 -> beta rises while I_hat > I_c, falls below it
    assert dual_update(0.5, mi=2.0, mi_const=1.0, beta_lr=-0.01) == pytest.approx(0.51)
    assert dual_update(0.5, mi=0.2, mi_const=1.0, beta_lr=-0.01) == pytest.approx(0.508 - 0.016)
    assert dual_update(0.5, mi=1.0, mi_const=1.0, beta_lr=-0.01) == 0.5


def _tiny(ib: str, family: str = "joint", **kw) -> tuple[CIBM, dict]:
    torch.manual_seed(0)
    model = CIBM(input_shape=[6], num_concepts=4, num_classes=3, concept_groups=[[0, 1], [2, 3]], family=family, ib=ib,
                 hidden=8, mi_source="batch", **kw)
    model.log = lambda *a, **k: None
    model.manual_backward = lambda loss, **k: loss.backward(**k)

    class _Opt:
        def step(self):
            pass

        def zero_grad(self, set_to_none=True):
            pass

    model.optimizers = lambda: _Opt()
    g = torch.Generator().manual_seed(3)
    batch = {"x": torch.randn(10, 6, generator=g), "c": (torch.rand(10, 4, generator=g) > 0.5).float(),
             "y": torch.randint(0, 3, (10,), generator=g)}
    return model, batch


def _grads(model):
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


def test_ib_b_step_uses_beta_times_constraint_then_moves_beta(monkeypatch):
    for mi_value, expected in ((0.3, 0.5 - 0.01 * 0.7), (1.6, 0.5 + 0.01 * 0.6)):
        model, batch = _tiny("B")
        mi = torch.tensor(mi_value, requires_grad=True)
        monkeypatch.setattr(module_mod, "est_mi", lambda *a, _mi=mi, **k: _mi)
        model.training_step(batch, 0)
        assert float(model.beta) == pytest.approx(expected)
        assert mi.grad == pytest.approx(-0.5)  # d/dI_hat of beta * (I_c - I_hat) with the pre-update beta 0.5


def test_ib_e_entropy_term_reaches_only_the_concept_heads(monkeypatch):
    model, batch = _tiny("E")
    torch.manual_seed(5)
    model.training_step(batch, 0)
    with_hc = _grads(model)
    model.zero_grad(set_to_none=True)
    monkeypatch.setattr(module_mod, "est_hc", lambda sigma: 0.0 * sigma.sum())
    torch.manual_seed(5)
    model.training_step(batch, 0)
    without = _grads(model)
    diff = {n: with_hc[n] - without[n] for n in with_hc}
    head_names = {n for n, p in model.named_parameters() if any(p is q for q in model.net.head_params())}
    assert head_names and not any("head." in n for n in head_names)
    for n, d in diff.items():
        if n not in head_names:
            assert d.abs().max() == 0, n  # label head: untouched by H(C)
    # on the heads, the difference is exactly the gradient of (1 - beta) * H_hat(C), computed independently
    model.zero_grad(set_to_none=True)
    sigma = model.net.encode(batch["x"])["sigma"]
    (0.5 * torch.log(sigma + 1e-8).sum()).backward()
    sigma_params = [n for n in head_names if "pred_sigma" in n]
    for n, p in model.named_parameters():
        if n in sigma_params:
            torch.testing.assert_close(diff[n], p.grad, rtol=1e-4, atol=1e-5)
    assert any(diff[n].abs().max() > 0 for n in sigma_params)


def test_gaussian_bound_matches_a_kl_computed_by_torch_distributions():
    from lit_iclr.cibm.ib import gaussian_mi_bound

    g = torch.Generator().manual_seed(5)
    mu, sigma = torch.randn(6, 3, generator=g), torch.rand(6, 3, generator=g) + 0.2
    m = mu.mean(0)
    s = (mu.var(0, unbiased=False) + (sigma**2).mean(0)).sqrt()
    ref = torch.stack([torch.distributions.kl_divergence(torch.distributions.Normal(mu[i], sigma[i]),
                                                         torch.distributions.Normal(m, s)).sum() for i in range(6)]).mean()
    torch.testing.assert_close(gaussian_mi_bound(mu, sigma), ref)


@pytest.mark.parametrize("sigma", [0.03, 0.3, 3.0])
def test_gaussian_bound_equals_the_closed_form_mi_of_gaussian_codes_and_keeps_its_gradient(sigma):
    # mu ~ N(0, I_15), z = mu + sigma eps: z is Gaussian, so I(X;C) = 15/2 log(1 + 1/sigma^2) exactly and the bound is tight
    from lit_iclr.cibm.ib import gaussian_mi_bound

    g = torch.Generator().manual_seed(0)
    m, d = 200, 15
    mu = torch.randn(m, d, generator=g).requires_grad_()
    log_s = torch.full((m, d), math.log(sigma), requires_grad=True)
    bound = gaussian_mi_bound(mu, log_s.exp())
    true = d / 2 * math.log(1 + 1 / sigma**2)
    assert bound.item() == pytest.approx(true, rel=0.05, abs=0.1)  # sample variance of 200 points: a few % off
    grad = torch.cat([gr.flatten() for gr in torch.autograd.grad(bound, [mu, log_s])]).norm().item()
    # d bound / d log sigma_ik = -(1 - sigma^2 / s^2) / M: norm sqrt(d / M) (1 - sigma^2 / s^2) = 0.27 at small sigma,
    # 0.03 at sigma 3 (I = 0.79 nats is nearly flat there); the minibatch estimator's is ~1e-8 at the ceiling
    assert grad > 1e-2
    if sigma == 0.03:  # where the minibatch estimator sits at log M with a vanishing gradient
        z = mu + log_s.exp() * torch.randn(m, d, generator=g)
        lse = est_mi(mu, log_s.exp(), z=z)
        assert lse.item() == pytest.approx(math.log(m), abs=1e-3) and true > 50
        assert torch.cat([gr.flatten() for gr in torch.autograd.grad(lse, [mu, log_s])]).norm().item() < 1e-5


def test_gaussian_bound_upper_bounds_the_mi_of_a_binary_code():
    # mu = +-a with equal probability, sigma fixed: I = h(mixture) - h(N(0, sigma^2)), by quadrature; the bound is above it
    from lit_iclr.cibm.ib import gaussian_mi_bound

    a, sigma = 1.0, 0.5
    t = torch.linspace(-8, 8, 20001, dtype=torch.float64)
    pdf = (0.5 * (torch.exp(-0.5 * ((t - a) / sigma) ** 2) + torch.exp(-0.5 * ((t + a) / sigma) ** 2))
           / (sigma * math.sqrt(2 * math.pi)))
    h_mix = -(pdf * torch.log(pdf.clamp_min(1e-300))).sum().item() * (t[1] - t[0]).item()
    true = h_mix - 0.5 * math.log(2 * math.pi * math.e * sigma**2)
    mu = torch.tensor([[a], [-a]] * 50, dtype=torch.float64)
    bound = gaussian_mi_bound(mu, torch.full_like(mu, sigma)).item()
    assert bound == pytest.approx(0.5 * math.log(1 + a**2 / sigma**2))  # Gaussian of the moments: 1/2 log(5) = 0.80
    assert 0.5 < true < math.log(2) and true < bound  # quadrature: 0.633 nats


def test_ib_b_with_the_gaussian_bound_moves_the_encoder():
    model, batch = _tiny("B", mi_estimator="gaussian", beta=-1.0)  # beta < 0: the term penalises I_hat
    r = model.losses(batch, 0, -1.0)
    mi = r["mi"]
    g = torch.autograd.grad(mi, list(model.net.pred_sigma.parameters()))
    assert mi.item() > 0 and sum(x.norm() for x in g).item() > 1e-3


def test_vanilla_baseline_trains_alongside_on_the_same_batch_and_leaves_the_model_unchanged():
    with_v, batch = _tiny("B")
    without, _ = _tiny("B", vanilla_baseline=False)
    assert with_v.vanilla is not None and without.vanilla is None
    assert all(torch.equal(a, b) for a, b in zip(with_v.net.state_dict().values(), without.net.state_dict().values(),
                                                      strict=True))
    torch.manual_seed(7)  # the same eps for both
    r = with_v.losses(batch, 0, 0.5)
    enc = with_v.vanilla.encode(batch["x"])
    out = with_v.vanilla.decide(enc, enc["mu"])
    ref = (torch.nn.functional.cross_entropy(out["y_logits"], batch["y"])
           + torch.nn.functional.binary_cross_entropy_with_logits(out["c_logits"], batch["c"], reduction="none").sum(1).mean())
    torch.testing.assert_close(r["loss_vanilla"], ref)
    torch.manual_seed(7)
    torch.testing.assert_close(r["loss"], without.losses(batch, 0, 0.5)["loss"])
    det, _ = _tiny("none", stochastic=False)
    assert det.vanilla is None  # the vanilla CBM itself has no second copy
