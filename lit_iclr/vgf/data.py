"""Offline RL data for VGF: the DataModules around the OGBench `.npz` and D4RL `.hdf5` readers of `core.offline_rl`.

The readers return the transition dict documented there (observations, actions, rewards, next_observations, masks;
`masks` = 1 - true termination, time-limit ends are not terminations), and the DataModules batch the same keys.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader

from lit_iclr.core import BaseDataModule, ConfigError, DatasetFormatError
from lit_iclr.core.loader import EveryIndexOnEveryRank, IndexDataset
from lit_iclr.core.offline_rl import (
    KEYS,
    check_reference_scores,
    episode_return_range,
    minari_data_dir,
    read_d4rl_hdf5,
    read_minari,
    read_ogbench_npz,
    single_hdf5,
)

from .envs import make_env

__all__ = ["KEYS", "D4RLData", "OGBenchData", "OfflineRLData", "TransitionLoader", "read_d4rl_hdf5", "read_ogbench_npz"]


# ---------------------------------------------------------------------------------------------------------- loaders
def _batch_seed(*parts: int) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


def check_updates_per_batch(n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"data.updates_per_batch must be a positive integer, got {n!r}: set "
                          "data.init_args.updates_per_batch to 1 (one gradient step per Trainer batch) or more")


class TransitionLoader:
    """`steps_per_epoch` uniform random minibatches (with replacement) per epoch, as offline RL samples them.

    The k-th minibatch of a run is drawn from a generator seeded by (seed, k), where k counts the gradient steps
    already taken: `position()` (the model's `updates` counter, restored from checkpoints) is read when an epoch's
    iteration starts. A run resumed from any checkpoint, mid-epoch included, therefore sees the very same stream, with
    no loader state to save (Lightning's one-batch pre-fetch cannot shift it). Under DDP (`world` processes) the draw
    is the global minibatch of `batch_size * world` rows and rank r keeps rows r, r + world, ...

    With `updates_per_batch` n > 1 each item is a list of the next n minibatches of the same stream (the module takes
    one gradient step per minibatch, so the numbers do not change), and the Trainer's fixed per-batch cost is paid
    once per n updates.
    """

    def __init__(self, data: dict[str, torch.Tensor], batch_size: int, steps_per_epoch: int, seed: int = 0,
                 rank: int = 0, position: Callable[[], int] | None = None, updates_per_batch: int = 1,
                 world: int = 1):
        check_updates_per_batch(updates_per_batch)
        self.data, self.batch_size, self.steps_per_epoch = data, batch_size, steps_per_epoch
        self.seed, self.rank, self.world, self.updates_per_batch = seed, rank, world, updates_per_batch
        self.size = len(next(iter(data.values())))
        self._own = 0
        self.position = position or (lambda: self._own)
        self._generator = torch.Generator()  # reseeded per minibatch: no new generator per step

    def __len__(self) -> int:
        return -(-self.steps_per_epoch // self.updates_per_batch)

    def batch(self, k: int) -> dict[str, torch.Tensor]:
        """The k-th minibatch of the stream."""
        g = self._generator.manual_seed(_batch_seed(self.seed, 0, k))
        # under DDP the k-th global minibatch (batch_size x world rows) is drawn on every rank and dealt out: rows
        # rank, rank + world, ... (the module draws its noise likewise), so the ranks together train on what one
        # process with the global batch would
        idx = torch.randint(self.size, (self.batch_size * self.world,), generator=g)[self.rank::self.world]
        return {key: v[idx] for key, v in self.data.items()}

    def __iter__(self):
        k = int(self.position())
        left = self.steps_per_epoch - k % self.steps_per_epoch  # a resumed epoch runs its remaining steps
        n = self.updates_per_batch
        for i in range(0, left, n):
            steps = range(k + i, k + min(i + n, left))
            self._own = steps[-1] + 1
            yield self.batch(steps[0]) if n == 1 else [self.batch(j) for j in steps]

    # Lightning treats a loader with this interface as resumable; the position lives in the model, so nothing to keep.
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


# ------------------------------------------------------------------------------------------------------ datamodules
class OfflineRLData(BaseDataModule):
    """Common part of the OGBench and D4RL DataModules: transitions for training, environment episodes for evaluation.

    Subclasses set `env_id` and the sizes in `__init__`, and implement `read()` and `generate_default()`.
    """

    model_links: ClassVar[dict[str, str]] = {"obs_dim": "obs_dim", "action_dim": "action_dim"}

    def __init__(self, root: str | None = None, data_dir: str = "data", batch_size: int = 256, num_workers: int = 0,
                 steps_per_epoch: int = 1000, eval_episodes: int = 10, eval_seed: int = 10_000, seed: int = 0,
                 reward_scale: float = 1.0, reward_shift: float = 0.0, updates_per_batch: int = 1):
        """
        Args:
            root: Real data (see the subclass); null generates the default dataset into `data_dir`.
            data_dir: Cache folder of generated datasets.
            batch_size: Transitions per gradient step (per device).
            num_workers: Unused (batches are sliced from in-memory tensors); kept for the common interface.
            steps_per_epoch: Gradient steps per epoch; evaluation runs every `check_val_every_n_epoch` epochs.
            eval_episodes: Environment episodes per evaluation (per evaluation budget L).
            eval_seed: Seed of the first evaluation episode (episode i resets with eval_seed + i).
            seed: Seed of the minibatch stream (each rank adds its rank).
            reward_scale: Rewards are used as reward_scale * r + reward_shift.
            reward_shift: See `reward_scale`.
            updates_per_batch: Gradient steps per Trainer batch (each on its own minibatch of the same stream): the
                Trainer's fixed per-batch cost is paid once per this many updates. Progress, the loggers' step axis,
                `log_every_n_steps` and `max_steps` then count in blocks of this many updates; the numbers do not
                change.
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        self.steps_per_epoch = steps_per_epoch
        self.eval_episodes = eval_episodes
        self.eval_seed = eval_seed
        self.seed = seed
        self.reward_scale = reward_scale
        self.reward_shift = reward_shift
        check_updates_per_batch(updates_per_batch)  # at construction, before any data is read or generated
        self.updates_per_batch = updates_per_batch
        self.env_id = ""
        self.obs_dim = 0
        self.action_dim = 0
        self.transitions: dict[str, torch.Tensor] | None = None

    def _sizes_from_env(self) -> None:
        env = make_env(self.env_id)
        self.obs_dim = int(np.prod(env.observation_space.shape))
        self.action_dim = int(np.prod(env.action_space.shape))
        env.close()

    def make_env(self):
        """A fresh evaluation environment."""
        return make_env(self.env_id)

    def read(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def score(self, returns: np.ndarray, successes: np.ndarray) -> np.ndarray:
        """The task's headline number per episode (success in % for OGBench, normalised return for D4RL)."""
        return 100.0 * successes

    def setup(self, stage: str) -> None:
        if self.transitions is not None:
            return
        data = self.read()
        path = self.data_file
        if data["observations"].shape[1] != self.obs_dim or data["actions"].shape[1] != self.action_dim:
            raise DatasetFormatError(
                path, f"observations/actions have dims {data['observations'].shape[1]}/{data['actions'].shape[1]} but "
                f"{self.env_id} has {self.obs_dim}/{self.action_dim}", "use the dataset that belongs to this environment")
        data["rewards"] = data["rewards"] * self.reward_scale + self.reward_shift
        self.transitions = {k: torch.from_numpy(np.ascontiguousarray(data[k], dtype=np.float32)) for k in KEYS}

    @property
    def data_file(self) -> Path:
        raise NotImplementedError

    def train_dataloader(self) -> TransitionLoader:
        rank = self.trainer.global_rank if self.trainer is not None else 0
        world = self.trainer.world_size if self.trainer is not None else 1
        module = self.trainer.lightning_module if self.trainer is not None else None
        position = (lambda: int(module.updates)) if hasattr(module, "updates") else None  # gradient steps taken
        return TransitionLoader(self.transitions, self.batch_size, self.steps_per_epoch, self.seed, rank, position,
                                self.updates_per_batch, world)

    def val_dataloader(self) -> DataLoader:
        # every episode index on every rank: the module evaluates its rank's share and reduces sums and counts
        return DataLoader(IndexDataset(self.eval_episodes), batch_size=self.eval_episodes,
                          sampler=EveryIndexOnEveryRank(self.eval_episodes))

    def describe(self) -> str:
        n = 0 if self.transitions is None else len(self.transitions["rewards"])
        return (f"{type(self).__name__}: {n} transitions from {self.data_file} (obs {self.obs_dim}, action "
                f"{self.action_dim}); evaluation in {self.env_id}, {self.eval_episodes} episodes per budget")


class OGBenchData(OfflineRLData):
    """An OGBench single-task dataset (`.npz`), evaluated in the OGBench environment of that task.

    The default generates a small `cube-single-play` dataset with OGBench's own scripted oracles (the benchmark's
    procedure at a smaller size, see `generate.py`); `root` points at a folder of real OGBench files
    (`~/.ogbench/data`, from `ogbench.download_datasets`), read by the same reader.
    """

    default_name = "ogbench"
    default_version = 1

    def __init__(self, dataset: str = "cube-single-play-singletask-task2-v0", root: str | None = None,
                 data_dir: str = "data", batch_size: int = 256, num_workers: int = 0, steps_per_epoch: int = 1000,
                 eval_episodes: int = 10, eval_seed: int = 10_000, seed: int = 0, reward_scale: float = 1.0,
                 reward_shift: float = 0.0, num_episodes: int = 100, episode_length: int = 1001,
                 generator_seed: int = 0, updates_per_batch: int = 1):
        """
        Args:
            dataset: OGBench single-task name `<env>-<play|noisy>-singletask[-taskK]-v0`.
            root: Folder holding `<env>-<type>-v0.npz` (OGBench's file name); null generates it.
            data_dir: Cache folder of generated datasets.
            batch_size: Transitions per gradient step (per device).
            num_workers: Unused (batches are sliced from in-memory tensors).
            steps_per_epoch: Gradient steps per epoch.
            eval_episodes: Environment episodes per evaluation budget L.
            eval_seed: Seed of the first evaluation episode.
            seed: Seed of the minibatch stream.
            reward_scale: Rewards are used as reward_scale * r + reward_shift.
            reward_shift: See `reward_scale`.
            num_episodes: Generated training episodes (OGBench uses 1000; one tenth as many go to the -val file).
            episode_length: Steps per generated episode (OGBench: 1001).
            generator_seed: Seed of the generated dataset.
            updates_per_batch: Gradient steps per Trainer batch (see `OfflineRLData`).
        """
        super().__init__(root, data_dir, batch_size, num_workers, steps_per_epoch, eval_episodes, eval_seed, seed,
                         reward_scale, reward_shift, updates_per_batch)
        parts = dataset.split("-")
        if "singletask" not in parts or parts.index("singletask") < 2:
            raise ValueError(f"{dataset!r} is not an OGBench single-task dataset name "
                             "(e.g. cube-single-play-singletask-task2-v0)")
        pos = parts.index("singletask")
        self.dataset = dataset
        self.dataset_type = parts[pos - 1]
        self.env_id = "-".join(parts[: pos - 1] + parts[pos:])  # cube-single-singletask-task2-v0
        self.file_stem = "-".join(parts[:pos] + parts[-1:])  # cube-single-play-v0
        self.generator_env = "-".join(parts[: pos - 1] + parts[-1:])  # cube-single-v0
        self.num_episodes, self.episode_length, self.generator_seed = num_episodes, episode_length, generator_seed
        self._sizes_from_env()

    @property
    def path(self) -> Path:
        if self.root is not None:
            return Path(self.root).expanduser()
        tag = f"{self.file_stem}-e{self.num_episodes}x{self.episode_length}-s{self.generator_seed}"
        return Path(self.data_dir) / f"{self.default_name}-{tag}-v{self.default_version}"

    @property
    def data_file(self) -> Path:
        return self.path / f"{self.file_stem}.npz"

    def generate_default(self, out_dir: Path) -> None:
        from .generate import generate_ogbench_manipulation

        generate_ogbench_manipulation(out_dir, self.generator_env, self.dataset_type, self.num_episodes,
                                      self.episode_length, seed=self.generator_seed)

    def read(self) -> dict[str, np.ndarray]:
        env = make_env(self.env_id)
        try:
            return read_ogbench_npz(self.data_file, env=env, env_name=self.env_id)
        finally:
            env.close()


class D4RLData(OfflineRLData):
    """A D4RL-format HDF5 dataset or a Minari dataset, evaluated in a gymnasium MuJoCo environment with D4RL's
    normalised score.

    normalised score = 100 (R - ref_min_score) / (ref_max_score - ref_min_score), the references coming from the
    arguments or else from the file's `metadata/ref_min_score`, `metadata/ref_max_score` (written by the generator), or
    from the `ref_min_score` / `ref_max_score` a Minari dataset records (Minari's `get_normalized_score` is this
    without the factor 100). A Minari dataset (`root` at `<MINARI_DATASETS_PATH>/<dataset_id>`, detected by its
    `data/main_data.hdf5`, or `data_format: minari`) must have been recorded in `env_id` (its env_spec id).
    The default writes a mixed-quality `Reacher-v5` dataset from a scripted arm controller (see `generate.py`).
    """

    default_name = "d4rl"
    default_version = 1

    def __init__(self, env_id: str = "Reacher-v5", root: str | None = None, data_dir: str = "data",
                 batch_size: int = 256, num_workers: int = 0, steps_per_epoch: int = 1000, eval_episodes: int = 10,
                 eval_seed: int = 10_000, seed: int = 0, reward_scale: float = 1.0, reward_shift: float = 0.0,
                 ref_min_score: float | None = None, ref_max_score: float | None = None, num_episodes: int = 400,
                 behaviour_p_expert: float = 0.5, behaviour_noise: float = 0.3, behaviour_gain: float = 1.0,
                 generator_seed: int = 0, normalize_rewards: bool = False, max_episode_steps: int = 1000,
                 updates_per_batch: int = 1, data_format: Literal["auto", "d4rl", "minari"] = "auto"):
        """
        Args:
            env_id: gymnasium environment the data come from and evaluation runs in.
            root: A D4RL `.hdf5` file (or a folder holding exactly one), or a Minari dataset folder
                (`<MINARI_DATASETS_PATH>/<dataset_id>`); null generates the default.
            data_dir: Cache folder of generated datasets.
            batch_size: Transitions per gradient step (per device).
            num_workers: Unused (batches are sliced from in-memory tensors).
            steps_per_epoch: Gradient steps per epoch.
            eval_episodes: Environment episodes per evaluation budget L.
            eval_seed: Seed of the first evaluation episode.
            seed: Seed of the minibatch stream.
            reward_scale: Rewards are used as reward_scale * r + reward_shift.
            reward_shift: See `reward_scale`.
            ref_min_score: Return of a random policy (D4RL's REF_MIN_SCORE); null reads the file's metadata.
            ref_max_score: Return of an expert (D4RL's REF_MAX_SCORE); null reads the file's metadata.
            num_episodes: Generated episodes.
            behaviour_p_expert: Generated behaviour: probability of the scripted controller (else a random action).
            behaviour_noise: Generated behaviour: std of the Gaussian noise on the controller's action.
            behaviour_gain: Generated behaviour: scale of the controller's PD gain (below 1: sluggish, suboptimal).
            generator_seed: Seed of the generated dataset.
            normalize_rewards: D4RL reward normalisation of the official VGF/FQL code (`--normalize_r=1`, used for
                locomotion): rewards *= 1000 / (max - min) of the dataset's episode returns (before reward_scale).
            max_episode_steps: Episode length cap used to split episodes for that range (D4RL: 1000; a Minari
                dataset's episodes are stored one by one and used as they are).
            updates_per_batch: Gradient steps per Trainer batch (see `OfflineRLData`).
            data_format: `auto` (a Minari dataset is recognised by its layout, anything else is D4RL HDF5), `d4rl` or
                `minari`.
        """
        super().__init__(root, data_dir, batch_size, num_workers, steps_per_epoch, eval_episodes, eval_seed, seed,
                         reward_scale, reward_shift, updates_per_batch)
        if data_format not in ("auto", "d4rl", "minari"):
            raise ConfigError(f"data.data_format must be auto, d4rl or minari, got {data_format!r}")
        if data_format == "minari" and root is None:
            raise ConfigError("data.data_format: minari needs data.init_args.root at a Minari dataset folder "
                              "(<MINARI_DATASETS_PATH>/<dataset_id>); the generated default is D4RL HDF5")
        self.data_format = data_format
        self.normalize_rewards, self.max_episode_steps = normalize_rewards, max_episode_steps
        self.reward_normalizer = 1.0  # set by read() when normalize_rewards
        self.env_id = env_id
        self.behaviour = (behaviour_p_expert, behaviour_noise, behaviour_gain)
        self.ref_min_score, self.ref_max_score = ref_min_score, ref_max_score
        self.num_episodes, self.generator_seed = num_episodes, generator_seed
        self._sizes_from_env()

    @property
    def path(self) -> Path:
        if self.root is not None:
            return Path(self.root).expanduser()
        p, noise, gain = self.behaviour
        tag = f"{self.env_id.lower()}-e{self.num_episodes}-p{p:g}-n{noise:g}-g{gain:g}-s{self.generator_seed}"
        return Path(self.data_dir) / f"{self.default_name}-{tag}-v{self.default_version}"

    def _minari_dir(self) -> Path | None:
        if self.root is None or self.data_format == "d4rl":
            return None
        found = minari_data_dir(self.path)
        if found is None and self.data_format == "minari":
            read_minari(self.path)  # raises the not-found error naming the layout
        return found

    @property
    def data_file(self) -> Path:
        found = self._minari_dir()
        return found / "main_data.hdf5" if found is not None else single_hdf5(self.path)

    def generate_default(self, out_dir: Path) -> None:
        from .generate import generate_d4rl_mujoco

        p, noise, gain = self.behaviour
        generate_d4rl_mujoco(out_dir / f"{self.env_id.lower()}-behaviour.hdf5", self.env_id, self.num_episodes,
                             p_expert=p, expert_noise=noise, expert_gain=gain, seed=self.generator_seed)

    def _read_minari(self, folder: Path) -> dict[str, np.ndarray]:
        data, meta = read_minari(folder)
        recorded = meta["env_spec"].get("id")
        if recorded is not None and recorded != self.env_id:
            raise DatasetFormatError(self.data_file, f"Minari dataset {meta.get('dataset_id')!r} was recorded in "
                                     f"{recorded} but data.env_id is {self.env_id}",
                                     f"set data.init_args.env_id: {recorded}, or point root at a dataset of {self.env_id}")
        for key in ("ref_min_score", "ref_max_score"):
            if getattr(self, key) is None and meta.get(key) is not None:
                setattr(self, key, float(meta[key]))
        if self.normalize_rewards:
            returns = meta["episode_returns"]
            low, high = float(returns.min()), float(returns.max())
            if high <= low:
                raise DatasetFormatError(self.data_file, f"every episode returns {low}: the reward normalisation "
                                         "1000 / (max - min) is undefined", "set data.init_args.normalize_rewards: false")
            self.reward_normalizer = 1000.0 / (high - low)
            data["rewards"] = data["rewards"] * np.float32(self.reward_normalizer)
        check_reference_scores(self.data_file, self.ref_min_score, self.ref_max_score)
        return data

    def read(self) -> dict[str, np.ndarray]:
        import h5py

        folder = self._minari_dir()
        if folder is not None:
            return self._read_minari(folder)
        data = read_d4rl_hdf5(self.data_file)
        with h5py.File(self.data_file, "r") as f:
            meta = f.get("metadata")
            for key in ("ref_min_score", "ref_max_score"):
                if getattr(self, key) is None and meta is not None and key in meta:
                    setattr(self, key, float(meta[key][()]))
            if self.normalize_rewards:
                low, high = episode_return_range(f["rewards"][()], f["terminals"][()],
                                                 f["timeouts"][()] if "timeouts" in f else None, self.max_episode_steps)
                if high <= low:
                    raise DatasetFormatError(self.data_file, f"every episode returns {low}: the reward normalisation "
                                             "1000 / (max - min) is undefined", "set data.init_args.normalize_rewards: false")
                self.reward_normalizer = 1000.0 / (high - low)
                data["rewards"] = data["rewards"] * np.float32(self.reward_normalizer)
        check_reference_scores(self.data_file, self.ref_min_score, self.ref_max_score)
        return data

    def score(self, returns: np.ndarray, successes: np.ndarray) -> np.ndarray:
        if self.ref_min_score is None or self.ref_max_score is None:
            return returns
        return 100.0 * (returns - self.ref_min_score) / (self.ref_max_score - self.ref_min_score)
