"""Upcycling a dense SwiGLU LM (Llama, SmolLM2) into an MoE without training (MoEfication, Zhang et al. 2022).

Each MLP y = W_down (act(W_gate x) * (W_up x)) = sum_k h_k(x) w_k is a sum over its I intermediate neurons, so a
partition of the neurons into E groups G_1..G_E gives E experts E_e(x) = sum_{k in G_e} h_k(x) w_k with

    y = sum_e E_e(x)                                   (exact: the dense MLP when every expert is active)
    y ~ sum_{e in TopK(r(x))} E_e(x)                   (router r, unit weights, top_k < E: the sparse MoE)

Grouping (`grouping`, balanced: every expert gets I / E neurons):
- "kmeans": balanced k-means of the neurons' normalised [gate row, up row] weights (MoEfication's parameter
  clustering);
- "coactivation": balanced k-means of the neurons' normalised |h_k| profiles over calibration tokens (neurons that
  fire together share an expert; MoEfication's co-activation split, with k-means in place of graph partitioning);
- "contiguous": neurons in index order (no structure; a control).

Router (`RouterFit`): an affine map r(x) = R x + b fitted by least squares on calibration tokens to predict every expert's
output norm ||E_e(x)||, top-k by the predicted norm (MoEfication's router predicts each expert's activation mass).
The routed experts are `VariableWidthExperts` behind a router named `gate`, so `lit_iclr.core.moe.moe_blocks` sees a
plain MoE block and HEAPr's atom scoring and the whole-expert baselines (`prune.py`) run on it unchanged.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lit_iclr.core.errors import ConfigError
from lit_iclr.core.moe import VariableWidthExperts

from .dense import swiglu_mlps

GROUPINGS = ("kmeans", "coactivation", "contiguous")


class UpcycledMoE(nn.Module):
    """Routed experts of one upcycled MLP: top-k experts per token by router score, each with weight 1."""

    def __init__(self, hidden_size: int, widths: list[int], act, top_k: int):
        super().__init__()
        self.gate = nn.Linear(hidden_size, len(widths), bias=False)  # the router r(x) = R x + b
        # b enters the top-k selection only (the expert weights are 1), as DeepSeek-V3's correction bias, under whose
        # name `prune.drop_experts` keeps it in step with the router rows
        self.gate.register_buffer("e_score_correction_bias", torch.zeros(len(widths)))
        self.experts = VariableWidthExperts(hidden_size, widths, act)
        self.num_experts, self.top_k = len(widths), int(top_k)

    def route_tokens_to_experts(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(top-k expert ids, unit weights): the upcycled experts are summed as in the dense MLP, not mixed."""
        scores = logits + self.gate.e_score_correction_bias.to(logits.dtype)
        idx = scores.topk(min(self.top_k, logits.shape[-1]), dim=-1).indices
        return idx, torch.ones(idx.shape, dtype=logits.dtype, device=logits.device)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        idx, w = self.route_tokens_to_experts(self.gate(x))
        return self.experts(x, idx, w.to(x.dtype)).reshape(hidden_states.shape)


@dataclass
class UpcycleInfo:
    """What `upcycle` built: the neuron groups per layer and the router fit (R^2 of the predicted expert norms)."""

    groups: list[list[torch.Tensor]]
    router_r2: list[float]
    num_experts: int
    top_k: int
    grouping: str


def balanced_kmeans(features: torch.Tensor, num_groups: int, iters: int = 20, seed: int = 0) -> torch.Tensor:
    """Group label [n] of every row of `features` [n, f]: k-means (cosine) with exactly n / num_groups rows per group.

    The assignment step is a greedy capacity-constrained matching: (row, centroid) pairs are taken in order of
    increasing distance, a pair is accepted while the row is unassigned and the group not full. Stops when the labels
    no longer change.
    """
    n = features.shape[0]
    if n % num_groups:
        raise ConfigError(f"cannot split {n} neurons into {num_groups} equal experts; choose a divisor of {n}")
    cap = n // num_groups
    x = nn.functional.normalize(features.double(), dim=1)
    g = torch.Generator().manual_seed(seed)
    centroids = x[torch.randperm(n, generator=g)[:num_groups]]
    labels = torch.full((n,), -1, dtype=torch.long)
    for _ in range(iters):
        dist = (1.0 - x @ centroids.T).numpy()  # cosine distance [n, E]
        new = _capacity_assign(dist, cap)
        if torch.equal(new, labels):
            break
        labels = new
        centroids = nn.functional.normalize(torch.zeros(num_groups, x.shape[1], dtype=x.dtype).index_add_(0, labels, x),
                                            dim=1)
    return labels


def _capacity_assign(dist: np.ndarray, cap: int) -> torch.Tensor:
    n, k = dist.shape
    rows, cols = np.unravel_index(np.argsort(dist, axis=None, kind="stable"), dist.shape)
    label, room, left = [-1] * n, [cap] * k, n
    for row, col in zip(rows.tolist(), cols.tolist(), strict=True):  # pairs by distance; stops once all are placed
        if label[row] < 0 and room[col] > 0:
            label[row] = col
            room[col] -= 1
            left -= 1
            if left == 0:
                break
    return torch.tensor(label)


