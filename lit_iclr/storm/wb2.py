"""Reader for ERA5 in WeatherBench 2 layout (Zarr store, one netCDF file or a folder of netCDF files) through xarray.

Dims `time, level, latitude, longitude` (WB1 spellings `lat`, `lon` and `plev`/`pressure_level` are accepted), WB2
variable names. Arrays stay lazy (dask): a window is read when a sample is asked for, statistics are streamed over time
blocks, so a multi-year 1.5-degree store is never loaded whole. Latitude is returned ascending and longitude in
[0, 360) ascending whatever the file uses.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError

ALIASES = {"lat": "latitude", "lon": "longitude", "plev": "level", "pressure_level": "level", "isobaricInhPa": "level",
           "valid_time": "time"}


@dataclass(frozen=True)
class Channel:
    variable: str
    level: int | None  # None: a surface variable

    @property
    def name(self) -> str:
        return self.variable if self.level is None else f"{self.variable}_{self.level}"


def open_wb2(path: str | Path, dask: bool = True):
    """Open a WB2 Zarr store, a netCDF file or a folder of netCDF files lazily, with canonical dims and coordinates.

    `dask=False` opens a Zarr store or a single netCDF file without dask: indexing then reads exactly the chunks it
    touches through the backend, with none of dask's per-call graph building (a folder of netCDF files needs dask)."""
    import xarray as xr

    chunks = {} if dask else None

    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "no such file or folder", "point `data.init_args.root` at a WB2 .zarr store or "
                                   "netCDF file(s), or set it to null for the generated default")
    try:
        if path.is_dir() and not _is_zarr(path):
            zarrs = sorted(path.glob("*.zarr"))
            ncs = sorted(path.glob("*.nc"))
            if len(zarrs) == 1 and not ncs:
                return open_wb2(zarrs[0], dask)
            if not ncs:
                raise DatasetFormatError(path, "holds neither a Zarr store nor .nc files",
                                         "point root at a WB2 .zarr store or a folder of ERA5 netCDF files")
            ds = xr.open_mfdataset(ncs, engine="h5netcdf", combine="by_coords", chunks={}, data_vars="minimal",
                                   coords="minimal", compat="override")
        elif path.is_dir():
            ds = xr.open_zarr(path, chunks=chunks, consolidated=None)
        else:
            ds = xr.open_dataset(path, engine="h5netcdf", chunks=chunks)
    except (OSError, ValueError, KeyError) as e:
        if isinstance(e, DatasetFormatError):
            raise
        raise DatasetFormatError(path, f"cannot be opened as Zarr/netCDF ({type(e).__name__}: {e})",
                                 "check that the file is complete (re-download or regenerate it)") from e
    return canonical(ds, path)


def _is_zarr(path: Path) -> bool:
    return any((path / f).exists() for f in (".zgroup", ".zmetadata", "zarr.json"))


def canonical(ds, path: Path):
    """Rename aliases, check the grid, sort latitude ascending and longitude to [0, 360) ascending."""
    ds = ds.rename({k: v for k, v in ALIASES.items() if k in ds.dims or k in ds.coords})
    for dim in ("time", "latitude", "longitude"):
        if dim not in ds.dims:
            raise DatasetFormatError(path, f"has no `{dim}` dimension (dims: {sorted(ds.dims)})",
                                     "use the WB2 layout: dims time, level, latitude, longitude")
    lat = ds["latitude"].values
    lon = ds["longitude"].values
    if lat.size < 2 or lon.size < 2 or np.abs(lat).max() > 90 or lon.min() < -180 or lon.max() > 360:
        raise DatasetFormatError(path, f"latitude/longitude out of range or too short (lat {lat.min()}..{lat.max()}, "
                                 f"lon {lon.min()}..{lon.max()})", "write degrees north in [-90, 90] and degrees east")
    if not np.issubdtype(ds["time"].dtype, np.datetime64):
        raise DatasetFormatError(path, f"time has dtype {ds['time'].dtype}, not datetime64",
                                 "store time as CF datetimes (xarray decodes `hours since ...`)")
    ds = ds.assign_coords(longitude=np.mod(lon, 360.0)).sortby("longitude").sortby("latitude")
    if not (np.diff(ds["time"].values).astype(np.int64) > 0).all():
        ds = ds.sortby("time")
        if not (np.diff(ds["time"].values).astype(np.int64) > 0).all():
            raise DatasetFormatError(path, "duplicate time stamps", "drop duplicated times (ds.drop_duplicates('time'))")
    return ds


