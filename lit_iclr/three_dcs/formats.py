"""Readers and writers of the published 3DCS formats.

- Dataset rows (`EscheWang/3dcs` configs, one parquet folder each): `rotation` (key, shard, n_conformers, per-shard
  offset, mol_blocks, torsion_deg), `chirality` (key `<mol_id>::en<k>_<CIP>`, mol_id, en_id, n_conformers, offset,
  mol_blocks), `traj_frames` (mol_type, frame_idx, mol_block) and `traj_energies` (mol_type, n_frames, float64
  energies in kcal/mol).
- rMD17 (figshare 12672038): `rmd17/npz_data/rmd17_<molecule>.npz` with `nuclear_charges` (A,), `coords` (F, A, 3)
  in Angstrom, `energies` (F,) kcal/mol, `forces` (F, A, 3) kcal/mol/Angstrom, `old_indices` / `old_energies` /
  `old_forces` (the MD17 frames they recompute); `rmd17/splits/index_{train,test}_0<k>.csv`, one frame index per line
  (0-based rows of the npz). The frames are a subsample, not in simulation-time order: the energy axis is scored with
  `time_ordered=False` on them.
- Embeddings: one npz per dataset, array `embeddings` with one row per conformer in dataset row order (bool arrays are
  bit fingerprints, scored with the Tanimoto distance).

Every malformed input raises `DatasetFormatError(path, problem, fix)`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError

CONFIGS = ("rotation", "chirality", "traj_frames", "traj_energies")


@dataclass
class Group:
    """Conformers scored together: one rotation molecule, one chirality parent, or one trajectory."""

    key: str
    mols: list  # RDKit Mol per conformer (hydrogens kept)
    rows: slice  # rows of this group in the dataset's embedding array
    torsion_deg: np.ndarray | None = None
    labels: np.ndarray | None = None  # stereoisomer id per conformer
    energies: np.ndarray | None = None  # float64 kcal/mol per frame
    extra: dict = field(default_factory=dict)


def parquet_files(root: Path, config: str, arg: str = "benchmark_root") -> list[Path]:
    """The parquet files of one config; `arg` is the setting that names the folder (in the fix of the error)."""
    files = sorted((Path(root) / config).glob("*.parquet"))
    if not files:
        raise DatasetNotFoundError(Path(root) / config, f"no parquet files of the 3DCS `{config}` config",
                                   f"point `{arg}` at a folder holding {config}/*.parquet (EscheWang/3dcs layout) or "
                                   "set it to null for the generated default")
    return files


def present_configs(root: Path) -> set[str]:
    """The configs of a (possibly partial) 3DCS download that have parquet files in `root`."""
    return {c for c in CONFIGS if any((Path(root) / c).glob("*.parquet"))}


def write_parquet(rows: list[dict], path: Path, schema) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def schemas() -> dict:
    import pyarrow as pa

    s, i32, i64 = pa.string(), pa.int32(), pa.int64()
    return {
        "rotation": pa.schema([("key", s), ("shard", i32), ("n_conformers", i32), ("offset", i64),
                               ("mol_blocks", pa.list_(s)), ("torsion_deg", pa.list_(pa.float32()))]),
        "chirality": pa.schema([("key", s), ("mol_id", s), ("en_id", i32), ("n_conformers", i32), ("offset", i64),
                                ("mol_blocks", pa.list_(s))]),
        "traj_frames": pa.schema([("mol_type", s), ("frame_idx", i32), ("mol_block", s)]),
        "traj_energies": pa.schema([("mol_type", s), ("n_frames", i32), ("energies", pa.list_(pa.float64()))]),
    }


def read_rows(root: Path, config: str, columns: list[str], arg: str = "benchmark_root") -> tuple[list[dict], Path]:
    import pyarrow.parquet as pq

    rows, path = [], None
    for path in parquet_files(root, config, arg):
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for a damaged file
            raise DatasetFormatError(path, f"not a readable parquet file ({type(e).__name__}: {e})",
                                     "re-download or regenerate the file") from None
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise DatasetFormatError(path, f"missing columns {missing} of the `{config}` config",
                                     f"write rows with the columns {columns}")
        rows.extend(table.select(columns).to_pylist())
    return rows, path


def parse_block(block: str, path: Path, where: str):
    """RDKit Mol (hydrogens kept, sanitised) from a MolBlock with 3-D coordinates."""
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromMolBlock(block or "", removeHs=False, sanitize=True)
    if mol is None or mol.GetNumConformers() == 0:
        raise DatasetFormatError(path, f"unparsable MolBlock in {where}",
                                 "store RDKit `Chem.MolToMolBlock` strings with 3-D coordinates")
    return mol


def _check_counts(path: Path, key: str, n_conf, blocks, offset, expected_offset) -> None:
    if n_conf != len(blocks):
        raise DatasetFormatError(path, f"row {key!r}: n_conformers={n_conf} but {len(blocks)} MolBlocks",
                                 "rewrite the row so that n_conformers equals the number of MolBlocks")
    if offset != expected_offset:
        raise DatasetFormatError(path, f"row {key!r}: offset {offset} is not the running sum of n_conformers "
                                       f"({expected_offset})", "recompute offsets as the cumulative conformer count")


def read_rotation(root: Path, arg: str = "benchmark_root") -> list[Group]:
    """Torsion-scan molecules; `offset` restarts at 0 in every shard (embedding rows follow the dataset row order)."""
    rows, path = read_rows(root, "rotation", ["key", "shard", "n_conformers", "offset", "mol_blocks", "torsion_deg"], arg)
    groups, start, shard_offsets = [], 0, {}
    for r in rows:
        n = int(r["n_conformers"])
        _check_counts(path, r["key"], n, r["mol_blocks"], int(r["offset"]), shard_offsets.get(r["shard"], 0))
        if len(r["torsion_deg"]) != n:
            raise DatasetFormatError(path, f"row {r['key']!r}: {len(r['torsion_deg'])} torsion angles for {n} conformers",
                                     "store one torsion angle (degrees) per conformer")
        shard_offsets[r["shard"]] = shard_offsets.get(r["shard"], 0) + n
        mols = [parse_block(b, path, f"row {r['key']!r}") for b in r["mol_blocks"]]
        groups.append(Group(r["key"], mols, slice(start, start + n), torsion_deg=np.asarray(r["torsion_deg"], float)))
        start += n
    return groups


def read_chirality(root: Path, arg: str = "benchmark_root") -> list[Group]:
    """Stereoisomer rows pooled per parent molecule (`mol_id`); labels are `en_id` per conformer."""
    rows, path = read_rows(root, "chirality", ["key", "mol_id", "en_id", "n_conformers", "offset", "mol_blocks"], arg)
    by_mol: dict[str, Group] = {}
    start = 0
    keys = set()
    for r in rows:
        n = int(r["n_conformers"])
        _check_counts(path, r["key"], n, r["mol_blocks"], int(r["offset"]), start)
        if r["key"] in keys:
            raise DatasetFormatError(path, f"duplicate key {r['key']!r}", "give every stereoisomer row a unique key")
        keys.add(r["key"])
        mols = [parse_block(b, path, f"row {r['key']!r}") for b in r["mol_blocks"]]
        g = by_mol.get(r["mol_id"])
        if g is None:
            g = by_mol[r["mol_id"]] = Group(r["mol_id"], [], slice(start, start), labels=np.zeros(0, int))
        elif g.rows.stop != start:
            raise DatasetFormatError(path, f"rows of molecule {r['mol_id']!r} are not contiguous",
                                     "sort the chirality rows by mol_id")
        g.mols.extend(mols)
        cip = r["key"].split("::", 1)[-1].partition("_")[2]  # `<mol_id>::en<k>_<CIP labels>`
        g.extra["n_centres"] = max(g.extra.get("n_centres", 0), sum(ch in "RS" for ch in cip))
        g.labels = np.concatenate([g.labels, np.full(n, int(r["en_id"]))])
        g.rows = slice(g.rows.start, start + n)
        start += n
    return list(by_mol.values())


def read_traj(root: Path, arg: str = "benchmark_root") -> list[Group]:
    """Trajectories: frames (MolBlocks, by `frame_idx`) and float64 energies per `mol_type`."""
    frames, fpath = read_rows(root, "traj_frames", ["mol_type", "frame_idx", "mol_block"], arg)
    energies, epath = read_rows(root, "traj_energies", ["mol_type", "n_frames", "energies"], arg)
    by_type: dict[str, list] = {}
    for r in frames:
        by_type.setdefault(r["mol_type"], []).append(r)
    groups, start = [], 0
    for e in energies:
        name = e["mol_type"]
        fr = by_type.get(name, [])
        E = np.asarray(e["energies"], dtype=np.float64)
        if len(E) != int(e["n_frames"]) or len(fr) != len(E):
            raise DatasetFormatError(epath, f"{name}: n_frames={e['n_frames']}, {len(E)} energies, {len(fr)} frames",
                                     "write one energy per frame and one traj_frames row per frame")
        if not np.isfinite(E).all():
            raise DatasetFormatError(epath, f"{name}: non-finite energies", "remove or recompute those frames")
        idx = [int(r["frame_idx"]) for r in fr]
        if idx != list(range(len(fr))):
            raise DatasetFormatError(fpath, f"{name}: frame_idx is not 0..{len(fr) - 1} in row order",
                                     "write the frames of each trajectory in frame order")
        mols = [parse_block(r["mol_block"], fpath, f"{name} frame {i}") for i, r in enumerate(fr)]
        groups.append(Group(name, mols, slice(start, start + len(fr)), energies=E))
        start += len(fr)
    return groups


def write_rmd17_npz(path: Path, coords: np.ndarray, energies: np.ndarray, forces: np.ndarray, z: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, coords=coords.astype(np.float64), energies=energies.astype(np.float64),
             forces=forces.astype(np.float64), nuclear_charges=z.astype(np.int64),
             old_indices=np.arange(len(energies)))


def read_rmd17_npz(path: Path) -> dict[str, np.ndarray]:
    """rMD17 npz -> dict with coords (F, A, 3), energies (F,), nuclear_charges (A,), checked for shape and finiteness."""
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "no rMD17 npz file here", "point at rmd17_<molecule>.npz of rMD17")
    try:
        with np.load(path, allow_pickle=False) as f:
            data = {k: f[k] for k in f.files}
    except Exception as e:
        raise DatasetFormatError(path, f"not a readable npz ({type(e).__name__})", "re-download the file") from None
    for k in ("coords", "energies", "nuclear_charges"):
        if k not in data:
            raise DatasetFormatError(path, f"missing array `{k}`", "rMD17 npz files hold coords, energies, nuclear_charges")
    c, e, z = data["coords"], data["energies"], data["nuclear_charges"]
    if c.ndim != 3 or c.shape[2] != 3 or c.shape[0] != len(e) or c.shape[1] != len(z):
        raise DatasetFormatError(path, f"coords {c.shape}, energies {e.shape}, nuclear_charges {z.shape} do not match",
                                 "coords must be (frames, atoms, 3) with one energy per frame and one charge per atom")
    if not (np.isfinite(c).all() and np.isfinite(e).all()):
        raise DatasetFormatError(path, "non-finite coordinates or energies", "remove the broken frames")
    if not np.issubdtype(z.dtype, np.integer) or (z < 1).any() or (z > 118).any():
        raise DatasetFormatError(path, f"nuclear_charges {z.tolist()[:8]} are not atomic numbers",
                                 "store the atomic number (int) of every atom")
    if "forces" in data and data["forces"].shape != c.shape:
        raise DatasetFormatError(path, f"forces {data['forces'].shape} do not match coords {c.shape}",
                                 "store one force vector per atom and frame, or drop `forces`")
    return data


def read_rmd17_split(path: Path, n_frames: int) -> np.ndarray:
    """Frame indices of an rMD17 split file (`splits/index_{train,test}_0<k>.csv`: one 0-based index per line)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(path, "rMD17 split file not found",
                                   "name a split of rmd17/splits/ (e.g. test_01 for index_test_01.csv)")
    try:
        raw = np.loadtxt(path, dtype=np.float64, ndmin=1, delimiter=",", usecols=0)  # "12" or "1.2e+01"
    except ValueError as e:
        raise DatasetFormatError(path, f"not one integer index per line ({e})",
                                 "rMD17 split files hold one frame index per line") from None
    if not np.all(np.isfinite(raw) & (raw == np.round(raw))):
        raise DatasetFormatError(path, "indices that are not integers", "rMD17 split files hold one frame index per line")
    idx = raw.astype(np.int64)
    if idx.size == 0:
        raise DatasetFormatError(path, "no indices", "rMD17 split files hold one frame index per line")
    if idx.min() < 0 or idx.max() >= n_frames:
        raise DatasetFormatError(path, f"indices span {idx.min()}..{idx.max()} but the npz has {n_frames} frames",
                                 "use the split files of the same rMD17 release (0-based rows of the npz)")
    return idx


