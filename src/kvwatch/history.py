"""Bounded per-series history of Readings, counter rates and restart detection (pure: caller's timestamps).

One :class:`SeriesHistory` per ``(model_name, engine)``, a ring of the last ``max_samples`` polls (and, when
``keep_seconds`` is given, of those polls no older than that: the longest window a reader asks for). Rates
follow Prometheus' ``rate()``: a counter that goes down was reset, and its new value is the increase since
the reset, unless the page says the process is the same (:meth:`History.screen`: a broken read, unknown for that
poll). A restart of vLLM is recognised when a counter goes down otherwise, ``process_start_time_seconds`` changes, or
``vllm:cache_config_info`` changes (a new KV configuration), each against its last known value (a page
without one of them for a poll forgot it: the next engine's start went unseen); it is counted and stamped so that
analyzers can discard what came before (``samples(since_restart=True)``). Within one process the engine's KV
configuration cannot change, so a page without ``cache_config_info`` keeps the last one (:meth:`History.completed`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from itertools import pairwise
from types import MappingProxyType

from kvwatch.counters import counter_delta, counter_reset, sum_count_reset
from kvwatch.model import CAPACITY_UNDETERMINED, Histogram, Poll, Reading, SeriesKey

COUNTER_FIELDS: tuple[str, ...] = (
    "preemptions_total", "prompt_tokens_total", "generation_tokens_total", "prefix_cache_queries_total",
    "prefix_cache_hits_total", "request_prompt_tokens_sum", "request_prompt_tokens_count",
    "request_generation_tokens_sum", "request_generation_tokens_count", "requests_aborted_total",
)

SCREENED_FIELDS: tuple[str, ...] = (*COUNTER_FIELDS, "finished_by_reason", "latency")
"""Every Reading field :meth:`SeriesHistory.screen` can drop (``kvwatch_implausible_values_total`` exports each
from 0)."""

DEFAULT_MAX_SAMPLES = 720  # a cap per series (an hour of 5-s polls); the sidecar keeps only what its windows read

# Reading fields that rarely change between polls: an entry equal to its predecessor's shares that object.
_SHARED_FIELDS: tuple[str, ...] = ("model_name", "engine", "cache_config", "waiting_by_reason", "finished_by_reason",
                                   "latency", "prefix_cache_unit", "capacity_source", "sleep_state",
                                   "engine_role")


_NO_REASONS: Mapping[str, float] = MappingProxyType({})

# What a reading reads from the engine's KV configuration (cache_config_info), kept through a page without it.
ENGINE_CONFIG_FIELDS: tuple[str, ...] = ("kv_capacity_tokens", "kv_max_concurrency", "max_model_len", "num_gpu_blocks",
                                         "block_size", "gpu_memory_utilization")


def _with_known_signals(known: Reading, reading: Reading) -> Reading:
    """``reading`` with each restart signal it lacks (:func:`restart_reason`) at its value in ``known``."""
    fields: dict[str, object] = {name: getattr(known, name) for name in (*COUNTER_FIELDS, "process_start_time_seconds")
                                 if getattr(reading, name) is None and getattr(known, name) is not None}
    if not reading.cache_config and known.cache_config:
        fields["cache_config"] = known.cache_config
    if not reading.finished_by_reason and known.finished_by_reason:
        fields["finished_by_reason"] = known.finished_by_reason
    if set(known.latency) - set(reading.latency):  # (kvwatch serve reads the latency histograms once a minute)
        fields["latency"] = MappingProxyType({**known.latency, **reading.latency})
    return replace(reading, **fields) if fields else reading


@dataclass(frozen=True, slots=True)
class Entry:
    timestamp: float
    reading: Reading


START_TIME_JITTER = 1.0
"""Seconds a target's ``process_start_time_seconds`` may move without a restart: exporters that compute it anew
each scrape (client_golang reads boot time and jiffies every time: prometheus/client_golang#289) wobble by
milliseconds, and each wobble was a restart, the forecaster warming up for good. No engine
restarts within a second of its predecessor's start."""


def restart_reason(previous: Reading, current: Reading) -> str | None:
    """Why ``current`` looks like a new vLLM process compared with ``previous``, or None."""
    reason = _new_process_reason(previous, current)
    if reason is not None:
        return reason
    for name in COUNTER_FIELDS:
        before, now = getattr(previous, name), getattr(current, name)
        if before is not None and now is not None and counter_reset(before, now):
            return f"{name} went down"
    for reason in set(previous.finished_by_reason) & set(current.finished_by_reason):
        if counter_reset(previous.finished_by_reason[reason], current.finished_by_reason[reason]):
            return "request_success_total went down"
    for kind in set(previous.latency) & set(current.latency):
        if _histogram_went_down(previous.latency[kind], current.latency[kind]):
            return f"the {kind} latency histogram went down"
    return None


def _histogram_went_down(previous: Histogram, current: Histogram) -> bool:
    """A latency histogram's ``_count`` or ``_sum`` is lower (kvwatch.counters.sum_count_reset)."""
    return sum_count_reset(previous.sum, previous.count, current.sum, current.count)


def _new_process_reason(previous: Reading, current: Reading) -> str | None:
    """The process's own signs of a restart: its start time moved, or its KV configuration changed."""
    if (previous.process_start_time_seconds is not None and current.process_start_time_seconds is not None
            and abs(previous.process_start_time_seconds - current.process_start_time_seconds) > START_TIME_JITTER):
        return "process_start_time_seconds changed"
    if previous.cache_config and current.cache_config and dict(previous.cache_config) != dict(current.cache_config):
        return "cache_config_info changed"
    return None


BROKEN_READ_HOLD_SECONDS = 60.0
"""How long a counter may read below its last value within one process and still be a broken read (unknown, its
last value kept, so its return counts only what it really rose). One that stays lower this long is at a new level
(a summing proxy that lost a worker for good) and is read from there: held for ever, its rates would stay unknown
until it climbed past the old value. A minute outlasts a proxy's failed read of one worker page for a few polls."""


def _same_process(previous: Reading, current: Reading) -> bool:
    """Both readings tell of one process: each has ``process_start_time_seconds``, and neither it (beyond
    START_TIME_JITTER) nor ``cache_config_info`` changed."""
    return (previous.process_start_time_seconds is not None and current.process_start_time_seconds is not None
            and _new_process_reason(previous, current) is None)


class SeriesHistory:
    """The last ``max_samples`` readings of one series, oldest first; with ``keep_seconds``, only those within
    that many seconds of the newest (a window of up to ``keep_seconds`` still finds its first point)."""

    def __init__(self, max_samples: int = DEFAULT_MAX_SAMPLES, keep_seconds: float | None = None) -> None:
        if max_samples < 2:
            raise ValueError("max_samples must be at least 2")
        if keep_seconds is not None and not keep_seconds > 0:
            raise ValueError("keep_seconds must be positive")
        self._entries: deque[Entry] = deque(maxlen=max_samples)
        self.keep_seconds = keep_seconds
        # Per counter: (timestamp, reset-adjusted running total) of each entry where it is reported, so an
        # increase over a window is one subtraction, not a walk over every sample kept (CPU per poll grew
        # with the history at fast poll intervals; docs/reliability.md). Made at a counter's first value:
        # most series report few counters (memory under many series, docs/reliability.md).
        self._totals: dict[str, _Totals] = {}
        self._last_value: dict[str, float] = {}
        self.restarts = 0
        self.last_restart_timestamp: float | None = None
        self.last_restart_reason: str | None = None
        # The newest reading with each restart signal at its last known value; the newest reading of this process
        # with a cache_config (what a page without one keeps).
        self._known: Reading | None = None
        self._configured: Reading | None = None
        # Per counter read below its last value: the first such poll's time and value
        self._below_since: dict[str, tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    @property
    def latest(self) -> Entry | None:
        return self._entries[-1] if self._entries else None

    def append(self, timestamp: float, reading: Reading) -> str | None:
        """Record one reading; returns the restart reason when this reading starts a new vLLM process."""
        if self._entries and timestamp <= self._entries[-1].timestamp:
            raise ValueError(f"timestamps must increase: {timestamp} after {self._entries[-1].timestamp}")
        known = self._known
        reason = restart_reason(known, reading) if known is not None else None
        if reason is not None:
            self.restarts += 1
            self.last_restart_timestamp = timestamp
            self.last_restart_reason = reason
        self._known = reading if known is None or reason is not None else _with_known_signals(known, reading)
        if reading.cache_config:
            self._configured = reading
        elif reason is not None:
            self._configured = None
        shared = self._shared(reading)
        if self._entries:
            # An entry's per-reason counts go once a newer one comes (restart_reason reads _known's): every entry
            # keeping its own, changed every poll, held a copy per entry (656 MiB from 16 series).
            last = self._entries[-1]
            if last.reading.finished_by_reason or last.reading.waiting_by_reason:
                self._entries[-1] = Entry(last.timestamp, replace(last.reading, finished_by_reason=_NO_REASONS,
                                                                  waiting_by_reason=_NO_REASONS))
        self._drop_before(timestamp)
        self._entries.append(Entry(timestamp, shared))
        for name in COUNTER_FIELDS:
            value = getattr(reading, name)
            if value is None:
                continue
            totals = self._totals.get(name)
            if totals is None:
                totals = self._totals[name] = _Totals()
            before = self._last_value.get(name)
            step = counter_delta(before, value) or 0.0  # a reset counts from zero
            totals.append(timestamp, step)
            self._last_value[name] = value
        return reason

    def screen(self, timestamp: float, reading: Reading) -> tuple[Reading, tuple[tuple[str, float], ...]]:
        """``reading`` with each counter that went down within one process unknown, and (field, value) of each;
        before :meth:`append`. One process: ``process_start_time_seconds`` is on both pages and unchanged, and so is
        ``cache_config_info``. vLLM's counters go down only when a new process starts them from zero, so such a
        decrease is a broken read (an exporter or a proxy), not a restart: read as one, a finished counter halved
        for one poll cleared a warned ramp's forecast into 30 minutes of warm-up. Without the start time nothing
        tells the two apart, and any decrease is a restart (:func:`restart_reason`). The counter's last value is
        kept, so a read that returns counts only what the counter rose (forgotten at the first lower read, the
        second became the baseline and the return counted the whole way back up); one lower for
        BROKEN_READ_HOLD_SECONDS is read from its new level, no decrease, what it rose there since its first lower
        read counted. A page without the start time keeps a hold (a new start time or configuration ends it)."""
        known = self._known
        held = self._below_since
        if known is None:
            return reading, ()
        only: set[str] | None = None
        if not _same_process(known, reading):
            # A page without the start time tells nothing new mid-hold: the held counters stay held (compared with
            # their kept values they made a restart). A new start time or configuration ends every hold.
            if not held or _new_process_reason(known, reading) is not None:
                held.clear()
                return reading, ()
            only = set(held)
        reads = {name: (before, now) for name in COUNTER_FIELDS
                 if (before := getattr(known, name)) is not None and (now := getattr(reading, name)) is not None}
        reasons = set(known.finished_by_reason) & set(reading.finished_by_reason)
        reads.update({f"finished_by_reason/{r}": (known.finished_by_reason[r], reading.finished_by_reason[r])
                      for r in reasons})
        # A latency histogram is one counter: its _count and _sum (the e2e one is the forecaster's residence)
        histograms = {f"latency/{kind}": (known.latency[kind], reading.latency[kind])
                      for kind in set(known.latency) & set(reading.latency)}
        if only is not None:
            reads = {name: read for name, read in reads.items() if name in only}
            histograms = {name: read for name, read in histograms.items() if name in only}
        broken = {name for name, (before, now) in reads.items() if counter_reset(before, now)}
        broken |= {name for name, (before, now) in histograms.items() if _histogram_went_down(before, now)}
        for name in [n for n in held if n not in broken and (n in reads or n in histograms
                                                             or not n.startswith("latency/"))]:
            # back at or above its last value, or not read this poll (a reason's value goes with it); a latency
            # histogram's hold outlives the polls between its reads
            del held[name]
        if not broken:
            return reading, ()
        changes: dict[str, object] = {}
        dropped: list[tuple[str, float]] = []
        latency = dict(reading.latency)
        for name in sorted(broken):
            field, _, reason = name.partition("/")
            if field == "latency":
                histogram = histograms[name][1]
                since, _ = held.setdefault(name, (timestamp, histogram.count))
                if timestamp - since < BROKEN_READ_HOLD_SECONDS:
                    dropped.append((field, histogram.count))
                    del latency[reason]
                    changes[field] = MappingProxyType(latency)
                else:
                    del held[name]
                    known = replace(known, latency=MappingProxyType({**known.latency, reason: histogram}))
                continue
            now = reads[name][1]
            since, first = held.setdefault(name, (timestamp, now))
            if timestamp - since < BROKEN_READ_HOLD_SECONDS:
                dropped.append((field, now))
                changes[field] = _NO_REASONS if reason else None
                continue
            del held[name]  # its new level: the last value moves down to it
            if reason:
                known = replace(known, finished_by_reason=MappingProxyType({**known.finished_by_reason, reason: now}))
            else:
                known = replace(known, **{field: now})
                # What it rose at its new level during the hold counts (from its first lower read), not nothing
                self._last_value[field] = min(first, now)
        self._known = known
        return (replace(reading, **changes) if changes else reading), tuple(dropped)

    def completed(self, reading: Reading) -> Reading:
        """``reading`` (this series' newest) with the engine configuration it lacks at this process's last one: a
        page without ``cache_config_info`` for a poll made the capacity the formula's, and the forecaster took
        the change for a restart and cleared its warning."""
        configured = self._configured
        if configured is None or reading.cache_config:
            return reading
        fields = {name: getattr(configured, name) for name in ENGINE_CONFIG_FIELDS if getattr(reading, name) is None}
        return replace(reading, cache_config=configured.cache_config, **fields)

    def _drop_before(self, timestamp: float) -> None:
        """Make room for an entry at ``timestamp``: the oldest goes when the ring is full, and with
        ``keep_seconds`` every entry older than that before ``timestamp`` (with its counters' points)."""
        entries = self._entries
        cut = timestamp - self.keep_seconds if self.keep_seconds is not None else None
        dropped = None
        while entries and (len(entries) == entries.maxlen or (cut is not None and entries[0].timestamp < cut)):
            dropped = entries.popleft().timestamp
        if dropped is not None:
            for totals in self._totals.values():
                totals.drop_through(dropped)

    def _shared(self, reading: Reading) -> Reading:
        """``reading`` with the fields equal to the previous entry's pointing at that entry's objects.

        Each poll parses new strings and mappings (the engine's cache_config labels alone are ~1 KB), so a
        ring of 720 readings would hold 720 equal copies; this keeps one (sidecar RSS, docs/performance.md)."""
        if not self._entries:
            return reading
        previous = self._entries[-1].reading
        same = {}
        for name in _SHARED_FIELDS:
            old, new = getattr(previous, name), getattr(reading, name)
            if old is not new and old == new:
                same[name] = old
        return replace(reading, **same) if same else reading

    def samples(self, since_restart: bool = False, window: float | None = None) -> list[Entry]:
        """Entries, optionally only those after the last restart and/or within ``window`` s of the newest.

        Walks back from the newest entry only as far as the window reaches, so a short window costs what it
        holds, not the whole history."""
        start = self._start(since_restart, window)
        if start is None:
            return list(self._entries)
        out = []
        for entry in reversed(self._entries):
            if entry.timestamp < start:
                break
            out.append(entry)
        out.reverse()
        return out

    def first(self, since_restart: bool = False, window: float | None = None) -> Entry | None:
        """The oldest entry :meth:`samples` would return (binary search: no walk over the window)."""
        start = self._start(since_restart, window)
        entries = self._entries
        if not entries:
            return None
        if start is None:
            return entries[0]
        lo, hi = 0, len(entries)
        while lo < hi:
            mid = (lo + hi) // 2
            if entries[mid].timestamp < start:
                lo = mid + 1
            else:
                hi = mid
        return entries[lo] if lo < len(entries) else None

    def _start(self, since_restart: bool, window: float | None) -> float | None:
        start = None
        if since_restart and self.last_restart_timestamp is not None:
            start = self.last_restart_timestamp
        if window is not None and self._entries:
            newest = self._entries[-1].timestamp
            if start is not None and newest < start:
                return start  # nothing after the restart: the window has no newest entry
            start = newest - window if start is None else max(start, newest - window)
        return start

    def increase(self, field: str, window: float | None = None) -> tuple[float, float] | None:
        """(increase, elapsed seconds) of counter ``field`` over ``window``, resets handled; None if < 2 points."""
        totals = self._totals.get(field)
        if totals is None and field in COUNTER_FIELDS:
            return None  # a tracked counter never reported by this series
        if totals is None:  # not a counter this history tracks: walk the samples
            return _increase([(e.timestamp, getattr(e.reading, field)) for e in self.samples(window=window)])
        times, sums = totals.times, totals.sums
        # the first point at or after the window's start (timestamps increase)
        first = 0 if window is None else bisect_left(times, self._entries[-1].timestamp - window)
        if len(times) - first < 2:
            return None
        return sums[-1] - sums[first], times[-1] - times[first]

    def rate(self, field: str, window: float | None = None) -> float | None:
        """Per-second increase of counter ``field`` over the last ``window`` seconds (None when unknown)."""
        result = self.increase(field, window)
        if result is None or result[1] <= 0:
            return None
        return result[0] / result[1]


class _Totals:
    """One counter's (timestamp, running total) points as two float arrays: 16 bytes a point instead of a
    ~100-byte tuple in a deque (15 counters x 720 polls: ~0.2 MB a series instead of ~1.1; docs/performance.md)."""

    __slots__ = ("sums", "times")

    def __init__(self) -> None:
        self.times = array("d")
        self.sums = array("d")

    def append(self, timestamp: float, step: float) -> None:
        self.sums.append((self.sums[-1] if self.sums else 0.0) + step)
        self.times.append(timestamp)

    def drop_through(self, timestamp: float) -> None:
        """Forget the points at or before ``timestamp`` (the oldest entry leaving the ring)."""
        gone = bisect_right(self.times, timestamp)
        if gone:
            del self.times[:gone]
            del self.sums[:gone]


def _increase(points: list[tuple[float, float | None]]) -> tuple[float, float] | None:
    known = [(t, v) for t, v in points if v is not None]
    if len(known) < 2:
        return None
    total = sum(counter_delta(before, now) or 0.0 for (_, before), (_, now) in pairwise(known))
    return total, known[-1][0] - known[0][0]


class History:
    """SeriesHistory per (model_name, engine); series unseen for ``forget_after`` seconds are dropped, and
    beyond ``max_series`` series the longest unseen go first (a target churning label values every poll
    must not grow memory for an hour)."""

    def __init__(self, max_samples: int = DEFAULT_MAX_SAMPLES, forget_after: float = 3600.0,
                 max_series: int | None = None, keep_seconds: float | None = None) -> None:
        self.max_samples = max_samples
        self.keep_seconds = keep_seconds
        self.forget_after = forget_after
        self.max_series = max_series
        self._series: dict[SeriesKey, SeriesHistory] = {}  # least recently seen first

    def __getitem__(self, key: SeriesKey) -> SeriesHistory:
        return self._series[key]

    def __contains__(self, key: object) -> bool:
        return key in self._series

    def keys(self) -> Iterable[SeriesKey]:
        return self._series.keys()

    def completed(self, poll: Poll) -> Poll:
        """``poll`` with each reading :meth:`SeriesHistory.completed` (after :meth:`record`), except where the page
        holds two configurations for the engine (the adapter's CAPACITY_UNDETERMINED: unknown, not the last one)."""
        readings = tuple(self._series[r.key].completed(r) if r.key in self._series
                         and r.capacity_source != CAPACITY_UNDETERMINED else r for r in poll.readings)
        return replace(poll, readings=readings)

    def screen(self, poll: Poll) -> Poll:
        """``poll`` with :meth:`SeriesHistory.screen` applied to each reading of a series already seen (before
        :meth:`record`); ``implausible`` lists the counters dropped."""
        readings = []
        implausible = list(poll.implausible)
        for reading in poll.readings:
            series = self._series.get(reading.key)
            if series is not None:
                reading, dropped = series.screen(poll.timestamp, reading)
                implausible.extend((reading.key, name, value) for name, value in dropped)
            readings.append(reading)
        if len(implausible) == len(poll.implausible):
            return poll
        return replace(poll, readings=tuple(readings), implausible=tuple(implausible))

    def record(self, poll: Poll) -> dict[SeriesKey, str]:
        """Append every reading of ``poll``; returns the series that restarted, with the reason."""
        restarted: dict[SeriesKey, str] = {}
        for reading in poll.readings:
            series = self._series.pop(reading.key, None)  # re-inserted: the dict stays least recently seen first
            if series is None:
                series = SeriesHistory(self.max_samples, self.keep_seconds)
            self._series[reading.key] = series
            reason = series.append(poll.timestamp, reading)
            if reason is not None:
                restarted[reading.key] = reason
        for key in [k for k, s in self._series.items()
                    if s.latest is not None and poll.timestamp - s.latest.timestamp > self.forget_after]:
            del self._series[key]
        if self.max_series is not None:
            for key in list(self._series)[:max(0, len(self._series) - self.max_series)]:
                del self._series[key]
        return restarted
