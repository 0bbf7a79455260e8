"""`MergingFFN`: the FFN layer family (dense, top-k SMoE, SMEAR, CAMEx, EP-CAMEx, NAMEx) behind one constructor.

Drop-in for timm's `Mlp` (same keyword arguments), so a timm `Block(mlp_layer=partial(MergingFFN, mode=...))` becomes a
merging block. All variants own the same parameter bank of `num_experts` two-layer FFN experts stored as one flat
(num_experts, P) tensor, so they have the same parameter count: SMoE and SMEAR route over all of them, the CAMEx family
uses slot 0 as the learned base expert and routes over the other num_experts - 1, and `dense` is one FFN of
num_experts x hidden units.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .curvature import KroneckerCurvature
from .merging import MERGE_MODES, ExpertMerger
from .propagation import Chain
from .routing import Router

MODES = ("dense", "smoe", *MERGE_MODES)


def merge_units(x: Tensor, segment: int | None) -> tuple[Tensor, Tensor]:
    """Split x (B, T, D) into merge units: (router inputs (U, D), tokens per unit (U, S, D)).

    segment None (or >= T): one unit per sequence, routed on its mean. Otherwise units of `segment` tokens, unit j routed
    on the mean of unit j-1 and unit 0 on zeros, so a unit's merged expert never depends on its own or later tokens.
    """
    B, T, D = x.shape
    if segment is None or segment >= T:
        return x.mean(1), x
    if T % segment:
        raise ValueError(f"sequence length {T} is not a multiple of the merge segment {segment}")
    n = T // segment
    means = x.reshape(B, n, segment, D).mean(2)
    prev = torch.cat([means.new_zeros(B, 1, D), means[:, :-1]], dim=1)   # causal: route segment j on segment j-1
    return prev.reshape(B * n, D), x.reshape(B * n, segment, D)


@dataclass
class MergeOptions:
    """Options of the merging FFN layer family (one `merge:` block in the YAML configs).

    Args:
        mode: dense, smoe, smear, camex, ep_camex or namex.
        num_experts: Expert-sized parameter slots (equal for every mode; the CAMEx family spends one on the base).
        top_k: Experts per token (smoe) or per merge unit (merging modes); null: 2 for smoe, all for merging.
        segment: Merge unit length in tokens for causal models: the merged expert of segment j is routed on the mean of
            segment j-1 (Lory/CAMEx segment routing; segment 0 gets zero router input, i.e. uniform logits).
            null: one unit per sequence, routed on its mean (non-causal).
        noisy_gating: Noisy top-k gating in training.
        curvature_rank: Rank of CAMEx's Kronecker curvature M_i (0: M_i = I, Euclidean merging).
        gamma: Merge / propagation step size (E_hat = E_base + gamma Delta). Below 1 on purpose: with gamma = 1,
            softmax gates (sum_i s_i = 1) and M_i = I, E_base + sum_i s_i (E_i - E_base) = sum_i s_i E_i and the base
            (hence all of EP-CAMEx's propagation) cancels out (CAMEx writes gamma = alpha / (N - 1)).
        beta_abs: NAMEx momentum magnitude |beta| (0: no momentum, i.e. EP-CAMEx propagation with Nash weights).
        beta_phase: NAMEx momentum phase arg(beta) in radians (0: heavy-ball).
        alpha_mode: How Nash weights meet router scores: product (w_i = s_i alpha_i) or propagation (layer merges with
            s_i, the base update uses alpha_i alone).
        mask: none, ties or dare on the domain vectors.
        dare_p: DARE drop probability.
        nash_every: Nash weights re-solved every k training steps (1: every forward, per merge unit).
        chunk: Hugging Face models only: merge units processed at once; each chunk's merged expert weights are
            recomputed in the backward instead of stored (bounds the merge buffers; null: all units at once).
        chain_state: Hugging Face models only, EP-CAMEx / NAMEx: how the propagated state is kept. `coefficients`: in
            the expert basis (per-unit coefficients over the experts merged so far; memory independent of the number
            of merge units, merge cost growing with depth); `weights`: per-unit flat expert weights (U, P) per layer
            (faster, memory U P per layer); `auto`: coefficients unless a TIES / DARE mask needs the weights.
    """

    mode: str = "namex"
    num_experts: int = 4
    top_k: int | None = None
    segment: int | None = None
    noisy_gating: bool = True
    curvature_rank: int = 0
    gamma: float = 0.5
    beta_abs: float = 0.0
    beta_phase: float = 0.0
    alpha_mode: str = "product"
    mask: str = "none"
    dare_p: float = 0.1
    nash_every: int = 1
    chunk: int | None = None
    chain_state: str = "auto"


class MergingFFN(nn.Module):
    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: type[nn.Module] = nn.GELU, bias: bool = True, drop: float = 0.0,
                 options: MergeOptions | None = None, chain: Chain | None = None, **_timm_kwargs):
        """
        Args:
            in_features: Model width D.
            hidden_features: Hidden width H of one expert (default 4 D).
            out_features: Must equal in_features (residual FFN).
            act_layer: Activation class.
            bias: Accepted for timm compatibility; experts always have biases.
            drop: Dropout after the activation and the output.
            options: The layer family's options (`MergeOptions`).
            chain: Propagation chain shared by the layers of one network (EP-CAMEx, NAMEx).
        """
        o = options or MergeOptions()
        mode, num_experts, top_k, segment = o.mode, o.num_experts, o.top_k, o.segment
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if out_features not in (None, in_features):
            raise ValueError("MergingFFN is a residual FFN: out_features must equal in_features")
        D, H = in_features, hidden_features or 4 * in_features
        self.mode, self.segment, self.D = mode, segment, D
        if mode == "dense":
            H, slots = H * num_experts, 1                  # one FFN with the parameters of num_experts experts
        else:
            slots = num_experts
        self.H = H
        self.sizes = (H * D, H, D * H, D)                  # flat layout: w1 (H, D), b1 (H), w2 (D, H), b2 (D)
        self.bank = nn.Parameter(torch.zeros(slots, sum(self.sizes)))
        with torch.no_grad():                              # timm-style init: trunc-normal(0.02) weights, zero biases
            w1, _, w2, _ = self.bank.split(self.sizes, dim=-1)
            nn.init.trunc_normal_(w1, std=0.02)
            nn.init.trunc_normal_(w2, std=0.02)
        self.act, self.drop = act_layer(), nn.Dropout(drop)
        routed = {"dense": 0, "smoe": num_experts, "smear": num_experts}.get(mode, num_experts - 1)
        if mode in ("camex", "ep_camex", "namex") and routed < 1:
            raise ValueError(f"{mode} needs num_experts >= 2 (a base expert plus at least one routed expert)")
        self.router = None
        if routed:
            k = top_k if top_k is not None else (2 if mode == "smoe" else routed)
            self.router = Router(D, routed, k, noisy=o.noisy_gating)
        self.merger, self.curvature, self.chain, self.chain_index = None, None, None, 0
        if mode in MERGE_MODES:
            self.merger = ExpertMerger(mode, routed, o.gamma, o.beta_abs, o.beta_phase, o.alpha_mode, o.mask, o.dare_p,
                                       o.nash_every)
            if o.curvature_rank > 0 and mode != "smear":
                self.curvature = KroneckerCurvature(routed, [(0, H, D), (H * D + H, D, H)], o.curvature_rank)
            if self.merger.propagates and chain is not None:
                self.chain, self.chain_index = chain, chain.register()

    @property
    def aux_loss(self) -> Tensor | None:
        """Router balancing loss of the last forward (None for dense)."""
        return self.router.aux_loss if self.router is not None else None

    def _split(self, flat: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        w1, b1, w2, b2 = flat.split(self.sizes, dim=-1)
        lead = flat.shape[:-1]
        return w1.reshape(*lead, self.H, self.D), b1, w2.reshape(*lead, self.D, self.H), b2

    def apply_expert(self, x: Tensor, flat: Tensor) -> Tensor:
        """Run expert(s) `flat` on x: flat (P,) shared by all tokens, or (U, P) with x (U, S, D), one expert per unit."""
        w1, b1, w2, b2 = self._split(flat)
        if flat.dim() == 1:
            return self.drop(F.linear(self.drop(self.act(F.linear(x, w1, b1))), w2, b2))
        h = self.drop(self.act(torch.baddbmm(b1.unsqueeze(1), x, w1.transpose(1, 2))))
        return self.drop(torch.baddbmm(b2.unsqueeze(1), h, w2.transpose(1, 2)))

    def units(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(router inputs (U, D), tokens per unit (U, S, D)) for x (B, T, D)."""
        return merge_units(x, self.segment)

    def _smoe(self, x: Tensor) -> Tensor:
        """Token-level top-k SMoE. Loops over experts (not tokens): each iteration is one matmul on its tokens."""
        tokens = x.reshape(-1, self.D)
        gates = self.router(tokens, samples=x.shape[0])
        y = torch.zeros_like(tokens)
        for e in range(self.bank.shape[0]):
            idx = gates[:, e].nonzero().squeeze(-1)
            if idx.numel():
                y.index_add_(0, idx, gates[idx, e, None] * self.apply_expert(tokens[idx], self.bank[e]))
        return y.reshape_as(x)

    def forward(self, x: Tensor) -> Tensor:
        if self.mode == "dense":
            return self.apply_expert(x, self.bank[0])
        if self.mode == "smoe":
            return self._smoe(x)
        u, xu = self.units(x)
        gates = self.router(u, samples=x.shape[0])
        merged = self.merger(self.bank, gates, self.chain, self.chain_index, self.curvature)
        merged = merged.expand(xu.shape[0], -1)                 # (1, P) when the merge is unit-independent
        return self.apply_expert(xu, merged).reshape_as(x)
