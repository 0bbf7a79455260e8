"""A routing workload and its readers: per-(query, model) quality in [0, 1] and cost, plus a model table.

Formats read (all end up as a `Workload`):
- long table, `quality.parquet` or `quality.csv`: columns `query_id, model, quality, cost`, one row per (query, model);
- RouterBench's released wide table (`*.pkl`, pickled by pandas): one row per prompt with `sample_id`, `prompt`,
  `eval_name`, a quality column per model and `<model>|model_response`, `<model>|total_cost` (US dollars per query,
  about 1e-5 to 1e-1). A pickle can run code, so it is read only with `allow_pickle=True`; it is converted once to a
  parquet cache under `cache_dir` (default `data/cache/`), named by the SHA-256 of the pickle's bytes, and the cache is
  read from then on. Nothing is written beside the user's file, and no parquet beside it is trusted: an edited or
  replaced pickle has another hash and is converted afresh. A RouterBench `.parquet` given as `root` is read as is;
- model table, `models.csv`: `model, release, capacity[, retire]`; release/retire are fractions of the query stream in
  [0, 1] (a model is available for queries t with release <= t / T < retire), capacity alpha_m in (0, 1] is the share of
  traffic it can take. Without a model table every model is present from the start with capacity 1.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError

LONG_COLUMNS = ("query_id", "model", "quality", "cost")
COST_SUFFIX = "|total_cost"
RESPONSE_SUFFIX = "|model_response"
ROUTERBENCH_META = ("sample_id", "prompt", "eval_name", "oracle_model_to_route_to")


@dataclass
class Workload:
    """quality, cost: (N queries, K models); release, retire: (K,) fractions of the stream; capacity: (K,)."""

    models: list[str]
    quality: np.ndarray
    cost: np.ndarray
    release: np.ndarray
    retire: np.ndarray
    capacity: np.ndarray

    @property
    def num_models(self) -> int:
        return len(self.models)

    def means(self) -> tuple[np.ndarray, np.ndarray]:
        """(mu_m, c_m): what the oracle knows, the column means over all queries."""
        return self.quality.mean(0), self.cost.mean(0)

    def available(self, t: int, horizon: int) -> np.ndarray:
        frac = t / horizon
        return (self.release <= frac) & (frac < self.retire)


def _fail(path, problem: str, fix: str):
    raise DatasetFormatError(path, problem, fix)


def _check_values(path: Path, quality: np.ndarray, cost: np.ndarray) -> None:
    if not np.isfinite(quality).all() or not np.isfinite(cost).all():
        _fail(path, "missing (NaN) or infinite quality or cost values", "give every (query, model) pair a quality and a cost")
    if quality.min() < 0 or quality.max() > 1:
        _fail(path, f"quality outside [0, 1] (min {quality.min():.3g}, max {quality.max():.3g})",
              "rescale quality to [0, 1] (correctness or a normalised score)")
    if cost.min() < 0:
        _fail(path, f"negative cost ({cost.min():.3g})", "costs are non-negative (dollars, FLOPs, seconds)")


def read_long_table(path: str | Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(models, quality (N, K), cost (N, K)) from a long parquet/csv table; every query needs every model."""
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "quality table not found",
                                   "write quality.parquet (or .csv) with query_id, model, quality, cost")
    try:
        df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as e:  # pyarrow / csv parser errors on a damaged file
        _fail(path, f"cannot be read ({str(e).splitlines()[0]})", "rewrite the file as parquet or csv")
    missing = [c for c in LONG_COLUMNS if c not in df.columns]
    if missing:
        _fail(path, f"missing columns {missing}", f"the long table needs the columns {list(LONG_COLUMNS)}")
    if df.empty:
        _fail(path, "the table is empty", "give at least one query")
    if df.duplicated(["query_id", "model"]).any():
        _fail(path, "duplicate (query_id, model) rows", "keep one row per query and model")
    for col in ("quality", "cost"):  # a NaN in a row is a missing value, not a missing row: name the row
        bad = ~np.isfinite(pd.to_numeric(df[col], errors="coerce").to_numpy(float))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            where = f"line {i + 2}, " if path.suffix != ".parquet" else f"row {i}, "
            _fail(path, f"{int(bad.sum())} rows with a missing (NaN), non-numeric or infinite {col} (first: {where}"
                  f"query_id {df['query_id'].iloc[i]!r}, model {df['model'].iloc[i]!r}, {col} {df[col].iloc[i]!r})",
                  f"give every (query, model) row a finite {col}")
    models = sorted(df["model"].astype(str).unique())
    wide_q = df.pivot(index="query_id", columns="model", values="quality").reindex(columns=models)
    wide_c = df.pivot(index="query_id", columns="model", values="cost").reindex(columns=models)
    if wide_q.isna().any().any():
        _fail(path, "some queries lack a row for some model", "give every query one row per model")
    quality, cost = wide_q.to_numpy(float), wide_c.to_numpy(float)
    _check_values(path, quality, cost)
    return models, quality, cost


def pickle_cache_path(path: str | Path, cache_dir: str | Path = "data/cache") -> Path:
    """Where the parquet conversion of a RouterBench pickle lives: keyed by the SHA-256 of the pickle's content."""
    path = Path(path)
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return Path(cache_dir) / f"stageroute-{path.stem}-{digest[:20]}.parquet"


