"""Expert propagation across layers (EP-CAMEx) and its complex-momentum variant (NAMEx).

EP-CAMEx carries the merged expert of layer l forward as the base expert of layer l+1 (E_base^{l+1} = E_hat^l), a
gradient-like iteration whose "time" is the layer index. NAMEx accelerates it with complex momentum (Lorraine et al.,
2022):

    mu^{l+1}     = beta * mu^l + Delta^l,        beta = |beta| e^{i theta} in C,  mu^1 = 0
    E_base^{l+1} = E_base^l + gamma * Re(mu^{l+1})

The complex buffer is stored as two real tensors (re, im), so nothing downstream (FSDP, autocast, optimizers) sees
complex dtypes. With theta = 0 the imaginary part stays zero and this is heavy-ball momentum; with beta = 0 it is
EP-CAMEx.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor


def complex_momentum_step(mu_re: Tensor | None, mu_im: Tensor | None, delta: Tensor, beta_abs: float,
                          beta_phase: float) -> tuple[Tensor, Tensor | None]:
    """mu <- beta mu + delta for complex beta = beta_abs * exp(i beta_phase) and real delta; returns (re, im).

    None stands for a zero part (mu^1 = 0, or an imaginary part that a real beta never creates), which saves the
    elementwise passes over a (units, P) tensor that the merge is otherwise bound by.
    """
    b_re, b_im = beta_abs * math.cos(beta_phase), beta_abs * math.sin(beta_phase)
    re = delta if mu_re is None or b_re == 0 else delta.add(mu_re, alpha=b_re)
    if mu_im is not None and b_im != 0:
        re = re.add(mu_im, alpha=-b_im)
    im = None
    if mu_im is not None and b_re != 0:
        im = mu_im.mul(b_re)
    if mu_re is not None and b_im != 0:
        im = mu_re.mul(b_im) if im is None else im.add(mu_re, alpha=b_im)
    return re, im


@dataclass
class PropagationState:
    """What layer l hands to layer l+1 in one forward pass: the base expert and the momentum buffer (per merge unit).

    In the weights basis `base`, `mu_re`, `mu_im` are (U, P) flat expert parameters. In the expert basis
    (`lit_iclr.namex.hf`, `chain_state: coefficients`) they are (U, K) coefficients over the rows of `banks` (the flat
    experts of every earlier MoE layer, K rows in all) and `metric` is the (K, K) float64 Gram matrix of those rows,
    which is all the Nash solve needs: tau_i . tau_j = (e_i - c) M (e_j - c)^T.
    """

    base: Tensor               # (U, P) flat base-expert parameters of the next layer, or (U, K) coefficients
    mu_re: Tensor | None = None
    mu_im: Tensor | None = None
    metric: Tensor | None = None
    banks: tuple[Tensor, ...] = ()

    def flat(self) -> tuple[Tensor | None, ...]:
        """The state as a flat tuple of tensors (what crosses a checkpointed decoder layer)."""
        return (self.base, self.mu_re, self.mu_im, self.metric, *self.banks)

    @classmethod
    def from_flat(cls, flat) -> PropagationState:
        return cls(flat[0], flat[1], flat[2], flat[3], tuple(flat[4:]))


EMPTY_STATE = (None, None, None, None)  # `flat()` of "no predecessor" (layer 0)


class Chain:
    """The propagation states of the merging layers of one network, one per layer index, for one forward pass.

    Layer i writes `states[i]` and layer i+1 reads it. Keying by layer (instead of one "current" slot) makes a
    recomputed layer (activation checkpointing replays layer i during the backward, after the whole forward has run)
    read the state of *its* predecessor, not of the last layer. Under checkpointing the states additionally cross every
    checkpointed decoder layer as explicit inputs/outputs (`lit_iclr.namex.hf`), so a reentrant replay, which runs
    under its own autograd graph, differentiates through them too. Layer 0 never reads (it starts from its own learned
    base), and layers run in index order, which every sequential stack (timm blocks, HF decoders) does.
    Deliberately not an nn.Module: it holds activations, not parameters, and must not enter state dicts.
    """

    def __init__(self) -> None:
        self.states: dict[int, PropagationState] = {}
        self.length = 0

    def register(self) -> int:
        """Give the next layer its index in the chain."""
        self.length += 1
        return self.length - 1

    def read(self, index: int) -> PropagationState | None:
        """What layer `index` starts from (None for layer 0: its own base)."""
        return self.states.get(index - 1) if index > 0 else None

    def write(self, index: int, state: PropagationState) -> None:
        self.states[index] = state

    def clear(self) -> None:
        """Drop the states (after a forward pass: they are part of the autograd graph, not needed beyond it)."""
        self.states.clear()
