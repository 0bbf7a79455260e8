"""Exit tables: what exit policies are fitted on, written by the platform and readable from any framework.

One `.npz` per split with
    logits   (N, S, C) float   the logits of every stage (exit head or cascade model) for every query
    labels   (N,) int          the true class
    cost     (S,) float        the cost of consulting each stage: for a `nested` network (early exits of one
                               backbone) the incremental cost of reaching exit i from exit i-1, for a `cascade` the
                               cost of running model i on its own
    kind     0-d string        `nested` or `cascade`
    cost_convention 0-d string `incremental` (as above) or `cumulative` (cost[i] = the total cost of consulting
                               stages 0..i, the common export of profilers: FLOPs or seconds up to exit i)
    latency  (S,) float        optional: the measured seconds per query of each stage, same convention as cost
Bring the exits of your own multi-exit network or cascade in this layout (numpy.savez) and point
`data.init_args.root` at the folder holding `calibration.npz` and `test.npz`.

Cost convention: policies add up the costs of the stages they consult, so a cumulative column read as incremental
would be summed twice. A `cumulative` table is converted to increments on reading (cost[0], cost[1] - cost[0], ...;
it must rise at every stage), and so is its latency. A table without `cost_convention` whose cost rises at every
stage is ambiguous (a cumulative column, or a cascade of growing models) and is refused with the fix; one whose cost
does not rise at every stage cannot be cumulative and is read as incremental. Tables the platform writes say
`incremental`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lit_iclr.core.errors import DatasetFormatError, DatasetNotFoundError

KINDS = ("nested", "cascade")
CONVENTIONS = ("incremental", "cumulative")
FIX = ("write it with numpy.savez(logits=[N, stages, classes], labels=[N], cost=[stages], kind='nested'|'cascade', "
       "cost_convention='incremental'|'cumulative')")


@dataclass
class ExitTable:
    logits: torch.Tensor      # (N, S, C)
    labels: torch.Tensor      # (N,)
    cost: torch.Tensor        # (S,) incremental (nested) or per-model (cascade); cumulative files are converted
    kind: str
    latency: torch.Tensor | None = None

    @property
    def stages(self) -> int:
        return self.logits.shape[1]

    def correct(self) -> torch.Tensor:
        """(N, S) bool: is stage i's prediction right."""
        return self.logits.argmax(-1) == self.labels[:, None]

    def save(self, path: str | Path) -> None:
        arrays = {"logits": self.logits.numpy(), "labels": self.labels.numpy(), "cost": self.cost.numpy(),
                  "kind": np.array(self.kind), "cost_convention": np.array("incremental")}
        if self.latency is not None:
            arrays["latency"] = self.latency.numpy()
        np.savez(path, **arrays)


def read_exit_table(path: str | Path) -> ExitTable:
    """Read and check one exit table; errors name the file, the problem and the fix."""
    path = Path(path)
    if not path.exists():
        raise DatasetNotFoundError(path, "exit table not found", "point data.init_args.root at a folder holding "
                                   "calibration.npz and test.npz exit tables (see seeds/ttamer.md)")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as e:
        raise DatasetFormatError(path, f"not a readable npz file ({e})", FIX) from e
    missing = [k for k in ("logits", "labels", "cost", "kind") if k not in arrays]
    if missing:
        raise DatasetFormatError(path, f"missing arrays {missing}", FIX)
    logits, labels, cost, kind = arrays["logits"], arrays["labels"], arrays["cost"], str(arrays["kind"])
    if logits.ndim != 3:
        raise DatasetFormatError(path, f"logits have shape {logits.shape}, expected (N, stages, classes)", FIX)
    n, s, c = logits.shape
    if labels.shape != (n,):
        raise DatasetFormatError(path, f"labels have shape {labels.shape}, expected ({n},) to match logits", FIX)
    if cost.shape != (s,):
        raise DatasetFormatError(path, f"cost has shape {cost.shape}, expected ({s},): one cost per stage", FIX)
    if kind not in KINDS:
        raise DatasetFormatError(path, f"kind is {kind!r}, expected one of {KINDS}", FIX)
    if not np.isfinite(logits).all():
        bad = int((~np.isfinite(logits)).any(axis=(1, 2)).sum())
        raise DatasetFormatError(path, f"logits of {bad} queries are NaN or infinite", "re-export the exits")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= c:
        raise DatasetFormatError(path, f"labels must be integers in [0, {c}), got range [{labels.min()}, {labels.max()}]",
                                 FIX)
    if not np.isfinite(cost).all() or (cost <= 0).any():
        raise DatasetFormatError(path, f"costs must be positive and finite, got {cost.tolist()}", FIX)
    latency = arrays.get("latency")
    if latency is not None and latency.shape != (s,):
        raise DatasetFormatError(path, f"latency has shape {latency.shape}, expected ({s},)", FIX)
    rising = s > 1 and bool((np.diff(cost) > 0).all())
    convention = str(arrays["cost_convention"]) if "cost_convention" in arrays else None
    if convention is None and rising:
        raise DatasetFormatError(path, f"cost {cost.tolist()} rises at every stage, as a cumulative column (cost up to "
                                 "stage i) does, and the table does not say whether it is cumulative or incremental",
                                 "add cost_convention='cumulative' (converted to per-stage increments) or "
                                 "'incremental' (per-stage costs as given) to the npz")
    if convention is not None and convention not in CONVENTIONS:
        raise DatasetFormatError(path, f"cost_convention is {convention!r}, expected one of {CONVENTIONS}", FIX)
    if convention == "cumulative":
        if s > 1 and not rising:
            raise DatasetFormatError(path, f"cost_convention is 'cumulative' but cost {cost.tolist()} does not rise at "
                                     "every stage", "give the total cost up to each stage, or cost_convention='incremental'")
        cost = np.diff(cost, prepend=0.0)  # per-stage increments: what consulting stage i adds
        if latency is not None:
            if not (np.diff(latency) >= 0).all():
                raise DatasetFormatError(path, "cost_convention is 'cumulative' but latency falls between stages",
                                         "give the latency up to each stage, in the same convention as cost")
            latency = np.diff(latency, prepend=0.0)
    return ExitTable(torch.from_numpy(logits.astype(np.float32)), torch.from_numpy(labels.astype(np.int64)),
                     torch.from_numpy(cost.astype(np.float64)), kind,
                     None if latency is None else torch.from_numpy(latency.astype(np.float64)))


def check_pair(calibration: ExitTable, test: ExitTable, where: Path) -> None:
    """The two splits must describe the same stages."""
    if calibration.logits.shape[1:] != test.logits.shape[1:] or calibration.kind != test.kind:
        raise DatasetFormatError(where, f"calibration {tuple(calibration.logits.shape[1:])} {calibration.kind} and test "
                                 f"{tuple(test.logits.shape[1:])} {test.kind} exits differ",
                                 "export both splits from the same network(s)")
    if not torch.allclose(calibration.cost, test.cost):
        raise DatasetFormatError(where, "calibration and test tables give different stage costs", "use one cost vector")


def overthinking_rate(table: ExitTable) -> float:
    """Share of queries that some exit gets right and a later exit gets wrong (the 'overthinking' regime)."""
    ok = table.correct()
    earlier_right = ok.cummax(dim=1).values          # some exit <= i was right
    later_wrong = earlier_right[:, :-1] & ~ok[:, 1:]  # ... and exit i+1 is wrong
    return float(later_wrong.any(dim=1).float().mean())
