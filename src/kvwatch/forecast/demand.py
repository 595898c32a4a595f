"""Demand forecaster: Little's law in token-time, projected with a damped robust trend of the rate.

Time-average KV tokens in use ``E[K] = λ·A`` with ``A`` the KV token-seconds one request holds. ``A`` is
measured, not modelled (``ΣK / Σλ`` over 30 minutes, so it includes block rounding, prefix sharing and
the current decode speed), and a request-mix index from the length histograms moves it at once when the
mix shifts. The arrival rate ``λ`` is projected with a Theil–Sen slope damped by ``φ`` per minute, and a
burst factor (a high quantile of the polls over their mean) turns the mean into the peaks that actually saturate. The
result is in unbounded demand units: it keeps rising where usage flattens at 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.forecast.buckets import MinuteBucket
from kvwatch.forecast.robust import (
    Ewma,
    SlidingTheilSen,
    damped_trend_offset,
    least_squares,
    level_shift,
    quantile,
    theil_sen,
)
from kvwatch.forecast.thresholds import BUCKET_SECONDS, SATURATION_USAGE, whole_requests


@dataclass(frozen=True)
class DemandParams:
    bucket_seconds: float = BUCKET_SECONDS
    a_window_buckets: int = 30
    a_halflife_buckets: float = 10.0
    mix_correction: bool = False  # off by default: noisier than it helps on the tuning traces
    mix_window_buckets: int = 5
    mix_correction_halflife_buckets: float = 30.0
    rate_halflife_buckets: float = 5.0
    rate_window_buckets: int = 60
    rate_min_points: int = 10
    rate_shrink_points: float = 0.0
    burst_window_buckets: int = 30
    burst_quantile: float = 0.98
    damping: float = 0.97
    # Decode steps slow down as the batch grows, so each request holds its KV longer: A ∝ λ^κ near the knee.
    knee_elasticity: float = 0.5
    confidence: float = 0.90
    max_horizon_buckets: int = 60
    u_sat: float = SATURATION_USAGE
    # v8: where one shift of level explains the window's rates this many times better than a line
    # (robust.level_shift), the trend is fitted on the rates since it (none before rate_min_points of them): a
    # step in the load, up or down, is not a ramp that goes on. 0: off (v6).
    shift_ratio: float = 3.0


@dataclass(frozen=True)
class DemandEstimate:
    capacity_tokens: float
    token_seconds_per_request: float  # Â now (mix-corrected when histograms exist)
    rate_level: float  # λ_ℓ, arrivals per second
    rate_slope: float  # per second per second
    rate_slope_lower: float
    burst_factor: float
    tokens_per_running_request: float | None
    damping: float
    bucket_seconds: float
    u_sat: float
    eta_seconds: float
    knee_elasticity: float = 0.0

    @property
    def demand_tokens(self) -> float:
        return self.rate_level * self.token_seconds_per_request

    def rate_at(self, horizon_seconds: float) -> float:
        steps = horizon_seconds / self.bucket_seconds
        slope_per_step = self.rate_slope * self.bucket_seconds
        return max(0.0, self.rate_level + damped_trend_offset(slope_per_step, self.damping, steps))

    def forecast(self, horizon_seconds: float) -> float:
        """Predicted peak usage in demand units (may exceed 1) ``horizon_seconds`` ahead."""
        rate = self.rate_at(horizon_seconds)
        if rate <= 0.0:
            return 0.0
        if self.rate_level <= 0:
            return rate * self.token_seconds_per_request / self.capacity_tokens
        growth = rate / self.rate_level
        # Relative bursts shrink like 1/sqrt(load): more requests average out.
        burst = 1.0 + (self.burst_factor - 1.0) / math.sqrt(growth)
        knee = min(2.0, max(1.0, growth) ** self.knee_elasticity)
        return rate * self.token_seconds_per_request * knee * burst / self.capacity_tokens

    @property
    def saturation_rate(self) -> float:
        """λ* = the arrival rate at which the burst peaks reach the saturation threshold."""
        return self.u_sat * self.capacity_tokens / (self.token_seconds_per_request * self.burst_factor)

    @property
    def headroom_rate(self) -> float:
        return self.saturation_rate - self.rate_level

    @property
    def recommended_max_concurrency(self) -> int | None:
        if not self.tokens_per_running_request:
            return None
        return whole_requests(self.u_sat * self.capacity_tokens / self.tokens_per_running_request)


def burst_factor(buckets: Sequence[MinuteBucket], window_buckets: int, q: float) -> float:
    """High quantile over mean of the raw polls of the last ``window_buckets`` minutes (≥ 1).

    Preemption starts when the cache is full for an instant, so what matters is how far single polls
    rise above the mean, across minutes as well as within them.
    """
    newest = buckets[-1].minute
    usages = [u for b in buckets if b.minute > newest - window_buckets for u in b.usages]
    if len(usages) < 10:
        return 1.0
    mean = sum(usages) / len(usages)
    return max(1.0, quantile(usages, q) / mean) if mean > 0 else 1.0


def _mean_lengths(buckets: Sequence[MinuteBucket]) -> tuple[float, float] | None:
    """Mean prompt and output length of requests that finished in ``buckets`` (from histogram deltas)."""
    ps = pc = gs = gc = 0.0
    for b in buckets:
        if None in (b.request_prompt_sum, b.request_prompt_count, b.request_generation_sum,
                    b.request_generation_count):
            return None
        ps += b.request_prompt_sum or 0.0
        pc += b.request_prompt_count or 0.0
        gs += b.request_generation_sum or 0.0
        gc += b.request_generation_count or 0.0
    if pc <= 0 or gc <= 0 or ps <= 0:
        # (no prompt is empty, vLLM refuses one: a prompt sum of 0 over finished requests is an exporter's stub)
        return None
    return ps / pc, gs / gc


def mix_index(mean_prompt: float, mean_output: float) -> float:
    """Token-time footprint shape ``P·D + D²/2 + P``: prompt held while decoding, output growing, prefill."""
    return mean_prompt * mean_output + 0.5 * mean_output * mean_output + mean_prompt


class DemandModel:
    """Stateful per-series estimator, updated once per closed minute."""

    def __init__(self, params: DemandParams) -> None:
        self.params = params
        self._a = Ewma(params.a_halflife_buckets)
        self._mix_correction = Ewma(params.mix_correction_halflife_buckets)
        self._rate = Ewma(params.rate_halflife_buckets)
        self._rate_fit = SlidingTheilSen()  # the rate's window slides a minute per update

    def update(self, buckets: Sequence[MinuteBucket], first_fit_minute: int | None = None) -> DemandEstimate | None:
        """Fold in the newest bucket (``buckets[-1]``) and estimate from the recent ones.

        The rate slope is fitted only on minutes from ``first_fit_minute`` (after a restart's warm-up,
        traffic returning is not a trend).
        """
        p = self.params
        newest = buckets[-1]
        capacity = newest.capacity_tokens
        arrival = newest.arrival_rate
        if arrival is not None:
            self._rate.update(arrival)
        window = [b for b in buckets if b.minute > newest.minute - p.a_window_buckets]
        measured = [(k, r) for b in window if (k := b.k_mean) is not None and (r := b.departure_rate) is not None]
        k_sum = sum(k for k, _ in measured)
        rate_sum = sum(r for _, r in measured)
        if rate_sum > 0 and k_sum > 0:
            a_now = self._a.update(k_sum / rate_sum)
            lengths = _mean_lengths(window)
            if lengths is not None:
                self._mix_correction.update(a_now / mix_index(*lengths))
        if capacity is None or capacity <= 0 or self._a.value is None or self._rate.value is None:
            return None
        a_est = self._a.value
        recent_lengths = _mean_lengths(window[-p.mix_window_buckets:])
        if p.mix_correction and recent_lengths is not None and self._mix_correction.value is not None:
            a_est = self._mix_correction.value * mix_index(*recent_lengths)
        rate_points = [
            (float(b.minute), rate)
            for b in buckets
            if b.minute > newest.minute - p.rate_window_buckets and (rate := b.arrival_rate) is not None
            and (first_fit_minute is None or b.minute >= first_fit_minute)
        ]
        slope = lower = 0.0
        if len(rate_points) >= p.rate_min_points:
            fit = self._rate_fit.fit([x for x, _ in rate_points], [y for _, y in rate_points], p.confidence)
            shift = _shift_at(rate_points, p.shift_ratio) if p.shift_ratio else None
            if shift is not None:
                # A shift of level (v8): the trend is the rates' since it, if there are enough of them to fit.
                rate_points = rate_points[shift:]
                fit = (theil_sen([x for x, _ in rate_points], [y for _, y in rate_points], p.confidence)
                       if len(rate_points) >= p.rate_min_points else None)
            if fit is not None:
                # Shrink short fits towards "no trend": a few 5-minute swings of a bursty trace are not a ramp.
                shrink = len(rate_points) / (len(rate_points) + p.rate_shrink_points)
                slope, lower = shrink * fit.slope / p.bucket_seconds, shrink * fit.lower / p.bucket_seconds
        running = sum(b.running_mean for b in window if b.k_mean is not None)
        tokens_per_running = (
            sum(b.k_mean for b in window if b.k_mean is not None) / running if running > 0 else None
        )
        estimate = DemandEstimate(
            capacity_tokens=capacity,
            token_seconds_per_request=a_est,
            rate_level=self._rate.value,
            rate_slope=slope,
            rate_slope_lower=lower,
            burst_factor=burst_factor(buckets, p.burst_window_buckets, p.burst_quantile),
            tokens_per_running_request=tokens_per_running,
            damping=p.damping,
            bucket_seconds=p.bucket_seconds,
            u_sat=p.u_sat,
            eta_seconds=math.inf,
            knee_elasticity=p.knee_elasticity,
        )
        return _with_eta(estimate, p)


def _shift_at(points: Sequence[tuple[float, float]], ratio: float, min_segment: int = 5) -> int | None:
    """The first index after a shift of level that explains ``points`` ``ratio`` times better than a
    least-squares line (robust.level_shift); None without one."""
    residuals = least_squares(points)[4]
    found = level_shift([y for _, y in points], sum(e * e for e in residuals), ratio, min_segment)
    return found[0] if found is not None else None


def _with_eta(estimate: DemandEstimate, p: DemandParams) -> DemandEstimate:
    """First horizon (interpolated between minutes) at which forecast demand reaches ``u_sat``."""
    previous = estimate.forecast(0.0)
    eta = math.inf
    if previous >= p.u_sat:
        eta = 0.0
    else:
        for step in range(1, p.max_horizon_buckets + 1):
            value = estimate.forecast(step * p.bucket_seconds)
            if value >= p.u_sat:
                fraction = (p.u_sat - previous) / (value - previous) if value > previous else 1.0
                eta = (step - 1 + fraction) * p.bucket_seconds
                break
            previous = value
    return DemandEstimate(**{**estimate.__dict__, "eta_seconds": eta})
