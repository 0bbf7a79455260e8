"""SOOPER's safety filters and its optimistic, terminating planning MDP (imagined rollouts in the learned model).

Notation (paper, Sec. 4): C_t = sum_{tau < t} gamma_c^tau c_tau is the discounted cost accumulated so far in the
episode, Q_c^{pi_hat} and Q_r^{pi_hat} are the prior's cost and reward critics, d the budget.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FILTERS = ("sooper", "advantage", "none")


def aggregate_cost(q_heads: torch.Tensor, kappa: float, margin: float = 0.0) -> torch.Tensor:
    """A pessimistic cost-to-go from the critic heads [K, N]: mean + kappa * std over heads + margin (kappa = 0 and
    margin = 0: the mean). With K = 2 heads, kappa = 1 is above the larger head (std = |q1 - q2| / sqrt 2)."""
    if kappa == 0 or q_heads.shape[0] == 1:
        return q_heads.mean(0) + margin
    return q_heads.mean(0) + kappa * q_heads.std(0) + margin


def sooper_unsafe(cum_cost: torch.Tensor, discount_t: torch.Tensor, q_c: torch.Tensor, budget: float) -> torch.Tensor:
    """SOOPER's filter: intervene unless Phi = C_t + gamma_c^t Q_c^{pi_hat}(s_t, a) < d.

    C_t + gamma_c^t Q_c is the expected discounted episode cost if `a` is taken now and the prior acts from then on.
    """
    return cum_cost + discount_t * q_c >= budget


def advantage_unsafe(q_c: torch.Tensor, q_c_prior: torch.Tensor, threshold: float) -> torch.Tensor:
    """The SAILR-style advantage filter: intervene when Q_c(s, a) - Q_c(s, pi_hat(s)) > threshold."""
    return q_c - q_c_prior > threshold


@dataclass
class PlanningConfig:
    horizon: int
    optimism: float  # lambda_opt: reward bonus per unit of ensemble disagreement
    pessimism: float  # lambda_pess: cost bonus per unit of ensemble disagreement
    cost_discount: float  # gamma_c
    filter: str  # "sooper" | "advantage" | "none"
    budget: float
    advantage_threshold: float
    cost_kappa: float  # head pessimism of Q_c^{pi_hat}
    cost_margin: float = 0.0  # explicit margin added to Q_c^{pi_hat} (upper bound)
    penalty: float = 0.0  # Lagrange multiplier lambda: reward r - lambda c (SAC-Lagrangian)
    undiscounted_phi: bool = False  # Phi = C_t + Q_c (authors' code) instead of C_t + gamma_c^t Q_c


def unsafe_mask(cfg: PlanningConfig, obs, action, cum_cost, discount_t, prior, prior_cost) -> torch.Tensor:
    """Where the configured filter would hand control to the prior (all False for "none")."""
    if cfg.filter == "none":
        return torch.zeros(obs.shape[0], dtype=torch.bool, device=obs.device)
    q_c = aggregate_cost(prior_cost(obs, action), cfg.cost_kappa, cfg.cost_margin)
    if cfg.filter == "sooper":
        return sooper_unsafe(cum_cost, torch.ones_like(discount_t) if cfg.undiscounted_phi else discount_t, q_c, cfg.budget)
    q_c_prior = aggregate_cost(prior_cost(obs, prior(obs)), cfg.cost_kappa, cfg.cost_margin)
    return advantage_unsafe(q_c, q_c_prior, cfg.advantage_threshold)


def imagine_step(cfg: PlanningConfig, model, actor, prior, prior_cost, s: torch.Tensor, c_acc: torch.Tensor,
                 disc: torch.Tensor, noise: torch.Tensor, member: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One imagined step of the live rollouts s [M, obs_dim], before terminations: the policy's action a (its Gaussian
    draw `noise` given), where the filter would intervene, and the next state, optimistic reward r_hat + lambda_opt u and
    pessimistic cost c_hat + lambda_pess u of member `member` [M] of every rollout (TS-1). A pure function of its
    inputs, so `compile_update` compiles it (one graph per step instead of ~60 small operations)."""
    a, _ = actor(s, noise=noise)
    unsafe = unsafe_mask(cfg, s, a, c_acc, disc, prior, prior_cost)
    pred = model.predict(s, a)  # [E, M, obs_dim + 2]: one batched forward, every member on every rollout
    chosen = pred[member, torch.arange(s.shape[0], device=s.device)]
    u = pred[..., : s.shape[1]].std(0).mean(-1) if pred.shape[0] > 1 else torch.zeros(s.shape[0])
    next_s, r_hat, c_hat = chosen[:, : s.shape[1]], chosen[:, -2], chosen[:, -1]
    reward = r_hat + cfg.optimism * u
    cost = (c_hat + cfg.pessimism * u).clamp_min(0.0)
    return a, unsafe, next_s, reward, cost


