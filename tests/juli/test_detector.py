"""Trace features against a hand computation; the detector's AUROC against separable and identical classes."""
from __future__ import annotations

import math

import torch

from lit_iclr.juli.api import Trace
from lit_iclr.juli.detector import detector_auroc, trace_features


def test_trace_features_by_hand():
    tr = Trace(tokens=torch.tensor([[5, 6, 7], [8, 0, 0]]), mask=torch.tensor([[True, True, True], [True, False, False]]),
               true_logp=torch.tensor([[-0.1, -2.0, -0.3], [-0.5, -9.0, -9.0]]),
               true_rank=torch.tensor([[0, 3, 0], [1, 7, 7]]))
    f = trace_features(tr)
    expect = torch.tensor([[-0.8, -2.0, 1 / 3, math.log(4), -0.1, 3.0], [-0.5, -0.5, 1.0, math.log(2), -0.5, 1.0]])
    torch.testing.assert_close(f, expect)


def test_detector_auroc_separable_and_indistinguishable():
    g = torch.Generator().manual_seed(0)
    neg = torch.randn(60, 6, generator=g)
    assert detector_auroc(neg + 6.0, neg.flip(0)) == 1.0
    same = detector_auroc(torch.randn(200, 6, generator=g), torch.randn(200, 6, generator=g))
    assert 0.35 < same < 0.65