def rmd17_npz_files(path: Path, molecules: list[str] | None = None) -> list[Path]:
    """`rmd17_<molecule>.npz` files of an rMD17 folder (`rmd17/`, its `npz_data/`) or the one file `path`."""
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    folder = path / "npz_data" if (path / "npz_data").is_dir() else path
    files = {f.stem.removeprefix("rmd17_"): f for f in sorted(folder.glob("rmd17_*.npz"))}
    if molecules:
        missing = [m for m in molecules if m not in files]
        if missing:
            raise DatasetNotFoundError(folder, f"no rmd17_<molecule>.npz for {missing} (found {sorted(files)})",
                                       "name molecules of the rMD17 release (aspirin, azobenzene, benzene, ethanol, "
                                       "malonaldehyde, naphthalene, paracetamol, salicylic, toluene, uracil)")
        return [files[m] for m in molecules]
    if not files:
        raise DatasetNotFoundError(path, "no rmd17_<molecule>.npz here or in npz_data/",
                                   "point `benchmark_rmd17` (evaluate: --rmd17) at the rmd17/ folder of the release")
    return list(files.values())


def frame_mol(z: np.ndarray, xyz: np.ndarray):
    """RDKit Mol of one rMD17 frame: the atoms at their coordinates, bonds inferred from the distances (rMD17 stores no
    bonds; `rdDetermineBonds.DetermineConnectivity`), not sanitised."""
    from rdkit import Chem
    from rdkit.Chem import rdDetermineBonds
    from rdkit.Geometry import Point3D

    m = Chem.RWMol()
    for a in z.tolist():
        m.AddAtom(Chem.Atom(int(a)))
    conf = Chem.Conformer(len(z))
    for i, p in enumerate(xyz):
        conf.SetAtomPosition(i, Point3D(*map(float, p)))
    m.AddConformer(conf, assignId=True)
    mol = m.GetMol()
    try:
        rdDetermineBonds.DetermineConnectivity(mol)
    except Exception:  # noqa: BLE001 - connectivity only helps bond-based fingerprints; coordinates are what is scored
        pass
    mol.UpdatePropertyCache(strict=False)
    return mol


