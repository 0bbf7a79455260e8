"""Paper scale of ttamer: configs/paper/ttamer.yaml parses with the real CLI without the dataset, builds on the meta
device in seconds, and plans (lit_iclr/ttamer/plan.py). No gradients: step_loss is None; the policy fit runs at paper
size on the CPU."""
from __future__ import annotations

import pytest
import torch

from lit_iclr.core.plan import build, method_hooks, plan
from tests.twin import ROOT

CONFIG = str(ROOT / "configs/paper/ttamer.yaml")


def test_paper_plan_is_forward_only_with_no_parameters():
    p = plan([CONFIG])
    assert not p.gradient and p.params["total"] == 0


@pytest.mark.slow
def test_real_size_policy_fit_on_cpu():
    """fit_policies on a calibration table of the paper config's size (25,000 x 4 stages x 1000 classes)."""
    module, datamodule, _ = build([CONFIG], "cpu")
    batch = method_hooks(module).example_batch(datamodule, 1, "cpu")
    g = torch.Generator().manual_seed(0)
    n, s, c = batch["logits"].shape
    labels = torch.randint(0, c, (n,), generator=g)
    logits = torch.randn(n, s, c, generator=g)
    logits[torch.arange(n), :, labels] += torch.linspace(1.0, 4.0, s)  # later stages more accurate
    module.fit_policies(logits, labels, torch.tensor([0.06, 1.8, 4.1, 17.6], dtype=torch.float64))
    assert bool(module.fitted) and torch.isfinite(module.stop_value).all() and torch.isfinite(module.temperatures).all()
