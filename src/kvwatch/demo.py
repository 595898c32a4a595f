"""``kvwatch demo``: the simulator filling a KV cache while ``kvwatch serve`` watches it.

Starts two child processes, ``kvwatch simulate`` (vLLM 0.33, one engine whose load ramps into KV
saturation) and ``kvwatch serve`` polling it every 10 simulated seconds with its forecast clock at the
simulator's speed, prints both URLs, then a status line every few seconds read from kvwatch's own
``/metrics``. Ctrl-C or SIGTERM stops both children.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import IO

from kvwatch.exposition import ParseError, parse
from kvwatch.forecast.risk import RiskParams
from kvwatch.settings import (
    MAX_INTERVAL_SECONDS,
    MAX_POLL_STEP_SECONDS,
    MIN_INTERVAL_SECONDS,
    ServeSettings,
    SettingsError,
)
from kvwatch.sim.cli import ClockSpeed, check, check_number
from kvwatch.sim.engines_wire import ENGINES
from kvwatch.stop_signals import StopSignals

DEFAULT_SPEED = 30.0
# The load: one engine of 16,384 blocks (262k tokens, ~250 requests in flight at saturation, so usage is
# smooth enough for a trend), requests of 600 + 600 tokens on average, arrivals ramping from 4/s to 14/s
# over the simulated hour. The step-time model is a fast GPU's (25 ms per step, cheap tokens) so the KV
# cache, not compute, is what saturates, and usage grows about linearly with the arrival rate.
# Replayed headlessly through kvwatch's own pipeline (tests/test_demo.py), the forecaster leaves warm-up at
# ~31 simulated minutes, says `filling` from ~33 (ETA 10-25 min) and `bottleneck` from ~51-53.
SIMULATOR_FLAGS = ("--vllm-version", "0.33", "--profile", "ramp", "--rate", "4", "--rate-end", "14",
                   "--period-seconds", "3600", "--num-gpu-blocks", "16384", "--max-num-seqs", "512",
                   "--prompt-tokens", "600", "--output-tokens", "600", "--max-model-len", "8192",
                   "--step-fixed-ms", "25", "--step-decode-token-ms", "0.02", "--step-prefill-token-ms", "0.01")
POLL_SIMULATED_SECONDS = 10.0  # kvwatch's forecaster works on evenly spaced samples; 10 s is a fine grain
# kvwatch polls every POLL_SIMULATED_SECONDS / speed real seconds (serve's interval is at least 0.01 s), each poll
# within 0.8 of it, and the saturated simulator's page waits for its catch-up of simulated time: on an idle 2-core
# machine (2026-12-07) x100 timed out every poll once the cache saturated, and x1000 every poll from the start, while
# x60 ran into `bottleneck` with a few timed-out polls (the status line names them).
MAX_DEMO_SPEED = 60.0
STALE_AFTER_MIN_SECONDS = 2.0  # real seconds: a busy laptop may delay a poll; do not call that stale
FORECAST_READY_SIM_SECONDS = 31 * 60.0  # 15 min warm-up, then 15 one-minute buckets of history
FILLING_SIM_SECONDS = 33 * 60.0
SATURATION_SIM_SECONDS = 51 * 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    # One name per idea: serve's setting is --clock-speed (KVWATCH_CLOCK_SPEED, Helm config.clockSpeed).
    parser.add_argument("--clock-speed", "--speed", dest="speed", type=float, default=DEFAULT_SPEED, action=ClockSpeed,
                        help="simulated seconds per wall-clock second (the simulator's and kvwatch's clocks; "
                             f"at most {MAX_DEMO_SPEED:g}); --speed is a deprecated alias")
    parser.add_argument("--sim-port", type=int, default=8000, help="simulator /metrics port (0: a free one)")
    parser.add_argument("--port", type=int, default=ServeSettings.model_fields["port"].default,
                        help="kvwatch /metrics port (0: a free one)")
    # "%(default).0s" prints nothing: it only stops the formatter from appending "(default: None)".
    parser.add_argument("--poll-interval-seconds", type=float, default=None,
                        help=f"kvwatch poll interval in real seconds (default: {POLL_SIMULATED_SECONDS:g} simulated "
                             "seconds, i.e. %(default).0s" f"{POLL_SIMULATED_SECONDS:g} / --clock-speed)")
    parser.add_argument("--status-interval-seconds", type=float, default=3.0, help="seconds between status lines")
    parser.add_argument("--duration-seconds", type=float, default=None, help="stop after this many wall seconds")
    parser.add_argument("--seed", type=int, default=0, help="simulator seed")
    parser.add_argument("--engine", choices=ENGINES, default="vllm",
                        help="whose /metrics names the simulator speaks (kvwatch detects it; the load is the same)")


def simulator_argv(speed: float, port: int, seed: int = 0, engine: str = "vllm") -> list[str]:
    """``kvwatch simulate`` arguments of the demo (after the subcommand)."""
    return [*SIMULATOR_FLAGS, "--listen-address", "127.0.0.1", "--port", str(port), "--clock-speed", str(speed),
            "--seed", str(seed), "--engine", engine]


def serve_argv(target_url: str, port: int, speed: float, poll_interval_seconds: float | None = None) -> list[str]:
    """``kvwatch serve`` arguments of the demo (after the subcommand): its clock runs at the simulator's speed."""
    poll = poll_interval_seconds if poll_interval_seconds is not None else POLL_SIMULATED_SECONDS / speed
    stale = max(3.0 * poll, STALE_AFTER_MIN_SECONDS)
    return ["--target-url", target_url, "--listen-address", "127.0.0.1", "--port", str(port),
            "--poll-interval-seconds", str(poll), "--stale-after-seconds", str(stale),
            "--clock-speed", str(speed), "--log-level", "WARNING"]


