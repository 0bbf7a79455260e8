"""Exit policies: when to stop consulting stages, and which consulted stage answers.

A query's stages are consulted in order (a nested early-exit network, or a cascade in a chosen order). After stage k
the policy sees a signal s_k (binned into B bins) and the estimated value of each consulted answer, q_k = calibrated
probability that stage k is right. Objective for a latency weight lambda: E[ v_out - lambda * sum of consulted costs ].

    no recall   v_out = q of the stage we stop at
                W_{S}(b) = q_S(b);  W_k(b) = max( q_k(b), -lambda c_{k+1} + sum_b' P_k(b'|b) W_{k+1}(b') )
    recall      v_out = max of the consulted q (return the best answer seen so far)
                V_S(b, m) = m;  V_k(b, m) = max( m, -lambda c_{k+1} + sum_b' P_k(b'|b) V_{k+1}(b', max(m, q_{k+1}(b'))) )
    Pandora     free order, recall (Weitzman): reservation value sigma_i solves E[(q_i - sigma_i)^+] = lambda c_i;
                consult in decreasing sigma, stop once the best q seen is at least the next sigma.

The Markov model (initial bin distribution, per-stage bin transitions P_k, per-bin values q_k(b)) is estimated on the
calibration split (`MarkovModel.estimate`) or given exactly (the synthetic family). Both dynamic programs cost
O(S B^2 J) with J = S B + 1 running-best levels (polynomial), and every policy is evaluated on all queries at once (`simulate`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MarkovModel:
    """A fixed-order serving instance: q[k, b] values, p0[b] first-stage bins, trans[k, b, b'] = P(b_{k+1}=b' | b_k=b)."""

    q: torch.Tensor        # (S, B) value of an answer from stage k whose signal fell in bin b
    p0: torch.Tensor       # (B,)
    trans: torch.Tensor    # (S - 1, B, B)
    cost: torch.Tensor     # (S,) cost of consulting stage k (after the previous ones)
    # Optional, estimated on calibration queries: the value of stopping with recall in state (k, b, j) and whether the
    # current stage's answer beats the best-so-far one there. Without them stopping is worth m, the running best q.
    stop_value: torch.Tensor | None = None      # (S, B, J), J = len(value_grid(self))
    answer_current: torch.Tensor | None = None  # (S, B, J) bool

    @property
    def stages(self) -> int:
        return self.q.shape[0]

    @staticmethod
    def estimate(bins: torch.Tensor, values: torch.Tensor, cost: torch.Tensor, n_bins: int,
                 smoothing: float = 1.0, correct: torch.Tensor | None = None, prior_weight: float = 5.0) -> MarkovModel:
        """From calibration queries: bins (N, S) signal bins, values (N, S) per-query answer values (e.g. correctness or
        calibrated confidence). q_k(b) is the mean value in the bin (the bin's centre when empty); transitions are
        counted with `smoothing` added to every cell (Laplace).

        With `correct` (N, S), the recall stop values are estimated too: the maximum of several calibrated confidences
        overstates the accuracy of the answer it picks (a winner's curse), so the value of stopping in state
        (k, b, j) is the calibration accuracy of the best-so-far answer, and of the current answer, among queries
        in that state, each shrunk toward its model value (m_j, q_k(b)) with `prior_weight` pseudo-queries.
        """
        n, s = bins.shape
        flat = bins + n_bins * torch.arange(s)[None, :]
        ones = torch.ones(n * s, dtype=torch.float64)
        count = torch.zeros(s * n_bins, dtype=torch.float64).index_add_(0, flat.reshape(-1), ones)
        total = torch.zeros(s * n_bins, dtype=torch.float64).index_add_(0, flat.reshape(-1), values.reshape(-1).double())
        q = torch.where(count > 0, total / count.clamp_min(1), torch.nan).reshape(s, n_bins)
        centers = (torch.arange(n_bins, dtype=torch.float64) + 0.5) / n_bins
        q = torch.where(torch.isnan(q), centers.expand(s, -1), q)   # empty bins: the bin's own confidence level
        p0 = torch.bincount(bins[:, 0], minlength=n_bins).double() + smoothing
        pair = bins[:, :-1] * n_bins + bins[:, 1:] + (n_bins * n_bins) * torch.arange(s - 1)[None, :]
        trans = torch.bincount(pair.reshape(-1), minlength=(s - 1) * n_bins * n_bins).double().reshape(s - 1, n_bins, n_bins)
        trans = trans + smoothing
        model = MarkovModel(q, p0 / p0.sum(), trans / trans.sum(-1, keepdim=True), cost.double())
        if correct is not None:
            model.stop_value, model.answer_current = _recall_stop_values(model, bins, correct, prior_weight)
        return model


def _recall_stop_values(model: MarkovModel, bins: torch.Tensor, correct: torch.Tensor, prior_weight: float
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, B, J) empirical value of stopping with recall, and whether the current answer is the better one."""
    s, b = model.q.shape
    grid = value_grid(model)
    levels = len(grid)
    vals = model.q[torch.arange(s)[None, :], bins]                       # (N, S) model value of each answer
    best, arg = vals.cummax(1)                                           # running best and its stage
    j = level_index(best, grid)
    flat = ((torch.arange(s)[None, :] * b + bins) * levels + j).reshape(-1)
    size = s * b * levels
    count = torch.zeros(size, dtype=torch.float64).index_add_(0, flat, torch.ones(flat.numel(), dtype=torch.float64))
    right_best = correct.gather(1, arg).double().reshape(-1)
    right_cur = correct.double().reshape(-1)
    sum_best = torch.zeros(size, dtype=torch.float64).index_add_(0, flat, right_best)
    sum_cur = torch.zeros(size, dtype=torch.float64).index_add_(0, flat, right_cur)
    prior_best = grid.expand(s, b, levels).reshape(-1)
    prior_cur = model.q[:, :, None].expand(s, b, levels).reshape(-1)
    r_best = ((sum_best + prior_weight * prior_best) / (count + prior_weight)).reshape(s, b, levels)
    r_cur = ((sum_cur + prior_weight * prior_cur) / (count + prior_weight)).reshape(s, b, levels)
    return torch.maximum(r_best, r_cur), r_cur > r_best


def value_grid(model: MarkovModel) -> torch.Tensor:
    """The J = S B + 1 levels the running best m can take (0 and every q_k(b), sorted; repeats allowed so J is fixed):
    m is always one of the q_k(b), so the levels carry it exactly."""
    return torch.cat([torch.zeros(1, dtype=torch.float64), model.q.reshape(-1).double()]).sort().values


def level_index(m: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    return (torch.searchsorted(grid, m.contiguous(), right=True) - 1).clamp(0, len(grid) - 1)


def no_recall_dp(model: MarkovModel, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """W[k, b] (value-to-go at stage k, bin b) and go[k, b] (continue?)."""
    s = model.stages
    w = torch.empty_like(model.q)
    go = torch.zeros_like(model.q, dtype=torch.bool)
    w[-1] = model.q[-1]
    for k in range(s - 2, -1, -1):   # backward induction over the (few) stages; each step is vectorised over bins
        cont = -lam * model.cost[k + 1] + model.trans[k] @ w[k + 1]
        go[k] = cont > model.q[k]
        w[k] = torch.maximum(model.q[k], cont)
    return w, go


def recall_dp(model: MarkovModel, lam: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """V[k, b, j] and go[k, b, j] over (stage, signal bin, running-best level j of `value_grid`); returns (V, go, grid).
    Exact: the successor max(m, q_{k+1}(b')) is itself a grid level."""
    s, b = model.q.shape
    grid = value_grid(model)
    levels = len(grid)
    v = torch.empty(s, b, levels, dtype=torch.float64)
    go = torch.zeros(s, b, levels, dtype=torch.bool)
    stops = model.stop_value if model.stop_value is not None else grid.expand(s, b, levels)
    v[-1] = stops[-1]
    for k in range(s - 2, -1, -1):
        nxt = torch.maximum(grid[None, :], model.q[k + 1][:, None])          # (B', J): best after stage k+1
        j2 = level_index(nxt, grid)                                           # (B', J)
        after = torch.gather(v[k + 1], 1, j2)                                 # V_{k+1}(b', max(m, q(b')))  (B', J)
        cont = -lam * model.cost[k + 1] + model.trans[k] @ after              # (B, J)
        stop = stops[k]
        go[k] = cont > stop
        v[k] = torch.maximum(stop, cont)
    return v, go, grid


def expected_value(model: MarkovModel, lam: float, recall: bool) -> float:
    """Optimal objective E[v_out - lambda cost] of the instance (first stage always consulted)."""
    if recall:
        v, _, grid = recall_dp(model, lam)
        j0 = level_index(model.q[0], grid)
        first = v[0, torch.arange(model.q.shape[1]), j0]
    else:
        first = no_recall_dp(model, lam)[0][0]
    return float(model.p0 @ first - lam * model.cost[0])


@dataclass
class Outcome:
    """Per query: the last consulted stage, the answering stage, and the cost paid."""

    stop: torch.Tensor
    answer: torch.Tensor
    cost: torch.Tensor

    def summary(self, correct: torch.Tensor) -> tuple[float, float]:
        """(accuracy, mean cost) given (N, S) correctness."""
        acc = correct.gather(1, self.answer[:, None]).float().mean()
        return float(acc), float(self.cost.mean())


def simulate(go_fn, values: torch.Tensor, bins: torch.Tensor, cost: torch.Tensor, recall: bool) -> Outcome:
    """Run a fixed-order policy on all queries at once. `go_fn(k, bins_k, best)` -> (N,) bool continue after stage k.

    values (N, S) are the policy's own estimates of each answer (it never sees correctness)."""
    n, s = values.shape
    alive = torch.ones(n, dtype=torch.bool)
    stop = torch.full((n,), s - 1, dtype=torch.long)
    best = values[:, 0].clone()
    answer = torch.zeros(n, dtype=torch.long)
    for k in range(s - 1):  # stages are few; every stage is one vectorised step over the queries still going
        cont = go_fn(k, bins[:, k], best) & alive
        ended = alive & ~cont
        stop[ended] = k
        alive = cont
        nxt = values[:, k + 1]
        if recall:
            better = alive & (nxt > best)
            answer[better] = k + 1
            best = torch.where(better, nxt, best)
        else:
            answer[alive] = k + 1
            best = torch.where(alive, nxt, best)
    return Outcome(stop, answer, torch.cumsum(cost, 0)[stop])


def threshold_policy(conf: torch.Tensor, cost: torch.Tensor, tau: float) -> Outcome:
    """The usual rule: exit at the first stage whose confidence reaches tau (the last stage otherwise); no recall."""
    n, s = conf.shape
    hit = conf >= tau
    hit[:, -1] = True
    stop = hit.float().argmax(1)
    return Outcome(stop, stop, torch.cumsum(cost, 0)[stop])


def dp_policy(model: MarkovModel, bins: torch.Tensor, lam: float, recall: bool) -> Outcome:
    """The optimal (under the Markov model) policy with or without recall, run on queries with these (N, S) signal bins;
    each consulted answer is valued by the model's q_k(bin)."""
    values = model.q[torch.arange(model.stages)[None, :], bins]
    if not recall:
        _, go = no_recall_dp(model, lam)
        return simulate(lambda k, b, best: go[k, b], values, bins, model.cost, recall=False)
    _, go, grid = recall_dp(model, lam)
    out = simulate(lambda k, b, best: go[k, b, level_index(best.double(), grid)], values, bins, model.cost, recall=True)
    if model.answer_current is not None:  # where the calibration split says so, answer with the stage we stop at
        rows = torch.arange(len(bins))
        best = values.cummax(1).values[rows, out.stop]
        use_current = model.answer_current[out.stop, bins[rows, out.stop], level_index(best.double(), grid)]
        out.answer = torch.where(use_current, out.stop, out.answer)
    return out


def reservation_values(samples: torch.Tensor, cost: torch.Tensor, lam: float, weights: torch.Tensor | None = None,
                       iters: int = 60) -> torch.Tensor:
    """sigma_i with E[(q_i - sigma_i)^+] = lambda c_i for each stage (column of `samples`, optionally with probability
    `weights` per sample and column), by bisection on all stages at once.

    The left side falls from E[q_i] - lo at sigma = lo to 0 at sigma = max q_i; when lambda c_i exceeds E[q_i] the index
    is below every outcome (the box is not worth opening for its own sake) and is extended linearly below 0."""
    samples = samples.double()
    w = torch.full_like(samples, 1.0 / len(samples)) if weights is None else weights.double() / weights.sum(0, keepdim=True)
    target = lam * cost.double()
    lo = samples.min(0).values - target - 1.0
    hi = samples.max(0).values.clone()
    for _ in range(iters):
        mid = (lo + hi) / 2
        gain = ((samples - mid[None]).clamp_min(0) * w).sum(0)
        lo = torch.where(gain > target, mid, lo)
        hi = torch.where(gain > target, hi, mid)
    return (lo + hi) / 2


def pandora_policy(values: torch.Tensor, cost: torch.Tensor, sigma: torch.Tensor) -> Outcome:
    """Weitzman's rule for a cascade of independent stages (free order, recall): open in decreasing sigma (the first box
    always, since a query needs an answer), stop when the best value seen is at least the next box's sigma."""
    n, s = values.shape
    order = sigma.argsort(descending=True)
    v = values[:, order]
    alive = torch.ones(n, dtype=torch.bool)
    best = v[:, 0].clone()
    answer = torch.zeros(n, dtype=torch.long)
    opened = torch.zeros(n, dtype=torch.long)
    paid = torch.full((n,), float(cost[order[0]]), dtype=torch.float64)
    for k in range(1, s):
        alive = alive & (best < sigma[order[k]])
        paid = paid + alive.double() * cost[order[k]]
        opened = opened + alive.long()
        better = alive & (v[:, k] > best)
        answer[better] = k
        best = torch.where(better, v[:, k], best)
    return Outcome(opened, order[answer], paid)


def oracle_policy(correct: torch.Tensor, cost: torch.Tensor, lam: float, nested: bool) -> Outcome:
    """Knows correctness: nested, consult the prefix maximising 1[some stage right] - lambda C_k and answer with a right
    stage; cascade, run the single model maximising 1[right] - lambda c_i."""
    if nested:
        cum = torch.cumsum(cost, 0)
        any_right = correct.cummax(1).values.double()
        stop = (any_right - lam * cum[None]).argmax(1)
        first_right = correct.float().argmax(1)
        answer = torch.where(correct.any(1), torch.minimum(first_right, stop), stop)
        return Outcome(stop, answer, cum[stop])
    pick = (correct.double() - lam * cost[None]).argmax(1)
    return Outcome(pick, pick, cost[pick])
