"""Per-question results of every data-parallel rank, so VEA's validation and test numbers count each question once.

Under DDP each rank validates and tests its own share of the questions (the platform's eval sampler deals them without
padding, `core.ddp.use_unrepeated_eval_sampler`). VEA's numbers are not plain means that `sync_dist` could average:
the layers are profiled on the calibration half of *all* validation questions before any question is re-answered, and
the summary holds conditional rates (hit rates of the wrong answers, the seeing-but-not-believing rate) and per-layer
NaN-skipping means. So every rank collects its per-question rows, `gather_lists` hands each rank the rows of all ranks,
and each rank computes the same numbers one process computes on the whole split (up to the order of float sums).
"""
from __future__ import annotations

import torch.distributed as dist


def gather_lists(items: list) -> list:
    """The items of every rank's list, rank after rank (the list itself without a process group). Every rank must call
    it, also one whose list is empty. Items travel pickled (`all_gather_object`): CPU tensors of a few hundred rows."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return items
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]
