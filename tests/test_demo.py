"""``kvwatch demo``: the scenario shows ``filling`` with an ETA well before the bottleneck, and the real
processes start, report and stop.

The scenario test runs the demo's own simulator and serve arguments through the real code of both
processes, without HTTP or wall-clock waits: the simulator library behind ``/metrics`` rendering on an
explicit clock, and kvwatch serve's ``Sidecar`` (parser, adapter, history, capacity and forecast
analyzers) polling it every 10 simulated seconds, its collector rendered to the text the demo reads.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest

from kvwatch import demo
from kvwatch.serve import app
from kvwatch.serve.collector import KvwatchCollector, make_registry
from kvwatch.settings import ServeSettings, SettingsError, load_settings
from kvwatch.sim import cli as sim_cli
from kvwatch.sim.server import SimulationService

ENV = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
EPOCH = 1_764_000_017.0  # kvwatch's clock starts at wall time, not on a minute boundary
STATE = re.compile(r"state (\w+)")
ETA_MINUTES = re.compile(r"ETA (\d+\.\d) min")


def _parse(add_arguments: Callable[[argparse.ArgumentParser], None], argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


class _Now:
    """The one explicit clock both 'processes' read, in simulated seconds since the demo started."""

    def __init__(self) -> None:
        self.sim_seconds = 0.0


class _SimulatorEndpoint:
    """What kvwatch's fetcher gets from the simulator's GET /metrics at the current simulated time."""

    last_body_bytes = 0

    def __init__(self, service: SimulationService) -> None:
        self.service = service

    def fetch(self) -> str:
        return self.service.metrics_text()


def _run_demo_scenario(until_sim_seconds: float) -> list[tuple[float, str]]:
    """(simulated seconds, status line) per kvwatch poll, until one minute into the bottleneck."""
    speed = demo.DEFAULT_SPEED
    now = _Now()
    simulator, feed, render_options = sim_cli.build(_parse(sim_cli.add_arguments, demo.simulator_argv(speed, 0)))
    service = SimulationService(simulator, feed, render_options, speed=1.0, clock=lambda: now.sim_seconds)

    settings = load_settings(ServeSettings, _parse(app.add_arguments, demo.serve_argv(
        "http://127.0.0.1:8000/metrics", 9747, speed)))
    assert settings.clock_speed == speed
    poll_sim_seconds = settings.poll_interval_seconds * settings.clock_speed
    assert poll_sim_seconds == pytest.approx(demo.POLL_SIMULATED_SECONDS)

    def kvwatch_clock() -> float:
        return EPOCH + now.sim_seconds

    analyzers = app.load_analyzers(settings)
    sidecar = app.Sidecar(settings, _SimulatorEndpoint(service), kvwatch_clock, analyzers)  # type: ignore[arg-type]
    registry = make_registry(KvwatchCollector(
        lambda: sidecar.state, now=kvwatch_clock,
        stale_after=float(settings.stale_after_seconds or 0) * settings.clock_speed, analyzers=analyzers))

    lines: list[tuple[float, str]] = []
    bottleneck_at: float | None = None
    while now.sim_seconds < until_sim_seconds:
        now.sim_seconds += poll_sim_seconds
        sidecar.poll()
        line = demo.status_line(generate_latest(registry).decode(), now.sim_seconds / speed, speed)
        lines.append((now.sim_seconds, line))
        if bottleneck_at is None and "state bottleneck" in line:
            bottleneck_at = now.sim_seconds
        if bottleneck_at is not None and now.sim_seconds >= bottleneck_at + 60:
            break
    return lines


def test_demo_scenario_warns_filling_with_an_eta_minutes_before_the_bottleneck() -> None:
    lines = _run_demo_scenario(until_sim_seconds=demo.SATURATION_SIM_SECONDS + 15 * 60)
    states = [(t, m.group(1) if (m := STATE.search(line)) else None, line) for t, line in lines]
    first = {}
    for t, state, _ in states:
        first.setdefault(state, t)
    history = "\n".join(line for _, line in lines[::6])
    assert states[0][1] == "warming_up", history
    assert "filling" in first and "bottleneck" in first, history
    assert first["filling"] + 5 * 60 <= first["bottleneck"], history  # several simulated minutes of warning
    assert not {"unknown", "stalled", "scheduler_limited"} & set(first), history
    assert all(state != "ok" for t, state, _ in states if t >= first["filling"] and t < first["bottleneck"]), \
        history  # one warning, held until the bottleneck

    filling_line = next(line for t, line in lines if t == first["filling"])
    eta = ETA_MINUTES.search(filling_line)
    assert eta is not None, filling_line
    predicted = first["filling"] + float(eta.group(1)) * 60
    assert abs(predicted - first["bottleneck"]) <= 10 * 60, (filling_line, first)  # an ETA worth reading
    assert "demand in 30 min" in filling_line and "fix: limit concurrency to" in filling_line, filling_line

    bottleneck_line = next(line for t, line in lines if t == first["bottleneck"])
    assert "ETA now" in bottleneck_line and "fix: limit concurrency to" in bottleneck_line, bottleneck_line

    # What the demo's first lines announce holds, and saturation comes within the wall-time budget.
    assert abs(first["filling"] - demo.FILLING_SIM_SECONDS) <= 5 * 60, first
    assert abs(first["bottleneck"] - demo.SATURATION_SIM_SECONDS) <= 5 * 60, first
    assert abs(first["ok"] - demo.FORECAST_READY_SIM_SECONDS) <= 3 * 60, first
    assert first["bottleneck"] / demo.DEFAULT_SPEED <= 4 * 60


def test_status_line_reads_kvwatch_metrics() -> None:
    text = "\n".join([
        "# TYPE kvwatch_up gauge", 'kvwatch_up{model_name="m",engine="0"} 1',
        "# TYPE kvwatch_kv_usage_ratio gauge", 'kvwatch_kv_usage_ratio{model_name="m",engine="0"} 0.873',
        "# TYPE kvwatch_requests_running gauge", 'kvwatch_requests_running{model_name="m",engine="0"} 41',
        "# TYPE kvwatch_requests_waiting gauge", 'kvwatch_requests_waiting{model_name="m",engine="0"} 3',
        "# TYPE kvwatch_kv_exhaustion_eta_seconds gauge",
        'kvwatch_kv_exhaustion_eta_seconds{model_name="m",engine="0"} 540',
        "# TYPE kvwatch_kv_usage_forecast_ratio gauge",
        'kvwatch_kv_usage_forecast_ratio{model_name="m",engine="0",horizon="10m"} 0.97',
        'kvwatch_kv_usage_forecast_ratio{model_name="m",engine="0",horizon="30m"} 1.234',
        "# TYPE kvwatch_state gauge", 'kvwatch_state{model_name="m",engine="0",state="filling"} 1',
        'kvwatch_state{model_name="m",engine="0",state="ok"} 0',
        "# TYPE kvwatch_recommended_max_concurrency gauge",
        'kvwatch_recommended_max_concurrency{model_name="m",engine="0"} 44',
        "# TYPE kvwatch_recommendation gauge",
        'kvwatch_recommendation{model_name="m",engine="0",action="add_tensor_parallelism"} 2',
        'kvwatch_recommendation{model_name="m",engine="0",action="limit_concurrency"} 1',
        'kvwatch_recommendation{model_name="m",engine="0",action="quantize_weights"} 0', "",
    ])
    line = demo.status_line(text, 12.0, speed=30.0)
    assert line.startswith("[  12s | sim   6.0 min]")
    assert "usage 87.3%" in line and "running   41" in line and "waiting    3" in line
    assert "ETA 9.0 min" in line and "state filling" in line and "demand in 30 min 123%" in line
    assert "fix: limit concurrency to 44" in line
    quantize_first = text.replace('action="limit_concurrency"} 1', 'action="limit_concurrency"} 3').replace(
        'action="add_tensor_parallelism"} 2', 'action="add_tensor_parallelism"} 1')
    assert "fix: add tensor parallelism" in demo.status_line(quantize_first, 12.0, 30.0)
    # +Inf is "none within 1 h" once the risk is exported; before, there is no forecast yet, whatever state shows
    # (scheduler_limited and stalled take precedence over warming_up)
    calm = text.replace("} 540", "} +Inf") + (
        '# TYPE kvwatch_kv_saturation_risk gauge\nkvwatch_kv_saturation_risk{model_name="m",engine="0",horizon="30m"} '
        '0.1\n')
    assert "ETA none within 1 h" in demo.status_line(calm, 12.0, 30.0)
    cold = text.replace("} 540", "} +Inf").replace('state="filling"} 1', 'state="scheduler_limited"} 1')
    assert "ETA not yet (warming up)" in demo.status_line(cold, 12.0, 30.0)
    # a busy cache warming up exports no ETA (unknown): still "not yet", not nothing
    warming = "".join(f"{line}\n" for line in text.splitlines() if "exhaustion_eta" not in line).replace(
        'state="filling"} 1', 'state="warming_up"} 1')
    assert "ETA not yet (warming up)" in demo.status_line(warming, 12.0, 30.0)
    assert "waiting for the first good poll" in demo.status_line(
        '# TYPE kvwatch_up gauge\nkvwatch_up{model_name="m",engine="0"} 0\n', 1.0)
    # After good polls, a failed one is not "waiting for the first" (an overloaded simulator missing the demo's
    # short poll timeout read so)
    failed = ('# TYPE kvwatch_up gauge\nkvwatch_up 0\n# TYPE kvwatch_last_success_timestamp_seconds gauge\n'
              'kvwatch_last_success_timestamp_seconds 1000.0\n')
    line = demo.status_line(failed, 126.0, 30.0, now=1012.4)
    assert "did not answer kvwatch's last poll, the last good one 12 s ago" in line and "first" not in line, line
    # while the last good poll's figures are fresh (exported), they are shown, the failed poll beside them: one
    # missed poll hid a bottleneck's whole line (every line at x100)
    fresh = text.replace('kvwatch_up{model_name="m",engine="0"} 1', 'kvwatch_up{model_name="m",engine="0"} 0') + (
        "\n# TYPE kvwatch_last_success_timestamp_seconds gauge\nkvwatch_last_success_timestamp_seconds 1000.0\n")
    line = demo.status_line(fresh, 126.0, 30.0, now=1001.0)
    assert "usage 87.3%" in line and "state filling" in line, line
    assert line.endswith("did not answer kvwatch's last poll, the last good one 1 s ago (kvwatch's log says why)")


def test_status_line_stamps_the_simulators_own_clock_when_known() -> None:
    text = '# TYPE kvwatch_up gauge\nkvwatch_up{model_name="m",engine="0"} 0\n'
    assert demo.status_line(text, 12.0, 30.0).startswith("[  12s | sim   6.0 min]")
    assert demo.status_line(text, 12.0, 30.0, sim_seconds=330.0).startswith("[  12s | sim   5.5 min]")


def test_simulator_clock_starts_when_the_simulator_says_it_serves() -> None:
    ticks = iter([100.0, 103.0, 104.0])
    clock = demo.SimulatorClock(io.StringIO("serving http://127.0.0.1:1/metrics\nmore\n"), speed=30.0,
                                clock=lambda: next(ticks))
    clock.reader.join(timeout=10)
    assert not clock.reader.is_alive()
    assert clock.seconds() == pytest.approx(3.0 * 30)
    silent = demo.SimulatorClock(io.StringIO(""), speed=30.0, clock=lambda: 0.0)
    silent.reader.join(timeout=10)
    assert silent.seconds() is None  # the caller falls back on its own elapsed time x speed


class _Child:
    """A child process that ignores SIGTERM; ``wait`` raises KeyboardInterrupt once, like a second Ctrl-C."""

    def __init__(self, interrupt: bool) -> None:
        self.calls: list[str] = []
        self.interrupt = interrupt
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.calls.append("terminate")

    def kill(self) -> None:
        self.calls.append("kill")
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        self.calls.append("wait" if timeout is None else "wait-grace")
        if self.returncode is not None:
            return self.returncode
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt
        raise subprocess.TimeoutExpired("child", timeout or 0)


def test_a_second_ctrl_c_while_stopping_kills_and_reaps_every_child() -> None:
    before = signal.getsignal(signal.SIGINT)
    children = [_Child(interrupt=True), _Child(interrupt=False)]
    demo._stop(children)  # type: ignore[arg-type]
    for child in children:
        assert child.returncode == -9 and child.calls[-2:] == ["kill", "wait"], child.calls
    assert children[1].calls == ["terminate", "kill", "wait"]  # no grace left to wait for after the interrupt
    assert signal.getsignal(signal.SIGINT) is before


def test_stop_kills_a_child_that_ignores_sigterm_after_the_grace() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        demo._stop([child], grace=0.2)
        assert child.returncode == -signal.SIGKILL  # reaped: no zombie left
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_demo_runs_both_processes_says_the_clock_is_accelerated_and_stops_them() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvwatch", "demo", "--sim-port", "0", "--port", "0", "--duration-seconds", "10",
         "--status-interval-seconds", "1"], capture_output=True, text=True, timeout=60, env=ENV)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"clock is accelerated x{demo.DEFAULT_SPEED:g}" in lines[0]
    assert re.search(r"simulated vLLM 0\.33: http://127\.0\.0\.1:\d+/metrics", lines[1]), lines[1]
    assert re.search(r"kvwatch: +http://127\.0\.0\.1:\d+/metrics", lines[2]), lines[2]
    assert "filling" in lines[4] and "bottleneck" in lines[4]
    # kvwatch polled the simulator and the status line read kvwatch's /metrics: still warming up this early.
    assert any("usage" in line and "state warming_up" in line for line in lines[5:]), result.stdout


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP])
def test_neither_child_outlives_a_demo_killed_or_hung_up(how: signal.Signals) -> None:
    # SIGKILL (an OOM kill) or SIGHUP (a closed terminal) sent to the demo alone left both children running, holding
    # ports 8000 and 9747 for the next `make demo`
    proc = subprocess.Popen([sys.executable, "-m", "kvwatch", "demo", "--sim-port", "0", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        for _ in range(5):  # the intro's lines: both children started
            proc.stdout.readline()
        children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(children) == 2
        proc.send_signal(how)
        proc.wait(timeout=20)
        deadline = time.monotonic() + 15
        while any(Path(f"/proc/{c}").exists() and "Z" not in _state(c) for c in children) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [c for c in children if Path(f"/proc/{c}").exists() and "Z" not in _state(c)], children
    finally:
        with contextlib.suppress(ProcessLookupError):  # (the group outlives the demo while a child is left)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _state(pid: int) -> str:
    """A process's state letter (Z: a zombie, which holds no port), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return ""