def parse_channels(ds, variables: list[str], levels: list[int] | None, path: Path,
                   problems: list[str] | None = None) -> list[Channel]:
    """`name` (all `levels`, or all levels in the store when None) or `name@level`; surface variables have no level.

    Every problem (missing variable, level, a static field listed as a variable) is collected; one
    `DatasetFormatError` lists them all, unless the caller passes `problems` to add more before raising.
    """
    own = problems is None
    problems = [] if own else problems
    channels = []
    for spec in variables:
        name, _, lev = spec.partition("@")
        if name not in ds.data_vars:
            problems.append(f"variable {name!r} not found")
            continue
        da = ds[name]
        if "time" not in da.dims:
            problems.append(f"{name!r} has no time dimension (a static field: list it under `static_variables`)")
            continue
        if "level" not in da.dims:
            if lev:
                problems.append(f"{name!r} is a surface variable; it has no level {lev}")
                continue
            channels.append(Channel(name, None))
            continue
        have = [int(x) for x in da["level"].values]
        wanted = [int(lev)] if lev else (list(levels) if levels is not None else have)
        for w in wanted:
            if w not in have:
                problems.append(f"{name!r} has no level {w}; levels there: {have}")
                continue
            channels.append(Channel(name, w))
    if own:
        raise_problems(problems, ds, path)
    return channels


def check_statics(ds, names: list[str], path: Path, problems: list[str] | None = None) -> None:
    own = problems is None
    problems = [] if own else problems
    for name in names:
        if name not in ds.data_vars:
            problems.append(f"static variable {name!r} not found")
            continue
        extra = set(ds[name].dims) - {"latitude", "longitude"}
        if extra:
            problems.append(f"static variable {name!r} has dims {ds[name].dims}, not (latitude, longitude)")
    if own:
        raise_problems(problems, ds, path)


def raise_problems(problems: list[str], ds, path: Path) -> None:
    """One `DatasetFormatError` listing every problem of a store that does not hold what the config asks for."""
    if problems:
        raise DatasetFormatError(path, f"{len(problems)} problem(s): " + "; ".join(problems)
                                 + f" (the store has {sorted(ds.data_vars)})",
                                 "choose `variables`, `levels` and `static_variables` among the store's (WB2 spelling)")