def neuron_groups(mlp: nn.Module, num_experts: int, grouping: str, h: torch.Tensor | None = None,
                  seed: int = 0) -> list[torch.Tensor]:
    """Neuron indices of each expert (sorted), a balanced partition of the MLP's I neurons."""
    width = mlp.down_proj.in_features
    if grouping == "contiguous":
        if width % num_experts:
            raise ConfigError(f"cannot split {width} neurons into {num_experts} equal experts; choose a divisor of {width}")
        return list(torch.arange(width).view(num_experts, -1))
    if grouping == "kmeans":
        feats = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], 1).detach().float().cpu()
    elif grouping == "coactivation":
        if h is None:
            raise ConfigError("grouping 'coactivation' needs calibration batches (the neurons' activations)")
        feats = h.abs().T  # [I, T]: each neuron's activation profile over the calibration tokens
    else:
        raise ConfigError(f"unknown grouping {grouping!r}; choose from {', '.join(GROUPINGS)}")
    labels = balanced_kmeans(feats, num_experts, seed=seed)
    return [torch.nonzero(labels == e).flatten() for e in range(num_experts)]


def expert_norms(h: torch.Tensor, down: torch.Tensor, groups: list[torch.Tensor]) -> torch.Tensor:
    """||E_e(x_t)|| [T, E] with E_e(x) = W_down[:, G_e] h_{G_e}(x)."""
    return torch.stack([(h[:, gi] @ down[:, gi].T).norm(dim=1) for gi in groups], 1)


