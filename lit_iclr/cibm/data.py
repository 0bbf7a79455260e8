"""DataModules of concept-bottleneck data: CUB-200-2011 (images, Koh et al.'s concepts) and AwA2/aPY (xlsa17 features).

Batches are dicts: `x` (an embedding (B, D) or an image (B, C, H, W) in [-1, 1]), `c` (B, K) concept labels in {0, 1},
`y` (B,) class. Sizes the model needs (input shape, number of concepts and classes, concept groups) are linked to the
model. `__init__` reads no file: real data's sizes come from the config when it states them (`num_concepts`,
`num_classes`; checked against the files in setup, so `cli.py plan` needs no data) or are read at first use.
`train_inputs` (all training inputs, in memory) is what the model draws its I(X;C) subsample from.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core import BaseDataModule, ConfigError, DatasetFormatError
from lit_iclr.core.atomic import atomic_torch_save
from lit_iclr.core.loader import EveryIndexOnEveryRank, ResumableDataLoader, random_state_kept

from . import generate
from .cub import read_cub
from .embed import embed_images, embedding_dim, normalize, pretrain_on_fashion_mnist
from .xlsa17 import read_xlsa17

SPLITS = ("train", "val", "test")
# bumped when a reader's output changes, so embeddings cached with older concept labels are not reused
# (2: Koh et al.'s majority vote skips "not visible" zeros)
READER_VERSION = 2
# the generator settings of configs/cibm.yaml: their data keeps the folder name it always had
GENERATOR_DEFAULTS = {"num_images": 3600, "num_classes": 16, "p_leak": 0.85, "p_deviate": 0.12, "seed": 0,
                      "classes_per_prototype": 1}


class ConceptDataset(Dataset):
    def __init__(self, x: torch.Tensor, c: torch.Tensor, y: torch.Tensor):
        self.x, self.c, self.y = x, c, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "c": self.c[i], "y": self.y[i]}


class _ConceptData(BaseDataModule):
    model_links = {"input_shape": "input_shape", "num_concepts": "num_concepts", "num_classes": "num_classes",
                   "concept_groups": "concept_groups"}

    def __init__(self, root, data_dir, batch_size, num_workers):
        super().__init__(root, data_dir, batch_size, num_workers)
        self.sets: dict[str, ConceptDataset] = {}

    @property
    def train_inputs(self) -> torch.Tensor:
        """Every training input, for the model's I(X;C) subsample."""
        return self.sets["train"].x

    def _check_sizes(self, source: Path, k: int, classes: int) -> None:
        if (k, classes) != (self.num_concepts, self.num_classes):
            raise DatasetFormatError(source, f"{k} concepts / {classes} classes, but the model was sized for "
                                     f"{self.num_concepts} / {self.num_classes}", "set the data's sizes to match the files")

    def train_dataloader(self):
        return ResumableDataLoader(self.sets["train"], batch_size=self.batch_size, shuffle=True,
                                   num_workers=self.num_workers)

    def _eval_loader(self, split: str) -> DataLoader:
        # the whole split on every rank under DDP: I(X;C), I(C;Y), the leakage probes and the interventions are
        # statistics of all points at once, not sums a rank could contribute its share of (each rank logs the same)
        # (in batches of at least the global batch size: batches, and the z each draws, are one process's)
        world = self.trainer.world_size if self.trainer is not None else 1
        data = self.sets[split]
        return DataLoader(data, batch_size=max(self.batch_size * world, 256), sampler=EveryIndexOnEveryRank(len(data)),
                          num_workers=self.num_workers)

    def val_dataloader(self):
        return self._eval_loader("val")

    def test_dataloader(self):
        return self._eval_loader("test")


