"""Robust building blocks: Theil–Sen slope with Sen's confidence bounds, EWMA, damped trend.

Pure functions over plain floats (stdlib only, so the sidecar needs no numpy). Theil–Sen is the
median of pairwise slopes: it tolerates ~29 % outlying points and is unbiased under a sawtooth,
where least squares (what PromQL's ``predict_linear`` does) follows every burst.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist


@dataclass(frozen=True)
class SlopeFit:
    """A Theil–Sen fit: ``slope`` per x unit, two-sided confidence bounds, intercept at ``x = 0``."""

    slope: float
    lower: float
    upper: float
    intercept: float
    n: int

    @property
    def significantly_positive(self) -> bool:
        return self.lower > 0.0


def theil_sen(xs: Sequence[float], ys: Sequence[float], confidence: float = 0.80) -> SlopeFit | None:
    """Median pairwise slope with Sen's (Kendall-τ based) ``confidence`` interval; None below 3 points.

    The interval takes the order statistics ``(N ∓ z·σ_S)/2`` of the ``N`` sorted pairwise slopes, with
    ``σ_S² = n(n−1)(2n+5)/18`` the variance of Kendall's S without ties (Sen 1968).
    """
    n = len(xs)
    if n != len(ys):
        raise ValueError("xs and ys differ in length")
    if n < 3:
        return None
    slopes: list[float] = []
    for i in range(n - 1):
        xi, yi = xs[i], ys[i]
        for j in range(i + 1, n):
            dx = xs[j] - xi
            if dx != 0.0:
                slopes.append((ys[j] - yi) / dx)
    if not slopes:
        return None
    slopes.sort()
    count = len(slopes)
    slope = _median_sorted(slopes)
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lo_index = max(0, math.floor((count - c) / 2.0) - 1)  # 1-based order statistic -> 0-based
    hi_index = min(count - 1, math.ceil((count + c) / 2.0))
    intercept = _median([y - slope * x for x, y in zip(xs, ys, strict=True)])
    return SlopeFit(slope=slope, lower=slopes[lo_index], upper=slopes[hi_index], intercept=intercept, n=n)


def _median_sorted(values: Sequence[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else 0.5 * (values[mid - 1] + values[mid])


def _median(values: Sequence[float]) -> float:
    return _median_sorted(sorted(values))


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default), ``q`` in [0, 1]; values need not be sorted."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def ewma_alpha(halflife_steps: float) -> float:
    """Smoothing weight of one new point for an EWMA whose weights halve every ``halflife_steps``."""
    if halflife_steps <= 0:
        return 1.0
    return 1.0 - 0.5 ** (1.0 / halflife_steps)


class Ewma:
    """Exponentially weighted mean; the first value seeds it (no bias towards zero)."""

    __slots__ = ("_alpha", "value")

    def __init__(self, halflife_steps: float) -> None:
        self._alpha = ewma_alpha(halflife_steps)
        self.value: float | None = None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else self.value + self._alpha * (x - self.value)
        return self.value


def damped_trend_offset(slope: float, phi: float, steps: float) -> float:
    """Cumulative damped-trend increment ``slope·(φ + φ² + … + φ^h)`` after ``steps`` (Gardner–McKenzie)."""
    if steps <= 0:
        return 0.0
    if phi >= 1.0:
        return slope * steps
    return slope * phi * (1.0 - phi**steps) / (1.0 - phi)
