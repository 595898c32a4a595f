"""End to end: a real ``kvwatch serve`` process polling a real HTTP target on loopback.

The target serves a vLLM payload, then garbage, then goes away, then comes back. kvwatch must stay up,
report ``kvwatch_up`` 0 with the right error reasons, drop derived gauges after stale-after, keep
``/healthz`` at 200 throughout, and recover when the target returns; SIGTERM stops it cleanly.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

PAYLOAD = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom").read_bytes()
HTML = b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>\n"


class Target:
    """A stand-in vLLM on loopback whose answer the test switches."""

    def __init__(self) -> None:
        self.body = PAYLOAD
        self.port = free_port()
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = target.body
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2.0).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def get(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def has_derived(samples: dict) -> bool:
    return any(name.startswith(("kvwatch_kv_", "kvwatch_requests_")) for name, _ in samples)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except httpx.HTTPError as exc:  # kvwatch not listening yet
            last_error = exc
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_error})")


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target()
    t.start()
    try:
        yield t
    finally:
        t.stop()


def test_serve_survives_garbage_and_outage(target: Target) -> None:
    port = free_port()
    # (faulthandler: a stuck shutdown is made to print every thread's stack, below)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")} | {"PYTHONFAULTHANDLER": "1"}
    # Polls 0.4 s long at most: 0.15 s timed out on a loaded machine, and each timeout logs a change of its own.
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "serve", "--target-url", f"http://127.0.0.1:{target.port}/metrics",
         "--listen-address", "127.0.0.1", "--port", str(port), "--poll-interval-seconds", "0.5",
         "--poll-timeout-seconds", "0.4", "--stale-after-seconds", "1.5"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        e1 = {"model_name": "llama", "engine": "1"}
        wait_for(lambda: get(scrape(port), "kvwatch_kv_usage_ratio", **e1) == 0.5, "first good poll")
        samples = scrape(port)
        assert get(samples, "kvwatch_up") == 1.0
        assert get(samples, "kvwatch_kv_capacity_tokens", **e1) == 163840.0
        assert get(samples, "kvwatch_source_info", engine_kind="vllm", version_range=">=0.21",
                   usage_metric="vllm:kv_cache_usage_perc", running_metric="vllm:num_requests_running",
                   waiting_metric="vllm:num_requests_waiting",
                   capacity_metric="vllm:cache_config_info{kv_cache_size_tokens}") == 1.0

        target.body = HTML  # the target answers, but not with metrics
        wait_for(lambda: (get(scrape(port), "kvwatch_scrape_errors_total", reason="parse") or 0) > 0, "parse error")
        assert get(scrape(port), "kvwatch_up") == 0.0
        wait_for(lambda: not has_derived(scrape(port)), "derived gauges to go stale")

        target.stop()  # the target is gone
        wait_for(lambda: (get(scrape(port), "kvwatch_scrape_errors_total", reason="connect") or 0) > 0,
                 "connect error")
        samples = scrape(port)
        assert get(samples, "kvwatch_up") == 0.0 and not has_derived(samples)
        assert get(samples, "kvwatch_last_success_timestamp_seconds") is not None
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2.0).status_code == 200
        assert proc.poll() is None

        target.body = PAYLOAD
        target.start()  # back on the same port
        wait_for(lambda: get(scrape(port), "kvwatch_up") == 1.0 and has_derived(scrape(port)), "recovery")
        assert get(scrape(port), "kvwatch_requests_waiting", model_name="llama", engine="0") == 4.0

        proc.send_signal(signal.SIGTERM)
        try:
            # Well past kvwatch's own 9-s fallback (which dumps the stacks and exits 1): one CI run saw no exit
            # within 10 s, and the test gave up before the dump could name the cause.
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack on its way out
            proc.wait(timeout=10)
            code = None
        log = proc.stdout.read() if proc.stdout else ""
        assert code == 0, f"SIGTERM: exit status {code}; kvwatch's output:\n{log[-20000:]}"
        # Only changes are logged: one "down" per outage kind, not one per poll.
        assert log.count("is down (parse)") == 1 and log.count("is down (connect)") == 1
        assert log.count("is up") == 2
    finally:
        _reap(proc)


def test_sigterm_stops_serve_while_a_poll_hangs() -> None:
    accepted = threading.Event()
    hung: list[socket.socket] = []
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, reads nothing, never answers

    def accept() -> None:
        try:
            hung.append(silent.accept()[0])
            accepted.set()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    # A poll may run for 50 s; SIGTERM must not wait for it.
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "serve", "--target-url",
         f"http://127.0.0.1:{silent.getsockname()[1]}/metrics", "--listen-address", "127.0.0.1", "--port", str(port),
         "--poll-interval-seconds", "60", "--poll-timeout-seconds", "50"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert accepted.wait(30), "kvwatch never polled"
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200, "serving")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        log = proc.stdout.read() if proc.stdout else ""
        assert "is down" not in log  # the cancelled poll is not reported as an outage
    finally:
        _reap(proc)
        for conn in hung:
            conn.close()
        silent.close()


def test_a_stuck_shutdown_dumps_every_thread_and_exits_at_the_deadline(target: Target) -> None:
    """The last resort (serve.app.SHUTDOWN_DEADLINE_SECONDS): when a shutdown step hangs, faulthandler prints
    every thread's stack and the process exits with status 1 instead of waiting for SIGKILL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    code = ("import sys, threading\n"
            "from kvwatch.serve import app\n"
            "app.SHUTDOWN_DEADLINE_SECONDS = 1.0\n"
            "app.stop_polling = lambda poller, sidecar: threading.Event().wait()  # a shutdown step that hangs\n"
            "from kvwatch.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--target-url", f"http://127.0.0.1:{target.port}/metrics",
         "--listen-address", "127.0.0.1", "--port", str(port), "--poll-interval-seconds", "0.2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: get(scrape(port), "kvwatch_up") == 1.0, "first good poll")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 1  # without the deadline it would hang until SIGKILL
        log = proc.stdout.read() if proc.stdout else ""
        # faulthandler's dump, naming the deadline and the step that hung
        assert "shutdown still running after 1 s" in log and 'File "<string>", line 4 in <lambda>' in log, log[-3000:]
    finally:
        _reap(proc)


