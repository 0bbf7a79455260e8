"""Generated default in the published formats, read back by the real readers; malformed files give one clear error."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError
from lit_iclr.three_dcs import formats


def rewrite(path, **edits):
    """The rows of one parquet file after applying each edit function (`{name: fn(rows)}`) in place."""
    rows = pq.read_table(path).to_pylist()
    for fn in edits.values():
        fn(rows)
    return rows


def test_rotation_rows_are_relaxed_15_degree_scans(tiny_3dcs):
    from rdkit.Chem import AllChem

    groups = formats.read_rotation(tiny_3dcs)
    assert len(groups) == 2 and all(len(g.mols) == 24 for g in groups)
    g = groups[0]
    steps = np.diff(np.sort(g.torsion_deg))
    assert np.allclose(steps, 15.0, atol=1.0)  # the constraint held during the MMFF relaxation
    # relaxed: the MMFF gradient of a scan point is small except along the constrained torsion (checked by norm)
    mol = g.mols[3]
    ff = AllChem.MMFFGetMoleculeForceField(mol, AllChem.MMFFGetMoleculeProperties(mol))
    assert np.linalg.norm(ff.CalcGrad()) < 50.0
    assert g.mols[0].GetNumAtoms() > g.mols[0].GetNumHeavyAtoms()  # hydrogens kept in the MolBlocks


def test_chirality_rows_hold_stereoisomers_and_labels(tiny_3dcs):
    from rdkit import Chem

    groups = formats.read_chirality(tiny_3dcs)
    g = groups[0]  # amphetamine: one stereocentre, two enantiomers
    assert sorted(set(g.labels)) == [0, 1] and g.extra["n_centres"] == 1
    cips = set()
    for m, lab in zip(g.mols, g.labels, strict=True):
        Chem.AssignStereochemistryFrom3D(m)
        cips.add((lab, Chem.FindMolChiralCenters(m)[0][1]))
    assert len(cips) == 2  # each label has one CIP code, and the two differ


def test_traj_energies_are_the_mmff_energies_of_the_frames(tiny_3dcs):
    from rdkit.Chem import AllChem

    (g,) = formats.read_traj(tiny_3dcs)
    assert len(g.mols) == len(g.energies) == 30 and g.energies.dtype == np.float64
    m = g.mols[7]
    e = AllChem.MMFFGetMoleculeForceField(m, AllChem.MMFFGetMoleculeProperties(m)).CalcEnergy()
    assert e == pytest.approx(g.energies[7], abs=1e-2)  # MolBlocks keep 4 decimals of the coordinates
    npz = formats.read_rmd17_npz(tiny_3dcs / "rmd17" / "npz_data" / "rmd17_aspirin.npz")
    assert np.allclose(npz["energies"], g.energies) and npz["coords"].shape == (30, m.GetNumAtoms(), 3)
    assert np.allclose(npz["coords"][7], m.GetConformer().GetPositions(), atol=1e-3)


def test_wrong_conformer_count_and_bad_molblock(tiny_3dcs, tmp_path):
    path = next((tiny_3dcs / "rotation").glob("*.parquet"))
    sch = formats.schemas()["rotation"]

    def bump(rows):
        rows[0]["n_conformers"] += 1

    formats.write_parquet(rewrite(path, n=bump), tmp_path / "a" / "rotation" / "x.parquet", sch)
    with pytest.raises(DatasetFormatError, match="n_conformers"):
        formats.read_rotation(tmp_path / "a")

    def garble(rows):
        rows[1]["mol_blocks"][2] = "not a molblock"

    formats.write_parquet(rewrite(path, b=garble), tmp_path / "b" / "rotation" / "x.parquet", sch)
    with pytest.raises(DatasetFormatError, match="unparsable MolBlock"):
        formats.read_rotation(tmp_path / "b")

    def shift(rows):
        rows[1]["offset"] += 3

    formats.write_parquet(rewrite(path, c=shift), tmp_path / "c" / "rotation" / "x.parquet", sch)
    with pytest.raises(DatasetFormatError, match="running sum"):
        formats.read_rotation(tmp_path / "c")
    with pytest.raises(DatasetNotFoundError):
        formats.read_rotation(tmp_path / "missing")
    (tmp_path / "d" / "rotation").mkdir(parents=True)
    (tmp_path / "d" / "rotation" / "x.parquet").write_bytes(b"PAR1 broken")
    with pytest.raises(DatasetFormatError, match="parquet"):
        formats.read_rotation(tmp_path / "d")


def test_embedding_rows_must_match_the_dataset(tmp_path):
    formats.write_embeddings(tmp_path / "e.npz", np.zeros((5, 3)))
    assert formats.read_embeddings(tmp_path / "e.npz", 5).shape == (5, 3)
    with pytest.raises(DatasetFormatError, match=r"\(5, 3\) for a dataset of 6 conformers"):
        formats.read_embeddings(tmp_path / "e.npz", 6)
    np.savez(tmp_path / "nan.npz", embeddings=np.full((2, 2), np.nan))
    with pytest.raises(DatasetFormatError, match="non-finite"):
        formats.read_embeddings(tmp_path / "nan.npz", 2)


def test_rmd17_npz_checks(tmp_path):
    np.savez(tmp_path / "bad.npz", coords=np.zeros((3, 4, 3)), energies=np.zeros(2), nuclear_charges=np.ones(4))
    with pytest.raises(DatasetFormatError, match="do not match"):
        formats.read_rmd17_npz(tmp_path / "bad.npz")
    np.savez(tmp_path / "nokey.npz", coords=np.zeros((3, 4, 3)))
    with pytest.raises(DatasetFormatError, match="energies"):
        formats.read_rmd17_npz(tmp_path / "nokey.npz")


def test_traj_frame_energy_mismatch(tiny_3dcs, tmp_path):
    import shutil

    root = tmp_path / "t"
    shutil.copytree(tiny_3dcs / "traj_frames", root / "traj_frames")
    path = next((tiny_3dcs / "traj_energies").glob("*.parquet"))

    def drop(rows):
        rows[0]["energies"] = rows[0]["energies"][:-1]

    formats.write_parquet(rewrite(path, e=drop), root / "traj_energies" / "x.parquet", formats.schemas()["traj_energies"])
    with pytest.raises(DatasetFormatError, match="energies"):
        formats.read_traj(root)
