"""The per-series facade: ``Forecaster(params).observe(sample) -> ForecastResult``.

Pure and clock-free: every call carries its own timestamp, so tests and the backtest replay hours in
milliseconds and the sidecar feeds it from its poll loop. One ``Forecaster`` per (model_name, engine).

Hygiene rules (see docs/forecasting.md):
- a restart (the sample's flag, any counter going down, or a capacity change) clears all estimator
  state and starts a warm-up during which only the reactive states may fire; kvwatch's own start counts
  as a restart, because it has no history;
- no sample for longer than ``stale_after_seconds`` (or a sample without usage) means ``unknown``;
- counter rates are not computed across a gap longer than ``stale_after_seconds``, and a gap longer
  than ``split_gap_seconds`` starts a fresh fit window (the fits need ``min_buckets`` minutes again).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from itertools import zip_longest
from typing import TYPE_CHECKING, Any

from kvwatch.counters import counter_delta, counter_reset, histogram_delta, sum_count_reset
from kvwatch.forecast.buckets import BucketAggregator, MinuteBucket, SampleDeltas
from kvwatch.forecast.calibration import WARNING_READS, CalibrationParams, SelfCalibration
from kvwatch.forecast.demand import DemandEstimate, DemandModel, DemandParams
from kvwatch.forecast.detector import (
    BOTTLENECK,
    FILLING,
    OK,
    SCHEDULER_LIMITED,
    STALLED,
    UNKNOWN,
    WARMING_UP,
    DetectorParams,
    ReactiveDetectors,
    SampleFlags,
    WarningLatch,
    WarningParams,
    no_room_for_next_request,
)
from kvwatch.forecast.risk import (
    RISK_HORIZONS_SECONDS,
    RiskEstimate,
    RiskParams,
    estimate_risk,
    last_minutes,
    mean_prompt,
    residence_seconds,
    with_recurrence,
)
from kvwatch.forecast.robust import SlidingTheilSen
from kvwatch.forecast.thresholds import (
    BUCKET_SECONDS,
    BUSY_USAGE,
    SATURATION_USAGE,
    queue_waits_for_kv,
    standing_queue,
    whole_requests,
)
from kvwatch.forecast.trend import TrendEstimate, estimate_trend
from kvwatch.plausible import is_count, usage_or_none

if TYPE_CHECKING:  # the forecaster reads a Reading's fields; it needs no import of it to run
    from kvwatch.model import Reading

HORIZONS_SECONDS: tuple[int, ...] = (600, 1800)


@dataclass(frozen=True)
class ForecastParams:
    """Every knob of the algorithm; defaults are the tuned values (docs/forecasting.md §Parameters)."""

    bucket_seconds: float = BUCKET_SECONDS
    u_sat: float = SATURATION_USAGE  # the saturation threshold forecasts aim at
    u_busy: float = BUSY_USAGE  # at or above this, requests waiting mean KV is the limit
    # Below it too when fewer tokens are free than a recent request's prompt (detector.no_room_for_next_request):
    # long contexts fill the cache with a handful of requests (v9).
    room_for_next_request: bool = True
    trend_confidence: float = 0.90
    trend_window_buckets: int = 45
    level_buckets: int = 5
    min_buckets: int = 15
    warmup_seconds: float = 900.0
    # 3 × the poll interval, as the sidecar sets it (kvwatch.serve.forecast): the default suits 10-s polls. Polls
    # further apart than it are gaps, with no counter rates and so no risk: pass it for slower polls.
    stale_after_seconds: float = 30.0
    split_gap_seconds: float = 300.0
    history_buckets: int = 120
    demand: DemandParams = field(default_factory=DemandParams)
    detector: DetectorParams = field(default_factory=DetectorParams)
    warning: WarningParams = field(default_factory=WarningParams)
    risk: RiskParams = field(default_factory=RiskParams)
    calibration: CalibrationParams = field(default_factory=CalibrationParams)


@dataclass(frozen=True, slots=True)
class ForecastSample:
    """One poll of one series, in the units the forecaster needs (None where vLLM does not expose it)."""

    timestamp: float
    kv_usage: float | None
    capacity_tokens: float | None = None
    running: float = 0.0
    waiting: float = 0.0
    preemptions_total: float | None = None
    finished_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    request_prompt_tokens_sum: float | None = None
    request_prompt_tokens_count: float | None = None
    request_generation_tokens_sum: float | None = None
    request_generation_tokens_count: float | None = None
    e2e_latency_seconds_sum: float | None = None
    e2e_latency_seconds_count: float | None = None
    restarted: bool = False
    # The length histograms' buckets: upper bounds (the last +Inf) and cumulative counts at each (v7's tail).
    prompt_length_bounds: tuple[float, ...] | None = None
    prompt_length_cumulative: tuple[float, ...] | None = None
    generation_length_bounds: tuple[float, ...] | None = None
    generation_length_cumulative: tuple[float, ...] | None = None
    # Fields added later go last (:meth:`__setstate__` gives a cached backtest simulation's samples their defaults).
    # Waiting for room to run (vLLM's "capacity" reason; None: the total): the saturated and queued flags use it,
    # as check's kv_bound does; requests deferred for a LoRA slot or a KV transfer do not wait for the KV cache.
    waiting_for_capacity: float | None = None
    # vLLM's sleep mode (Reading.asleep): the KV cache is released and requests wait for a wake-up, on purpose.
    asleep: bool = False
    # A PD prefill server (Reading.prefill_server): its loop never "runs" a request, so a queue there is its work.
    prefill_server: bool = False
    # Reading.tokens_counted_every_step: requests running with no progress are a stall even with nothing waiting.
    tokens_counted_every_step: bool = False
    # Reading.prefix_cached_share: a waiting prompt needs KV only for what the prefix cache does not hold (v9).
    prefix_cache_hit_ratio: float | None = None
    # False where the page has no running count (``running`` is then 0): no queue's share of it is known, so no
    # queue stands (kvwatch.forecast.thresholds.standing_queue, as check reads it).
    running_known: bool = True

    def __setstate__(self, state: Sequence[Any]) -> None:
        """Unpickle by field order, the fields a pickle predates at their defaults (benchmarks/ keeps simulated
        backtests pickled between runs, docs/forecasting.md)."""
        for f, value in zip_longest(fields(self), state, fillvalue=MISSING):
            object.__setattr__(self, f.name, f.default if value is MISSING else value)

    @classmethod
    def from_reading(cls, reading: Reading, timestamp: float, *, restarted: bool = False) -> ForecastSample:
        """The forecaster's view of one poll of a series (:class:`kvwatch.model.Reading`)."""
        finished = reading.finished_by_reason
        e2e = reading.latency.get("e2e")  # the e2e latency histogram, when the engine exports one (and it was read)
        prompt, generation = reading.lengths.get("prompt"), reading.lengths.get("generation")
        return cls(
            timestamp=timestamp,
            kv_usage=reading.kv_usage_ratio,
            asleep=reading.asleep,
            prefill_server=reading.prefill_server,
            tokens_counted_every_step=reading.tokens_counted_every_step,
            prefix_cache_hit_ratio=reading.prefix_cached_share,
            running_known=reading.requests_running is not None,
            capacity_tokens=_capacity_of(reading),
            running=reading.requests_running or 0.0,
            waiting=reading.requests_waiting or 0.0,
            waiting_for_capacity=reading.requests_waiting_for_capacity,
            preemptions_total=reading.preemptions_total,
            finished_total=sum(finished.values()) if finished else None,
            prompt_tokens_total=reading.prompt_tokens_total,
            generation_tokens_total=reading.generation_tokens_total,
            request_prompt_tokens_sum=reading.request_prompt_tokens_sum,
            request_prompt_tokens_count=reading.request_prompt_tokens_count,
            request_generation_tokens_sum=reading.request_generation_tokens_sum,
            request_generation_tokens_count=reading.request_generation_tokens_count,
            e2e_latency_seconds_sum=e2e.sum if e2e is not None else None,
            e2e_latency_seconds_count=e2e.count if e2e is not None else None,
            restarted=restarted,
            prompt_length_bounds=prompt.bounds if prompt is not None else None,
            prompt_length_cumulative=prompt.cumulative if prompt is not None else None,
            generation_length_bounds=generation.bounds if generation is not None else None,
            generation_length_cumulative=generation.cumulative if generation is not None else None,
        )


