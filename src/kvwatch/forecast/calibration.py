"""Self-calibration: the risk's log-odds shifted by what this series' own past forecasts came to (v11).

The risk model misses in opposite directions on different traffic (docs/forecasting.md, Results, round 26: on one
trace family its 30-minute risk of 0.96 came true 55 % of the time, on another a risk of 0.15 came true 79 %), and a
sidecar cannot know in advance which traffic it serves. It can see how its own forecasts turned out: each minute the
forecaster records the model's risk 5, 15 and 30 minutes ahead, and once a horizon has passed it knows whether a
sustained saturation came within it. The shift ``δ`` of the log-odds that makes the recent forecasts match their
outcomes on average (recalibration in the large: a logistic intercept), under a normal prior around 0 with
standard deviation ``prior_sd``, is added to the model's log-odds to give the published risk (and the ETA read from
it). The warning reads the model's risk unless ``drives_warning``.

Forecasts a minute apart over a 30-minute horizon share most of their outcome, so each pair weighs
``minute / horizon`` (about one independent outcome per horizon of forecasts): with little history the prior
holds ``δ`` near 0. Forecasts made during a saturation or in the quiet stretch after one are not scored, as
the backtest's scorer does not score them (backtest/scoring.py ``score_probabilities``). Pure and clock-free.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from kvwatch.forecast.risk import RISK_HORIZONS_SECONDS, RiskEstimate

_LOGIT_LIMIT = 8.0  # |log-odds| of recorded risks is capped here (risks of exactly 0 or 1 carry no odds)
_BINS = 64  # recorded log-odds are kept as counts in bins of width 2·_LOGIT_LIMIT/_BINS (0.25)
_BIN_WIDTH = 2 * _LOGIT_LIMIT / _BINS


@dataclass(frozen=True)
class CalibrationParams:
    # The prior's standard deviation of δ (log-odds); 0: off (v10). 1 (v11): on the 41 tuning runs the Brier score
    # at 5 / 15 / 30 minutes 0.0296 / 0.0687 / 0.1030 against v10's 0.0297 / 0.0708 / 0.1079 (0.5: 0.0295 / 0.0698 /
    # 0.1054; 2: 0.0308 / 0.0698 / 0.1047; 1 over 2 hours of forecasts, not 6: 0.0299 / 0.0695 / 0.1043).
    prior_sd: float = 1.0
    window_seconds: float = 6 * 3600.0  # forecasts whose horizon ended within this long are counted
    quiet_seconds: float = 600.0  # after a saturation ends, this long is not scored (the scorer's rule)
    newton_steps: int = 3
    # The warning reads the calibrated risk (True) or the model's (False, v11). Its thresholds were tuned on the
    # model's; read on the calibrated risk they warned less well on the tuning runs (on 5 minutes before 0.62 against
    # 0.65, false alarms 11 against 8, at a prior sd of 1), and on the model's it warns exactly as v10.
    drives_warning: bool = False


def _logit(p: float) -> float:
    p = min(max(p, 1e-12), 1.0 - 1e-12)
    return min(_LOGIT_LIMIT, max(-_LOGIT_LIMIT, math.log(p / (1.0 - p))))


def _bin_centre(i: int) -> float:
    return -_LOGIT_LIMIT + (i + 0.5) * _BIN_WIDTH


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


class _Horizon:
    """One horizon's pending forecasts and the binned outcomes of those whose horizon has passed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.pending: deque[tuple[float, int]] = deque()  # (made at, bin)
        self.scored: deque[tuple[float, int, bool]] = deque()  # (horizon ended at, bin, came true)
        self.hits = [0] * _BINS
        self.misses = [0] * _BINS
        self.shift = 0.0

    def clear(self) -> None:
        self.pending.clear()
        self.scored.clear()
        self.hits = [0] * _BINS
        self.misses = [0] * _BINS
        self.shift = 0.0

    def fit(self, prior_sd: float, weight: float, steps: int) -> None:
        """Newton steps on the penalized log-likelihood of ``δ`` (from the last shift: it moves slowly)."""
        precision = 1.0 / (prior_sd * prior_sd)
        delta = self.shift
        for _ in range(steps):
            gradient, curvature = delta * precision, precision
            for i in range(_BINS):
                n1, n0 = self.hits[i], self.misses[i]
                if n1 or n0:
                    p = _sigmoid(_bin_centre(i) + delta)
                    gradient += weight * ((n1 + n0) * p - n1)
                    curvature += weight * (n1 + n0) * p * (1.0 - p)
            delta -= gradient / curvature
        self.shift = delta


