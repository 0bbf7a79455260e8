"""The expert-merging family: SMEAR, CAMEx, EP-CAMEx and NAMEx, on flat expert parameter vectors.

Every expert is one flat vector of P parameters (all its weights and biases), so the same merging code serves the
two-layer FFN of our ViT / text transformer (`ffn.MergingFFN`) and the SwiGLU experts of Hugging Face MoE blocks
(`hf.MergedMoEBlock`). A "merge unit" u is a sequence (or a segment of one); one merged expert is built per unit and then
applied to all of its tokens with one matmul, so a merging layer costs about one dense FFN per token.

Notation (paper / CAMEx): experts E_1..E_n, base expert E_base (slot 0 of the parameter bank, a learned expert, so every
variant has the same parameter count), router scores s_i(u), domain vectors tau_i = M_i (E_i - E_base).

    SMEAR     E_hat = sum_i s_i E_i                                    (router-weighted parameter average)
    CAMEx     E_hat = E_base + gamma sum_i s_i tau_i                   (base = the layer's learned base)
    EP-CAMEx  same, but E_base^{l+1} = E_hat^l                         (base propagated through the layers)
    NAMEx     alpha = Nash(G), G = [tau_i . tau_j]; Delta = sum_i w_i tau_i with w = s * alpha ("product")
              mu^{l+1} = beta mu^l + Delta (complex beta); E_base^{l+1} = E_base^l + gamma Re(mu^{l+1}) = E_hat^l
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from lit_iclr.core.global_batch import sum_over_ranks

from .nash import nash_weights, normalize_gram
from .propagation import Chain, PropagationState, complex_momentum_step

MERGE_MODES = ("smear", "camex", "ep_camex", "namex")
ALPHA_MODES = ("product", "propagation")
MASKS = ("none", "ties", "dare")


def ties_mask(tau: Tensor) -> Tensor:
    """TIES sign election: keep tau_i's entry only where its sign agrees with the sign of sum_j tau_j."""
    return (torch.sign(tau) == torch.sign(tau.sum(-2, keepdim=True))).to(tau.dtype)


def dare_mask(tau: Tensor, p: float) -> Tensor:
    """DARE: drop each entry with probability p and rescale the rest by 1/(1-p) (unbiased)."""
    return torch.bernoulli(torch.full_like(tau, 1.0 - p)) / (1.0 - p)


class DomainVectors:
    """tau_i = E_i - E_base for experts E (n, P) and bases (U|1, P), or given explicitly (U|1, n, P).

    Without curvature or masks tau is linear in (E, base), so sum_i w_i tau_i = w E - (sum_i w_i) base and
    G_ij = E_i.E_j - E_i.b - E_j.b + b.b: a few (U, n) x (n, P) products instead of a (U, n, P) tensor per batch.
    With `metric` M (K, K), experts and base are coefficient rows over a basis whose Gram matrix is M (the expert
    basis of `lit_iclr.namex.hf`): the same formula with x.y = x M y^T.
    """

    def __init__(self, experts: Tensor, base: Tensor, tau: Tensor | None = None, metric: Tensor | None = None):
        self.experts, self.base, self.tau, self.metric = experts, base, tau, metric
        self.dtype = experts.dtype

    def weighted(self, w: Tensor) -> Tensor:
        """sum_i w_i tau_i, (U|1, P), for w (U|1, n)."""
        if self.tau is None:
            return torch.addcmul(w @ self.experts, w.sum(-1, keepdim=True), self.base, value=-1.0)
        if self.tau.shape[0] == 1:
            return w @ self.tau[0]
        return torch.bmm(w.unsqueeze(1), self.tau).squeeze(1)

    @torch.no_grad()
    def gram(self, chunk: int = 1 << 16) -> Tensor:
        """[tau_i . tau_j], (U|1, n, n), in float64 (the expanded form subtracts nearly equal terms).

        Accumulated over column blocks of `chunk` parameters, so only (n + U) x chunk float64 values exist at a time
        (never a float64 copy of the (U, P) bases or (n, P) experts).
        """
        if self.tau is not None:
            t = self.tau.double()
            return t @ t.transpose(-1, -2)
        if self.metric is not None:
            E, b = self.experts.double(), self.base.double()
            EM = E @ self.metric
            eb = b @ EM.T
            return EM @ E.T - eb.unsqueeze(-1) - eb.unsqueeze(-2) + ((b @ self.metric) * b).sum(-1)[:, None, None]
        n, P = self.experts.shape
        U = self.base.shape[0]
        dev = self.experts.device
        EE = torch.zeros(n, n, dtype=torch.float64, device=dev)
        eb = torch.zeros(U, n, dtype=torch.float64, device=dev)
        bb = torch.zeros(U, dtype=torch.float64, device=dev)
        for a in range(0, P, chunk):
            E, b = self.experts[:, a:a + chunk].double(), self.base[:, a:a + chunk].double()
            EE += E @ E.T
            eb += b @ E.T
            bb += (b * b).sum(-1)
        return EE - eb.unsqueeze(-1) - eb.unsqueeze(-2) + bb[:, None, None]


