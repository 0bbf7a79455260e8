"""SOOPER's data: the offline dataset the prior is learned from (D4RL HDF5 with `costs`) and the real environment.

Training is online: one "batch" is one real episode, collected by the module in `training_step`; the DataModule yields
`online_episodes` episode indices per epoch and hands out fresh environments with `make_env`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from lit_iclr.core import BaseDataModule, DatasetFormatError
from lit_iclr.core.offline_rl import read_d4rl_hdf5, single_hdf5

from .envs import make_task

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
                 generator_seed: int = 0):
        """
        Args:
            task: `point_goal` (Safety-Gym-style hazard) or `cartpole_swingup` (RWRL slider constraint).
            task_kwargs: Keyword arguments of the task (e.g. `slider_limit`, `max_steps`).
            root: A D4RL-format `.hdf5` file with `costs` (or a folder holding one); null generates the default.
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
        """
        super().__init__(root, data_dir, batch_size, num_workers)
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

    @property
    def data_file(self) -> Path:
        return single_hdf5(self.path)

    def generate_default(self, out_dir: Path) -> None:
        from .generate import generate_safe_d4rl

        p, noise, reckless, spread = self.behaviour
        generate_safe_d4rl(out_dir / f"{self.task}-behaviour.hdf5", self.task, self.num_episodes, p, noise,
                           self.generator_seed, self.task_kwargs, reckless, spread)

    def setup(self, stage: str) -> None:
        if self.transitions is not None:
            return
        data = read_d4rl_hdf5(self.data_file, require_costs=True)
        if data["observations"].shape[1] != self.obs_dim or data["actions"].shape[1] != self.action_dim:
            raise DatasetFormatError(
                self.data_file, f"observations/actions have dims {data['observations'].shape[1]}/"
                f"{data['actions'].shape[1]} but {self.task} has {self.obs_dim}/{self.action_dim}",
                "use the dataset that belongs to this task")
        data["safe"] = safe_episodes(data, self.safe_episode_cost)
        self.transitions = {k: torch.from_numpy(np.ascontiguousarray(data[k], dtype=np.float32)) for k in KEYS}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Episodes(self.online_episodes), batch_size=None)

    def describe(self) -> str:
        n = 0 if self.transitions is None else len(self.transitions["rewards"])
        return (f"SafeOfflineData: {n} transitions with costs from {self.data_file} (obs {self.obs_dim}, action "
                f"{self.action_dim}); online episodes in {self.task}")
