"""A short backtest on the shipped trace sample: kvwatch warns before saturation on a ramp and stays
quiet on steady load. Also the ``kvwatch backtest`` CLI contract (JSON shape, exit codes, --plot)."""

from __future__ import annotations

import json

import pytest

from kvwatch.backtest.runner import calibrate, run_scenario
from kvwatch.backtest.scenarios import Scenario, load_trace
from kvwatch.cli import main
from kvwatch.sim.traces import packaged_trace

SCALE = 2.0  # twice the sample's rate on an engine twice as fast: ~70 requests in flight at load 1


@pytest.fixture(scope="module")
def conv():
    trace = load_trace(packaged_trace("azure_conv_sample.csv"))
    return trace, calibrate(trace, SCALE, seed=0, speedup=SCALE, seconds=1800.0)


def _run(conv, profile, start, peak, hours=2.0, seed=0):
    trace, calibration = conv
    scenario = Scenario("azure_conv_sample.csv", profile, hours, seed, start, peak,
                        rate_scale=SCALE, engine_speedup=SCALE)
    return run_scenario(scenario, trace, calibration=calibration)


def test_kvwatch_warns_before_saturation_on_a_ramp(conv):
    result = _run(conv, "ramp", 0.4, 1.2)
    assert result.events, "a ramp to 1.2x capacity must saturate the simulated cache"
    kv = result.outcomes["kvwatch"]
    assert kv.leads[0] is not None and kv.leads[0] >= 600, kv.leads  # >= 10 minutes of warning
    assert kv.false_alarm_episodes == 0
    assert kv.detect_delays[0] is not None and kv.detect_delays[0] <= 180  # bottleneck within 3 min


def test_kvwatch_stays_quiet_on_steady_load(conv):
    result = _run(conv, "steady", 0.6, 0.6)
    assert result.events == []
    assert result.outcomes["kvwatch"].false_alarm_episodes == 0
    assert not any(result.timeline.warnings["kvwatch"])
    # The naive baseline cries wolf on the same polls: the comparison has teeth.
    assert result.outcomes["predict_linear"].false_alarm_episodes >= 1


def _cli(argv, capsys):
    code = main(["backtest", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_json_contract_and_plot(tmp_path, capsys):
    png = tmp_path / "timeline.png"
    code, out, _ = _cli(["--trace", str(packaged_trace("azure_code_sample.csv")), "--profile", "steady",
                         "--hours", "0.5", "--start-load", "0.5", "--peak-load", "0.5", "--rate-scale", "1",
                         "--engine-speedup", "1", "--json", "--plot", str(png)], capsys)
    assert code == 0
    report = json.loads(out)
    assert set(report) >= {"events", "hours", "methods"}
    assert report["hours"] == 0.5
    assert set(report["methods"]) == {"kvwatch", "threshold", "predict_linear", "guarded_predict_linear", "holt"}
    for scores in report["methods"].values():
        assert set(scores["recall"]) == {"0", "300", "900", "1800"}
        for key in ("median_lead_seconds", "p10_lead_seconds", "precision", "false_alarms_per_day"):
            assert key in scores
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--trace", "/nonexistent/trace.csv"], "--trace"),
        (["--hours", "0"], "--hours"),
        (["--peak-load", "-1"], "--peak-load"),
        (["--plot", "/nonexistent/dir/x.png"], "--plot"),
    ],
)
def test_cli_bad_input_exits_2_naming_the_flag(argv, flag, capsys):
    base = ["--trace", str(packaged_trace("azure_code_sample.csv"))]
    code, _, err = _cli([*base, *argv], capsys)
    assert code == 2
    assert flag in err


def test_cli_unreadable_trace_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("not,a,trace\n1,2,3\n")
    code, _, err = _cli(["--trace", str(bad)], capsys)
    assert code == 2 and "--trace" in err
