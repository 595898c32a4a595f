"""Self-calibration: the risk's log-odds shifted by what this series' own past forecasts came to (v11).

The risk model misses in opposite directions on different traffic (docs/forecasting.md, Results, round 26: on one
trace family its 30-minute risk of 0.96 came true 55 % of the time, on another a risk of 0.15 came true 79 %), and a
sidecar cannot know in advance which traffic it serves. It can see how its own forecasts turned out: each minute the
forecaster records the model's risk 5, 15 and 30 minutes ahead, and once a horizon has passed it knows whether a
sustained saturation came within it. The shift ``δ`` of the log-odds that makes the recent forecasts match their
outcomes on average (recalibration in the large: a logistic intercept), under a normal prior around 0 with
standard deviation ``prior_sd``, is added to the model's log-odds to give the published risk (and the ETA read from
it). The warning reads the model's risk (``warning_reads``).

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
# CalibrationParams.warning_reads: the warning's risk from (the model's, the calibrated one).
WARNING_READS = {"model": lambda model, calibrated: model, "calibrated": lambda model, calibrated: calibrated,
                 "higher": max, "lower": min}


@dataclass(frozen=True)
class CalibrationParams:
    # The prior's standard deviation of δ (log-odds); 0: off (v10). 1 (v11): on the 41 tuning runs the Brier score
    # at 5 / 15 / 30 minutes 0.0297 / 0.0686 / 0.1030 against v10's 0.0297 / 0.0708 / 0.1079 (0.5: 0.0296 / 0.0697 /
    # 0.1054; 2: 0.0305 / 0.0694 / 0.1047; 1 over 2 hours of forecasts, not 6: 0.0300 / 0.0694 / 0.1044).
    prior_sd: float = 1.0
    window_seconds: float = 6 * 3600.0  # forecasts whose horizon ended within this long are counted
    quiet_seconds: float = 600.0  # after a saturation ends, this long is not scored (the scorer's rule)
    newton_steps: int = 3
    # What the warning reads: the model's risk ("model", v11: it warns exactly as v10), the calibrated one
    # ("calibrated"), or the higher or lower of the two ("higher", "lower"). On the 41 tuning runs (recall at 5
    # minutes, on 5 minutes before, false alarms; `forecast_sweep.py --round warning`): model 0.51 / 0.65 / 8,
    # calibrated 0.52 / 0.63 / 11 (at an on-level of 0.75: 0.46 / 0.58 / 8), higher 0.54 / 0.66 / 10, lower 0.49 /
    # 0.62 / 9: none is at least as good on all three.
    warning_reads: str = "model"

    def __post_init__(self) -> None:
        if self.warning_reads not in WARNING_READS:
            raise ValueError(f"warning_reads must be one of {sorted(WARNING_READS)}, not {self.warning_reads!r}")


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
    """Records the model's risks, learns their outcomes, and shifts new risks' log-odds by ``δ(h)``.

    Outcomes follow the scorer's events: a sustained saturation (the detector's, over ``event_window_seconds``)
    starts at the first saturated poll of the window that made it sustained and ends at its last saturated poll. A
    forecast is scored once ``event_window_seconds`` and a minute past its horizon have been seen (a saturation
    starting just before the horizon ends is known only when it has been sustained), and dropped where a gap in the
    polls of over ``max_gap_seconds`` falls before that: its horizon was not seen, so whether it came true is not
    known."""

    def __init__(self, params: CalibrationParams, bucket_seconds: float, *, event_window_seconds: float,
                 max_gap_seconds: float, horizons: Sequence[int] = RISK_HORIZONS_SECONDS) -> None:
        self.params = params
        self.bucket_seconds = bucket_seconds
        self.event_window_seconds = event_window_seconds
        self.max_gap_seconds = max_gap_seconds
        self._horizons = [_Horizon(float(h)) for h in horizons]
        self._saturations: deque[list[float]] = deque()  # [first, last] saturated poll of each sustained saturation
        self._in_saturation = False
        self._saturated_polls: deque[float] = deque()  # the saturated polls of the last event window
        self._last_poll: float | None = None

    @property
    def enabled(self) -> bool:
        return self.params.prior_sd > 0.0

    def clear(self) -> None:
        for h in self._horizons:
            h.clear()
        self._saturations.clear()
        self._saturated_polls.clear()
        self._in_saturation = False
        self._last_poll = None

    def observe(self, now: float, saturated: bool, sustained: bool) -> None:
        """Each poll: whether it was saturated, and whether the detector reads sustained saturation."""
        if self._last_poll is not None and now - self._last_poll > self.max_gap_seconds:
            for h in self._horizons:
                h.pending.clear()  # their horizons were not seen
            self._saturated_polls.clear()
            self._in_saturation = False
        self._last_poll = now
        if saturated:
            self._saturated_polls.append(now)
        while self._saturated_polls and self._saturated_polls[0] <= now - self.event_window_seconds:
            self._saturated_polls.popleft()
        if sustained and not self._in_saturation:
            polls = self._saturated_polls
            self._saturations.append([polls[0], polls[-1]] if polls else [now, now])
            self._prune(now)
        elif sustained and saturated:
            self._saturations[-1][1] = now
        self._in_saturation = sustained

    def record(self, now: float, risk: RiskEstimate) -> None:
        """At a minute's close, with the model's risk: score what has matured, record the new risk, and refit each
        horizon's shift."""
        p = self.params
        seen = now - self.event_window_seconds - self.bucket_seconds  # outcomes are known up to here
        for h in self._horizons:
            while h.pending and h.pending[0][0] + h.seconds <= seen:
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
        self._prune(now)

    def _prune(self, now: float) -> None:
        """Forget forecasts that would leave the window as soon as they were scored (none is scored while the
        forecaster is not warm: a restart loop), and saturations no pending forecast can meet."""
        for h in self._horizons:
            while h.pending and h.pending[0][0] + h.seconds < now - self.params.window_seconds:
                h.pending.popleft()
        oldest = min((h.pending[0][0] for h in self._horizons if h.pending), default=now)
        while len(self._saturations) > 1 and self._saturations[0][1] + self.params.quiet_seconds < oldest:
            self._saturations.popleft()

    def _during_or_after_saturation(self, t: float) -> bool:
        """The scorer does not score a forecast made during a saturation or within ``quiet_seconds`` after it."""
        return any(first <= t <= last + self.params.quiet_seconds for first, last in self._saturations)

    def _saturation_within(self, start: float, end: float) -> bool:
        """A saturation is in progress at some time in ``(start, end]`` (scoring.outcome_within)."""
        return any(first <= end and last > start for first, last in self._saturations)

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