def read_rmd17(path: Path, molecules: list[str] | None = None, split: str | None = None,
               max_frames: int | None = None, start_row: int = 0) -> list[Group]:
    """Energy-axis groups of rMD17: one trajectory per molecule, its frames (in split order when `split`, e.g.
    `test_01` for `splits/index_test_01.csv`, else in file order; the first `max_frames`) and float64 energies."""
    groups, start = [], start_row
    for f in rmd17_npz_files(path, molecules):
        data = read_rmd17_npz(f)
        idx = np.arange(len(data["energies"]))
        if split:
            base = Path(path).expanduser()
            root = base.parent if base.is_file() else base
            root = root.parent if root.name == "npz_data" else root
            idx = read_rmd17_split(root / "splits" / f"index_{split}.csv", len(idx))
        if max_frames:
            idx = idx[:max_frames]
        z = data["nuclear_charges"]
        mols = [frame_mol(z, data["coords"][i]) for i in idx]
        name = f.stem.removeprefix("rmd17_")
        groups.append(Group(name, mols, slice(start, start + len(idx)), energies=data["energies"][idx].astype(np.float64),
                            extra={"time_ordered": False, "frames": idx}))
        start += len(idx)
    return groups


def write_embeddings(path: Path, embeddings: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, embeddings=embeddings)


def read_embeddings(path: Path, n_rows: int, key: str = "embeddings") -> np.ndarray:
    """Embeddings npz in dataset row order; the row count must equal the dataset's conformer count."""
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "embedding file not found", "write np.savez(path, embeddings=Z) in dataset row order")
    with np.load(path, allow_pickle=False) as f:
        if key not in f.files:
            raise DatasetFormatError(path, f"no array `{key}` (has {f.files})", f"save the matrix under the name `{key}`")
        Z = f[key]
    if Z.ndim != 2 or Z.shape[0] != n_rows:
        raise DatasetFormatError(path, f"embeddings of shape {Z.shape} for a dataset of {n_rows} conformers",
                                 "write one row per conformer, in dataset row order")
    if Z.dtype != bool and not np.isfinite(Z).all():
        raise DatasetFormatError(path, "non-finite embedding values", "fix the model outputs (NaN/inf)")
    return Z