class CUBConcepts(_ConceptData):
    """CUB-200-2011 with Koh et al.'s concepts; the default is a generated CUB-format set of Fashion-MNIST scenes."""

    default_name = "cibm-cub-scenes"
    default_version = 1

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 64, num_workers: int = 0,
                 splits: str = "auto", min_class_count: int = 10, image_size: int = 32, in_chans: int = 1,
                 embed_backbone: str | None = "test_resnet", embed_stages: list[int] = (2, 3, 4), embed_grid: int = 2,
                 embed_checkpoint: str | None = None, embed_pretrain_steps: int = 150,
                 num_images: int = 3600, num_classes: int = 16, p_leak: float = 0.85, p_deviate: float = 0.12,
                 generator_seed: int = 0, classes_per_prototype: int = 1, num_concepts: int | None = None):
        """
        Args:
            root: Folder holding CUB_200_2011/ (and attributes.txt, class_attr_data_10/); null: the generated default.
            data_dir: Cache folder (generated data, pretrained embedding backbone, cached embeddings).
            batch_size: Samples per training batch.
            num_workers: DataLoader workers.
            splits: `pkl` (Koh et al.'s train/val/test.pkl), `raw` (original files, Koh et al.'s processing) or `auto`.
            min_class_count: Raw splits: keep attributes present in at least this many classes (Koh et al.: 10).
            image_size: Images are resized to this side.
            in_chans: 1 (grey) or 3 (RGB).
            embed_backbone: timm backbone whose frozen features are the model input (the paper's precomputed
                embeddings); null: the model gets images and trains its own backbone end to end.
            embed_stages: Feature stages (timm `out_indices`) pooled into the embedding.
            embed_grid: Each stage is average-pooled to grid x grid.
            embed_checkpoint: Local weights of the embedding backbone; null: pretrain it on Fashion-MNIST (grey only).
            embed_pretrain_steps: Fashion-MNIST pretraining steps when no checkpoint is given (0: random frozen features).
            num_images: Default generator: number of images.
            num_classes: Default generator: classes (attribute combinations). Real data: the class count of the files
                when `num_concepts` is given too (checked in setup), else read from the files.
            p_leak: Default generator: probability that the background level carries the class (the leakage channel).
            p_deviate: Default generator: probability that an image shows another value than its class's, per group.
            generator_seed: Default generator seed.
            classes_per_prototype: Default generator: classes sharing one concept prototype (1: every class has its
                own). Above 1 the classes of a prototype differ only by the leakage channel (the background level),
                so class information beyond the concepts exists and a joint CBM can leak it (configs/cibm_leakage.yaml).
            num_concepts: Real data: the concept count (Koh et al.'s CUB: 112), stated so that nothing is read before
                setup; null: read from the files at first use.
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.splits, self.min_class_count = splits, min_class_count
        self.image_size, self.in_chans = image_size, in_chans
        self.embed_backbone, self.embed_stages, self.embed_grid = embed_backbone, list(embed_stages), embed_grid
        self.embed_checkpoint, self.embed_pretrain_steps = embed_checkpoint, embed_pretrain_steps
        self.gen_kwargs = {"num_images": num_images, "num_classes": num_classes, "p_leak": p_leak,
                           "p_deviate": p_deviate, "seed": generator_seed, "classes_per_prototype": classes_per_prototype}
        if root is not None and num_concepts is not None and num_classes is None:
            raise ConfigError("data.init_args.num_concepts is set but num_classes is null: state both (CUB: 112 and 200) "
                              "or neither (read from the files)")
        # real data: stated sizes (checked against the files in setup), or None until the files are read at first use
        self._stated = (num_concepts, num_classes) if root is not None and num_concepts is not None else None
        self._names: list[str] | None = generate.concept_names() if root is None else None
        self._classes: int | None = num_classes if root is None else None
        if embed_backbone is not None:
            self.input_shape = [embedding_dim(embed_backbone, in_chans, self.embed_stages, embed_grid)]
        else:
            self.input_shape = [in_chans, image_size, image_size]

    # ------------------------------------------------------------------ sizes, read lazily
    def _read_meta(self) -> None:
        """Concept names and class count of real data (attributes.txt and the split files; images are read in setup)."""
        if self._names is not None:
            return
        data = read_cub(self.path, self.splits, self.min_class_count)
        self._names, self._classes = data.concept_names, data.num_classes
        if self._stated is not None and self._stated != (len(self._names), self._classes):
            raise DatasetFormatError(self.path, f"{len(self._names)} concepts / {self._classes} classes, but the config "
                                     f"states {self._stated[0]} / {self._stated[1]}",
                                     "set data.init_args.num_concepts / num_classes to the files' sizes (or null)")

    @property
    def num_concepts(self) -> int:
        if self._names is None and self._stated is not None:
            return self._stated[0]
        self._read_meta()
        return len(self._names)

    @property
    def num_classes(self) -> int:
        if self._classes is None and self._stated is not None:
            return self._stated[1]
        self._read_meta()
        return self._classes

    @property
    def concept_names(self) -> list[str]:
        self._read_meta()
        return self._names

    def _groups(self) -> dict[str, list[int]] | None:
        if self._names is None and self._stated is not None:
            return None  # not read yet: the model takes the groups after setup (CIBM.setup)
        self._read_meta()
        groups: dict[str, list[int]] = {}
        for k, n in enumerate(self._names):
            groups.setdefault(n.split("::")[0], []).append(k)
        return groups

    @property
    def concept_groups(self) -> list[list[int]] | None:
        groups = self._groups()
        return None if groups is None else list(groups.values())

    @property
    def group_names(self) -> list[str]:
        groups = self._groups()
        return [] if groups is None else list(groups)

    def generated_path(self, stem: str) -> Path:
        """The default settings keep the plain folder name; other generator settings get a folder keyed by their values."""
        changed = {k: v for k, v in self.gen_kwargs.items() if v != GENERATOR_DEFAULTS[k]}
        if not changed:
            return Path(self.data_dir) / stem
        key = hashlib.sha1(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:10]
        return Path(self.data_dir) / f"{stem}-{key}"

    def generate_default(self, out_dir: Path) -> None:
        generate.generate_cub(out_dir, **self.gen_kwargs)

    def _backbone_weights(self) -> Path | None:
        if self.embed_checkpoint is not None:
            return Path(self.embed_checkpoint)
        if self.embed_pretrain_steps <= 0:
            return None
        return Path(self.data_dir) / "backbones" / f"{self.embed_backbone}-fmnist-{self.embed_pretrain_steps}.safetensors"

    def prepare_data(self) -> None:
        super().prepare_data()
        weights = self._backbone_weights()
        if self.embed_backbone is not None and self.embed_checkpoint is None and weights is not None and not weights.exists():
            if self.in_chans != 1:
                raise DatasetFormatError(self.path, "Fashion-MNIST pretraining makes a grey backbone only",
                                         "set embed_checkpoint to local RGB weights, or in_chans: 1")
            with random_state_kept():  # it seeds the global generators
                pretrain_on_fashion_mnist(self.embed_backbone, self.embed_pretrain_steps, weights, canvas=self.image_size)

    def _load_images(self, paths: list[Path]) -> np.ndarray:
        mode = "L" if self.in_chans == 1 else "RGB"
        out = []
        for p in paths:
            try:
                with Image.open(p) as im:
                    im = im.convert(mode)
                    if im.size != (self.image_size, self.image_size):
                        im = im.resize((self.image_size, self.image_size), Image.Resampling.BILINEAR)
                    out.append(np.asarray(im, dtype=np.uint8))
            except (UnidentifiedImageError, OSError) as e:
                raise DatasetFormatError(p, f"image does not open ({e.__class__.__name__})",
                                         "re-extract the CUB images/ folder") from e
        return np.stack(out)

    def _cache_file(self) -> Path:
        weights = self._backbone_weights()
        key = json.dumps([READER_VERSION, str(self.path.resolve()), self.splits, self.min_class_count, self.image_size,
                          self.in_chans, self.embed_backbone, self.embed_stages, self.embed_grid, str(weights),
                          weights.stat().st_mtime if weights is not None and weights.exists() else 0], sort_keys=True)
        return Path(self.data_dir) / "cache" / f"cibm-{hashlib.sha1(key.encode()).hexdigest()[:16]}.pt"

    def setup(self, stage: str | None = None) -> None:
        if self.sets:
            return
        if self.root is not None:
            self._read_meta()  # names, groups and class count (checked against stated sizes) before any embedding
        cache = self._cache_file()
        if cache.exists():
            tensors = torch.load(cache, weights_only=True)
        else:
            with random_state_kept():  # the backbone's random init: a run that embeds trains as one finding the cache
                tensors = self._embed_all(cache)
        self.sets = {s: ConceptDataset(**tensors[s]) for s in SPLITS}

    def _embed_all(self, cache: Path) -> dict:
        data = read_cub(self.path, self.splits, self.min_class_count)
        self._check_sizes(self.path, len(data.concept_names), data.num_classes)
        tensors = {}
        for s in SPLITS:
            sp = data.splits[s]
            images = self._load_images(sp.paths)
            if self.embed_backbone is not None:
                x = embed_images(images, self.embed_backbone, self.in_chans, self.embed_stages, self.embed_grid,
                                 self._backbone_weights())
            else:
                x = torch.from_numpy(images).float() / 255.0
                x = normalize(x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2))
            tensors[s] = {"x": x, "c": torch.from_numpy(sp.concepts).float(), "y": torch.from_numpy(sp.labels)}
        if self.embed_backbone is not None:  # standardise features with training statistics
            mean, std = tensors["train"]["x"].mean(0), tensors["train"]["x"].std(0).clamp_min(1e-6)
            for s in SPLITS:
                tensors[s]["x"] = (tensors[s]["x"] - mean) / std
        # every rank of a DDP run embeds (setup runs on each) and writes the same bytes: each through its own
        # temporary file (`.tmp-<pid>`), so one rank's rename never takes the file another is still writing
        atomic_torch_save(tensors, cache)
        return tensors

    def describe(self) -> str:
        what = "generated CUB-format Fashion-MNIST scenes" if self.root is None else "CUB-200-2011"
        inp = f"frozen {self.embed_backbone} embeddings" if self.embed_backbone else "images"
        groups = len(self.group_names) or "(read at setup)"
        return (f"CUBConcepts: {what} at {self.path}; {self.num_concepts} concepts in {groups} groups, "
                f"{self.num_classes} classes; model input: {inp} {self.input_shape}")


class XLSA17Concepts(_ConceptData):
    """AwA2 or aPY in the xlsa17 format: ResNet-101 features with class-level binary attributes as concepts."""

    default_name = "xlsa17"

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 256, num_workers: int = 0,
                 split_seed: int = 0, concepts: str = "auto", att_threshold: float | None = None,
                 num_concepts: int | None = None, num_classes: int | None = None, feature_dim: int = 2048):
        """
        Args:
            root: Folder holding res101.mat and att_splits.mat (xlsa17/data/AWA2 or APY; AwA2's predicates.txt optional).
            data_dir: Unused (no default is generated); kept for the common interface.
            batch_size: Samples per training batch.
            num_workers: DataLoader workers.
            split_seed: Seed of the random train/val/test split.
            concepts: Binary concepts from `auto` (AwA2's predicate-matrix-binary.txt when beside the .mat files, else
                `original_att`), `binary` or `original_att` (never the L2-normalised `att`).
            att_threshold: `original_att` values >= this are present (missing -1 entries are absent); null: half the
                scale (50 on AwA2's 0-100, 0.5 on aPY's 0-1).
            num_concepts: The concept count (AwA2 85, aPY 64), stated with `num_classes` so that nothing is read before
                setup (checked against the files there); null: the .mat files are read at first use.
            num_classes: The class count (AwA2 50, aPY 32), with `num_concepts`.
            feature_dim: The feature width when the sizes are stated (xlsa17's ResNet-101: 2048).
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        if root is None:
            raise DatasetFormatError("data.init_args.root", "XLSA17Concepts has no generated default",
                                     "point root at xlsa17/data/AWA2 (or APY)")
        if (num_concepts is None) != (num_classes is None):
            raise ConfigError("data.init_args.num_concepts and num_classes: state both (AwA2: 85 and 50) or neither")
        self.split_seed = split_seed
        self.concepts, self.att_threshold = concepts, att_threshold
        self._stated = (num_concepts, num_classes, feature_dim) if num_concepts is not None else None
        self._data: dict | None = None

    def _read(self) -> dict:
        if self._data is None:
            self._data = read_xlsa17(self.path, self.split_seed, self.concepts, self.att_threshold)
            if self._stated is not None:
                have = (len(self._data["names"]), self._data["num_classes"], self._data["splits"]["train"][0].shape[1])
                if have != self._stated:
                    raise DatasetFormatError(self.path, f"{have[0]} concepts / {have[1]} classes / {have[2]} features, "
                                             f"but the config states {self._stated[0]} / {self._stated[1]} / "
                                             f"{self._stated[2]}", "set num_concepts / num_classes / feature_dim to match")
        return self._data

    @property
    def num_concepts(self) -> int:
        return self._stated[0] if self._data is None and self._stated else len(self._read()["names"])

    @property
    def num_classes(self) -> int:
        return self._stated[1] if self._data is None and self._stated else self._read()["num_classes"]

    @property
    def input_shape(self) -> list[int]:
        return [self._stated[2]] if self._data is None and self._stated else [self._read()["splits"]["train"][0].shape[1]]

    @property
    def concept_groups(self) -> list[list[int]] | None:
        if self._data is None and self._stated:
            return None  # not read yet: the model takes the groups after setup (CIBM.setup)
        return [g for g in self._read()["groups"].values() if g]

    @property
    def group_names(self) -> list[str]:
        return [] if self._data is None and self._stated else list(self._read()["groups"])

    def setup(self, stage: str | None = None) -> None:
        self.sets = {s: ConceptDataset(torch.from_numpy(x), torch.from_numpy(c), torch.from_numpy(y))
                     for s, (x, c, y) in self._read()["splits"].items()}
