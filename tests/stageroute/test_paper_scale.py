"""Paper scale of stageroute: configs/paper/stageroute.yaml parses with the real CLI without the dataset, builds on the
meta device in seconds, and plans (lit_iclr/stageroute/plan.py). No gradients: step_loss is None and the module has no
parameters."""
from __future__ import annotations

from lit_iclr.core.plan import plan
from tests.twin import ROOT

CONFIG = str(ROOT / "configs/paper/stageroute.yaml")


def test_paper_plan_is_forward_only_with_no_parameters():
    p = plan([CONFIG])
    assert not p.gradient and p.params["total"] == 0 and p.batch_size == 500
