"""Processes and endpoints for end-to-end tests on loopback: free ports, a subprocess wrapper that always
stops what it started (by its own PID), a webhook receiver, Prometheus and Alertmanager configs, and small
HTTP helpers. Nothing here binds anything but 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A port free right now on loopback (the OS picks it; the caller binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found on PATH: run `make tools` (Debian's prometheus packages)")
    return path


class Process:
    """One child process with its output in a log file; ``stop()`` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=timeout)
        self._log.close()

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def get_json(url: str, timeout: float = 5.0) -> Any:
    return json.loads(http_get(url, timeout))


def wait_until_ready(url: str, process: Process, timeout: float) -> None:
    """Poll ``url`` until it answers 200; fail early if ``process`` died."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited with {process.popen.returncode}:\n{process.tail()}")
        try:
            http_get(url, timeout=2.0)
            return
        except OSError as exc:
            last_error = exc
            time.sleep(0.2)
    raise RuntimeError(f"{process.name} not ready at {url} after {timeout:.0f}s ({last_error}):\n{process.tail()}")


def prometheus_query(base_url: str, promql: str) -> list[dict[str, Any]]:
    answer = get_json(f"{base_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    if answer.get("status") != "success":
        raise RuntimeError(f"query {promql!r} failed: {answer}")
    return answer["data"]["result"]


def prometheus_samples(base_url: str, selector: str, window: str = "15m") -> list[tuple[float, float]]:
    """The raw samples of one series (``selector[window]``) as (unix time, value), oldest first."""
    result = prometheus_query(base_url, f"{selector}[{window}]")
    if len(result) != 1:
        raise RuntimeError(f"{selector!r} selects {len(result)} series, not one: {[r['metric'] for r in result]}")
    return [(float(t), float(v)) for t, v in result[0]["values"]]


@dataclass
class Notification:
    received: float  # time.monotonic() when the webhook got it
    wall: float  # time.time() then: comparable with Prometheus' sample timestamps
    status: str  # "firing" or "resolved"
    labels: dict[str, str]
    annotations: dict[str, str]


@dataclass
class WebhookReceiver:
    """Alertmanager's webhook target: records every alert of every POST, with its arrival time."""

    notifications: list[Notification] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                now, wall = time.monotonic(), time.time()
                payload = json.loads(body or b"{}")
                with receiver._lock:
                    for alert in payload.get("alerts", []):
                        receiver.notifications.append(Notification(
                            now, wall, alert.get("status", ""), alert.get("labels", {}), alert.get("annotations", {})))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.url = f"http://{LOOPBACK}:{self._server.server_address[1]}/alerts"
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)
        self._thread.start()

    def first(self, alertname: str, status: str = "firing") -> Notification | None:
        with self._lock:
            return next((n for n in self.notifications
                         if n.labels.get("alertname") == alertname and n.status == status), None)

    def of(self, alertname: str) -> list[Notification]:
        """Every notification about ``alertname``, in arrival order."""
        with self._lock:
            return [n for n in self.notifications if n.labels.get("alertname") == alertname]

    def names(self) -> list[str]:
        with self._lock:
            return [f"{n.labels.get('alertname')}:{n.status}" for n in self.notifications]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def alertmanager_config(webhook_url: str) -> str:
    """Route every alert, each in its own group, to the webhook as soon as Alertmanager has it."""
    return yaml.safe_dump({
        "route": {
            "receiver": "webhook",
            "group_by": ["..."],  # every label set is its own group: one notification per alert
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }, sort_keys=False)


def prometheus_config(rule_file: Path, kvwatch_port: int, alertmanager_port: int,
                      target_labels: dict[str, str]) -> str:
    """Scrape kvwatch every second and evaluate the rules every second (real-time ``for:`` still applies)."""
    return yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(rule_file)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{LOOPBACK}:{alertmanager_port}"]}]}]},
        "scrape_configs": [{
            "job_name": "kvwatch",
            "static_configs": [{"targets": [f"{LOOPBACK}:{kvwatch_port}"], "labels": target_labels}],
        }],
    }, sort_keys=False)
