"""HEAPr's calibration statistics are the same with activation checkpointing (reentrant or not) as without."""
import pytest
import torch

from lit_iclr.core.moe import tiny_model
from lit_iclr.heapr.calibrate import calibrate

from .helpers import markov_batches


@pytest.mark.parametrize("fisher_state", ["full", "atom"])
@pytest.mark.parametrize("recompute", ["non_reentrant", "reentrant"])
def test_calibration_with_recompute_equals_plain(fisher_state, recompute):
    batches = markov_batches(2, 2, 12, vocab=128)
    ref = calibrate(tiny_model("qwen2_moe"), batches, fisher_state)
    got = calibrate(tiny_model("qwen2_moe"), batches, fisher_state, recompute=recompute)
    assert got.loss == pytest.approx(ref.loss, rel=1e-6)
    for a, b in zip(ref.blocks, got.blocks, strict=True):
        torch.testing.assert_close(b.n, a.n, rtol=0, atol=0)  # each routed pair counted once, not once per replay
        assert a.n.sum() > 0
        for x, y in zip(a.h2 + (a.M or a.gh2), b.h2 + (b.M or b.gh2), strict=True):
            torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-7)
        assert sum(float(t.abs().sum()) for t in (a.M or a.gh2)) > 0


def test_unknown_recompute_is_refused():
    with pytest.raises(ValueError, match="recompute"):
        calibrate(tiny_model("qwen2_moe"), markov_batches(1, 1, 8, vocab=128), recompute="yes")
