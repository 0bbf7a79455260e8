"""Networks of SOOPER: ensembles as one batched matmul per layer, the probabilistic dynamics model, SAC's actor.

Every ensemble (dynamics members, critic heads) is an `EnsembleMLP`: its weights are [E, in, out] and a layer is one
`torch.baddbmm` over all members, so a rollout step is a single forward for every member and every rollout.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class EnsembleLinear(nn.Module):
    """E independent linear layers applied as one batched matmul: x [E, N, in] -> [E, N, out]."""

    def __init__(self, members: int, in_features: int, out_features: int):
        super().__init__()
        bound = 1 / math.sqrt(in_features)  # nn.Linear's default init, member by member
        self.weight = nn.Parameter(torch.empty(members, in_features, out_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, 1, out_features).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleMLP(nn.Module):
    """E MLPs with SiLU activations (optionally LayerNorm), evaluated together; input [E, N, in] or [N, in] (shared)."""

    def __init__(self, members: int, in_features: int, out_features: int, hidden: list[int], layer_norm: bool = False):
        super().__init__()
        self.members = members
        sizes = [in_features, *hidden]
        self.hidden = nn.ModuleList(EnsembleLinear(members, a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        self.norms = nn.ModuleList(nn.LayerNorm(b) if layer_norm else nn.Identity() for b in hidden)
        self.out = EnsembleLinear(members, sizes[-1], out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.expand(self.members, *x.shape)
        for layer, norm in zip(self.hidden, self.norms, strict=True):
            x = F.silu(norm(layer(x)))
        return self.out(x)


class Critics(nn.Module):
    """K Q-function heads Q_k(s, a) as one ensemble; forward returns [K, N]."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int], heads: int = 2, layer_norm: bool = True):
        super().__init__()
        self.net = EnsembleMLP(heads, obs_dim + action_dim, 1, hidden, layer_norm)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, action], -1)).squeeze(-1)


class TanhGaussianActor(nn.Module):
    """SAC's policy: a = tanh(u), u ~ N(mu(s), sigma(s)); `mode` is tanh(mu)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int], log_std_range: tuple[float, float] = (-5.0, 2.0)):
        super().__init__()
        self.net = EnsembleMLP(1, obs_dim, 2 * action_dim, hidden)
        self.action_dim, self.log_std_range = action_dim, log_std_range

    def forward(self, obs: torch.Tensor, deterministic: bool = False,
                noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`noise`: the standard normal draw of u, given (drawn outside a compiled update); None: drawn here."""
        mu, log_std = self.net(obs)[0].chunk(2, -1)
        lo, hi = self.log_std_range
        log_std = lo + 0.5 * (hi - lo) * (torch.tanh(log_std) + 1)
        if deterministic:
            return torch.tanh(mu), torch.zeros(obs.shape[:-1], device=obs.device)
        u = mu + log_std.exp() * (torch.randn_like(mu) if noise is None else noise)
        a = torch.tanh(u)
        # log N(u; mu, sigma) - sum log(1 - tanh(u)^2), the latter in the stable form 2 (log 2 - u - softplus(-2u))
        logp = (-0.5 * ((u - mu) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        logp = logp - (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)
        return a, logp


class DeterministicPolicy(nn.Module):
    """The prior pi_hat(s) = tanh(MLP(s)), fitted to the offline data by behaviour cloning."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int]):
        super().__init__()
        self.net = EnsembleMLP(1, obs_dim, action_dim, hidden)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs)[0])


class DynamicsEnsemble(nn.Module):
    """E probabilistic models p_e(s' - s, r, c | s, a) = N(mean_e, diag var_e) (PETS / MBPO style).

    Inputs are standardised with statistics of the real replay (`set_normalizer`); the bounded log-variance uses
    PETS' learned soft bounds.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int], members: int = 5):
        super().__init__()
        self.obs_dim, self.members = obs_dim, members
        self.out_dim = obs_dim + 2  # delta state, reward, cost
        self.net = EnsembleMLP(members, obs_dim + action_dim, 2 * self.out_dim, hidden)
        self.max_logvar = nn.Parameter(torch.full((self.out_dim,), 0.5))
        self.min_logvar = nn.Parameter(torch.full((self.out_dim,), -10.0))
        self.register_buffer("in_mean", torch.zeros(obs_dim + action_dim))
        self.register_buffer("in_std", torch.ones(obs_dim + action_dim))
        self.register_buffer("out_std", torch.ones(self.out_dim))

    def set_normalizer(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.in_mean.copy_(inputs.mean(0))
        self.in_std.copy_(inputs.std(0).clamp_min(1e-3))
        self.out_std.copy_(targets.std(0).clamp_min(1e-3))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance of every member, in standardised target units: [E, N, obs_dim + 2] each."""
        x = (torch.cat([obs, action], -1) - self.in_mean) / self.in_std
        mean, logvar = self.net(x).chunk(2, -1)
        logvar = self.max_logvar - F.softplus(self.max_logvar - logvar)
        logvar = self.min_logvar + F.softplus(logvar - self.min_logvar)
        return mean, logvar

    def loss(self, obs: torch.Tensor, action: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Gaussian NLL of targets [E, N, obs_dim + 2] (each member its own bootstrap batch), plus the bound penalty."""
        mean, logvar = self(obs, action)
        nll = (((mean - target / self.out_std) ** 2) * torch.exp(-logvar) + logvar).mean()
        return nll + 0.01 * (self.max_logvar.sum() - self.min_logvar.sum())

    def predict(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Every member's mean prediction [E, N, obs_dim + 2] in real units: next state, reward, cost."""
        mean, _ = self(obs, action)
        mean = mean * self.out_std
        return torch.cat([obs + mean[..., : self.obs_dim], mean[..., self.obs_dim:]], -1)
