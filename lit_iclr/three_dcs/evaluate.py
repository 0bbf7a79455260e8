"""GCE evaluation: score a representation on the three 3DCS axes and summarise per metric (mean, 95% CI, n).

A representation is either a function `embed(mols) -> (C, dim)` array (bool = bit fingerprint), run here group by
group, or embedding files in dataset row order (`score_embedding_files`, for a model run elsewhere).

    python -m lit_iclr.three_dcs.evaluate --root data/three_dcs-v1 --embeddings my_model/ [--metric-version v2]
    python -m lit_iclr.three_dcs.evaluate --rmd17 rmd17/ --rmd17-split test_01 --rmd17-frames 1000 --embeddings my_model/

reads `my_model/{rotation,chirality,traj}.npz` (array `embeddings`) and prints the GCE table. A partial 3DCS download
(e.g. only `chirality/`) is scored on the configs it holds; `--rmd17` scores the energy axis on rMD17 trajectories
(`traj.npz` rows: the molecules in name order, each molecule's frames in split order) instead of `traj_*`.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lit_iclr.core.errors import LitIclrError

from . import formats
from .chirality import chirality_metrics, chirality_spec
from .distances import mean_ci, representation_distance
from .energy import energy_metrics, energy_spec, window_starts
from .geometry import geometry_metrics, geometry_spec, rmsd_matrix

HEADLINE = {"geometry": ("A1_spearman", "A2_kendall", "G_cka_rbf", "J_isotonic_R2", "H_LIE@k", "torsion_sp", "AS"),
            "chirality": ("ES_AUC", "NN1_acc", "SCI", "Hopkins", "SCI_unsup", "DBI"),
            "energy": ("spearman", "kendall", "cka_rbf", "iso_R2", "EJS", "ROC_AUC", "TS", "KS", "W1")}


@dataclass
class Benchmark:
    """The three datasets of one 3DCS folder, with the reference RMSD matrices computed once and cached."""

    rotation: list
    chirality: list
    traj: list
    rmsd: dict = field(default_factory=dict)

    @classmethod
    def load(cls, root: str | Path | None, rmd17: str | Path | None = None, rmd17_molecules: list[str] | None = None,
             rmd17_split: str | None = None, rmd17_frames: int | None = None, arg: str = "benchmark_root") -> Benchmark:
        """The configs present in `root` (a partial download is scored on what it holds; `traj` needs both
        `traj_frames/` and `traj_energies/`); with `rmd17`, the energy axis reads rMD17 trajectories instead.
        `arg` names the setting that gave `root` (in error fixes)."""
        present = formats.present_configs(root) if root is not None else set()
        if root is not None and not present and rmd17 is None:
            raise formats.DatasetNotFoundError(
                root, "no 3DCS config here (rotation/, chirality/, traj_frames/ + traj_energies/ with *.parquet)",
                f"point `{arg}` at a 3DCS folder (EscheWang/3dcs layout) or set it to null for the generated default")
        traj_parts = present & {"traj_frames", "traj_energies"}
        if len(traj_parts) == 1 and rmd17 is None:
            missing = ({"traj_frames", "traj_energies"} - traj_parts).pop()
            raise formats.DatasetNotFoundError(Path(root) / missing, f"{traj_parts.pop()}/ is here but not {missing}/",
                                               f"download the `{missing}` config too (the energy axis needs both)")
        rotation = formats.read_rotation(Path(root), arg) if "rotation" in present else []
        chirality = formats.read_chirality(Path(root), arg) if "chirality" in present else []
        if rmd17 is not None:
            traj = formats.read_rmd17(Path(rmd17), rmd17_molecules, rmd17_split, rmd17_frames)
        else:
            traj = formats.read_traj(Path(root), arg) if len(traj_parts) == 2 else []
        return cls(rotation, chirality, traj)

    def axes(self) -> tuple[str, ...]:
        """The axes this benchmark has groups for."""
        have = {"geometry": self.rotation, "chirality": self.chirality, "energy": self.traj}
        return tuple(a for a, groups in have.items() if groups)

    def reference(self, group) -> np.ndarray:
        if group.key not in self.rmsd:
            self.rmsd[group.key] = rmsd_matrix(group.mols)
        return self.rmsd[group.key]

    def n_rows(self, axis: str) -> int:
        groups = {"rotation": self.rotation, "chirality": self.chirality, "traj": self.traj}[axis]
        return groups[-1].rows.stop if groups else 0


def _distance(Z: np.ndarray, metric: str) -> np.ndarray:
    return representation_distance(Z, "tanimoto" if Z.dtype == bool else metric)


def score(bench: Benchmark, embed: Callable | None = None, files: dict | None = None, version: str = "paper",
          geometry_distance: str = "cosine", chirality_distance: str = "euclidean", energy_distance: str = "half_cosine",
          window: int = 50, n_windows: int = 4, window_seed: int = 2025, unsup_kmax: int | None = None,
          axes=None) -> dict:
    """Per-group metric rows for each axis, plus timing. Give `embed` (callable on a list of Mols) or `files`
    ({"rotation"|"chirality"|"traj": (n_rows, dim) array in dataset row order}). `axes`: default, every axis the
    benchmark has groups for."""
    axes = bench.axes() if axes is None else axes

    def Z_of(group, axis):
        return np.asarray(embed(group.mols)) if embed is not None else files[axis][group.rows]

    out: dict = {"rows": {}, "seconds": {}, "conformers": {}}
    if "geometry" in axes:
        spec, rows, t, n = geometry_spec(version), [], time.perf_counter(), 0
        for g in bench.rotation:  # one molecule at a time: metrics are within-molecule
            Z = Z_of(g, "rotation")
            rows.append(geometry_metrics(bench.reference(g), _distance(Z, geometry_distance), g.torsion_deg, spec, Z,
                                         cosine=geometry_distance == "cosine" and Z.dtype != bool))
            n += len(g.mols)
        out["rows"]["geometry"], out["seconds"]["geometry"], out["conformers"]["geometry"] = rows, time.perf_counter() - t, n
    if "chirality" in axes:
        spec, rows, t, n = chirality_spec(version, unsup_kmax=unsup_kmax), [], time.perf_counter(), 0
        for g in bench.chirality:
            Z = Z_of(g, "chirality")
            X = None if Z.dtype == bool else Z
            rows.append(chirality_metrics(_distance(Z, chirality_distance), g.labels, X, spec,
                                          cosine=chirality_distance == "cosine"))
            rows[-1]["enantiomers_only"] = len(set(g.labels)) == 2 and g.extra.get("n_centres", 1) == 1
            n += len(g.mols)
        out["rows"]["chirality"], out["seconds"]["chirality"], out["conformers"]["chirality"] = rows, time.perf_counter() - t, n
    if "energy" in axes:
        base, rows, t, n = energy_spec(version), [], time.perf_counter(), 0
        for g in bench.traj:
            Z = Z_of(g, "traj")
            n += len(g.mols)
            spec = dataclasses.replace(base, time_ordered=base.time_ordered and g.extra.get("time_ordered", True))
            # low precision (paper, release): Delta computed and stored as the reference evaluator does
            stored = "stored_half_cosine" if spec.low_precision and energy_distance == "half_cosine" else energy_distance
            for s in window_starts(len(g.energies), n_windows, window, window_seed):
                sl = slice(int(s), int(s) + window)
                rows.append(energy_metrics(g.energies[sl], _distance(Z[sl], stored), spec))
        out["rows"]["energy"], out["seconds"]["energy"], out["conformers"]["energy"] = rows, time.perf_counter() - t, n
    return out


def summarise(result: dict, metrics: dict | None = None) -> dict[str, dict[str, tuple[float, float, int]]]:
    """{axis: {metric: (mean, 95% half-width, n finite)}} over molecules (geometry, chirality) or windows (energy)."""
    metrics = metrics or HEADLINE
    out = {axis: {m: mean_ci([r.get(m, np.nan) for r in rows]) for m in metrics[axis]}
           for axis, rows in result["rows"].items()}
    if "chirality" in result["rows"]:  # enantiomer pairs alone: the case a reflection-invariant feature cannot separate
        rows = [r for r in result["rows"]["chirality"] if r.get("enantiomers_only")]
        out["enantiomers"] = {m: mean_ci([r.get(m, np.nan) for r in rows]) for m in metrics["chirality"]}
    return out


def markdown(summaries: dict[str, dict], axis: str, metrics=None) -> str:
    """One markdown table: a row per representation, `mean ± CI` per metric."""
    metrics = metrics or HEADLINE["chirality" if axis == "enantiomers" else axis]
    lines = ["| representation | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for name, summ in summaries.items():
        cells = []
        for m in metrics:
            mean, ci, n = summ[axis][m]
            cells.append("n/a" if n == 0 else f"{mean:.3f} ± {ci:.3f}" if np.isfinite(ci) else f"{mean:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def score_embedding_files(root: Path | None, folder: Path, version: str = "paper", bench: Benchmark | None = None) -> dict:
    """Score `folder/{rotation,chirality,traj}.npz` (array `embeddings`, dataset row order) on the dataset at `root`
    (or on `bench`), for the axes both the dataset and the folder have."""
    bench = bench if bench is not None else Benchmark.load(root, arg="--root")
    files, axes = {}, []
    for axis, name in (("rotation", "geometry"), ("chirality", "chirality"), ("traj", "energy")):
        path = Path(folder) / f"{axis}.npz"
        if path.exists() and name in bench.axes():
            files[axis] = formats.read_embeddings(path, bench.n_rows(axis))
            axes.append(name)
    if not axes:
        raise formats.DatasetNotFoundError(folder, f"no embeddings here for the axes of the dataset {bench.axes()} "
                                           "(rotation.npz, chirality.npz, traj.npz)",
                                           "save embeddings with np.savez(folder / 'rotation.npz', embeddings=Z)")
    return summarise(score(bench, files=files, version=version, axes=tuple(axes)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Score embedding files (dataset row order) on a 3DCS folder.")
    p.add_argument("--root", help="3DCS folder with rotation/, chirality/, traj_frames/ + traj_energies/ (or some)")
    p.add_argument("--rmd17", help="rMD17 folder (rmd17/, with npz_data/ and splits/) or one rmd17_<molecule>.npz: "
                   "the energy axis on its trajectories")
    p.add_argument("--rmd17-molecules", nargs="*", default=None, help="rMD17 molecules (default: every npz found)")
    p.add_argument("--rmd17-split", default=None, help="split file splits/index_<split>.csv, e.g. test_01")
    p.add_argument("--rmd17-frames", type=int, default=None, help="first N frames per molecule (of the split)")
    p.add_argument("--embeddings", required=True, help="folder with rotation.npz / chirality.npz / traj.npz")
    p.add_argument("--metric-version", default="paper", choices=("paper", "v2", "release"),
                   help="paper: the published tables; v2: the paper text (App. C); release: three_dbench 0.1.0's code")
    a = p.parse_args(argv)
    if a.root is None and a.rmd17 is None:
        p.error("give --root (a 3DCS folder), --rmd17 (an rMD17 folder), or both")
    try:
        bench = Benchmark.load(a.root, a.rmd17, a.rmd17_molecules, a.rmd17_split, a.rmd17_frames, arg="--root")
        summ = score_embedding_files(None, Path(a.embeddings), a.metric_version, bench=bench)
    except LitIclrError as e:  # one message naming the file, the problem and the fix; no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    for axis in summ:
        print(f"\n{axis}\n" + markdown({Path(a.embeddings).name: summ}, axis))
    return 0


if __name__ == "__main__":
    sys.exit(main())
