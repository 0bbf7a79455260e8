"""DataModules: the predictor's training data (fit) and the sampler's queries (predict) for each task.

| DataModule | real format read | default generator | sampler domain |
|---|---|---|---|
| `BooleanLandscapeData` | `scores.csv` (bit string, score) | rugged + needle landscape, n bits | binary (GWG) |
| `SequenceAffinityData` | `sequences.fasta` + `scores.tsv` | PWM motifs + epistatic pairs (TF affinity) | categorical (GWG) |
| `PointLandscapeData` | `scores.csv` (x1..xd, score) | sharp separated 2-D Gaussian modes | continuous (MALA) |
| `FashionMNISTCounterfactualData` | Fashion-MNIST IDX (binarised) | Debian `dataset-fashion-mnist` | binary (GWG) |

Generated datasets also hold `landscape.json`, the exact f* they were scored with, so sampling runs report the true
score of their samples (`evaluate_samples`); a user's measured data has none and that part is skipped.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_iclr.core import BaseDataModule, DatasetFormatError
from lit_iclr.core.idx import FASHION_MNIST_DIR, load_fashion_mnist
from lit_iclr.core.loader import ResumableDataLoader

from .formats import (
    one_hot_dna,
    read_bit_table,
    read_fasta,
    read_point_table,
    read_scores,
    write_bit_table,
    write_fasta,
    write_point_table,
    write_scores,
)
from .landscapes import ALPHABET, BooleanLandscape, GaussianModes2D, MotifLandscape, landscape_from_dict


class DictDataset(TensorDataset):
    """TensorDataset yielding dicts {"x": ..., "y": ...} (the platform's batch convention)."""

    def __init__(self, **tensors: torch.Tensor):
        self.keys = list(tensors)
        super().__init__(*tensors.values())

    def __getitem__(self, i):
        return dict(zip(self.keys, super().__getitem__(i), strict=True))


class _ScoredData(BaseDataModule):
    """Shared split/loaders: (x, y) tensors for fit; `num_chains` start states for predict."""

    model_links = {"input_dim": "input_dim", "sampler_domain": "domain"}
    sampler_domain = "binary"

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 128, num_workers: int = 0,
                 val_fraction: float = 0.1, split_seed: int = 0, num_chains: int = 256, chain_seed: int = 0):
        super().__init__(root, data_dir, batch_size, num_workers)
        self.val_fraction, self.split_seed = val_fraction, split_seed
        self.num_chains, self.chain_seed = num_chains, chain_seed
        self.x = self.y = None

    @property
    def path(self) -> Path:
        """`root`, or the generated default under a name keyed by the generator's arguments (changing one regenerates)."""
        if self.root is not None:
            return Path(self.root).expanduser()
        key = json.dumps(self.generator_args(), sort_keys=True)
        tag = hashlib.sha1(key.encode()).hexdigest()[:8]
        return Path(self.data_dir) / f"{self.default_name}-v{self.default_version}-{tag}"

    def generator_args(self) -> dict:
        return {}

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.x is None:
            self.x, self.y = self.read()
            if tuple(self.x.shape[1:]) != self.expected_shape():
                raise DatasetFormatError(self.path, f"inputs have shape {tuple(self.x.shape[1:])}, the config expects "
                                         f"{self.expected_shape()}", "set the DataModule's size arguments to the data's")
        g = torch.Generator().manual_seed(self.split_seed)
        perm = torch.randperm(len(self.y), generator=g)
        n_val = int(round(self.val_fraction * len(perm)))
        self.val_idx, self.train_idx = perm[:n_val], perm[n_val:]

    def expected_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def train_dataloader(self):
        ds = DictDataset(x=self.x[self.train_idx], y=self.y[self.train_idx])
        return ResumableDataLoader(ds, batch_size=self.batch_size, shuffle=True, seed=self.split_seed)

    def val_dataloader(self):
        idx = self.val_idx if len(self.val_idx) else self.train_idx[:1]
        return DataLoader(DictDataset(x=self.x[idx], y=self.y[idx]), batch_size=1024)

    def chain_starts(self, g: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def predict_dataloader(self):
        """One batch of `num_chains` start states per `batch_size` chains (chains in a batch move together)."""
        x0 = self.chain_starts(torch.Generator().manual_seed(self.chain_seed))
        return DataLoader(DictDataset(x0=x0), batch_size=self.batch_size)

    def landscape(self):
        """The exact f* of a generated dataset (None for user data without landscape.json)."""
        f = self.path / "landscape.json"
        return landscape_from_dict(json.loads(f.read_text())) if f.is_file() else None


class BooleanLandscapeData(_ScoredData):
    """Scored bit strings (`scores.csv`); default: a rugged landscape with a deceptive needle on n bits.

    Training inputs are uniform bit strings plus a fraction with the needle bits set (oversampled positives, so the
    final predictor learns the needle). Chains start uniform on {0,1}^n.
    """

    default_name = "trajectory-boolean"
    default_version = 1

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 128, num_workers: int = 0,
                 val_fraction: float = 0.1, split_seed: int = 0, num_chains: int = 256, chain_seed: int = 0,
                 n_bits: int = 16, needle_size: int = 8, needle_height: float = 14.0, deception: float = 1.0,
                 rugged: float = 0.5, num_samples: int = 4000, needle_fraction: float = 0.2, generator_seed: int = 0):
        """
        Args:
            root: Folder holding scores.csv (header x,y: bit strings and scores); null: generated default.
            data_dir: Cache folder of the generated default.
            batch_size: Training batch size, and chains per predict batch.
            num_workers: DataLoader workers.
            val_fraction: Held-out fraction of the scored inputs.
            split_seed: Seed of the split and of the training order.
            num_chains: Chains the sampler runs (predict).
            chain_seed: Seed of the chains' uniform start states.
            n_bits: Number of bits n.
            needle_size: |S|, the needle's order (default generator).
            needle_height: B, the needle's value (default generator).
            deception: c, the cost of each needle bit alone (default generator).
            rugged: Scale of the spin-glass couplings (default generator).
            num_samples: Scored inputs written (default generator).
            needle_fraction: Fraction of training inputs with every needle bit set (default generator).
            generator_seed: Seed of the landscape and of its samples (default generator).
        """
        super().__init__(root, data_dir, batch_size, num_workers, val_fraction, split_seed, num_chains, chain_seed)
        self.n_bits, self.input_dim = n_bits, n_bits
        self.gen = dict(n=n_bits, needle_size=needle_size, needle_height=needle_height, deception=deception, rugged=rugged,
                        seed=generator_seed)
        self.num_samples, self.needle_fraction, self.generator_seed = num_samples, needle_fraction, generator_seed

    def generator_args(self) -> dict:
        return {**self.gen, "num_samples": self.num_samples, "needle_fraction": self.needle_fraction}

    def generate_default(self, out_dir: Path) -> None:
        f = BooleanLandscape.generate(**self.gen)
        g = torch.Generator().manual_seed(self.generator_seed + 1)
        x = torch.randint(0, 2, (self.num_samples, self.n_bits), generator=g).float()
        planted = torch.rand(self.num_samples, generator=g) < self.needle_fraction
        x[planted.nonzero()[:, :1], torch.tensor(f.needle)] = 1.0  # oversampled needle positives
        write_bit_table(out_dir / "scores.csv", x, f(x))
        (out_dir / "landscape.json").write_text(json.dumps(f.to_dict()))

    def read(self):
        return read_bit_table(self.path / "scores.csv")

    def expected_shape(self):
        return (self.n_bits,)

    def chain_starts(self, g):
        return torch.randint(0, 2, (self.num_chains, self.n_bits), generator=g).float()

    def evaluate_samples(self, x: torch.Tensor) -> dict:
        f = self.landscape()
        if f is None:
            return {}
        return {"true_score_mean": float(f(x).mean()), "true_score_max": float(f(x).max()),
                "needle_rate": float(f.in_needle(x).float().mean())}

    def describe(self) -> str:
        return f"BooleanLandscapeData: {self.path} (scores.csv: {self.n_bits}-bit strings and scores)"


