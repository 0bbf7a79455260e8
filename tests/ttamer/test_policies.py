"""Exit policies against exact enumeration, Monte Carlo and hand-computed cases."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from lit_iclr.ttamer.policies import (
    MarkovModel,
    dp_policy,
    expected_value,
    level_index,
    oracle_policy,
    pandora_policy,
    reservation_values,
    threshold_policy,
    value_grid,
)
from lit_iclr.ttamer.synthetic import doubling_instance, enumerate_optimum


def random_instance(seed: int, stages: int = 3, bins: int = 2) -> MarkovModel:
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(stages, bins, generator=g, dtype=torch.float64)
    p0 = torch.rand(bins, generator=g, dtype=torch.float64)
    trans = torch.rand(stages - 1, bins, bins, generator=g, dtype=torch.float64)
    cost = 0.05 * torch.rand(stages, generator=g, dtype=torch.float64)
    return MarkovModel(q, p0 / p0.sum(), trans / trans.sum(-1, keepdim=True), cost)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("recall", [False, True])
def test_dynamic_programs_equal_brute_force_over_all_policies(seed, recall):
    model = random_instance(seed)
    for lam in (0.0, 1.0, 5.0):
        assert math.isclose(expected_value(model, lam, recall), enumerate_optimum(model, lam, recall), abs_tol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_recall_dp_with_calibrated_stop_values_equals_brute_force(seed):
    """The recall DP as served (stop values estimated on calibration queries, not the running best m) against every
    history-dependent stopping rule paying the same stop values: a stop value that is not a function of m alone
    (here random) still has the DP's optimum."""
    model = random_instance(seed)
    s, b = model.q.shape
    g = torch.Generator().manual_seed(50 + seed)
    model.stop_value = torch.rand(s, b, s * b + 1, generator=g, dtype=torch.float64)
    for lam in (0.0, 1.0, 5.0):
        assert math.isclose(expected_value(model, lam, True), enumerate_optimum(model, lam, True), abs_tol=1e-12)
    assert not math.isclose(expected_value(model, 0.0, True), enumerate_optimum(replace(model, stop_value=None), 0.0,
                                                                                 True), abs_tol=1e-6)


def test_calibrated_stop_values_are_the_shrunk_accuracies_of_their_states():
    """`MarkovModel.estimate(..., correct=...)`: the stop value of state (k, b, j) is the larger of the best-so-far
    answer's and the current answer's calibration accuracy among the queries in that state, each shrunk toward its
    model value with `prior_weight` pseudo-queries; recomputed here query by query."""
    g = torch.Generator().manual_seed(3)
    n, s, b, w = 400, 3, 3, 5.0
    bins = torch.randint(0, b, (n, s), generator=g)
    correct = torch.rand(n, s, generator=g) < 0.3 + 0.2 * bins
    values = correct.double()
    model = MarkovModel.estimate(bins, values, torch.ones(s, dtype=torch.float64), b, correct=correct, prior_weight=w)
    grid = value_grid(model)
    stats: dict[tuple[int, int, int], list[float]] = {}
    for i in range(n):
        best, arg = -1.0, 0
        for k in range(s):
            v = float(model.q[k, bins[i, k]])
            if v > best:
                best, arg = v, k
            j = int(level_index(torch.tensor([best], dtype=torch.float64), grid)[0])
            row = stats.setdefault((k, int(bins[i, k]), j), [0.0, 0.0, 0.0])
            row[0] += 1
            row[1] += float(correct[i, arg])
            row[2] += float(correct[i, k])
    for (k, bb, j), (cnt, right_best, right_cur) in stats.items():
        r_best = (right_best + w * float(grid[j])) / (cnt + w)
        r_cur = (right_cur + w * float(model.q[k, bb])) / (cnt + w)
        assert float(model.stop_value[k, bb, j]) == pytest.approx(max(r_best, r_cur), abs=1e-12)
        assert bool(model.answer_current[k, bb, j]) == (r_cur > r_best)


