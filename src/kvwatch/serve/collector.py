"""The custom Prometheus collector: fresh ``kvwatch_*`` families from one State per scrape.

It never raises: a bug while building per-series families is logged and the health families are still
served, so Prometheus keeps seeing ``kvwatch_up``. Derived per-series gauges are left out once the last
good poll ended more than ``stale_after`` seconds ago (poll clock, :meth:`State.fresh`); health families always stay.
Sample timestamps are never attached: kvwatch polls on its own timer and Prometheus stamps on scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from kvwatch import __version__
from kvwatch.derived import SeriesState
from kvwatch.history import SCREENED_FIELDS
from kvwatch.payload import REASONS
from kvwatch.plausible import CHECKED_FIELDS
from kvwatch.serve.gpu import families as gpu_families
from kvwatch.serve.state import SERIES_LABELS, Analyzer, State

log = logging.getLogger(__name__)

_POLL_NOTE = " kvwatch polls the engine on its own timer (--poll-interval-seconds), not on Prometheus' scrape."


class KvwatchCollector(Collector):
    def __init__(self, get_state: Callable[[], State], *, now: Callable[[], float], stale_after: float,
                 analyzers: Sequence[Analyzer[Any]] = (), polling_within: float | None = None) -> None:
        self._get_state = get_state
        self._now = now
        self._stale_after = stale_after
        # Polls end at most this far apart while polling goes on (serve: stale-after plus the longest poll)
        self._polling_within = stale_after if polling_within is None else polling_within
        self._analyzers = tuple(analyzers)

    def describe(self) -> list[Metric]:
        return []  # families vary with the state; registering must not run a collection

    def collect(self) -> Iterator[Metric]:
        try:
            state = self._get_state()
            now = self._now()
        except Exception:  # never fail a scrape
            log.exception("cannot read state")
            yield from _build_info()
            return
        # No poll at all (good or bad) for stale_after: polling itself stopped, and the last poll's "up" is no
        # news (a log call blocked on a full pipe held the poll thread with kvwatch_up frozen at 1).
        polling = state.polling(now, self._polling_within)
        yield from _health(state, polling)
        try:
            fresh = state.fresh(now, self._stale_after)
            series = state.series if fresh else {}
            families = list(_series_families(series))
            for analyzer in self._analyzers:
                results = {k: s.extra[analyzer.name] for k, s in series.items()
                           if s.extra.get(analyzer.name) is not None}
                try:
                    families.extend(analyzer.families(results, now))
                except Exception:
                    log.exception("analyzer %s failed to export", analyzer.name)
            if state.gpu is not None:
                # GPU memory is refreshed by every poll, good or bad: stale only when polling itself stopped.
                families.extend(gpu_families(state.gpu if polling else replace(state.gpu, gpus=())))
        except Exception:
            log.exception("cannot export per-series metrics")
            return
        # A family with no sample this scrape (no series has the figure) is left out, HELP and TYPE too: the
        # docs call such a metric absent.
        yield from (family for family in families if family.samples)


def make_registry(collector: KvwatchCollector) -> CollectorRegistry:
    """A private registry holding only kvwatch's collector (no process/python defaults)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def _build_info() -> Iterator[Metric]:
    info = GaugeMetricFamily("kvwatch_build_info", "kvwatch build; always 1.", labels=["version"])
    info.add_metric([__version__], 1.0)
    yield info


def _health(state: State, polling: bool = True) -> Iterator[Metric]:
    health = state.health
    yield from _build_info()
    yield GaugeMetricFamily(
        "kvwatch_up",
        "1 if the last poll fetched and recognised a vLLM, SGLang or TensorRT-LLM payload, else 0 (0 too once no "
        "poll has ended for --stale-after-seconds + 2 x --poll-timeout-seconds + a second per MiB of "
        "--max-body-bytes + --poll-interval-seconds: polling stopped)." + _POLL_NOTE,
        value=1.0 if health.up and polling else 0.0)
    if health.scrape_duration_seconds is not None:
        yield GaugeMetricFamily("kvwatch_scrape_duration_seconds",
                                "Duration of the last poll of the target (fetch, parse, analyse, and the wait for "
                                "the GPU memory read when --dcgm-url or --nvml gives one).",
                                value=health.scrape_duration_seconds)
    errors = CounterMetricFamily("kvwatch_scrape_errors", "Failed polls of the target, by reason.",
                                 labels=["reason"])
    for reason in REASONS:
        errors.add_metric([reason], float(health.errors_total.get(reason, 0)))
    yield errors
    yield CounterMetricFamily("kvwatch_series_dropped",
                              "(model_name, engine) series a good poll left out because the target served more "
                              "than --max-series, summed over polls; rising means series are missing now.",
                              value=float(health.series_dropped_total))
    implausible = CounterMetricFamily(
        "kvwatch_implausible_values", "Impossible values the target served (NaN, +-Inf, negative counts, usage "
        "outside 0..1), read as unknown instead, by Reading field; summed over series and polls.", labels=["field"])
    # Every field from 0: a counter that appears at its first increment starts at 1, and rate()
    # never counts that first impossible value.
    for name in sorted({*CHECKED_FIELDS, *SCREENED_FIELDS, *health.implausible_total}):
        implausible.add_metric([name], float(health.implausible_total.get(name, 0)))
    yield implausible
    if health.last_success_wall_seconds is not None:
        yield GaugeMetricFamily("kvwatch_last_success_timestamp_seconds",
                                "Unix time (wall clock) of the last successful poll of the target.",
                                value=health.last_success_wall_seconds)
    if state.detection is not None:
        info = GaugeMetricFamily(
            "kvwatch_source_info", "Which engine (vllm, sglang, tensorrt-llm), generation and source metrics the "
            "last good poll read; an empty name means the engine reports no such metric (unknown); 1.",
            labels=["engine_kind", "version_range", "usage_metric", "running_metric", "waiting_metric",
                    "capacity_metric"])
        d = state.detection
        info.add_metric([d.engine_kind, d.version_range, d.usage_metric or "", d.running_metric or "",
                         d.waiting_metric or "", d.capacity_metric or ""], 1.0)
        yield info


