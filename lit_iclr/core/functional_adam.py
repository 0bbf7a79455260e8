"""Adam / AdamW steps in a form `torch.compile` traces without graph breaks.

`Optimizer.step` breaks dynamo's graph before and after itself (torch/optim/optimizer.py, `_use_grad`), so a compiled
function that calls two `opt.step()` and a Polyak update between them runs as five graphs with five guard checks. On a
small update (VGF at its default size) that fixed cost is a few percent of the step. `adam_groups(opt)` reads one
optimizer's parameters, gradients and moment buffers, all owned by the optimizer itself, so checkpoints, an eager
step and this one share one state, and `adam_step(groups)` applies torch's own functional Adam
(`torch.optim.adam.adam`, the code `Adam.step` runs) to them; inside one `torch.compile`d function it traces into the
caller's graph.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.optim.adam import adam

__all__ = ["adam_groups", "adam_step"]

AdamGroup = tuple[tuple[list[torch.Tensor], ...], dict[str, Any]]


def adam_groups(opt: torch.optim.Optimizer) -> list[AdamGroup] | None:
    """Per parameter group: (params, grads, exp_avgs, exp_avg_sqs, steps) and the step's hyperparameters; None when
    this optimizer step has no such form: not Adam/AdamW, amsgrad, differentiable, a tensor learning rate, state not yet
    made (take one ordinary `opt.step()` first) or a parameter without a gradient (Adam would skip it)."""
    if type(opt) not in (torch.optim.Adam, torch.optim.AdamW):
        return None
    out = []
    for group in opt.param_groups:
        if group["amsgrad"] or group["differentiable"] or isinstance(group["lr"], torch.Tensor):
            return None
        params = group["params"]
        states = [opt.state.get(p) for p in params]
        if any(p.grad is None or not s for p, s in zip(params, states, strict=True)):
            return None
        lists = (params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                 [s["step"] for s in states])
        beta1, beta2 = group["betas"]
        out.append((lists, {"lr": group["lr"], "beta1": beta1, "beta2": beta2, "eps": group["eps"],
                            "weight_decay": group["weight_decay"], "maximize": group["maximize"],
                            "decoupled_weight_decay": group.get("decoupled_weight_decay",
                                                                isinstance(opt, torch.optim.AdamW))}))
    return out


def adam_step(groups: list[AdamGroup]) -> None:
    """One Adam step of `adam_groups(opt)`, in place (as `opt.step()` would take it). Compiled, `capturable` keeps the
    step counters and bias corrections as tensors, so nothing leaves the graph (eager, torch allows it on GPUs only)."""
    capturable = torch.compiler.is_compiling()
    with torch.no_grad():
        for (params, grads, exp_avgs, exp_avg_sqs, steps), kw in groups:
            adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True, capturable=capturable, amsgrad=False,
                 **kw)
