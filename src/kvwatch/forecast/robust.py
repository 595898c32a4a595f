"""Robust building blocks: Theil–Sen slope with Sen's confidence bounds, EWMA, damped trend.

Pure functions over plain floats (stdlib only, so the sidecar needs no numpy). Theil–Sen is the
median of pairwise slopes: it tolerates ~29 % outlying points and is unbiased under a sawtooth,
where least squares (what PromQL's ``predict_linear`` does) follows every burst.
"""

from __future__ import annotations

import bisect
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
    for j in range(1, n):
        slopes += _slopes_to(xs, ys, j)
    slopes.sort()
    return _fit(xs, ys, slopes, confidence)


class SlidingTheilSen:
    """:func:`theil_sen` for a window that slides forward a point or a few at a time, with the same results.

    Between two minutes most pairs of points stay in the window, so their slopes are kept, sorted, and only
    the pairs of the points that left or joined are removed or added (``bisect``: O(n) slopes a minute, not
    O(n²), and no sort). Any other change of the points (a restart, a window that jumped by more than half)
    refits from scratch. Removing a pair recomputes its slope with the very expression that added it, so the
    kept slopes are bit for bit those a fresh fit sorts. Points that are not finite are never kept (a NaN
    slope cannot be kept in order).
    """

    __slots__ = ("_slopes", "_xs", "_ys")

    def __init__(self) -> None:
        self._xs: list[float] = []
        self._ys: list[float] = []
        self._slopes: list[float] | None = None  # sorted pairwise slopes of _xs, _ys; None: nothing kept

    def fit(self, xs: Sequence[float], ys: Sequence[float], confidence: float = 0.80) -> SlopeFit | None:
        xs, ys = list(xs), list(ys)
        if len(xs) != len(ys):
            raise ValueError("xs and ys differ in length")
        finite = all(map(math.isfinite, xs)) and all(map(math.isfinite, ys))
        slopes = self._slid(xs, ys) if finite else None
        if slopes is None:
            slopes = []
            for j in range(1, len(xs)):
                slopes += _slopes_to(xs, ys, j)
            slopes.sort()
        self._xs, self._ys, self._slopes = xs, ys, slopes if finite else None
        if len(xs) < 3:
            return None
        return _fit(xs, ys, slopes, confidence)

    def _slid(self, xs: list[float], ys: list[float]) -> list[float] | None:
        """The kept slopes updated to ``xs, ys`` (all finite) when these are the kept points with ``d`` dropped
        from the front and some appended (``d`` at most the number kept); None otherwise."""
        old_xs, old_ys, slopes = self._xs, self._ys, self._slopes
        if slopes is None or not xs or xs[0] not in old_xs:
            return None
        dropped = old_xs.index(xs[0])
        kept = len(old_xs) - dropped
        if kept < dropped or kept > len(xs) or old_xs[dropped:] != xs[:kept] or old_ys[dropped:] != ys[:kept]:
            return None
        for i in range(dropped):
            for slope in _slopes_from(old_xs, old_ys, i):
                del slopes[bisect.bisect_left(slopes, slope)]
        for j in range(kept, len(xs)):
            for slope in _slopes_to(xs, ys, j):
                bisect.insort(slopes, slope)
        return slopes


def _slopes_to(xs: Sequence[float], ys: Sequence[float], j: int) -> list[float]:
    """The slopes of the pairs ``(i, j)``, ``i < j``; a pair with equal x has none."""
    xj, yj = xs[j], ys[j]
    return [(yj - ys[i]) / (xj - xs[i]) for i in range(j) if xs[i] != xj]


def _slopes_from(xs: Sequence[float], ys: Sequence[float], i: int) -> list[float]:
    """The slopes of the pairs ``(i, j)``, ``i < j``: :func:`_slopes_to`'s very expression, pair by pair."""
    xi, yi = xs[i], ys[i]
    return [(ys[j] - yi) / (xs[j] - xi) for j in range(i + 1, len(xs)) if xs[j] != xi]


def _fit(xs: Sequence[float], ys: Sequence[float], slopes: list[float], confidence: float) -> SlopeFit | None:
    """Sen's estimate and interval from the sorted pairwise ``slopes`` of the points ``xs, ys``."""
    if not slopes:
        return None
    n = len(xs)
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


def level_shift(ys: Sequence[float], residual_squares: float, ratio: float, min_segment: int,
                min_before: int = 1) -> tuple[int, float] | None:
    """(first index after the shift, mean after it), when one shift of level explains ``ys`` ``ratio`` times
    better than a line.

    ``residual_squares``: the line's Σ residual². A step up (a batch job starting) followed by a flat stretch
    leaves a line through both tilted, read above the plateau at its newest point, and its residuals count the
    step as noise. The best single break (at least ``min_segment`` points after it, to read a level from, and
    ``min_before`` before it: a step leaving the window's start tilts the line as much as one in its middle;
    the means of both sides) is the model when its Σ residual² is at most the line's divided by ``ratio``."""
    n = len(ys)
    if ratio <= 0 or n < min_before + min_segment or residual_squares <= 0:
        return None
    # Around the mean: sums of squares of raw values cancel catastrophically when the values barely vary.
    centre = sum(ys) / n
    ys = [y - centre for y in ys]
    total, total_sq = sum(ys), sum(y * y for y in ys)
    if total_sq <= n * (1e-9 * max(1.0, abs(centre))) ** 2:
        return None  # flat to within rounding: no shift to find
    best: float | None = None
    found = (0, 0.0)
    head = head_sq = 0.0
    for k in range(1, n):
        head += ys[k - 1]
        head_sq += ys[k - 1] ** 2
        if k < min_before or n - k < min_segment:
            continue
        tail, tail_sq = total - head, total_sq - head_sq
        squares = (head_sq - head * head / k) + (tail_sq - tail * tail / (n - k))
        if best is None or squares < best:
            best, found = squares, (k, tail / (n - k))
    if best is None or best * ratio > residual_squares:
        return None
    return found[0], found[1] + centre


def least_squares(points: Sequence[tuple[float, float]]) -> tuple[float, float, float, float, list[float]]:
    """(mean x, mean y, Σ(x − mean x)², slope, residuals) of a least-squares line through ``points``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    slope = sxy / sxx if sxx > 0 else 0.0
    return mx, my, sxx, slope, [y - my - slope * (x - mx) for x, y in points]
