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
A stored `next_observations` must have the columns of `observations`; costs must be >= 0 (a constraint violation).

Minari conventions (the maintained successor of D4RL's datasets, `minari` 0.5 HDF5 storage): a dataset folder
`<MINARI_DATASETS_PATH>/<dataset_id>/data/` holds `metadata.json` (dataset_id, env_spec as a JSON string,
ref_min_score / ref_max_score when recorded, observation/action spaces) and `main_data.hdf5` with one group
`episode_<i>` per episode: `observations` [T + 1] (the reset observation, then one per step), `actions`, `rewards`,
`terminations`, `truncations` [T], and `infos/<key>` with T + 1 rows when written by `minari.DataCollector` (the reset
info first) or T rows. Row t pairs observations[t] with observations[t + 1], so every step, a truncated last one
included, has its successor: nothing is dropped, and only `terminations` zero the mask. Costs come from
`infos/cost` (the `info["cost"]` of Safety-Gymnasium-style environments). Minari < 0.5 kept the metadata as attributes
of `main_data.hdf5`; they are read when `metadata.json` is absent. Dict/Tuple spaces (HDF5 groups) are refused.
"""
from __future__ import annotations

import json
import re
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


def _costs(path: Path, v: np.ndarray, key: str = "costs") -> np.ndarray:
    """One non-negative cost per step: a cost counts constraint violations, so a negative one (a reward sign, or a
    cost-minus-threshold) would silently relax the budget."""
    c = _per_step_vector(path, v, key)
    if (c < 0).any():
        row = int(np.flatnonzero(c < 0)[0])
        raise DatasetFormatError(path, f"key {key!r} has {(c < 0).sum()} negative values (first at row {row}: "
                                 f"{float(c[row]):g})", "costs must be >= 0 (1 per violating step in Safety-Gym/DSRL); "
                                 "store the cost itself, not a negated cost or cost minus a threshold")
    return c


def _check_next_observations(path: Path, obs: np.ndarray, nxt: np.ndarray) -> None:
    if nxt.shape[1:] != obs.shape[1:]:
        raise DatasetFormatError(path, f"key 'next_observations' has shape {nxt.shape} but 'observations' has "
                                 f"{obs.shape}", "store next_observations with the columns of observations, or drop "
                                 "the key so that it is derived from observations and timeouts")


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
    if "next_observations" in per_step:
        _check_next_observations(path, per_step["observations"], per_step["next_observations"])
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
        out["costs"] = _costs(path, per_step["costs"])[keep]
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
        out["costs"] = _costs(path, per_step["costs"])[ob_mask]
    return out


# ----------------------------------------------------------------------------------------------------------- Minari
MINARI_FILE = "main_data.hdf5"


def minari_data_dir(path: str | Path) -> Path | None:
    """The folder holding `main_data.hdf5` when `path` is a Minari dataset (`<root>/<dataset_id>`, its `data/`
    folder, or the `main_data.hdf5` file itself); None when it is not in that layout."""
    p = Path(path).expanduser()
    if p.is_file():
        return p.parent if p.name == MINARI_FILE else None
    for cand in (p, p / "data"):
        if (cand / MINARI_FILE).is_file():
            return cand
    return None


def read_minari_metadata(data_dir: str | Path) -> dict:
    """The dataset's metadata (`metadata.json`, else the root attributes of `main_data.hdf5`, as Minari < 0.5 kept
    them), with `env_spec` parsed from its JSON string into a dict ({} when the dataset records none)."""
    import h5py

    data_dir = Path(data_dir)
    meta_file = data_dir / "metadata.json"
    if meta_file.is_file():
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError) as e:
            raise DatasetFormatError(meta_file, f"not readable JSON ({e})", "re-create the dataset with minari") from e
    else:
        with h5py.File(data_dir / MINARI_FILE, "r") as f:
            meta = {k: (v.decode() if isinstance(v, bytes) else v.item() if isinstance(v, np.generic) else v)
                    for k, v in f.attrs.items()}
    spec = meta.get("env_spec")
    if isinstance(spec, str):
        try:
            meta["env_spec"] = json.loads(spec)
        except ValueError as e:
            raise DatasetFormatError(meta_file, f"env_spec is not a JSON string ({e})",
                                     "re-create the dataset with minari (env_spec = EnvSpec.to_json())") from e
    meta["env_spec"] = meta.get("env_spec") or {}
    return meta


def _episode_keys(f) -> list[str]:
    eps = [k for k in f.keys() if re.fullmatch(r"episode_\d+", k)]
    return sorted(eps, key=lambda k: int(k.split("_")[1]))


def _flat_rows(path: Path, group, key: str, where: str) -> np.ndarray:
    import h5py

    v = group.get(key)
    if v is None:
        raise DatasetFormatError(path, f"{where} has no {key!r} (found {sorted(group.keys())})",
                                 "a Minari episode holds observations, actions, rewards, terminations, truncations")
    if isinstance(v, h5py.Group):
        raise DatasetFormatError(path, f"{where}/{key} is a group {sorted(v.keys())} (a Dict or Tuple space)",
                                 f"flatten the {key} into one array per step (gymnasium.wrappers.FlattenObservation) "
                                 "and re-create the dataset")
    a = v[()]
    if not np.issubdtype(a.dtype, np.number) and a.dtype != bool:
        raise DatasetFormatError(path, f"{where}/{key} has dtype {a.dtype} (encoded images?)",
                                 "store numeric vectors (minari jpeg_encoding=False for image spaces)")
    return a


def read_minari(path: str | Path, action_low: float = -1.0, action_high: float = 1.0, require_costs: bool = False,
                cost_key: str = "cost") -> tuple[dict[str, np.ndarray], dict]:
    """(transitions, metadata) of a Minari dataset (see the module docstring); raises `DatasetFormatError`.

    metadata is `read_minari_metadata`'s dict plus `episode_returns` (undiscounted return of every episode).
    `infos/<cost_key>`, when present, becomes `costs`; `require_costs` makes its absence an error.
    """
    import h5py

    data_dir = minari_data_dir(path)
    if data_dir is None:
        raise DatasetNotFoundError(path, f"no Minari dataset here (no {MINARI_FILE} in it or in its data/ folder)",
                                   "point `root` at <MINARI_DATASETS_PATH>/<dataset_id> (e.g. ~/.minari/datasets/"
                                   "mujoco/hopper/medium-v0)")
    meta = read_minari_metadata(data_dir)
    file = data_dir / MINARI_FILE
    parts = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "masks", "costs")}
    returns = []
    try:
        f = h5py.File(file, "r")
    except OSError as e:
        raise DatasetFormatError(file, f"not a readable HDF5 file ({e})", "re-download or re-create the dataset") from e
    with f:
        episodes = _episode_keys(f)
        if not episodes:
            raise DatasetFormatError(file, f"no episode_<i> groups (found {sorted(f.keys())[:5]})",
                                     "a Minari main_data.hdf5 holds one group episode_<i> per episode")
        for name in episodes:
            g = f[name]
            obs = _flat_rows(file, g, "observations", name)
            obs = obs.reshape(len(obs), -1)
            act = _flat_rows(file, g, "actions", name)
            act = act.reshape(len(act), -1)
            rew = _flat_rows(file, g, "rewards", name).reshape(-1)
            term = _flat_rows(file, g, "terminations", name).astype(bool).reshape(-1)
            trunc = _flat_rows(file, g, "truncations", name).astype(bool).reshape(-1)
            T = len(rew)
            if T == 0:
                continue
            if len(obs) != T + 1:
                raise DatasetFormatError(file, f"{name}/observations has {len(obs)} rows for {T} steps",
                                         "Minari stores T + 1 observations per episode (the reset one, then one per step)")
            for key, arr in (("actions", act), ("terminations", term), ("truncations", trunc)):
                if len(arr) != T:
                    raise DatasetFormatError(file, f"{name}/{key} has {len(arr)} rows for {T} rewards",
                                             "every per-step array of an episode has one row per step")
            infos = g.get("infos")
            if infos is not None and cost_key in infos:
                c = _flat_rows(file, infos, cost_key, f"{name}/infos").reshape(-1)
                if len(c) not in (T, T + 1):
                    raise DatasetFormatError(file, f"{name}/infos/{cost_key} has {len(c)} rows for {T} steps",
                                             "record one cost per step (T rows, or T + 1 with the reset info first)")
                parts["costs"].append(c[len(c) - T:])  # DataCollector: row 0 is the reset info
            elif require_costs:
                raise DatasetFormatError(file, f"{name} has no infos/{cost_key}",
                                         f"record info[{cost_key!r}] per step (minari.DataCollector(record_infos=True))")
            parts["observations"].append(obs[:-1])
            parts["next_observations"].append(obs[1:])
            parts["actions"].append(act)
            parts["rewards"].append(rew)
            parts["masks"].append(1.0 - term)
            returns.append(float(np.sum(rew, dtype=np.float64)))
    if not returns:
        raise DatasetFormatError(file, "every episode is empty", "point at a dataset with transitions")
    if parts["costs"] and len(parts["costs"]) != len(returns):
        raise DatasetFormatError(file, f"only {len(parts['costs'])} of {len(returns)} episodes record infos/{cost_key}",
                                 "record the cost in every episode")
    raw = {k: np.concatenate(v) for k, v in parts.items() if v}
    _check_finite(file, raw)
    _check_actions(file, raw["actions"], action_low, action_high)
    out = {k: raw[k].astype(np.float32) for k in KEYS}
    if "costs" in raw:
        out["costs"] = _costs(file, raw["costs"], f"infos/{cost_key}")
    meta["episode_returns"] = np.asarray(returns)
    return out, meta
