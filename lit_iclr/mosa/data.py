"""Human motion (+ video) data for MoSA: HumanML3D motion files, alone or with mp4 videos and per-frame labels.

Layout of `root` (and of the generated default):

    new_joints/<id>.npy      (T_m, 22, 3) joints, metres, Y up, floor at y = 0, at `motion_fps` (HumanML3D: 20 fps)
    new_joint_vecs/<id>.npy  optional: HumanML3D's (T_m, 263) features; their last 4 dims are the foot contacts used
    Mean.npy Std.npy         optional: (263,) feature statistics (needed with `motion_features`)
    texts/<id>.txt           caption#word/POS ...#start#end lines (seconds; 0#0: the whole clip)
    train.txt val.txt test.txt
    videos/<id>.mp4          the clip at motion_fps / motion_stride, >= num_frames frames
    videos/<id>.npz          keypoints2d, depth, K, extrinsics, tracks, track_visible (see formats.read_video_labels)

Without `videos/` the folder is HumanML3D alone and only the structure stage trains (`video_stage` is linked into the
model): every caption line is an item on its own (sub-)clip, motion frames int(start * 20) : int(end * 20) as
text-to-motion crops them; a training item is a random window of num_frames * motion_stride motion frames inside it
(so the whole motion is seen over the epochs), an evaluation item each of the non-overlapping windows that tile it;
joints are moved so that the window starts with the root above the origin (x = z = 0; height kept). Foot contacts are
HumanML3D's own (new_joint_vecs[..., -4:]) when the features are there, else the height-and-speed rule of
`skeleton.foot_contacts`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core import BaseDataModule, ConfigError, DatasetFormatError
from lit_iclr.core.loader import EveryIndexOnEveryRank, ResumableDataLoader

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


def motion_contacts(root: Path, cid: str, joints: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(T, 4) float contacts of a motion and its (T, 263) features: HumanML3D's own labels (the features' last 4 dims,
    feet_l then feet_r: left ankle, left foot, right ankle, right foot) when new_joint_vecs/<id>.npy exists, else the
    height-and-speed rule (`skeleton.foot_contacts`, the generated default)."""
    path = root / "new_joint_vecs" / f"{cid}.npy"
    if not path.exists():
        return foot_contacts(joints).astype(np.float32), None
    vecs = formats.read_joint_vecs(path, len(joints))
    return (vecs[:, -4:] > 0.5).astype(np.float32), vecs