def _length_delta(prev_bounds: tuple[float, ...] | None, prev: tuple[float, ...] | None,
                  cur_bounds: tuple[float, ...] | None, cur: tuple[float, ...] | None) -> tuple[float, ...] | None:
    """Cumulative bucket deltas of a length histogram between two polls; None when the bounds changed."""
    if prev_bounds != cur_bounds:
        return None
    return histogram_delta(prev, cur)


def _capacity_of(reading: Reading) -> float | None:
    """The series' capacity, as kvwatch.capacity.series resolved it: none where it left it unknown (blocks × block
    size of a Mamba hybrid overstate the pool by its KV groups, and the risk and ETA were computed against that
    while every gauge of capacity read unknown)."""
    return float(reading.kv_capacity_tokens) if reading.kv_capacity_tokens else None


@dataclass(frozen=True)
class ForecastResult:
    """What the forecaster concluded at ``timestamp``; ``estimates`` holds the inner numbers for debugging."""

    timestamp: float
    state: str
    # inf when the risk reaches 0.5 within no hour (or while warming up, or with nothing to project), 0 in
    # bottleneck; None while unknown, or when warm and busy with no rate or capacity to project from
    eta_seconds: float | None
    forecast_ratio: Mapping[int, float | None]  # horizon seconds -> usage (demand units, may exceed 1)
    request_rate_per_second: float | None
    headroom_requests_per_second: float | None
    recommended_max_concurrency: int | None
    estimates: Mapping[str, float | None]
    # horizon seconds (300, 900, 1800) -> P(KV occupancy reaches the threshold within it); None = unknown
    risk: Mapping[int, float | None] = field(default_factory=lambda: dict.fromkeys(RISK_HORIZONS_SECONDS))


