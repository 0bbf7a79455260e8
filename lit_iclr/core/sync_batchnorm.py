"""BatchNorm whose training statistics are those of the global batch, on any device and backend (gloo on the CPU too).

Under DDP each rank's BatchNorm normalises with its own share's mean and variance, so a step on 2 ranks x B/2 is not
one process's step on B (and with one or two samples per device the statistics are noise). `torch.nn.SyncBatchNorm`
fixes that on GPUs only ("SyncBatchNorm expected input tensor to be on GPU"). `SyncBatchNorm` here computes the
statistics from sums all-reduced with autograd (`core.global_batch.sum_over_ranks`): the mean from the ranks' summed
values and counts, the biased variance from the summed squared deviations from that mean (two passes, as one process
computes it), so its output and, after DDP's average, its gradients equal one process's BatchNorm on the global batch.
Running statistics are updated as `nn.BatchNorm` does (unbiased variance over the global count). In evaluation, or on
one process, it is `nn.BatchNorm` itself, so it needs no collective where ranks may run different numbers of batches.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .global_batch import ranks, sum_over_ranks


class SyncBatchNorm(_BatchNorm):
    """`nn.BatchNorm{1,2,3}d` with the global batch's statistics in training under a process group of several ranks."""

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects (N, C, ...) input, got {x.dim()} dimension(s)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        world, _ = ranks()
        if not self.training or world == 1:
            return super().forward(x)
        self._check_input_dim(x)
        dims = [0, *range(2, x.dim())]
        view = (1, -1) + (1,) * (x.dim() - 2)
        count = x.new_full((1,), x.numel() // x.shape[1])
        stats = sum_over_ranks(torch.cat([x.sum(dims), count]), sync=True)
        n = stats[-1].detach()
        mean = stats[:-1] / n
        centred = x - mean.view(view)
        var = sum_over_ranks((centred * centred).sum(dims), sync=True) / n  # biased: what normalises
        y = centred * torch.rsqrt(var + self.eps).view(view)
        if self.affine:
            y = y * self.weight.view(view) + self.bias.view(view)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(var.detach() * (n / (n - 1).clamp_min(1)), alpha=m)
        return y


def convert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """`module` with every BatchNorm layer replaced by `SyncBatchNorm` holding the same parameters and buffers (the same
    tensors, so optimisers, checkpoints and state-dict keys are unchanged); returns the root (replaced if it is one)."""
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        out = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
        if module.affine:
            out.weight, out.bias = module.weight, module.bias
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
        return out
    for name, child in module.named_children():
        new = convert_sync_batchnorm(child)
        if new is not child:
            setattr(module, name, new)
    return module
