"""The embedded default: the offline dataset of a conservative behaviour policy, written in D4RL HDF5 layout with costs.

A fraction `p_reckless` of the episodes follows the task's reckless controller (which violates the constraint), the
rest its cautious one (`envs.PRIOR_CONTROLLERS`); each step takes the controller's action plus Gaussian noise with
probability `p_expert`, else a uniform random action. The data thus cover the safe path and costly excursions (which
the prior's cost critic must see); a fraction `p_spread` of the episodes starts from a state drawn over the whole
workspace, so the cautious controller is also seen recovering (e.g. leaving the hazard). The prior clones only the
episodes with little cost (BC-Safe).
Layout (D4RL + DSRL's `costs`): observations, actions, rewards, costs, terminals, timeouts, next_observations;
`metadata/*` records how the file was made, and `metadata/task` + `metadata/task_kwargs` (JSON of every constructor
argument of the task) the task it was recorded on, which the reader compares with the configured task.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .envs import PRIOR_CONTROLLERS, make_task


def generate_safe_d4rl(path: str | Path, task: str, num_episodes: int, p_expert: float = 0.7, noise: float = 0.3,
                       seed: int = 0, task_kwargs: dict | None = None, p_reckless: float = 0.3,
                       p_spread: float = 0.5) -> Path:
    env = make_task(task, **(task_kwargs or {}))
    controller = PRIOR_CONTROLLERS[task]
    rng = np.random.default_rng(seed)
    rows = {k: [] for k in ("observations", "actions", "rewards", "costs", "terminals", "timeouts", "next_observations")}
    returns, costs = [], []
    for ep in range(num_episodes):
        obs, _ = env.reset(seed=seed * 100_003 + ep)
        reckless = bool(rng.random() < p_reckless)
        if rng.random() < p_spread:  # start anywhere in the workspace (hazard included): the prior learns to recover
            obs = env.reset_to(*env.spread_state(rng))
        ret = cost = 0.0
        done = False
        while not done:
            if rng.random() < p_expert:
                a = controller(obs, env, reckless) + noise * rng.standard_normal(env.action_space.shape)
            else:
                a = rng.uniform(-1, 1, env.action_space.shape)
            a = np.clip(a, -1, 1).astype(np.float32)
            nxt, r, term, trunc, info = env.step(a)
            for k, v in zip(rows, (obs, a, r, info["cost"], term, trunc, nxt), strict=True):
                rows[k].append(v)
            ret, cost, obs, done = ret + r, cost + info["cost"], nxt, term or trunc
        returns.append(ret)
        costs.append(cost)
    import h5py

    from .data import task_parameters

    path = Path(path)
    dtypes = {"terminals": bool, "timeouts": bool}
    with h5py.File(path, "w") as f:
        for k, v in rows.items():
            f.create_dataset(k, data=np.asarray(v, dtype=dtypes.get(k, np.float32)), compression="gzip")
        meta = f.create_group("metadata")
        meta["task"], meta["p_expert"], meta["noise"], meta["seed"], meta["p_reckless"] = task, p_expert, noise, seed, p_reckless
        meta["p_spread"] = p_spread
        meta["task_kwargs"] = json.dumps(task_parameters(task, task_kwargs))
        meta["behaviour_return_mean"], meta["behaviour_cost_mean"] = float(np.mean(returns)), float(np.mean(costs))
    return path