def _gauge(name: str, help_text: str, series: dict, value: Callable[[SeriesState], float | None]) -> Metric | None:
    family = GaugeMetricFamily(name, help_text, labels=SERIES_LABELS)
    for key, s in series.items():
        v = value(s)
        if v is not None:
            family.add_metric(list(key), float(v))
    return family if family.samples else None


def _series_families(series: dict) -> Iterator[Metric]:
    specs: list[tuple[str, str, Callable[[SeriesState], float | None]]] = [
        ("kvwatch_kv_usage_ratio", "KV-cache usage of the engine, 0..1 (evictable prefix-cache blocks are free).",
         lambda s: s.reading.kv_usage_ratio),
        ("kvwatch_kv_capacity_tokens", "KV-cache capacity of the engine in tokens (engine-reported, else blocks x "
         "block size per engine, else the capacity model's; kvwatch_capacity_source_info says which).",
         lambda s: s.reading.kv_capacity_tokens),
        ("kvwatch_kv_used_tokens", "Tokens held in the KV cache: usage ratio x capacity (with several KV groups, "
         "sliding-window or hybrid, that share of the capacity, not the context held).",
         lambda s: s.reading.kv_used_tokens),
        ("kvwatch_requests_running", "Requests in the engine's running batch (TensorRT-LLM: scheduled requests, "
         "else active).",
         lambda s: s.reading.requests_running),
        ("kvwatch_requests_waiting", "Requests waiting in the engine's queue (TensorRT-LLM: active not scheduled, "
         "plus trtllm-serve's queue).", lambda s: s.reading.requests_waiting),
        ("kvwatch_preemptions_per_second",
         "Preemptions (SGLang: retractions) per second over the last minute of polls.",
         lambda s: s.preemptions_per_second),
        ("kvwatch_concurrency_headroom", "Concurrency ceiling at the observed request mix minus running requests, "
         "at most the free KV tokens' worth of such requests (absent while the usage is unknown or the engine "
         "asleep).",
         lambda s: s.concurrency_headroom),
        ("kvwatch_engine_asleep", "1 while the engine is in vLLM's sleep mode (vllm:engine_sleep_state: its KV cache "
         "paused or released on purpose, requests waiting for POST /wake_up; kvwatch_state reads unknown), 0 awake; "
         "absent where the engine does not say.",
         lambda s: (1.0 if s.reading.asleep else 0.0) if s.reading.sleep_state is not None else None),
    ]
    for name, help_text, value in specs:
        family = _gauge(name, help_text + _POLL_NOTE, series, value)
        if family is not None:
            yield family
    ceiling = GaugeMetricFamily(
        "kvwatch_max_concurrency",
        "Concurrent requests the KV cache holds: basis=observed_mix (the smaller of capacity / live KV tokens "
        "per running request and capacity / mean finished request's own KV: prompt less its prefix-cached share, "
        "plus output; also in whole blocks, or the model's layout's count on the engine's (or the formula's) "
        "blocks where its KV groups or windows hold a request unevenly; never above the block count) or "
        "basis=max_model_len (every request at max length: vLLM's figure, else its sum on the engine's or the "
        "formula's blocks, else capacity / max length)." + _POLL_NOTE,
        labels=[*SERIES_LABELS, "basis"])
    for key, s in series.items():
        for basis, value in sorted(s.max_concurrency.items()):
            ceiling.add_metric([*key, basis], value)
    if ceiling.samples:
        yield ceiling
