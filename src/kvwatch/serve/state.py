"""The frozen snapshot the exporter reads (per-series values are :mod:`kvwatch.derived`'s).

Each poll builds a new :class:`State` and the app swaps one reference; the collector reads that reference
once per scrape, so a scrape never sees half of a poll.

Extending it (capacity model, forecaster, advisor): write an :class:`Analyzer` and add it to the app's
analyzer list. Each poll the app calls ``analyze(key, history, reading, now)`` for every series and stores
the result under ``SeriesState.extra[analyzer.name]``; at scrape time the collector calls
``analyzer.families(results, now)`` with the fresh series' results, and exports what it yields. An analyzer
that raises loses only its own result for that poll (logged); it never breaks the poll or the scrape.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, TypeVar

from prometheus_client.core import Metric

from kvwatch.derived import SeriesState
from kvwatch.history import SeriesHistory
from kvwatch.model import Detection, Reading, SeriesKey
from kvwatch.payload import REASONS
from kvwatch.serve.gpu import GpuState

# The labels of every per-series family kvwatch exports (a model served by one engine of the target).
SERIES_LABELS = ["model_name", "engine"]

Result = TypeVar("Result")


class Analyzer(Protocol[Result]):
    """A per-series plug-in run each poll (pure: no clock, no I/O; ``now`` is the poll timestamp), whose
    results are ``Result``s (kvwatch.serve.capacity.CapacityResult, kvwatch.serve.forecast.SeriesForecast,
    kvwatch.serve.latency.SeriesLatency)."""

    name: str
    # The longest window (seconds of poll clock) it reads from the series' history: the sidecar keeps no older
    # polls than its analyzers and kvwatch.derived need.
    history_seconds: float

    def analyze(self, key: SeriesKey, history: SeriesHistory, reading: Reading, now: float) -> Result | None:
        """The per-series result (an immutable value), or None when there is nothing to say."""

    def families(self, results: Mapping[SeriesKey, Result], now: float) -> Iterable[Metric]:
        """prometheus_client metric families for the fresh series' results (``{key: result}``)."""


@dataclass(frozen=True)
class Health:
    up: bool = False
    scrape_duration_seconds: float | None = None
    errors_total: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(dict.fromkeys(REASONS, 0)))
    last_error_reason: str | None = None
    last_error: str | None = None
    last_success_timestamp: float | None = None  # poll clock (accelerated by --clock-speed): when it began
    last_success_finished: float | None = None  # poll clock: when it ended, what staleness counts from
    # Wall-clock Unix time of the same poll: what kvwatch_last_success_timestamp_seconds exports, since alert
    # rules compare it with Prometheus' time() (the demo's poll clock runs ahead of it).
    last_success_wall_seconds: float | None = None
    polls_total: int = 0
    series_dropped_total: int = 0  # series left out by --max-series, summed over good polls
    implausible_total: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # by field


@dataclass(frozen=True)
class State:
    """Everything one scrape exports. ``timestamp`` and ``last_success_timestamp`` use the poll clock."""

    timestamp: float | None = None  # when the poll began
    finished: float | None = None  # when it ended (its fetch and GPU read may each take the poll timeout)
    health: Health = field(default_factory=Health)
    detection: Detection | None = None
    series: Mapping[SeriesKey, SeriesState] = field(default_factory=lambda: MappingProxyType({}))
    gpu: GpuState | None = None  # the GPU memory source's last read (--dcgm-url/--nvml), None when off

    def polling(self, now: float, within: float, started: float | None = None) -> bool:
        """Whether a poll, good or bad, has ended within ``within`` of ``now`` (counted from ``started`` before the
        first one): False once polling itself stopped (serve's ``within``: kvwatch.serve.app.polling_window)."""
        last = self.finished if self.finished is not None else self.timestamp if self.timestamp is not None \
            else started
        return last is not None and now - last <= within

    def fresh(self, now: float, stale_after: float) -> bool:
        """Whether derived per-series values may still be exported at ``now``: counted from the end of the last
        good poll. From its start, a poll running past the interval (the next tick skipped) left its series stale
        before the next one ended, kvwatch_up 1, every 10 s at a 5-s interval."""
        last = self.health.last_success_finished
        if last is None:
            last = self.health.last_success_timestamp
        return last is not None and now - last <= stale_after
