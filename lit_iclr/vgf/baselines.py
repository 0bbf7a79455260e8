"""Baselines of VGF, sharing its critic network, data and evaluation.

TD3+BC (Fujimoto & Gu, 2021), penalty-regularised:
    pi = argmax_pi E[ lambda Q(s, pi(s)) - (pi(s) - a)^2 ],  lambda = bc_alpha / mean|Q(s, pi(s))|
    y  = r + gamma m min_k Qbar_k(s', clip(pi_bar(s') + clip(eps, -c, c), -1, 1)),  eps ~ N(0, sigma^2)
  with states normalised by the dataset's mean and std (s - mu) / (sigma + 1e-3), as TD3+BC does (also at acting).

FQL (Park, Li, Levine, 2025), VGF's own base: the *same* flow reference policy mu_theta (flow matching) plus a
one-step policy mu_omega(s, z) distilled from it and pushed up Q:
    L_omega = -lambda mean Q(s, mu_omega(s, z)) + fql_alpha || mu_omega(s, z) - mu_theta(s, z) ||^2,
    lambda = 1 / mean|Q| (normalize_q_loss), mu_theta(s, z) the Euler-integrated flow from the same noise z;
    y = r + gamma m agg_k Qbar_k(s', mu_omega(s', z')).

IQL (Kostrikov, Nair, Levine, 2022): expectile value, in-sample TD and advantage-weighted regression:
    L_V = E |tau - 1(u < 0)| u^2,  u = min_k Qbar_k(s, a) - V(s)
    L_Q = sum_k (Q_k(s, a) - r - gamma m V(s'))^2
    L_pi = -E exp(beta (min_k Qbar_k(s, a) - V(s))) clipped at 100, times log pi(a | s)  (Gaussian, state-independent std)
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from lightning.pytorch.cli import OptimizerCallable

from .model import Critic, DeterministicActor, FlowPolicy, GaussianActor, OneStepPolicy, mlp
from .module import OfflineRLModule, polyak


class TD3BC(OfflineRLModule):
    """TD3+BC offline RL baseline (deterministic actor, clipped double Q, BC penalty)."""

    def __init__(self, obs_dim: int = 1, action_dim: int = 1, actor_hidden: Sequence[int] = (256, 256, 256),
                 critic_hidden: Sequence[int] = (256, 256, 256), critic_layer_norm: bool = True,
                 discount: float = 0.99, tau: float = 0.005, bc_alpha: float = 2.5, policy_noise: float = 0.2,
                 noise_clip: float = 0.5, policy_freq: int = 2, normalize_states: bool = True,
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
            normalize_states: Standardise observations with the training data's mean and std (TD3+BC's default),
                computed when fitting starts and kept in the checkpoint (buffers `obs_mean`, `obs_std`).
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
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))

    def on_fit_start(self) -> None:
        """TD3+BC's state normalisation: mu, sigma of the dataset's observations, sigma + 1e-3 (their eps)."""
        dm = self.trainer.datamodule if self._trainer is not None else None
        if self.hparams.normalize_states and getattr(dm, "transitions", None) is not None:
            obs = dm.transitions["observations"].to(self.obs_mean)
            self.obs_mean.copy_(obs.mean(0))
            self.obs_std.copy_(obs.std(0) + 1e-3)

    def norm(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self.obs_mean) / self.obs_std

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        hp = self.hparams
        opt_actor, opt_critic = self.optimizers()
        g = self.step_generator()
        batch = dict(batch, observations=self.norm(batch["observations"]),
                     next_observations=self.norm(batch["next_observations"]))
        with torch.no_grad():
            next_obs = batch["next_observations"]
            noise = self.rank_rows(lambda n: torch.randn(n, hp.action_dim, generator=g, device=self.device),
                                   next_obs.shape[0])  # the global batch's draw, this rank's rows
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
            lam = hp.bc_alpha / self.batch_mean(q.abs().mean())  # TD3+BC's normaliser: over the global batch
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
        obs = self.norm(obs)
        a = self.actor(obs)
        return a, self.critic.value(obs, a, "min")

    def configure_optimizers(self):
        return [self.actor_optimizer(self.actor.parameters()), self.critic_optimizer(self.critic.parameters())]


class FQL(OfflineRLModule):
    """Flow Q-learning: VGF's flow reference policy, distilled into a one-step policy that maximises Q."""

    def __init__(self, obs_dim: int = 1, action_dim: int = 1, actor_hidden: Sequence[int] = (256, 256, 256),
                 critic_hidden: Sequence[int] = (256, 256, 256), critic_layer_norm: bool = True,
                 discount: float = 0.99, tau: float = 0.005, fql_alpha: float = 1.0, bc_flow_steps: int = 10,
                 normalize_q_loss: bool = True, value_q_agg: str = "min",
                 actor_optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=3e-4),
                 critic_optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=3e-4),
                 seed: int = 0):
        """
        Args:
            obs_dim: Observation size (linked from the data).
            action_dim: Action size (linked from the data).
            actor_hidden: Hidden widths of the flow policy's velocity MLP and of the one-step policy.
            critic_hidden: Hidden widths of each Q network.
            critic_layer_norm: LayerNorm in the critics.
            discount: gamma.
            tau: Polyak rate of the target critic.
            fql_alpha: Weight of the distillation term || mu_omega - mu_theta ||^2 (FQL's alpha).
            bc_flow_steps: Euler steps of the flow policy (the distillation target).
            normalize_q_loss: Divide the Q term by mean |Q| (FQL's `normalize_q_loss`).
            value_q_agg: Ensemble reduction of the TD target: `min` (D4RL) or `mean` (OGBench).
            actor_optimizer: Optimizer of the flow policy and the one-step policy.
            critic_optimizer: Optimizer of the critics.
            seed: Seed of the per-step noise.
        """
        super().__init__()
        self.save_hyperparameters(ignore=["actor_optimizer", "critic_optimizer"])
        self.automatic_optimization = False
        self.actor_optimizer, self.critic_optimizer = actor_optimizer, critic_optimizer
        self.policy = FlowPolicy(obs_dim, action_dim, actor_hidden)  # the same class and size as VGF's mu_theta
        self.one_step = OneStepPolicy(obs_dim, action_dim, actor_hidden)
        self.critic = Critic(obs_dim, action_dim, critic_hidden, critic_layer_norm)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        hp = self.hparams
        opt_actor, opt_critic = self.optimizers()
        g = self.step_generator()
        obs, actions = batch["observations"], batch["actions"]
        n, dim = actions.shape
        draw = lambda m: torch.randn(m, dim, generator=g, device=self.device)  # noqa: E731 - the global batch's draw
        z_next, z = self.rank_rows(draw, n), self.rank_rows(draw, n)
        with torch.no_grad():
            next_a = self.one_step(batch["next_observations"], z_next)
            next_q = self.target_critic.value(batch["next_observations"], next_a, hp.value_q_agg)
            target = batch["rewards"] + hp.discount * batch["masks"] * next_q
            flow_a = self.policy.sample(obs, hp.bc_flow_steps, noise=z)  # distillation target mu_theta(s, z)
        critic_loss = (self.critic(obs, actions) - target).pow(2).sum(0).mean()
        opt_critic.zero_grad()
        self.manual_backward(critic_loss)
        opt_critic.step()

        fm_noise = (self.rank_rows(draw, n),  # x_0 and t as `flow_matching_loss` draws them, for the global batch
                    self.rank_rows(lambda m: torch.rand(m, 1, generator=g, device=self.device), n))
        bc_loss = self.policy.flow_matching_loss(obs, actions, noise=fm_noise)
        a = self.one_step(obs, z)
        distill_loss = (a - flow_a).pow(2).mean()
        q = self.critic.value(obs, a, "mean")  # the critic after its step, as TD3+BC's actor sees it
        q_loss = -q.mean()
        if hp.normalize_q_loss:
            q_loss = q_loss / self.batch_mean(q.abs().mean())  # over the global batch (DDP)
        actor_loss = bc_loss + hp.fql_alpha * distill_loss + q_loss
        opt_actor.zero_grad()
        self.manual_backward(actor_loss)  # the critic's grads from this backward are cleared before its next step
        opt_actor.step()
        polyak(self.target_critic, self.critic, hp.tau)
        self.count_step()
        self.log_train({"train/critic_loss": critic_loss, "train/bc_loss": bc_loss, "train/distill_loss": distill_loss,
                        "train/q_mean": q.detach().mean()}, prog_bar=("train/critic_loss",))

    def eval_groups(self) -> list[str]:
        return ["pi"]

    def act_groups(self, obs, groups, generator):
        z = torch.randn(obs.shape[0], self.hparams.action_dim, generator=generator, device=obs.device)
        a = self.one_step(obs, z)
        return a, self.critic.value(obs, a, self.hparams.value_q_agg)

    def configure_optimizers(self):
        actor = list(self.policy.parameters()) + list(self.one_step.parameters())
        return [self.actor_optimizer(actor), self.critic_optimizer(self.critic.parameters())]


