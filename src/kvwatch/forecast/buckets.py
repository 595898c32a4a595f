"""Per-minute aggregation of 5-/10-s samples, with counter-reset handling and gap splitting.

Forecasts are fitted on one point per minute: p90 of usage tracks the peaks that cause saturation while averaging out
10-s jitter, and counter deltas over a minute give rates that are not dominated by the batching noise of single polls.
Counter deltas follow :func:`kvwatch.counters.counter_delta`. Each sample-to-sample delta belongs to the bucket of the
later sample; deltas across a gap longer than ``ForecastParams.stale_after_seconds`` (kvwatch.forecast.forecaster)
are dropped (their rate is unknowable), so a bucket's rates are sums over the time its deltas actually
cover.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from operator import add

from kvwatch.forecast.robust import quantile
from kvwatch.forecast.thresholds import BUCKET_SECONDS


@dataclass(frozen=True, slots=True)
class SampleDeltas:
    """Changes between two consecutive samples of one series (None where a counter is not exposed)."""

    seconds: float
    finished: float | None
    queue_change: float  # Δ(running + waiting)
    preemptions: float | None
    prompt_tokens: float | None
    generation_tokens: float | None
    request_prompt_sum: float | None
    request_prompt_count: float | None
    request_generation_sum: float | None
    request_generation_count: float | None
    e2e_sum: float | None = None
    e2e_count: float | None = None
    # Length histograms' cumulative bucket deltas (at each upper bound, the last +Inf) and their bounds.
    prompt_length_bounds: tuple[float, ...] | None = None
    prompt_length_counts: tuple[float, ...] | None = None
    generation_length_bounds: tuple[float, ...] | None = None
    generation_length_counts: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class MinuteBucket:
    """One minute of one series. Token quantities are KV tokens in use (``usage × capacity``)."""

    minute: int
    samples: int
    u_mean: float
    u_p90: float
    u_max: float
    capacity_tokens: float | None
    running_mean: float
    waiting_max: float
    covered_seconds: float
    finished: float | None
    arrivals: float | None
    preemptions: float
    request_prompt_sum: float | None
    request_prompt_count: float | None
    request_generation_sum: float | None
    request_generation_count: float | None
    usages: tuple[float, ...] = ()  # the raw polls, for burst quantiles over several minutes
    u_sd: float = 0.0  # sample standard deviation of the polls' usage (0 with fewer than two)
    prompt_tokens: float | None = None  # prompt tokens admitted (counter delta)
    generation_tokens: float | None = None  # tokens generated (counter delta)
    e2e_sum: float | None = None  # e2e latency histogram delta: seconds and requests
    e2e_count: float | None = None
    # Requests finished this minute per length bucket (cumulative at each upper bound, the last +Inf), v7.
    # BucketAggregator keeps the counts as doubles in an array and one bounds tuple for the minutes that share it:
    # two hours of these were most of a series' memory as tuples of float objects (docs/performance.md).
    prompt_length_bounds: tuple[float, ...] | None = None
    prompt_length_counts: Sequence[float] | None = None
    generation_length_bounds: tuple[float, ...] | None = None
    generation_length_counts: Sequence[float] | None = None

    @property
    def k_mean(self) -> float | None:
        return None if self.capacity_tokens is None else self.u_mean * self.capacity_tokens

    @property
    def departure_rate(self) -> float | None:
        """Finished requests per second, None when no counter delta covered this minute."""
        if self.finished is None or self.covered_seconds <= 0:
            return None
        return self.finished / self.covered_seconds

    @property
    def arrival_rate(self) -> float | None:
        """Arrivals per second ≈ departures + growth of running + waiting (never negative)."""
        if self.arrivals is None or self.covered_seconds <= 0:
            return None
        return max(0.0, self.arrivals / self.covered_seconds)


def _sample_sd(values: Sequence[float]) -> float:
    """Sample standard deviation (statistics.stdev is exact but slow: this runs every minute per series)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _add(total: float | None, value: float | None) -> float | None:
    if value is None:
        return total
    return value if total is None else total + value


def _add_counts(total: Sequence[float] | None, bounds: tuple[float, ...] | None,
                counts: Sequence[float] | None, new_bounds: tuple[float, ...] | None
                ) -> tuple[tuple[float, ...] | None, Sequence[float] | None]:
    """(bounds, summed bucket counts) after adding one poll's deltas; bounds that change within the minute
    make the minute's counts unknown."""
    if counts is None or new_bounds is None:
        return bounds, total
    if total is None:
        return new_bounds, counts
    if bounds != new_bounds:
        return bounds, None
    return bounds, tuple(map(add, total, counts))


def _compact(counts: Sequence[float] | None) -> Sequence[float] | None:
    """The same doubles, 8 bytes each rather than a float object each."""
    return None if counts is None else array("d", counts)


