"""Routers of the MoE layers: (noisy) top-k softmax gates and the importance/load balancing loss (Shazeer et al., 2017),
as used by CAMEx's `noisy_top_k_gating` and `cv_squared`."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_iclr.core.global_batch import randn_rows, sum_over_ranks


def cv_squared(v: Tensor) -> Tensor:
    """Squared coefficient of variation var(v) / mean(v)^2 (0 for a single expert)."""
    if v.numel() <= 1:
        return v.new_zeros(())
    v = v.float()
    return v.var() / (v.mean() ** 2 + 1e-10)


def top_k_gates(logits: Tensor, k: int) -> Tensor:
    """Softmax over the k largest logits of each row, scattered back into a dense (..., n) tensor of zeros."""
    n = logits.shape[-1]
    if k >= n:
        return logits.softmax(-1)
    top, idx = logits.topk(k, dim=-1)
    return torch.zeros_like(logits).scatter(-1, idx, top.softmax(-1))


class Router(nn.Module):
    """Linear router with optional input-dependent Gaussian noise in training (noisy top-k gating).

    After each forward, `aux_loss` holds cv^2(importance) + cv^2(load), the balancing loss CAMEx adds (times a coefficient
    the LightningModule applies).
    """

    def __init__(self, dim: int, num_experts: int, top_k: int, noisy: bool = True):
        super().__init__()
        self.num_experts, self.top_k, self.noisy = num_experts, min(top_k, num_experts), noisy
        self.w_gate = nn.Parameter(torch.zeros(dim, num_experts))
        self.w_noise = nn.Parameter(torch.zeros(dim, num_experts)) if noisy else None
        nn.init.normal_(self.w_gate, std=0.02)
        self.aux_loss: Tensor | None = None

    def forward(self, u: Tensor, samples: int | None = None) -> Tensor:
        """Gates (U, n) for router inputs u (U, dim) of `samples` sequences (default U; each a run of U // samples
        consecutive rows): rows sum to one, k non-zeros.

        In training under DDP the noise is drawn for the global batch (this rank's sequences kept; the module seeds
        the step's RNG alike on every rank, `core.global_batch.step_rng`) and importance and
        load are summed over the ranks before cv^2, so the gates and the balancing loss are one process's on the global
        batch (cv^2 of a rank's share is not a mean over samples)."""
        logits = u @ self.w_gate
        if self.noisy and self.training:
            std = F.softplus(u @ self.w_noise) + 1e-2
            logits = logits + randn_rows(logits, samples) * std
        gates = top_k_gates(logits, self.top_k)
        importance = sum_over_ranks(gates.reshape(-1, self.num_experts).sum(0), sync=self.training)
        load = sum_over_ranks((gates.reshape(-1, self.num_experts) > 0).sum(0).float(), sync=self.training)
        self.aux_loss = cv_squared(importance) + cv_squared(load)
        return gates
