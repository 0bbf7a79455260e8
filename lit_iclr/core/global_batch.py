"""A data-parallel training step that computes what one process computes on the global batch.

Under DDP each rank runs the step on its share of the global batch and the gradients are averaged, so the step equals
one process's with the global batch only where the loss is a plain mean over samples and everything random is drawn
per sample. Three things break that, and each has its piece here:

- **Random draws.** The global RNG's state at a training step differs between ranks and between a DDP run and one
  process (Lightning reseeds it when the process group starts, after the model was built; rank 0 alone prepares the
  data), and a rank drawing `randn(n)` for its n samples draws numbers meant for other samples. `step_rng` seeds the
  global RNG by (run seed, step) inside a block, the same on every rank and in a resumed run; in it, `rank_rows` draws
  for the global batch and keeps this rank's rows, `rows[rank::world]`, which is how the platform's training sampler
  deals the global batch (`core.loader.EpochShuffleSampler`: global row i is row i // world of rank i % world).
  Dropout is such a draw: `GlobalBatchDropout` (`convert_dropout` swaps a model's `nn.Dropout`s) draws its mask so;
  a tensor whose leading axis holds several rows per sample (merge segments) is told the rank's sample count by
  `batch_samples`.
- **Per-batch normalisers.** A loss `sum / count` over a batch (a focal loss over its positives, an L1 over visible
  points) averaged over ranks is the mean of the ranks' ratios, not the global ratio. With the denominator
  `rank_denominator(count) = (sum over ranks of count) / world`, DDP's average of the ranks' `sum_r / that` is
  `sum over ranks of sum_r / total count`, the global ratio (as mmdet's `reduce_mean(num_pos)`).
- **Batch statistics in the loss.** A statistic of the whole batch (an MoE router's importance per expert) is summed
  over the ranks with `sum_over_ranks`, whose backward sums the gradient over the ranks too, so the averaged gradient is
  that of the global statistic. BatchNorm is this case: `core.sync_batchnorm`.

The collectives (`rank_denominator`, `sum_over_ranks`) run only when `sync` is true: pass it where every rank runs the
same code (a training step), never in validation, where ranks may hold different numbers of batches.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn


def ranks() -> tuple[int, int]:
    """(processes, this process's rank) of the running process group; (1, 0) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


@contextmanager
def step_rng(step: int, salt: int = 0) -> Iterator[None]:
    """Inside the block the global RNG (CPU and the current CUDA device) is seeded by (the run's seed, `step`, `salt`),
    so every rank draws the same numbers, as one process does at that step, and a resumed run draws what an
    uninterrupted one drew; the outer RNG state is restored after it. The run's seed is `seed_everything`'s
    (PL_GLOBAL_SEED), 0 without one."""
    seed = (int(os.environ.get("PL_GLOBAL_SEED", 0)) * 1_000_003 + int(step) * 7919 + int(salt)) % (2**63)
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def rank_rows(draw: Callable[[tuple[int, ...]], torch.Tensor], shape: Sequence[int],
              samples: int | None = None) -> torch.Tensor:
    """This rank's part, of shape `shape`, of `draw` for the global batch.

    `shape[0]` holds `samples` samples (default `shape[0]`: one row each), each a run of `shape[0] // samples`
    consecutive rows (an image's tokens); `draw((samples * world, shape[0] // samples, *shape[1:]))` is made and
    this rank's samples `[rank::world]` kept. On one process: `draw(shape)`, the same numbers in the same order.
    The ranks' draws are one process's only if their generators are in the same state (`step_rng`, or a generator
    seeded alike on every rank).
    """
    shape = tuple(int(s) for s in shape)
    samples = shape[0] if samples is None else int(samples)
    if samples <= 0 or shape[0] % samples:
        raise ValueError(f"rank_rows: {shape[0]} rows are not whole runs of {samples} samples")
    world, rank = ranks()
    if world == 1:
        return draw(shape)
    full = draw((samples * world, shape[0] // samples, *shape[1:]))
    return full[rank::world].reshape(shape)


def randn_rows(like: torch.Tensor, samples: int | None = None) -> torch.Tensor:
    """`torch.randn_like(like)` from the global RNG, drawn for the global batch (`rank_rows`)."""
    return rank_rows(lambda s: torch.randn(s, dtype=like.dtype, device=like.device), like.shape, samples)


def rand_rows(like: torch.Tensor, samples: int | None = None) -> torch.Tensor:
    """`torch.rand_like(like)` from the global RNG, drawn for the global batch (`rank_rows`)."""
    return rank_rows(lambda s: torch.rand(s, dtype=like.dtype, device=like.device), like.shape, samples)


def rank_denominator(count: torch.Tensor, sync: bool, min_total: float = 0.0) -> torch.Tensor:
    """Denominator of this rank's `sum / count` loss so that DDP's average over ranks is the global `sum / count`:
    `max(sum over ranks of count, min_total) / world` (no gradient); `count.clamp_min(min_total)` on one process or
    without `sync`."""
    world, _ = ranks()
    count = count.detach().to(torch.get_default_dtype() if not count.is_floating_point() else count.dtype)
    if world == 1 or not sync:
        return count.clamp_min(min_total)
    total = count.clone()
    dist.all_reduce(total)
    return total.clamp_min(min_total) / world


def sum_over_ranks(x: torch.Tensor, sync: bool) -> torch.Tensor:
    """`x` summed over the ranks, differentiably: the backward sums the incoming gradient over the ranks too, so a loss
    term of the sum, present on every rank and averaged by DDP, has the gradient of the global batch's term. `x` itself
    on one process or without `sync`."""
    world, _ = ranks()
    if world == 1 or not sync:
        return x
    from torch.distributed.nn.functional import all_reduce

    return all_reduce(x)


_SAMPLES: list[int] = []  # the rank's batch size inside `batch_samples`, innermost last


@contextmanager
def batch_samples(n: int) -> Iterator[None]:
    """Inside the block `GlobalBatchDropout` reads a tensor whose leading axis is a multiple of `n` (this rank's batch
    size) as `n` samples of consecutive rows (tokens, merge segments); without it each leading row is one sample."""
    _SAMPLES.append(int(n))
    try:
        yield
    finally:
        _SAMPLES.pop()


class GlobalBatchDropout(nn.Dropout):
    """`nn.Dropout` whose keep mask is drawn for the global batch, this rank keeping its samples' rows (`rand_rows`):
    in a `step_rng` block, 2 ranks x B/2 drop what one process drops on the global batch of B (torch's dropout draws
    for the rank's own rows, so a rank's sample got the mask of another sample, and DDP a gradient no single
    process has). Keep with probability 1 - p, scaled by 1 / (1 - p) (Srivastava et al. 2014), as `nn.Dropout`.
    A leading axis that is no multiple of the `batch_samples` count (rows gathered per expert) is drawn per row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p >= 1.0:
            return torch.zeros_like(x)
        samples = _SAMPLES[-1] if _SAMPLES and x.shape[0] % _SAMPLES[-1] == 0 else None
        keep = rand_rows(x, samples) >= self.p
        return x * keep / (1.0 - self.p)


def convert_dropout(module: nn.Module) -> nn.Module:
    """`module` with every `nn.Dropout` (its exact class) replaced by a `GlobalBatchDropout` of the same p, in place
    (the root itself returned converted). No parameters or buffers change, so checkpoints load either way."""
    if type(module) is nn.Dropout:
        return GlobalBatchDropout(module.p)
    for name, child in module.named_children():
        new = convert_dropout(child)
        if new is not child:
            setattr(module, name, new)
    return module