def read_routerbench(path: str | Path, allow_pickle: bool = False,
                     cache_dir: str | Path = "data/cache") -> tuple[list[str], np.ndarray, np.ndarray]:
    """(models, quality, cost) from RouterBench's wide table: a `.pkl` (with allow_pickle; converted once to a parquet
    cache under `cache_dir` keyed by its content hash) or a `.parquet` with the same columns."""
    path = Path(path)
    if path.suffix == ".pkl":
        if not path.exists():
            raise DatasetNotFoundError(path, "RouterBench pickle not found", "point root at routerbench_0shot.pkl")
        converted = pickle_cache_path(path, cache_dir)
        if not converted.exists():
            if not allow_pickle:
                _fail(path, "is a pickle, and reading a pickle can run code",
                      "set data.init_args.allow_pickle: true if you trust the file (it is converted once to a parquet "
                      f"cache in {cache_dir})")
            df = pd.read_pickle(path)
            if not isinstance(df, pd.DataFrame):
                _fail(path, f"holds a {type(df).__name__}, not a pandas DataFrame", "use RouterBench's released table")
            converted.parent.mkdir(parents=True, exist_ok=True)
            tmp = converted.with_name(f".{converted.name}.{os.getpid()}.tmp")
            df.to_parquet(tmp)
            tmp.replace(converted)
        path = converted
    if not path.exists():
        raise DatasetNotFoundError(path, "RouterBench table not found", "point root at routerbench_0shot.pkl")
    df = pd.read_parquet(path)
    models = [c[: -len(COST_SUFFIX)] for c in df.columns if str(c).endswith(COST_SUFFIX)]
    if not models:
        _fail(path, f"no '<model>{COST_SUFFIX}' columns", "use RouterBench's wide layout (or the long table format)")
    absent = [m for m in models if m not in df.columns]
    if absent:
        _fail(path, f"cost columns without a quality column: {absent}", "each model needs '<model>' and '<model>|total_cost'")
    quality = df[models].to_numpy(float)
    cost = df[[m + COST_SUFFIX for m in models]].to_numpy(float)
    _check_values(path, quality, cost)
    return models, quality, cost


def read_model_table(path: str | Path | None, models: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(release, retire, capacity) per model in `models` order from models.csv; defaults when `path` is None."""
    k = len(models)
    if path is None:
        return np.zeros(k), np.full(k, np.inf), np.ones(k)
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "model table not found", "write models.csv with model, release, capacity")
    df = pd.read_csv(path)
    for col in ("model", "release", "capacity"):
        if col not in df.columns:
            _fail(path, f"missing column {col!r}", "models.csv needs model, release, capacity (and optionally retire)")
    df["model"] = df["model"].astype(str)
    unknown = sorted(set(df["model"]) - set(models))
    if unknown:
        _fail(path, f"unknown model ids {unknown} (not in the quality table)", f"use ids of the quality table: {models}")
    lacking = sorted(set(models) - set(df["model"]))
    if lacking:
        _fail(path, f"no row for models {lacking}", "give every model of the quality table a row")
    df = df.set_index("model").reindex(models)
    release = df["release"].to_numpy(float)
    retire = df["retire"].fillna(np.inf).to_numpy(float) if "retire" in df.columns else np.full(k, np.inf)
    capacity = df["capacity"].to_numpy(float)
    if not ((release >= 0) & (release < 1)).all():
        _fail(path, "release outside [0, 1)", "release is the fraction of the query stream at which the model arrives")
    if not (retire > release).all():
        _fail(path, "retire is not after release", "retire (fraction of the stream) must exceed release, or be empty")
    if not ((capacity > 0) & (capacity <= 1)).all():
        _fail(path, "capacity outside (0, 1]", "capacity is the share of traffic a model can take")
    if not (release == 0).any():
        _fail(path, "no model is available at the start (release 0)", "give at least one model release 0")
    return release, retire, capacity


def read_workload(root: str | Path, allow_pickle: bool = False, cache_dir: str | Path = "data/cache") -> Workload:
    """A folder with quality.parquet|quality.csv (or a RouterBench .pkl/.parquet file) and optionally models.csv;
    `cache_dir` holds the parquet conversions of pickles."""
    root = Path(root)
    if not root.exists():
        raise DatasetNotFoundError(root, "workload not found", "point data.init_args.root at a folder with quality.parquet")
    if root.is_file():
        models, quality, cost = read_routerbench(root, allow_pickle, cache_dir)
        table = root.parent / "models.csv"
    else:
        found = [root / n for n in ("quality.parquet", "quality.csv") if (root / n).exists()]
        if not found:
            raise DatasetNotFoundError(root / "quality.parquet", "no quality table in the folder",
                                       "write quality.parquet (or .csv) with query_id, model, quality, cost")
        models, quality, cost = read_long_table(found[0])
        table = root / "models.csv"
    release, retire, capacity = read_model_table(table if table.exists() else None, models)
    return Workload(models, quality, cost, release, retire, capacity)


def write_workload(out_dir: str | Path, w: Workload) -> None:
    """The long table (quality.parquet) and models.csv: the format `read_workload` reads."""
    out_dir = Path(out_dir)
    n, k = w.quality.shape
    pd.DataFrame({"query_id": np.repeat(np.arange(n), k), "model": np.tile(np.asarray(w.models), n),
                  "quality": w.quality.ravel(), "cost": w.cost.ravel()}).to_parquet(out_dir / "quality.parquet")
    pd.DataFrame({"model": w.models, "release": w.release, "retire": np.where(np.isinf(w.retire), np.nan, w.retire),
                  "capacity": w.capacity}).to_csv(out_dir / "models.csv", index=False)
