"""Data-parallel gradients of a manually optimised module whose backward passes each reach only some of its networks.

DDP's reducer, armed by Lightning's `manual_backward`, expects every parameter of the wrapped module to get a gradient
in each backward; a method whose update is several backward passes over different networks (a critic, then a policy;
an alignment phase, then an attack phase) fails with "parameters that were not used in producing the loss".
`backward_and_average` runs `loss.backward()` outside the reducer and averages, in one all-reduce, the gradients this
backward created or added to. The set of those parameters is the same on every rank, since every rank runs the same
code on its share of the batch.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def backward_and_average(module: nn.Module, loss: torch.Tensor, world: int, *args, **kwargs) -> None:
    """`loss.backward(*args, **kwargs)`, then the gradients it wrote averaged over `world` ranks (a sum all-reduce)."""
    params = [p for p in module.parameters() if p.requires_grad]
    versions = [None if p.grad is None else p.grad._version for p in params]
    loss.backward(*args, **kwargs)
    reached = [p for p, v in zip(params, versions, strict=True)
               if p.grad is not None and (v is None or p.grad._version != v)]
    if not reached or world == 1:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in reached])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in reached:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n
