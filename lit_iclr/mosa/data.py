"""Paired human motion + video data for MoSA: HumanML3D motion files and mp4 videos with per-frame labels.

Layout of `root` (and of the generated default):

    new_joints/<id>.npy   (T_m, 22, 3) joints, metres, Y up, at `motion_fps` (HumanML3D: 20 fps)
    texts/<id>.txt        caption#word/POS ...#start#end lines
    train.txt val.txt test.txt
    videos/<id>.mp4       the clip at motion_fps / motion_stride, >= num_frames frames
    videos/<id>.npz       keypoints2d, depth, K, extrinsics, tracks, track_visible (see formats.read_video_labels)
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core import BaseDataModule, ConfigError, DatasetFormatError
from lit_iclr.core.loader import ResumableDataLoader

from . import formats
from .maps import control_maps, project
from .render import render_clip
from .skeleton import ACTIONS, DIRECTIONS, SPEEDS, SUBJECTS, VERB, caption, foot_contacts, sample_motion

VOCAB = sorted({w for s in SUBJECTS for w in s.split()} | {w for v in VERB.values() for p in v for w in p.split()}
               | {w for d in DIRECTIONS for w in d.split()} | set(SPEEDS) - {""}
               | {"with", "the", "left", "right", "hand", "hands", "leg", "both", "to"})


def generate(out: Path, num_clips: int, num_frames: int, image_size: int, seed: int, motion_stride: int = 2,
             motion_fps: int = 20, actions: tuple[str, ...] = ACTIONS, scene: str = "room") -> None:
    """Write `num_clips` procedural motions with captions and their rendered videos in the layout above."""
    bad = set(actions) - set(ACTIONS)
    if bad or not actions:
        raise ConfigError(f"data.actions {sorted(bad) or '[]'}: choose a non-empty subset of {list(ACTIONS)}")
    rng = np.random.default_rng(seed)
    for d in ("new_joints", "texts", "videos"):
        (out / d).mkdir(parents=True, exist_ok=True)
    ids = [f"{i:06d}" for i in range(num_clips)]
    for cid in ids:
        joints, cap, action, style = sample_motion(rng, num_frames * motion_stride, motion_fps,
                                                   actions[rng.integers(len(actions))])
        np.save(out / "new_joints" / f"{cid}.npy", joints)
        paraphrases = [cap] + [caption(action, style["adverb"], style["direction"], style, rng) for _ in range(2)]
        formats.write_texts(out / "texts" / f"{cid}.txt", paraphrases)
        clip = render_clip(joints[::motion_stride], rng, image_size, motion_fps / motion_stride, scene)
        formats.write_mp4(out / "videos" / f"{cid}.mp4", clip.pop("video"), motion_fps // motion_stride)
        np.savez(out / "videos" / f"{cid}.npz", action=np.array(action), **clip)
    n_val = n_test = max(1, num_clips // 10)
    splits = {"train": ids[: num_clips - n_val - n_test], "val": ids[num_clips - n_val - n_test: num_clips - n_test],
              "test": ids[num_clips - n_test:]}
    for name, part in splits.items():
        (out / f"{name}.txt").write_text("\n".join(part) + "\n")


def load_clip(root: Path, cid: str, num_frames: int, motion_stride: int, tokenizer: formats.WordTokenizer) -> dict:
    """One clip as arrays: joints, captions (token ids), video frames and labels, all checked."""
    joints = formats.read_joints(root / "new_joints" / f"{cid}.npy", num_frames * motion_stride)[::motion_stride][:num_frames]
    texts = formats.read_texts(root / "texts" / f"{cid}.txt")
    video = formats.read_mp4(root / "videos" / f"{cid}.mp4")
    if len(video) < num_frames:
        raise DatasetFormatError(root / "videos" / f"{cid}.mp4", f"{len(video)} frames, need {num_frames}",
                                 "lower data.num_frames or drop the clip")
    labels = formats.read_video_labels(root / "videos" / f"{cid}.npz", len(video))
    with np.load(root / "videos" / f"{cid}.npz", allow_pickle=False) as z:
        action = str(z["action"]) if "action" in z else ""
    ids, mask = zip(*(tokenizer(c) for c, *_ in texts), strict=True)
    T = num_frames
    return {"joints3d": joints, "contacts": foot_contacts(joints).astype(np.float32), "text_ids": np.stack(ids),
            "text_mask": np.stack(mask), "video": video[:T], "keypoints2d": labels["keypoints2d"][:T],
            "depth": labels["depth"][:T], "K": labels["K"], "extrinsics": labels["extrinsics"][:T],
            "tracks": labels["tracks"][:, :T], "track_visible": labels["track_visible"][:T],
            "action": ACTIONS.index(action) if action in ACTIONS else -1, "caption": texts[0][0]}


@torch.no_grad()
def add_structure_maps(clips: list[dict], size: int, chunk: int = 32) -> None:
    """Ground-truth structure maps (T, 6, H, W) float16 per clip, computed once: the video stage is trained on them
    (teacher forcing); the 2-D baseline uses the 5 limb channels (the projection of joints3d is keypoints2d)."""
    for i in range(0, len(clips), chunk):
        part = clips[i: i + chunk]
        joints = torch.as_tensor(np.stack([c["joints3d"] for c in part]))
        uv, z = project(joints, torch.as_tensor(np.stack([c["K"] for c in part])),
                        torch.as_tensor(np.stack([c["extrinsics"] for c in part])))
        maps = control_maps(uv, size, z).half().numpy()
        for c, m in zip(part, maps, strict=True):
            c["maps"] = m


class MotionVideoDataset(Dataset):
    """Clips held in memory (tiny videos); a training item takes a random paraphrase, an evaluation item the first."""

    def __init__(self, clips: list[dict], train: bool):
        self.clips, self.train = clips, train

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int) -> dict:
        c = self.clips[i]
        k = int(torch.randint(len(c["text_ids"]), ())) if self.train else 0
        out = {k2: torch.as_tensor(v) for k2, v in c.items() if k2 not in ("text_ids", "text_mask", "caption", "video")}
        out["video"] = torch.as_tensor(c["video"]).permute(0, 3, 1, 2).float() / 127.5 - 1  # (T, 3, H, W) in [-1, 1]
        out["text_ids"], out["text_mask"] = torch.as_tensor(c["text_ids"][k]), torch.as_tensor(c["text_mask"][k])
        out["track_visible"] = out["track_visible"].float()
        if "maps" in out:
            out["maps"] = out["maps"].float()
        return out


class HumanMotionVideo(BaseDataModule):
    """HumanML3D motion + mp4 human videos with 2-D keypoints, cameras and dense tracks (default: generated)."""

    default_name = "mosa-humanml3d-video"
    default_version = 1
    content_options = ("num_clips", "num_frames", "image_size", "generator_seed", "motion_stride", "actions", "scene")
    model_links = {"vocab_size": "vocab_size", "num_frames": "num_frames", "model_image_size": "image_size"}

    @property
    def model_image_size(self):
        """`image_size` as linked into the model: a source name of its own, so that DataModules with an `image_size` of
        their own whose model takes none (IB-CBM's) are not linked (the links are declared for every DataModule)."""
        return self.image_size

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 16, num_workers: int = 0,
                 num_clips: int = 600, num_frames: int = 8, image_size: int = 32, motion_stride: int = 2,
                 vocab_size: int = 128, max_words: int = 12, generator_seed: int = 0,
                 actions: tuple[str, ...] = ACTIONS, scene: Literal["room", "plain"] = "room"):
        """
        Args:
            root: Folder in the layout of this module's docstring; null generates the default into `data_dir`.
            data_dir: Cache folder of the generated default.
            batch_size: Clips per batch.
            num_workers: DataLoader workers.
            num_clips: Clips of the generated default (80/10/10 train/val/test).
            num_frames: Video and structure frames per clip.
            image_size: Frame height = width in pixels (must match the videos).
            motion_stride: Motion frames per video frame (HumanML3D 20 fps -> 10 fps video with 2).
            vocab_size: Word ids: the default vocabulary, then hash buckets for other words.
            max_words: Caption length in tokens (with the start token).
            generator_seed: Seed of the default generator.
            actions: Actions the default generator draws from (a subset of skeleton.ACTIONS).
            scene: Look of the generated default: `room` (random clothing, wall and checkered floor, moving camera) or
                `plain` (fixed clothing on a grey backdrop, still camera).
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.num_clips, self.num_frames, self.image_size = num_clips, num_frames, image_size
        self.motion_stride, self.vocab_size, self.generator_seed = motion_stride, vocab_size, generator_seed
        self.actions, self.scene = tuple(actions), scene
        self.tokenizer = formats.WordTokenizer(sorted(VOCAB), vocab_size, max_words)
        self.splits: dict[str, MotionVideoDataset] = {}

    def generate_default(self, out_dir: Path) -> None:
        generate(out_dir, self.num_clips, self.num_frames, self.image_size, self.generator_seed, self.motion_stride,
                 actions=self.actions, scene=self.scene)

    def describe(self) -> str:
        return (f"HumanMotionVideo: {self.path} (HumanML3D new_joints/texts + videos/<id>.mp4 with keypoints and tracks; "
                f"{self.num_frames} frames at {self.image_size} px)")

    def read_split(self, split: str) -> MotionVideoDataset:
        clips = [load_clip(self.path, cid, self.num_frames, self.motion_stride, self.tokenizer)
                 for cid in formats.read_split(self.path, split)]
        size = clips[0]["video"].shape[1:3]
        if size != (self.image_size, self.image_size):
            raise DatasetFormatError(self.path / "videos", f"frames are {size[0]}x{size[1]}, config says {self.image_size}",
                                     "set data.init_args.image_size to the videos' size")
        return MotionVideoDataset(clips, train=split == "train")

    def setup(self, stage: str | None = None) -> None:
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}.get(stage or "fit", ("train", "val", "test"))
        for split in wanted:
            if split not in self.splits:
                self.splits[split] = self.read_split(split)
                add_structure_maps(self.splits[split].clips, self.image_size)


    def train_dataloader(self):
        return ResumableDataLoader(self.splits["train"], self.batch_size, shuffle=True, num_workers=self.num_workers,
                                   drop_last=len(self.splits["train"]) > self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.splits["val"], self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self):
        return DataLoader(self.splits["test"], self.batch_size, num_workers=self.num_workers)
