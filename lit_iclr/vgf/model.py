"""Plain PyTorch networks of VGF (no Lightning): the flow-matching reference policy, the twin critic, the amortised
action-gradient network of A-VGF and the deterministic actor of the TD3+BC baseline.

Shapes: observations `[..., obs_dim]`, actions `[..., action_dim]`; every network accepts any number of leading batch
dimensions, so a `[B, N, action_dim]` block of particles is evaluated in one call. The networks conditioned on a state
and an action take the observations with leading dimensions that *broadcast* against the actions' (`[B, 1, obs_dim]`
against `[B, N, action_dim]` particles): their first layer on cat(s, a) is applied in parts, W [s; a] + b =
(W_s s + b) + W_a a, and the state part is computed once per state (and once per reference-flow sampling or transport,
see `state_features`), not once per particle and step. Same numbers as the concatenated layer up to float rounding;
the parameters and checkpoints are those of the plain layer. `matmul` (set by the module) picks the library of the
products: `aten` (PyTorch's own: MKL on x86 CPUs) or `onednn` (`core/onednn_linear.py`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from lit_iclr.core.onednn_linear import ensemble_linear, linear


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, layer_norm: bool = False) -> nn.Sequential:
    """ReLU MLP; `layer_norm` puts a LayerNorm after every hidden Linear (as FQL/VGF do for the critic)."""
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers.append(nn.Linear(d, h))
        if layer_norm:
            layers.append(nn.LayerNorm(h))
        layers.append(nn.ReLU())
        d = h
    layers.append(nn.Linear(d, out_dim))
    return nn.Sequential(*layers)


def state_part(first: nn.Linear, obs: torch.Tensor, matmul: str = "aten") -> torch.Tensor:
    """W_s s + b: the columns of a first layer on cat(s, ...) that see the state (the first `obs.shape[-1]`)."""
    return linear(obs, first.weight[:, :obs.shape[-1]], first.bias, matmul)


def after_first(net: nn.Sequential, h: torch.Tensor, matmul: str = "aten") -> torch.Tensor:
    """The layers of `net` after its first, on the first layer's output `h`; Linear layers through `matmul`."""
    for layer in list(net)[1:]:
        h = apply_linear(layer, h, matmul) if isinstance(layer, nn.Linear) else layer(h)
    return h


FEW_OUTPUTS = 8  # compiled, a Linear with at most this many outputs is a fused product and sum (`apply_linear`)


def apply_linear(layer: nn.Linear, h: torch.Tensor, matmul: str = "aten") -> torch.Tensor:
    """`layer(h)` through `matmul`. Compiled, a head with at most FEW_OUTPUTS outputs (the velocity of the action) is a product
    and a sum over the hidden units, which inductor fuses with the layer before and the Euler step after: MKL's
    product with a few output columns is its slow path (1024 x 128 x 5: 39 us); 0.955x [0.924, 0.987] of the compiled
    update at the default size. Eager, that product would materialise [..., out, hidden], so it stays a product."""
    if torch.compiler.is_compiling() and layer.out_features <= FEW_OUTPUTS:
        y = (h.unsqueeze(-2) * layer.weight).sum(-1)
        return y if layer.bias is None else y + layer.bias
    return linear(h, layer.weight, layer.bias, matmul)


