"""Small statistics helpers for benchmark tables: mean +- std over seeds and paired 95% confidence intervals."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class PairedCI:
    """Mean of the paired differences a - b with its two-sided t confidence interval over n pairs."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def significant(self) -> bool:
        """True when the interval excludes zero."""
        return self.low > 0 or self.high < 0

    def __str__(self) -> str:
        tag = "" if self.significant else ", not significant"
        return f"{self.mean:+.3g} [{self.low:+.3g}, {self.high:+.3g}]{tag}"


def paired_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95, finite_only: bool = False) -> PairedCI:
    """Paired t interval of mean(a_i - b_i); `a` and `b` are per-seed results of two methods on the same seeds.
    `finite_only` drops the pairs with a NaN or infinite value (a seed whose run produced no number); `n` counts the
    pairs kept."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_ci needs two 1-D arrays of equal length, got shapes {a.shape} and {b.shape}")
    d = a - b
    if finite_only:
        d = d[np.isfinite(a) & np.isfinite(b)]
    n = len(d)
    mean = float(d.mean()) if n else float("nan")
    if n < 2:
        return PairedCI(mean, float("-inf"), float("inf"), n)
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * d.std(ddof=1) / np.sqrt(n))
    return PairedCI(mean, mean - half, mean + half, n)


def ratio_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> str:
    """'mean [low, high]' of the paired ratios a_i / b_i with its t interval, e.g. per-block times of two sides of a
    speed benchmark measured in the same rounds."""
    ci = paired_ci([x / y for x, y in zip(a, b, strict=True)], [1.0] * len(a), level)
    return f"{1 + ci.mean:.3f} [{1 + ci.low:.3f}, {1 + ci.high:.3f}]"


def mean_std(values: Sequence[float], digits: int = 3) -> str:
    """'mean +- std' (sample std) with `digits` significant digits, for a table cell."""
    v = np.asarray(values, dtype=float)
    std = v.std(ddof=1) if len(v) > 1 else 0.0
    return f"{v.mean():.{digits}g} +- {std:.2g}"