def load_clip(root: Path, cid: str, num_frames: int, motion_stride: int, tokenizer: formats.WordTokenizer) -> dict:
    """One clip as arrays: joints, captions (token ids), video frames and labels, all checked (its first num_frames
    video frames, the motion frames under them)."""
    full = formats.read_joints(root / "new_joints" / f"{cid}.npy", num_frames * motion_stride)
    contacts = motion_contacts(root, cid, full)[0][::motion_stride][:num_frames]
    joints = full[::motion_stride][:num_frames]
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
    return {"joints3d": joints, "contacts": contacts, "text_ids": np.stack(ids),
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


def load_motion(root: Path, cid: str, tokenizer: formats.WordTokenizer, stats: tuple[np.ndarray, np.ndarray] | None
                ) -> dict:
    """One HumanML3D motion, whole: joints (T, 22, 3), contacts (T, 4), its caption lines with their frame ranges and
    token ids, and (with `stats`) the features normalised by Mean / Std, float16."""
    joints = formats.read_joints(root / "new_joints" / f"{cid}.npy")
    contacts, vecs = motion_contacts(root, cid, joints)
    texts = formats.read_texts(root / "texts" / f"{cid}.txt")
    out = {"id": cid, "joints3d": joints, "contacts": contacts,
           "captions": [(c, *tokenizer(c), *formats.caption_frames(a, b, len(joints))) for c, _, a, b in texts]}
    if stats is not None:
        if vecs is None:
            raise DatasetFormatError(root / "new_joint_vecs" / f"{cid}.npy", "feature file missing",
                                     "motion_features needs HumanML3D's new_joint_vecs/<id>.npy for every clip")
        out["vecs"] = ((vecs - stats[0]) / stats[1]).astype(np.float16)
    return out


def item_rng(epoch: int, index: int) -> np.random.Generator:
    """The random choices of training item `index` in `epoch` (window, paraphrase): a function of (the run's seed, epoch,
    index) only, not of the process's RNG, which differs between DDP ranks and between a DDP run and one process (so
    a sample got another paraphrase on each), nor of how items are batched or resumed."""
    return np.random.default_rng([int(os.environ.get("PL_GLOBAL_SEED", 0)), epoch, index])


class MotionDataset(Dataset):
    """HumanML3D alone: items are caption lines on their (sub-)clips, a random window of `window` motion frames when
    training, else every non-overlapping window; frames subsampled by `stride`, the window's first root at x = z = 0."""

    def __init__(self, motions: list[dict], window: int, stride: int, train: bool):
        self.motions, self.window, self.stride, self.train = motions, window, stride, train
        self.epoch = 0  # set by the module each training epoch: new random windows every epoch (`item_rng`)
        self.items: list[tuple[int, int, int, int]] = []  # (motion, caption, first frame, last start)
        self.skipped = 0
        for m, mo in enumerate(motions):
            for k, (*_, a, b) in enumerate(mo["captions"]):
                if b - a < window:
                    self.skipped += 1  # text-to-motion also drops sub-clips shorter than its minimum
                elif train:
                    self.items.append((m, k, a, b - window))
                else:
                    self.items.extend((m, k, s, s) for s in range(a, b - window + 1, window))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        m, k, lo, hi = self.items[i]
        mo = self.motions[m]
        s = int(item_rng(self.epoch, i).integers(lo, hi + 1)) if hi > lo else lo
        frames = slice(s, s + self.window, self.stride)
        joints = mo["joints3d"][frames].copy()
        joints[..., [0, 2]] -= mo["joints3d"][s, 0, [0, 2]]  # root of the window's first frame above the origin
        _, ids, mask, *_ = mo["captions"][k]
        out = {"joints3d": torch.from_numpy(joints), "contacts": torch.from_numpy(mo["contacts"][frames].copy()),
               "text_ids": torch.from_numpy(ids), "text_mask": torch.from_numpy(mask)}
        if "vecs" in mo:
            out["motion_vecs"] = torch.from_numpy(mo["vecs"][frames].astype(np.float32))
        return out


class MotionVideoDataset(Dataset):
    """Clips held in memory (tiny videos); a training item takes a random paraphrase, an evaluation item the first."""

    def __init__(self, clips: list[dict], train: bool):
        self.clips, self.train = clips, train
        self.epoch = 0  # set by the module each training epoch: new random paraphrases every epoch (`item_rng`)

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int) -> dict:
        c = self.clips[i]
        k = int(item_rng(self.epoch, i).integers(len(c["text_ids"]))) if self.train else 0
        out = {k2: torch.as_tensor(v) for k2, v in c.items() if k2 not in ("text_ids", "text_mask", "caption", "video")}
        out["video"] = torch.as_tensor(c["video"]).permute(0, 3, 1, 2).float() / 127.5 - 1  # (T, 3, H, W) in [-1, 1]
        out["text_ids"], out["text_mask"] = torch.as_tensor(c["text_ids"][k]), torch.as_tensor(c["text_mask"][k])
        out["track_visible"] = out["track_visible"].float()
        if "maps" in out:
            out["maps"] = out["maps"].float()
        return out


