"""`core/functional_adam.py`: the functional Adam / AdamW step equals `opt.step()` and compiles as one graph."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.core.functional_adam import adam_groups, adam_step


def _setup(cls, **kw):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    opt = cls([{"params": net[0].parameters()}, {"params": net[2].parameters(), "lr": 0.05}], lr=0.01, **kw)
    return net, opt


def _grads(net, k: int) -> None:
    g = torch.Generator().manual_seed(k)
    net.zero_grad()
    net(torch.randn(8, 4, generator=g)).pow(2).sum().backward()


@pytest.mark.parametrize("cls,kw", [(torch.optim.Adam, {}), (torch.optim.Adam, {"weight_decay": 0.1}),
                                    (torch.optim.AdamW, {"weight_decay": 0.1}), (torch.optim.Adam, {"maximize": True})])
@pytest.mark.parametrize("compiled", [False, True])
def test_functional_step_equals_optimizer_step(cls, kw, compiled):
    ref, ref_opt = _setup(cls, foreach=False, **kw)  # the plain per-tensor loop as the reference
    net, opt = _setup(cls, **kw)
    step = torch.compile(adam_step, backend="aot_eager", fullgraph=True) if compiled else adam_step  # no graph breaks
    for k in range(4):
        _grads(ref, k)
        ref_opt.step()
        _grads(net, k)
        groups = adam_groups(opt)
        if k == 0:
            assert groups is None  # no state yet: the first step is an ordinary one
            opt.step()
        else:
            step(groups)
    for a, b in zip(ref.parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=5e-6)  # compiled: bias corrections in float32 tensors
    for sa, sb in zip(ref_opt.state.values(), opt.state.values(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(sa[key], sb[key], rtol=1e-4, atol=1e-7)
    assert float(opt.state[next(net.parameters())]["step"]) == 4.0


def test_no_functional_form_where_adam_step_would_differ():
    net, opt = _setup(torch.optim.Adam, amsgrad=True)
    _grads(net, 0)
    opt.step()
    assert adam_groups(opt) is None  # amsgrad
    net, opt = _setup(torch.optim.Adam)
    _grads(net, 0)
    opt.step()
    assert adam_groups(opt) is not None
    net[2].bias.grad = None  # Adam skips a parameter without a gradient
    assert adam_groups(opt) is None
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    assert adam_groups(sgd) is None


@pytest.mark.parametrize("cls,kw", [(torch.optim.Adam, {}), (torch.optim.AdamW, {"weight_decay": 0.1})])
def test_step_with_outside_gradients_equals_optimizer_step(cls, kw):
    """`adam_step_with(adam_state(opt), grads)`: gradients handed in (as `torch.func.grad` gives them), not read from
    `.grad`; the same step as `opt.step()` with those gradients."""
    from lit_iclr.core.functional_adam import adam_state, adam_step_with

    ref, ref_opt = _setup(cls, foreach=False, **kw)
    net, opt = _setup(cls, **kw)
    for k in range(4):
        _grads(ref, k)
        ref_opt.step()
        _grads(net, k)
        state = adam_state(opt)
        if k == 0:
            assert state is None
            opt.step()
            continue
        grads = [p.grad.clone() for p in net.parameters()]
        net.zero_grad(set_to_none=True)  # the step must not read .grad
        assert adam_groups(opt) is None and adam_state(opt) is not None
        adam_step_with(state, grads)
    for a, b in zip(ref.parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=5e-6)
