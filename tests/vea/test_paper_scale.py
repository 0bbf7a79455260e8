"""Paper scale of vea: configs/paper/vea.yaml parses with the real CLI without the dataset, builds on the meta device in
seconds, and plans (lit_iclr/vea/plan.py). Training-free; LLaVA-1.5-7B (28 GB in fp32) does not fit 24 GB, so no CPU
pass."""
from __future__ import annotations

from lit_iclr.core.plan import plan
from tests.twin import ROOT

CONFIG = str(ROOT / "configs/paper/vea.yaml")


def test_paper_plan_counts_two_answering_passes_of_llava():
    p = plan([CONFIG])
    assert not p.gradient
    tokens = 576 + 40
    # two forwards of ~2 x 7 B FLOPs per token, batch 8 (matrix products only)
    assert 0.8 < p.flops / (2 * 8 * tokens * 2 * 7.0e9) < 1.2
