"""Readers and writers of the field's formats: HumanML3D motion (`new_joints/<id>.npy`, `new_joint_vecs/<id>.npy` with
`Mean.npy`/`Std.npy`, `texts/<id>.txt`, split files) and human videos (`<id>.mp4` through PyAV with a `<id>.npz` of
per-frame 2-D keypoints, cameras and dense tracks).

Every reader checks what it reads and raises `DatasetFormatError(path, problem, fix)` instead of training on bad data.
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from lit_iclr.core import DatasetFormatError, DatasetNotFoundError

from .skeleton import NUM_JOINTS

VEC_DIM = 263  # HumanML3D's motion features: root (4), ric (63), rot (126), local velocity (66), foot contacts (4)
FPS = 20  # HumanML3D's frame rate: caption start/end seconds * 20 are motion frames (text-to-motion's crop)
VIDEO_KEYS = ("keypoints2d", "depth", "K", "extrinsics", "tracks", "track_visible")
POS = {"a": "DET", "the": "DET", "with": "ADP", "to": "ADP", "from": "ADP", "toward": "ADP", "away": "ADV",
       "slowly": "ADV", "quickly": "ADV", "around": "ADV", "up": "ADV", "both": "DET"}


def read_joints(path: Path, min_frames: int = 1) -> np.ndarray:
    """`new_joints/<id>.npy`: float (T, 22, 3) joint positions in metres, finite, at least `min_frames` long."""
    if not path.exists():
        raise DatasetNotFoundError(path, "motion file missing",
                                   "every id of the split files needs new_joints/<id>.npy (HumanML3D's layout)")
    try:
        j = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise DatasetFormatError(path, f"not a plain .npy array ({e})", "save joints with numpy.save as float32") from None
    if j.ndim != 3 or j.shape[1:] != (NUM_JOINTS, 3):
        raise DatasetFormatError(path, f"joint array has shape {j.shape}, expected (T, {NUM_JOINTS}, 3)",
                                 "use HumanML3D's new_joints (22-joint SMPL layout), not new_joint_vecs (263-d features)")
    if len(j) < min_frames:
        raise DatasetFormatError(path, f"{len(j)} frames, need at least {min_frames}", "lower data.num_frames or drop the clip")
    if not np.isfinite(j).all():
        raise DatasetFormatError(path, "joint array holds NaN or inf", "re-export the motion")
    return j.astype(np.float32)


def read_joint_vecs(path: Path, n_frames: int) -> np.ndarray:
    """`new_joint_vecs/<id>.npy`: float (T, 263) features of the same T frames as new_joints (HumanML3D writes both from
    one pass), finite; the last 4 dims are its foot contacts (left ankle, left foot, right ankle, right foot)."""
    try:
        v = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise DatasetFormatError(path, f"not a plain .npy array ({e})", "re-run HumanML3D's motion_representation step") from None
    if v.ndim != 2 or v.shape[1] != VEC_DIM:
        raise DatasetFormatError(path, f"feature array has shape {v.shape}, expected (T, {VEC_DIM})",
                                 "use HumanML3D's new_joint_vecs (263-d features), not new_joints")
    if len(v) != n_frames:
        raise DatasetFormatError(path, f"{len(v)} frames but new_joints has {n_frames}",
                                 "use new_joints and new_joint_vecs of the same HumanML3D release")
    if not np.isfinite(v).all():
        raise DatasetFormatError(path, "feature array holds NaN or inf", "re-run HumanML3D's motion_representation step")
    return v.astype(np.float32)


def read_mean_std(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """HumanML3D's `Mean.npy` / `Std.npy` (263,) of new_joint_vecs; Std must be > 0 (features are divided by it)."""
    out = []
    for name in ("Mean.npy", "Std.npy"):
        path = root / name
        if not path.exists():
            raise DatasetNotFoundError(path, f"{name} missing", "copy HumanML3D's Mean.npy and Std.npy next to new_joint_vecs/")
        a = np.load(path, allow_pickle=False)
        if a.shape != (VEC_DIM,) or not np.isfinite(a).all():
            raise DatasetFormatError(path, f"shape {a.shape} or non-finite values, expected ({VEC_DIM},) finite",
                                     "use HumanML3D's own Mean.npy / Std.npy")
        out.append(a.astype(np.float32))
    if (out[1] <= 0).any():
        raise DatasetFormatError(root / "Std.npy", f"{int((out[1] <= 0).sum())} dims have Std <= 0",
                                 "use HumanML3D's own Std.npy (every dim > 0)")
    return out[0], out[1]


def caption_frames(start: float, end: float, n_frames: int) -> tuple[int, int]:
    """Motion frames [a, b) of a caption line: the whole clip for 0#0, else int(start * 20) : int(end * 20) clipped to
    the motion (text-to-motion's crop; HumanML3D's texts also hold `nan` times, read as 0)."""
    if start == 0.0 and end == 0.0:
        return 0, n_frames
    return min(int(start * FPS), n_frames), min(int(end * FPS), n_frames)


