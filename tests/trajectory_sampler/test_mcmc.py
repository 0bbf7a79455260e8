"""The kernels against exact targets computed by enumeration (binary, one-hot, constrained) and closed forms (MALA)."""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from lit_iclr.trajectory_sampler.annealing import Kernel, geometric_betas, run_tempering, sample
from lit_iclr.trajectory_sampler.landscapes import all_binary
from lit_iclr.trajectory_sampler.mcmc import ess, gwg_logits, init_state, systematic_resample


def quadratic(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, J = torch.randn(n, generator=g), torch.triu(torch.randn(n, n, generator=g), 1)
    return lambda x: x @ h + ((x @ J) * x).sum(-1)  # x in {0,1}^n (non-linear: pairwise terms)


def empirical_tv(x_bits, pi):
    n = x_bits.shape[1]
    idx = (x_bits.long() << torch.arange(n)).sum(-1)
    p = torch.bincount(idx, minlength=2**n).float() / len(idx)
    return 0.5 * float((p - pi).abs().sum())


def test_gwg_logits_are_exact_differences_for_a_linear_target():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(4, 3, generator=g)
    f = lambda x: (x * W).sum((-1, -2))
    x = F.one_hot(torch.randint(0, 3, (5, 4), generator=g), 3).float()
    st = init_state(f, x)
    logits = gwg_logits(x, st.grad, None).reshape(5, 4, 3) * 2
    for c, pos, k in itertools.product(range(5), range(4), range(3)):
        if x[c, pos, k] == 1:
            assert logits[c, pos, k] == float("-inf")
            continue
        y = x[c].clone()
        y[pos] = F.one_hot(torch.tensor(k), 3).float()
        assert torch.isclose(logits[c, pos, k], f(y[None])[0] - f(x[c:c + 1])[0], atol=1e-5)


def test_gwg_binary_matches_the_enumerated_target():
    torch.manual_seed(0)
    n, beta = 6, 1.0
    f = quadratic(n)
    X = all_binary(n)
    pi = torch.softmax(beta * f(X), 0)
    x0 = F.one_hot(torch.randint(0, 2, (4000, n)), 2).float()
    state, trace = sample("final", [lambda x: f(x[..., 1])], x0, beta, 60, Kernel("gwg"))
    floor = empirical_tv(all_binary(n)[torch.multinomial(pi, 4000, replacement=True)], pi)
    assert empirical_tv(state.x[..., 1], pi) < floor + 0.04
    assert 0.1 < trace.accepted <= 1 and trace.evaluations == 61


def test_gwg_respects_fixed_positions_and_edit_budget_and_samples_the_restricted_target():
    torch.manual_seed(1)
    L, K, budget = 4, 3, 2
    g = torch.Generator().manual_seed(3)
    W = torch.randn(L, K, generator=g)
    f = lambda x: (x * W).sum((-1, -2)) + 1.5 * x[:, 1, 2] * x[:, 3, 0]  # an interaction term
    ref = torch.zeros(L, dtype=torch.long)
    states = torch.tensor(list(itertools.product(range(K), repeat=L)))
    ok = (states[:, 0] == ref[0]) & ((states != ref).sum(-1) <= budget)  # position 0 fixed, at most 2 edits
    onehot = F.one_hot(states, K).float()
    pi = torch.softmax(f(onehot).masked_fill(~ok, -float("inf")), 0)
    ref_oh = F.one_hot(ref, K).float()

    def allowed(x):
        a = torch.ones_like(x, dtype=torch.bool)
        a[:, 0] = False
        changed = (x != ref_oh).any(-1)
        full = changed.sum(-1) >= budget
        return a & ~(full[:, None] & ~changed)[..., None]

    C = 4000
    x0 = ref_oh.expand(C, L, K).clone()
    state, _ = sample("final", [f], x0, 1.0, 80, Kernel("gwg", allowed=allowed))
    got = state.x.argmax(-1)
    assert (got[:, 0] == 0).all() and ((got != ref).sum(-1) <= budget).all()
    idx = (got * K ** torch.arange(L - 1, -1, -1)).sum(-1)
    p = torch.bincount(idx, minlength=K**L).float() / C
    assert 0.5 * float((p - pi).abs().sum()) < 0.06


def test_mala_matches_a_gaussian_in_closed_form():
    torch.manual_seed(0)
    mu, sd = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 2.0])
    f = lambda x: -(((x - mu) / sd) ** 2).sum(-1) / 2
    state, trace = sample("final", [f], torch.zeros(4000, 2), 1.0, 300, Kernel("mala", step_size=0.6))
    assert torch.allclose(state.x.mean(0), mu, atol=0.12)
    assert torch.allclose(state.x.std(0), sd, rtol=0.08)
    assert 0.3 < trace.accepted < 1