class SelfCalibration:
    """Records the published risks, learns their outcomes, and shifts new risks' log-odds by ``δ(h)``."""

    def __init__(self, params: CalibrationParams, bucket_seconds: float,
                 horizons: Sequence[int] = RISK_HORIZONS_SECONDS) -> None:
        self.params = params
        self.bucket_seconds = bucket_seconds
        self._horizons = [_Horizon(float(h)) for h in horizons]
        self._saturations: deque[list[float]] = deque()  # [start, last saturated poll] of sustained saturation
        self._saturated = False

    @property
    def enabled(self) -> bool:
        return self.params.prior_sd > 0.0

    def clear(self) -> None:
        for h in self._horizons:
            h.clear()
        self._saturations.clear()
        self._saturated = False

    def observe(self, now: float, sustained: bool) -> None:
        """Each poll: whether the series is in sustained saturation (the detector's, as the recurrence reads it)."""
        if sustained:
            if self._saturated:
                self._saturations[-1][1] = now
            else:
                self._saturations.append([now, now])
        self._saturated = sustained

    def record(self, now: float, risk: RiskEstimate) -> None:
        """At a minute's close, with the risk before calibration: score what has matured, record the new risk,
        and refit each horizon's shift."""
        p = self.params
        for h in self._horizons:
            while h.pending and h.pending[0][0] + h.seconds <= now:
                made, i = h.pending.popleft()
                if self._during_or_after_saturation(made):
                    continue
                came_true = self._saturation_within(made, made + h.seconds)
                h.scored.append((made + h.seconds, i, came_true))
                (h.hits if came_true else h.misses)[i] += 1
            while h.scored and h.scored[0][0] < now - p.window_seconds:
                _, i, came_true = h.scored.popleft()
                (h.hits if came_true else h.misses)[i] -= 1
            h.pending.append((now, min(_BINS - 1, int((_logit(risk.at(h.seconds)) + _LOGIT_LIMIT) / _BIN_WIDTH))))
            h.fit(p.prior_sd, min(1.0, self.bucket_seconds / h.seconds), p.newton_steps)
        oldest = min((h.pending[0][0] for h in self._horizons if h.pending), default=now)
        while self._saturations and self._saturations[0][1] + p.quiet_seconds < oldest:
            self._saturations.popleft()

    def _during_or_after_saturation(self, t: float) -> bool:
        return any(start <= t <= last + self.params.quiet_seconds for start, last in self._saturations)

    def _saturation_within(self, start: float, end: float) -> bool:
        return any(s <= end and last > start for s, last in self._saturations)

    def shifts(self) -> tuple[float, ...]:
        """``δ`` per horizon (RISK_HORIZONS_SECONDS), log-odds."""
        return tuple(h.shift for h in self._horizons)

    def apply(self, risk: RiskEstimate) -> RiskEstimate:
        """The risk curve with each minute's log-odds shifted by ``δ`` interpolated between the horizons (the
        first horizon's below it, the last's beyond), kept non-decreasing; risks of exactly 0 or 1 stay."""
        if not self.enabled:
            return risk
        knots = [(h.seconds, h.shift) for h in self._horizons]
        out: list[float] = []
        highest = 0.0
        for minute, r in enumerate(risk.risk, start=1):
            if 0.0 < r < 1.0:
                r = _sigmoid(math.log(r / (1.0 - r)) + _interpolate(knots, minute * risk.bucket_seconds))
            highest = max(highest, r)
            out.append(highest)
        return replace(risk, risk=tuple(out))


def _interpolate(knots: Sequence[tuple[float, float]], x: float) -> float:
    if x <= knots[0][0]:
        return knots[0][1]
    for (x0, y0), (x1, y1) in pairwise(knots):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return knots[-1][1]
