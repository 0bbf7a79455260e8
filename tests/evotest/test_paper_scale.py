"""Paper scale of evotest: configs/paper/evotest.yaml parses with the real CLI without the dataset, builds on the meta
device in seconds, and plans (lit_iclr/evotest/plan.py). No gradients; the 8 B actor (32 GB in fp32) does not fit 24
GB, so no CPU pass."""
from __future__ import annotations

from lit_iclr.core.plan import plan
from tests.twin import ROOT

CONFIG = str(ROOT / "configs/paper/evotest.yaml")


def test_paper_plan_counts_the_actor_forward():
    p = plan([CONFIG])
    assert not p.gradient and p.steps == 50 * 110
    assert p.params["per_group"]["actor_lm"] == 8_030_261_248
    assert 0.8 < p.flops / (2 * 16 * 2056 * 8.03e9) < 1.2
