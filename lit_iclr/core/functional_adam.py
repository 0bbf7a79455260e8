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

__all__ = ["adam_groups", "adam_state", "adam_step", "adam_step_with"]

AdamGroup = tuple[tuple[list[torch.Tensor], ...], dict[str, Any]]


def adam_state(opt: torch.optim.Optimizer) -> list[AdamGroup] | None:
    """Per parameter group: (params, exp_avgs, exp_avg_sqs, steps) and the step's hyperparameters, for a step whose
    gradients come from elsewhere (`adam_step_with`, e.g. `torch.func.grad`); None when this optimizer step has no such
    form: not Adam/AdamW, amsgrad, differentiable, a tensor learning rate, or state not yet made (take one ordinary
    `opt.step()` first)."""
    if type(opt) not in (torch.optim.Adam, torch.optim.AdamW):
        return None
    out = []
    for group in opt.param_groups:
        if group["amsgrad"] or group["differentiable"] or isinstance(group["lr"], torch.Tensor):
            return None
        params = group["params"]
        states = [opt.state.get(p) for p in params]
        if not all(states):
            return None
        lists = (list(params), [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                 [s["step"] for s in states])
        beta1, beta2 = group["betas"]
        out.append((lists, {"lr": group["lr"], "beta1": beta1, "beta2": beta2, "eps": group["eps"],
                            "weight_decay": group["weight_decay"], "maximize": group["maximize"],
                            "decoupled_weight_decay": group.get("decoupled_weight_decay",
                                                                isinstance(opt, torch.optim.AdamW))}))
    return out


def adam_groups(opt: torch.optim.Optimizer) -> list[AdamGroup] | None:
    """`adam_state` with each parameter's `.grad` as the gradients: (params, grads, exp_avgs, exp_avg_sqs, steps) per
    group; None also when a parameter has no gradient (Adam would skip it)."""
    state = adam_state(opt)
    if state is None:
        return None
    out = []
    for (params, exp_avgs, exp_avg_sqs, steps), kw in state:
        if any(p.grad is None for p in params):
            return None
        out.append(((params, [p.grad for p in params], exp_avgs, exp_avg_sqs, steps), kw))
    return out


def adam_step(groups: list[AdamGroup]) -> None:
    """One Adam step of `adam_groups(opt)`, in place (as `opt.step()` would take it). Compiled, `capturable` keeps the
    step counters and bias corrections as tensors, so nothing leaves the graph (eager, torch allows it on GPUs only)."""
    capturable = torch.compiler.is_compiling()
    with torch.no_grad():
        for (params, grads, exp_avgs, exp_avg_sqs, steps), kw in groups:
            adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=True, capturable=capturable, amsgrad=False,
                 **kw)


def adam_step_with(state: list[AdamGroup], grads: list[torch.Tensor]) -> None:
    """One Adam step of `adam_state(opt)` groups along `grads` (one per parameter, in the groups' order), in place."""
    capturable = torch.compiler.is_compiling()
    i = 0
    with torch.no_grad():
        for (params, exp_avgs, exp_avg_sqs, steps), kw in state:
            adam(params, list(grads[i:i + len(params)]), exp_avgs, exp_avg_sqs, [], steps, foreach=True,
                 capturable=capturable, amsgrad=False, **kw)
            i += len(params)
