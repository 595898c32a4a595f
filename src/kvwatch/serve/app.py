"""``kvwatch serve``: poll vLLM on a timer, keep history, serve ``kvwatch_*`` on /metrics and /healthz.

The shell around the pure core. One timer thread (:class:`Poller`) polls (one poll at a time, ticks that fall during
a poll skipped); each poll builds a new frozen :class:`~kvwatch.serve.state.State` and swaps one reference that the
collector reads per scrape. ``/healthz`` answers 200 while the process serves and its polls finish, whatever vLLM
answers, so a vLLM outage never restarts kvwatch too; 503 once no poll has ended for longer than stale-after plus
the longest poll (:func:`polling_window`: a stalled poll thread, restarted by the liveness probe). Logs only changes
(target up/down, detected generation, restarts).

Analyzers (capacity model, forecaster with the advisor, latency) plug in through :data:`ANALYZER_MODULES`: each module
exposes ``make_analyzer(settings: ServeSettings, capacity: CapacityResolver) -> Analyzer | None`` (see
:mod:`kvwatch.serve.state`); ``capacity`` is the sidecar's one resolver of each series' KV capacity.

The core's clock is ``start + monotonic elapsed × clock_speed`` (``--clock-speed``, a demo/test knob), so
kvwatch can watch a simulator running faster than real time; rates are then per simulated second. The
interval, timeout and stale-after settings stay in real seconds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import faulthandler
import functools
import importlib
import logging
import os
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from kvwatch.capacity.series import max_model_len_of
from kvwatch.derived import RATE_WINDOW_SECONDS, SeriesState, derive
from kvwatch.engines import SourceOverrides
from kvwatch.fetch import DaemonThreads, Fetcher
from kvwatch.gpu_memory import GpuMatch, GpuMemory, shared_terms
from kvwatch.history import History
from kvwatch.latency import EDGE_SECONDS
from kvwatch.model import Poll, Reading, SeriesKey
from kvwatch.payload import ScrapeError, interpret
from kvwatch.serve import logs
from kvwatch.serve.capacity import CapacityAnalyzer, CapacityResult
from kvwatch.serve.collector import KvwatchCollector, make_registry
from kvwatch.serve.gpu import DcgmSource, GpuReadError, GpuState, GpuWatcher, NvmlSource
from kvwatch.serve.sidecar_capacity import CapacityResolver, one_model_flags_note
from kvwatch.serve.state import Analyzer, State
from kvwatch.serve.web import MetricsServer, RenderCache, WebConfigError, WebConfigWatcher, load_web_config
from kvwatch.settings import ServeSettings, SettingsError, add_settings_flags, load_settings, redact_url
from kvwatch.stop_signals import StopSignals

log = logging.getLogger("kvwatch")

ANALYZER_MODULES: tuple[str, ...] = ("kvwatch.serve.capacity", "kvwatch.serve.forecast", "kvwatch.serve.latency")


class Clock:
    """The poll clock: wall time at start, advanced by monotonic elapsed time × speed."""

    def __init__(self, speed: float = 1.0) -> None:
        self.speed = speed
        self._wall0 = time.time()
        self._mono0 = time.monotonic()

    def __call__(self) -> float:
        return self._wall0 + (time.monotonic() - self._mono0) * self.speed


RELEASE_AFTER_BYTES = 1 << 20
"""After a poll that held a body this large (or refused a larger one), freed memory goes back to the OS."""

# The last resort of SIGTERM: every step of the shutdown is bounded (each fetcher's close by 4 s, the HTTP
# server's by its 0.5-s poll), so one that still runs after this long is stuck: every thread's stack goes to stderr
# and the process exits with status 1 (:func:`_exit_at_deadline`). A CI run once saw SIGTERM not stop the sidecar
# within 10 s (docs/reliability.md).
SHUTDOWN_DEADLINE_SECONDS = 9.0
BACKSTOP_SECONDS = 2.0
"""After the deadline, faulthandler's own C thread dumps and exits if the Python one could not (the GIL held)."""


