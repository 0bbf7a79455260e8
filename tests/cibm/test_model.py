"""Families, interventions and group orders checked against direct computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_iclr.cibm import interventions as tti
from lit_iclr.cibm.model import FAMILIES, ConceptBottleneck


def _net(family, stochastic=True, **kw):
    torch.manual_seed(0)
    return ConceptBottleneck([6], num_concepts=4, num_classes=3, family=family, stochastic=stochastic, hidden=8, emb_dim=2, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_predicts_concepts_and_labels(family):
    net = _net(family, stochastic=family != "blackbox")
    out = net(torch.randn(5, 6))
    assert out["c_logits"].shape == (5, 4) and out["y_logits"].shape == (5, 3)
    assert torch.isfinite(out["y_logits"]).all()
    if net.stochastic:
        assert (out["sigma"] >= 1e-7).all()
        lat = 4 * 2 if family == "probcbm" else 4
        assert out["mu"].shape == (5, lat)


@pytest.mark.parametrize("family", ["sequential", "independent", "probcbm"])
def test_full_intervention_feeds_the_true_concepts_to_the_head(family):
    net = _net(family)
    x, c = torch.randn(5, 6), (torch.rand(5, 4) > 0.5).float()
    enc = net.encode(x)
    out = net.decide(enc, net.sample(enc), c_true=c, mask=torch.ones(5, 4, dtype=torch.bool))
    torch.testing.assert_close(out["y_logits"], net.head(c))


def test_cem_intervention_selects_the_positive_or_negative_embedding():
    net = _net("cem")
    x, c = torch.randn(5, 6), (torch.rand(5, 4) > 0.5).float()
    enc = net.encode(x)
    out = net.decide(enc, net.sample(enc), c_true=c, mask=torch.ones(5, 4, dtype=torch.bool))
    emb = enc["emb"]
    chosen = torch.where(c.bool().unsqueeze(-1), emb[:, :, 0], emb[:, :, 1])
    torch.testing.assert_close(out["y_logits"], net.head(chosen.flatten(1)))


def test_joint_intervention_logits_follow_the_official_scales():
    c = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[True, True, False, False]])
    det = _net("joint", stochastic=False)
    enc = det.encode(torch.randn(1, 6))
    z = det.sample(enc)
    out = det.decide(enc, z, c_true=c, mask=mask)
    expected = torch.cat([torch.tensor([3.0, -3.0]), z[0, 2:]])[None]  # BasicMLP: +/-3
    torch.testing.assert_close(out["y_logits"], det.head(expected))
    sto = _net("joint")
    enc = sto.encode(torch.randn(3, 6))
    z = sto.sample(enc)
    c3 = c.repeat(3, 1)
    out = sto.decide(enc, z, c_true=c3, mask=mask.repeat(3, 1))
    scale = z.max() - z.mean()  # StochasticMLP.forward_tti
    zz = z.clone()
    zz[:, :2] = (2 * c3[:, :2] - 1) * scale
    torch.testing.assert_close(out["y_logits"], sto.head(zz))


def test_group_masks_and_orders():
    groups = [[0, 1], [2], [3, 4, 5]]
    order = torch.tensor([[2, 0, 1], [1, 2, 0]])
    m = tti.group_mask(order, groups, 2, 6)
    assert m.tolist() == [[True, True, False, True, True, True], [False, False, True, True, True, True]]
    assert not tti.group_mask(order, groups, 0, 6).any() and tti.group_mask(order, groups, 3, 6).all()
    # uncertainty: density at the boundary, log N(0; mu, sigma); mu = 0 with a wide sigma is the most uncertain
    mu = torch.tensor([[4.0, 4.0, 0.0, 3.0, 3.0, 3.0]])
    sigma = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    assert tti.uncertainty_order(mu, sigma, groups).tolist() == [[1, 2, 0]]
    assert tti.uncertainty_order(torch.tensor([[0.1, 0.1, 5.0, -1.0, 1.0, 1.0]]), None, groups).tolist() == [[0, 2, 1]]


def test_curve_summary():
    s = tti.summarize(np.array([0.5, 0.6, 0.7, 0.69, 0.9]))
    assert s["auc"] == pytest.approx(np.mean([0.6, 0.7, 0.69, 0.9]))
    assert s["normalized_auc"] == pytest.approx(0.1)
    assert s["monotone"] == 0.0 and s["full"] == 0.9  # a 1-point drop is not monotone at the 0.5-point tolerance
    assert tti.summarize(np.array([0.5, 0.6, 0.598, 0.7]))["monotone"] == 1.0
