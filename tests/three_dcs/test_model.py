"""Encoders and hand-made features: invariances (rotation, translation, reflection, padding), checked numerically."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_iclr.three_dcs.model import PaiNN, SchNet, pad_molecules


def rotation(seed=0, proper=True):
    R = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))[0]
    if (np.linalg.det(R) > 0) != proper:
        R[:, 0] *= -1
    return torch.tensor(R, dtype=torch.float32)


@pytest.mark.parametrize("cls", [SchNet, PaiNN])
def test_encoders_are_e3_invariant_and_ignore_padding(cls):
    torch.manual_seed(0)
    net = cls(hidden=16, n_interactions=2, n_rbf=8, cutoff=4.0).eval()
    z = torch.tensor([[6, 6, 8, 1, 1, 0, 0]])
    pos = torch.randn(1, 7, 3)
    y, e = net(z, pos)
    for proper in (True, False):  # rotations and reflections
        y2, e2 = net(z, pos @ rotation(1, proper).T + 2.5)
        assert torch.allclose(y, y2, atol=1e-4) and torch.allclose(e, e2, atol=1e-4)
    y3, e3 = net(z[:, :5], pos[:, :5])  # the padded atoms change nothing
    assert torch.allclose(y, y3, atol=1e-5) and torch.allclose(e, e3, atol=1e-5)
    far = pos.clone()
    far[0, 2] += 1.0  # and the geometry does matter
    assert not torch.allclose(net(z, far)[1], e, atol=1e-4)


def test_painn_vector_features_are_equivariant():
    torch.manual_seed(0)
    net = PaiNN(hidden=8, n_interactions=1, n_rbf=6).eval()
    z, pos = torch.tensor([[6, 7, 8, 1]]), torch.randn(1, 4, 3)
    R = rotation(2)
    captured = {}

    def run(p):
        h = net.U[0].register_forward_hook(lambda m, i, o: captured.setdefault(len(captured), i[0].detach()))
        net(z, p)
        h.remove()

    run(pos)
    run(pos @ R.T)
    v0, v1 = captured[0], captured[1]  # (1, N, 3, H) vector features entering the update
    assert torch.allclose(torch.einsum("ij,bnjh->bnih", R, v0), v1, atol=1e-4)


def test_pad_molecules():
    Z, P = pad_molecules([np.array([6, 1]), np.array([8])], [np.ones((2, 3)), np.zeros((1, 3))])
    assert Z.tolist() == [[6, 1], [8, 0]] and P.shape == (2, 2, 3)


def test_histograms_blind_and_aware_to_reflection(tiny_3dcs):
    from rdkit import Chem
    from rdkit.Geometry import Point3D

    from lit_iclr.three_dcs import ChiralHistogram, DistanceHistogram, MorganFingerprint
    from lit_iclr.three_dcs.formats import read_chirality

    g = read_chirality(tiny_3dcs)[0]
    mol = g.mols[0]
    mirror = Chem.Mol(mol)
    for i, p in enumerate(mol.GetConformer().GetPositions()):
        mirror.GetConformer().SetAtomPosition(i, Point3D(-p[0], p[1], p[2]))
    dist = DistanceHistogram().embed([mol, mirror])
    chiral = ChiralHistogram().embed([mol, mirror])
    assert np.allclose(dist[0], dist[1])  # enantiomers share every interatomic distance
    assert not np.allclose(chiral[0], chiral[1], atol=1e-3)  # signed dihedrals / volumes flip
    assert np.allclose(chiral[0, : dist.shape[1]], chiral[1, : dist.shape[1]])
    bits = MorganFingerprint(chirality=True).embed([mol, mirror])
    plain = MorganFingerprint().embed([mol, mirror])
    assert (bits[0] != bits[1]).any() and (plain[0] == plain[1]).all()