class RouterFit:
    """Sufficient statistics of the expert-norm regression N ~ X R^T + 1 b^T, accumulated batch by batch (float64)."""

    def __init__(self, d: int, num_experts: int):
        z = dict(dtype=torch.float64)
        self.t, self.sx, self.sn = 0, torch.zeros(d, **z), torch.zeros(num_experts, **z)
        self.sxx, self.sxn, self.snn = torch.zeros(d, d, **z), torch.zeros(d, num_experts, **z), torch.zeros(num_experts, **z)

    def add(self, x: torch.Tensor, norms: torch.Tensor) -> None:
        X, N = x.double(), norms.double()
        self.t += X.shape[0]
        self.sx += X.sum(0)
        self.sn += N.sum(0)
        self.sxx += X.T @ X
        self.sxn += X.T @ N
        self.snn += N.pow(2).sum(0)

    def solve(self, ridge: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(R [E, d], b [E]) minimising ||X R^T + 1 b^T - N||^2 + ridge * T * ||R||^2 (b not penalised), and the fit's
        R^2 (1 - residual / variance of N about its per-expert mean)."""
        mx, mn = self.sx / self.t, self.sn / self.t
        cxx = self.sxx - self.t * torch.outer(mx, mx)  # centred: the intercept separates, b = mean(N) - R mean(X)
        cxn = self.sxn - self.t * torch.outer(mx, mn)
        R = torch.linalg.solve(cxx + ridge * self.t * torch.eye(len(mx), dtype=cxx.dtype), cxn).T
        var = (self.snn - self.t * mn.pow(2)).sum()
        resid = var - 2 * (R * cxn.T).sum() + (R @ cxx * R).sum()
        return R.float(), (mn - R @ mx).float(), float(1.0 - resid / var.clamp_min(1e-30))


@torch.no_grad()
def mlp_activations(model: nn.Module, batches: Iterable[dict], max_tokens: int = 4096):
    """Inputs x [T, d] and neuron activations h [T, I] of every MLP of the dense model (first `max_tokens` tokens)."""
    mlps = swiglu_mlps(model)
    xs, hs = [[] for _ in mlps], [[] for _ in mlps]
    handles = []
    for i, m in enumerate(mlps):
        handles.append(m.register_forward_pre_hook(lambda mod, a, i=i: xs[i].append(a[0].flatten(0, -2).float())))
        handles.append(m.down_proj.register_forward_pre_hook(lambda mod, a, i=i: hs[i].append(a[0].flatten(0, -2).float())))
    _forward_until(model, batches, max_tokens, handles)
    return [torch.cat(x)[:max_tokens].cpu() for x in xs], [torch.cat(h)[:max_tokens].cpu() for h in hs]


def _forward_until(model: nn.Module, batches: Iterable[dict], max_tokens: int, handles: list) -> None:
    """Run the model over batches until `max_tokens` tokens were seen (the hooks in `handles` record what they need),
    then remove the hooks, also on error."""
    dev, seen = next(model.parameters()).device, 0
    try:
        for b in batches:
            if seen >= max_tokens:
                break
            ids = b["input_ids"].to(dev)
            model(input_ids=ids)
            seen += ids.numel()
    finally:
        for h in handles:
            h.remove()


def _parents(model: nn.Module, mlps: list[nn.Module]) -> list[tuple[nn.Module, str]]:
    where = {id(m): None for m in mlps}
    for module in model.modules():
        for name, child in module.named_children():
            if id(child) in where and where[id(child)] is None:
                where[id(child)] = (module, name)
    return [where[id(m)] for m in mlps]


@torch.no_grad()
def upcycle(model: nn.Module, batches: Iterable[dict] | None = None, num_experts: int = 8, top_k: int | None = None,
            grouping: str = "kmeans", ridge: float = 1e-3, max_tokens: int = 4096, seed: int = 0) -> UpcycleInfo:
    """Replace every SwiGLU MLP of `model` by an `UpcycledMoE` holding the same weights (in place).

    Args:
        model: A dense causal LM whose MLPs have gate_proj / up_proj / down_proj (Llama, SmolLM2, ...).
        batches: Calibration LM batches for the router (and the co-activation grouping); needed unless top_k == E.
        num_experts: E, the number of experts per MLP (a divisor of the intermediate width).
        top_k: Experts per token (default E: every expert active, the dense model exactly).
        grouping: "kmeans" (weights), "coactivation" (activations) or "contiguous".
        ridge: Ridge term of the router's least-squares fit (relative to the token count).
        max_tokens: Calibration tokens used for the router and the co-activation profiles.
        seed: Seed of the k-means initialisation.
    """
    top_k = num_experts if top_k is None else int(top_k)
    if not 1 <= top_k <= num_experts:
        raise ConfigError(f"top_k must be between 1 and num_experts={num_experts}, got {top_k}")
    if grouping not in GROUPINGS:
        raise ConfigError(f"unknown grouping {grouping!r}; choose from {', '.join(GROUPINGS)}")
    mlps = swiglu_mlps(model)
    if (grouping == "coactivation" or top_k < num_experts) and batches is None:
        raise ConfigError("upcycling with a router (top_k < num_experts) or co-activation grouping needs calibration "
                          "batches")
    batches = list(batches) if batches is not None else None
    hs = mlp_activations(model, batches, max_tokens)[1] if grouping == "coactivation" else [None] * len(mlps)
    groups = [neuron_groups(m, num_experts, grouping, h, seed) for m, h in zip(mlps, hs, strict=True)]
    del hs
    fits = router_fits(model, mlps, groups, batches, max_tokens) if top_k < num_experts else [None] * len(mlps)
    info = UpcycleInfo(groups=groups, router_r2=[], num_experts=num_experts, top_k=top_k, grouping=grouping)
    for mlp, (parent, name), gs, fit in zip(mlps, _parents(model, mlps), groups, fits, strict=True):
        ref = mlp.down_proj.weight
        moe = UpcycledMoE(mlp.down_proj.out_features, [len(gi) for gi in gs], mlp.act_fn, top_k).to(ref.device, ref.dtype)
        for e, gi in enumerate(gs):
            gi = gi.to(ref.device)
            moe.experts[e].gate_proj.weight.copy_(mlp.gate_proj.weight[gi])  # atoms of G_e: rows of W_gate, W_up
            moe.experts[e].up_proj.weight.copy_(mlp.up_proj.weight[gi])
            moe.experts[e].down_proj.weight.copy_(mlp.down_proj.weight[:, gi])  # and columns w_k of W_down
        if fit is not None:
            R, bias, r2 = fit.solve(ridge)
            moe.gate.weight.copy_(R)
            moe.gate.e_score_correction_bias.copy_(bias)
            info.router_r2.append(r2)
        else:
            moe.gate.weight.zero_()  # (and b = 0) every expert active: the router's choice does not matter
        moe.train(mlp.training).requires_grad_(ref.requires_grad)
        setattr(parent, name, moe)
    return info


@torch.no_grad()
def router_fits(model: nn.Module, mlps: list[nn.Module], groups: list[list[torch.Tensor]], batches: list[dict],
                max_tokens: int) -> list[RouterFit]:
    """One pass of the dense model over `batches`: every MLP's inputs x and its experts' output norms ||E_e(x)||
    accumulated into a `RouterFit` (nothing per token is kept)."""
    fits = [RouterFit(m.down_proj.out_features, len(g)) for m, g in zip(mlps, groups, strict=True)]
    seen_x: dict[int, torch.Tensor] = {}
    downs = [m.down_proj.weight.detach().float().cpu() for m in mlps]

    def on_input(i):
        return lambda mod, a: seen_x.__setitem__(i, a[0].flatten(0, -2).float().cpu())

    def on_h(i):
        return lambda mod, a: fits[i].add(seen_x.pop(i), expert_norms(a[0].flatten(0, -2).float().cpu(), downs[i],
                                                                        groups[i]))

    handles = [h for i, m in enumerate(mlps) for h in (m.register_forward_pre_hook(on_input(i)),
                                                       m.down_proj.register_forward_pre_hook(on_h(i)))]
    _forward_until(model, batches, max_tokens, handles)
    return fits


def set_top_k(model: nn.Module, top_k: int) -> None:
    """Experts per token of every `UpcycledMoE` of `model` (routing only; the weights are unchanged)."""
    blocks = [m for m in model.modules() if isinstance(m, UpcycledMoE)]
    if not blocks:
        raise ConfigError(f"{type(model).__name__} has no upcycled MoE block; call upcycle(model) first")
    for m in blocks:
        m.top_k = int(top_k)
