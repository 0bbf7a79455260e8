"""Offline RL datasets in their real formats: readers of D4RL `.hdf5` and OGBench `.npz` files.

Both readers return the same transition dict of float32 arrays:

    observations [T, obs_dim], actions [T, action_dim], rewards [T], next_observations [T, obs_dim], masks [T]
    (+ costs [T] when the file holds a per-step `costs` array, as safe/constrained RL datasets do)

`masks` is 1 - (true MDP termination): the TD target bootstraps through it. Time-limit ends are not terminations.

OGBench conventions (`ogbench.utils.load_dataset`, non-compact): a file stores trajectories back to back with
`terminals` = 1 on the *last row* of each trajectory; the last row has no successor and is dropped, every other row
is paired with the next row. Single-task rewards/masks are relabelled from `qpos` (and `button_states`) with the task's
success test (`ogbench.relabel_utils.relabel_dataset`): reward = #satisfied subgoals - #subgoals, mask = 1 - success.

D4RL conventions: `terminals` are true terminations (mask 0), `timeouts` are time-limit ends; when the file has no
`next_observations` they are derived by shifting within an episode, and the last step of a timed-out episode, which
has no successor, is dropped. A `costs` array (DSRL / OSRL's extension of the layout) is read like `rewards`.
"""
from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from .errors import DatasetFormatError, DatasetNotFoundError

KEYS = ("observations", "actions", "rewards", "next_observations", "masks")
COSTS_FIX = "a constrained-RL dataset stores one cost per step in `costs` (same length as `rewards`), as DSRL does"


# ----------------------------------------------------------------------------------------------------------- checks
def _require(path: Path, raw, keys: tuple[str, ...], fix: str) -> None:
    for k in keys:
        if k not in raw:
            raise DatasetFormatError(path, f"missing key {k!r} (found {sorted(raw.keys())})", fix)


def _check_lengths(path: Path, arrays: dict[str, np.ndarray]) -> None:
    n = len(arrays["observations"])
    for k, v in arrays.items():
        if len(v) != n:
            raise DatasetFormatError(path, f"key {k!r} has {len(v)} rows but 'observations' has {n}",
                                     "every per-step array must have one row per step; regenerate or repair the file")
    if n == 0:
        raise DatasetFormatError(path, "key 'observations' is empty", "point at a dataset with transitions")


def _check_finite(path: Path, arrays: dict[str, np.ndarray]) -> None:
    for k, v in arrays.items():
        if np.issubdtype(v.dtype, np.floating) and not np.isfinite(v).all():
            bad = np.flatnonzero(~np.isfinite(v.reshape(len(v), -1)).all(-1))
            raise DatasetFormatError(path, f"key {k!r} has {bad.size} rows with NaN/inf (first at row {bad[0]})",
                                     f"drop or repair those rows of {k!r}; training on non-finite values is refused")


def _check_actions(path: Path, actions: np.ndarray, low: float, high: float, tol: float = 1e-4) -> None:
    if actions.ndim != 2:
        raise DatasetFormatError(path, f"key 'actions' has shape {actions.shape}, expected [T, action_dim]",
                                 "store one action vector per row")
    out = (actions < low - tol) | (actions > high + tol)
    if out.any():
        row = int(np.flatnonzero(out.any(-1))[0])
        raise DatasetFormatError(
            path, f"key 'actions' has values outside the action space [{low}, {high}] (e.g. row {row}: "
            f"{np.round(actions[row], 3).tolist()})",
            "rescale the actions to the environment's action space, or check that the file belongs to this task")


def _per_step_vector(path: Path, v: np.ndarray, key: str) -> np.ndarray:
    if v.ndim > 1 and int(np.prod(v.shape[1:])) != 1:
        raise DatasetFormatError(path, f"key {key!r} has shape {v.shape}, expected one value per step [T]",
                                 f"store a scalar {key[:-1]} per row")
    return v.astype(np.float32).reshape(-1)