class _SlowThenFast:
    """A fetcher whose first polls overrun the interval, then keep to it."""

    last_body_bytes = 0

    def __init__(self, slow_polls: int, seconds: float) -> None:
        self.slow_polls, self.seconds, self.calls = slow_polls, seconds, 0
        self.done = threading.Event()

    def fetch(self) -> str:
        self.calls += 1
        if self.calls <= self.slow_polls:
            time.sleep(self.seconds)
        elif self.calls > self.slow_polls + 3:
            self.done.set()
        return PAYLOAD.decode()

    def close(self) -> None:
        pass


def test_overrunning_polls_are_logged_once_not_per_skipped_run(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from kvwatch.serve.app import Sidecar, start_polling, stop_polling
    from kvwatch.settings import ServeSettings

    fetcher = _SlowThenFast(slow_polls=3, seconds=0.35)
    sidecar = Sidecar(ServeSettings(poll_interval_seconds=0.1), fetcher, time.time)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO):
        poller = start_polling(sidecar, 0.1)
        try:
            assert fetcher.done.wait(30)
        finally:
            stop_polling(poller, sidecar)
    messages = [r.getMessage() for r in caplog.records]
    assert not any("maximum number of running instances" in m for m in messages)
    assert sum("longer than the 0.1s interval" in m for m in messages) == 1
    caught_up = [m for m in messages if "keep to the interval again" in m]
    assert len(caught_up) == 1 and "runs skipped" in caught_up[0]


def test_the_poller_polls_at_once_one_at_a_time_and_stops() -> None:
    """The poll timer: the first poll without waiting an interval, never two at once (ticks that fall during a
    long poll are skipped), none after stop."""
    from kvwatch.serve.app import Poller

    starts: list[float] = []
    running = threading.Lock()
    overlapped = threading.Event()
    third = threading.Event()

    def poll() -> None:
        if not running.acquire(blocking=False):
            overlapped.set()
            return
        try:
            starts.append(time.monotonic())
            time.sleep(0.25 if len(starts) == 1 else 0.0)  # the first poll overruns 0.1 s ticks
            if len(starts) >= 3:
                third.set()
        finally:
            running.release()

    began = time.monotonic()
    poller = Poller(poll, 0.1)
    poller.start()
    assert third.wait(30)
    poller.stop()
    assert starts[0] - began < 5 and not overlapped.is_set()
    assert starts[1] - starts[0] >= 0.25  # the ticks at 0.1 and 0.2 s fell during the first poll
    time.sleep(0.3)
    count = len(starts)
    time.sleep(0.3)
    assert len(starts) == count


