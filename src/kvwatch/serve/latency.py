"""Latency inside ``kvwatch serve`` (service wing: it builds prometheus_client families): p50/p90/p99 of
TTFT, inter-token latency, queue time and end-to-end latency per series over the last 5 minutes of polls,
the abort rate, and the optional TTFT objective.

The quantiles come from the engine's own histograms (:mod:`kvwatch.latency`, bucket increases between the
oldest and newest poll in the window that read them: the sidecar reads the buckets once per
``kvwatch.latency.EDGE_SECONDS`` of poll clock, so the quantiles cover the last 4-5 minutes and move once a
minute). ``--ttft-slo-seconds`` adds ``kvwatch_ttft_slo_breach{cause}``:
1 while TTFT p90 exceeds the objective, with ``cause="kv_cache"`` when the KV cache is saturated
(median usage over the window's polls >= 0.95, KVCacheBottleneck's threshold; one poll's usage swings by
several points on a full cache) and requests wait (the mean queue time is at least half of the mean TTFT over the
window: the time goes to waiting for KV room, and more KV or less load fixes it), else ``cause="other"`` (prefill
compute, long prompts, the scheduler's budget: more KV would not help). 0 on both while within the objective.
The share compares means, not the p90s: vLLM's TTFT and queue-time histograms have different buckets, and waits of
170-220 s read a TTFT p90 of 592 s (its bucket 160-640) beside a queue p90 of 228 s (120-240, 240-480), "other"
for a TTFT that was 99.9 % waiting. Without both means, the p90s.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily

from kvwatch.forecast import ForecastParams
from kvwatch.forecast.detector import no_room_in
from kvwatch.history import SeriesHistory
from kvwatch.latency import window_means, window_quantiles
from kvwatch.model import Histogram, Reading, SeriesKey
from kvwatch.serve.state import SERIES_LABELS

if TYPE_CHECKING:
    from kvwatch.serve.sidecar_capacity import CapacityResolver
    from kvwatch.settings import ServeSettings

WINDOW_SECONDS = 300.0
KV_SATURATED = ForecastParams().u_sat  # the forecaster's saturation, as the alerts' (alerts/config.yaml)
QUEUE_SHARE = 0.5
_NOTE = " Over the last 5 minutes of kvwatch's polls, from the engine's histograms (poll-clock seconds)."


@dataclass(frozen=True)
class SeriesLatency:
    quantiles: Mapping[tuple[str, float], float] = field(default_factory=lambda: MappingProxyType({}))
    aborted_per_second: float | None = None
    slo_breach_cause: str | None = None  # "kv_cache", "other", or None within the objective
    slo_known: bool = False


def classify(quantiles: Mapping[tuple[str, float], float], usage: float | None,
             slo_seconds: float, *, no_room: bool = False,
             means: Mapping[str, float] | None = None) -> tuple[bool, str | None]:
    """(known, cause): whether TTFT p90 is known, and ``kv_cache``/``other`` when it breaks the objective. The cache
    is full at KV_SATURATED, or below it with no room for the next prompt (``no_room``: the forecaster's rule,
    kvwatch.forecast.detector.no_room_for_next_request); waiting dominates where the window's mean queue time is at
    least QUEUE_SHARE of its mean TTFT (``means``, :func:`kvwatch.latency.window_means`; else the p90s)."""
    ttft = quantiles.get(("ttft", 0.9))
    if ttft is None:
        return False, None
    if ttft <= slo_seconds:
        return True, None
    if means and "queue" in means and means.get("ttft"):
        queue, first_token = means["queue"], means["ttft"]
    else:
        queue, first_token = quantiles.get(("queue", 0.9)), ttft
    full = usage is not None and (usage >= KV_SATURATED or no_room)
    kv_bound = full and queue is not None and queue >= QUEUE_SHARE * first_token
    return True, "kv_cache" if kv_bound else "other"


class LatencyAnalyzer:
    name = "latency"

    def __init__(self, ttft_slo_seconds: float | None = None, window: float = WINDOW_SECONDS,
                 max_series: int | None = None) -> None:
        self.ttft_slo_seconds = ttft_slo_seconds
        self.window = window
        self.history_seconds = window
        # Series kept at most, the longest unseen going first (as the forecasts'): model names churning every poll
        # grew this log by ~850 bytes a series ever seen, without a bound.
        self.max_series = max_series
        self._edge_log: dict[SeriesKey, deque[tuple[float, Mapping[str, Histogram]]]] = {}

    def _edges(self, key: SeriesKey, history: SeriesHistory,
               reading: Reading) -> deque[tuple[float, Mapping[str, Histogram]]]:
        """(timestamp, latency histograms) of the series' polls that read them, within the window and after
        the last restart, oldest first; the current poll's added when it read them."""
        latest = history.latest
        edges = self._edge_log.pop(key, None) or deque()
        self._edge_log[key] = edges  # re-inserted: least recently analysed first
        if self.max_series is not None and len(self._edge_log) > self.max_series:
            del self._edge_log[next(iter(self._edge_log))]
        if latest is None:
            return edges
        if reading.latency and (not edges or edges[-1][0] < latest.timestamp):
            edges.append((latest.timestamp, reading.latency))
        start = latest.timestamp - self.window
        if history.last_restart_timestamp is not None:
            start = max(start, history.last_restart_timestamp)
        while edges and edges[0][0] < start:
            edges.popleft()
        return edges

    def analyze(self, key: SeriesKey, history: SeriesHistory, reading: Reading, now: float) -> SeriesLatency | None:
        # The window's first entry by binary search: a walk over the window cost every poll as many steps as
        # the window held polls (docs/reliability.md, CPU per poll).
        first = history.first(since_restart=True, window=self.window)
        latest = history.latest
        aborted = history.rate("requests_aborted_total", self.window)
        # Only some polls read the histograms (kvwatch.latency.EDGE_SECONDS): the window runs from the oldest
        # to the newest of those in the last ``window`` seconds, kept here (a handful per series) so that no
        # poll walks the history (at a 0.05 s interval a minute between edges is 1,200 polls).
        edges = self._edges(key, history, reading)
        if first is None or latest is None or len(edges) < 2:
            return SeriesLatency(aborted_per_second=aborted) if aborted is not None else None
        quantiles = window_quantiles(edges[0][1], edges[-1][1])
        known, cause = False, None
        if self.ttft_slo_seconds is not None:
            entries = history.samples(since_restart=True, window=self.window)
            usages = [e.reading.kv_usage_ratio for e in entries if e.reading.kv_usage_ratio is not None]
            usage = statistics.median(usages) if usages else None
            no_room = usage is not None and no_room_in(reading, usage)
            known, cause = classify(quantiles, usage, self.ttft_slo_seconds, no_room=no_room,
                                    means=window_means(edges[0][1], edges[-1][1]))
        return SeriesLatency(MappingProxyType(quantiles), aborted, cause, known)

    def families(self, results: Mapping[SeriesKey, SeriesLatency], now: float) -> Iterable[GaugeMetricFamily]:
        latency = GaugeMetricFamily(
            "kvwatch_latency_seconds", "Request latency quantile by kind: ttft (time to first token), itl "
            "(inter-token latency; TensorRT-LLM: time per output token), queue (waiting for the scheduler), "
            "e2e (end to end); percentile 50, 90 or 99." + _NOTE, labels=[*SERIES_LABELS, "kind", "percentile"])
        aborts = GaugeMetricFamily("kvwatch_requests_aborted_per_second",
                                   "Requests the engine aborted per second (vLLM: finished_reason=abort; SGLang: "
                                   "num_aborted_requests_total). Over the last 5 minutes of kvwatch's polls, from "
                                   "the engine's counter (poll-clock seconds).", labels=SERIES_LABELS)
        slo = GaugeMetricFamily(
            "kvwatch_ttft_slo_breach", "1 while TTFT p90 exceeds --ttft-slo-seconds; cause=kv_cache when the KV "
            "cache is saturated and queueing dominates TTFT, else cause=other; 0 on both within the objective."
            + _NOTE, labels=[*SERIES_LABELS, "cause"])
        for key, result in sorted(results.items()):
            for (kind, q), value in sorted(result.quantiles.items()):
                # ("percentile", not "quantile": Prometheus reserves that label for summaries, promtool check metrics)
                latency.add_metric([*key, kind, f"{q * 100:g}"], value)
            if result.aborted_per_second is not None:
                aborts.add_metric(list(key), result.aborted_per_second)
            if result.slo_known:
                for cause in ("kv_cache", "other"):
                    slo.add_metric([*key, cause], 1.0 if result.slo_breach_cause == cause else 0.0)
        return [f for f in (latency, aborts, slo) if f.samples]


def make_analyzer(settings: ServeSettings, capacity: CapacityResolver) -> LatencyAnalyzer:
    return LatencyAnalyzer(settings.ttft_slo_seconds, max_series=2 * settings.max_series)