@pytest.mark.parametrize(("args", "flag"), [
    (["--clock-speed", "inf"], "--clock-speed"),  # once named serve's --poll-interval-seconds (10 / inf = 0)
    (["--clock-speed", "nan"], "--clock-speed"),
    (["--clock-speed", "1e9"], "--clock-speed"),
    (["--clock-speed", "2000"], "--clock-speed"),  # kvwatch would poll every 0.005 s, below serve's 0.01 s floor
    (["--clock-speed", "100"], "--clock-speed"),  # the saturated simulator missed every poll (0.08 s each)
    (["--speed", "2000"], "--clock-speed"),  # the deprecated alias is checked as the flag it stands for
    (["--poll-interval-seconds", "inf"], "--poll-interval-seconds"),
    (["--status-interval-seconds", "inf"], "--status-interval-seconds"),
    (["--status-interval-seconds", "0"], "--status-interval-seconds"),
    (["--duration-seconds", "inf"], "--duration-seconds"),
    (["--port", "70000"], "--port"),
    # serve refused the poll interval (10 / 0.0001 s), naming a flag the user never passed
    (["--clock-speed", "0.0001"], "--clock-speed"),
    (["--port", "9747", "--sim-port", "9747"], "--port"),  # "Address already in use" from a child process
])
def test_demo_flags_must_be_finite_and_in_range(args: list[str], flag: str) -> None:
    with pytest.raises(SettingsError, match=f"for {flag}: must be"):
        demo.check_flags(_parse(demo.add_arguments, args))