def _reap(proc: subprocess.Popen) -> None:
    """Whatever the test did: no kvwatch left running, no pipe left open."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=5)
    if proc.stdout:
        proc.stdout.close()


def test_port_0_picks_a_free_port_logs_it_and_exports_wall_clock_success(target: Target) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    # --clock-speed 100: the poll clock runs far ahead of the wall clock, as in the demo.
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "serve", "--target-url", f"http://127.0.0.1:{target.port}/metrics",
         "--listen-address", "127.0.0.1", "--port", "0", "--poll-interval-seconds", "0.2",
         "--clock-speed", "100"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        port = None
        for line in proc.stdout:  # the start line comes before polling begins
            if "kvwatch serving on http://127.0.0.1:" in line:
                port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
                break
        assert port is not None and port != 0
        wait_for(lambda: get(scrape(port), "kvwatch_up") == 1.0, "first good poll on the logged port")
        started = time.time()
        success = get(scrape(port), "kvwatch_last_success_timestamp_seconds")
        assert success is not None and started - 30 < success <= time.time() + 1  # wall clock, not 100x ahead
    finally:
        _reap(proc)


def test_a_resolver_that_never_answers_does_not_hold_up_the_exit() -> None:
    # asyncio resolves names on its default executor, whose workers are joined at exit: with a resolver that does not
    # answer, SIGTERM waited for them until the 9-s fallback (exit 1 and a thread dump). Here getaddrinfo never
    # returns, the poll times out, and the process must still end at once.
    code = (
        "import socket, threading\n"
        "socket.getaddrinfo = lambda *a, **k: threading.Event().wait()\n"
        "from kvwatch.fetch import Fetcher\nfrom kvwatch.payload import ScrapeError\n"
        "f = Fetcher('http://vllm.invalid:8000/metrics', timeout=0.5, max_body_bytes=1 << 20)\n"
        "try:\n    f.fetch()\nexcept ScrapeError as e:\n    print(e.reason)\n"
        "f.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "timeout"), done.stderr


def test_sighup_is_logged_and_ignored_not_fatal(target: Target) -> None:
    # A config reloader's SIGHUP killed the sidecar at once (the default action), without its shutdown.
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "serve", "--target-url", f"http://127.0.0.1:{target.port}/metrics",
         "--listen-address", "127.0.0.1",
         "--port", str(port), "--poll-interval-seconds", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200, "serving")
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200, "alive")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert "SIGHUP ignored" in (proc.stdout.read() if proc.stdout else "")
    finally:
        _reap(proc)


def test_a_log_pipe_nobody_reads_stops_neither_the_polls_nor_sigterm() -> None:
    """A container runtime that stops reading the log pipe (a collector fallen behind): the pipe fills, and a
    StreamHandler blocked the thread that logged. The poll thread stopped on an "is down" line, kvwatch_up froze at
    1 and SIGTERM hung on "shutting down". Here the pipe is full but for a few hundred bytes and
    the target flips between a payload and a 502 page every half second: every flip is a line to log."""
    import fcntl

    polls = 0
    good = True

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            nonlocal polls
            polls += 1
            body = PAYLOAD if good else HTML
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    os.write(write_end, b"x" * (fcntl.fcntl(write_end, 1032) - 300))  # F_GETPIPE_SZ: full but for 300 bytes
    os.set_blocking(write_end, True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "serve", "--target-url", f"http://127.0.0.1:{server.server_port}/metrics",
         "--listen-address", "127.0.0.1", "--port", str(port), "--poll-interval-seconds", "0.2"],
        env=env, stdout=write_end, stderr=write_end)
    os.close(write_end)
    try:
        wait_for(lambda: polls > 3, "first polls", timeout=30)
        for _ in range(8):
            good = not good
            time.sleep(0.5)
        before = polls
        wait_for(lambda: polls >= before + 5, "polls after the pipe filled", timeout=15)
        good = False
        wait_for(lambda: get(scrape(port), "kvwatch_up") == 0.0, "kvwatch_up 0 for the 502", timeout=15)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        _reap(proc)
        os.close(read_end)
        server.shutdown()
        server.server_close()