def single_hdf5(path: str | Path) -> Path:
    """`path` itself, or the one `.hdf5`/`.h5` file in the folder `path` (a D4RL dataset given by its folder)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.hdf5")) + sorted(p.glob("*.h5"))
        if len(files) != 1:
            raise DatasetNotFoundError(p, f"expected one .hdf5 file in the folder, found {len(files)}",
                                       "set `root` to the .hdf5 file itself")
        return files[0]
    return p


def check_reference_scores(path: str | Path, ref_min_score: float | None, ref_max_score: float | None) -> None:
    """Refuse references that make the normalised score undefined (min = max) or non-finite."""
    if ref_min_score is None or ref_max_score is None:
        return
    if not (np.isfinite(ref_min_score) and np.isfinite(ref_max_score)) or ref_min_score == ref_max_score:
        raise DatasetFormatError(path, f"reference scores min={ref_min_score}, max={ref_max_score} leave the normalised "
                                 "score 100 (R - min) / (max - min) undefined",
                                 "set data.init_args.ref_min_score / ref_max_score to a random and an expert return "
                                 "(D4RL's REF_MIN_SCORE / REF_MAX_SCORE)")


def d4rl_normalized_score(returns, ref_min_score: float, ref_max_score: float):
    """D4RL's normalised score: 100 (R - ref_min_score) / (ref_max_score - ref_min_score)."""
    check_reference_scores("reference scores", ref_min_score, ref_max_score)
    return 100.0 * (np.asarray(returns) - ref_min_score) / (ref_max_score - ref_min_score)


def episode_return_range(rewards, terminals, timeouts=None, max_episode_steps: int = 1000) -> tuple[float, float]:
    """(min, max) of the episode returns of a D4RL-layout file, as `return_range` of the FQL/VGF code that
    normalises D4RL rewards (r * 1000 / (max - min)): an episode ends at a terminal, a time-limit end (`timeouts`, when
    given) or after `max_episode_steps` steps (D4RL's 1000); a last, unfinished episode is left out."""
    rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
    ends = np.asarray(terminals, dtype=bool).reshape(-1).copy()
    if timeouts is not None:
        ends |= np.asarray(timeouts, dtype=bool).reshape(-1)
    returns, ret, length = [], 0.0, 0
    for r, end in zip(rewards.tolist(), ends.tolist(), strict=True):
        ret, length = ret + r, length + 1
        if end or length == max_episode_steps:
            returns.append(ret)
            ret, length = 0.0, 0
    if not returns:
        raise ValueError("no complete episode: the return range (reward normalisation) is undefined")
    return min(returns), max(returns)


# ---------------------------------------------------------------------------------------------------------- readers
def read_d4rl_hdf5(path: str | Path, action_low: float = -1.0, action_high: float = 1.0,
                   require_costs: bool = False) -> dict[str, np.ndarray]:
    """Transitions of a D4RL-format HDF5 file (see the module docstring); raises `DatasetFormatError` on bad input.

    A `costs` array, when present, is returned per transition; `require_costs` makes its absence an error.
    """
    import h5py

    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(path, "D4RL HDF5 file not found", "point `root` at a D4RL .hdf5 file")
    try:
        with h5py.File(path, "r") as f:
            raw = {k: f[k][()] for k in f.keys() if isinstance(f[k], h5py.Dataset)}
    except OSError as e:
        raise DatasetFormatError(path, f"not a readable HDF5 file ({e})", "re-download or regenerate it") from e
    fix = "a D4RL file holds observations, actions, rewards, terminals and timeouts (or next_observations)"
    _require(path, raw, ("observations", "actions", "rewards", "terminals"), fix)
    if require_costs:
        _require(path, raw, ("costs",), COSTS_FIX)
    if "next_observations" not in raw:
        _require(path, raw, ("timeouts",), "needed to derive next_observations: " + fix)
    per_step = {k: np.asarray(raw[k]) for k in ("observations", "actions", "rewards", "terminals", "timeouts",
                                                "next_observations", "costs") if k in raw}
    _check_lengths(path, per_step)
    _check_finite(path, per_step)
    _check_actions(path, per_step["actions"], action_low, action_high)

    obs = per_step["observations"].astype(np.float32)
    terminals = per_step["terminals"].astype(bool).reshape(-1)
    if "next_observations" in per_step:
        keep = np.ones(len(obs), dtype=bool)
        next_obs = per_step["next_observations"].astype(np.float32)
    else:
        timeouts = per_step["timeouts"].astype(bool).reshape(-1)
        # Row i's successor is row i + 1 unless i ends an episode. A terminal step needs no successor (mask 0):
        # it keeps its own observation as a placeholder. A time-limit end (or the file's last row) has none: dropped.
        next_obs = np.concatenate([obs[1:], obs[-1:]])
        next_obs[terminals] = obs[terminals]
        keep = terminals | ~timeouts
        keep[-1] = terminals[-1]
    out = {
        "observations": obs[keep],
        "actions": per_step["actions"].astype(np.float32)[keep],
        "rewards": per_step["rewards"].astype(np.float32).reshape(-1)[keep],
        "next_observations": next_obs[keep],
        "masks": (1.0 - terminals[keep]).astype(np.float32),
    }
    if "costs" in per_step:
        out["costs"] = _per_step_vector(path, per_step["costs"], "costs")[keep]
    return out