def test_the_slowest_demo_speed_gives_serve_a_valid_interval() -> None:
    from kvwatch.settings import MAX_POLL_STEP_SECONDS, SettingsError

    slowest = demo.POLL_SIMULATED_SECONDS / MAX_POLL_STEP_SECONDS
    demo.check_flags(_parse(demo.add_arguments, ["--clock-speed", str(slowest)]))
    argv = demo.serve_argv("http://127.0.0.1:8000/metrics", 9747, slowest)
    assert load_settings(ServeSettings, _parse(app.add_arguments, argv)).poll_interval_seconds == pytest.approx(
        MAX_POLL_STEP_SECONDS)
    with pytest.raises(SettingsError, match="--clock-speed"):
        demo.check_flags(_parse(demo.add_arguments, ["--clock-speed", str(slowest * 0.9)]))
    # With its own poll interval any speed above 0 runs, within serve's poll step (the demo says so, not serve).
    demo.check_flags(_parse(demo.add_arguments, ["--clock-speed", "0.0001", "--poll-interval-seconds", "5"]))
    with pytest.raises(SettingsError, match="--poll-interval-seconds"):
        demo.check_flags(_parse(demo.add_arguments, ["--clock-speed", "50", "--poll-interval-seconds", "5"]))


def test_the_fastest_demo_speed_gives_serve_a_valid_interval() -> None:
    argv = demo.serve_argv("http://127.0.0.1:8000/metrics", 9747, demo.MAX_DEMO_SPEED)
    settings = load_settings(ServeSettings, _parse(app.add_arguments, argv))
    assert settings.poll_interval_seconds == pytest.approx(demo.POLL_SIMULATED_SECONDS / demo.MAX_DEMO_SPEED)


