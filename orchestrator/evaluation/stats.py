"""The few statistics an evaluation prints: percentiles, and the paired difference of two
configurations over the same tickets with its 95% confidence interval (Student's t)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Two-sided 95% quantiles of Student's t by degrees of freedom; past 30, the normal's.
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
Z_975 = 1.960


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100), linear between the closest ranks; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Paired:
    """The mean of per-ticket differences (ablated minus baseline) and its 95% interval."""

    delta: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        """For --json."""
        return {"delta": self.delta, "ci95": [self.low, self.high], "n": self.n}


def paired(baseline: Sequence[float], ablated: Sequence[float]) -> Paired:
    """The paired difference `ablated - baseline` over the same tickets, in order."""
    diffs = [b - a for a, b in zip(baseline, ablated, strict=True)]
    n = len(diffs)
    if n == 0:
        return Paired(0.0, 0.0, 0.0, 0)
    mean = statistics.fmean(diffs)
    if n == 1:
        return Paired(mean, mean, mean, 1)
    half = _t975(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return Paired(mean, mean - half, mean + half, n)


def _t975(df: int) -> float:
    return T_975[df - 1] if df <= len(T_975) else Z_975
