"""Default 3DCS data made with RDKit, written in the published formats (see `formats.py`), then read by the real reader.

- rotation: relaxed torsion scans. The most central heavy-atom rotatable bond of each drug-like molecule is set in
  15 degree steps (`SetDihedralDeg`) and the molecule is MMFF94-optimised with that torsion constrained, each step
  starting from the previous relaxed geometry.
- chirality: `EnumerateStereoisomers` on molecules with one stereocentre (enantiomer pairs) or two or more
  (diastereomers), several ETKDG conformers per stereoisomer, MMFF-optimised.
- traj: short MMFF94 Langevin molecular dynamics of the ten rMD17 molecules (a stand-in for rMD17's DFT trajectories),
  frames with their MMFF energies in kcal/mol, written both as traj_frames/traj_energies rows and as rMD17 npz.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import formats

ROTATION_SMILES = {
    "ibuprofen": "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "paracetamol": "CC(=O)Nc1ccc(O)cc1", "aspirin": "CC(=O)Oc1ccccc1C(=O)O",
    "biphenyl": "c1ccc(cc1)-c1ccccc1", "phenethanol": "OCCc1ccccc1", "deet": "CCN(CC)C(=O)c1cccc(C)c1",
    "dopamine": "NCCc1ccc(O)c(O)c1", "phenylacetic_acid": "O=C(O)Cc1ccccc1", "diphenyl_ether": "c1ccc(Oc2ccccc2)cc1",
    "benzanilide": "O=C(Nc1ccccc1)c1ccccc1", "benzocaine": "CCOC(=O)c1ccc(N)cc1", "anisole_ethyl": "CCc1ccc(OC)cc1",
    "methoxyphenethylamine": "COc1ccc(CCN)cc1", "propiophenone": "CCC(=O)c1ccccc1", "butylbenzene": "CCCCc1ccccc1",
    "benzyl_acetate": "CC(=O)OCc1ccccc1", "thioanisole_ethyl": "CCSc1ccccc1", "phenoxyethanol": "OCCOc1ccccc1",
    "acetanilide_methyl": "CC(=O)N(C)c1ccccc1", "styrene_oxide_ring": "c1ccc(cc1)CC1CO1",
}
CHIRALITY_SMILES = {
    "amphetamine": "CC(N)Cc1ccccc1", "phenylethanol": "CC(O)c1ccccc1", "ibuprofen": "CC(C)Cc1ccc(cc1)C(C)C(=O)O",
    "nicotine": "CN1CCCC1c1cccnc1", "phenylalanine": "NC(Cc1ccccc1)C(=O)O", "lactic_acid": "CC(O)C(=O)O",
    "norephedrine": "CC(N)C(O)c1ccccc1", "ephedrine": "CNC(C)C(O)c1ccccc1", "butanediol": "CC(O)C(C)O",
    "tartaric_acid": "OC(=O)C(O)C(O)C(=O)O", "menthol": "CC(C)C1CCC(C)CC1O", "isoleucine": "CCC(C)C(N)C(=O)O",
}
# the ten rMD17 molecules
TRAJ_SMILES = {
    "aspirin": "CC(=O)Oc1ccccc1C(=O)O", "azobenzene": "c1ccc(cc1)/N=N/c1ccccc1", "benzene": "c1ccccc1",
    "ethanol": "CCO", "malonaldehyde": "O=CCC=O", "naphthalene": "c1ccc2ccccc2c1",
    "paracetamol": "CC(=O)Nc1ccc(O)cc1", "salicylic": "OC(=O)c1ccccc1O", "toluene": "Cc1ccccc1",
    "uracil": "O=c1cc[nH]c(=O)[nH]1",
}

KCAL_PER_AMU_A2_FS2 = 1.0 / 4.184e-4  # 1 amu A^2 / fs^2 = 2390.06 kcal/mol
KB = 0.0019872041  # kcal/mol/K


def _mmff(mol):
    from rdkit.Chem import AllChem

    return AllChem.MMFFGetMoleculeProperties(mol)


def embed(smiles: str, seed: int, n_conf: int = 1):
    """Hydrogen-complete molecule with `n_conf` ETKDG conformers, each MMFF94-optimised."""
    from rdkit import Chem
    from rdkit.Chem import AllChem

    mol = Chem.AddHs(Chem.MolFromSmiles(smiles))
    params = AllChem.ETKDGv3()
    params.randomSeed = 1009 + seed  # RDKit's seed 0 gives identical conformers from EmbedMultipleConfs
    cids = list(AllChem.EmbedMultipleConfs(mol, numConfs=n_conf, params=params))
    if not cids:
        raise RuntimeError(f"ETKDG could not embed {smiles}")
    AllChem.MMFFOptimizeMoleculeConfs(mol, maxIters=500)
    return mol


def central_torsion(mol) -> tuple[int, int, int, int] | None:
    """Heavy-atom dihedral (a, b, c, d) about the rotatable bond b-c that splits the heavy atoms most evenly."""
    from rdkit import Chem

    patt = Chem.MolFromSmarts("[!$([NH])&!$([NH2])&!$(C(=O)[OH])&!D1&!$(*#*)]-&!@[!D1&!$(*#*)]")
    heavy = Chem.RemoveHs(mol)
    best, best_split = None, -1
    for b, c in heavy.GetSubstructMatches(patt):
        em = Chem.RWMol(heavy)
        em.RemoveBond(b, c)
        frags = Chem.GetMolFrags(em.GetMol(), sanitizeFrags=False)
        side = next(len(f) for f in frags if b in f)
        split = min(side, heavy.GetNumAtoms() - side)
        a = [n.GetIdx() for n in heavy.GetAtomWithIdx(b).GetNeighbors() if n.GetIdx() != c]
        d = [n.GetIdx() for n in heavy.GetAtomWithIdx(c).GetNeighbors() if n.GetIdx() != b]
        if a and d and split > best_split:
            best, best_split = (a[0], b, c, d[0]), split
    return best  # heavy-atom indices equal the indices in the H-complete molecule (AddHs appends hydrogens)


def torsion_scan(smiles: str, seed: int, step_deg: float = 15.0):
    """Relaxed scan: list of (Mol with one conformer, torsion in degrees, MMFF energy)."""
    from rdkit import Chem
    from rdkit.Chem import AllChem, rdMolTransforms

    mol = embed(smiles, seed)
    tors = central_torsion(mol)
    if tors is None:
        return []
    props = _mmff(mol)
    out = []
    for angle in np.arange(-180.0, 180.0, step_deg):
        conf = mol.GetConformer()
        rdMolTransforms.SetDihedralDeg(conf, *tors, float(angle))
        ff = AllChem.MMFFGetMoleculeForceField(mol, props)
        ff.MMFFAddTorsionConstraint(*tors, False, float(angle), float(angle), 1e4)
        ff.Minimize(maxIts=500)
        frame = Chem.Mol(mol)
        phi = rdMolTransforms.GetDihedralDeg(frame.GetConformer(), *tors)
        energy = AllChem.MMFFGetMoleculeForceField(frame, _mmff(frame)).CalcEnergy()
        out.append((frame, float(phi), float(energy)))
    return out


def stereoisomers(smiles: str, seed: int, n_conf: int, max_isomers: int):
    """[(CIP label string, Mol with n_conf conformers)] for up to `max_isomers` stereoisomers."""
    from rdkit import Chem
    from rdkit.Chem.EnumerateStereoisomers import EnumerateStereoisomers, StereoEnumerationOptions

    opts = StereoEnumerationOptions(onlyUnassigned=True, unique=True, maxIsomers=max_isomers, rand=None)
    out = []
    for k, iso in enumerate(EnumerateStereoisomers(Chem.MolFromSmiles(smiles), options=opts)):
        smi = Chem.MolToSmiles(iso)
        mol = embed(smi, seed + k, n_conf)
        Chem.AssignStereochemistryFrom3D(mol)
        cip = "_".join(f"{i}{lab}" for i, lab in Chem.FindMolChiralCenters(mol, includeUnassigned=True,
                                                                           useLegacyImplementation=False))
        out.append((cip or smi, mol))
    return out


def langevin_md(smiles: str, seed: int, n_frames: int, stride: int, temperature: float = 500.0,
                dt_fs: float = 0.5, friction_per_fs: float = 0.01):
    """MMFF94 Langevin dynamics (BAOAB splitting): frames (F, A, 3) in Angstrom, energies and forces (kcal/mol[/A]).

    The time loop is inherent to integration; each step is one vectorised force call.
    """
    from rdkit.Chem import AllChem

    mol = embed(smiles, seed)
    props = _mmff(mol)
    rng = np.random.default_rng(seed)
    m = np.array([a.GetMass() for a in mol.GetAtoms()])[:, None]  # amu
    x = np.array(mol.GetConformer().GetPositions())
    kT = KB * temperature
    v = rng.normal(size=x.shape) * np.sqrt(kT / m / KCAL_PER_AMU_A2_FS2)  # A/fs

    def field():  # a reused RDKit force field drifts from the true gradient (energy not conserved): build one per call
        return AllChem.MMFFGetMoleculeForceField(mol, props)

    def force(pos):
        return -np.asarray(field().CalcGrad(pos.ravel().tolist())).reshape(-1, 3)

    f = force(x)
    c1 = np.exp(-friction_per_fs * dt_fs)
    c2 = np.sqrt((1 - c1 * c1) * kT / m / KCAL_PER_AMU_A2_FS2)
    frames, energies, forces = [], [], []
    for step in range(n_frames * stride):
        v += 0.5 * dt_fs * f / m / KCAL_PER_AMU_A2_FS2  # B
        x += 0.5 * dt_fs * v  # A
        v = c1 * v + c2 * rng.normal(size=x.shape)  # O
        x += 0.5 * dt_fs * v  # A
        f = force(x)
        v += 0.5 * dt_fs * f / m / KCAL_PER_AMU_A2_FS2  # B
        if (step + 1) % stride == 0:
            frames.append(x.copy())
            energies.append(field().CalcEnergy(x.ravel().tolist()))
            forces.append(f.copy())
    return mol, np.stack(frames), np.asarray(energies, dtype=np.float64), np.stack(forces)


def _with_coords(mol, xyz):
    from rdkit import Chem
    from rdkit.Geometry import Point3D

    m = Chem.Mol(mol, confId=0) if mol.GetNumConformers() == 1 else Chem.Mol(mol)
    conf = m.GetConformer()
    for i, p in enumerate(xyz):
        conf.SetAtomPosition(i, Point3D(*map(float, p)))
    return m


def generate(out_dir: Path, n_rotation: int = 16, n_chirality: int = 12, n_traj: int = 10, conformers_per_isomer: int = 4,
             max_isomers: int = 4, traj_frames: int = 150, traj_stride: int = 8, seed: int = 0) -> None:
    """Write the three datasets (parquet rows + rMD17 npz) into `out_dir`."""
    from rdkit import Chem

    out_dir = Path(out_dir)
    sch = formats.schemas()
    rows = []
    for name, smi in list(ROTATION_SMILES.items())[:n_rotation]:
        scan = torsion_scan(smi, seed)
        if len(scan) < 2:
            continue
        rows.append({"key": name, "shard": 0, "n_conformers": len(scan), "offset": sum(r["n_conformers"] for r in rows),
                     "mol_blocks": [Chem.MolToMolBlock(m) for m, _, _ in scan],
                     "torsion_deg": [phi for _, phi, _ in scan]})
    formats.write_parquet(rows, out_dir / "rotation" / "train-00000-of-00001.parquet", sch["rotation"])

    rows, offset = [], 0
    for name, smi in list(CHIRALITY_SMILES.items())[:n_chirality]:
        for en_id, (cip, mol) in enumerate(stereoisomers(smi, seed, conformers_per_isomer, max_isomers)):
            blocks = [Chem.MolToMolBlock(mol, confId=c.GetId()) for c in mol.GetConformers()]
            rows.append({"key": f"{name}::en{en_id}_{cip}", "mol_id": name, "en_id": en_id,
                         "n_conformers": len(blocks), "offset": offset, "mol_blocks": blocks})
            offset += len(blocks)
    formats.write_parquet(rows, out_dir / "chirality" / "train-00000-of-00001.parquet", sch["chirality"])

    frames_rows, energy_rows = [], []
    for name, smi in list(TRAJ_SMILES.items())[:n_traj]:
        mol, X, E, F = langevin_md(smi, seed, traj_frames, traj_stride)
        z = np.array([a.GetAtomicNum() for a in mol.GetAtoms()])
        formats.write_rmd17_npz(out_dir / "rmd17" / "npz_data" / f"rmd17_{name}.npz", X, E, F, z)
        frames_rows += [{"mol_type": name, "frame_idx": i, "mol_block": Chem.MolToMolBlock(_with_coords(mol, x))}
                        for i, x in enumerate(X)]
        energy_rows.append({"mol_type": name, "n_frames": len(E), "energies": E.tolist()})
    formats.write_parquet(frames_rows, out_dir / "traj_frames" / "train-00000-of-00001.parquet", sch["traj_frames"])
    formats.write_parquet(energy_rows, out_dir / "traj_energies" / "train-00000-of-00001.parquet", sch["traj_energies"])