class HumanMotionVideo(BaseDataModule):
    """HumanML3D motion + mp4 human videos with 2-D keypoints, cameras and dense tracks (default: generated), or
    HumanML3D alone (no videos/ folder: the structure stage only)."""

    default_name = "mosa-humanml3d-video"
    default_version = 1
    content_options = ("num_clips", "num_frames", "image_size", "generator_seed", "motion_stride", "actions", "scene")
    model_links = {"vocab_size": "vocab_size", "num_frames": "num_frames", "model_image_size": "image_size",
                   "video_stage": "video_stage"}

    @property
    def model_image_size(self):
        """`image_size` as linked into the model: a source name of its own, so that DataModules with an `image_size` of
        their own whose model takes none (IB-CBM's) are not linked (the links are declared for every DataModule)."""
        return self.image_size

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 16, num_workers: int = 0,
                 num_clips: int = 600, num_frames: int = 8, image_size: int = 32, motion_stride: int = 2,
                 vocab_size: int = 128, max_words: int = 12, generator_seed: int = 0,
                 actions: tuple[str, ...] = ACTIONS, scene: Literal["room", "plain"] = "room",
                 motion_features: bool = False):
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
            motion_features: HumanML3D alone: also give each window's new_joint_vecs normalised by Mean.npy / Std.npy
                (`motion_vecs`, (num_frames, 263)), the space HumanML3D's text-to-motion evaluators work in.
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.num_clips, self.num_frames, self.image_size = num_clips, num_frames, image_size
        self.motion_stride, self.vocab_size, self.generator_seed = motion_stride, vocab_size, generator_seed
        self.actions, self.scene = tuple(actions), scene
        self.tokenizer = formats.WordTokenizer(sorted(VOCAB), vocab_size, max_words)
        self.motion_features = motion_features
        # HumanML3D alone (no videos/): the structure stage only; the generated default always has videos
        # (a root that is not here, e.g. a cluster path under `cli.py plan`, is taken to hold videos/; prepare_data says it
        # is missing)
        here = root is not None and Path(root).expanduser().exists()
        self.video_stage = not here or (Path(root).expanduser() / "videos").is_dir()
        if motion_features and self.video_stage:
            raise ConfigError("data.motion_features is for HumanML3D alone (a root without videos/)")
        self.splits: dict[str, Dataset] = {}

    def generate_default(self, out_dir: Path) -> None:
        generate(out_dir, self.num_clips, self.num_frames, self.image_size, self.generator_seed, self.motion_stride,
                 actions=self.actions, scene=self.scene)

    def describe(self) -> str:
        if not self.video_stage:
            return (f"HumanMotionVideo: {self.path} (HumanML3D alone: new_joints, new_joint_vecs contacts, texts with "
                    f"sub-clip times; windows of {self.num_frames} frames every {self.motion_stride} motion frames)")
        return (f"HumanMotionVideo: {self.path} (HumanML3D new_joints/texts + videos/<id>.mp4 with keypoints and tracks; "
                f"{self.num_frames} frames at {self.image_size} px)")

    def read_motion_split(self, split: str) -> MotionDataset:
        ids = formats.read_split(self.path, split)
        stats = formats.read_mean_std(self.path) if self.motion_features else None
        data = MotionDataset([load_motion(self.path, cid, self.tokenizer, stats) for cid in ids],
                             self.num_frames * self.motion_stride, self.motion_stride, train=split == "train")
        if not len(data):
            raise DatasetFormatError(self.path / f"{split}.txt", f"no caption (sub-)clip of its {len(ids)} motions spans "
                                     f"{data.window} motion frames", "lower data.init_args.num_frames or motion_stride")
        if data.skipped:
            rank_zero_info(f"{split}: {data.skipped} caption lines on (sub-)clips shorter than {data.window} frames left out")
        return data

    def read_split(self, split: str) -> Dataset:
        if not self.video_stage:
            return self.read_motion_split(split)
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
                if self.video_stage:
                    add_structure_maps(self.splits[split].clips, self.image_size)


    def train_dataloader(self):
        return ResumableDataLoader(self.splits["train"], self.batch_size, shuffle=True, num_workers=self.num_workers,
                                   drop_last=len(self.splits["train"]) > self.batch_size)

    def _eval_loader(self, split: str) -> DataLoader:
        # the whole split on every rank under DDP, in batches of the global batch size: KID and the other video metrics
        # compare sets of samples (halves of the clips), not sums a rank could contribute its share of, and the noise
        # of a batch (seeded by its index) is then one process's, so every rank logs one process's metrics
        world = self.trainer.world_size if self.trainer is not None else 1
        data = self.splits[split]
        return DataLoader(data, self.batch_size * world, sampler=EveryIndexOnEveryRank(len(data)),
                          num_workers=self.num_workers)

    def val_dataloader(self):
        return self._eval_loader("val")

    def test_dataloader(self):
        return self._eval_loader("test")