def test_demo_rejects_a_bad_flag_naming_it() -> None:
    result = subprocess.run([sys.executable, "-m", "kvwatch", "demo", "--clock-speed", "0"], capture_output=True,
                            text=True, timeout=60, env=ENV)
    assert result.returncode == 2 and "--clock-speed" in result.stderr


def test_demo_and_simulate_name_the_clock_as_serve_does_and_keep_speed_as_an_alias() -> None:
    """One flag name per idea: --clock-speed everywhere (serve's setting); --speed still works, --help says
    it is deprecated."""
    assert _parse(demo.add_arguments, ["--speed", "30"]).speed == 30.0
    assert _parse(demo.add_arguments, ["--clock-speed", "30"]).speed == 30.0
    # the old name says so when it is used (it said nothing), the new one does not
    for flag, warned in (("--speed", True), ("--clock-speed", False)):
        run = subprocess.run([sys.executable, "-m", "kvwatch", "simulate", flag, "2", "--no-serve",
                              "--duration-seconds", "1"], capture_output=True, text=True, timeout=60, env=ENV)
        assert run.returncode == 0 and ("--speed is a deprecated alias: use --clock-speed" in run.stderr) == warned
    assert "--clock-speed" in demo.simulator_argv(30.0, 8000) and "--speed" not in demo.simulator_argv(30.0, 8000)
    for command in ("demo", "simulate"):
        text = subprocess.run([sys.executable, "-m", "kvwatch", command, "--help"], capture_output=True, text=True,
                              timeout=60, env=ENV).stdout
        assert "--clock-speed" in text and "--speed is a deprecated alias" in " ".join(text.split()), command


