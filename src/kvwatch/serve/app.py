"""``kvwatch serve``: poll vLLM on a timer, keep history, serve ``kvwatch_*`` on /metrics and /healthz.

The shell around the pure core. One APScheduler interval job polls (one instance at a time, late runs
coalesced); each poll builds a new frozen :class:`~kvwatch.serve.state.State` and swaps one reference that the
collector reads per scrape. ``/healthz`` answers 200 while the process serves, whatever vLLM does, so a
vLLM outage never restarts kvwatch too. Logs only changes (target up/down, detected generation, restarts).

Analyzers (capacity model, forecaster, advisor) plug in through :data:`ANALYZER_MODULES`: each module
exposes ``make_analyzer(settings: ServeSettings) -> Analyzer | None`` (see :mod:`kvwatch.serve.state`).

The core's clock is ``start + monotonic elapsed × clock_speed`` (``--clock-speed``, a demo/test knob), so
kvwatch can watch a simulator running faster than real time; rates are then per simulated second. The
interval, timeout and stale-after settings stay in real seconds.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from kvwatch.derived import SeriesState, derive
from kvwatch.engines import SourceOverrides
from kvwatch.fetch import Fetcher
from kvwatch.history import History
from kvwatch.latency import EDGE_SECONDS
from kvwatch.payload import ScrapeError, interpret
from kvwatch.serve.collector import KvwatchCollector, make_registry
from kvwatch.serve.sidecar_capacity import resolver_for
from kvwatch.serve.state import Analyzer, State
from kvwatch.settings import ServeSettings, SettingsError, add_settings_flags, load_settings

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


class Sidecar:
    """Polls the target and owns the current State (swapped whole, read without locks)."""

    def __init__(self, settings: ServeSettings, fetcher: Fetcher, clock: Callable[[], float],
                 analyzers: Sequence[Analyzer] = ()) -> None:
        self.settings = settings
        self.fetcher = fetcher
        self.clock = clock
        self.analyzers = tuple(analyzers)
        self.overrides = SourceOverrides.from_settings(settings)
        self.history = History(forget_after=max(3600.0, 10 * float(settings.stale_after_seconds or 0)))
        self.state = State()
        self._last_logged: tuple[Any, ...] | None = None
        self._stopping = False
        self._skipped_runs = 0  # runs the scheduler skipped since polls last kept to the interval
        self._latency_read_at: float | None = None  # poll clock of the last poll that read latency buckets

    def stop(self) -> None:
        """From now on a poll ending (cancelled by the fetcher's close) neither logs nor swaps the state."""
        self._stopping = True

    def poll(self) -> State:
        started = time.monotonic()
        state = self._poll()
        # A poll longer than the interval makes the scheduler skip runs (one at a time, coalesced): say so
        # once when it starts and once when polls keep up again, not on every skipped run.
        interval = self.settings.poll_interval_seconds
        elapsed = time.monotonic() - started
        if self._stopping:
            return state
        if elapsed > interval:
            if self._skipped_runs == 0:
                log.warning("a poll of %s took %.1fs, longer than the %gs interval: skipping runs until polls "
                            "keep up", self.settings.target_url, elapsed, interval)
            self._skipped_runs += int(elapsed // interval)
        elif self._skipped_runs:
            log.info("polls keep to the interval again (%d runs skipped)", self._skipped_runs)
            self._skipped_runs = 0
        return state

    def _poll(self) -> State:
        started = time.monotonic()
        now = self.clock()
        previous = self.state
        errors = dict(previous.health.errors_total)
        try:
            # Latency buckets once per EDGE_SECONDS of poll clock (the window's edges), not on every poll.
            latency = self._latency_read_at is None or now - self._latency_read_at >= EDGE_SECONDS \
                or now < self._latency_read_at
            poll = interpret(self.fetcher.fetch(), self.overrides, timestamp=now, latency=latency)
        except ScrapeError as exc:
            if self._stopping:
                return previous
            errors[exc.reason] += 1
            health = replace(previous.health, up=False, scrape_duration_seconds=time.monotonic() - started,
                             errors_total=MappingProxyType(errors), last_error_reason=exc.reason,
                             last_error=str(exc), polls_total=previous.health.polls_total + 1)
            state = replace(previous, timestamp=now, health=health)
            self._log_change(("down", exc.reason), "target %s is down (%s): %s", self.settings.target_url,
                             exc.reason, exc)
        else:
            if latency:
                self._latency_read_at = now
            restarted = self.history.record(poll)
            for key, reason in restarted.items():
                log.warning("vLLM series %s/%s restarted: %s", key[0], key[1], reason)
            series = {r.key: self._series(r, now) for r in poll.readings}
            health = replace(previous.health, up=True, scrape_duration_seconds=time.monotonic() - started,
                             last_success_timestamp=now, last_success_wall_seconds=time.time(),
                             polls_total=previous.health.polls_total + 1)
            state = State(timestamp=now, health=health, detection=poll.detection, series=MappingProxyType(series))
            d = poll.detection
            self._log_change(("up", d), "target %s is up: %s %s, usage from %s, %d series",
                             self.settings.target_url, d.engine_kind, d.version_range, d.usage_metric, len(series))
        self.state = state  # the one atomic swap readers see
        return state

    def _series(self, reading: Any, now: float) -> SeriesState:
        history = self.history[reading.key]
        # The series' one capacity (the engine's figures first, then the formula), filled in for every consumer.
        reading = resolver_for(self.settings).series(reading).apply(reading)
        extra: dict[str, Any] = {}
        for analyzer in self.analyzers:
            try:
                result = analyzer.analyze(reading.key, history, reading, now)
            except Exception:
                log.exception("analyzer %s failed on %s", analyzer.name, reading.key)
                continue
            if result is not None:
                extra[analyzer.name] = result
        return derive(reading, history, self.settings.max_model_len, extra)

    def _log_change(self, status: tuple[Any, ...], message: str, *args: Any) -> None:
        if status != self._last_logged:
            (log.info if status[0] == "up" else log.warning)(message, *args)
            self._last_logged = status


def load_analyzers(settings: ServeSettings, modules: Sequence[str] = ANALYZER_MODULES) -> list[Analyzer]:
    """Each module's ``make_analyzer(settings)``; one that returns None has nothing to do for these settings."""
    analyzers = []
    for name in modules:
        analyzer = importlib.import_module(name).make_analyzer(settings)
        if analyzer is not None:
            analyzers.append(analyzer)
    return analyzers


def make_handler(registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                self._reply(200, content_type, encoder(registry))
            elif path == "/healthz":
                self._reply(200, "text/plain; charset=utf-8", b"ok\n")
            else:
                self._reply(404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n")

        def _reply(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, ServeSettings)


def run(args: argparse.Namespace) -> int:
    settings: ServeSettings = load_settings(ServeSettings, args)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.log_level != "DEBUG":
        # Their INFO lines repeat every poll; kvwatch logs only changes.
        for noisy in ("apscheduler", "httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        SourceOverrides.from_settings(settings)  # fail at startup, not at the first poll
    except ValueError as exc:
        raise SettingsError(f"invalid source-metric override: {exc}") from None
    clock = Clock(settings.clock_speed)
    fetcher = Fetcher(settings.target_url, timeout=float(settings.poll_timeout_seconds or 1.0),
                      max_body_bytes=settings.max_body_bytes, bearer_token_file=settings.bearer_token_file,
                      ca_file=settings.ca_file, tls_verify=settings.tls_verify)
    analyzers = load_analyzers(settings)
    sidecar = Sidecar(settings, fetcher, clock, analyzers)
    # Settings durations are real seconds; the poll clock runs clock_speed times faster.
    stale_after = float(settings.stale_after_seconds or 0) * settings.clock_speed
    collector = KvwatchCollector(lambda: sidecar.state, now=clock, stale_after=stale_after, analyzers=analyzers)
    registry = make_registry(collector)
    try:
        server = ThreadingHTTPServer((settings.listen_address, settings.port), make_handler(registry))
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", settings.listen_address, settings.port, exc)
        fetcher.close()
        return 1
    server.daemon_threads = True
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    port = server.server_address[1]  # --port 0: the free port the system picked
    log.info("kvwatch serving on http://%s:%d/metrics, polling %s every %gs", settings.listen_address,
             port, settings.target_url, settings.poll_interval_seconds)
    scheduler = start_polling(sidecar, settings.poll_interval_seconds)
    try:
        stop.wait()
    finally:
        log.info("shutting down")
        stop_polling(scheduler, sidecar)
        server.shutdown()
        server.server_close()
    return 0


def start_polling(sidecar: Sidecar, interval_seconds: float) -> BackgroundScheduler:
    """The poll job: one at a time, late runs coalesced; the sidecar, not APScheduler, logs overruns."""
    logging.getLogger("apscheduler.scheduler").addFilter(_drop_skip_warnings)
    scheduler = BackgroundScheduler(timezone="UTC")
    # Real-time interval: with --clock-speed the core sees interval × speed poll-clock seconds between polls.
    scheduler.add_job(sidecar.poll, "interval", seconds=interval_seconds,
                      max_instances=1, coalesce=True, next_run_time=_utcnow(), id="poll",
                      misfire_grace_time=None)
    scheduler.start()
    return scheduler


def stop_polling(scheduler: BackgroundScheduler, sidecar: Sidecar) -> None:
    """Bounded: a poll in flight is cancelled by closing the fetcher, not waited for."""
    sidecar.stop()
    scheduler.shutdown(wait=False)
    sidecar.fetcher.close()


def _drop_skip_warnings(record: logging.LogRecord) -> bool:
    # APScheduler warns on every skipped run; the sidecar logs an overrun once instead.
    return "maximum number of running instances" not in str(record.msg)


def _utcnow() -> Any:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)
