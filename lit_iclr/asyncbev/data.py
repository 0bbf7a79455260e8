"""nuScenes DataModule with asynchronous LiDAR / camera inputs (real layout or the generated default world)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core import BaseDataModule
from lit_iclr.core.errors import ConfigError, DatasetFormatError
from lit_iclr.core.loader import EveryIndexOnEveryRank

from .nusc import DETECTION_CLASSES, MIN_DISTANCE, AsyncNuScenes
from .world import CAMERA_HZ, CLASSES, SWEEP_HZ, WorldConfig, generate_world

MAX_BOXES = 64


class AsyncDataset(Dataset):
    """Keyframes with one modality delayed.

    Training (`offset=None`): per sample a delay drawn uniformly, LiDAR by 0..`max_lidar_sweeps` periods of 1/20 s, the
    camera by 0..`max_camera_frames` periods of 1/12 s (the official code's sweep / frame indices, turned into seconds
    at the sensors' nominal rates); `delayed` picks which modality (`random`: either, per sample).
    Evaluation: a fixed `offset` in seconds for the `delayed` modality.
    Either way the reader takes the recorded frame nearest to that time (`AsyncNuScenes.at_delay`), and `dt` is what the
    timestamps give. Box targets keep only boxes some sensor saw (`use_valid_flag`: LiDAR or radar points, mmdet3d's
    valid_flag; false: LiDAR points, mmdet3d's default filter).
    """

    def __init__(self, reader: AsyncNuScenes, tokens: list[str], delayed: str, offset: float | None, num_sweeps: int,
                 max_points: int, max_lidar_sweeps: int = 12, max_camera_frames: int = 8, seed: int = 0,
                 use_valid_flag: bool = True):
        if delayed not in ("lidar", "camera", "random"):
            raise ConfigError(f"delayed must be lidar | camera | random, got {delayed!r}")
        self.reader, self.tokens, self.delayed, self.offset = reader, tokens, delayed, offset
        self.num_sweeps, self.max_points = num_sweeps, max_points
        self.max_lidar_sweeps, self.max_camera_frames, self.seed = max_lidar_sweeps, max_camera_frames, seed
        self.use_valid_flag = use_valid_flag
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def _delays(self, i: int) -> tuple[bool, float, float]:
        """(LiDAR delayed?, LiDAR delay s, camera delay s) of sample i."""
        rng = np.random.default_rng([self.seed, self.epoch, i])
        lidar = self.delayed == "lidar" or (self.delayed == "random" and rng.random() < 0.5)
        if self.offset is not None:
            return lidar, self.offset if lidar else 0.0, 0.0 if lidar else self.offset
        if lidar:
            return lidar, int(rng.integers(0, self.max_lidar_sweeps + 1)) / SWEEP_HZ, 0.0
        return lidar, 0.0, int(rng.integers(0, self.max_camera_frames + 1)) / CAMERA_HZ

    def __getitem__(self, i: int) -> dict:
        token = self.tokens[i]
        lidar_delayed, ld, cd = self._delays(i)
        s = self.reader.async_sample(token, ld, cd, self.num_sweeps)
        pts = s["points"]
        if len(pts) > self.max_points:  # deterministic subsample of very dense clouds
            pts = pts[np.random.default_rng(i).choice(len(pts), self.max_points, replace=False)]
        points = np.zeros((self.max_points, 5), np.float32)
        points[: len(pts)] = pts
        b = self.reader.boxes(token)
        seen = b["num_lidar_pts"] + (b["num_radar_pts"] if self.use_valid_flag else 0) > 0
        b = {k: v[seen] for k, v in b.items()}
        rows = np.concatenate([b["center"], b["size"], b["yaw"][:, None], b["velocity"], b["label"][:, None]], 1)[:MAX_BOXES]
        boxes = np.zeros((MAX_BOXES, 10), np.float32)
        boxes[: len(rows)] = rows
        return dict(points=torch.from_numpy(points), points_mask=torch.arange(self.max_points) < len(pts),
                    images=torch.from_numpy(s["images"]),
                    lidar2img=torch.from_numpy(s["lidar2img"]), emc=torch.from_numpy(s["emc"]),
                    dt=torch.tensor(float(s["dt"])), lidar_delayed=torch.tensor(lidar_delayed),
                    boxes=torch.from_numpy(boxes), boxes_mask=torch.arange(MAX_BOXES) < len(rows),
                    lidar2global=torch.from_numpy(s["lidar2global"]).float(), sample_token=token)


class NuScenesAsync(BaseDataModule):
    """nuScenes (v1.0-mini / v1.0-trainval layout) read by nuscenes-devkit, with asynchronous sensor inputs."""

    default_name = "nuscenes-asyncbev"
    default_version = 3  # 2: objects_per_scene / moving_share / meet_ego options; 3: closed-form yaw quaternions
    world_classes = tuple(CLASSES)  # the detection classes the generated world holds
    content_options = ("num_train_scenes", "num_val_scenes", "scene_seconds", "objects_per_scene", "moving_share",
                       "meet_ego", "image_width", "image_height", "generator_seed")
    model_links = {"num_classes": "num_classes", "detection_classes": "detection_classes",
                   "model_image_size": "image_size"}

    @property
    def model_image_size(self):
        """`image_size` as linked into the model: a source name of its own, so that DataModules with an `image_size` of
        their own whose model takes none (IB-CBM's) are not linked (the links are declared for every DataModule)."""
        return self.image_size

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 4, num_workers: int = 0,
                 version: str = "v1.0-mini", train_split: str = "mini_train", val_split: str = "mini_val",
                 classes: list[str] | None = None, delayed: str = "lidar", val_offset: float = 0.5, num_sweeps: int = 3,
                 max_points: int = 12000, min_distance: float = MIN_DISTANCE, use_valid_flag: bool = True,
                 max_lidar_sweeps: int = 12, max_camera_frames: int = 8, num_train_scenes: int = 8,
                 num_val_scenes: int = 2, scene_seconds: float = 4.0, objects_per_scene: int = 24,
                 moving_share: float = 0.6, meet_ego: bool = False, image_width: int = 64, image_height: int = 40,
                 generator_seed: int = 0, seed: int = 0):
        """
        Args:
            root: nuScenes folder holding `<version>/`, `samples/`, `sweeps/`, `maps/`; null: the generated default.
            data_dir: Cache folder of the generated default.
            batch_size: Keyframes per batch.
            num_workers: DataLoader worker processes.
            version: nuScenes version folder (v1.0-mini, v1.0-trainval).
            train_split: Official split for training (mini_train, train).
            val_split: Official split for validation / devkit evaluation (mini_val, val).
            classes: nuScenes detection classes to detect; null: all ten on real data, the generated world's four
                (car, truck, pedestrian, bicycle) on the default. Annotations of the others are counted and reported.
            delayed: Which modality is late during training and validation: lidar | camera | random.
            val_offset: Fixed time offset (s) of the delayed modality in validation (the nearest recorded frame by
                timestamp).
            num_sweeps: LiDAR sweeps accumulated per input (the newest is the delayed one), with a time-lag channel.
            max_points: Points per input cloud (padded / subsampled to this).
            min_distance: Points within this many metres of their LiDAR in x and y are dropped from every sweep
                (no-return points at the origin, the ego's roof), as the devkit's `remove_close` (1.0).
            use_valid_flag: Box targets: keep boxes with LiDAR or radar points (mmdet3d's valid_flag); false: boxes with
                LiDAR points (mmdet3d's default). Boxes no sensor saw are never targets.
            max_lidar_sweeps: Training draws the LiDAR delay from 0..this many 1/20 s periods (12: 0-0.6 s).
            max_camera_frames: Training draws the camera delay from 0..this many 1/12 s periods.
            num_train_scenes: Default generator: scenes in mini_train (at most 8).
            num_val_scenes: Default generator: scenes in mini_val (at most 2).
            scene_seconds: Default generator: length of each scene.
            objects_per_scene: Default generator: cars, trucks, pedestrians and cyclists per scene.
            moving_share: Default generator: share of the objects that move (at their class's speeds).
            meet_ego: Default generator: place every moving object near the ego at a random time of the scene (true),
                or anywhere along the ego path at the start (false; moving objects then leave long scenes early).
            image_width: Default generator: camera image width (pixels).
            image_height: Default generator: camera image height (pixels).
            generator_seed: Seed of the default generator.
            seed: Seed of the per-sample random delays in training.
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.version, self.train_split, self.val_split = version, train_split, val_split
        self.delayed, self.val_offset, self.num_sweeps, self.max_points = delayed, val_offset, num_sweeps, max_points
        self.max_lidar_sweeps, self.max_camera_frames = max_lidar_sweeps, max_camera_frames
        self.num_train_scenes, self.num_val_scenes, self.scene_seconds = num_train_scenes, num_val_scenes, scene_seconds
        self.objects_per_scene, self.moving_share, self.meet_ego = objects_per_scene, moving_share, meet_ego
        self.image_width, self.image_height, self.generator_seed, self.seed = image_width, image_height, generator_seed, seed
        if classes is not None and (not classes or [c for c in classes if c not in DETECTION_CLASSES]):
            raise ConfigError(f"data.init_args.classes must be nuScenes detection classes among {DETECTION_CLASSES}, "
                              f"got {classes}")
        if delayed not in ("lidar", "camera", "random"):
            raise ConfigError(f"delayed must be lidar | camera | random, got {delayed!r}")
        if val_offset < 0 or min_distance < 0:
            raise ConfigError(f"val_offset and min_distance must be >= 0, got {val_offset} and {min_distance}")
        default = self.world_classes if root is None else DETECTION_CLASSES
        self.detection_classes = list(classes if classes is not None else default)
        self.min_distance, self.use_valid_flag = min_distance, use_valid_flag
        self.num_classes = len(self.detection_classes)
        self.image_size = (image_height, image_width)
        self.reader: AsyncNuScenes | None = None

    def generate_default(self, out_dir: Path) -> None:
        generate_world(out_dir, WorldConfig(num_train_scenes=self.num_train_scenes, num_val_scenes=self.num_val_scenes,
                                            scene_seconds=self.scene_seconds, objects_per_scene=self.objects_per_scene,
                                            moving_share=self.moving_share, meet_ego=self.meet_ego,
                                            image_width=self.image_width, image_height=self.image_height,
                                            seed=self.generator_seed), self.version)

    def describe(self) -> str:
        return (f"nuScenes {self.version} at {self.path} (splits {self.train_split}/{self.val_split}); "
                f"{self.delayed} delayed, validation offset {self.val_offset} s")

    def setup(self, stage: str | None = None) -> None:
        if self.reader is None:
            self.reader = AsyncNuScenes(self.path, self.version, self.detection_classes, self.min_distance)
            ignored = self.reader.ignored_annotations()
            if ignored:
                from lightning.pytorch.utilities import rank_zero_warn

                rank_zero_warn(f"{self.path}: {sum(ignored.values())} annotations of detection classes outside "
                               f"data.init_args.classes are not trained or evaluated ({ignored}); set classes: null "
                               "to detect all ten")
            self.train_tokens = self.reader.split_samples(self.train_split)
            self.val_tokens = self.reader.split_samples(self.val_split)
            if not self.train_tokens or not self.val_tokens:
                raise DatasetFormatError(self.path / self.version, f"no samples in split {self.train_split!r} or "
                                         f"{self.val_split!r}", "set train_split / val_split to splits of this version")

    def dataset(self, split: str, offset: float | None, delayed: str | None = None) -> AsyncDataset:
        tokens = self.train_tokens if split == "train" else self.val_tokens
        return AsyncDataset(self.reader, tokens, delayed or self.delayed, offset, self.num_sweeps, self.max_points,
                            self.max_lidar_sweeps, self.max_camera_frames, self.seed, self.use_valid_flag)

    def train_dataloader(self):
        from lit_iclr.core.loader import ResumableDataLoader

        return ResumableDataLoader(self.dataset("train", None), batch_size=self.batch_size, shuffle=True, seed=self.seed,
                                   num_workers=self.num_workers)

    def val_dataloader(self):
        # the whole split on every rank under DDP, in batches of the global batch size: the devkit scores all boxes at
        # once (NDS is not a sum of per-rank parts) and the logged losses, normalised per batch, are then one process's
        world = self.trainer.world_size if self.trainer is not None else 1
        data = self.dataset("val", self.val_offset)
        return DataLoader(data, batch_size=self.batch_size * world, sampler=EveryIndexOnEveryRank(len(data)),
                          num_workers=self.num_workers)

    def test_dataloader(self):
        """The validation split again (nuScenes' test split has no public annotations), at the same offset."""
        return self.val_dataloader()
