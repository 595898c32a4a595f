"""The forecaster inside ``kvwatch serve``: one :class:`Forecaster` per series, plus the advisor.

Plugged in through ``kvwatch.serve.app.ANALYZER_MODULES`` (``make_analyzer(settings, capacity)``). Each poll,
``analyze`` feeds the series' reading to its forecaster (the history's restart detection is passed on as
the restart flag) and ranks fixes while filling or in bottleneck. At scrape time ``families`` exports every
series kvwatch has seen: fresh results as they are, the others as ``kvwatch_state{state="unknown"} 1``
(stale data is never ``ok``); a series missing for longer than stale-after from pages that are read (an engine
scaled down, a model renamed) is gone and not exported, its forecaster kept until ``FORGET_AFTER_SECONDS`` in case
it comes back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from prometheus_client.core import Metric

from kvwatch.advisor import (
    ADVISE_IN_STATES,
    DEFAULT_GPUS_PER_NODE,
    Advice,
    advise_from_result,
    concurrency_limit,
    longest_request_bound,
)
from kvwatch.capacity.planner import CapacityPlan
from kvwatch.capacity.series import max_model_len_of
from kvwatch.derived import observed_mix_ceiling
from kvwatch.forecast.forecaster import Forecaster, ForecastParams, ForecastResult, ForecastSample
from kvwatch.history import SeriesHistory
from kvwatch.model import Reading, SeriesKey
from kvwatch.serve.forecast_export import forecast_metric_families
from kvwatch.serve.sidecar_capacity import CapacityResolver
from kvwatch.settings import ServeSettings

log = logging.getLogger(__name__)
FORGET_AFTER_SECONDS = 3600.0


@dataclass(frozen=True)
class SeriesForecast:
    result: ForecastResult
    advice: tuple[Advice, ...]


class ForecastAnalyzer:
    name = "forecast"
    history_seconds = 0.0  # the forecaster keeps its own minute buckets; from the history only the restart stamp

    def __init__(self, params: ForecastParams | None = None, *, max_model_len: int | None = None,
                 capacity: CapacityResolver | None = None, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                 max_series: int | None = None) -> None:
        self.params = params or ForecastParams()
        self.max_series = max_series  # forecasters kept at most; the longest unseen go first
        self.max_model_len = max_model_len
        self._capacity_resolver = capacity  # the sidecar's one (None: no capacity plan, no advice needing it)
        self.gpus_per_node = gpus_per_node
        self._forecasters: dict[tuple[str, str], Forecaster] = {}
        # The longest request per series, from the length buckets, which are read once a minute (with the latency
        # ones): the advice between those polls uses the last reading, not "unknown".
        self._longest: dict[tuple[str, str], float | None] = {}
        # When each series was last in a page kvwatch read (its forecaster's last sample may be older: usage unknown).
        self._seen: dict[tuple[str, str], float] = {}

    def _capacity(self, reading: Reading) -> tuple[Reading, CapacityPlan | None]:
        """(the reading with the series' one capacity filled in, the capacity plan for advice or None)."""
        if self._capacity_resolver is None:
            return reading, None
        series = self._capacity_resolver.series(reading)  # the object the capacity analyzer exports
        return series.apply(reading), series.plan

    def analyze(self, key: SeriesKey, history: SeriesHistory | None, reading: Reading, now: float) -> SeriesForecast:
        forecaster = self._forecasters.pop(key, None)  # re-inserted: least recently analysed first
        if forecaster is None:
            forecaster = Forecaster(self.params)
        self._forecasters[key] = forecaster
        self._seen[key] = now
        if self.max_series is not None and len(self._forecasters) > self.max_series:
            self._longest.pop(oldest := next(iter(self._forecasters)), None)
            self._seen.pop(oldest, None)
            del self._forecasters[oldest]
        restarted = history is not None and history.last_restart_timestamp == now
        if reading.lengths or restarted:
            self._longest[key] = longest_request_bound(reading.lengths)
        reading, plan = self._capacity(reading)
        result = forecaster.observe(ForecastSample.from_reading(reading, now, restarted=restarted))
        # The ceiling kvwatch_max_concurrency{basis="observed_mix"} shows: the exported limit and the advice's are
        # one figure, never above 95 % of it (kvwatch.advisor.concurrency_limit).
        ceiling = observed_mix_ceiling(reading, history)
        if reading.prefill_server or (reading.requests_running == 0 and result.state in ADVISE_IN_STATES):
            # its running count holds little of its KV (kvwatch.derived.max_concurrency); or none of it, and the
            # advice gives no limit then (a limit on running requests frees no KV held by transfers or a leak)
            result = replace(result, recommended_max_concurrency=None)
        else:
            # the ceiling alone bounds it when the forecaster has no figure (no capacity reported: a NIM page read
            # bottleneck with the advice's limit 23 and no kvwatch_recommended_max_concurrency)
            result = replace(result, recommended_max_concurrency=concurrency_limit(
                result.recommended_max_concurrency, ceiling))
        advice: tuple[Advice, ...] = ()
        if result.state in ("filling", "bottleneck"):
            advice = tuple(advise_from_result(
                result, reading, capacity_plan=plan, max_model_len=max_model_len_of(reading, self.max_model_len),
                concurrency_ceiling=ceiling, gpus_per_node=self.gpus_per_node,
                longest_request_tokens=self._longest.get(key)))
        return SeriesForecast(result, advice)

    def families(self, results: Mapping[SeriesKey, SeriesForecast], now: float) -> Iterable[Metric]:
        rows = []
        # When the newest page was read: "gone" counts between pages (poll starts), not to the scrape, which may
        # come a whole poll's duration after its page's start.
        newest_page = max(self._seen.values(), default=None)
        for key, forecaster in sorted(list(self._forecasters.items())):
            fresh = results.get(key)
            if fresh is not None:
                rows.append((key, fresh.result, fresh.advice))
                continue
            # Not in the latest good poll, or the data is stale: unknown, never ok.
            last = self._seen.get(key, forecaster.last_timestamp)
            if last is not None and now - last > FORGET_AFTER_SECONDS:
                self._forecasters.pop(key, None)  # the series is gone (model removed, engine scaled down)
                self._longest.pop(key, None)
                self._seen.pop(key, None)
                continue
            if last is not None and newest_page is not None and \
                    newest_page - last > self.params.stale_after_seconds:
                # missing from pages that are read: gone, not unknown (five ghosts lingered an hour), and still gone
                # while the target is down or stale (no results: they came back as unknown at every outage)
                continue
            rows.append((key, forecaster.unknown(now), ()))
        return forecast_metric_families(
            ({"model_name": model_name, "engine": engine}, result, advice)
            for (model_name, engine), result, advice in rows
        )


def make_analyzer(settings: ServeSettings, capacity: CapacityResolver) -> ForecastAnalyzer:
    # Settings are real seconds; the forecaster sees the poll clock, which runs clock_speed times faster.
    stale = settings.stale_after_seconds  # set by validation (3 x the interval unless given)
    params = ForecastParams(stale_after_seconds=stale * settings.clock_speed) if stale else ForecastParams()
    return ForecastAnalyzer(params, max_model_len=settings.max_model_len, capacity=capacity,
                            gpus_per_node=settings.gpus_per_node, max_series=2 * settings.max_series)