_COUNTERS = (
    "finished_total",
    "preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "request_prompt_tokens_count",
    "request_generation_tokens_count",
    "e2e_latency_seconds_count",
)


# The optional numbers of a sample. A NaN or an infinity among them (a histogram without its _sum line reads as
# NaN, kvwatch.engines.series.histograms) is unknown, as a missing one is: carried into a sum it made every risk
# NaN, and a NaN risk never reaches the warning's level (the early warning was off for good).
_OPTIONAL_NUMBERS = tuple(f.name for f in fields(ForecastSample)
                          if f.name not in ("timestamp", "kv_usage", "running", "waiting") and f.type == "float | None")


def _plausible(sample: ForecastSample) -> ForecastSample:
    """``sample`` with every number no vLLM page can hold unknown (running and waiting: none counted), as the
    sidecar's kvwatch.plausible drops them before a poll reaches here: fed a usage of 1e200 directly, the
    minute's spread overflowed."""
    bad: dict[str, Any] = {name: None for name in _OPTIONAL_NUMBERS
                           if (v := getattr(sample, name)) is not None and not is_count(v)}
    if sample.kv_usage is not None:
        usage = usage_or_none(sample.kv_usage)
        if usage != sample.kv_usage:
            bad["kv_usage"] = usage
    for name in ("running", "waiting"):
        if not is_count(getattr(sample, name)):
            bad[name] = 0.0
    for kind in ("prompt", "generation"):
        counts = getattr(sample, f"{kind}_length_cumulative")
        bounds = getattr(sample, f"{kind}_length_bounds")
        # Bucket counts are counts, bounds numbers (the last +Inf by definition): else the histogram is unknown, whole.
        if (counts is not None and not all(map(is_count, counts))) or (
                bounds is not None and any(math.isnan(b) for b in bounds)):
            bad[f"{kind}_length_cumulative"] = bad[f"{kind}_length_bounds"] = None
    return replace(sample, **bad) if bad else sample


def _idle(running: float, waiting: float, usage: float) -> bool:
    """Nothing running or waiting and the cache all but empty: nothing fills it."""
    return running < 1 and waiting < 1 and usage < 0.05