def read_ogbench_npz(path: str | Path, env=None, env_name: str | None = None,
                     action_low: float = -1.0, action_high: float = 1.0, require_costs: bool = False) -> dict[str, np.ndarray]:
    """Transitions of an OGBench `.npz` file; single-task rewards/masks are relabelled with `env` (see docstring).

    Without `env` the file must already hold `rewards` (and optionally `masks`) per row. A `costs` array, when
    present, is returned per transition; `require_costs` makes its absence an error.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(path, "OGBench .npz file not found",
                                   "point `root` at the folder of OGBench datasets (e.g. ~/.ogbench/data)")
    try:
        with np.load(path) as f:
            raw = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:  # truncated: BadZipFile / EOFError
        raise DatasetFormatError(path, f"not a readable .npz file ({e})", "re-download or regenerate it") from e
    fix = "an OGBench file holds observations, actions, terminals (+ qpos, qvel for single-task rewards)"
    _require(path, raw, ("observations", "actions", "terminals"), fix)
    if require_costs:
        _require(path, raw, ("costs",), COSTS_FIX)
    relabel = env is not None
    if relabel:
        _require(path, raw, ("qpos", "qvel"), "single-task rewards are computed from them: " + fix)
        if "puzzle" in (env_name or "") or "scene" in (env_name or ""):
            _require(path, raw, ("button_states",), "puzzle/scene rewards are computed from them: " + fix)
    else:
        _require(path, raw, ("rewards",), "without an environment to relabel from, the file must hold rewards")
    per_step = {k: np.asarray(v) for k, v in raw.items() if k in
                ("observations", "actions", "terminals", "qpos", "qvel", "button_states", "rewards", "masks", "costs")}
    _check_lengths(path, per_step)
    _check_finite(path, per_step)
    _check_actions(path, per_step["actions"], action_low, action_high)
    terminals = per_step["terminals"].astype(bool).reshape(-1)
    if not terminals[-1]:
        raise DatasetFormatError(path, "key 'terminals': the last row does not end a trajectory",
                                 "OGBench files mark the last row of every trajectory with terminals = 1")

    ob_mask = ~terminals  # rows with a successor in the same trajectory
    next_mask = np.concatenate([[False], ob_mask[:-1]])
    out = {
        "observations": per_step["observations"][ob_mask].astype(np.float32),
        "actions": per_step["actions"][ob_mask].astype(np.float32),
        "next_observations": per_step["observations"][next_mask].astype(np.float32),
    }
    if relabel:
        from ogbench.relabel_utils import relabel_dataset

        info = {k: per_step[k][ob_mask] for k in ("qpos", "qvel", "button_states") if k in per_step}
        relabel_dataset(env_name, env, info)
        out["rewards"], out["masks"] = info["rewards"], info["masks"]
    else:
        out["rewards"] = per_step["rewards"][ob_mask].astype(np.float32).reshape(-1)
        out["masks"] = (per_step["masks"][ob_mask] if "masks" in per_step
                        else np.ones(ob_mask.sum())).astype(np.float32).reshape(-1)
    if "costs" in per_step:
        out["costs"] = _per_step_vector(path, per_step["costs"], "costs")[ob_mask]
    return out
