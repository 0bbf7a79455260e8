"""Default datasets, written in the real formats: OGBench manipulation `.npz` and D4RL `.hdf5`.

* `generate_ogbench_manipulation` reproduces OGBench's `data_gen_scripts/generate_manipspace.py`: the environment in
  `data_collection` mode (random start, random targets), the benchmark's scripted oracles from the installed `ogbench`
  package (`play`: the non-Markovian plan oracle with temporally smoothed noise; `noisy`: the closed-loop Markov oracle
  with Gaussian noise), a new random target whenever the oracle finishes one, episodes of `episode_length` steps, and
  the `.npz` keys `observations, actions, terminals, qpos, qvel` (`qpos`/`qvel` of the state *before* the step, which is
  what OGBench relabels single-task rewards from), plus a `-val.npz` file of one tenth as many episodes.
* `generate_d4rl_mujoco` writes a D4RL-format HDF5 (`observations, actions, rewards, terminals, timeouts` plus
  `metadata/*`) from a gymnasium MuJoCo task. The behaviour policy is a scripted controller mixed with a poor one,
  so the data hold good and bad actions in the same states, the setting where reweighting/transport beats cloning.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .envs import headless


@contextlib.contextmanager
def numpy_global_seed(seed: int) -> Iterator[None]:
    """OGBench's oracles draw from `np.random`; seed it for the block and restore the caller's state afterwards."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def ogbench_dataset_name(env_name: str, dataset_type: str) -> str:
    """`cube-single-v0`, `play` -> `cube-single-play-v0` (OGBench's file naming)."""
    stem, version = env_name.rsplit("-", 1)
    return f"{stem}-{dataset_type}-{version}"


def _oracles(env, env_name: str, dataset_type: str, noise: float, noise_smoothing: float, min_norm: float) -> dict:
    from ogbench.manipspace.oracles.markov.button_markov import ButtonMarkovOracle
    from ogbench.manipspace.oracles.markov.cube_markov import CubeMarkovOracle
    from ogbench.manipspace.oracles.markov.drawer_markov import DrawerMarkovOracle
    from ogbench.manipspace.oracles.markov.window_markov import WindowMarkovOracle
    from ogbench.manipspace.oracles.plan.button_plan import ButtonPlanOracle
    from ogbench.manipspace.oracles.plan.cube_plan import CubePlanOracle
    from ogbench.manipspace.oracles.plan.drawer_plan import DrawerPlanOracle
    from ogbench.manipspace.oracles.plan.window_plan import WindowPlanOracle

    markov = dataset_type == "noisy"
    plan_kw = dict(noise=noise, noise_smoothing=noise_smoothing)
    if "cube" in env_name:
        return {"cube": CubeMarkovOracle(env=env, min_norm=min_norm) if markov else CubePlanOracle(env=env, **plan_kw)}
    if "scene" in env_name:
        if markov:
            return {"cube": CubeMarkovOracle(env=env, min_norm=min_norm, max_step=100),
                    "button": ButtonMarkovOracle(env=env, min_norm=min_norm),
                    "drawer": DrawerMarkovOracle(env=env, min_norm=min_norm),
                    "window": WindowMarkovOracle(env=env, min_norm=min_norm)}
        return {"cube": CubePlanOracle(env=env, **plan_kw), "button": ButtonPlanOracle(env=env, **plan_kw),
                "drawer": DrawerPlanOracle(env=env, **plan_kw), "window": WindowPlanOracle(env=env, **plan_kw)}
    if "puzzle" in env_name:
        if markov:
            return {"button": ButtonMarkovOracle(env=env, min_norm=min_norm, gripper_always_closed=True)}
        return {"button": ButtonPlanOracle(env=env, gripper_always_closed=True, **plan_kw)}
    raise ValueError(f"no OGBench oracle for {env_name!r}; use a cube-*, scene-* or puzzle-* environment")


def _p_stack(env_name: str) -> float:
    """Probability of stacking the target cube (OGBench's per-environment choice; 0 for a single cube)."""
    if "single" in env_name:
        return 0.0
    for name, (lo, hi) in {"double": (0.0, 0.25), "triple": (0.05, 0.35), "quadruple": (0.1, 0.5),
                           "octuple": (0.0, 0.35)}.items():
        if name in env_name:
            return float(np.random.uniform(lo, hi))
    return 0.5