class BucketAggregator:
    """Accumulates samples of the current minute; ``add`` returns the previous minute once it closes."""

    def __init__(self, bucket_seconds: float = BUCKET_SECONDS) -> None:
        self.bucket_seconds = bucket_seconds
        self._minute: int | None = None
        self._shared_bounds: dict[tuple[float, ...], tuple[float, ...]] = {}
        self._reset_accumulators()

    def _reset_accumulators(self) -> None:
        self._usages: list[float] = []
        self._running_sum = 0.0
        self._waiting_max = 0.0
        self._capacity: float | None = None
        self._covered = 0.0
        self._finished: float | None = None
        self._arrivals: float | None = None
        self._preemptions = 0.0
        self._prompt_sum: float | None = None
        self._prompt_count: float | None = None
        self._gen_sum: float | None = None
        self._gen_count: float | None = None
        self._prompt_tokens: float | None = None
        self._gen_tokens: float | None = None
        self._e2e_sum: float | None = None
        self._e2e_count: float | None = None
        self._prompt_bounds: tuple[float, ...] | None = None
        self._prompt_counts: Sequence[float] | None = None
        self._gen_bounds: tuple[float, ...] | None = None
        self._gen_counts: Sequence[float] | None = None

    def minute_of(self, timestamp: float) -> int:
        return math.floor(timestamp / self.bucket_seconds)

    def add(
        self,
        timestamp: float,
        usage: float,
        capacity_tokens: float | None,
        running: float,
        waiting: float,
        deltas: SampleDeltas | None,
    ) -> MinuteBucket | None:
        minute = self.minute_of(timestamp)
        closed = None
        if self._minute is not None and minute != self._minute:
            closed = self._close()
        self._minute = minute
        self._usages.append(usage)
        self._running_sum += running
        self._waiting_max = max(self._waiting_max, waiting)
        if capacity_tokens is not None:
            self._capacity = capacity_tokens
        if deltas is not None:
            self._covered += deltas.seconds
            self._finished = _add(self._finished, deltas.finished)
            if deltas.finished is not None:
                self._arrivals = _add(self._arrivals, deltas.finished + deltas.queue_change)
            self._preemptions += deltas.preemptions or 0.0
            self._prompt_sum = _add(self._prompt_sum, deltas.request_prompt_sum)
            self._prompt_count = _add(self._prompt_count, deltas.request_prompt_count)
            self._gen_sum = _add(self._gen_sum, deltas.request_generation_sum)
            self._gen_count = _add(self._gen_count, deltas.request_generation_count)
            self._prompt_tokens = _add(self._prompt_tokens, deltas.prompt_tokens)
            self._gen_tokens = _add(self._gen_tokens, deltas.generation_tokens)
            self._e2e_sum = _add(self._e2e_sum, deltas.e2e_sum)
            self._e2e_count = _add(self._e2e_count, deltas.e2e_count)
            self._prompt_bounds, self._prompt_counts = _add_counts(
                self._prompt_counts, self._prompt_bounds, deltas.prompt_length_counts, deltas.prompt_length_bounds)
            self._gen_bounds, self._gen_counts = _add_counts(
                self._gen_counts, self._gen_bounds, deltas.generation_length_counts, deltas.generation_length_bounds)
        return closed

    def clear(self) -> None:
        """Forget the open minute (restart or long gap)."""
        self._minute = None
        self._reset_accumulators()

    def _shared(self, bounds: tuple[float, ...] | None) -> tuple[float, ...] | None:
        """The first equal bounds tuple this aggregator closed a minute with (each poll parses its own)."""
        if bounds is None:
            return None
        if len(self._shared_bounds) > 8:  # bounds that keep changing are a page's fault; keep a few
            self._shared_bounds.clear()
        return self._shared_bounds.setdefault(bounds, bounds)

    def _close(self) -> MinuteBucket | None:
        if self._minute is None or not self._usages:
            return None
        usages = self._usages
        bucket = MinuteBucket(
            minute=self._minute,
            samples=len(usages),
            u_mean=sum(usages) / len(usages),
            u_p90=quantile(usages, 0.9),
            u_max=max(usages),
            capacity_tokens=self._capacity,
            running_mean=self._running_sum / len(usages),
            waiting_max=self._waiting_max,
            covered_seconds=self._covered,
            finished=self._finished,
            arrivals=self._arrivals,
            preemptions=self._preemptions,
            request_prompt_sum=self._prompt_sum,
            request_prompt_count=self._prompt_count,
            request_generation_sum=self._gen_sum,
            request_generation_count=self._gen_count,
            usages=tuple(usages),
            u_sd=_sample_sd(usages) if len(usages) >= 2 else 0.0,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._gen_tokens,
            e2e_sum=self._e2e_sum,
            e2e_count=self._e2e_count,
            prompt_length_bounds=self._shared(self._prompt_bounds),
            prompt_length_counts=_compact(self._prompt_counts),
            generation_length_bounds=self._shared(self._gen_bounds),
            generation_length_counts=_compact(self._gen_counts),
        )
        self._reset_accumulators()
        return bucket
