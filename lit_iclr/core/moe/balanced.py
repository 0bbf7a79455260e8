"""Balanced expert dispatch for shape-only (meta) steps of MoE models: what one step costs under even routing.

Top-k routing is data-dependent: which tokens reach which expert is decided by values, so the experts' dispatch
(`bincount`, `nonzero`, host-side loops over the experts hit) cannot run on meta tensors, where `cli.py plan` counts
FLOPs and saved activations. `balanced_dispatch(model)` replaces, while it is active, every MoE block's experts call
`experts(hidden_states, top_k_index, top_k_weights)` by the same computation with the N x k (token, slot) rows dealt
evenly over the E experts (ceil(N k / E) rows each, the perfectly balanced routing load-balancing losses aim at): each
expert's SwiGLU runs on its share, and the outputs are weighted by the router's top-k weights and summed over the k
slots as the real dispatch does. The router, the shared experts and everything else run unchanged, so the FLOPs and
activations are those of one step whose routing is balanced (the real ones differ by the load imbalance only).
"""
from __future__ import annotations

import math
import types
from contextlib import contextmanager

import torch
from torch import nn

from .layout import moe_blocks


def _balanced_forward(block):
    act = getattr(block.experts, "act_fn", None) or nn.functional.silu

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        N, d = hidden_states.shape
        k, E = top_k_index.shape[-1], block.num_experts
        share = math.ceil(N * k / E)
        rows = hidden_states.repeat(math.ceil(share * E / N), 1)[: share * E]  # (token, slot) rows dealt to experts
        widths = block.widths()
        if len(set(widths)) == 1:  # one width: the E products as batched matmuls
            w = block.stacked()
            x = rows.view(E, share, d)
            h = act(torch.bmm(x, w.gate.transpose(1, 2))) * torch.bmm(x, w.up.transpose(1, 2))
            y = torch.bmm(h, w.down.transpose(1, 2)).reshape(E * share, d)
        else:  # pruned experts of their own widths
            outs = []
            for e in range(E):
                w = block.get_expert(e)
                x = rows[e * share:(e + 1) * share]
                h = act(nn.functional.linear(x, w.gate)) * nn.functional.linear(x, w.up)
                outs.append(nn.functional.linear(h, w.down))
            y = torch.cat(outs)
        y = y[: N * k].view(N, k, d)
        return (y * top_k_weights.view(N, k, 1).to(y.dtype)).sum(1)

    return forward


@contextmanager
def balanced_dispatch(model: nn.Module):
    """Within the block, every MoE block of `model` dispatches its (token, slot) rows evenly over its experts."""
    patched = []
    for block in moe_blocks(model):
        experts = block.experts
        experts.forward = types.MethodType(_balanced_forward(block), experts)
        patched.append(experts)
    try:
        yield model
    finally:
        for experts in patched:
            del experts.forward
