"""The I/O shell of the simulator: a clock, a request feed and an HTTP ``/metrics`` endpoint.

The simulated clock is ``(monotonic() - start) * speed``. A ticker thread advances the simulator a few
times per second and every scrape advances it to "now" first, so ``/metrics`` is always current.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kvwatch.sim.engine import EngineSnapshot, Request, Simulator
from kvwatch.sim.engines_wire import render_any
from kvwatch.sim.load import LoadGenerator
from kvwatch.sim.traces import span_of

# Always the text format 0.0.4, uncompressed: vLLM's make_asgi_app would also negotiate OpenMetrics and gzip
# (see docs/simulator.md, "Wire format", for why the simulator does not).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class TraceFeed:
    """Replays a trace, looping it (each pass shifted by the trace's span) for runs longer than it."""

    def __init__(self, requests: Sequence[Request]) -> None:
        if not requests:
            raise ValueError("the trace has no requests")
        self._requests = sorted(requests, key=lambda r: r.arrival_time)
        self._span = span_of(self._requests)
        self._pass = 0
        self._index = 0

    def take_until(self, t: float) -> list[Request]:
        out: list[Request] = []
        while True:
            offset = self._pass * self._span
            while self._index < len(self._requests) and self._requests[self._index].arrival_time + offset <= t:
                request = self._requests[self._index]
                out.append(replace(request, arrival_time=request.arrival_time + offset) if offset else request)
                self._index += 1
            if self._index < len(self._requests):
                return out
            self._pass += 1
            self._index = 0


Feed = LoadGenerator | TraceFeed


class SimulationService:
    """A simulator fed by a load source, advanced to a given simulated time (thread-safe)."""

    def __init__(self, simulator: Simulator, feed: Feed, render_options: dict, *, speed: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, restarts: Sequence[float] = ()) -> None:
        self.simulator = simulator
        self.feed = feed
        self.render_options = render_options
        self.speed = speed
        self._restarts = sorted(restarts)  # simulated times at which the server restarts
        self._clock = clock
        self._start = clock()
        self._lock = threading.Lock()
        self.submitted = 0

    def sim_now(self) -> float:
        return (self._clock() - self._start) * self.speed

    def advance(self, t: float | None = None) -> tuple[EngineSnapshot, ...]:
        """Advance to simulated time ``t`` (default: the clock's now) and return the snapshot there."""
        with self._lock:
            target = max(self.simulator.time, self.sim_now() if t is None else t)
            while self._restarts and self._restarts[0] <= target:
                self._run_to(self._restarts.pop(0))
                self.simulator.restart()
            self._run_to(target)
            return self.simulator.snapshot()

    def _run_to(self, t: float) -> None:
        t = max(t, self.simulator.time)
        new = self.feed.take_until(t)
        self.submitted += len(new)
        self.simulator.submit(new)
        self.simulator.run_until(t)

    def metrics_text(self) -> str:
        return render_any(self.advance(), **self.render_options)


def make_server(service: SimulationService, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server answering ``/metrics`` (and vLLM's ``/health``) from ``service``; port 0 picks one."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/metrics", "/metrics/"):  # (vLLM's api_server mounts /metrics with a regex for both)
                self._reply(200, service.metrics_text().encode(), CONTENT_TYPE)
            elif path == "/health":
                self._reply(200, b"", "text/plain")
            else:
                self._reply(404, b"not found: try /metrics\n", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the scraper gave up at its poll deadline: its own log says so, a traceback here adds nothing

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every few seconds would flood the terminal

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # an IPv6 address (--listen-address ::1), as kvwatch serve listens on one
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    return Server((host, port), Handler)


def start_ticker(service: SimulationService, stop: threading.Event, interval: float = 0.2) -> threading.Thread:
    """Keep the simulation close to the clock between scrapes, so no scrape pays for a long catch-up."""

    def loop() -> None:
        while not stop.wait(interval):
            service.advance()

    thread = threading.Thread(target=loop, name="kvwatch-sim-ticker", daemon=True)
    thread.start()
    return thread