def region_index(lat: np.ndarray, lon: np.ndarray, region: list[float] | None) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the lat/lon box `[lat_min, lat_max, lon_min, lon_max]` (a lon box may cross 0 E: lon_min > lon_max)."""
    if region is None:
        return np.arange(lat.size), np.arange(lon.size)
    if len(region) != 4:
        raise ValueError(f"region must be [lat_min, lat_max, lon_min, lon_max], got {region}")
    la0, la1, lo0, lo1 = region
    ilat = np.flatnonzero((lat >= la0) & (lat <= la1))
    lo0, lo1 = lo0 % 360.0, lo1 % 360.0
    rel = (lon - lo0) % 360.0
    ilon = np.flatnonzero(rel <= (lo1 - lo0) % 360.0)
    ilon = ilon[np.argsort(rel[ilon], kind="stable")]  # eastward from lon_min, across 0 E when needed
    return ilat, ilon


def parse_periods(periods: list, path: Path | str = "config") -> list[tuple[np.datetime64, np.datetime64]]:
    """Years (2000) or inclusive date ranges ('2000-01-01:2000-02-15') -> [start, end) datetime64 pairs."""
    out = []
    for p in periods:
        s = str(p)
        if ":" in s:
            a, b = s.split(":")
            start, end = np.datetime64(a, "ns"), np.datetime64(b, "D") + np.timedelta64(1, "D")
        else:
            start, end = np.datetime64(f"{int(s)}-01-01", "ns"), np.datetime64(f"{int(s) + 1}-01-01", "ns")
        out.append((np.datetime64(start, "ns"), np.datetime64(end, "ns")))
    return out


def select_times(times: np.ndarray, periods: list) -> np.ndarray:
    """Indices of `times` inside any of the periods."""
    mask = np.zeros(times.shape, bool)
    for a, b in parse_periods(periods):
        mask |= (times >= a) & (times < b)
    return np.flatnonzero(mask)


def window_starts(times: np.ndarray, offsets_h: np.ndarray) -> np.ndarray:
    """Indices i (into `times`) for which every time `times[i] + offsets_h` exists: gaps and split edges are skipped."""
    t = times.astype("datetime64[ns]").astype(np.int64)
    need = t[:, None] + (offsets_h.astype(np.int64) * 3_600_000_000_000)[None, :]
    pos = np.searchsorted(t, need).clip(max=t.size - 1)
    ok = (t[pos] == need).all(1)
    inside = (need.min(1) >= t[0]) & (need.max(1) <= t[-1])  # windows a gap-free axis would have
    dropped = int((inside & ~ok).sum())
    if dropped:
        warnings.warn(f"{dropped} of {int(inside.sum())} forecast windows dropped: the time axis has gaps or a "
                      "non-uniform step there", stacklevel=2)
    return np.flatnonzero(ok)


def offsets_index(times: np.ndarray, starts: np.ndarray, offsets_h: np.ndarray) -> np.ndarray:
    """(n_starts, n_offsets) positions in `times` of `times[start] + offset`."""
    t = times.astype("datetime64[ns]").astype(np.int64)
    need = t[starts][:, None] + (offsets_h.astype(np.int64) * 3_600_000_000_000)[None, :]
    return np.searchsorted(t, need)


# reads of at most this many time steps bypass dask (`WB2Reader.read`): a batch's windows (batch x (history + leads),
# e.g. 16 x 6) go straight to the backend; the statistics' blocks of 256 steps use dask's threads
DIRECT_MAX_STEPS = 192


def _as_slice(idx: np.ndarray):
    """A slice for sorted contiguous indices (backends read a slice as one block; an index array is an orthogonal
    selection), else the indices."""
    idx = np.asarray(idx)
    if idx.size and (idx.size == 1 or (np.diff(idx) == 1).all()):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


class WB2Reader:
    """The selected channels of a store, optionally cropped to a region, read as (n, C, H, W) float32 arrays."""

    def __init__(self, path: str | Path, variables: list[str], levels: list[int] | None = None,
                 static_variables: list[str] | None = None, region: list[float] | None = None):
        self.path = Path(path)
        self.ds = open_wb2(self.path)
        problems: list[str] = []  # reported together: a foreign store needs one fix, not one launch per mistake
        self.channels = parse_channels(self.ds, variables, levels, self.path, problems)
        self.static_names = list(static_variables or [])
        check_statics(self.ds, self.static_names, self.path, problems)
        raise_problems(problems, self.ds, self.path)
        lat, lon = self.ds["latitude"].values, self.ds["longitude"].values
        self.ilat, self.ilon = region_index(lat, lon, region)
        if self.ilat.size < 4 or self.ilon.size < 4:
            raise DatasetFormatError(self.path, f"the region {region} holds {self.ilat.size} x {self.ilon.size} grid "
                                     "points", "choose a larger lat/lon box (at least 4 x 4 points)")
        self.lat, self.lon = lat[self.ilat], lon[self.ilon]
        self.times = self.ds["time"].values
        # a global grid when the longitudes are evenly spaced around the whole circle (then the model wraps around)
        dlon = np.diff(lon)
        self.periodic = region is None and np.allclose(dlon, 360.0 / lon.size, atol=1e-3)
        # one read per variable: the channels of a variable share its chunks (a WB2 chunk holds every level of one time
        # step), so reading them per channel decoded each chunk once per channel
        groups: dict[str, list[int]] = {}
        for k, c in enumerate(self.channels):
            groups.setdefault(c.variable, []).append(k)
        self._groups = [(v, np.asarray(ks), [self.channels[k].level for k in ks]) for v, ks in groups.items()]
        self._arrays = {v: self._array(self.ds, v, levels) for v, _, levels in self._groups}
        self._direct: dict | None = None  # the same arrays opened without dask, per process (see `read`)
        self._direct_pid: int | None = None

    def _array(self, ds, variable: str, levels: list[int | None]):
        da = ds[variable]
        if levels[0] is not None:
            da = da.sel(level=levels).transpose("time", "level", "latitude", "longitude")
        else:
            da = da.transpose("time", "latitude", "longitude")
        return da.isel(latitude=_as_slice(self.ilat), longitude=_as_slice(self.ilon))

    def _direct_arrays(self) -> dict:
        """The channel arrays of a store opened without dask (Zarr or one netCDF file), opened once per process: a
        forked loader worker opens its own handle."""
        if self._direct is None or self._direct_pid != os.getpid():
            self._direct_pid = os.getpid()
            if _is_zarr(self.path) or self.path.is_file() or len(list(self.path.glob("*.zarr"))) == 1:
                ds = open_wb2(self.path, dask=False)
                self._direct = {v: self._array(ds, v, levels) for v, _, levels in self._groups}
            else:
                self._direct = {}
        return self._direct

    @property
    def channel_names(self) -> list[str]:
        return [c.name for c in self.channels]

    def read(self, time_idx: np.ndarray) -> np.ndarray:
        """(len(time_idx), C, H, W) float32; NaN raises `DatasetFormatError` naming the variable and time."""
        uniq, inv = np.unique(np.asarray(time_idx), return_inverse=True)
        out = np.empty((uniq.size, len(self.channels), self.ilat.size, self.ilon.size), np.float32)
        # a few time steps (a training sample) are read without dask, whose graph per call cost more than the read;
        # long blocks (statistics) go through dask, which decodes their chunks on several threads
        arrays = self._direct_arrays() if uniq.size <= DIRECT_MAX_STEPS else {}
        for variable, ks, _ in self._groups:
            da = arrays.get(variable, self._arrays[variable])
            try:
                vals = da.isel(time=_as_slice(uniq)).values
                out[:, ks] = vals if vals.ndim == 4 else vals[:, None]
            except Exception as e:  # noqa: BLE001 - zarr/numcodecs/h5 raise many types for a damaged chunk
                names = ", ".join(self.channels[k].name for k in ks)
                raise DatasetFormatError(self.path, f"cannot read {names} at {self.times[uniq[0]]} .. "
                                         f"{self.times[uniq[-1]]} ({type(e).__name__}: {str(e).splitlines()[0][:150]})",
                                         "a chunk of the store is truncated or corrupt: re-download or regenerate it") from e
        bad = ~np.isfinite(out)
        if bad.any():
            i, k = np.argwhere(bad)[0][:2]
            name, when = self.channels[k].name, self.times[uniq[i]]
            if self._chunk_missing(self.channels[k].variable, int(uniq[i])):
                raise DatasetFormatError(self.path, f"the chunk of {name} holding {when} is missing from the store "
                                         "(read as NaN)", "re-download the store (or the missing chunk files)")
            raise DatasetFormatError(self.path, f"NaN/inf in {name} at {when}",
                                     "fill or drop the missing values (or exclude those dates from the periods)")
        return out[inv]

    def _chunk_missing(self, variable: str, time_index: int) -> bool:
        """True when `path` is a Zarr store and no chunk file of `variable` covers time `time_index`."""
        folder = self.path / variable
        if not (_is_zarr(self.path) and folder.is_dir()):
            return False
        chunks = self.ds[variable].encoding.get("chunks") or self.ds[variable].encoding.get("preferred_chunks")
        if isinstance(chunks, dict):
            chunks = [chunks.get(d, 1) for d in self.ds[variable].dims]
        if not chunks:
            return False
        t = time_index // int(chunks[list(self.ds[variable].dims).index("time")])
        v2 = list(folder.glob(f"{t}.*")) + list(folder.glob(f"{t}")) + list(folder.glob(f"{t}/*"))
        v3 = list((folder / "c").glob(f"{t}/*")) + list((folder / "c").glob(f"{t}"))
        return not (v2 or v3)

    def read_static(self) -> np.ndarray:
        """(S, H, W) float32 static fields, each standardised to zero mean and unit variance."""
        if not self.static_names:
            return np.zeros((0, self.ilat.size, self.ilon.size), np.float32)
        fields = []
        for name in self.static_names:
            a = self.ds[name].transpose("latitude", "longitude").values[self.ilat][:, self.ilon].astype(np.float32)
            if not np.isfinite(a).all():
                raise DatasetFormatError(self.path, f"NaN in static variable {name}", "fill the missing values")
            fields.append((a - a.mean()) / (a.std() + 1e-6))
        return np.stack(fields)

    def time_step_hours(self) -> float:
        if self.times.size < 2:
            raise DatasetFormatError(self.path, f"holds {self.times.size} time step(s)",
                                     "use a store with enough time steps for history + lead times")
        return float(np.median(np.diff(self.times)).astype("timedelta64[s]").astype(np.int64)) / 3600.0


def harmonic_basis(times: np.ndarray, n_harmonics: int) -> np.ndarray:
    """(n, 2K+1) design matrix [1, cos(2 pi k doy), sin(2 pi k doy)] of the annual cycle."""
    t = times.astype("datetime64[s]")
    year_start = t.astype("datetime64[Y]")
    doy = (t - year_start).astype(np.int64) / 86400.0 / 365.25
    cols = [np.ones_like(doy)]
    for k in range(1, n_harmonics + 1):
        cols += [np.cos(2 * np.pi * k * doy), np.sin(2 * np.pi * k * doy)]
    return np.stack(cols, 1)


def hour_of_day(times: np.ndarray) -> np.ndarray:
    t = times.astype("datetime64[s]")
    return ((t - t.astype("datetime64[D]")).astype(np.int64) // 3600).astype(np.int64)


def compute_stats(reader: WB2Reader, idx: np.ndarray, step: int, n_harmonics: int = 3, block: int = 256) -> dict:
    """Streaming statistics over the training time indices `idx` (one pass, `block` steps at a time).

    mean/std per channel; std of the `step`-ahead difference (the 6-h tendency) per channel; and the climatology for
    ACC: per hour of day, a least-squares fit of the annual cycle (mean + `n_harmonics` harmonics) per grid point.
    """
    C, H, W = len(reader.channels), reader.ilat.size, reader.ilon.size
    span_days = (reader.times[idx[-1]] - reader.times[idx[0]]) / np.timedelta64(1, "D")
    if span_days < 300:  # an annual cycle cannot be fitted from less than a year: the climatology is the mean
        n_harmonics = 0
    hods = np.unique(hour_of_day(reader.times[idx]))
    K = 2 * n_harmonics + 1
    s1 = np.zeros(C)
    s2 = np.zeros(C)
    d2 = np.zeros(C)
    nd = 0
    ata = np.zeros((hods.size, K, K))
    atx = np.zeros((hods.size, K, C * H * W))
    tset = set(idx.tolist())
    for b in range(0, idx.size, block):
        ib = idx[b:b + block]
        x = reader.read(ib).astype(np.float64)
        s1 += x.sum((0, 2, 3))
        s2 += (x**2).sum((0, 2, 3))
        nxt = np.array([i + step in tset for i in ib])
        if nxt.any():
            y = reader.read(ib[nxt] + step).astype(np.float64)
            d2 += ((y - x[nxt]) ** 2).sum((0, 2, 3))
            nd += int(nxt.sum())
        A = harmonic_basis(reader.times[ib], n_harmonics)
        h = np.searchsorted(hods, hour_of_day(reader.times[ib]))
        flat = x.reshape(len(ib), -1)
        for j in range(hods.size):
            sel = h == j
            ata[j] += A[sel].T @ A[sel]
            atx[j] += A[sel].T @ flat[sel]
    n = idx.size * H * W
    mean = s1 / n
    std = np.sqrt(np.maximum(s2 / n - mean**2, 1e-12))
    diff_std = np.sqrt(d2 / max(nd * H * W, 1)) if nd else std.copy()
    coef = np.stack([np.linalg.lstsq(ata[j] + 1e-9 * np.eye(K), atx[j], rcond=None)[0] for j in range(hods.size)])
    return {"mean": mean.astype(np.float32), "std": std.astype(np.float32),
            "diff_std": np.maximum(diff_std, 1e-6 * std).astype(np.float32),
            "clim_coef": coef.reshape(hods.size, K, C, H, W).astype(np.float32), "clim_hours": hods,
            "n_harmonics": np.array(n_harmonics)}


def climatology(stats: dict, times: np.ndarray) -> np.ndarray:
    """(n, C, H, W) climatology at `times`, in physical units (nearest fitted hour of day)."""
    A = harmonic_basis(times, int(stats["n_harmonics"]))
    hods = stats["clim_hours"]
    h = hour_of_day(times)
    j = np.abs(h[:, None] - hods[None, :]).argmin(1)
    coef = stats["clim_coef"]  # (nh, K, C, H, W)
    return np.einsum("nk,nkchw->nchw", A, coef[j]).astype(np.float32)


def stats_cache_key(reader: WB2Reader, periods: list, step: int, n_harmonics: int) -> str:
    p = reader.path.resolve()
    stamp = max((f.stat().st_mtime for f in [p, *p.glob("*")]), default=0.0)
    key = json.dumps([str(p), stamp, reader.channel_names, reader.lat.tolist()[:2], reader.lat.size,
                      reader.lon.tolist()[:2], reader.lon.size, [str(x) for x in periods], step, n_harmonics])
    return hashlib.sha1(key.encode()).hexdigest()[:16]


STATS_KEYS = {"mean", "std", "diff_std", "clim_coef", "clim_hours", "n_harmonics"}


def cached_stats(reader: WB2Reader, idx: np.ndarray, periods: list, step: int, cache_dir: Path,
                 n_harmonics: int = 3) -> dict:
    """`compute_stats` on the training times, cached as npz in `cache_dir` (keyed by store, channels, grid, periods)."""
    cache_dir = Path(cache_dir)
    f = cache_dir / f"storm-stats-{stats_cache_key(reader, periods, step, n_harmonics)}.npz"
    if f.exists():
        try:
            with np.load(f) as z:
                cached = {k: z[k] for k in z.files}
            if STATS_KEYS <= cached.keys():
                return cached
            problem = f"lacks {sorted(STATS_KEYS - cached.keys())}"
        except Exception as e:  # noqa: BLE001 - truncated/garbled: any failure means "recompute"
            problem = f"cannot be read ({type(e).__name__})"
        warnings.warn(f"{f}: statistics cache {problem}; recomputing it", stacklevel=2)
    stats = compute_stats(reader, idx, step, n_harmonics)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:  # a file object: np.savez would append .npz to a name
        np.savez(fh, **stats)
    os.replace(tmp, f)
    return stats
