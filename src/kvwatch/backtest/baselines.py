"""What operators run today, re-implemented on the same 10-s sample stream kvwatch sees.

Each baseline is fed ``observe(timestamp, usage) -> bool`` (warning active) in time order. ``for``
durations follow Prometheus: the condition must hold at every evaluation for that long (pending →
firing) and any false evaluation resets it.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import NormalDist

from kvwatch.forecast.thresholds import SATURATION_USAGE


class ForDuration:
    """Prometheus ``for:``: true once the condition has held continuously for ``seconds``."""

    __slots__ = ("_since", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._since: float | None = None

    def update(self, timestamp: float, condition: bool) -> bool:
        if not condition:
            self._since = None
            return False
        if self._since is None:
            self._since = timestamp
        return timestamp - self._since >= self.seconds


class ThresholdBaseline:
    """Static threshold: ``usage >= threshold for: 1m``."""

    def __init__(self, threshold: float = SATURATION_USAGE, for_seconds: float = 60.0) -> None:
        self.threshold = threshold
        self._for = ForDuration(for_seconds)

    def observe(self, timestamp: float, usage: float) -> bool:
        return self._for.update(timestamp, usage >= self.threshold)


class LinearFit:
    """Least squares over a sliding time window, O(1) per sample (PromQL ``predict_linear``/``deriv``)."""

    def __init__(self, window_seconds: float) -> None:
        self.window_seconds = window_seconds
        self._points: deque[tuple[float, float]] = deque()
        self._origin: float | None = None
        self._n = 0
        self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0

    def add(self, timestamp: float, value: float) -> None:
        if self._origin is None:
            self._origin = timestamp
        x = (timestamp - self._origin) / 60.0  # minutes keep the sums well conditioned
        self._points.append((x, value))
        self._n += 1
        self._sx += x
        self._sy += value
        self._sxx += x * x
        self._sxy += x * value
        self._syy += value * value
        # Prometheus ranges are left-open: (t - range, t].
        while self._points and self._points[0][0] <= x - self.window_seconds / 60.0:
            ox, oy = self._points.popleft()
            self._n -= 1
            self._sx -= ox
            self._sy -= oy
            self._sxx -= ox * ox
            self._sxy -= ox * oy
            self._syy -= oy * oy

    def predict(self, timestamp: float, horizon_seconds: float) -> float | None:
        """Value on the fitted line ``horizon_seconds`` after ``timestamp`` (intercept at eval time)."""
        if self._n < 2 or self._origin is None:
            return None
        denominator = self._n * self._sxx - self._sx * self._sx
        if denominator <= 1e-12:
            return None
        slope = (self._n * self._sxy - self._sx * self._sy) / denominator
        intercept = (self._sy - slope * self._sx) / self._n
        x = (timestamp - self._origin) / 60.0 + horizon_seconds / 60.0
        return intercept + slope * x


    def residual_sd(self) -> float | None:
        """Standard deviation of the points around the fitted line (None below 3 points)."""
        if self._n < 3:
            return None
        n = self._n
        sxx = self._sxx - self._sx * self._sx / n
        sxy = self._sxy - self._sx * self._sy / n
        syy = self._syy - self._sy * self._sy / n
        if sxx <= 1e-12:
            return None
        return math.sqrt(max(0.0, (syy - sxy * sxy / sxx) / (n - 2)))


class PredictLinearProbability:
    """``predict_linear(usage[30m], h)`` turned into a probability: the chance the fitted line plus Gaussian
    residual noise is at or above the threshold at ``h`` (the reference forecast of the calibration table)."""

    def __init__(self, window_seconds: float = 1800.0, threshold: float = SATURATION_USAGE) -> None:
        self.threshold = threshold
        self._fit = LinearFit(window_seconds)

    def observe(self, timestamp: float, usage: float, horizons: tuple[int, ...]) -> dict[int, float | None]:
        self._fit.add(timestamp, usage)
        sd = self._fit.residual_sd()
        out: dict[int, float | None] = {}
        for h in horizons:
            predicted = self._fit.predict(timestamp, h)
            if predicted is None or sd is None:
                out[h] = None
            elif sd <= 1e-9:
                out[h] = 1.0 if predicted >= self.threshold else 0.0
            else:
                out[h] = 1.0 - NormalDist().cdf((self.threshold - predicted) / sd)
        return out


class PredictLinearBaseline:
    """``[usage >= level_floor and] predict_linear(usage[window], horizon) >= threshold for: ...``."""

    def __init__(
        self,
        window_seconds: float = 1800.0,
        horizon_seconds: float = 1800.0,
        threshold: float = SATURATION_USAGE,
        level_floor: float | None = None,
        for_seconds: float = 0.0,
    ) -> None:
        self.horizon_seconds = horizon_seconds
        self.threshold = threshold
        self.level_floor = level_floor
        self._fit = LinearFit(window_seconds)
        self._for = ForDuration(for_seconds)

    def observe(self, timestamp: float, usage: float) -> bool:
        self._fit.add(timestamp, usage)
        predicted = self._fit.predict(timestamp, self.horizon_seconds)
        condition = predicted is not None and predicted >= self.threshold
        if self.level_floor is not None:
            condition = condition and usage >= self.level_floor
        return self._for.update(timestamp, condition)


class HoltBaseline:
    """Holt's linear smoothing on per-minute mean usage, extrapolated ``horizon``; ``for: 5m``.

    Implemented directly: PromQL's ``double_exponential_smoothing`` returns only the level.
    """

    def __init__(
        self,
        alpha: float = 0.3,
        beta: float = 0.1,
        horizon_minutes: float = 30.0,
        threshold: float = SATURATION_USAGE,
        for_seconds: float = 300.0,
        bucket_seconds: float = 60.0,
    ) -> None:
        self.alpha, self.beta = alpha, beta
        self.horizon_minutes = horizon_minutes
        self.threshold = threshold
        self.bucket_seconds = bucket_seconds
        self._for = ForDuration(for_seconds)
        self._minute: int | None = None
        self._sum = 0.0
        self._count = 0
        self._level: float | None = None
        self._trend = 0.0
        self._condition = False

    def observe(self, timestamp: float, usage: float) -> bool:
        minute = int(timestamp // self.bucket_seconds)
        if self._minute is not None and minute != self._minute and self._count:
            self._fold(self._sum / self._count)
            self._sum, self._count = 0.0, 0
        self._minute = minute
        self._sum += usage
        self._count += 1
        return self._for.update(timestamp, self._condition)

    def _fold(self, value: float) -> None:
        if self._level is None:
            self._level = value
            return
        previous = self._level
        self._level = self.alpha * value + (1 - self.alpha) * (previous + self._trend)
        self._trend = self.beta * (self._level - previous) + (1 - self.beta) * self._trend
        self._condition = self._level + self.horizon_minutes * self._trend >= self.threshold


def make_baselines() -> dict[str, ThresholdBaseline | PredictLinearBaseline | HoltBaseline]:
    """Fresh instances of every baseline, keyed like the JSON output."""
    return {
        "threshold": ThresholdBaseline(SATURATION_USAGE, for_seconds=60.0),
        "predict_linear": PredictLinearBaseline(1800.0, 1800.0, SATURATION_USAGE),
        "guarded_predict_linear": PredictLinearBaseline(1800.0, 1800.0, 1.0, level_floor=0.7, for_seconds=300.0),
        "holt": HoltBaseline(),
    }