@pytest.mark.parametrize("flag", ["--sim-port", "--port"])
def test_a_demo_port_in_use_is_refused_before_anything_starts(flag: str) -> None:
    # A taken --sim-port printed both URLs and "starting kvwatch ...", kvwatch polled the other server (404), and
    # the demo ended with exit 1 and a line about the simulator's own --port.
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        other = "--port" if flag == "--sim-port" else "--sim-port"
        result = subprocess.run([sys.executable, "-m", "kvwatch", "demo", flag, str(port), other, "0",
                                 "--duration-seconds", "3"], capture_output=True, text=True, timeout=60, env=ENV)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert f"for {flag}: 127.0.0.1:{port} is in use" in result.stderr
    assert f"DEMO_ARGS='{flag} 0'" in result.stderr


@pytest.mark.parametrize(("variable", "value"), [("KVWATCH_FOO", "1"), ("KVWATCH_POLL_TIMEOUT_SECONDS", "9")])
def test_a_bad_kvwatch_variable_stops_the_demo_before_anything_starts(variable: str, value: str) -> None:
    # The demo passes its environment to serve, which said so after the simulator had started: its banner on stdout,
    # three lines on stderr and exit 1.
    result = subprocess.run([sys.executable, "-m", "kvwatch", "demo", "--sim-port", "0", "--port", "0",
                             "--duration-seconds", "3"], capture_output=True, text=True, timeout=60,
                            env={**ENV, variable: value})
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert variable in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_refused_variable_beside_a_flag_the_demo_passes_serve_is_not_said_to_have_set_it() -> None:
    # Checked in the demo's process, the message was annotated from the demo's flags: "--target-url (from
    # KVWATCH_TARGET_URL) is plain http", where the plain-http URL was the demo's own simulator's.
    import certifi

    env = {**ENV, "KVWATCH_TARGET_URL": "https://example.com/metrics", "KVWATCH_CA_FILE": certifi.where()}
    result = subprocess.run([sys.executable, "-m", "kvwatch", "demo", "--sim-port", "0", "--port", "0",
                             "--duration-seconds", "3"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert "for KVWATCH_CA_FILE: applies to an https:// target only; --target-url is plain http" in result.stderr
    assert "(from KVWATCH_TARGET_URL)" not in result.stderr and "its own --target-url" in result.stderr


def test_a_child_that_exits_is_named_and_only_a_bad_setting_gets_the_port_hint(
        capsys: pytest.CaptureFixture[str]) -> None:
    # A short run whose simulator dies must not report success; the hint about its --port only for exit 2 (a stop by
    # SIGINT reaching the simulator alone read "exited with code 0 (its --port is the demo's --sim-port)").
    for code, hinted in ((2, True), (0, False)):
        child = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
        child.wait(timeout=30)
        running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert demo._exited([child, running])
        finally:
            running.kill()
            running.wait()
        said = capsys.readouterr().err
        assert f"kvwatch demo: the simulator exited with code {code}" in said
        assert ("the demo's --sim-port" in said) is hinted


def test_a_web_config_the_demo_cannot_read_through_stops_it_before_anything_starts(tmp_path: Path) -> None:
    # The demo passes its environment to serve: with basic auth from KVWATCH_WEB_CONFIG_FILE every status line read
    # "starting kvwatch" until the end, exit 0 (the demo reads serve's /metrics over plain HTTP, no password).
    import bcrypt

    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  u: {bcrypt.hashpw(b'p', bcrypt.gensalt(rounds=4)).decode()}\n")
    result = subprocess.run([sys.executable, "-m", "kvwatch", "demo", "--sim-port", "0", "--port", "0",
                             "--duration-seconds", "3"], capture_output=True, text=True, timeout=60,
                            env={**ENV, "KVWATCH_WEB_CONFIG_FILE": str(config)})
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert "KVWATCH_WEB_CONFIG_FILE" in result.stderr and "unset it for the demo" in result.stderr