@functools.cache
def _libc() -> Any:
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def tune_malloc() -> None:
    """glibc only, best effort: keep the RSS of a process that now and then holds a 16 MiB body near its floor.

    glibc raises its mmap threshold after the first large buffer is freed, so later bodies land in the heap
    and in per-thread arenas that never shrink: a gzip bomb at a 0.5 s interval left RSS at ~100 MB after
    the target healed. A fixed threshold keeps big buffers mmapped (unmapped when freed); two arenas bound
    what the poll, parse and HTTP threads can strand."""
    libc = _libc()
    if libc is not None:
        m_mmap_threshold, m_arena_max = -3, -8  # glibc's mallopt parameter numbers (malloc.h)
        libc.mallopt(m_mmap_threshold, 256 * 1024)
        libc.mallopt(m_arena_max, 2)


def release_memory() -> None:
    """Hand freed heap pages back to the OS (glibc's malloc_trim); a no-op elsewhere."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


GpuRead = concurrent.futures.Future[list[GpuMemory] | GpuReadError]  # a GPU read running beside the poll


def _cause(exc: ScrapeError) -> str:
    """A failure's message without its numbers (a line or a size that moves every poll), an HTTP status kept: a
    change of cause within one reason is logged (a 503 while loading, then a 401 after an auth change, read 503 for
    good), one that only moves a number is not."""
    return str(exc) if exc.reason == "http_status" else re.sub(r"\d+", "#", str(exc))


class ChangeLog:
    """Logs each change of a status once, while there are at most ``burst`` changes per ``window`` seconds.

    A flapping target (up, down, up... every poll) would otherwise log two lines a poll. Beyond the burst,
    changes are counted instead, and :meth:`tick` (called every poll) logs one summary line per window for
    as long as the flapping lasts; once it calms down, changes are logged one by one again.
    """

    def __init__(self, logger: logging.Logger, *, burst: int = 10, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, initial: object = None) -> None:
        self._log, self._burst, self._window, self._clock = logger, burst, window, clock
        self._last = initial
        self._changes: deque[float] = deque()  # times of the changes within the last window
        self._suppressed = 0
        self._latest = ""
        self._summary_at: float | None = None

    def change(self, status: object, level: int, message: str, *args: object,
               exc_info: BaseException | None = None) -> None:
        if status == self._last:
            return
        self._last = status
        now = self._clock()
        self._changes.append(now)
        while now - self._changes[0] >= self._window:
            self._changes.popleft()
        if len(self._changes) <= self._burst and not self._suppressed:
            self._log.log(level, message, *args, exc_info=exc_info)
            return
        self._suppressed += 1
        self._latest = message % args
        if self._summary_at is None:
            self._summary_at = now
        self.tick()

    def tick(self) -> None:
        """One summary line per window while changes are being held back (and one when they stop)."""
        if not self._suppressed or self._summary_at is None:
            return
        now = self._clock()
        if now - self._summary_at < self._window:
            return
        self._log.warning("%d more changes in the last %.0fs not logged (flapping); latest: %s",
                          self._suppressed, now - self._summary_at, self._latest)
        self._suppressed = 0
        self._summary_at = None


class Sidecar:
    """Polls the target and owns the current State (swapped whole, read without locks)."""

    def __init__(self, settings: ServeSettings, fetcher: Fetcher, clock: Callable[[], float],
                 analyzers: Sequence[Analyzer[Any]] = (), gpu: GpuWatcher | None = None,
                 capacity: CapacityResolver | None = None) -> None:
        self.settings = settings
        # The one capacity per series (the engine's figures first, then the formula) every consumer reads;
        # run() hands the same resolver to the analyzers.
        self.capacity = capacity or CapacityResolver(settings)
        self.gpu = gpu
        # The GPU source is read on a thread of its own beside the engine's poll, so a slow exporter never delays
        # it, and one read at a time: a read that hangs (NVML on a GPU fallen off the bus) is waited for at most the
        # poll timeout and counted as timed out until it returns, while the engine's polls go on.
        self._gpu_threads = DaemonThreads("kvwatch-gpu") if gpu is not None else None
        self._gpu_pending: GpuRead | None = None
        self._gpu_log = ChangeLog(log, initial=None)
        self.fetcher = fetcher
        self.clock = clock
        self.analyzers = tuple(analyzers)
        self.overrides = SourceOverrides.from_settings(settings)
        self.target = redact_url(settings.target_url)  # what logs name: never the password in the URL
        self.max_series = settings.max_series
        # Polls older than the longest window a reader asks for are dropped (the ring of 720 was most of the
        # sidecar's data: docs/performance.md, "Sidecar memory").
        self.history = History(forget_after=max(3600.0, 10 * float(settings.stale_after_seconds or 0)),
                               max_series=2 * settings.max_series,
                               keep_seconds=max([RATE_WINDOW_SECONDS, *(a.history_seconds for a in self.analyzers)]))
        self.state = State()
        self._status_log = ChangeLog(log)
        self._values_log = ChangeLog(log, initial=())
        self._unknown_log = ChangeLog(log, initial=())  # values a page holds but does not determine (Poll.undetermined)
        self._overrun_log = ChangeLog(log, initial="on time")
        self._restart_log = ChangeLog(log)  # a target flapping between two engines "restarts" every poll
        self._models_log = ChangeLog(log)  # --model/--model-config meeting a page of several models
        self._stop = threading.Event()
        self._capped = False  # whether the last good poll had more series than --max-series
        self._skipped_runs = 0  # runs the poll timer skipped since polls last kept to the interval
        self._latency_read_at: float | None = None  # poll clock of the last poll that read latency buckets

    def close(self) -> None:
        """Close the engine's fetcher and the GPU source (cancelling reads in flight)."""
        self.fetcher.close()
        if self.gpu is not None:
            self.gpu.close()
        if self._gpu_threads is not None:
            self._gpu_threads.shutdown(wait=False)

    def stop(self) -> None:
        """From now on a poll ending (cancelled by the fetcher's close) neither logs nor swaps the state,
        and a poll still parsing is abandoned."""
        self._stop.set()

    @property
    def _stopping(self) -> bool:
        return self._stop.is_set()

    def poll(self) -> State:
        started = time.monotonic()
        state = self._poll()
        # A poll longer than the interval makes the poll timer skip ticks (one at a time, coalesced): say so
        # once when it starts and once when polls keep up again, not on every skipped run.
        interval = self.settings.poll_interval_seconds
        elapsed = time.monotonic() - started
        if self._stopping:
            return state
        self._status_log.tick()
        self._values_log.tick()
        self._unknown_log.tick()
        self._overrun_log.tick()
        self._restart_log.tick()
        if elapsed > interval:
            took = f"{elapsed:.3g}" if elapsed < 100 else f"{elapsed:.0f}"  # 0.012s, 1.5s, 1234s
            self._overrun_log.change("overrun", logging.WARNING, "a poll of %s took %ss, longer than the %gs "
                                     "interval: skipping runs until polls keep up", self.target, took, interval)
            self._skipped_runs += int(elapsed // interval)
        elif self._skipped_runs:
            self._overrun_log.change("on time", logging.INFO, "polls keep to the interval again (%d runs skipped)",
                                     self._skipped_runs)
            self._skipped_runs = 0
        return state

    def _interpret(self, text: str, now: float, latency: bool = True) -> Poll:
        """``interpret`` on a daemon thread this poll waits for, so SIGTERM never waits for a long parse.

        The parser has no stop check (a 16 MiB body takes seconds): on stop the poll returns at once and
        the abandoned thread, which touches nothing shared, dies with the process."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def work(body: str) -> None:
            try:
                box["poll"] = interpret(body, self.overrides, timestamp=now, max_series=self.max_series,
                                        latency=latency)
            except BaseException as exc:  # handed to the poll thread as is
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=work, args=(text,), name="kvwatch-parse", daemon=True).start()
        while not done.wait(0.05):
            if self._stopping:
                raise ScrapeError("connect", "poll abandoned: kvwatch is shutting down")
        error, poll = box.pop("error", None), box.pop("poll", None)
        del text  # the body: an error's traceback holds this frame, and the body must not outlive the poll
        if error is not None:
            try:
                raise error
            finally:
                del error  # no cycle frame -> error -> traceback -> frame
        return poll

    def _poll(self) -> State:
        started = time.monotonic()
        now = self.clock()
        previous = self.state
        errors = dict(previous.health.errors_total)
        big = False
        good = False
        text = ""
        gpu_read = self._start_gpu_read()
        try:
            # Latency buckets once per EDGE_SECONDS of poll clock (the window's edges), not on every poll.
            latency = self._latency_read_at is None or now - self._latency_read_at >= EDGE_SECONDS \
                or now < self._latency_read_at
            text = self.fetcher.fetch()
            big = len(text) > RELEASE_AFTER_BYTES
            poll = self._interpret(text, now, latency)
            text = ""
            if self._stopping:
                return previous
            if latency:
                self._latency_read_at = now
            state = self._up_state(poll, previous, now, gpu_read)
            if state is None:
                return previous
            good = True
        except ScrapeError as exc:
            text = ""
            if self._stopping:
                return previous
            # (a large body read whole and then refused as unreadable held its copies too)
            big = big or exc.reason == "too_large" or (
                exc.reason == "parse" and self.fetcher.last_body_bytes > RELEASE_AFTER_BYTES)
            state = self._down_state(exc, previous, now, errors, gpu_read,
                                     cause=exc.__cause__ if exc.reason == "internal" else None)
        except Exception as exc:  # kvwatch's own bug meeting this input: counted and reported down, never frozen
            text = ""
            if self._stopping:
                return previous
            failure = ScrapeError("internal", f"kvwatch failed on this poll: {type(exc).__name__}: {exc}")
            state = self._down_state(failure, previous, now, errors, gpu_read, cause=exc)
        # (measured here, so that it holds the wait for the GPU read too)
        finished = self.clock()
        health = replace(state.health, scrape_duration_seconds=time.monotonic() - started)
        if good:
            health = replace(health, last_success_finished=finished)
        state = replace(state, finished=finished, health=health)
        self.state = state  # the one atomic swap readers see
        if big:
            release_memory()
        return state

    def _down_state(self, exc: ScrapeError, previous: State, now: float, errors: dict[str, int],
                    gpu_read: GpuRead | None, cause: BaseException | None = None) -> State:
        """The state of a failed poll: the last good one, reported down, its error counted (``cause``: the
        exception behind an ``internal`` failure, whose traceback the log line carries)."""
        errors[exc.reason] += 1
        health = replace(previous.health, up=False, errors_total=MappingProxyType(errors), last_error_reason=exc.reason,
                         last_error=str(exc), polls_total=previous.health.polls_total + 1)
        self._status_log.change(("down", exc.reason, _cause(exc)), logging.ERROR if cause else logging.WARNING,
                                "target %s is down (%s): %s", self.target, exc.reason, exc, exc_info=cause)
        return replace(previous, timestamp=now, health=health,
                       gpu=self._gpu_state(gpu_read, now, {}, engine_serving=False))

    def _up_state(self, poll: Poll, previous: State, now: float, gpu_read: GpuRead | None) -> State | None:
        """The state of a good poll; None when SIGTERM came while its series were analysed."""
        poll, dropped = self._cap(poll)
        poll = self.history.screen(poll)
        implausible = self._count_implausible(poll, previous.health.implausible_total)
        self._log_undetermined(poll)
        restarted = self.history.record(poll)
        poll = self.history.completed(poll)
        for key, reason in restarted.items():
            # Each restart is a change of its own (the poll's time tells them apart); a flapping target is still
            # held to the burst.
            self._restart_log.change((key, reason, now), logging.WARNING, "engine series %s/%s restarted: %s",
                                     key[0], key[1], reason)
        shared = one_model_flags_note(self.settings, (r.model_name for r in poll.readings))
        self._models_log.change(shared, logging.WARNING if shared else logging.INFO, "%s",
                                shared or "the page serves one model again: --model/--model-config describe it")
        series = {}
        for reading in poll.readings:
            if self._stopping:  # up to --max-series analyses: SIGTERM does not wait for them
                return None
            series[reading.key] = self._series(reading, now)
        health = replace(previous.health, up=True, last_success_timestamp=now, last_success_wall_seconds=time.time(),
                         polls_total=previous.health.polls_total + 1,
                         series_dropped_total=previous.health.series_dropped_total + dropped,
                         implausible_total=implausible)
        state = State(timestamp=now, health=health, detection=poll.detection, series=MappingProxyType(series),
                      gpu=self._gpu_state(gpu_read, now, series, engine_restarted=bool(restarted)))
        d = poll.detection
        if not d.usage_metric:  # (None or "", which kvwatch_source_info exports as "" alike)
            # (a page read, but no KV usage on it: every KV state, risk and alert is blind while kvwatch_up reads 1,
            # as after an engine upgrade that renames the gauge again; `kvwatch check` says usage_unknown)
            self._status_log.change(("up", d), logging.WARNING, "target %s is up: %s %s, but no KV usage metric was "
                                    "found on its page (%d series): pass --usage-metric with the name it exports; "
                                    "until then kvwatch cannot tell how full the KV cache is",
                                    self.target, d.engine_kind, d.version_range, len(series))
        else:
            self._status_log.change(("up", d), logging.INFO, "target %s is up: %s %s, usage from %s, %d series",
                                    self.target, d.engine_kind, d.version_range, d.usage_metric, len(series))
        return state

    def _cap(self, poll: Poll) -> tuple[Poll, int]:
        """The adapter read at most ``--max-series`` series (the first in its stable order): one warning when
        series start being dropped, one line when they stop."""
        dropped = poll.series_dropped
        served = len(poll.readings) + dropped
        if dropped and not self._capped:
            log.warning("target %s serves %d (model_name, engine) series, more than --max-series %d: exporting "
                        "the first %d, dropping the rest (counted in kvwatch_series_dropped_total) until it "
                        "serves fewer", self.target, served, self.max_series, self.max_series)
        elif not dropped and self._capped:
            log.info("target %s serves %d series again, within --max-series %d", self.target, served,
                     self.max_series)
        self._capped = bool(dropped)
        return poll, dropped

    def _log_undetermined(self, poll: Poll) -> None:
        """A warning when the set of values the page holds but does not determine changes (an override matching no
        sample yet, vLLM's disagreeing pid copies, a histogram it cannot read): they are unknown, not exported, and
        this says why."""
        reasons = tuple(sorted({why for _, _, why in poll.undetermined} | set(poll.unread)))
        if not reasons:
            self._unknown_log.change((), logging.INFO, "target %s: every value it holds is read again", self.target)
            return
        self._unknown_log.change(reasons, logging.WARNING, "target %s: %s", self.target, "; ".join(reasons))

    def _count_implausible(self, poll: Poll, totals: Mapping[str, int]) -> Mapping[str, int]:
        if not poll.implausible:
            self._values_log.change((), logging.INFO, "target %s serves no impossible values any more", self.target)
            return totals
        counts = dict(totals)
        for _, name, _ in poll.implausible:
            counts[name] = counts.get(name, 0) + 1
        fields = tuple(sorted({name for _, name, _ in poll.implausible}))
        key, name, value = poll.implausible[0]
        self._values_log.change(fields, logging.WARNING, "target %s serves impossible values, read as unknown: %s "
                                "(first: %s/%s %s = %r)", self.target, ", ".join(fields), key[0], key[1], name, value)
        return MappingProxyType(counts)

    def _start_gpu_read(self) -> GpuRead | None:
        """This poll's read of the GPU source; the one still in flight when the last has not returned."""
        if self._gpu_threads is None or self.gpu is None:
            return None
        if self._gpu_pending is None or self._gpu_pending.done():
            self._gpu_pending = self._gpu_threads.submit(self.gpu.read)
        return self._gpu_pending

    def _gpu_state(self, read: GpuRead | None, now: float, series: dict[SeriesKey, SeriesState], *,
                   engine_serving: bool = True, engine_restarted: bool = False) -> GpuState | None:
        if read is None or self.gpu is None:
            return None
        # The KV pool and weights per GPU, as the capacity analyzer computed them for the live engine series.
        results = [s.extra.get(CapacityAnalyzer.name) for s in series.values()]
        kv_pool, weights = shared_terms((r.pool_bytes, r.weights_bytes) if isinstance(r, CapacityResult) else
                                        (None, None) for r in results)
        wait = float(self.settings.poll_timeout_seconds or 1.0)
        try:
            result = read.result(timeout=wait)
        except concurrent.futures.TimeoutError:
            result = GpuReadError("timeout", f"the GPU source has not answered for {wait:g}s or more")
        state = self.gpu.update(result, now, kv_pool, weights, engine_serving=engine_serving,
                                engine_restarted=engine_restarted)
        # (failures were counted but never said: the source's error, once per change)
        failing = None if state.up else state.last_error
        self._gpu_log.change(failing, logging.WARNING if failing else logging.INFO, "GPU memory source %s",
                             f"failing: {failing}" if failing else "read again")
        return state

    def _series(self, reading: Reading, now: float) -> SeriesState:
        history = self.history[reading.key]
        # The series' one capacity (the engine's figures first, then the formula), filled in for every consumer.
        reading = self.capacity.series(reading).apply(reading)
        extra: dict[str, object] = {}
        for analyzer in self.analyzers:
            try:
                result = analyzer.analyze(reading.key, history, reading, now)
            except Exception:
                log.exception("analyzer %s failed on %s", analyzer.name, reading.key)
                continue
            if result is not None:
                extra[analyzer.name] = result
        return derive(reading, history, max_model_len_of(reading, self.settings.max_model_len), extra)


def make_gpu_watcher(settings: ServeSettings) -> GpuWatcher | None:
    """The GPU memory source the settings ask for (--dcgm-url or --nvml), or None."""
    uuids = frozenset(settings.gpu_uuids.split(",")) if settings.gpu_uuids else frozenset()
    if settings.nvml:
        return GpuWatcher(NvmlSource(uuids))
    if settings.dcgm_url is None:
        return None
    fetcher = Fetcher(settings.dcgm_url, timeout=float(settings.poll_timeout_seconds or 1.0),
                      max_body_bytes=settings.max_body_bytes)
    return GpuWatcher(DcgmSource(fetcher, GpuMatch(settings.gpu_pod, settings.gpu_namespace, uuids)))


def load_analyzers(settings: ServeSettings, capacity: CapacityResolver | None = None,
                   modules: Sequence[str] = ANALYZER_MODULES) -> list[Analyzer[Any]]:
    """Each module's ``make_analyzer(settings, capacity)``; one that returns None has nothing to do for these
    settings. ``capacity`` is the sidecar's resolver (a new one when not given)."""
    capacity = capacity or CapacityResolver(settings)
    analyzers = []
    for name in modules:
        analyzer = importlib.import_module(name).make_analyzer(settings, capacity)
        if analyzer is not None:
            analyzers.append(analyzer)
    return analyzers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, ServeSettings)


def checked_settings(args: argparse.Namespace) -> ServeSettings:
    """The settings of ``args`` and the environment, with every check serve makes before it starts anything
    (SettingsError names the flag or variable); ``kvwatch demo`` makes them before it starts the simulator."""
    settings: ServeSettings = load_settings(ServeSettings, args)
    try:
        SourceOverrides.from_settings(settings)  # fail at startup, not at the first poll
    except ValueError as exc:
        raise SettingsError(f"invalid source-metric override: {exc}") from None
    if settings.web_config_file is not None:
        try:
            load_web_config(settings.web_config_file)
        except WebConfigError as exc:
            raise SettingsError(f"invalid --web-config-file: {exc}") from None
    return settings


def run(args: argparse.Namespace) -> int:
    settings = checked_settings(args)
    logs.setup(settings.log_level)
    if settings.log_level != "DEBUG":
        # Their INFO lines repeat every poll; kvwatch logs only changes.
        for noisy in ("httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    tune_malloc()
    clock = Clock(settings.clock_speed)
    fetcher = Fetcher(settings.target_url, timeout=float(settings.poll_timeout_seconds or 1.0),
                      max_body_bytes=settings.max_body_bytes, bearer_token_file=settings.bearer_token_file,
                      ca_file=settings.ca_file, tls_verify=settings.tls_verify)
    capacity = CapacityResolver(settings)
    analyzers = load_analyzers(settings, capacity)
    sidecar = Sidecar(settings, fetcher, clock, analyzers, make_gpu_watcher(settings), capacity)
    # Settings durations are real seconds; the poll clock runs clock_speed times faster.
    stale_after = float(settings.stale_after_seconds or 0) * settings.clock_speed
    polling_within = polling_window(settings)
    collector = KvwatchCollector(lambda: sidecar.state, now=clock, stale_after=stale_after, analyzers=analyzers,
                                 polling_within=polling_within)
    registry = make_registry(collector)

    stalled = polls_stalled(sidecar, clock, settings)

    def version() -> tuple[object, bool]:
        # What the rendered body depends on: the State (a new object each poll) and whether it is still fresh.
        state = sidecar.state
        return state, state.fresh(clock(), stale_after)

    try:
        web = WebConfigWatcher(settings.web_config_file)
    except WebConfigError as exc:
        fetcher.close()
        raise SettingsError(f"invalid --web-config-file: {exc}") from None
    try:
        server = MetricsServer((settings.listen_address, settings.port), RenderCache(registry, version), web,
                               stalled)
    except OSError as exc:
        sidecar.close()
        # The address is only checked for its form until here: a host that does not resolve, an address this
        # machine does not own and a port in use are all the flags' values, so the refusal names them.
        raise SettingsError(f"cannot listen on --listen-address {settings.listen_address} --port {settings.port}: "
                            f"{exc.strerror or exc}") from None
    stop = StopSignals().install()  # SIGTERM, SIGINT (a handler setting an Event could deadlock: the module says why)
    # Their default is to die at once, without the shutdown above: a config reloader's SIGHUP restarted the container.
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda number, _frame: log.info(
            "%s ignored: the web config file is read again when it changes, and other settings need a restart",
            signal.Signals(number).name))
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    port = server.server_address[1]  # --port 0: the free port the system picked
    log.info("kvwatch serving on %s://%s:%d/metrics%s, polling %s every %gs", "https" if web.config.tls else "http",
             f"[{settings.listen_address}]" if ":" in settings.listen_address else settings.listen_address, port,
             " (basic auth)" if web.config.users else "", sidecar.target,
             settings.poll_interval_seconds)
    if sidecar.gpu is not None:
        log.info("GPU memory from %s", redact_url(settings.dcgm_url) if settings.dcgm_url else "NVML")
    poller = start_polling(sidecar, settings.poll_interval_seconds)
    try:
        stop.wait()
    finally:
        _exit_at_deadline(SHUTDOWN_DEADLINE_SECONDS)
        log.info("shutting down")
        stop_polling(poller, sidecar)
        server.shutdown()
        server.server_close()
        stop.restore()  # (last: a second signal during the shutdown is recorded, not a kill mid-way)
    return 0


def _exit_at_deadline(seconds: float) -> None:
    """Past ``seconds``, every thread's stack to stderr, then exit 1. A Python thread dumps them holding the GIL:
    faulthandler's own watchdog reads the other threads' frames without it (a CI run ended with a
    segfault, -11, when it alone dumped: the likeliest cause, not reproduced). That watchdog stays,
    BACKSTOP_SECONDS later, for an exit the GIL never lets the Python thread reach."""
    last_words = logs.nonblocking_stderr()  # (writes fail rather than wait on a full pipe)

    def exit_now() -> None:
        with contextlib.suppress(OSError, ValueError):
            last_words.write(f"kvwatch: shutdown still running after {seconds:g} s: every thread's stack follows\n")
            last_words.flush()
            faulthandler.dump_traceback(file=last_words, all_threads=True)
        os._exit(1)

    timer = threading.Timer(seconds, exit_now)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(seconds + BACKSTOP_SECONDS, exit=True, file=last_words)


# The parse's allowance in the polling window, per MiB of --max-body-bytes: a NIM page at the 16 MiB cap (read
# twice) took 10 s on 2 cores, one at 64 MiB 41.5 s, and /healthz answered 503 for 15 s of every such poll.
PARSE_SECONDS_PER_MIB = 1.0


def polling_window(settings: ServeSettings) -> float:
    """How far apart (poll clock) polls may end while polling goes on: an interval (<= stale-after) plus the longest
    poll, its fetch and its GPU read each up to the poll timeout, the parse of a body at the cap, and its analysis
    (an interval's margin). Past that, polling stopped (kvwatch_up 0, /healthz 503); less flapped with polls that ran
    to their timeouts."""
    stale_after = float(settings.stale_after_seconds or 0)
    parse = settings.max_body_bytes / 2**20 * PARSE_SECONDS_PER_MIB
    longest_poll = 2 * float(settings.poll_timeout_seconds or 0) + parse + settings.poll_interval_seconds
    return (stale_after + longest_poll) * settings.clock_speed


def polls_stalled(sidecar: Sidecar, clock: Callable[[], float],
                  settings: ServeSettings) -> Callable[[], str | None]:
    """Why /healthz fails, or None: once no poll has ended for :func:`polling_window` (counted from now before the
    first), a stalled poll thread is for the liveness probe to restart. A target that is down still ends its polls
    (failed ones): that is kvwatch_up's to say, never a restart."""
    started = clock()
    within = polling_window(settings)
    within_seconds = within / settings.clock_speed

    def stalled() -> str | None:
        if sidecar.state.polling(clock(), within, started):
            return None
        return (f"no poll has ended for {within_seconds:g} s (--stale-after-seconds + 2 x --poll-timeout-seconds + "
                "a second per MiB of --max-body-bytes + --poll-interval-seconds): polling stopped\n")

    return stalled


class Poller:
    """Calls ``poll`` every ``interval`` real seconds on one daemon thread, the first call at once.

    One poll at a time: a tick that falls while a poll still runs is skipped and the next poll starts at the
    following tick (the sidecar logs overruns). A plain thread rather than a scheduler library: the sidecar
    has one job, and APScheduler's ~70 modules cost ~3 MB of RSS (docs/performance.md)."""

    def __init__(self, poll: Callable[[], object], interval: float) -> None:
        self._poll = poll
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvwatch-poll", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stops the ticks; a poll in flight is not waited for (the sidecar cancels it)."""
        self._stop.set()

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                self._poll()
            except Exception:
                log.exception("poll failed")
            now = time.monotonic()
            due += self._interval
            if due <= now:  # ticks missed during a long poll: wait for the next one ahead
                due += (1 + int((now - due) // self._interval)) * self._interval
            self._stop.wait(due - now)


def start_polling(sidecar: Sidecar, interval_seconds: float) -> Poller:
    """The poll timer; with --clock-speed the core sees interval × speed poll-clock seconds between polls."""
    poller = Poller(sidecar.poll, interval_seconds)
    poller.start()
    return poller


def stop_polling(poller: Poller, sidecar: Sidecar) -> None:
    """Bounded: a poll in flight is cancelled by closing the fetcher, not waited for."""
    sidecar.stop()
    poller.stop()
    sidecar.close()
