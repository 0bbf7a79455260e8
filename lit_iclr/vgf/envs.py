"""Environments for VGF: OGBench (state-based manipulation) and gymnasium MuJoCo, and batched evaluation rollouts.

State observations need no renderer; `MUJOCO_GL` is set to a headless backend before mujoco is imported so that
importing `ogbench` on a machine without a display neither warns about X11 nor fails.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from lit_iclr.core.errors import ConfigError


def headless() -> None:
    """Pick a headless GL backend (only rendering would use it); a user's explicit choice is kept."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    warnings.filterwarnings("ignore", message=".*DISPLAY environment variable is missing.*")
    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32.*")


def make_env(env_id: str, **kwargs):
    """`gymnasium.make(env_id)`; OGBench ids (`cube-single-singletask-task2-v0`, ...) are registered on import."""
    headless()
    import gymnasium

    if _is_ogbench(env_id):
        import ogbench  # noqa: F401  (registers the OGBench environments)
    try:
        env = gymnasium.make(env_id, disable_env_checker=True, **kwargs)
    except gymnasium.error.Error as e:
        raise ConfigError(f"cannot make environment {env_id!r}: {e}") from e
    space = env.action_space
    if not (np.allclose(space.low, -1.0) and np.allclose(space.high, 1.0)):
        raise ConfigError(f"{env_id} has actions in [{space.low.min()}, {space.high.max()}]; VGF's particles live in "
                          "[-1, 1]: wrap the environment with gymnasium.wrappers.RescaleAction(env, -1, 1)")
    return env


def _is_ogbench(env_id: str) -> bool:
    return any(k in env_id for k in ("cube-", "scene-", "puzzle-", "maze-", "soccer-"))


@dataclass
class Rollouts:
    """Per-job results of `evaluate`: undiscounted return, success flag (0 where the env reports none), length and
    the job's group; `q_means` maps a group to the mean Q estimate of the actions it took (filled by the caller)."""

    returns: np.ndarray
    successes: np.ndarray
    lengths: np.ndarray
    groups: np.ndarray
    q_means: dict = field(default_factory=dict)


def evaluate(envs: Sequence, policy: Callable[[np.ndarray, np.ndarray], np.ndarray],
             jobs: Sequence[tuple[int, int]], max_steps: int = 100_000) -> Rollouts:
    """Run one episode per job `(reset seed, group)` on a pool of environments in lock-step.

    Every environment step queries `policy(obs [M, D], groups [M])` once for all running episodes, so the episodes of
    every group (e.g. every evaluation budget L) share one batched policy call; an environment that finishes its
    episode takes the next job. Episodes end by the environment's termination or time limit (or `max_steps`).
    """
    n = len(jobs)
    groups = np.array([g for _, g in jobs])
    returns, successes, lengths = np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64)
    pending = iter(range(n))
    slot_job: list[int | None] = [None] * len(envs)
    obs: list[np.ndarray | None] = [None] * len(envs)

    def start(slot: int) -> None:
        job = next(pending, None)
        slot_job[slot] = job
        if job is not None:
            obs[slot] = np.asarray(envs[slot].reset(seed=int(jobs[job][0]))[0], dtype=np.float32)

    for slot in range(len(envs)):
        start(slot)
    while True:
        live = [s for s in range(len(envs)) if slot_job[s] is not None]
        if not live:
            break
        job_ids = [slot_job[s] for s in live]
        actions = policy(np.stack([obs[s] for s in live]), groups[job_ids])
        for a, s, j in zip(actions, live, job_ids, strict=True):
            ob, r, terminated, truncated, info = envs[s].step(a)
            obs[s] = np.asarray(ob, dtype=np.float32)
            returns[j] += r
            lengths[j] += 1
            if "success" in info:
                successes[j] = max(successes[j], float(info["success"]))
            if terminated or truncated or lengths[j] >= max_steps:
                start(s)
    return Rollouts(returns, successes, lengths, groups)
