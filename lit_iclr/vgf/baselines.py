"""TD3+BC (Fujimoto & Gu, 2021): the penalty-regularised baseline VGF is compared with.

    pi = argmax_pi E[ lambda Q(s, pi(s)) - (pi(s) - a)^2 ],  lambda = bc_alpha / mean|Q(s, pi(s))|
    y  = r + gamma m min_k Qbar_k(s', clip(pi_bar(s') + clip(eps, -c, c), -1, 1)),  eps ~ N(0, sigma^2)

The behaviour regulariser is an explicit penalty weighted by `bc_alpha`, where VGF bounds a transport budget instead.
It shares the critic network, the data and the evaluation of `VGF`.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from lightning.pytorch.cli import OptimizerCallable

from .model import Critic, DeterministicActor
from .module import OfflineRLModule, polyak


class TD3BC(OfflineRLModule):
    """TD3+BC offline RL baseline (deterministic actor, clipped double Q, BC penalty)."""

    def __init__(self, obs_dim: int = 1, action_dim: int = 1, actor_hidden: Sequence[int] = (256, 256, 256),
                 critic_hidden: Sequence[int] = (256, 256, 256), critic_layer_norm: bool = True,
                 discount: float = 0.99, tau: float = 0.005, bc_alpha: float = 2.5, policy_noise: float = 0.2,
                 noise_clip: float = 0.5, policy_freq: int = 2,
                 actor_optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=3e-4),
                 critic_optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=3e-4),
                 seed: int = 0):
        """
        Args:
            obs_dim: Observation size (linked from the data).
            action_dim: Action size (linked from the data).
            actor_hidden: Hidden widths of the actor.
            critic_hidden: Hidden widths of each Q network.
            critic_layer_norm: LayerNorm in the critics (as VGF's, for a like-for-like comparison).
            discount: gamma.
            tau: Polyak rate of the target networks.
            bc_alpha: alpha of TD3+BC: weight of the value term against the BC penalty.
            policy_noise: Target policy smoothing noise sigma.
            noise_clip: Clip c of the smoothing noise.
            policy_freq: Actor (and target) update every `policy_freq` critic updates.
            actor_optimizer: Optimizer of the actor.
            critic_optimizer: Optimizer of the critics.
            seed: Seed of the per-step noise.
        """
        super().__init__()
        self.save_hyperparameters(ignore=["actor_optimizer", "critic_optimizer"])
        self.automatic_optimization = False
        self.actor_optimizer, self.critic_optimizer = actor_optimizer, critic_optimizer
        self.actor = DeterministicActor(obs_dim, action_dim, actor_hidden)
        self.critic = Critic(obs_dim, action_dim, critic_hidden, critic_layer_norm)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        hp = self.hparams
        opt_actor, opt_critic = self.optimizers()
        g = self.step_generator()
        with torch.no_grad():
            next_obs = batch["next_observations"]
            noise = torch.randn(next_obs.shape[0], hp.action_dim, generator=g, device=self.device)
            noise = (hp.policy_noise * noise).clamp(-hp.noise_clip, hp.noise_clip)
            next_a = (self.target_actor(next_obs) + noise).clamp(-1.0, 1.0)
            target = batch["rewards"] + hp.discount * batch["masks"] * self.target_critic.value(next_obs, next_a, "min")
        qs = self.critic(batch["observations"], batch["actions"])
        critic_loss = (qs - target).pow(2).sum(0).mean()
        opt_critic.zero_grad()
        self.manual_backward(critic_loss)
        opt_critic.step()

        if self.step_count() % hp.policy_freq == 0:
            pi = self.actor(batch["observations"])
            q = self.critic(batch["observations"], pi)[0]
            lam = hp.bc_alpha / q.abs().mean().detach()
            actor_loss = -lam * q.mean() + (pi - batch["actions"]).pow(2).mean()
            opt_actor.zero_grad()
            self.manual_backward(actor_loss)
            opt_actor.step()
            polyak(self.target_actor, self.actor, hp.tau)
            polyak(self.target_critic, self.critic, hp.tau)
            logs = {"train/critic_loss": critic_loss, "train/actor_loss": actor_loss}
        else:
            logs = {"train/critic_loss": critic_loss}
        self.count_step()
        self.log_train(logs, prog_bar=("train/critic_loss",))

    def eval_groups(self) -> list[str]:
        return ["pi"]

    def act_groups(self, obs, groups, generator):
        a = self.actor(obs)
        return a, self.critic.value(obs, a, "min")

    def configure_optimizers(self):
        return [self.actor_optimizer(self.actor.parameters()), self.critic_optimizer(self.critic.parameters())]
