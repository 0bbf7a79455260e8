"""Paper scale of trajectory_sampler: configs/paper/trajectory_sampler.yaml parses with the real CLI without the dataset,
builds on the meta device in seconds, and plans (lit_iclr/trajectory_sampler/plan.py)."""
from __future__ import annotations

import torch

from lit_iclr.core.plan import build, count_params, method_hooks
from tests.twin import ROOT

CONFIG = str(ROOT / "configs/paper/trajectory_sampler.yaml")


def test_real_size_step_on_cpu_has_finite_loss_and_gradients():
    """Batch 1 of TFBind8-shaped input (8 one-hot bases) through the paper-size predictor, forward and backward."""
    module, datamodule, _ = build([CONFIG], "cpu")
    hooks = method_hooks(module)
    batch = hooks.example_batch(datamodule, 1, "cpu")
    assert batch["x"].shape == (1, 8, 4)
    batch["x"][0, torch.arange(8), torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])] = 1.0
    batch["y"] = torch.tensor([0.7])
    loss = hooks.step_loss(module, batch)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in module.parameters())
    assert count_params(module)["total"] == 4 * 8 * 256 + 256 + 256 * 256 + 256 + 256 + 1