def generate_ogbench_manipulation(out_dir: str | Path, env_name: str = "cube-single-v0", dataset_type: str = "play",
                                  num_episodes: int = 100, episode_length: int = 1001, noise: float = 0.1,
                                  noise_smoothing: float = 0.5, min_norm: float = 0.4, p_random_action: float = 0.0,
                                  seed: int = 0) -> Path:
    """Collect `num_episodes` (+ `num_episodes // 10` validation) oracle episodes; returns the training `.npz` path."""
    if dataset_type not in ("play", "noisy"):
        raise ValueError(f"dataset_type must be 'play' or 'noisy', got {dataset_type!r}")
    headless()
    import gymnasium
    import ogbench.manipspace  # noqa: F401  (registers the environments)

    out_dir = Path(out_dir)
    env = gymnasium.make(env_name, terminate_at_goal=False, mode="data_collection", max_episode_steps=episode_length)
    data: dict[str, list] = defaultdict(list)
    has_buttons = hasattr(env.unwrapped, "_cur_button_states")
    num_val = max(num_episodes // 10, 1)
    train_steps = 0
    with numpy_global_seed(seed):
        agents = _oracles(env, env_name, dataset_type, noise, noise_smoothing, min_norm)
        env.reset(seed=seed)  # seeds the environment's own generator (start states, targets)
        for ep in range(num_episodes + num_val):
            while True:  # scene episodes that push the cube out of view are redone, as OGBench does
                ob, info = env.reset()
                p_stack = _p_stack(env_name)
                xi = np.random.uniform(0, noise) if dataset_type == "noisy" else 0.0
                agent = agents[info["privileged/target_task"]]
                agent.reset(ob, info)
                episode: dict[str, list] = defaultdict(list)
                done = False
                while not done:
                    if np.random.rand() < p_random_action:
                        action = env.action_space.sample()
                    else:
                        action = np.asarray(agent.select_action(ob, info))
                        if dataset_type == "noisy":
                            action = action + np.random.normal(0, [xi, xi, xi, xi * 3, xi * 10], action.shape)
                    action = np.clip(action, -1, 1)
                    next_ob, _, terminated, truncated, info = env.step(action)
                    done = terminated or truncated
                    if agent.done:  # the oracle finished its task: pick a new random target
                        agent_ob, agent_info = env.unwrapped.set_new_target(p_stack=p_stack)
                        agent = agents[agent_info["privileged/target_task"]]
                        agent.reset(agent_ob, agent_info)
                    episode["observations"].append(ob)
                    episode["actions"].append(action)
                    episode["terminals"].append(done)
                    episode["qpos"].append(info["prev_qpos"])
                    episode["qvel"].append(info["prev_qvel"])
                    if has_buttons:
                        episode["button_states"].append(info["prev_button_states"])
                    ob = next_ob
                if "scene" not in env_name or _scene_healthy(np.asarray(episode["qpos"])):
                    break
            for k, v in episode.items():
                data[k].extend(v)
            if ep < num_episodes:
                train_steps = len(data["observations"])
    env.close()

    name = ogbench_dataset_name(env_name, dataset_type)
    dtypes = {"terminals": bool, "button_states": np.int64}
    train = {k: np.asarray(v[:train_steps], dtype=dtypes.get(k, np.float32)) for k, v in data.items()}
    val = {k: np.asarray(v[train_steps:], dtype=dtypes.get(k, np.float32)) for k, v in data.items()}
    np.savez_compressed(out_dir / f"{name}.npz", **train)
    np.savez_compressed(out_dir / f"{name}-val.npz", **val)
    return out_dir / f"{name}.npz"


def _scene_healthy(qpos: np.ndarray) -> bool:
    """OGBench's health check for scene episodes: the cube never leaves the view unless it is in the drawer."""
    xyz = qpos[:, 14:17]
    if (xyz[:, 1] >= 0.29).any():
        return False
    return not ((xyz[:, 1] <= -0.3) & ((xyz[:, 2] < 0.06) | (xyz[:, 2] > 0.08))).any()


# --------------------------------------------------------------------------------------------- D4RL-format MuJoCo data
REACHER_LINKS = (0.1, 0.11)  # Reacher's upper arm and forearm-to-fingertip lengths (reacher.xml)


def reacher_controller(obs: np.ndarray, kp: float = 0.5, kd: float = 0.1) -> np.ndarray:
    """Scripted Reacher-v5 expert: analytic two-link inverse kinematics to the target, then joint-space PD torques.

    obs = [cos q (2), sin q (2), target xy (2), qdot (2), fingertip - target (2)]. Of the two IK solutions (elbow
    up/down) the one nearer the current joint angles is used. Its return (about -4) is the 100 of the normalised score.
    """
    l1, l2 = REACHER_LINKS
    q = np.arctan2(obs[2:4], obs[0:2])
    x, y = obs[4], obs[5]
    c2 = np.clip((x * x + y * y - l1**2 - l2**2) / (2 * l1 * l2), -1.0, 1.0)
    best = None
    for sign in (1.0, -1.0):
        q2 = sign * np.arccos(c2)
        q1 = np.arctan2(y, x) - np.arctan2(l2 * np.sin(q2), l1 + l2 * np.cos(q2))
        err = (np.array([q1, q2]) - q + np.pi) % (2 * np.pi) - np.pi
        if best is None or np.abs(err).sum() < np.abs(best).sum():
            best = err
    return np.clip(kp * best - kd * obs[6:8], -1.0, 1.0)


def _episode_returns(env, policy, episodes: int, seed: int) -> float:
    total = 0.0
    for e in range(episodes):
        ob, _ = env.reset(seed=seed + e)
        done = False
        while not done:
            ob, r, terminated, truncated, _ = env.step(policy(ob))
            total += r
            done = terminated or truncated
    return total / episodes


def generate_d4rl_mujoco(path: str | Path, env_id: str = "Reacher-v5", num_episodes: int = 400,
                         p_expert: float = 0.5, expert_noise: float = 0.3, expert_gain: float = 1.0, seed: int = 0,
                         reference_episodes: int | None = None) -> Path:
    """Write a D4RL-format HDF5 of `num_episodes` episodes from a mixed behaviour policy; returns `path`.

    Behaviour: at every step, with probability `p_expert` the scripted controller (its PD gain scaled by
    `expert_gain`: below 1 a sluggish, suboptimal controller) plus N(0, expert_noise^2) noise, otherwise a uniformly
    random action. The default mixture puts good and useless actions in the same states ("medium-replay"-like):
    cloning averages them, a value-guided policy should pick and refine the good ones. With `p_expert=1` and a small
    noise the data cover only a narrow band of actions ("medium"-like), where Q is unreliable off that band.
    `metadata/ref_min_score` (uniform random policy) and `metadata/ref_max_score` (the noiseless controller) are
    measured on `reference_episodes` episodes (default: min(num_episodes, 100)) and stored for the normalised score.
    """
    if env_id != "Reacher-v5":
        raise ValueError(f"the default D4RL generator scripts Reacher-v5 only, not {env_id!r}; "
                         "point `root` at a D4RL .hdf5 file for other tasks")
    import gymnasium
    import h5py

    headless()
    env = gymnasium.make(env_id)
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    cols: dict[str, list] = defaultdict(list)
    for ep in range(num_episodes):
        ob, _ = env.reset(seed=seed * 100_003 + ep)
        done = False
        while not done:
            if rng.random() < p_expert:
                action = np.clip(reacher_controller(ob, kp=0.5 * expert_gain, kd=0.1) + rng.normal(0, expert_noise, 2),
                                 -1, 1)
            else:
                action = rng.uniform(-1, 1, 2)
            next_ob, r, terminated, truncated, _ = env.step(action)
            for k, v in (("observations", ob), ("actions", action), ("rewards", r), ("terminals", terminated),
                         ("timeouts", truncated and not terminated)):
                cols[k].append(v)
            ob, done = next_ob, terminated or truncated
    reference_episodes = reference_episodes or min(num_episodes, 100)
    ref_min = _episode_returns(env, lambda o: rng.uniform(-1, 1, 2), reference_episodes, seed=7_000_000)
    ref_max = _episode_returns(env, reacher_controller, reference_episodes, seed=7_000_000)
    env.close()

    path = Path(path)
    with h5py.File(path, "w") as f:
        for k in ("observations", "actions"):  # no next_observations: the reader derives them, as for D4RL v0 files
            f.create_dataset(k, data=np.asarray(cols[k], dtype=np.float32), compression="gzip")
        f.create_dataset("rewards", data=np.asarray(cols["rewards"], dtype=np.float32))
        f.create_dataset("terminals", data=np.asarray(cols["terminals"], dtype=bool))
        f.create_dataset("timeouts", data=np.asarray(cols["timeouts"], dtype=bool))
        f.create_dataset("metadata/env_id", data=env_id)
        f.create_dataset("metadata/ref_min_score", data=ref_min)
        f.create_dataset("metadata/ref_max_score", data=ref_max)
        behaviour = f"p_expert={p_expert}, expert_noise={expert_noise}, expert_gain={expert_gain}, seed={seed}"
        f.create_dataset("metadata/behaviour", data=behaviour)
    return path
