"""Paper scale of mosa: configs/paper/mosa.yaml parses with the real CLI without the dataset, builds on the meta device
in seconds, and plans (lit_iclr/mosa/plan.py). The paper-size DiT (1.95 B parameters; AdamW state alone 15.6 GB in
fp32) does not fit 24 GB: no CPU step."""
from __future__ import annotations

from lit_iclr.core.plan import plan
from tests.twin import ROOT

CONFIG = str(ROOT / "configs/paper/mosa.yaml")


def test_paper_plan_counts_the_dit_and_does_not_fit_24_gb_on_one_device():
    p = plan([CONFIG])
    assert 1.9e9 < p.params["total"] < 2.0e9 and p.gradient
    n = p.params["total"]
    assert 16 * n > 24e9  # fp32 weights + gradients + two AdamW moments, before any activation
