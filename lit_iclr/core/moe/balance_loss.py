"""The Switch-Transformer load-balancing loss of Hugging Face's MoE models, computed on the global batch under DDP.

Hugging Face's `load_balancing_loss_func` (Mixtral, Qwen2-MoE; `transformers/models/mixtral/modeling_mixtral.py`)
is, over the L layers' router logits of the batch's N (unmasked) tokens (Switch Transformer, eqs. 4-6):

    f = (sum over layers and tokens of the top-k one-hot assignments) / N      (no gradient: a count)
    P = (sum over layers and tokens of softmax(router logits)) / N
    aux = E * sum_e f_e P_e

Both are statistics of the batch, so a rank's aux on its half of the global batch, averaged by DDP, is not the aux of
the global batch (HEAPr's router gates stepped 3e-3 apart after one Adam step). Here f's counts and N are summed over
the ranks, and P's sum is divided by `rank_denominator(N)`, so DDP's average of the ranks' losses is the global
batch's aux and its gradient the global one (`core.global_batch`).
"""
from __future__ import annotations

import torch

from lit_iclr.core.global_batch import rank_denominator, sum_over_ranks


def load_balancing_loss(router_logits: tuple[torch.Tensor, ...], num_experts: int, top_k: int,
                        attention_mask: torch.Tensor | None = None, sync: bool = False) -> torch.Tensor:
    """E * sum_e f_e P_e over the layers' `router_logits` ([tokens, E] each); on one process (or without `sync`) the
    value of Hugging Face's `load_balancing_loss_func`; with `sync` (a training step under DDP) each rank's share of
    the global batch's loss."""
    device = router_logits[0].device
    mask = None if attention_mask is None else attention_mask.reshape(-1).to(device=device, dtype=torch.float32)
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probs = torch.zeros(num_experts, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    for logits in router_logits:
        weights = torch.softmax(logits.to(device).float(), dim=-1)
        chosen = torch.topk(weights, top_k, dim=-1).indices.reshape(-1)
        w = torch.ones(weights.shape[0], device=device) if mask is None else mask
        counts = counts.scatter_add(0, chosen, w.repeat_interleave(top_k))
        probs = probs + (weights * w[:, None]).sum(0)
        rows = rows + w.sum()
    total = sum_over_ranks(torch.cat([counts, rows[None]]).detach(), sync)  # f and N of the global batch
    f = total[:-1] / total[-1].clamp_min(1.0)
    p = probs / rank_denominator(rows, sync, 1.0)
    return num_experts * (f * p).sum()
