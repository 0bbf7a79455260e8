"""SOOPER's data: the offline dataset the prior is learned from (D4RL HDF5 with `costs`, or a Minari dataset with
`infos/cost`) and the real environment.

Training is online: one "batch" is one real episode, collected by the module in `training_step`; the DataModule yields
`online_episodes` episode indices per epoch and hands out fresh environments with `make_env`. Validation is one item: the
module evaluates the learner and the prior on held-out reset seeds in one `validation_step`.

The dataset must have been recorded on the configured task: besides the observation/action dimensions, the task the
file records (`metadata/task` + `metadata/task_kwargs` of a D4RL-layout file, the `env_spec` entry point + kwargs of a
Minari dataset) is compared with the environment's parameters, and a mismatch is refused. Parameters that only shape
the episodes (`max_steps`, start state and its noise) may differ. A file that records no task (DSRL's own files)
is checked on its dimensions alone, with a warning.
"""
from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core import BaseDataModule, ConfigError, DatasetFormatError
from lit_iclr.core.offline_rl import minari_data_dir, read_d4rl_hdf5, read_minari, single_hdf5

from .envs import TASKS, make_task

EPISODE_ONLY = ("max_steps", "start", "start_noise", "init_noise")  # change the episodes, not the MDP's rules


def task_parameters(task: str, task_kwargs: dict | None = None) -> dict:
    """Every constructor argument of the task, defaults filled in, JSON-normalised (tuples become lists)."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of {sorted(TASKS)}")
    sig = inspect.signature(TASKS[task].__init__)
    params = {k: p.default for k, p in sig.parameters.items() if k != "self" and p.default is not inspect.Parameter.empty}
    params.update(task_kwargs or {})
    return json.loads(json.dumps(params, default=lambda v: np.asarray(v).tolist()))


def _same(a, b) -> bool:
    try:
        return np.shape(a) == np.shape(b) and bool(np.allclose(np.asarray(a, float), np.asarray(b, float)))
    except (TypeError, ValueError):
        return a == b


def check_task(path: Path, task: str, params: dict, recorded_task: str | None, recorded: dict | None) -> None:
    """Refuse a dataset whose recorded task or task parameters differ from the environment's (see the module doc)."""
    fix = ("point root at a dataset recorded on this task, or set data.init_args.task / task_kwargs to the task the "
           "file records")
    if recorded_task is not None and recorded_task != task:
        raise DatasetFormatError(path, f"the dataset was recorded on task {recorded_task!r} but data.task is {task!r}", fix)
    diff = [f"{k}={recorded[k]} (config: {params[k]})" for k in sorted(recorded or {})
            if k in params and k not in EPISODE_ONLY and not _same(recorded[k], params[k])]
    if diff:
        raise DatasetFormatError(path, f"the dataset was recorded on {task} with " + ", ".join(diff), fix)


def _text(v) -> str:
    v = v[()] if hasattr(v, "shape") else v
    return v.decode() if isinstance(v, bytes) else str(v)


def d4rl_task_metadata(path: Path) -> tuple[str | None, dict | None]:
    """(task, parameters) recorded in a D4RL-layout file's `metadata` group (the generator writes both); None where
    the file records nothing."""
    import h5py

    with h5py.File(path, "r") as f:
        meta = f.get("metadata")
        if meta is None or not isinstance(meta, h5py.Group):
            return None, None
        task = _text(meta["task"]) if "task" in meta else None
        params = None
        if "task_kwargs" in meta:
            try:
                params = json.loads(_text(meta["task_kwargs"]))
            except ValueError as e:
                raise DatasetFormatError(path, f"metadata/task_kwargs is not JSON ({e})",
                                         "store the task's constructor arguments as a JSON object") from e
    return task, params


def minari_task_metadata(env_spec: dict) -> tuple[str | None, dict | None]:
    """(task, parameters) from a Minari env_spec: the task is the one whose class the entry point names (another
    environment's entry point is returned as is, so the comparison refuses it)."""
    if not env_spec:
        return None, None
    entry = str(env_spec.get("entry_point") or env_spec.get("id"))
    cls = entry.rpartition(":")[2]
    task = next((name for name, c in TASKS.items() if entry.startswith("lit_iclr.sooper") and c.__name__ == cls), entry)
    return task, dict(env_spec.get("kwargs") or {})

KEYS = ("observations", "actions", "rewards", "costs", "next_observations", "masks", "safe")


def safe_episodes(data: dict[str, np.ndarray], max_cost: float) -> np.ndarray:
    """1 for the transitions of episodes whose total cost is <= max_cost. Episodes are recovered from the transition
    chain: a new one starts after a termination or where a row's next observation is not the next row's observation."""
    obs, nxt = data["observations"], data["next_observations"]
    breaks = np.concatenate([[False], (data["masks"][:-1] == 0) | np.any(nxt[:-1] != obs[1:], axis=1)])
    episode = np.cumsum(breaks)
    cost = np.bincount(episode, weights=data["costs"])
    return (cost[episode] <= max_cost).astype(np.float32)


