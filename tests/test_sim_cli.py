"""``kvwatch simulate`` headless and over HTTP, as real processes (``kvwatch demo``: tests/test_demo.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.cli import main
from kvwatch.settings import SettingsError
from kvwatch.sim import cli as sim_cli
from kvwatch.sim.metrics import render
from kvwatch.sim.traces import load_trace, packaged_trace

ENV = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}


def _kvwatch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvwatch", *args], capture_output=True, text=True, timeout=timeout,
                          env=ENV)


def test_headless_json_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--no-serve", "--duration-seconds", "300", "--json", "--profile", "step", "--rate", "1",
                 "--rate-end", "12", "--period-seconds", "100", "--num-gpu-blocks", "800", "--seed", "3"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    for key in ("requests_completed", "preemptions", "kv_usage_mean", "kv_usage_max", "simulated_seconds",
                "wall_seconds"):
        assert key in summary
    assert summary["simulated_seconds"] == 300.0
    assert 0 < summary["kv_usage_mean"] <= summary["kv_usage_max"] <= 1.0
    assert summary["preemptions"] > 0 and summary["requests_completed"] > 100
    again = main(["simulate", "--no-serve", "--duration-seconds", "300", "--json", "--profile", "step", "--rate", "1",
                  "--rate-end", "12", "--period-seconds", "100", "--num-gpu-blocks", "800", "--seed", "3"])
    assert again == 0
    second = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in second.items() if "wall" not in k and k != "speedup"} == \
        {k: v for k, v in summary.items() if "wall" not in k and k != "speedup"}


def test_headless_trace_replay_with_rate_scale(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(packaged_trace("mooncake_conversation_sample.jsonl"))
    code = main(["simulate", "--no-serve", "--json", "--duration-seconds", "240", "--trace", trace, "--rate-scale",
                 "0.5", "--enable-prefix-caching", "--num-gpu-blocks", "20000", "--max-model-len", "131072"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests_submitted"] > 0 and summary["requests_completed"] > 0


def test_a_packaged_trace_is_named_by_its_file_name_as_backtest_names_it(tmp_path, monkeypatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # The README's backtest line names a sample; simulate said "No such file or directory" for the same name
    monkeypatch.chdir(tmp_path)
    code = main(["simulate", "--no-serve", "--json", "--duration-seconds", "60", "--trace", "azure_conv_sample.csv"])
    assert code == 0 and json.loads(capsys.readouterr().out)["requests_submitted"] > 0


@pytest.mark.parametrize(("args", "flag"), [
    (["--num-gpu-blocks", "1"], "--num-gpu-blocks"),
    (["--clock-speed", "0"], "--clock-speed"),
    (["--speed", "0"], "--clock-speed"),  # the deprecated alias still works, and is checked
    (["--max-model-len", "100000"], "--max-model-len"),
    (["--vllm-version", "v0", "--data-parallel-size", "2"], "--data-parallel-size"),
    (["--trace", "/nonexistent.csv"], "--trace"),
    (["--rate-scale", "5"], "--rate-scale"),  # without --trace it was silently ignored
    (["--block-size", "7"], "--block-size"),  # (vLLM's sizes only, as serve and plan take)
    (["--listen-address", " "], "--listen-address"),  # an empty one listened on every interface
    (["--listen-address", "a b"], "--listen-address"),  # (serve's own check)
    (["--restart-at-seconds", "5,30"], "--restart-at-seconds"),  # after the run's end: taken, and never restarted
])
def test_bad_flags_exit_2_naming_the_flag(args: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--no-serve", "--duration-seconds", "10", *args]) == 2
    assert flag in capsys.readouterr().err


def _build(*argv: str, warn=None):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    return sim_cli.build(parser.parse_args(list(argv)), warn=warn)


@pytest.mark.parametrize(("args", "flag"), [
    # Each of these passed plain comparisons and then hung (infinite arrival rate, infinite clock, steps that never
    # end) or crashed (OverflowError in the lognormal draw, ValueError from scale_rate).
    (["--rate", "inf"], "--rate"),
    (["--rate", "nan"], "--rate"),
    (["--profile", "ramp", "--rate-end", "inf"], "--rate-end"),
    (["--no-serve", "--duration-seconds", "inf"], "--duration-seconds"),
    (["--prompt-tokens", "inf"], "--prompt-tokens"),
    (["--output-tokens", "1e308"], "--output-tokens"),
    (["--prompt-tokens", "9000"], "--prompt-tokens"),  # a mean above --max-model-len
    (["--clock-speed", "inf"], "--clock-speed"),
    (["--clock-speed", "1e6"], "--clock-speed"),
    (["--step-fixed-ms", "inf"], "--step-fixed-ms"),
    (["--step-decode-token-ms", "nan"], "--step-decode-token-ms"),
    (["--step-prefill-token-ms=-inf"], "--step-prefill-token-ms"),
    (["--profile", "ramp", "--period-seconds", "inf"], "--period-seconds"),
    (["--profile", "bursty", "--period-seconds", "1e-300"], "--period-seconds"),
    (["--data-parallel-size", "100000"], "--data-parallel-size"),
    (["--max-model-len", "200000000", "--num-gpu-blocks", "20000000"], "--max-model-len"),
])
def test_non_finite_and_out_of_range_numbers_are_flag_errors(args: list[str], flag: str) -> None:
    with pytest.raises(SettingsError, match=f"for {flag}: must be"):
        _build(*args)


@pytest.mark.parametrize("args", [["--rate", "1", "--rate-end", "20"], ["--period-seconds", "300"]])
def test_a_profiles_shape_without_a_profile_is_a_flag_error(args: list[str]) -> None:
    # The constant profile took them and changed nothing but the random draws: --rate 1 --rate-end 20 ran flat at 1.
    with pytest.raises(SettingsError, match=f"for {args[-2]}: shapes a profile: add --profile ramp"):
        _build(*args)
    assert main(["simulate", "--no-serve", "--duration-seconds", "10", *args]) == 2
    assert _build("--profile", "ramp", *args) is not None


@pytest.mark.parametrize(("args", "flag"), [(["--profile", "ramp"], "--profile"), (["--rate", "3"], "--rate"),
                                             (["--rate-end", "50"], "--rate-end"),
                                             (["--period-seconds", "10"], "--period-seconds")])
def test_the_synthetic_loads_flags_beside_a_trace_are_flag_errors(args: list[str], flag: str) -> None:
    # The trace gives the arrivals: --profile ramp --rate-end 50 --period-seconds 10 ran the trace unchanged, exit 0.
    trace = str(packaged_trace("azure_conv_sample.csv"))
    with pytest.raises(SettingsError, match=f"for {flag}: shapes the synthetic load, which --trace replaces"):
        _build("--trace", trace, *args)
    assert _build("--trace", trace, "--rate-scale", "2") is not None


def test_infinite_rate_scale_is_a_flag_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(packaged_trace("azure_conv_sample.csv"))
    for value in ("inf", "nan", "5000"):
        with pytest.raises(SettingsError, match="for --rate-scale"):
            _build("--trace", trace, "--rate-scale", value)
    assert main(["simulate", "--no-serve", "--duration-seconds", "10", "--trace", trace, "--rate-scale", "inf"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rate-scale" in err and "Traceback" not in err


def test_restart_times_must_be_finite(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--no-serve", "--duration-seconds", "10", "--restart-at-seconds", "100,inf"])
    assert exit_info.value.code == 2 and "--restart-at-seconds" in capsys.readouterr().err


def test_a_cache_too_small_for_one_request_names_both_flags_and_the_way_out(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--no-serve", "--duration-seconds", "10", "--num-gpu-blocks", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "--num-gpu-blocks 100 (99 usable blocks x 16 tokens = 1584 tokens) cannot hold one request of " \
           "--max-model-len 8192 (512 blocks)" in err
    assert "lower --max-model-len to <= 1584 or raise --num-gpu-blocks to >= 513" in err
    # The advice is right: either way out starts.
    _build("--num-gpu-blocks", "100", "--max-model-len", "1584")
    _build("--num-gpu-blocks", "513")
    with pytest.raises(SettingsError):
        _build("--num-gpu-blocks", "100", "--max-model-len", "1585")


def test_trace_requests_longer_than_max_model_len_are_announced(capsys: pytest.CaptureFixture[str]) -> None:
    trace = packaged_trace("mooncake_conversation_sample.jsonl")
    requests = load_trace(trace)
    expected, longest = sim_cli.too_long_for(requests, 8192)
    assert 0 < expected < len(requests)
    warnings: list[str] = []
    _build("--trace", str(trace), "--num-gpu-blocks", "20000", warn=warnings.append)
    assert len(warnings) == 1
    assert f"{expected} of {len(requests)} trace requests" in warnings[0] and f"longest is {longest}" in warnings[0]
    warnings.clear()
    _build("--trace", str(trace), "--num-gpu-blocks", "20000", "--max-model-len", str(longest), warn=warnings.append)
    assert warnings == []
    # What the warning says is what happens: exactly those requests are rejected in a headless run.
    last_arrival = max(r.arrival_time for r in requests)  # before the trace's second pass starts
    code = main(["simulate", "--no-serve", "--json", "--duration-seconds", str(last_arrival), "--trace",
                 str(trace), "--num-gpu-blocks", "20000"])
    assert code == 0
    out, err = capsys.readouterr()
    assert f"{expected} of {len(requests)} trace requests" in err
    assert json.loads(out)["requests_rejected"] == expected


@pytest.mark.parametrize("flags", [[], ["--enable-prefix-caching"]])
def test_cache_config_info_says_what_the_engine_does(flags: list[str]) -> None:
    simulator, _, render_options = _build("--vllm-version", "0.33", "--data-parallel-size", "2", *flags)
    assert render_options["enable_prefix_caching"] is simulator.config.enable_prefix_caching is bool(flags)
    simulator.run_until(1.0)
    text = render(simulator.snapshot(), **render_options)
    info = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info")
    for sample in info.samples:
        assert sample.labels["enable_prefix_caching"] == str(bool(flags))
        assert sample.labels["num_gpu_blocks_override"] == "2048" and sample.labels["num_gpu_blocks"] == "4096"


def test_no_serve_needs_a_duration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--no-serve"]) == 2
    assert "--duration-seconds" in capsys.readouterr().err


def test_simulate_serves_metrics_over_http() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "simulate", "--port", "0", "--clock-speed", "50", "--rate", "20",
         "--vllm-version", "0.10", "--data-parallel-size", "2", "--model-name", "sim-model"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:")
        url = line.split()[1]
        time.sleep(1.0)
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            first = response.read().decode()
        time.sleep(0.5)
        with urllib.request.urlopen(url, timeout=5) as response:
            second = response.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(first)}
        engines = {s.labels["engine"] for s in families["vllm:kv_cache_usage_perc"].samples}
        assert engines == {"0", "1"}
        assert all(s.labels["model_name"] == "sim-model" for s in families["vllm:num_requests_running"].samples)

        def generated(text: str) -> float:
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            return sum(s.value for s in fams["vllm:generation_tokens"].samples if s.name.endswith("_total"))

        assert generated(second) > generated(first) > 0  # the clock runs
        # The process started now, as vLLM's says: every simulator said 1.75e9, so a killed and restarted one read as
        # counters going down under one start (impossible values), never as a restart.
        started = families["process_start_time_seconds"].samples[0].value
        assert abs(started - time.time()) < 120
        with urllib.request.urlopen(url + "/", timeout=5) as response:  # vLLM serves /metrics/ too
            assert response.status == 200 and "vllm:kv_cache_usage_perc" in response.read().decode()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(url.replace("/metrics", "/nope"), timeout=5)
        assert missing.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0  # SIGTERM is a clean stop


def test_restart_injection_resets_counters_once_at_the_given_time() -> None:
    from kvwatch.sim.engine import EngineConfig, Simulator
    from kvwatch.sim.load import LoadGenerator, LoadProfile
    from kvwatch.sim.server import SimulationService

    service = SimulationService(Simulator(EngineConfig(num_gpu_blocks=2000)),
                                LoadGenerator(LoadProfile(rate=5.0), seed=1), {"profile": "0.33"}, restarts=[100.0])
    before = service.advance(99.0)[0]
    after = service.advance(101.0)[0]
    later = service.advance(200.0)[0]
    assert before.generation_tokens_total > after.generation_tokens_total  # a counter reset
    assert after.started_at == pytest.approx(100.0, abs=0.1) and later.started_at == after.started_at
    assert later.generation_tokens_total > after.generation_tokens_total  # traffic resumes
    assert service.submitted > 0


def test_a_scraper_that_gives_up_mid_answer_leaves_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    """kvwatch drops a connection at its poll deadline; the simulator must not print a traceback for each one
    (a fast demo printed hundreds)."""
    import socket
    import struct
    import threading

    from kvwatch.sim.server import make_server

    client_gone = threading.Event()
    answered = threading.Event()

    class SlowService:  # answers only after the client has reset the connection
        def metrics_text(self) -> str:
            client_gone.wait(5)
            time.sleep(0.2)
            answered.set()
            return "vllm:num_requests_running 1\n" * 50_000

    server = make_server(SlowService())  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(server.server_address[:2]) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: sim\r\n\r\n")
            time.sleep(0.2)
        client_gone.set()
        assert answered.wait(5)
        time.sleep(0.5)  # the handler's failed write and whatever it prints
    finally:
        server.shutdown()
        server.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err


def test_json_while_serving_is_refused_and_a_trace_run_ignores_the_length_means(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    # --json prints a --no-serve run's summary: a server printed none, exit 0, without a word
    assert main(["simulate", "--json"]) == 2 and "--json" in capsys.readouterr().err
    # with --trace the trace gives the lengths: --prompt-tokens above --max-model-len was refused though unused
    from kvwatch.sim.traces import packaged_trace

    assert main(["simulate", "--no-serve", "--duration-seconds", "5", "--trace",
                 str(packaged_trace("azure_code_sample.csv")), "--prompt-tokens", "9000"]) == 0


def test_a_port_in_use_stops_the_simulator_naming_the_flags() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = _kvwatch("simulate", "--listen-address", "127.0.0.1", "--port", str(taken.getsockname()[1]))
    assert done.returncode == 2
    assert "--listen-address 127.0.0.1 --port" in done.stderr and "in use" in done.stderr


def test_the_simulator_listens_on_an_ipv6_address() -> None:
    # --listen-address ::1 failed: "Address family for hostname not supported"
    proc = subprocess.Popen([sys.executable, "-m", "kvwatch", "simulate", "--listen-address", "::1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving http://[::1]:"), line + (proc.stderr.read() if proc.stderr else "")
        with urllib.request.urlopen(line.split()[1], timeout=10) as response:
            assert b"vllm:kv_cache_usage_perc" in response.read()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_no_serve_without_a_duration_names_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    # "invalid value None for --duration-seconds": None was never given
    assert main(["simulate", "--no-serve"]) == 2
    assert "kvwatch simulate: --no-serve needs --duration-seconds" in capsys.readouterr().err


def test_a_restart_at_the_runs_last_second_is_taken() -> None:
    # (restarts run up to and including the simulated time reached, and a run ends at --duration-seconds)
    _build("--no-serve", "--duration-seconds", "30", "--restart-at-seconds", "10,30")