@torch.no_grad()
def imagine(cfg: PlanningConfig, model, actor, prior, prior_reward, prior_cost, obs: torch.Tensor,
            cum_cost: torch.Tensor, discount_t: torch.Tensor, generator: torch.Generator | None = None,
            step=imagine_step) -> dict:
    """Roll the policy out in the learned model from N replay states for `cfg.horizon` steps, all rollouts at once.

    Per step: a ~ pi(s); where the filter would intervene the rollout **terminates** with reward
    Q_r^{pi_hat}(s, pi_hat(s)) (the value of handing over to the prior); elsewhere one forward of every ensemble member
    on every rollout gives the next state, reward and cost of a member drawn per rollout (TS-1), and the ensemble's
    disagreement u (std over members of the next-state mean, averaged over dimensions) makes the reward optimistic,
    r_hat + lambda_opt u, and the cost pessimistic, c_hat + lambda_pess u.

    `step`: `imagine_step` or its compiled form. Returns the flattened transitions (obs, action, reward, next_obs,
    done) of the live rollouts and counts.
    """
    n = obs.shape[0]
    alive = torch.ones(n, dtype=torch.bool, device=obs.device)
    out = {k: [] for k in ("obs", "action", "reward", "next_obs", "done")}
    terminated = 0
    for _ in range(cfg.horizon):
        s, c_acc, disc = obs[alive], cum_cost[alive], discount_t[alive]
        if s.shape[0] == 0:
            break
        noise = torch.randn(s.shape[0], actor.action_dim, device=s.device)  # the policy's draw (global generator)
        member = torch.randint(model.members, (s.shape[0],), generator=generator, device=s.device)
        a, unsafe, next_s, reward, cost = step(cfg, model, actor, prior, prior_cost, s, c_acc, disc, noise, member)
        reward = reward - cfg.penalty * cost
        if unsafe.any():
            v_prior = prior_reward(s[unsafe], prior(s[unsafe])).min(0).values  # pessimistic over the reward heads
            reward = torch.where(unsafe, torch.zeros_like(reward).index_put((unsafe.nonzero()[:, 0],), v_prior), reward)
        out["obs"].append(s)
        out["action"].append(a)
        out["reward"].append(reward)
        out["next_obs"].append(torch.where(unsafe[:, None], s, next_s))
        out["done"].append(unsafe.float())
        terminated += int(unsafe.sum())
        # advance the live rollouts; the terminated ones stop here
        idx = alive.nonzero()[:, 0]
        obs = obs.clone()
        obs[idx] = next_s
        cum_cost = cum_cost.clone()
        cum_cost[idx] = c_acc + disc * cost
        discount_t = discount_t.clone()
        discount_t[idx] = disc * cfg.cost_discount
        alive[idx[unsafe]] = False
    flat = {k: torch.cat(v) for k, v in out.items()}
    flat["terminated"] = terminated
    return flat
