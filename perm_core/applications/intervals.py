"""Confidence intervals for a handful of runs: Student's t-interval of a mean, and of a paired difference."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class Interval:
    """mean ± t(confidence, n - 1) · s / sqrt(n) of n values."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float

    @property
    def half_width(self) -> float:
        return self.high - self.mean

    def above(self, value: float = 0.0) -> bool:
        return self.low > value

    def below(self, value: float = 0.0) -> bool:
        return self.high < value


def t_interval(values, confidence: float = 0.95) -> Interval:
    """The two-sided t-interval of the mean of `values` (at least two of them)."""
    values = [float(v) for v in values]
    n = len(values)
    if n < 2:
        raise ValueError(f"an interval needs at least two values, got {n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    mean = sum(values) / n
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1) * spread / math.sqrt(n))
    return Interval(mean, mean - half, mean + half, n, confidence)


def paired_difference(after, before, confidence: float = 0.95) -> Interval:
    """The t-interval of after[i] - before[i]: two methods measured on the same runs."""
    if len(after) != len(before):
        raise ValueError("a paired difference needs the same runs on both sides")
    return t_interval([a - b for a, b in zip(after, before, strict=True)], confidence)