class _Episodes(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class SafeOfflineData(BaseDataModule):
    """A constrained task and the offline dataset of a conservative behaviour policy on it.

    `root` may point at a real D4RL/DSRL-format `.hdf5` file with a `costs` array for the same task; null generates the
    default (see `generate.py`) into `data_dir` and reads it back with the same reader.
    """

    default_name = "safe-d4rl"
    default_version = 2  # 2: the cautious controller blends into its escape continuously
    model_links = {"obs_dim": "obs_dim", "action_dim": "action_dim"}

    def __init__(self, task: str = "point_goal", task_kwargs: dict | None = None, root: str | None = None,
                 data_dir: str = "data", batch_size: int = 256, num_workers: int = 0, online_episodes: int = 30,
                 num_episodes: int = 200, behaviour_p_expert: float = 0.7, behaviour_noise: float = 0.3,
                 behaviour_p_reckless: float = 0.3, behaviour_p_spread: float = 0.5, safe_episode_cost: float = 8.0,
                 generator_seed: int = 0, data_format: Literal["auto", "d4rl", "minari"] = "auto"):
        """
        Args:
            task: `point_goal` (Safety-Gym-style hazard) or `cartpole_swingup` (RWRL slider constraint).
            task_kwargs: Keyword arguments of the task (e.g. `slider_limit`, `max_steps`).
            root: A D4RL-format `.hdf5` file with `costs` (or a folder holding one), or a Minari dataset folder
                (`<MINARI_DATASETS_PATH>/<dataset_id>`, costs in `infos/cost`); null generates the default.
            data_dir: Cache folder of generated datasets.
            batch_size: Transitions per gradient step (offline prior, SAC, model and cost-critic updates).
            num_workers: Unused (data are in-memory tensors); kept for the common interface.
            online_episodes: Real episodes per epoch (the real-step budget is epochs x episodes x episode length).
            num_episodes: Generated offline episodes.
            behaviour_p_expert: Generated behaviour: probability of the cautious controller (else a random action).
            behaviour_noise: Generated behaviour: std of the Gaussian noise on the controller's action.
            behaviour_p_reckless: Generated behaviour: fraction of episodes driven by the constraint-violating controller.
            behaviour_p_spread: Generated behaviour: fraction of episodes started from a state drawn over the workspace.
            safe_episode_cost: Episodes with at most this total cost are "safe": the prior clones only those (BC-Safe).
            generator_seed: Seed of the generated dataset.
            data_format: `auto` (a Minari dataset is recognised by its layout, anything else is D4RL HDF5), `d4rl` or
                `minari`.
        """
        super().__init__(root, data_dir, batch_size, num_workers)
        if data_format not in ("auto", "d4rl", "minari"):
            raise ConfigError(f"data.data_format must be auto, d4rl or minari, got {data_format!r}")
        if data_format == "minari" and root is None:
            raise ConfigError("data.data_format: minari needs data.init_args.root at a Minari dataset folder "
                              "(<MINARI_DATASETS_PATH>/<dataset_id>); the generated default is D4RL HDF5")
        self.data_format = data_format
        self.task, self.task_kwargs = task, dict(task_kwargs or {})
        self.online_episodes, self.num_episodes = online_episodes, num_episodes
        self.behaviour = (behaviour_p_expert, behaviour_noise, behaviour_p_reckless, behaviour_p_spread)
        self.safe_episode_cost = safe_episode_cost
        self.generator_seed = generator_seed
        env = self.make_env()
        self.obs_dim, self.action_dim = env.observation_space.shape[0], env.action_space.shape[0]
        self.transitions: dict[str, torch.Tensor] | None = None

    def make_env(self):
        return make_task(self.task, **self.task_kwargs)

    @property
    def path(self) -> Path:
        if self.root is not None:
            return Path(self.root).expanduser()
        p, noise, reckless, spread = self.behaviour
        extra = "".join(f"-{k}{v:g}" if isinstance(v, float | int) else "" for k, v in sorted(self.task_kwargs.items()))
        tag = f"{self.task}{extra}-e{self.num_episodes}-p{p:g}-n{noise:g}-r{reckless:g}-w{spread:g}-s{self.generator_seed}"
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
        from .generate import generate_safe_d4rl

        p, noise, reckless, spread = self.behaviour
        generate_safe_d4rl(out_dir / f"{self.task}-behaviour.hdf5", self.task, self.num_episodes, p, noise,
                           self.generator_seed, self.task_kwargs, reckless, spread)

    def setup(self, stage: str) -> None:
        if self.transitions is not None:
            return
        folder = self._minari_dir()
        if folder is not None:
            data, meta = read_minari(folder, require_costs=True)
            recorded_task, recorded = minari_task_metadata(meta["env_spec"])
        else:
            data = read_d4rl_hdf5(self.data_file, require_costs=True)
            recorded_task, recorded = d4rl_task_metadata(self.data_file)
        if recorded_task is None and recorded is None:
            warnings.warn(f"{self.data_file} records no task: only its dimensions are compared with {self.task}",
                          stacklevel=2)
        check_task(self.data_file, self.task, task_parameters(self.task, self.task_kwargs), recorded_task, recorded)
        if data["observations"].shape[1] != self.obs_dim or data["actions"].shape[1] != self.action_dim:
            raise DatasetFormatError(
                self.data_file, f"observations/actions have dims {data['observations'].shape[1]}/"
                f"{data['actions'].shape[1]} but {self.task} has {self.obs_dim}/{self.action_dim}",
                "use the dataset that belongs to this task")
        data["safe"] = safe_episodes(data, self.safe_episode_cost)
        self.transitions = {k: torch.from_numpy(np.ascontiguousarray(data[k], dtype=np.float32)) for k in KEYS}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Episodes(self.online_episodes), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        # one item: the module runs its held-out evaluation episodes (learner and prior) in one validation_step
        return DataLoader(_Episodes(1), batch_size=None)

    def describe(self) -> str:
        n = 0 if self.transitions is None else len(self.transitions["rewards"])
        return (f"SafeOfflineData: {n} transitions with costs from {self.data_file} (obs {self.obs_dim}, action "
                f"{self.action_dim}); online episodes in {self.task}")
