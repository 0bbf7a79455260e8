"""Paper scale of juli: configs/paper/juli.yaml parses with the real CLI without the dataset, builds on the meta device
in seconds, and plans (lit_iclr/juli/plan.py). The 8 B target in fp32 (32 GB) does not fit 24 GB: the CPU step checks
BiasNet at real size."""
from __future__ import annotations

import torch

from lit_iclr.core.plan import plan
from tests.twin import ROOT

CONFIG = str(ROOT / "configs/paper/juli.yaml")


def test_paper_plan_adds_the_frozen_target():
    p = plan([CONFIG])
    assert p.gradient and p.memory["target weights (frozen)"] == 8_030_261_248 * 2


def test_biasnet_real_size_step_on_cpu_has_finite_loss_and_gradients():
    """BiasNet at the paper config's width on what a top-5 API returns over a 64-token reply, forward and backward."""
    from lit_iclr.juli.model import BiasNet
    from lit_iclr.juli.steering import biasnet_loss

    torch.manual_seed(0)
    net = BiasNet(max_k=5, hidden=256, token_buckets=0, max_steps=64)
    ids = torch.randint(0, 128256, (1, 64, 5))
    lp = torch.log_softmax(torch.randn(1, 64, 5), -1).sort(-1, descending=True).values
    target = ids[:, :, 1]  # the rank-2 candidate at every position
    loss, coverage = biasnet_loss(net, ids, lp, target, torch.ones(1, 64, dtype=torch.bool))
    loss.backward()
    assert torch.isfinite(loss) and float(coverage) == 1.0
    assert all(torch.isfinite(p.grad).all() for p in net.parameters() if p.grad is not None)
