"""Learned 3-D conformer encoders on padded atom tensors: SchNet (invariant) and PaiNN (E(3)-equivariant).

Inputs are `z` (B, N) atomic numbers (0 = padding) and `pos` (B, N, 3) in Angstrom; all pair terms are dense
(B, N, N, ...) tensors, which for molecules of up to ~30 atoms is faster on CPU than gathering edge lists. `forward`
returns the per-molecule prediction and the pooled embedding (the representation scored by the benchmark).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def ssp(x: torch.Tensor) -> torch.Tensor:
    """Shifted softplus `ln(0.5 e^x + 0.5)` (SchNet)."""
    return F.softplus(x) - math.log(2.0)


class RadialBasis(nn.Module):
    """Gaussian expansion of distances on [0, cutoff] times the cosine cutoff `0.5 (cos(pi d / rc) + 1)`."""

    def __init__(self, n_rbf: int, cutoff: float):
        super().__init__()
        self.register_buffer("centres", torch.linspace(0.0, cutoff, n_rbf))
        self.gamma = 0.5 / (cutoff / (n_rbf - 1)) ** 2
        self.cutoff = cutoff

    def forward(self, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rbf = torch.exp(-self.gamma * (d[..., None] - self.centres) ** 2)
        fcut = 0.5 * (torch.cos(math.pi * d / self.cutoff) + 1.0) * (d < self.cutoff)
        return rbf, fcut


def pair_geometry(z: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Atom mask (B, N), pair mask (B, N, N) without self pairs, distances and unit vectors r_ij = (x_j - x_i)/d."""
    mask = z > 0
    diff = pos[:, None, :, :] - pos[:, :, None, :]  # (B, N, N, 3): x_j - x_i
    d = torch.sqrt((diff**2).sum(-1) + 1e-12)
    eye = torch.eye(z.shape[1], dtype=torch.bool, device=z.device)
    pmask = mask[:, :, None] & mask[:, None, :] & ~eye
    return mask, pmask, d, diff / d[..., None]