def read_texts(path: Path) -> list[tuple[str, list[str], float, float]]:
    """`texts/<id>.txt`: lines `caption#word/POS ...#start#end` (seconds; 0#0 means the whole clip; nan reads as 0)."""
    if not path.exists():
        raise DatasetNotFoundError(path, "caption file missing", "every id of the split files needs texts/<id>.txt")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("#")
        if len(parts) != 4:
            raise DatasetFormatError(path, f"line {n} has {len(parts)} '#'-fields, expected caption#tokens#start#end",
                                     "write HumanML3D caption lines with their timing, e.g. 'a man walks.#a/DET ...#0.0#0.0'")
        try:
            start, end = float(parts[2]), float(parts[3])
        except ValueError:
            raise DatasetFormatError(path, f"line {n}: start/end {parts[2]!r}, {parts[3]!r} are not numbers",
                                     "use seconds, 0.0#0.0 for the whole clip") from None
        start, end = (0.0 if np.isnan(x) else x for x in (start, end))  # as text-to-motion's loader
        out.append((parts[0].strip(), parts[1].split(), start, end))
    if not out:
        raise DatasetFormatError(path, "no caption lines", "write at least one caption#tokens#start#end line")
    return out


def read_split(root: Path, split: str) -> list[str]:
    path = root / f"{split}.txt"
    if not path.exists():
        raise DatasetNotFoundError(path, f"split file {split}.txt missing", "list one clip id per line (HumanML3D layout)")
    ids = [x.strip() for x in path.read_text().splitlines() if x.strip()]
    if not ids:
        raise DatasetFormatError(path, "split file is empty", "list one clip id per line")
    return ids


def write_texts(path: Path, captions: list[str]) -> None:
    lines = []
    for c in captions:
        tokens = " ".join(f"{w}/{POS.get(w, 'VERB' if w.endswith('s') else 'NOUN')}" for w in c.split())
        lines.append(f"{c}#{tokens}#0.0#0.0")
    path.write_text("\n".join(lines) + "\n")


def write_mp4(path: Path, frames: np.ndarray, fps: int) -> None:
    """H.264 in MP4, 4:4:4 chroma (tiny frames would lose their colours at 4:2:0), near-lossless crf."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv444p"
        stream.options = {"crf": "4", "preset": "ultrafast"}
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def read_mp4(path: Path) -> np.ndarray:
    """(T, H, W, 3) uint8 RGB frames of a video file, or a clear error when it cannot be decoded."""
    import av

    if not path.exists():
        raise DatasetNotFoundError(path, "video missing", "every clip id needs videos/<id>.mp4 and videos/<id>.npz; without "
                                   "a videos/ folder the root is read as HumanML3D alone (the structure stage)")
    try:
        with av.open(str(path)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        raise DatasetFormatError(path, f"unreadable video ({type(e).__name__}: {e})",
                                 "re-encode it, e.g. ffmpeg -i in -c:v libx264 out.mp4") from None
    if not frames:
        raise DatasetFormatError(path, "video has no frames", "re-encode it")
    return np.stack(frames)


def read_video_labels(path: Path, n_frames: int) -> dict[str, np.ndarray]:
    """`<id>.npz`: keypoints2d (T, 22, 2) px, depth (T, 22), K (3, 3), extrinsics (T, 3, 4), tracks (N, T, 2),
    track_visible (T, N); each checked for presence, shape and finiteness."""
    if not path.exists():
        raise DatasetNotFoundError(path, "per-frame labels missing", "write <id>.npz next to <id>.mp4")
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in VIDEO_KEYS if k not in z]
        if missing:
            raise DatasetFormatError(path, f"missing arrays {missing}", f"the npz needs {list(VIDEO_KEYS)}")
        d = {k: z[k] for k in VIDEO_KEYS}
    T = n_frames
    shapes = {"keypoints2d": (T, NUM_JOINTS, 2), "depth": (T, NUM_JOINTS), "K": (3, 3), "extrinsics": (T, 3, 4)}
    for k, s in shapes.items():
        if d[k].shape != s:
            raise DatasetFormatError(path, f"{k} has shape {d[k].shape}, expected {s} (video has {T} frames)",
                                     "write one label per video frame")
    if d["tracks"].ndim != 3 or d["tracks"].shape[1:] != (T, 2) or d["track_visible"].shape != (T, len(d["tracks"])):
        raise DatasetFormatError(path, f"tracks {d['tracks'].shape} / track_visible {d['track_visible'].shape} do not "
                                 f"match (N, {T}, 2) / ({T}, N)", "store tracks as (points, frames, xy)")
    for k in ("keypoints2d", "depth", "K", "extrinsics", "tracks"):
        if not np.isfinite(d[k]).all():
            raise DatasetFormatError(path, f"{k} holds NaN or inf", "mark untracked points with track_visible = False")
    return d


class WordTokenizer:
    """Lower-case words to ids: a fixed vocabulary first, then crc32 hash buckets, so `vocab_size` is known without data."""

    def __init__(self, vocab: list[str], vocab_size: int, max_len: int):
        if vocab_size <= len(vocab) + 2:
            raise ValueError(f"vocab_size {vocab_size} must exceed the {len(vocab) + 2} fixed words")
        self.index = {w: i + 2 for i, w in enumerate(vocab)}  # 0 pad, 1 unknown-free start token
        self.vocab_size, self.max_len = vocab_size, max_len

    def word_id(self, w: str) -> int:
        if w in self.index:
            return self.index[w]
        n = len(self.index) + 2
        return n + zlib.crc32(w.encode()) % (self.vocab_size - n)

    def __call__(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        words = [w for w in "".join(c if c.isalnum() else " " for c in text.lower()).split()][: self.max_len - 1]
        ids = np.zeros(self.max_len, dtype=np.int64)
        ids[0] = 1
        ids[1: len(words) + 1] = [self.word_id(w) for w in words]
        return ids, ids > 0
