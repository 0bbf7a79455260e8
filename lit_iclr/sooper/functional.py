"""SOOPER's updates as single compiled graphs (`compile_update`): loss, gradient, Adam step and Polyak update in one.

At the default widths (64 units) an eager update is a few hundred small operations, each paying Python, dispatch and
autograd bookkeeping, plus one `Optimizer.step` call; the authors' JAX code runs the whole cycle as one XLA program.
Here each update is a pure function of (parameters, optimizer state, batch, noise): `torch.func.grad_and_value` of the
loss through `torch.func.functional_call` (no autograd engine at run time), torch's functional Adam
(`torch.optim.adam.adam`, the code `Adam.step` runs) on the optimizer's own state tensors, and the Polyak update, all
traced by `torch.compile` into one graph, which inductor fuses. The optimizer's state stays its own (checkpoints and
an eager step read the same tensors), so compiled and eager updates can alternate.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad_and_value

from lit_iclr.core.functional_adam import AdamGroup, adam_step_with


class Methods(nn.Module):
    """`forward(name, *args)` = `owner.name(*args)`: lets `functional_call` run any loss method of `owner` with
    substituted parameters (named `owner.<parameter name>`)."""

    def __init__(self, owner: nn.Module):
        super().__init__()
        self.owner = owner

    def forward(self, name: str, *args):
        return getattr(self.owner, name)(*args)


def total(out) -> torch.Tensor:
    """The minimised loss of a loss method's output: the tensor, or the sum of a tuple's tensors (disjoint
    parameters, e.g. the actor's and the temperature's losses)."""
    if isinstance(out, torch.Tensor):
        return out
    loss = out[0]
    for term in out[1:]:
        loss = loss + term
    return loss


def make_update(methods: Methods, names: list[str], method: str, targets: tuple):
    """A function (states, *inputs) -> loss output: one Adam step on every parameter of `states` (the
    `adam_state` of each optimizer; `names` their names in `methods`) along the gradient of
    `total(owner.method(*inputs))`, then `lerp_(target, source, tau)` for each (target, source, tau) of `targets`.
    Other parameters enter the loss as constants (e.g. the critic in the actor's step)."""

    def update(states: list[list[AdamGroup]], *inputs: torch.Tensor):
        groups = [g for st in states for g in st]
        params = [p for (lists, _) in groups for p in lists[0]]

        def loss_of(values):
            out = functional_call(methods, dict(zip(names, values, strict=True)), (method, *inputs), tie_weights=False)
            return total(out), out

        with torch.no_grad():  # grad_and_value differentiates its own inputs; nothing else builds a graph
            grads, (_, out) = grad_and_value(loss_of, has_aux=True)([p.detach() for p in params])
            adam_step_with(groups, grads)
            for target, source, tau in targets:
                torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)
        return out

    # a code object of its own per loss: dynamo keeps compiled graphs, guards and its shape history per code object, so
    # the updates of one shared function would check each other's guards on every call and turn the shapes that differ
    # between them (the networks') dynamic
    update.__code__ = update.__code__.replace(co_name=f"update_{method}")
    return update