def test_parallel_tempering_target_replica_matches_the_enumerated_target():
    torch.manual_seed(2)
    n = 5
    f = quadratic(n, seed=4)
    pi = torch.softmax(2.0 * f(all_binary(n)), 0)
    x0 = F.one_hot(torch.randint(0, 2, (2000, n)), 2).float()
    betas = geometric_betas(0.2, 2.0, 3).float()
    state, trace = run_tempering(x0, lambda x: f(x[..., 1]), betas, 60, Kernel("gwg"))
    assert empirical_tv(state.x[..., 1], pi) < 0.08
    assert trace.evaluations == 3 + 60 * 3
    # the returned replica's cached log-density is beta * f at its own state (swaps rescale it)
    assert torch.allclose(state.logp, 2.0 * f(state.x[..., 1]), atol=1e-4)


def test_systematic_resampling_counts_follow_the_weights_and_ess():
    w = torch.tensor([[0.5, 0.25, 0.125, 0.125]])
    idx = systematic_resample(w.log(), torch.Generator().manual_seed(0))
    counts = torch.bincount(idx[0], minlength=4).float()
    assert ((counts - 4 * w[0]).abs() < 1).all()  # systematic: each count within 1 of C * w
    assert torch.isclose(ess(w.log()), torch.tensor([1 / (w**2).sum()]))


def test_smc_weights_correct_a_mismatched_ladder():
    """Annealed importance sampling with zero MCMC steps: reweighting alone turns uniform starts into the target."""
    torch.manual_seed(0)
    n = 4
    f = quadratic(n, seed=5)
    pi = torch.softmax(f(all_binary(n)), 0)
    x0 = F.one_hot(torch.randint(0, 2, (20000, n)), 2).float()
    from lit_iclr.trajectory_sampler.annealing import run_ladder

    zero = lambda x: torch.zeros(len(x))
    stages = [(zero, 1.0, 0), (lambda x: f(x[..., 1]), 1.0, 0)]
    state, trace = run_ladder(x0, stages, Kernel("gwg"), smc=True, ess_threshold=1.01)
    assert trace.resamples == 1
    assert empirical_tv(state.x[..., 1], pi) < 0.03


def test_parallel_tempering_keeps_per_chain_targets_and_constraints():
    """Per-query targets (one field per chain) and an edit budget stay attached to their chain across replicas."""
    torch.manual_seed(3)
    C, n, budget = 6, 8, 2
    W = torch.randn(C, n) * 3
    f = lambda x: (x[..., 1] * W).sum(-1)  # chain c's own target
    ref = F.one_hot(torch.zeros(C, n, dtype=torch.long), 2).float()
    allowed = lambda x: ~(((x != ref).any(-1).sum(-1) >= budget)[:, None] & ~(x != ref).any(-1))[..., None].expand_as(x)
    state, _ = run_tempering(ref.clone(), f, geometric_betas(0.3, 3.0, 4).float(), 40, Kernel("gwg", allowed=allowed))
    bits = state.x[..., 1]
    assert (bits.sum(-1) <= budget).all()
    assert torch.allclose(state.logp, 3.0 * f(state.x), atol=1e-4)
    best = W.topk(budget, -1).values.clamp_min(0).sum(-1)  # the optimum within the budget: the top positive fields
    assert (f(state.x) > best - 3).float().mean() > 0.5