class SequenceAffinityData(_ScoredData):
    """DNA sequences and affinities (`sequences.fasta` + `scores.tsv`); default: PWM motifs + epistatic pairs.

    Training sequences are uniform random, a fraction with a motif's consensus planted at a random position.
    Chains start from uniform random sequences (or from `x_ref` for constrained design, see TrajectorySampler).
    """

    default_name = "trajectory-tf-affinity"
    default_version = 1
    sampler_domain = "categorical"

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 128, num_workers: int = 0,
                 val_fraction: float = 0.1, split_seed: int = 0, num_chains: int = 256, chain_seed: int = 0,
                 length: int = 24, motifs: int = 2, motif_width: int = 6, pairs: int = 12, num_samples: int = 4000,
                 planted_fraction: float = 0.3, generator_seed: int = 0):
        """
        Args:
            root: Folder holding sequences.fasta and scores.tsv (id<TAB>score); null: generated default.
            data_dir: Cache folder of the generated default.
            batch_size: Training batch size, and chains per predict batch.
            num_workers: DataLoader workers.
            val_fraction: Held-out fraction of the sequences.
            split_seed: Seed of the split and of the training order.
            num_chains: Chains the sampler runs (predict).
            chain_seed: Seed of the chains' random start sequences.
            length: Sequence length L.
            motifs: Number of PWM motifs (default generator).
            motif_width: Width of each motif (default generator).
            pairs: Number of epistatic letter pairs (default generator).
            num_samples: Sequences written (default generator).
            planted_fraction: Fraction of sequences with a motif consensus planted (default generator).
            generator_seed: Seed of the landscape and of its sequences (default generator).
        """
        super().__init__(root, data_dir, batch_size, num_workers, val_fraction, split_seed, num_chains, chain_seed)
        self.length, self.input_dim = length, 4 * length
        self.gen = dict(length=length, motifs=motifs, width=motif_width, pairs=pairs, seed=generator_seed)
        self.num_samples, self.planted_fraction, self.generator_seed = num_samples, planted_fraction, generator_seed

    def generator_args(self) -> dict:
        return {**self.gen, "num_samples": self.num_samples, "planted_fraction": self.planted_fraction}

    def generate_default(self, out_dir: Path) -> None:
        f = MotifLandscape.generate(**self.gen)
        g = torch.Generator().manual_seed(self.generator_seed + 1)
        idx = torch.randint(0, 4, (self.num_samples, self.length), generator=g)
        pwms = torch.tensor(f.pwms)
        consensus = pwms.argmax(-1)  # (M, w)
        w = consensus.shape[1]
        planted = (torch.rand(self.num_samples, generator=g) < self.planted_fraction).nonzero()[:, 0]
        which = torch.randint(0, len(consensus), (len(planted),), generator=g)
        start = torch.randint(0, self.length - w + 1, (len(planted),), generator=g)
        cols = start[:, None] + torch.arange(w)
        idx[planted[:, None], cols] = consensus[which]
        x = torch.nn.functional.one_hot(idx, 4).float()
        ids = [f"seq{i:06d}" for i in range(self.num_samples)]
        write_fasta(out_dir / "sequences.fasta", ids, ["".join(ALPHABET[i] for i in row) for row in idx.tolist()])
        write_scores(out_dir / "scores.tsv", ids, f(x))
        (out_dir / "landscape.json").write_text(json.dumps(f.to_dict()))

    def read(self):
        ids, seqs = read_fasta(self.path / "sequences.fasta")
        return one_hot_dna(seqs), read_scores(self.path / "scores.tsv", ids)

    def expected_shape(self):
        return (self.length, 4)

    def chain_starts(self, g):
        return torch.nn.functional.one_hot(torch.randint(0, 4, (self.num_chains, self.length), generator=g), 4).float()

    def evaluate_samples(self, x: torch.Tensor) -> dict:
        f = self.landscape()
        if f is None:
            return {}
        y = f(x)
        return {"true_score_mean": float(y.mean()), "true_score_max": float(y.max()),
                "unique_sequences": int(len(torch.unique(x.argmax(-1), dim=0)))}

    def describe(self) -> str:
        return f"SequenceAffinityData: {self.path} (sequences.fasta + scores.tsv, length {self.length})"