class SchNet(nn.Module):
    """SchNet (Schuett et al. 2017): continuous-filter convolutions `x_i += f(sum_j x_j W(d_ij))`, invariant features."""

    def __init__(self, hidden: int = 64, n_interactions: int = 3, n_rbf: int = 32, cutoff: float = 5.0,
                 extensive: bool = True):
        super().__init__()
        self.embedding = nn.Embedding(100, hidden, padding_idx=0)
        self.rbf = RadialBasis(n_rbf, cutoff)
        self.filters = nn.ModuleList(nn.Sequential(nn.Linear(n_rbf, hidden), nn.Softplus(), nn.Linear(hidden, hidden))
                                     for _ in range(n_interactions))
        self.in2f = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(n_interactions))
        self.f2out = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.Softplus(), nn.Linear(hidden, hidden))
                                   for _ in range(n_interactions))
        self.head = nn.Sequential(nn.Linear(hidden, hidden // 2), nn.Softplus(), nn.Linear(hidden // 2, 1))
        self.extensive = extensive

    def atoms(self, z: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask, pmask, d, _ = pair_geometry(z, pos)
        rbf, fcut = self.rbf(d)
        w_cut = (fcut * pmask)[..., None]
        x = self.embedding(z)
        for filt, lin_in, lin_out in zip(self.filters, self.in2f, self.f2out, strict=True):
            W = filt(rbf) * w_cut  # (B, N, N, H)
            m = torch.einsum("bijh,bjh->bih", W, lin_in(x))
            x = x + lin_out(m)
        return x * mask[..., None], mask

    def forward(self, z: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, mask = self.atoms(z, pos)
        return readout(self.head(x).squeeze(-1), x, mask, self.extensive)


class PaiNN(nn.Module):
    """PaiNN (Schuett et al. 2021): scalar s_i and vector v_i features, rotation- and reflection-equivariant messages
    `ds_i = sum_j phi_s(s_j) W_s(d_ij)`, `dv_i = sum_j v_j phi_vv W_vv + phi_vs W_vs r_ij`, then gated updates."""

    def __init__(self, hidden: int = 64, n_interactions: int = 3, n_rbf: int = 20, cutoff: float = 5.0,
                 extensive: bool = True):
        super().__init__()
        h = hidden
        self.embedding = nn.Embedding(100, h, padding_idx=0)
        self.rbf = RadialBasis(n_rbf, cutoff)
        self.phi = nn.ModuleList(nn.Sequential(nn.Linear(h, h), nn.SiLU(), nn.Linear(h, 3 * h)) for _ in range(n_interactions))
        self.W = nn.ModuleList(nn.Linear(n_rbf, 3 * h) for _ in range(n_interactions))
        self.U = nn.ModuleList(nn.Linear(h, h, bias=False) for _ in range(n_interactions))
        self.V = nn.ModuleList(nn.Linear(h, h, bias=False) for _ in range(n_interactions))
        self.upd = nn.ModuleList(nn.Sequential(nn.Linear(2 * h, h), nn.SiLU(), nn.Linear(h, 3 * h))
                                 for _ in range(n_interactions))
        self.head = nn.Sequential(nn.Linear(h, h // 2), nn.SiLU(), nn.Linear(h // 2, 1))
        self.hidden, self.extensive = h, extensive

    def atoms(self, z: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask, pmask, d, rhat = pair_geometry(z, pos)
        rbf, fcut = self.rbf(d)
        cut = (fcut * pmask)[..., None]
        h = self.hidden
        s = self.embedding(z)
        v = s.new_zeros(*s.shape[:2], 3, h)
        for phi, W, U, V, upd in zip(self.phi, self.W, self.U, self.V, self.upd, strict=True):
            x = phi(s)[:, None, :, :] * W(rbf) * cut  # (B, i, j, 3H)
            ds, dvv, dvs = x.split(h, dim=-1)
            s = s + ds.sum(2)
            v = v + torch.einsum("bijh,bjch->bich", dvv, v) + torch.einsum("bijh,bijc->bich", dvs, rhat)
            Uv, Vv = U(v), V(v)  # (B, N, 3, H): linear maps act on the channel axis only
            a = upd(torch.cat([s, torch.sqrt((Vv**2).sum(2) + 1e-8)], -1))
            avv, asv, ass = a.split(h, dim=-1)
            v = v + avv[:, :, None, :] * Uv
            s = s + asv * (Uv * Vv).sum(2) + ass
            s, v = s * mask[..., None], v * mask[..., None, None]
        return s, mask

    def forward(self, z: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s, mask = self.atoms(z, pos)
        return readout(self.head(s).squeeze(-1), s, mask, self.extensive)


def readout(atomwise: torch.Tensor, feats: torch.Tensor, mask: torch.Tensor, extensive: bool):
    """Prediction = sum (extensive targets, e.g. energy) or mean (intensive, e.g. gap) of atomwise outputs; embedding =
    mean of the final atom features."""
    m = mask.float()
    n = m.sum(1).clamp_min(1.0)
    y = (atomwise * m).sum(1)
    if not extensive:
        y = y / n
    emb = (feats * m[..., None]).sum(1) / n[:, None]
    return y, emb


ENCODERS = {"schnet": SchNet, "painn": PaiNN}


def pad_molecules(zs: list, positions: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad lists of (A_i,) atomic numbers and (A_i, 3) coordinates to (B, N) / (B, N, 3) tensors (0 = no atom)."""
    n = max(len(z) for z in zs)
    Z = torch.zeros(len(zs), n, dtype=torch.long)
    P = torch.zeros(len(zs), n, 3)
    for i, (z, p) in enumerate(zip(zs, positions, strict=True)):
        Z[i, : len(z)] = torch.as_tensor(z)
        P[i, : len(z)] = torch.as_tensor(p, dtype=torch.float32)
    return Z, P
