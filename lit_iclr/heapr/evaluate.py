"""Evaluation of (pruned) causal LMs: perplexity, zero-shot topic accuracy, throughput."""
from __future__ import annotations

import math
import time

import torch
from torch import nn

from lit_iclr.core.corpus import zero_shot_topic_accuracy

from .calibrate import lm_loss_sum


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def perplexity(model: nn.Module, loader, max_batches: int | None = None) -> float:
    """exp(mean next-token NLL) over every predicted token of `loader`."""
    was = model.training
    model.eval()
    dev, nll, count = _device(model), 0.0, 0
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        ids = batch["input_ids"].to(dev)
        mask = batch.get("attention_mask")
        mask = mask.to(dev) if mask is not None else None
        loss, n = lm_loss_sum(model(input_ids=ids, attention_mask=mask).logits, batch.get("labels", ids).to(dev), mask)
        nll, count = nll + float(loss), count + int(n)
    model.train(was)
    return math.exp(nll / max(count, 1))


@torch.no_grad()
def topic_accuracy(model: nn.Module, loader) -> float:
    """Zero-shot topic accuracy: the topic name with the highest likelihood after the document (core.corpus)."""
    was = model.training
    model.eval()
    dev = _device(model)
    acc = zero_shot_topic_accuracy(lambda ids, m: model(input_ids=ids.to(dev), attention_mask=m.to(dev)).logits.cpu(),
                                   loader)
    model.train(was)
    return acc


@torch.no_grad()
def tokens_per_second(model: nn.Module, input_ids: torch.Tensor, repeats: int = 3) -> float:
    """Forward throughput on `input_ids` (best of `repeats`, after one warm-up pass)."""
    model.eval()
    ids = input_ids.to(_device(model))
    model(input_ids=ids)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(input_ids=ids)
        best = min(best, time.perf_counter() - t0)
    return ids.numel() / best
