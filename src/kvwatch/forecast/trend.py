"""Trend forecaster: Theil–Sen slope of the per-minute p90 usage (the cross-check of the demand model).

Usage is capped at 1 by vLLM's admission control, so this forecaster flattens exactly when the cache
fills; it is only trusted for short horizons from a high level (the "urgent" branch of the warning).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvwatch.forecast.buckets import MinuteBucket
from kvwatch.forecast.robust import SlopeFit, theil_sen


@dataclass(frozen=True)
class TrendEstimate:
    level: float  # mean of the last few per-minute p90 usages
    slope_per_second: float
    slope_lower_per_second: float
    points: int
    eta_seconds: float  # to the saturation threshold; inf when not rising

    def forecast(self, horizon_seconds: float) -> float:
        return max(0.0, self.level + self.slope_per_second * horizon_seconds)


def estimate_trend(
    buckets: Sequence[MinuteBucket],
    *,
    bucket_seconds: float,
    window_buckets: int,
    min_points: int,
    level_points: int,
    u_sat: float,
    confidence: float,
    fit_line: Callable[[Sequence[float], Sequence[float], float], SlopeFit | None] = theil_sen,
) -> TrendEstimate | None:
    """Fit the last ``window_buckets`` minutes; None with fewer than ``min_points`` of them. ``fit_line``:
    :func:`theil_sen` or, for a caller that fits every minute, a :class:`SlidingTheilSen`'s ``fit``."""
    if not buckets:
        return None
    newest = buckets[-1].minute
    recent = [b for b in buckets if b.minute > newest - window_buckets]
    if len(recent) < min_points:
        return None
    fit = fit_line([float(b.minute) for b in recent], [b.u_p90 for b in recent], confidence)
    if fit is None:
        return None
    level = sum(b.u_p90 for b in recent[-level_points:]) / len(recent[-level_points:])
    slope = fit.slope / bucket_seconds
    if level >= u_sat:
        eta = 0.0
    elif slope > 0:
        eta = (u_sat - level) / slope
    else:
        eta = math.inf
    return TrendEstimate(
        level=level,
        slope_per_second=slope,
        slope_lower_per_second=fit.lower / bucket_seconds,
        points=len(recent),
        eta_seconds=eta,
    )