class PointLandscapeData(_ScoredData):
    """Scored points in R^d (`scores.csv`); default: log-density of sharp, well separated Gaussian modes in 2-D.

    Training points are uniform in the box [-box, box]^2 plus a fraction near the modes. Chains start from N(0, I).
    """

    default_name = "trajectory-modes2d"
    default_version = 1
    sampler_domain = "continuous"

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 128, num_workers: int = 0,
                 val_fraction: float = 0.1, split_seed: int = 0, num_chains: int = 256, chain_seed: int = 0,
                 dim: int = 2, modes: int = 8, radius: float = 3.0, sigma: float = 0.15, box: float = 4.5,
                 num_samples: int = 6000, near_fraction: float = 0.3, generator_seed: int = 0):
        """
        Args:
            root: Folder holding scores.csv (header x1,...,xd,y); null: generated default.
            data_dir: Cache folder of the generated default.
            batch_size: Training batch size, and chains per predict batch.
            num_workers: DataLoader workers.
            val_fraction: Held-out fraction of the points.
            split_seed: Seed of the split and of the training order.
            num_chains: Chains the sampler runs (predict).
            chain_seed: Seed of the chains' N(0, I) start points.
            dim: Point dimension d (the default generator writes d = 2).
            modes: Number of modes on the ring (default generator).
            radius: Ring radius (default generator).
            sigma: Mode width (default generator).
            box: Half-width of the uniform training box (default generator).
            num_samples: Points written (default generator).
            near_fraction: Fraction of points drawn near the modes (default generator).
            generator_seed: Seed of the sample points (default generator).
        """
        super().__init__(root, data_dir, batch_size, num_workers, val_fraction, split_seed, num_chains, chain_seed)
        self.dim, self.input_dim = dim, dim
        self.gen = dict(modes=modes, radius=radius, sigma=sigma)
        self.box, self.num_samples, self.near_fraction, self.generator_seed = box, num_samples, near_fraction, generator_seed

    def generator_args(self) -> dict:
        return {**self.gen, "box": self.box, "num_samples": self.num_samples, "near_fraction": self.near_fraction,
                "seed": self.generator_seed}

    def generate_default(self, out_dir: Path) -> None:
        if self.dim != 2:
            raise DatasetFormatError(out_dir, f"the default generator writes 2-D points, dim is {self.dim}",
                                     "set dim: 2 or point `root` at your own scores.csv")
        f = GaussianModes2D.generate(**self.gen)
        g = torch.Generator().manual_seed(self.generator_seed)
        n_near = int(self.near_fraction * self.num_samples)
        far = (torch.rand(self.num_samples - n_near, 2, generator=g) * 2 - 1) * self.box
        k = torch.randint(0, len(f.centers), (n_near,), generator=g)
        near = torch.tensor(f.centers)[k] + 3 * f.sigma * torch.randn(n_near, 2, generator=g)
        x = torch.cat([far, near])
        write_point_table(out_dir / "scores.csv", x, f(x))
        (out_dir / "landscape.json").write_text(json.dumps(f.to_dict()))

    def read(self):
        return read_point_table(self.path / "scores.csv")

    def expected_shape(self):
        return (self.dim,)

    def chain_starts(self, g):
        return torch.randn(self.num_chains, self.dim, generator=g)

    def evaluate_samples(self, x: torch.Tensor) -> dict:
        f = self.landscape()
        if not isinstance(f, GaussianModes2D):
            return {}
        return mode_stats(f, x)

    def describe(self) -> str:
        return f"PointLandscapeData: {self.path} (scores.csv: {self.dim}-D points and scores)"


