"""Hand-made conformer representations: Morgan bits (2-D), interatomic-distance histograms (3-D, reflection-invariant)
and the same with signed dihedral / signed-volume features (3-D, chirality-aware).

All conformers of one molecule share a topology, so each is computed for the whole stack of conformers at once:
coordinates (C, A, 3) -> distances (C, A, A) -> Gaussian-binned histograms per element pair (no loop over atoms/pairs).
"""
from __future__ import annotations

import numpy as np

ELEMENTS = (1, 6, 7, 8, 9, 16, 17)  # H C N O F S Cl; anything else shares the last "other" slot


def coords(mols) -> np.ndarray:
    """(C, A, 3) coordinates of conformers of one molecule (first conformer of each Mol)."""
    return np.stack([m.GetConformer().GetPositions() for m in mols])


def element_slot(mol) -> np.ndarray:
    z = np.array([a.GetAtomicNum() for a in mol.GetAtoms()])
    slot = np.full(len(z), len(ELEMENTS))
    for k, e in enumerate(ELEMENTS):
        slot[z == e] = k
    return slot


def gaussian_bins(x: np.ndarray, centres: np.ndarray, width: float) -> np.ndarray:
    """Soft histogram weights exp(-(x - c)^2 / 2 w^2), shape x.shape + (len(centres),)."""
    return np.exp(-((x[..., None] - centres) ** 2) / (2 * width * width))


def morgan_bits(mols, radius: int = 2, n_bits: int = 2048, chirality: bool = False) -> np.ndarray:
    """(C, n_bits) bool Morgan fingerprints; stereo tags are perceived from each conformer's 3-D coordinates."""
    from rdkit import Chem
    from rdkit.Chem import rdFingerprintGenerator

    gen = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits, includeChirality=chirality)
    out = np.zeros((len(mols), n_bits), dtype=bool)
    for i, m in enumerate(mols):  # RDKit fingerprints are per molecule
        m = Chem.Mol(m)
        Chem.AssignStereochemistryFrom3D(m)
        out[i] = gen.GetFingerprintAsNumPy(m).astype(bool)
    return out


def distance_histogram(mols, n_bins: int = 24, r_max: float = 8.0, heavy_only: bool = False) -> np.ndarray:
    """(C, P * n_bins): per element-pair Gaussian histogram of all interatomic distances (invariant to rotation,
    translation and reflection, hence blind to handedness)."""
    mol = mols[0]
    X = coords(mols)
    slot = element_slot(mol)
    keep = slot != 0 if heavy_only else np.ones(len(slot), bool)
    X, slot = X[:, keep], slot[keep]
    iu = np.triu_indices(len(slot), 1)
    d = np.linalg.norm(X[:, iu[0]] - X[:, iu[1]], axis=-1)  # (C, pairs)
    a, b = np.minimum(slot[iu[0]], slot[iu[1]]), np.maximum(slot[iu[0]], slot[iu[1]])
    n_el = len(ELEMENTS) + 1
    pair_type = a * n_el + b  # (pairs,)
    onehot = np.eye(n_el * n_el)[pair_type]  # (pairs, P)
    centres = np.linspace(0.8, r_max, n_bins)
    h = np.einsum("cpb,pt->ctb", gaussian_bins(d, centres, (r_max - 0.8) / n_bins), onehot)
    return h.reshape(len(mols), -1)


def dihedral_quads(mol) -> np.ndarray:
    """(Q, 4) atom indices of all bonded paths a-b-c-d over heavy atoms (each path once)."""
    quads = []
    for bond in mol.GetBonds():
        b, c = bond.GetBeginAtom(), bond.GetEndAtom()
        if b.GetAtomicNum() == 1 or c.GetAtomicNum() == 1:
            continue
        for a in b.GetNeighbors():
            for d in c.GetNeighbors():
                ids = (a.GetIdx(), b.GetIdx(), c.GetIdx(), d.GetIdx())
                if a.GetAtomicNum() > 1 and d.GetAtomicNum() > 1 and len(set(ids)) == 4:
                    quads.append(ids)
    return np.array(quads, dtype=int).reshape(-1, 4)