def intro(speed: float, sim_url: str, kvwatch_url: str, engine: str = "vllm") -> list[str]:
    """The lines printed before the status lines: what runs, where, and that the clock is accelerated."""

    def wall(sim_seconds: float) -> str:
        return f"~{sim_seconds / speed:.0f} s"

    return [
        f"kvwatch demo: the clock is accelerated x{speed:g} (1 wall second = {speed:g} simulated seconds); "
        "lines start [wall seconds | simulated minutes], ETAs are simulated minutes",
        f"simulated {'vLLM 0.33' if engine == 'vllm' else engine}: {sim_url}",
        f"kvwatch:             {kvwatch_url}",
        "load: 4 -> 14 requests/s over the simulated hour into a 262k-token KV cache; Ctrl-C stops both",
        f"expect: the forecast after warm-up at sim {FORECAST_READY_SIM_SECONDS / 60:.0f} min "
        f"({wall(FORECAST_READY_SIM_SECONDS)}), 'filling' with an ETA from ~{FILLING_SIM_SECONDS / 60:.0f} min "
        f"({wall(FILLING_SIM_SECONDS)}), bottleneck at ~{SATURATION_SIM_SECONDS / 60:.0f} min "
        f"({wall(SATURATION_SIM_SECONDS)})",
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # its own loopback ports: never a proxy


def _fetch(url: str, timeout: float = 2.0) -> str | None:
    try:
        with _DIRECT.open(url, timeout=timeout) as response:
            return response.read().decode()
    except (OSError, ValueError):
        return None


def status_line(text: str, elapsed: float, speed: float = 1.0, sim_seconds: float | None = None,
                now: float | None = None) -> str:
    """One line from kvwatch's /metrics: usage, queue, and the forecast and advice once they exist (pure).

    ``elapsed`` is wall seconds since the start; ``sim_seconds`` the simulator's clock (default: ``elapsed``
    times ``speed``). ETAs are read from kvwatch, whose clock runs at the simulator's speed, so they are
    simulated minutes already. ``now`` (Unix time) dates kvwatch's last good poll when the latest one failed.
    """
    simulated = elapsed * speed if sim_seconds is None else sim_seconds
    stamp = f"[{elapsed:4.0f}s | sim {simulated / 60:5.1f} min]"
    try:
        exp = parse(text)
    except ParseError as exc:
        return f"{stamp} kvwatch /metrics unreadable: {exc}"

    def values(name: str, **labels: str) -> list[float]:
        return [s.value for s in exp.samples(name) if not math.isnan(s.value)
                and all(s.labels.get(k) == v for k, v in labels.items())]

    def total(name: str) -> float | None:
        found = values(name)
        return sum(found) if found else None

    def worst(name: str, **labels: str) -> float | None:
        found = values(name, **labels)
        return max(found) if found else None

    failed = ""
    if not total("kvwatch_up"):
        last = worst("kvwatch_last_success_timestamp_seconds")
        if last is None:
            return f"{stamp} waiting for the first good poll of the simulator"
        # An overloaded simulator can miss the demo's short poll timeout: not the same as never having answered.
        ago = "" if now is None else f", the last good one {max(0.0, now - last):.0f} s ago"
        failed = f"the simulator did not answer kvwatch's last poll{ago} (kvwatch's log says why)"
        if not values("kvwatch_kv_usage_ratio"):  # (stale: kvwatch withdrew the figures)
            return f"{stamp} {failed}"
    parts = [stamp]
    usage = worst("kvwatch_kv_usage_ratio")
    parts.append("usage " + ("  n/a" if usage is None else f"{usage:5.1%}"))
    for label, name in (("running", "kvwatch_requests_running"), ("waiting", "kvwatch_requests_waiting")):
        value = total(name)
        parts.append(f"{label} {'n/a' if value is None else f'{value:4.0f}'}")
    preempt = total("kvwatch_preemptions_per_second")
    if preempt:
        parts.append(f"preemptions/s {preempt:.2f}")
    states = sorted({s.labels.get("state", "?") for s in exp.samples("kvwatch_state") if s.value >= 1})
    if states:
        parts.append("state " + ",".join(states))
    eta = values("kvwatch_kv_exhaustion_eta_seconds")
    if eta:
        soonest = min(eta)
        # +Inf before the forecaster is warm (no risk exported yet, whatever state shows) is no forecast, not a
        # calm hour ahead
        warm = bool(exp.samples("kvwatch_kv_saturation_risk"))
        hours = RiskParams().max_horizon_buckets * RiskParams().bucket_seconds / 3600  # (the ETA's horizon)
        parts.append("ETA " + ((f"none within {hours:g} h" if warm else "not yet (warming up)")
                               if math.isinf(soonest) else "now" if soonest <= 0 else f"{soonest / 60:.1f} min"))
    elif "warming_up" in states:
        parts.append("ETA not yet (warming up)")  # (absent while a busy cache's forecaster warms up: unknown)
    forecast = worst("kvwatch_kv_usage_forecast_ratio", horizon="30m")
    if forecast is not None:
        parts.append(f"demand in 30 min {forecast:4.0%}")  # (of the cache: past 100 % where it outgrows it)
    # Each fix has a rank (1 = cheapest first) while filling or in bottleneck, else 0: show the first.
    advice = sorted((s for s in exp.samples("kvwatch_recommendation") if s.value >= 1), key=lambda s: s.value)
    if advice:
        action = advice[0].labels.get("action", "?")
        limit = worst("kvwatch_recommended_max_concurrency")
        parts.append(f"fix: limit concurrency to {limit:.0f}" if action == "limit_concurrency" and limit else
                     "fix: " + action.replace("_", " "))
    if failed:  # (the last good poll's figures, still fresh: one missed poll hid a bottleneck's whole line)
        parts.append(failed)
    return " | ".join([" ".join(parts[:2]), *parts[2:]])


class SimulatorClock:
    """The simulator's clock as the demo can read it: ``kvwatch simulate`` starts its clock, then prints
    ``serving http://...`` on stdout, so simulated time is ``(now - when that line came) * speed``.

    A daemon thread reads (and keeps draining) the child's stdout; until the line comes, ``seconds`` is None.
    """

    def __init__(self, stream: IO[str], speed: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.speed = speed
        self._clock = clock
        self._origin: float | None = None
        self.reader = threading.Thread(target=self._read, args=(stream,), name="kvwatch-demo-sim-stdout", daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            if self._origin is None and line.startswith("serving "):
                self._origin = self._clock()

    def seconds(self) -> float | None:
        origin = self._origin
        return None if origin is None else (self._clock() - origin) * self.speed


STOP_GRACE_SECONDS = 5.0


def _stop(processes: Sequence[subprocess.Popen], grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM every child, wait up to ``grace`` seconds, SIGKILL what is left, and always reap them all.

    Another Ctrl-C while waiting cuts the grace short (the children are killed at once); none can
    interrupt the kill and the reaping, so no child outlives the demo or stays a zombie.
    """
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    try:
        for proc in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: stop waiting, kill now
    finally:
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
        try:
            for proc in processes:
                if proc.poll() is None:
                    proc.kill()
            for proc in processes:
                proc.wait()  # SIGKILL cannot be ignored: this returns at once
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)


def check_flags(args: argparse.Namespace) -> None:
    """SettingsError naming the first bad flag; times and the speed must be finite (``inf`` would hang)."""
    check_number(args.speed, "--clock-speed", 0, MAX_DEMO_SPEED, low_open=True)
    for flag, value, most in (("--poll-interval-seconds", args.poll_interval_seconds, MAX_POLL_STEP_SECONDS),
                              ("--status-interval-seconds", args.status_interval_seconds, MAX_INTERVAL_SECONDS)):
        if value is not None:
            check_number(value, flag, MIN_INTERVAL_SECONDS, most)
    if args.duration_seconds is not None:
        check_number(args.duration_seconds, "--duration-seconds", 0, 1e9, low_open=True)
    for flag, port in (("--sim-port", args.sim_port), ("--port", args.port)):
        check(0 <= port <= 65535, flag, "must be 0..65535", port)
    check(not args.port or args.port != args.sim_port, "--port", "must be another port than --sim-port", args.port)
    if args.poll_interval_seconds is None:
        # kvwatch polls every 10 simulated seconds, --poll-interval-seconds = 10 / speed, which must be at most
        # serve's longest interval: a slower clock failed in serve, naming a flag the user never passed.
        slowest = POLL_SIMULATED_SECONDS / MAX_POLL_STEP_SECONDS
        check(args.speed >= slowest, "--clock-speed", f"must be at least {slowest:.4g} (kvwatch polls every "
              f"{POLL_SIMULATED_SECONDS:g} simulated seconds, at most every {MAX_POLL_STEP_SECONDS:g} s), or pass "
              "--poll-interval-seconds", args.speed)
    else:  # (serve's own check, said here with the demo's flags)
        step = args.poll_interval_seconds * args.speed
        check(step <= MAX_POLL_STEP_SECONDS, "--poll-interval-seconds", f"times --clock-speed ({args.speed:g}) is "
              f"{step:g} s of the poll clock: at most {MAX_POLL_STEP_SECONDS:g}", args.poll_interval_seconds)


def _check_free(flag: str, port: int) -> None:
    """SettingsError naming ``flag`` when its port is taken on 127.0.0.1: the child said so only after the URLs were
    printed and the other had started (a taken --sim-port read as kvwatch's target answering 404)."""
    if not port:
        return
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as the servers bind: a closing socket is no owner)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise SettingsError(f"invalid value {port} for {flag}: 127.0.0.1:{port} is in use ({exc.strerror}); pass "
                                f"{flag} 0 for a free port (make demo DEMO_ARGS='{flag} 0')") from None


def _check_serve(argv: list[str]) -> None:
    """SettingsError as ``kvwatch serve`` with ``argv`` would stop (the demo passes it its environment): a bad
    KVWATCH_* variable was said by serve after the simulator had started, in three lines, exit 1."""
    from kvwatch.serve.app import add_arguments, checked_settings
    from kvwatch.settings import name_variables

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = checked_settings(args)
    except SettingsError as exc:
        # Which values came from variables, told by serve's own arguments: told by the demo's, a flag the demo
        # passes (--target-url, its poll interval) was said to come from a variable the demo had overridden.
        own = ", ".join(a for a in argv if a.startswith("--"))
        refused = SettingsError(f"the kvwatch serve it starts (with this environment and its own {own}) refuses: "
                                f"{name_variables(str(exc), args)}")
        refused.sources_named = True
        raise refused from None
    if settings.web_config_file is not None:
        from kvwatch.serve.web import load_web_config

        web = load_web_config(settings.web_config_file)
        if web.tls is not None or web.users:  # (every status line read "starting kvwatch", then exit 0)
            raise SettingsError(f"KVWATCH_WEB_CONFIG_FILE={settings.web_config_file} puts TLS or a password on the "
                                "kvwatch serve the demo starts, whose /metrics the demo reads over plain HTTP: "
                                "unset it for the demo")


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    _check_free("--sim-port", args.sim_port)
    _check_free("--port", args.port)
    sim_port = args.sim_port or _free_port()
    port = args.port or _free_port()
    sim_url = f"http://127.0.0.1:{sim_port}/metrics"
    kvwatch_url = f"http://127.0.0.1:{port}/metrics"
    _check_serve(serve_argv(sim_url, port, args.speed, args.poll_interval_seconds))
    py = sys.executable
    # (Ctrl-C: KeyboardInterrupt, below; SIGHUP: the terminal closed, which left both children holding the ports)
    stop = StopSignals((signal.SIGTERM, signal.SIGHUP)).install()
    processes: list[subprocess.Popen] = []
    die_with_demo = _parent_death_signal()
    try:
        # (both started before the clock's reader thread: a preexec_fn is safe only while no other thread runs)
        simulator = subprocess.Popen([py, "-m", "kvwatch", "simulate", *simulator_argv(args.speed, sim_port,
                                                                                     args.seed, args.engine)],
                                     stdout=subprocess.PIPE, text=True, preexec_fn=die_with_demo)
        processes.append(simulator)
        processes.append(subprocess.Popen([py, "-m", "kvwatch", "serve", *serve_argv(
            sim_url, port, args.speed, args.poll_interval_seconds)], preexec_fn=die_with_demo))
        assert simulator.stdout is not None
        sim_clock = SimulatorClock(simulator.stdout, args.speed)
        print("\n".join(intro(args.speed, sim_url, kvwatch_url, args.engine)), flush=True)
        started = time.monotonic()
        while stop.received is None:
            elapsed = time.monotonic() - started
            if _exited(processes):
                return 1
            if args.duration_seconds is not None and elapsed >= args.duration_seconds:
                break
            text = _fetch(kvwatch_url)
            print(status_line(text, elapsed, args.speed, sim_clock.seconds(), now=time.time()) if text is not None else
                  f"[{elapsed:4.0f}s] starting kvwatch ...", flush=True)
            wait = args.status_interval_seconds
            if args.duration_seconds is not None:
                wait = min(wait, max(0.0, args.duration_seconds - elapsed))
            stop.wait(wait)
        if _exited(processes):  # one that died during the last wait: a short run must not report success
            return 1
    except KeyboardInterrupt:
        pass
    finally:
        try:
            _stop(processes)
        finally:
            stop.restore()
    return 0


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _parent_death_signal() -> Callable[[], None] | None:
    """A child's ``preexec_fn`` that has Linux send it SIGTERM when the demo dies, however (an OOM kill, SIGKILL):
    both children outlived such a demo, holding ports 8000 and 9747, and the next ``make demo`` found them in use.
    None elsewhere (the demo stops its children on every signal it can catch)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # (looked up here: the child only calls it)

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))

    return die_with_parent


def _exited(processes: list[subprocess.Popen]) -> bool:  # type: ignore[type-arg]
    """Whether the simulator or kvwatch has exited on its own (said on stderr)."""
    # A child names its own flags (exit 2: a bad setting); the demo's --sim-port is the simulator's --port.
    ports = {"the simulator": " (its --port is the demo's --sim-port)", "kvwatch serve": ""}
    for proc, name in zip(processes, ports, strict=True):
        if proc.poll() is not None:
            hint = ports[name] if proc.returncode == 2 else ""
            print(f"kvwatch demo: {name} exited with code {proc.returncode}{hint}", file=sys.stderr)
            return True
    return False