def mode_stats(f: GaussianModes2D, x: torch.Tensor) -> dict:
    """Modes covered (a chain within 3 sigma), fraction of chains in a mode, and the TV of the chains' mode histogram
    to the target's equal weights."""
    d = torch.cdist(x, torch.tensor(f.centers))
    near = d.min(-1).values < 3 * f.sigma
    k = d.argmin(-1)[near]
    K = len(f.centers)
    hist = torch.bincount(k, minlength=K).float() / max(len(x), 1)
    tv = 0.5 * float((hist - near.float().mean() / K).abs().sum() + (1 - near.float().mean()))
    return {"modes_covered": int((hist > 0).sum()), "in_mode_rate": float(near.float().mean()), "mode_tv": tv}


class FashionMNISTCounterfactualData(BaseDataModule):
    """Binarised Fashion-MNIST (real IDX files) for the classifier (fit) and counterfactual queries (predict).

    Predict batches: `num_queries` test images of `source_class` (the reference `x_ref`, also the chains' start) and
    the `target_class` each counterfactual must reach.
    """

    default_name = "fashion-mnist"
    model_links = {"num_classes": "num_classes", "sampler_domain": "domain"}
    sampler_domain = "binary"
    num_classes = 10

    def __init__(self, root: str | None = str(FASHION_MNIST_DIR), data_dir: str = "data", batch_size: int = 128,
                 num_workers: int = 0, threshold: float = 0.5, max_train: int | None = 12000, val_size: int = 2000,
                 split_seed: int = 0, source_class: int = 9, target_class: int = 7, num_queries: int = 16):
        """
        Args:
            root: Folder of Fashion-MNIST IDX files (Debian `dataset-fashion-mnist`).
            data_dir: Unused (the images are read in place).
            batch_size: Training batch size, and queries per predict batch.
            num_workers: DataLoader workers.
            threshold: Pixels above it (intensity in [0, 1]) become 1.
            max_train: Use this many training images (null: all 60000), for CPU-sized runs.
            val_size: Images of the official test split used for validation.
            split_seed: Seed of the training subset and order.
            source_class: Class of the query images (default 9, ankle boot).
            target_class: Class the counterfactuals must reach (default 7, sneaker).
            num_queries: Query images (predict).
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.threshold, self.max_train, self.val_size, self.split_seed = threshold, max_train, val_size, split_seed
        self.source_class, self.target_class, self.num_queries = source_class, target_class, num_queries
        self.train = None

    def _binary(self, images) -> torch.Tensor:
        return (torch.from_numpy(images).float().flatten(1) / 255.0 > self.threshold).float()

    def setup(self, stage: str | None = None) -> None:
        if self.train is not None:
            return
        xi, yi = load_fashion_mnist(self.path, "train")
        xt, yt = load_fashion_mnist(self.path, "test")
        g = torch.Generator().manual_seed(self.split_seed)
        keep = torch.randperm(len(yi), generator=g)[: self.max_train]
        self.train = (self._binary(xi)[keep], torch.from_numpy(yi)[keep])
        x_test, y_test = self._binary(xt), torch.from_numpy(yt)
        self.val = (x_test[: self.val_size], y_test[: self.val_size])
        pool = (y_test[self.val_size:] == self.source_class).nonzero()[:, 0][: self.num_queries] + self.val_size
        self.queries = x_test[pool]

    def train_dataloader(self):
        return ResumableDataLoader(DictDataset(x=self.train[0], y=self.train[1]), batch_size=self.batch_size, shuffle=True,
                                   seed=self.split_seed)

    def val_dataloader(self):
        return DataLoader(DictDataset(x=self.val[0], y=self.val[1]), batch_size=1000)

    def predict_dataloader(self):
        target = torch.full((len(self.queries),), self.target_class)
        return DataLoader(DictDataset(x0=self.queries, x_ref=self.queries, target=target), batch_size=self.batch_size)

    def describe(self) -> str:
        return f"FashionMNISTCounterfactualData: {self.path} (IDX, binarised at {self.threshold})"
