"""``kvwatch demo``: the simulator filling a KV cache while ``kvwatch serve`` watches it.

Starts two child processes, ``kvwatch simulate`` (vLLM 0.33, a ramp that saturates the cache about two
minutes in) and ``kvwatch serve`` polling it with its forecast clock at the simulator's speed, prints both
URLs, then a status line every few seconds read from kvwatch's own ``/metrics``. Ctrl-C or SIGTERM stops
both children.
"""

from __future__ import annotations

import argparse
import math
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence

from kvwatch.exposition import ParseError, parse
from kvwatch.settings import SettingsError

# The load: 0.5 -> 12 requests/s over 4500 simulated seconds into 4096 blocks (65k tokens). Saturation comes
# at about 3300 s, i.e. ~2 min of wall time at the default speed of 25.
SIMULATOR_FLAGS = ("--vllm-version", "0.33", "--profile", "ramp", "--rate", "0.5", "--rate-end", "12",
                   "--period-seconds", "4500", "--num-gpu-blocks", "4096", "--prompt-tokens", "800",
                   "--output-tokens", "250", "--max-model-len", "8192")
SATURATION_SIM_SECONDS = 3300.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("--speed", type=float, default=25.0, help="simulated seconds per wall-clock second")
    parser.add_argument("--sim-port", type=int, default=8000, help="simulator /metrics port (0: a free one)")
    parser.add_argument("--port", type=int, default=9747, help="kvwatch /metrics port (0: a free one)")
    parser.add_argument("--poll-interval-seconds", type=float, default=1.0, help="kvwatch poll interval (real s)")
    parser.add_argument("--status-interval-seconds", type=float, default=3.0, help="seconds between status lines")
    parser.add_argument("--duration-seconds", type=float, default=None, help="stop after this many wall seconds")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fetch(url: str, timeout: float = 2.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read().decode()
    except (OSError, ValueError):
        return None


def status_line(text: str, elapsed: float) -> str:
    """One line from kvwatch's /metrics: usage, queue, and the forecast once it exists (pure)."""
    try:
        exp = parse(text)
    except ParseError as exc:
        return f"[{elapsed:5.0f}s] kvwatch /metrics unreadable: {exc}"

    def total(name: str) -> float | None:
        values = [s.value for s in exp.samples(name) if not math.isnan(s.value)]
        return sum(values) if values else None

    def worst(name: str) -> float | None:
        values = [s.value for s in exp.samples(name) if not math.isnan(s.value)]
        return max(values) if values else None

    parts = [f"[{elapsed:5.0f}s]"]
    up = total("kvwatch_up")
    if not up:
        parts.append("waiting for the first good poll of the simulator")
        return " ".join(parts)
    usage = worst("kvwatch_kv_usage_ratio")
    parts.append("usage " + ("  n/a" if usage is None else f"{usage:5.1%}"))
    for label, name in (("running", "kvwatch_requests_running"), ("waiting", "kvwatch_requests_waiting")):
        value = total(name)
        parts.append(f"{label} {'n/a' if value is None else f'{value:4.0f}'}")
    preempt = total("kvwatch_preemptions_per_second")
    if preempt:
        parts.append(f"preemptions/s {preempt:.2f}")
    eta = [s.value for s in exp.samples("kvwatch_kv_exhaustion_eta_seconds")]
    if eta:
        soonest = min(eta)
        parts.append("ETA " + ("not filling" if math.isinf(soonest) else f"{soonest / 60:.1f} min"))
    states = sorted({s.labels.get("state", "?") for s in exp.samples("kvwatch_state") if s.value >= 1})
    if states:
        parts.append("state " + ",".join(states))
    # Each fix has a rank (1 = cheapest first) while filling or in bottleneck, else 0: show the first.
    advice = sorted((s for s in exp.samples("kvwatch_recommendation") if s.value >= 1), key=lambda s: s.value)
    if advice:
        labels = advice[0].labels
        parts.append("advice " + next((labels[k] for k in ("action", "recommendation", "kind") if k in labels),
                                      ",".join(f"{k}={v}" for k, v in sorted(labels.items()))))
    return " | ".join([" ".join(parts[:2]), *parts[2:]])


def _stop(processes: Sequence[subprocess.Popen]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 5.0
    for proc in processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(args: argparse.Namespace) -> int:
    for flag, value, ok in (("--speed", args.speed, args.speed > 0),
                            ("--poll-interval-seconds", args.poll_interval_seconds, args.poll_interval_seconds > 0),
                            ("--status-interval-seconds", args.status_interval_seconds,
                             args.status_interval_seconds > 0),
                            ("--duration-seconds", args.duration_seconds,
                             args.duration_seconds is None or args.duration_seconds > 0),
                            ("--sim-port", args.sim_port, 0 <= args.sim_port <= 65535),
                            ("--port", args.port, 0 <= args.port <= 65535)):
        if not ok:
            raise SettingsError(f"invalid value {value!r} for {flag}")
    sim_port = args.sim_port or _free_port()
    port = args.port or _free_port()
    sim_url = f"http://127.0.0.1:{sim_port}/metrics"
    kvwatch_url = f"http://127.0.0.1:{port}/metrics"
    py = sys.executable
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    processes: list[subprocess.Popen] = []
    try:
        processes.append(subprocess.Popen(
            [py, "-m", "kvwatch", "simulate", *SIMULATOR_FLAGS, "--port", str(sim_port), "--speed", str(args.speed),
             "--seed", str(args.seed)], stdout=subprocess.DEVNULL))
        processes.append(subprocess.Popen(
            [py, "-m", "kvwatch", "serve", "--target-url", sim_url, "--listen-address", "127.0.0.1",
             "--port", str(port), "--poll-interval-seconds", str(args.poll_interval_seconds),
             "--clock-speed", str(args.speed), "--log-level", "WARNING"]))
        print(f"simulated vLLM 0.33 (x{args.speed:g} real time): {sim_url}")
        print(f"kvwatch:                          {kvwatch_url}")
        print(f"load rises into KV saturation about {SATURATION_SIM_SECONDS / args.speed:.0f} s in; Ctrl-C stops both",
              flush=True)
        started = time.monotonic()
        while not stop.is_set():
            elapsed = time.monotonic() - started
            if args.duration_seconds is not None and elapsed >= args.duration_seconds:
                break
            for proc, name in zip(processes, ("simulator", "kvwatch"), strict=True):
                if proc.poll() is not None:
                    print(f"kvwatch demo: the {name} exited with code {proc.returncode}", file=sys.stderr)
                    return 1
            text = _fetch(kvwatch_url)
            print(status_line(text, elapsed) if text is not None else f"[{elapsed:5.0f}s] starting kvwatch ...",
                  flush=True)
            wait = args.status_interval_seconds
            if args.duration_seconds is not None:
                wait = min(wait, max(0.0, args.duration_seconds - elapsed))
            stop.wait(wait)
    except KeyboardInterrupt:
        pass
    finally:
        _stop(processes)
        signal.signal(signal.SIGTERM, previous)
    return 0