def replaying() -> bool:
    """True while autograd runs a backward pass, i.e. when a forward runs now it is an activation-checkpoint replay."""
    return torch._C._current_graph_task_id() != -1


class ExpertMerger(nn.Module):
    """Builds one merged expert per unit from a bank of flat experts, for one of `MERGE_MODES`.

    Holds no expert parameters itself (the layer owns the bank), only the merging state: the Nash weight cache, and the
    optional curvature operator (owned by the layer too and passed in as a callable).
    """

    def __init__(self, mode: str, num_experts: int, gamma: float = 0.5, beta_abs: float = 0.0, beta_phase: float = 0.0,
                 alpha_mode: str = "product", mask: str = "none", dare_p: float = 0.1, nash_every: int = 1,
                 nash_iters: int = 25):
        """
        Args:
            mode: One of smear, camex, ep_camex, namex.
            num_experts: n, the number of routed experts (the base expert is extra for the CAMEx family).
            gamma: Step size of the merge / base update (E_hat = E_base + gamma * Delta).
            beta_abs: |beta| of NAMEx's complex momentum (0 = no momentum).
            beta_phase: arg(beta) in radians (0 = heavy-ball momentum).
            alpha_mode: How Nash weights meet router scores: `product` (w_i = s_i alpha_i in the merge and the
                propagation) or `propagation` (the layer merges with s_i, the base update uses alpha alone).
            mask: Domain-vector mask: none, ties (sign election) or dare (random drop-and-rescale, training only).
            dare_p: DARE drop probability.
            nash_every: Re-solve the Nash weights every k training steps (1: every forward, per unit); in between, and
                at evaluation when k > 1, the batch-mean alpha of the last solve is used.
            nash_iters: Newton iterations of the Nash solver.
        """
        super().__init__()
        if mode not in MERGE_MODES:
            raise ValueError(f"mode must be one of {MERGE_MODES}, got {mode!r}")
        if alpha_mode not in ALPHA_MODES:
            raise ValueError(f"alpha_mode must be one of {ALPHA_MODES}, got {alpha_mode!r}")
        if mask not in MASKS:
            raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
        self.mode, self.gamma, self.beta_abs, self.beta_phase = mode, gamma, beta_abs, beta_phase
        self.alpha_mode, self.mask, self.dare_p = alpha_mode, mask, dare_p
        self.nash_every, self.nash_iters = nash_every, nash_iters
        self.register_buffer("alpha_cache", torch.ones(num_experts))
        self.register_buffer("nash_calls", torch.zeros((), dtype=torch.long))
        self.last_alpha: Tensor | None = None      # diagnostics of the last forward (detached): alpha and ||tau_i||
        self.last_tau_norm: Tensor | None = None

    @property
    def propagates(self) -> bool:
        return self.mode in ("ep_camex", "namex")

    def elementwise(self, curvature: Callable[[Tensor], Tensor] | None = None) -> bool:
        """Whether this forward's domain vectors need their parameters entry by entry (curvature, TIES, training DARE)."""
        return curvature is not None or self.mask == "ties" or (self.mask == "dare" and self.training)

    def domain_vectors(self, experts: Tensor, base: Tensor, curvature: Callable[[Tensor], Tensor] | None,
                       metric: Tensor | None = None) -> DomainVectors:
        """tau_i = M_i (E_i - E_base), masked; experts (n, P), base (U|1, P) (or coefficients with `metric`)."""
        if not self.elementwise(curvature):
            return DomainVectors(experts, base, metric=metric)  # linear in (E, base): never materialise (U, n, P)
        if metric is not None:
            raise ValueError("curvature, TIES and training-time DARE act entry by entry on the expert parameters; "
                             "use chain_state: weights (or auto) with them")
        tau = experts.unsqueeze(0) - base.unsqueeze(1)
        if curvature is not None:
            tau = curvature(tau)
        if self.mask == "ties":
            tau = tau * ties_mask(tau.detach())
        elif self.mask == "dare" and self.training:
            tau = tau * dare_mask(tau, self.dare_p)
        return DomainVectors(experts, base, tau)

    def nash_alpha(self, tau: DomainVectors) -> Tensor:
        """Nash bargaining weights (U|1, n) of the domain vectors (stop-gradient, as in Nash-MTL)."""
        # the call count is read on the host only when the schedule needs it (nash_every > 1; never on meta tensors)
        refresh = self.nash_every <= 1 or (
            self.training and (int(self.nash_calls) - (1 if replaying() else 0)) % self.nash_every == 0)  # a replay
        if not refresh:
            return self.alpha_cache.to(tau.experts.device, tau.dtype).unsqueeze(0)
        G = tau.gram()                                                       # Gram matrix [tau_i . tau_j]
        alpha = nash_weights(normalize_gram(G), iters=self.nash_iters)      # G alpha = 1/alpha
        self.last_alpha, self.last_tau_norm = alpha, G.diagonal(dim1=-2, dim2=-1).clamp_min(0).sqrt()
        if self.training:  # the mean over the global batch's units (summed over the ranks under DDP)
            stats = torch.cat([alpha.detach().sum(0), alpha.new_tensor([alpha.shape[0]])])
            stats = sum_over_ranks(stats, sync=True)
            self.alpha_cache.copy_(stats[:-1] / stats[-1])
        return alpha.to(tau.dtype)

    def tick(self) -> None:
        """Count one training forward for the Nash refresh schedule (not while activation checkpointing replays it)."""
        if self.training and not replaying():
            self.nash_calls += 1

    def forward(self, bank: Tensor, gates: Tensor, chain: Chain | None = None, index: int = 0,
                curvature: Callable[[Tensor], Tensor] | None = None, tick: bool = True,
                metric: Tensor | None = None) -> Tensor:
        """Merged flat experts (U, P).

        Args:
            bank: (n + 1, P) for the CAMEx family (slot 0 = learned base), (n, P) for SMEAR.
            gates: Router scores s (U, n).
            chain: Shared propagation state of the network (EP-CAMEx, NAMEx); None = a standalone layer.
            index: This layer's position in the chain (0 starts from its own base).
            curvature: Optional M (tau -> M tau) of CAMEx.
            tick: Count this call for the Nash schedule (false when one forward merges its units in several calls).
            metric: Gram matrix of the basis when bank and chain states are coefficients (the expert basis).
        """
        merged = self._merge(bank, gates, chain, index, curvature, metric)
        if tick:
            self.tick()
        return merged

    def _merge(self, bank: Tensor, gates: Tensor, chain: Chain | None, index: int,
               curvature: Callable[[Tensor], Tensor] | None, metric: Tensor | None = None) -> Tensor:
        if self.mode == "smear":
            return gates @ bank
        prev = chain.read(index) if (self.propagates and chain is not None) else None
        base = prev.base if prev is not None else bank[:1]                  # (U|1, P)
        tau = self.domain_vectors(bank[1:], base, curvature, metric)
        if self.mode != "namex":
            merged = torch.add(base, tau.weighted(gates), alpha=self.gamma)  # CAMEx: E_base + gamma sum_i s_i tau_i
            if self.mode == "ep_camex" and chain is not None:
                chain.write(index, PropagationState(merged))                  # E_base^{l+1} = E_hat^l
            return merged
        alpha = self.nash_alpha(tau)
        if self.alpha_mode == "product":
            delta = tau.weighted(gates * alpha)                              # Delta = sum_i s_i alpha_i tau_i
        else:
            delta = tau.weighted(alpha)                                      # propagation uses alpha alone (U|1, P)
        mu_re, mu_im = complex_momentum_step(prev.mu_re if prev is not None else None,
                                             prev.mu_im if prev is not None else None,
                                             delta, self.beta_abs, self.beta_phase)
        next_base = torch.add(base, mu_re, alpha=self.gamma)                 # E_base^{l+1} = E_base^l + gamma Re(mu)
        if chain is not None:  # with beta = 0 the next layer never reads mu: do not carry (and keep) it
            chain.write(index, PropagationState(next_base, *((mu_re, mu_im) if self.beta_abs else (None, None))))
        if self.alpha_mode == "product":
            return next_base                                                 # E_hat^l = E_base^{l+1}
        return torch.add(base, tau.weighted(gates), alpha=self.gamma)        # the layer's own router merge