class IQL(OfflineRLModule):
    """Implicit Q-learning: expectile V, in-sample TD through V(s'), advantage-weighted Gaussian policy."""

    def __init__(self, obs_dim: int = 1, action_dim: int = 1, actor_hidden: Sequence[int] = (256, 256, 256),
                 critic_hidden: Sequence[int] = (256, 256, 256), critic_layer_norm: bool = True,
                 discount: float = 0.99, tau: float = 0.005, expectile: float = 0.7, beta: float = 3.0,
                 max_weight: float = 100.0,
                 actor_optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=3e-4),
                 critic_optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=3e-4),
                 seed: int = 0):
        """
        Args:
            obs_dim: Observation size (linked from the data).
            action_dim: Action size (linked from the data).
            actor_hidden: Hidden widths of the Gaussian policy's mean network.
            critic_hidden: Hidden widths of each Q network and of V.
            critic_layer_norm: LayerNorm in the critics and V.
            discount: gamma.
            tau: Polyak rate of the target critic.
            expectile: tau of the expectile regression of V (IQL: 0.7 for locomotion).
            beta: Inverse temperature of the advantage weights (IQL: 3.0 for locomotion).
            max_weight: Clip of exp(beta A) (IQL: 100).
            actor_optimizer: Optimizer of the policy.
            critic_optimizer: Optimizer of the critics and V.
            seed: Seed (the update is deterministic; kept for the common interface).
        """
        super().__init__()
        self.save_hyperparameters(ignore=["actor_optimizer", "critic_optimizer"])
        self.automatic_optimization = False
        self.actor_optimizer, self.critic_optimizer = actor_optimizer, critic_optimizer
        self.actor = GaussianActor(obs_dim, action_dim, actor_hidden)
        self.critic = Critic(obs_dim, action_dim, critic_hidden, critic_layer_norm)
        self.value_net = mlp(obs_dim, critic_hidden, 1, critic_layer_norm)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)

    def v(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_net(obs).squeeze(-1)

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        hp = self.hparams
        opt_actor, opt_critic = self.optimizers()
        obs, actions = batch["observations"], batch["actions"]
        with torch.no_grad():
            q_t = self.target_critic.value(obs, actions, "min")
            target = batch["rewards"] + hp.discount * batch["masks"] * self.v(batch["next_observations"])
        v = self.v(obs)
        u = q_t - v
        value_loss = ((hp.expectile - (u < 0).float()).abs() * u.pow(2)).mean()  # expectile regression
        critic_loss = (self.critic(obs, actions) - target).pow(2).sum(0).mean()
        weights = torch.exp(hp.beta * u.detach()).clamp(max=hp.max_weight)
        actor_loss = -(weights * self.actor.log_prob(obs, actions)).mean()
        opt_critic.zero_grad()
        opt_actor.zero_grad()
        self.manual_backward(value_loss + critic_loss + actor_loss)  # disjoint parameters: one backward for all three
        opt_critic.step()
        opt_actor.step()
        polyak(self.target_critic, self.critic, hp.tau)
        self.count_step()
        self.log_train({"train/critic_loss": critic_loss, "train/value_loss": value_loss, "train/actor_loss": actor_loss},
                       prog_bar=("train/critic_loss",))

    def eval_groups(self) -> list[str]:
        return ["pi"]

    def act_groups(self, obs, groups, generator):
        a = self.actor.mean(obs)  # deterministic evaluation, as IQL
        return a, self.critic.value(obs, a, "min")

    def configure_optimizers(self):
        critic = list(self.critic.parameters()) + list(self.value_net.parameters())
        return [self.actor_optimizer(self.actor.parameters()), self.critic_optimizer(critic)]
