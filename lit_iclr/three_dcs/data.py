"""DataModule: QM9 molecules (qm9pack CSV) to train a 3-D encoder, and a 3DCS folder to score its representation.

Training batches are padded atom tensors `z` (B, N), `pos` (B, N, 3) with the standardised target `y` (B,). The 3DCS
benchmark (rotation / chirality / traj rows) is read by the real readers and handed to the module, which scores its
embeddings on it during validation.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core import BaseDataModule, DatasetFormatError, ensure_generated
from lit_iclr.core.loader import ResumableDataLoader

from .model import pad_molecules
from .qm9 import TARGETS, read_qm9_csv, target_values, write_subset


class MoleculeSet(Dataset):
    """Padded molecules as dicts of tensors."""

    def __init__(self, z: torch.Tensor, pos: torch.Tensor, y: torch.Tensor):
        self.z, self.pos, self.y = z, pos, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"z": self.z[i], "pos": self.pos[i], "y": self.y[i]}


class QM9Conformers(BaseDataModule):
    default_name = "qm9pack-subset"
    default_version = 1
    model_links = {"extensive": "extensive"}

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 32, num_workers: int = 0,
                 num_molecules: int = 600, subset_seed: int = 0, target: Literal["U0", "gap", "mmff"] = "U0",
                 val_fraction: float = 0.1, split_seed: int = 0, benchmark_root: str | None = None,
                 benchmark_rotation: int = 16, benchmark_chirality: int = 12, benchmark_traj: int = 10,
                 benchmark_traj_frames: int = 150, benchmark_seed: int = 0, benchmark_rmd17: str | None = None,
                 benchmark_rmd17_molecules: list[str] | None = None, benchmark_rmd17_split: str | None = None,
                 benchmark_rmd17_frames: int | None = 1000):
        """
        Args:
            root: A qm9pack-format CSV of QM9 (or a folder of them); null: a seeded sample of the QM9 copy inside the
                installed qm9pack package, written to `data_dir`.
            data_dir: Cache folder for the QM9 sample and the generated 3DCS default.
            batch_size: Molecules per batch.
            num_workers: DataLoader worker processes.
            num_molecules: Size of the default QM9 sample.
            subset_seed: Seed of the default QM9 sample.
            target: Training target: `U0` (internal energy at 0 K minus fitted per-element references, eV; extensive),
                `gap` (HOMO-LUMO gap, eV; intensive), or `mmff` (not QM9 labels: MMFF94 energy of noise-displaced
                RDKit conformers of num_molecules/4 QM9 molecules above their relaxed geometry, eV; extensive).
            val_fraction: Share of molecules held out for validation.
            split_seed: Seed of the train/validation split.
            benchmark_root: 3DCS folder (rotation/, chirality/, traj_frames/ + traj_energies/ parquet rows, or only
                some of them: the axes it has are scored); null: the RDKit-generated default in `data_dir`.
            benchmark_rotation: Torsion-scan molecules of the generated default.
            benchmark_chirality: Stereoisomer parent molecules of the generated default.
            benchmark_traj: MMFF trajectories (rMD17 molecules) of the generated default.
            benchmark_traj_frames: Frames per generated trajectory (8 MD steps of 0.5 fs apart).
            benchmark_seed: Seed of the generated default.
            benchmark_rmd17: rMD17 folder (`rmd17/` with `npz_data/rmd17_<molecule>.npz` and `splits/`) or one npz:
                the energy axis is scored on its DFT trajectories instead of the `traj_*` configs; null: not used.
            benchmark_rmd17_molecules: rMD17 molecules to read (null: every npz found).
            benchmark_rmd17_split: Frames of `splits/index_<split>.csv` (e.g. `test_01`); null: the npz's frame order.
            benchmark_rmd17_frames: First this many frames per molecule (of the split); null: all (100k per molecule).
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        if target not in TARGETS:
            raise ValueError(f"data.target must be one of {list(TARGETS)}, got {target!r}")
        self.num_molecules, self.subset_seed, self.target = num_molecules, subset_seed, target
        self.val_fraction, self.split_seed = val_fraction, split_seed
        self.benchmark_root = benchmark_root
        self.bench_sizes = dict(n_rotation=benchmark_rotation, n_chirality=benchmark_chirality, n_traj=benchmark_traj,
                                traj_frames=benchmark_traj_frames, seed=benchmark_seed)
        self.rmd17 = dict(rmd17=benchmark_rmd17, rmd17_molecules=benchmark_rmd17_molecules,
                          rmd17_split=benchmark_rmd17_split, rmd17_frames=benchmark_rmd17_frames)
        self.extensive = TARGETS[target][1]
        self.splits: dict[str, MoleculeSet] = {}
        self.benchmark = None

    @property
    def path(self) -> Path:
        if self.root is not None:
            return Path(self.root).expanduser()
        return Path(self.data_dir) / f"{self.default_name}-n{self.num_molecules}-s{self.subset_seed}-v{self.default_version}"

    @property
    def benchmark_path(self) -> Path:
        if self.benchmark_root is not None:
            return Path(self.benchmark_root).expanduser()
        s = self.bench_sizes
        return Path(self.data_dir) / (f"three_dcs-r{s['n_rotation']}-c{s['n_chirality']}-t{s['n_traj']}x{s['traj_frames']}"
                                          f"-s{s['seed']}-v1")

    def generate_default(self, out_dir: Path) -> None:
        write_subset(out_dir / "qm9_subset.csv", self.num_molecules, self.subset_seed)

    @property
    def mmff_path(self) -> Path:
        return Path(self.data_dir) / f"qm9-rdkit-mmff-n{self.num_molecules // 4}-s{self.subset_seed}-v1"

    def _qm9_csv(self) -> Path:
        return self.path if self.path.is_file() else sorted(self.path.glob("*.csv"))[0]

    def prepare_data(self) -> None:
        super().prepare_data()
        if self.target == "mmff":
            from .qm9 import write_mmff_set

            ensure_generated(self.mmff_path, lambda out: write_mmff_set(out / "qm9_rdkit_mmff.csv", self._qm9_csv(),
                                                                        self.num_molecules // 4, seed=self.subset_seed))
        if self.benchmark_root is None:
            from .generator import generate

            ensure_generated(self.benchmark_path, lambda out: generate(out, **self.bench_sizes))

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        data = read_qm9_csv(self.mmff_path if self.target == "mmff" else self.path)
        n = len(data["z"])
        if n < 10:
            raise DatasetFormatError(self.path, f"only {n} molecules", "use at least 10 QM9 molecules")
        perm = np.random.default_rng(self.split_seed).permutation(n)
        n_val = max(1, round(n * self.val_fraction))
        idx = {"val": perm[:n_val], "train": perm[n_val:]}
        y = target_values(data, self.target, idx["train"])
        self.y_mean, self.y_std = float(y[idx["train"]].mean()), float(y[idx["train"]].std() + 1e-12)
        ys = torch.tensor((y - self.y_mean) / self.y_std, dtype=torch.float32)
        Z, P = pad_molecules(data["z"], data["pos"])
        self.splits = {k: MoleculeSet(Z[v], P[v], ys[v]) for k, v in idx.items()}
        from .evaluate import Benchmark

        self.benchmark = Benchmark.load(self.benchmark_path, **self.rmd17, arg="benchmark_root")

    def train_dataloader(self):
        return ResumableDataLoader(self.splits["train"], batch_size=self.batch_size, shuffle=True,
                                   num_workers=self.num_workers)

    def val_dataloader(self):
        return DataLoader(self.splits["val"], batch_size=self.batch_size, num_workers=self.num_workers)

    def describe(self) -> str:
        sizes = ", ".join(f"{k} {len(v)}" for k, v in self.splits.items())
        rmd17 = f"; energy axis on rMD17 at {self.rmd17['rmd17']}" if self.rmd17["rmd17"] else ""
        return (f"QM9 (qm9pack CSV) at {self.path} ({sizes}), target {self.target}; 3DCS benchmark rows at "
                f"{self.benchmark_path}{rmd17}.")