@pytest.mark.parametrize("stages", [2, 3])
def test_doubling_family_ratio_is_two_over_s_plus_one(stages):
    model = doubling_instance(stages)
    recall, no_recall = expected_value(model, 1.0, True), expected_value(model, 1.0, False)
    assert math.isclose(recall, enumerate_optimum(model, 1.0, True), abs_tol=1e-12)
    assert math.isclose(no_recall, enumerate_optimum(model, 1.0, False), abs_tol=1e-12)
    assert math.isclose(no_recall / recall, 2 / (stages + 1), rel_tol=1e-12)


def test_no_recall_ratio_keeps_falling_on_long_doubling_chains():
    ratios = [expected_value(doubling_instance(s), 1.0, False) / expected_value(doubling_instance(s), 1.0, True)
              for s in (8, 16, 32)]
    assert ratios == pytest.approx([2 / 9, 2 / 17, 2 / 33], rel=1e-9)


@pytest.mark.parametrize("recall", [False, True])
def test_simulated_policy_earns_the_dp_value_on_draws_from_the_model(recall):
    """Monte Carlo: queries drawn from the Markov model, run through `dp_policy`, earn the DP's expected value."""
    model = random_instance(7, stages=4, bins=3)
    lam, n = 0.5, 200_000
    g = torch.Generator().manual_seed(0)
    bins = torch.empty(n, 4, dtype=torch.long)
    bins[:, 0] = torch.multinomial(model.p0, n, replacement=True, generator=g)
    for k in range(3):
        bins[:, k + 1] = torch.multinomial(model.trans[k][bins[:, k]], 1, generator=g)[:, 0]
    out = dp_policy(model, bins, lam, recall)
    values = model.q[torch.arange(4)[None, :], bins]
    earned = values.gather(1, out.answer[:, None])[:, 0] - lam * out.cost
    assert float(earned.mean()) == pytest.approx(expected_value(model, lam, recall), abs=3e-3)
    if recall:  # the answer is the best value among the consulted stages
        consulted = torch.arange(4)[None, :] <= out.stop[:, None]
        assert torch.equal(values.gather(1, out.answer[:, None])[:, 0], torch.where(consulted, values, -1.0).max(1).values)


def test_recall_never_loses_to_no_recall():
    for seed in range(10):
        model = random_instance(100 + seed, stages=4, bins=4)
        for lam in (0.0, 0.3, 3.0):
            assert expected_value(model, lam, True) >= expected_value(model, lam, False) - 1e-12


def test_reservation_value_solves_its_equation():
    g = torch.Generator().manual_seed(1)
    samples = torch.rand(500, 3, generator=g, dtype=torch.float64)
    cost = torch.tensor([0.01, 0.05, 0.2], dtype=torch.float64)
    sigma = reservation_values(samples, cost, lam=1.0)
    gain = (samples - sigma).clamp_min(0).mean(0)
    assert torch.allclose(gain, cost, atol=1e-9)


def test_pandora_opens_by_index_and_stops_when_the_best_beats_the_next_index():
    values = torch.tensor([[0.9, 0.2, 0.1], [0.1, 0.3, 0.95]], dtype=torch.float64)
    cost = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    sigma = torch.tensor([0.5, 0.8, 0.6], dtype=torch.float64)   # order: stage 1, stage 2, stage 0
    out = pandora_policy(values, cost, sigma)
    # query 0: opens stage 1 (0.2 < 0.6) then stage 2 (0.1), best 0.2 < 0.5 -> opens stage 0 (0.9): answers stage 0
    # query 1: opens stage 1 (0.3 < 0.6), then stage 2 (0.95 >= 0.5): stops, answers stage 2
    assert out.answer.tolist() == [0, 2] and out.cost.tolist() == [7.0, 6.0]


def test_threshold_and_oracle_on_a_hand_case():
    conf = torch.tensor([[0.95, 0.5, 0.9], [0.4, 0.6, 0.99], [0.1, 0.2, 0.3]])
    cost = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    out = threshold_policy(conf, cost, 0.9)
    assert out.answer.tolist() == [0, 2, 2] and out.cost.tolist() == [1.0, 3.0, 3.0]
    correct = torch.tensor([[False, True, False], [False, False, False], [True, True, True]])
    o = oracle_policy(correct, cost, lam=0.1, nested=True)
    assert o.answer.tolist() == [1, 0, 0] and o.cost.tolist() == [2.0, 1.0, 1.0]