class Forecaster:
    """Forecast, bottleneck and state machine for one (model_name, engine) series."""

    def __init__(self, params: ForecastParams | None = None) -> None:
        self.params = params or ForecastParams()
        self._aggregator = BucketAggregator(self.params.bucket_seconds)
        self._detectors = ReactiveDetectors(_detector_params(self.params))
        self._latch = WarningLatch(self.params.warning)
        # Outlives restarts and gaps (it learns the traffic, not the process); a clock stepped back over the split gap
        # clears it.
        self._calibration = SelfCalibration(self.params.calibration, self.params.bucket_seconds,
                                            event_window_seconds=self.params.detector.fire_window_seconds,
                                            max_gap_seconds=self.params.stale_after_seconds)
        self._risk_known_at: float | None = None  # the last minute close with a risk: what backs a warning in force
        self._rewarming = False  # a minute closed not warm since the last one with a risk (a gap's re-warming)
        self._buckets: deque[MinuteBucket] = deque(maxlen=self.params.history_buckets)
        self._demand_model = DemandModel(_demand_params(self.params))
        self._trend_fit = SlidingTheilSen()  # the trend's window slides a minute per fit
        self._previous: ForecastSample | None = None
        self._lengths_last: ForecastSample | None = None  # the last sample with length buckets
        self._e2e_last: ForecastSample | None = None  # the last sample with the e2e latency histogram
        self._warm_after: float | None = None
        self._restart_at: float | None = None
        self._trend: TrendEstimate | None = None
        self._demand: DemandEstimate | None = None
        self._risk: RiskEstimate | None = None
        self._residence_unknown = False  # a rate to project, but how long a request stays unknown (no risk)
        self._raw = False
        self._warning_risk: float | None = None  # what the warning read at the last minute's close
        self._last: ForecastResult | None = None
        self.restarts = 0
        # Onsets of sustained saturation (after a quiet stretch), for the risk's recurrence.
        # Each onset keeps the load it came at: a saturation at a load the cache has since left behind predicts
        # nothing about the next (RiskParams.recurrence_load_ratio).
        self._onsets: deque[tuple[float, float]] = deque()
        self._window_load: float | None = None  # the mean usage of the risk's window, at the last minute's close
        # That mean at each of the last window_buckets minute closes with a full window since the (re)start or gap.
        self._window_loads: deque[float] = deque(maxlen=self.params.risk.window_buckets)
        self._was_sustained = False
        self._sustained_last: float | None = None
        self._saturated_minute = False  # a poll in the open minute was in bottleneck (disarms the warning, v5)
        self._recent_prompt_mean: float | None = None  # of the risk's window (_prompt_mean)

    # ------------------------------------------------------------------ public API

    def observe(self, sample: ForecastSample) -> ForecastResult:
        prev = self._previous
        if not math.isfinite(sample.timestamp):  # no time, no place in the series: ignored like an old sample
            return self._last or self._unknown(prev.timestamp if prev is not None else 0.0)
        sample = _plausible(sample)
        # A clock stepped back further than a gap that splits the series: the series starts over at the new time
        # (ignoring every sample until the old time came back froze the last result for as long).
        clock_back = prev is not None and sample.timestamp < prev.timestamp - self.params.split_gap_seconds
        if prev is not None and sample.timestamp <= prev.timestamp and not clock_back:
            return self._last or self._unknown(sample.timestamp)  # duplicate or out of order: ignore
        if sample.kv_usage is None or not math.isfinite(sample.kv_usage) or sample.asleep:
            # (asleep: an engine an operator put to sleep holds a frozen or released cache and a queue waiting for
            # its wake-up; fed to the risk, a sleeping engine at 0.97 read filling at a risk of 0.999 with an ETA of
            # 42 s. Its state is unknown until it wakes, and the fits start afresh after a sleep past the split gap.
            # A warning from before the sleep does not outlive it: the sleep is no gap in the polls through which
            # it would stand, and on waking it fired on an empty cache, "re-warming after a gap in its polls".)
            if sample.asleep:
                self._latch.clear()
                self._risk_known_at = None
            self._last = self._unknown(sample.timestamp)
            return self._last
        if clock_back:
            self._start_over(sample.timestamp, counted=False)
            self._calibration.clear()
            prev = None
        elif prev is None or sample.restarted or self._is_restart(prev, sample):
            self._start_over(sample.timestamp, counted=prev is not None)
            prev = None
        elif sample.timestamp - prev.timestamp > self.params.split_gap_seconds:
            self._split(sample.timestamp)
        deltas = self._deltas(prev, sample)
        closed = self._aggregator.add(
            sample.timestamp, sample.kv_usage, sample.capacity_tokens, sample.running, sample.waiting, deltas
        )
        if closed is not None:
            self._on_minute(closed)
        flags = self._flags(sample, deltas, prev)
        self._detectors.update(flags)
        self._saturated_minute |= self._detectors.bottleneck
        if self._calibration.enabled:
            self._calibration.observe(sample.timestamp, flags.saturated, self._detectors.sustained)
        self._track_onsets(sample.timestamp)
        self._previous = sample
        self._last = self._result(sample)
        return self._last

    def _track_onsets(self, now: float) -> None:
        # An onset is sustained saturation after ``recurrence_quiet_seconds`` without any, as the scorer counts
        # events. Measured from the bottleneck *state*, which stays on minutes after saturation ends (its clear
        # hysteresis), the quiet stretch needed was about 15 minutes: saturations every 15 counted once.
        sustained = self._detectors.sustained
        quiet = self.params.risk.recurrence_quiet_seconds
        if sustained and not self._was_sustained and (
                self._sustained_last is None or now - self._sustained_last >= quiet):
            self._onsets.append((now, self._onset_load()))
        if sustained:
            self._sustained_last = now
        self._was_sustained = sustained
        window = self.params.risk.recurrence_window_seconds
        while self._onsets and self._onsets[0][0] < now - window:
            self._onsets.popleft()

    def _onset_load(self) -> float:
        """The load an onset came at: the lowest of the risk window's mean usage over the last 30 minute closes,
        so a saturation reached by a climb is held to the load it climbed from (the mean just before it, climb
        included, put the troughs between hourly ramped bursts below the gate: no warning before any of them).
        0, counting whatever the load (as v9), until 30 minute closes with a full window have been
        seen since the (re)start or gap, an hour: a cache that saturates at once after a restart has no load of its
        own yet."""
        if len(self._window_loads) < self.params.risk.window_buckets:
            return 0.0
        return min(self._window_loads) if self.params.risk.recurrence_load_trough else self._window_loads[-1]

    def _onsets_at_this_load(self) -> int:
        """The recent onsets that came at a load the cache still carries: the risk window's mean usage now is at
        least ``recurrence_load_ratio`` of what it was at the onset (0: every onset counts, v9)."""
        ratio = self.params.risk.recurrence_load_ratio
        if ratio <= 0.0:
            return len(self._onsets)
        load = self._window_load if self._window_load is not None else 0.0
        return sum(1 for _, at in self._onsets if load >= ratio * at)

    @property
    def last_timestamp(self) -> float | None:
        """Timestamp of the last sample with a usage reading (None before the first)."""
        return self._previous.timestamp if self._previous is not None else None

    def unknown(self, now: float) -> ForecastResult:
        """The ``unknown`` result at ``now`` (for a series missing from a poll)."""
        return self._unknown(now)

    def status(self, now: float) -> ForecastResult:
        """The result at ``now`` without a new sample: ``unknown`` once the last sample is stale."""
        if self._previous is None or now - self._previous.timestamp > self.params.stale_after_seconds:
            return self._unknown(now)
        return self._last or self._unknown(now)

    # ------------------------------------------------------------------ hygiene

    def _is_restart(self, prev: ForecastSample, cur: ForecastSample) -> bool:
        for name in _COUNTERS:
            a, b = getattr(prev, name), getattr(cur, name)
            if a is not None and b is not None and counter_reset(a, b):
                return True
        return (
            prev.capacity_tokens is not None
            and cur.capacity_tokens is not None
            and abs(cur.capacity_tokens - prev.capacity_tokens) > 1e-9 * max(1.0, prev.capacity_tokens)
        )

    def _start_over(self, timestamp: float, *, counted: bool) -> None:
        self.restarts += int(counted)
        self._restart_at = timestamp
        self._warm_after = timestamp + self.params.warmup_seconds
        self._split(timestamp)
        self._detectors.clear()
        self._latch.clear()
        self._risk_known_at = None
        self._rewarming = False
        self._onsets.clear()
        self._was_sustained = False
        self._sustained_last = None
        self._saturated_minute = False

    def _split(self, timestamp: float) -> None:
        self._lengths_last = self._e2e_last = None
        self._aggregator.clear()
        self._buckets.clear()
        self._demand_model = DemandModel(_demand_params(self.params))
        self._trend = self._demand = None
        self._risk = None
        self._residence_unknown = False
        self._raw = False
        self._warning_risk = None
        self._recent_prompt_mean = None
        self._window_load = None
        self._window_loads.clear()

    def _deltas(self, prev: ForecastSample | None, cur: ForecastSample) -> SampleDeltas | None:
        lengths = self._length_deltas(cur)
        e2e_sum, e2e_count = self._e2e_deltas(cur)
        if prev is None:
            return None
        seconds = cur.timestamp - prev.timestamp
        if seconds > self.params.stale_after_seconds:
            return None  # no rate across a gap
        return SampleDeltas(
            seconds=seconds,
            finished=counter_delta(prev.finished_total, cur.finished_total),
            queue_change=(cur.running + cur.waiting) - (prev.running + prev.waiting),
            preemptions=counter_delta(prev.preemptions_total, cur.preemptions_total),
            prompt_tokens=counter_delta(prev.prompt_tokens_total, cur.prompt_tokens_total),
            generation_tokens=counter_delta(prev.generation_tokens_total, cur.generation_tokens_total),
            request_prompt_sum=counter_delta(prev.request_prompt_tokens_sum, cur.request_prompt_tokens_sum),
            request_prompt_count=counter_delta(prev.request_prompt_tokens_count, cur.request_prompt_tokens_count),
            request_generation_sum=counter_delta(
                prev.request_generation_tokens_sum, cur.request_generation_tokens_sum
            ),
            request_generation_count=counter_delta(
                prev.request_generation_tokens_count, cur.request_generation_tokens_count
            ),
            e2e_sum=e2e_sum,
            e2e_count=e2e_count,
            **lengths,
        )

    def _e2e_deltas(self, cur: ForecastSample) -> tuple[float | None, float | None]:
        """The e2e latency histogram's sum and count deltas since the last poll that read it. ``kvwatch serve``
        reads the latency histograms once a minute (kvwatch.latency.EDGE_SECONDS), the backtest every poll: a
        delta between consecutive polls only would leave the sidecar's risk without the measured residence
        (Little's law instead), unlike the backtest it was scored by. The histogram is one counter: when its sum or
        its count went down (a restart between two reads that nothing else showed, or a broken read the sidecar
        took for a new level), this read tells nothing of the interval; taking the lower field's whole value as the
        delta mixed the engine's lifetime into the 30-minute residence (20x off for half an hour)."""
        if cur.e2e_latency_seconds_sum is None or cur.e2e_latency_seconds_count is None:
            return None, None
        last, self._e2e_last = self._e2e_last, cur
        if last is None or last.e2e_latency_seconds_sum is None or last.e2e_latency_seconds_count is None:
            return None, None
        if sum_count_reset(last.e2e_latency_seconds_sum, last.e2e_latency_seconds_count,
                           cur.e2e_latency_seconds_sum, cur.e2e_latency_seconds_count):
            return None, None
        return (counter_delta(last.e2e_latency_seconds_sum, cur.e2e_latency_seconds_sum),
                counter_delta(last.e2e_latency_seconds_count, cur.e2e_latency_seconds_count))

    def _length_deltas(self, cur: ForecastSample) -> dict[str, Any]:
        """The length histograms' bucket deltas since the last poll that read them: ``kvwatch serve`` reads the
        buckets once a minute (with the latency histograms'), the backtest every poll. The delta goes to the
        minute of the poll that read them; a gap over ``split_gap_seconds`` has started afresh already."""
        if cur.prompt_length_cumulative is None and cur.generation_length_cumulative is None:
            return {}
        last, self._lengths_last = self._lengths_last, cur
        if last is None:
            return {}
        return {
            "prompt_length_bounds": cur.prompt_length_bounds,
            "prompt_length_counts": _length_delta(last.prompt_length_bounds, last.prompt_length_cumulative,
                                                  cur.prompt_length_bounds, cur.prompt_length_cumulative),
            "generation_length_bounds": cur.generation_length_bounds,
            "generation_length_counts": _length_delta(last.generation_length_bounds, last.generation_length_cumulative,
                                                      cur.generation_length_bounds, cur.generation_length_cumulative),
        }

    def _flags(self, sample: ForecastSample, deltas: SampleDeltas | None, prev: ForecastSample | None) -> SampleFlags:
        p = self.params
        u = sample.kv_usage or 0.0
        if deltas is not None:
            preempted = bool(deltas.preemptions)
        else:
            # No rate across a gap, but whether a preemption happened since the last good poll still holds: a
            # /metrics slower than the interval under load (polls failing between) read a preempting cache `ok`.
            preempted = prev is not None and sample.timestamp - prev.timestamp <= p.split_gap_seconds and bool(
                counter_delta(prev.preemptions_total, sample.preemptions_total))
        progressed: bool | None = None
        if deltas is not None and (deltas.finished is not None or deltas.generation_tokens is not None):
            # The KV gauge moving is progress too: a long prefill allocates blocks before its first token is
            # counted, and a decode grows its blocks; a hung engine freezes every gauge at its last value.
            progressed = (bool(deltas.finished) or bool(deltas.generation_tokens) or bool(deltas.prompt_tokens)
                          or (prev is not None and prev.kv_usage != sample.kv_usage))
        queued = sample.waiting if sample.waiting_for_capacity is None else sample.waiting_for_capacity
        running = sample.running if sample.running_known else None
        waits_for_kv = queue_waits_for_kv(
            u, queued, running, saturation=p.u_sat, busy=p.u_busy,
            no_room=queued >= 1 and p.room_for_next_request and no_room_for_next_request(
                u, sample.capacity_tokens, self._prompt_mean(sample), sample.prefix_cache_hit_ratio))
        return SampleFlags(
            timestamp=sample.timestamp,
            usage=u,
            waiting=sample.waiting,
            running=sample.running,
            saturated=u >= p.u_sat or waits_for_kv or preempted,
            # (a queue one poll can trust, as check's scheduler_limited reads it: at hundreds of requests a second a
            # few arrivals wait at nearly every poll, and 0.55 of a 680k-token cache read scheduler_limited; and
            # something running: no scheduler cap holds a queue back while nothing runs, check's queue_not_admitted)
            # (and a known capacity: below u_busy a queue waits for KV when the next prompt does not fit in the free
            # tokens, which no one can tell without it; check says queue_cause_unknown)
            queued_below_kv_limit=standing_queue(queued, running)
            and bool(running)
            and not waits_for_kv
            and not sample.prefill_server
            and bool(sample.capacity_tokens),
            progressed=progressed,
            stalls_without_queue=sample.tokens_counted_every_step,
        )

    def _prompt_mean(self, sample: ForecastSample) -> float | None:
        """Mean prompt of the requests finished in the risk's window (30 minutes), else since the engine started."""
        recent = self._recent_prompt_mean
        if recent is not None:
            return recent
        total, count = sample.request_prompt_tokens_sum, sample.request_prompt_tokens_count
        return total / count if total is not None and count else None

    # ------------------------------------------------------------------ per minute

    def _on_minute(self, bucket: MinuteBucket) -> None:
        p = self.params
        self._buckets.append(bucket)
        # The raw polls are read over the last 30 minutes only (the burst quantile, the within-minute spread): an
        # older bucket keeping them held every poll of 2 hours (26 MB a series at 0.01-s polls).
        oldest_read = bucket.minute - max(p.risk.window_buckets, p.demand.burst_window_buckets)
        for i, old in enumerate(self._buckets):
            if old.minute > oldest_read:
                break
            if old.usages:
                self._buckets[i] = replace(old, usages=())
        buckets = list(self._buckets)
        recent = buckets[-p.risk.window_buckets:]
        self._recent_prompt_mean = mean_prompt(recent)
        self._window_load = sum(b.u_mean for b in recent) / len(recent)
        if len(recent) == p.risk.window_buckets:
            self._window_loads.append(self._window_load)
        # Slopes are fitted after the warm-up only: usage and rate climbing back after a restart is no trend.
        # The cache filling back up is no trend either, and it would bias A low: the demand model starts then too.
        first_fit = math.ceil(self._warm_after / p.bucket_seconds) if self._warm_after is not None else None
        fit_buckets = [b for b in buckets if first_fit is None or b.minute >= first_fit]
        self._demand = self._demand_model.update(fit_buckets) if fit_buckets else None
        self._trend = estimate_trend(
            fit_buckets,
            bucket_seconds=p.bucket_seconds,
            window_buckets=p.trend_window_buckets,
            min_points=p.min_buckets,
            level_points=p.level_buckets,
            u_sat=p.u_sat,
            confidence=p.trend_confidence,
            fit_line=self._trend_fit.fit,
        )
        risk_params = replace(p.risk, bucket_seconds=p.bucket_seconds, threshold=p.u_sat)
        self._risk = estimate_risk(fit_buckets, self._demand, risk_params) if self._demand is not None else None
        # (no e2e histogram and no running count: Little's law has nothing to divide, so no risk, yet work to project)
        self._residence_unknown = self._risk is None and self._demand is not None and \
            self._demand.rate_level > 0 and residence_seconds(
                last_minutes(fit_buckets, risk_params.window_buckets), self._demand.rate_level) is None
        now = bucket.minute * p.bucket_seconds + p.bucket_seconds
        excursion = self._risk
        if self._risk is not None and self._restart_at is not None:
            window = p.risk.recurrence_window_seconds
            onsets = self._onsets_at_this_load() if window > 0 else 0
            observed = min(window, max(0.0, now - self._restart_at))
            self._risk = with_recurrence(self._risk, onsets, observed, window)
        warm = self._warm(now)
        model = self._risk
        if model is not None and warm and self._calibration.enabled:
            self._calibration.record(now, model)  # the model's risk: what δ is fitted to
            self._risk = self._calibration.apply(model)
        horizon = p.warning.horizon_seconds
        risk = None
        if warm and p.warning.with_recurrence and model is not None and self._risk is not None:
            risk = WARNING_READS[p.calibration.warning_reads](model.at(horizon), self._risk.at(horizon))
        elif warm and not p.warning.with_recurrence and excursion is not None:
            risk = excursion.at(horizon)
        self._warning_risk = risk
        self._raw = risk is not None and risk >= p.warning.risk_on
        # The bottleneck polls since the last minute closed (this minute's, give or take the closing poll).
        saturated, self._saturated_minute = self._saturated_minute, False
        self._update_latch(now, warm, risk, bucket, saturated,
                           hold=excursion is not None and excursion.level_from_fall)

    def _update_latch(self, now: float, warm: bool, risk: float | None, bucket: MinuteBucket,
                      saturated: bool, hold: bool = False) -> None:
        """The warning's hysteresis, and what a minute without a risk means to it. Re-warming
        after a gap is neither calm nor high (counted calm, it cleared a warning minutes before the saturation it
        had predicted); the warning is dropped once no risk has backed it for its horizon, and on the first warm
        minute whose risk has fallen below risk_off. A warm minute with nothing to project (an idle engine) is
        calm; one whose rate or capacity is unknown is neither."""
        p = self.params.warning
        if self._latch.active and not self._warning_stands(now):
            # (whatever this minute brings: the state read `ok` from the poll past the horizon, and a risk back at
            # this close re-backed the old warning, `filling` again at a warning risk of 0.035)
            self._latch.clear()
        if risk is not None:
            if self._latch.active and self._rewarming and risk < p.risk_off:
                self._latch.clear()  # back after re-warming, and what it warned of has not come
            self._risk_known_at, self._rewarming = now, False
        else:
            self._rewarming = self._rewarming or not warm
        idle = self._nothing_to_project(bucket.running_mean, bucket.waiting_max, bucket.u_mean)
        calm = risk < p.risk_off if risk is not None else warm and idle
        self._latch.update(self._raw, calm, saturated, hold=hold)

    def _warning_stands(self, now: float) -> bool:
        """The warning is on, and a risk has backed it within its horizon (past that, what it warned of is past:
        the latch clears at the next minute's close, and a result before then must not show it)."""
        known = self._risk_known_at
        return self._latch.active and known is not None and now - known <= self.params.warning.horizon_seconds

    def _warm(self, now: float) -> bool:
        return (
            self._warm_after is not None
            and now >= self._warm_after
            and self._trend is not None
            and len(self._buckets) >= self.params.min_buckets
        )

    # ------------------------------------------------------------------ results

    def _state(self, now: float) -> str:
        d = self._detectors
        if d.stalled:  # a hung engine's frozen gauges can read full too: the stall is the cause, not the KV
            return STALLED
        if d.bottleneck:
            return BOTTLENECK
        if self._warning_stands(now):
            # (also while re-warming after a gap: the warning stands, its risk unknown until warm; shown as
            # warming_up, it resolved the alert minutes before the saturation it had predicted).
            # Before scheduler_limited: a queue with room now does not make a forecast saturation less likely,
            # and its advice (raise --max-num-seqs) would fill the cache sooner.
            return FILLING
        if d.scheduler_limited:
            return SCHEDULER_LIMITED
        if not self._warm(now):
            return WARMING_UP
        return OK

    def _result(self, sample: ForecastSample) -> ForecastResult:
        now = sample.timestamp
        state = self._state(now)
        demand, trend = self._demand, self._trend
        warm = self._warm(now)
        risk_now = self._risk if warm else None
        risks: dict[int, float | None] = {
            h: (risk_now.at(h) if risk_now is not None else None) for h in RISK_HORIZONS_SECONDS}
        if state == BOTTLENECK:
            eta = 0.0
            # Saturated now. The model's own risk is kept when it has one: the detector clears minutes after
            # the saturation ends (hysteresis), and "certain" would be wrong about those minutes.
            risks = {h: (1.0 if r is None else r) for h, r in risks.items()}
        elif risk_now is not None:
            eta = risk_now.eta_seconds()
        elif state == FILLING and not warm:
            eta = None  # the warning stands through a re-warm; when it would come is unknown until warm
        elif (warm or _idle(sample.running, sample.waiting, sample.kv_usage or 0.0)) and \
                self._nothing_to_project(sample.running, sample.waiting, sample.kv_usage or 0.0):
            eta = math.inf  # a known rate with nothing to project, or an idle engine (warming up or not)
        else:
            # busy and warming up (+Inf claimed "not within the hour" 35 minutes before a saturation), or warm with
            # no rate to project (no finished-request counter, no capacity): unknown
            eta = None
        ratios: dict[int, float | None] = {}
        for horizon in HORIZONS_SECONDS:
            if demand is not None:
                ratios[horizon] = demand.forecast(horizon)
            elif trend is not None:
                ratios[horizon] = trend.forecast(horizon)
            else:
                ratios[horizon] = None
        estimates: dict[str, float | None] = {
            "usage_level": trend.level if trend else None,
            "usage_slope_per_second": trend.slope_per_second if trend else None,
            "usage_slope_lower_per_second": trend.slope_lower_per_second if trend else None,
            "trend_eta_seconds": trend.eta_seconds if trend else None,
            "demand_eta_seconds": demand.eta_seconds if demand else None,
            "token_seconds_per_request": demand.token_seconds_per_request if demand else None,
            "request_rate_slope": demand.rate_slope if demand else None,
            "request_rate_slope_lower": demand.rate_slope_lower if demand else None,
            "burst_factor": demand.burst_factor if demand else None,
            "occupancy_mean_tokens": self._risk.mean_tokens if self._risk else None,
            "occupancy_sd_tokens": math.sqrt(self._risk.variance_tokens2) if self._risk else None,
            "request_size_tokens": self._risk.size_tokens if self._risk else None,
            "residence_seconds": self._risk.residence_seconds if self._risk else None,
            "demand_tokens": demand.demand_tokens if demand else None,
            "tokens_per_running_request": demand.tokens_per_running_request if demand else None,
            "capacity_tokens": sample.capacity_tokens,
            "saturated_sample_fraction": self._detectors.saturated_fraction,
            "minutes_since_restart": (now - self._restart_at) / 60.0 if self._restart_at is not None else None,
            "buckets": float(len(self._buckets)),
            "warm": 1.0 if warm else 0.0,
            "warning_risk": self._warning_risk,
        }
        return ForecastResult(
            timestamp=now,
            state=state,
            eta_seconds=eta,
            forecast_ratio=ratios,
            request_rate_per_second=demand.rate_level if demand else None,
            headroom_requests_per_second=demand.headroom_rate if demand else None,
            recommended_max_concurrency=self._recommended_concurrency(sample),
            estimates=estimates,
            risk=risks,
        )

    def _nothing_to_project(self, running: float, waiting: float, usage: float) -> bool:
        """Without a risk: the demand model has a rate (and a capacity) and how long requests stay is known, so the
        risk model found nothing to project (no arrivals, an empty cache, a level fitted at or below 0 after a
        drop), or the engine is idle. Otherwise (no rate: no finished-request counter, no capacity; or neither an
        e2e histogram nor a running count) nothing backs a time."""
        return (self._demand is not None and not self._residence_unknown) or _idle(running, waiting, usage)

    def _recommended_concurrency(self, sample: ForecastSample) -> int | None:
        """From the 30-minute mix when fitted, else from this poll (a bottleneck right after a restart)."""
        if self._demand is not None and self._demand.recommended_max_concurrency is not None:
            return self._demand.recommended_max_concurrency
        u, capacity = sample.kv_usage or 0.0, sample.capacity_tokens
        if capacity and u >= 0.05 and sample.running >= 1:
            return whole_requests(self.params.u_sat * sample.running / u)
        return None

    def _unknown(self, now: float) -> ForecastResult:
        return ForecastResult(
            timestamp=now,
            state=UNKNOWN,
            eta_seconds=None,
            forecast_ratio=dict.fromkeys(HORIZONS_SECONDS),
            request_rate_per_second=None,
            headroom_requests_per_second=None,
            recommended_max_concurrency=None,
            estimates={},
        )


def _demand_params(p: ForecastParams) -> DemandParams:
    return replace(p.demand, bucket_seconds=p.bucket_seconds, u_sat=p.u_sat)


def _detector_params(p: ForecastParams) -> DetectorParams:
    return replace(p.detector, u_sat=p.u_sat)