def signed_dihedrals(X: np.ndarray, quads: np.ndarray) -> np.ndarray:
    """Signed dihedral angles (C, Q) in radians (IUPAC sign: a mirror image flips every sign)."""
    p0, p1, p2, p3 = (X[:, quads[:, k]] for k in range(4))
    b0, b1, b2 = p0 - p1, p2 - p1, p3 - p2
    b1n = b1 / np.linalg.norm(b1, axis=-1, keepdims=True)
    v = b0 - (b0 * b1n).sum(-1, keepdims=True) * b1n
    w = b2 - (b2 * b1n).sum(-1, keepdims=True) * b1n
    x = (v * w).sum(-1)
    y = (np.cross(b1n, v) * w).sum(-1)
    return np.arctan2(y, x)


def chiral_volumes(mol, X: np.ndarray) -> np.ndarray:
    """(C, S) signed volumes `(n1 - c) . ((n2 - c) x (n3 - c))` at atoms whose three top-ranked neighbours have distinct
    graph ranks (stereo-free canonical ranks, so enantiomers get opposite signs)."""
    from rdkit import Chem

    rank = np.array(Chem.CanonicalRankAtoms(mol, breakTies=False, includeChirality=False))
    centres = []
    for atom in mol.GetAtoms():
        nb = [n.GetIdx() for n in atom.GetNeighbors()]
        if len(nb) >= 3:
            order = sorted(nb, key=lambda i: -rank[i])[:3]
            if len({rank[i] for i in order}) == 3:
                centres.append((atom.GetIdx(), *order))
    if not centres:
        return np.zeros((X.shape[0], 0))
    c = np.array(centres)
    v1, v2, v3 = (X[:, c[:, k]] - X[:, c[:, 0]] for k in (1, 2, 3))
    return (v1 * np.cross(v2, v3)).sum(-1)


def chiral_histogram(mols, n_bins: int = 24, r_max: float = 8.0, n_angle_bins: int = 24) -> np.ndarray:
    """Distance histogram + histogram of signed heavy-atom dihedrals + binned signed chiral volumes (chirality-aware)."""
    mol = mols[0]
    X = coords(mols)
    parts = [distance_histogram(mols, n_bins, r_max)]
    quads = dihedral_quads(mol)
    centres = np.linspace(-np.pi, np.pi, n_angle_bins, endpoint=False)
    if len(quads):
        phi = signed_dihedrals(X, quads)  # (C, Q); circular Gaussian bins
        dphi = np.angle(np.exp(1j * (phi[..., None] - centres)))
        parts.append(np.exp(-dphi**2 / (2 * (2 * np.pi / n_angle_bins) ** 2)).sum(1))
    else:
        parts.append(np.zeros((len(mols), n_angle_bins)))
    vol = chiral_volumes(mol, X)
    vcentres = np.linspace(-3.0, 3.0, 12)
    parts.append(gaussian_bins(vol, vcentres, 0.5).sum(1) if vol.shape[1] else np.zeros((len(mols), 12)))
    return np.concatenate(parts, axis=1)


def topology_key(mol) -> tuple:
    return (tuple(a.GetAtomicNum() for a in mol.GetAtoms()),
            tuple(sorted((b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in mol.GetBonds())))


def per_topology(fn, mols, **kwargs) -> np.ndarray:
    """Apply a stacked-conformer feature `fn` to each set of mols sharing one atom order (stereoisomers embedded from
    their own SMILES may number atoms differently), and put the rows back in input order."""
    keys = [topology_key(m) for m in mols]
    out = None
    for key in dict.fromkeys(keys):
        idx = [i for i, k in enumerate(keys) if k == key]
        feats = fn([mols[i] for i in idx], **kwargs)
        if out is None:
            out = np.zeros((len(mols), feats.shape[1]), dtype=feats.dtype)
        out[idx] = feats
    return out