class FlowPolicy(nn.Module):
    """Reference policy mu_theta(a|s): a rectified-flow velocity field v_theta(s, x_t, t), sampled by Euler steps.

    Flow matching (paper Sec. 3 / FQL): x_0 ~ N(0, I), x_1 = a, x_t = (1 - t) x_0 + t x_1, and v_theta regresses the
    constant velocity x_1 - x_0. Sampling integrates dx/dt = v_theta from t = 0 to 1 and clips to the action box.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256, 256),
                 layer_norm: bool = False, matmul: str = "aten"):
        super().__init__()
        self.obs_dim, self.action_dim, self.matmul = obs_dim, action_dim, matmul
        self.net = mlp(obs_dim + action_dim + 1, hidden, action_dim, layer_norm)  # input cat(s, x_t, t)

    def state_features(self, obs: torch.Tensor) -> torch.Tensor:
        """The first layer's state part W_s s + b `[..., H]`: the same for every particle and Euler step of a state."""
        return state_part(self.net[0], obs, self.matmul)

    def velocity_from_features(self, features: torch.Tensor, x: torch.Tensor, t: torch.Tensor | float
                               ) -> torch.Tensor:
        """v_theta(s, x_t, t) from `state_features(s)`: first layer (W_s s + b) + W_xt [x_t, t], then the rest."""
        if not torch.is_tensor(t):
            t = x.new_full((*x.shape[:-1], 1), t)
        # (x_t, t) through one product: `t * w_t` with the weight's strided last column would keep inductor's fused
        # first-layer kernel scalar (measured 8 % slower sampling)
        xt = linear(torch.cat([x, t], dim=-1), self.net[0].weight[:, self.obs_dim:], None, self.matmul)
        return after_first(self.net, features + xt, self.matmul)

    def velocity(self, obs: torch.Tensor, x: torch.Tensor, t: torch.Tensor | float) -> torch.Tensor:
        """v_theta(s, x_t, t) = net(cat(s, x_t, t)); `t` is a float or has shape `[..., 1]`."""
        return self.velocity_from_features(self.state_features(obs), x, t)

    def flow_matching_loss(self, obs: torch.Tensor, actions: torch.Tensor, generator: torch.Generator | None = None,
                           noise: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """|| v_theta(s, x_t, t) - (x_1 - x_0) ||^2 averaged over the batch and action dims; `noise` = (x_0, t) given
        instead of drawn."""
        if noise is None:
            x0 = torch.randn(actions.shape, generator=generator, device=actions.device, dtype=actions.dtype)
            t = torch.rand((*actions.shape[:-1], 1), generator=generator, device=actions.device, dtype=actions.dtype)
        else:
            x0, t = noise
        xt = (1 - t) * x0 + t * actions
        return (self.velocity(obs, xt, t) - (actions - x0)).pow(2).mean()

    def sample(self, obs: torch.Tensor, steps: int = 10, generator: torch.Generator | None = None,
               noise: torch.Tensor | None = None) -> torch.Tensor:
        """Euler-integrate the flow from Gaussian noise for `steps` steps; returns actions clipped to [-1, 1].

        `obs` `[..., D]` may broadcast against the noise (`[B, 1, D]` for `[B, N, A]` particles); without `noise`,
        the samples take the shape of `obs`."""
        x = noise if noise is not None else torch.randn(
            (*obs.shape[:-1], self.action_dim), generator=generator, device=obs.device, dtype=obs.dtype)
        features = self.state_features(obs)  # once for all N particles and all Euler steps
        for i in range(steps):
            x = x + self.velocity_from_features(features, x, i / steps) / steps
        return x.clamp(-1.0, 1.0)


class EnsembleLinear(nn.Module):
    """`num` independent Linear layers applied to a stacked input `[num, ..., in]` with one batched matmul."""

    def __init__(self, num: int, in_dim: int, out_dim: int, matmul: str = "aten"):
        super().__init__()
        self.matmul = matmul
        self.weight = nn.Parameter(torch.empty(num, in_dim, out_dim))
        self.bias = nn.Parameter(torch.empty(num, 1, out_dim))
        bound = 1.0 / math.sqrt(in_dim)  # nn.Linear's default initialisation, per member
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x3 = x.reshape(shape[0], -1, shape[-1])
        if self.weight.shape[-1] == 1:  # a Q head: a batched matmul with one output column is MKL's slow path on
            # CPU (280 us for [2, 1024, 128] vs 67 us as a product and sum, which inductor also fuses into the layer before)
            y = (x3 * self.weight.transpose(1, 2)).sum(-1, keepdim=True) + self.bias
        else:
            y = ensemble_linear(x3, self.weight, self.bias, self.matmul)
        return y.reshape(*shape[:-1], y.shape[-1])

    def partial(self, x: torch.Tensor, start: int, bias: bool) -> torch.Tensor:
        """The layer on input features `start : start + x.shape[-1]` only, for every member: x `[..., d]` (shared by
        the members) -> `[num, ..., out]`; with `bias`, b is added. Parts of one input sum to `forward` of the whole."""
        num, _, out = self.weight.shape
        w = self.weight[:, start:start + x.shape[-1]]
        # an explicit bmm on the expanded input: `matmul`'s broadcasting folds it into products whose backward to a
        # few-column input (the action part) is MKL's slow skinny path (measured 8x slower than this bmm's)
        x3 = x.reshape(1, -1, x.shape[-1]).expand(num, -1, -1)
        y = ensemble_linear(x3, w, None, self.matmul).reshape(num, *x.shape[:-1], out)
        return y + self.bias.reshape(num, *[1] * (x.dim() - 1), out) if bias else y


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over the last dim with a separate gain and bias per ensemble member."""

    def __init__(self, num: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num, 1, dim))
        self.bias = nn.Parameter(torch.zeros(num, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = nn.functional.layer_norm(x, shape[-1:]).reshape(shape[0], -1, shape[-1])
        return (y * self.weight + self.bias).reshape(shape)


class Critic(nn.Module):
    """An ensemble of `num_q` Q networks Q_k(s, a) (MLP, LayerNorm, ReLU); `forward` returns `[num_q, ...]`."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256, 256),
                 layer_norm: bool = True, num_q: int = 2, matmul: str = "aten"):
        super().__init__()
        self.num_q = num_q
        layers: list[nn.Module] = []
        d = obs_dim + action_dim
        for h in hidden:
            layers.append(EnsembleLinear(num_q, d, h, matmul))
            if layer_norm:
                layers.append(EnsembleLayerNorm(num_q, h))
            layers.append(nn.ReLU())
            d = h
        layers.append(EnsembleLinear(num_q, d, 1))
        self.net = nn.Sequential(*layers)  # input cat(s, a)
        self.obs_dim = obs_dim

    def state_features(self, obs: torch.Tensor) -> torch.Tensor:
        """The first layer's state part W_s s + b of every member, `[num_q, ..., H]`: shared by all actions at s."""
        return self.net[0].partial(obs, 0, bias=True)

    def from_features(self, features: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q_k(s, a) `[num_q, ...]` from `state_features(s)` (leading dims broadcasting against the actions')."""
        return after_first(self.net, features + self.net[0].partial(actions, self.obs_dim, bias=False)).squeeze(-1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.from_features(self.state_features(obs), actions)

    def value(self, obs: torch.Tensor, actions: torch.Tensor, agg: str = "mean") -> torch.Tensor:
        """Q(s, a) aggregated over the ensemble: `mean` (VGF's flow gradient) or `min` (clipped double Q)."""
        return aggregate(self(obs, actions), agg)

    def value_from_features(self, features: torch.Tensor, actions: torch.Tensor, agg: str = "mean") -> torch.Tensor:
        """`value` from `state_features(s)`: for many actions at the same states (a transport's steps)."""
        return aggregate(self.from_features(features, actions), agg)


def aggregate(qs: torch.Tensor, agg: str) -> torch.Tensor:
    """Reduce the ensemble dim 0 of `qs`: `mean` or `min`."""
    if agg == "mean":
        return qs.mean(0)
    if agg == "min":
        return qs.min(0).values
    raise ValueError(f"unknown Q aggregation {agg!r}; use 'mean' or 'min'")


class ActionGradient(nn.Module):
    """A-VGF's amortised score g_psi(s, a) ~ grad_a Q(s, a), trained by regression on the critic's action gradient."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256, 256),
                 layer_norm: bool = True, matmul: str = "aten"):
        super().__init__()
        self.obs_dim, self.matmul = obs_dim, matmul
        self.net = mlp(obs_dim + action_dim, hidden, action_dim, layer_norm)  # input cat(s, a)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """g_psi(s, a); `obs` may broadcast against the actions (`[B, 1, D]` for `[B, N, A]` particles)."""
        first, mm = self.net[0], self.matmul
        h = state_part(first, obs, mm) + linear(actions, first.weight[:, self.obs_dim:], None, mm)
        return after_first(self.net, h, mm)


class DeterministicActor(nn.Module):
    """pi(s) in [-1, 1] (tanh head): the policy of the TD3+BC baseline."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256, 256)):
        super().__init__()
        self.net = mlp(obs_dim, hidden, action_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))


class OneStepPolicy(nn.Module):
    """FQL's one-step policy mu_omega(s, z): noise z ~ N(0, I) to an action in one network call, clipped to [-1, 1]."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256, 256)):
        super().__init__()
        self.net = mlp(obs_dim + action_dim, hidden, action_dim)

    def forward(self, obs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, z], dim=-1)).clamp(-1.0, 1.0)


class GaussianActor(nn.Module):
    """IQL's policy: N(tanh(m(s)), diag(exp(log_std))) with a state-independent log std (IQL's GaussianPolicy)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (256, 256, 256)):
        super().__init__()
        self.net = mlp(obs_dim, hidden, action_dim)
        self.log_std = nn.Parameter(torch.zeros(action_dim))

    def mean(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        log_std = self.log_std.clamp(-5.0, 2.0)
        return torch.distributions.Normal(self.mean(obs), log_std.exp()).log_prob(actions).sum(-1)
