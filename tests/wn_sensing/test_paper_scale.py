"""Paper scale of wn_sensing: configs/paper/wn_sensing.yaml parses with the real CLI without the dataset, builds on the
meta device in seconds, and plans (lit_iclr/wn_sensing/plan.py)."""
from __future__ import annotations

import torch

from lit_iclr.core.plan import build, method_hooks, plan
from tests.twin import ROOT

CONFIG = str(ROOT / "configs/paper/wn_sensing.yaml")


def test_paper_plan_counts_the_factor_and_the_operator():
    p = plan([CONFIG])
    m, r = 100, 20
    assert p.params["total"] == m * r + r * r  # X (m, r) and Theta (r, r)
    assert p.gradient and p.steps == 2000


def test_real_size_iteration_on_cpu_has_finite_loss_and_gradients():
    """One full-gradient iteration at the paper config's size (n = 3920 Gaussian measurements of a 100 x 100 target)."""
    module, datamodule, _ = build([CONFIG], "cpu")
    hooks = method_hooks(module)
    batch = hooks.example_batch(datamodule, 1, "cpu")
    g = torch.Generator().manual_seed(0)
    batch["sensing"] = torch.randn(batch["sensing"].shape, generator=g, dtype=torch.float64) / batch["sensing"].shape[0] ** 0.5
    batch["y"] = torch.randn(batch["y"].shape, generator=g, dtype=torch.float64)
    loss = hooks.step_loss(module, batch)
    loss.backward()
    grads = [p.grad for p in module.parameters()]
    assert torch.isfinite(loss) and all(gr is not None and torch.isfinite(gr).all() for gr in grads)
    # independent check of the value: f = 1/4 ||A(X Theta X^T) - y||^2 computed from the dense product
    x, theta = module.factor()
    z = (x @ theta @ x.T).reshape(-1)
    assert torch.allclose(loss, 0.25 * ((batch["sensing"] @ z - batch["y"]) ** 2).sum())
