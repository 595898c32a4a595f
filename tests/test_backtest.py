"""A short backtest on the shipped trace sample: kvwatch warns before saturation on a ramp and stays
quiet on steady load. Also the ``kvwatch backtest`` CLI contract (JSON shape, exit codes, --plot)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from kvwatch.backtest.runner import calibrate, run_scenario
from kvwatch.backtest.scenarios import Scenario, load_trace, shape_lengths
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


def test_the_bottleneck_state_is_scored_on_the_events_the_warnings_are(conv):
    # A cache saturated from the start: its event falls in the 30-minute warm-up, which every
    # method's score leaves out, but the bottleneck state counted it (recall 1.0, detected 100 s into the run).
    result = _run(conv, "steady", 1.3, 1.3, hours=0.75)
    kv = result.outcomes["kvwatch"]
    assert result.events and kv.warmup_events == len(result.events)
    assert kv.detect_delays == []


def test_kvwatch_stays_quiet_on_steady_load(conv):
    result = _run(conv, "steady", 0.6, 0.6)
    assert result.events == []
    assert result.outcomes["kvwatch"].false_alarm_episodes == 0
    assert not any(result.timeline.warnings["kvwatch"])
    # After the warm-up the risk is computed (not left unknown) and stays below the warning level. (The
    # baselines' alarms here were all in their first minutes of data, which the fair scorer now masks.)
    risks = [r for t, r in zip(result.timeline.times, result.timeline.probabilities["kvwatch"][1800], strict=True)
             if t >= 2400]
    assert risks and all(r is not None for r in risks)
    assert max(risks) < 0.7


def _cli(argv, capsys):
    code = main(["backtest", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_json_contract_and_plot(tmp_path, capsys):
    png = tmp_path / "timeline.png"
    code, out, err = _cli(["--trace", str(packaged_trace("azure_code_sample.csv")), "--profile", "steady",
                         "--hours", "0.6", "--start-load", "0.5", "--peak-load", "0.5", "--rate-scale", "1",
                         "--engine-speedup", "1", "--json", "--plot", str(png)], capsys)
    assert code == 0
    report = json.loads(out)
    assert set(report) >= {"events", "hours", "methods"}
    assert report["hours"] == 0.6
    assert set(report["methods"]) == {"kvwatch", "threshold", "predict_linear", "guarded_predict_linear", "holt"}
    for scores in report["methods"].values():
        assert set(scores["recall"]) == {"0", "300", "900", "1800"}
        for key in ("median_lead_seconds", "p10_lead_seconds", "precision", "false_alarms_per_day"):
            assert key in scores
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {png.resolve()}" in err
    assert report["scenario"]["trace_format"] == "azure"
    assert report["scenario"]["engine"] is None  # (no --engine: polls straight from the simulator)
    assert set(report["scenario"]["trace_columns"]) == {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
    assert report["scenario"]["trace_empty_blocks"] == {"empty": 0, "blocks": 1}  # the sample: one short block
    # ... so the bootstrap draws only the requests of that block, about half the sample, and the report says so
    assert report["scenario"]["trace_requests_in_blocks"] == 781 < report["scenario"]["trace_requests_read"] == 1482
    assert report["scenario"]["trace_requests_capped"] == 0
    assert report["scenario"]["trace_rows_left_out"] == {}  # the sample holds no row without a prompt
    for horizon in ("5m", "15m", "30m"):
        block = report["calibration"][horizon]
        assert set(block) == {"kvwatch", "predict_linear", "climatology"}
        assert block["kvwatch"]["n"] == block["predict_linear"]["n"] == block["climatology"]["n"]
    for scores in report["methods"].values():
        assert scores["false_alarms_per_day"] is None  # 6 monitored minutes are no day: never extrapolated


def test_cli_text_says_how_much_of_the_trace_was_read_and_left_out(tmp_path, capsys):
    # Rows left out (an empty prompt) were counted nowhere in the text report: the run simulated the rest at a
    # higher rate without a word
    sample = packaged_trace("azure_code_sample.csv").read_text().splitlines()
    header, rows = sample[0], sample[1:]
    path = tmp_path / "t.csv"
    path.write_text("\n".join([header, *rows, *(f"{r.split(',')[0]},0,5" for r in rows[:7])]) + "\n")
    code, out, _ = _cli(["--trace", str(path), "--profile", "steady", "--hours", "0.6", "--start-load", "0.5",
                         "--peak-load", "0.5", "--rate-scale", "1", "--engine-speedup", "1"], capsys)
    assert code == 0
    assert f"trace read: {len(rows):,} requests over " in out and "; 7 rows left out (ContextTokens 0)" in out
    assert "note: the bootstrap draws whole 300-s blocks, 1 here: " in out
    assert "polls read straight from the simulator" in out
    assert "long context" not in out
    # the JSON named --prompt-scale and --long-fraction, the text report neither
    code, out, _ = _cli(["--trace", str(path), "--profile", "steady", "--hours", "0.6", "--start-load", "0.5",
                         "--peak-load", "0.5", "--rate-scale", "1", "--engine-speedup", "4", "--prompt-scale", "2",
                         "--long-fraction", "0.01", "--max-model-len", "32768"], capsys)
    assert code == 0 and "long context: prompts x 2 (--prompt-scale); 1 % of requests get a 16k-128k-token prompt " \
        "(--long-fraction); every request capped at --max-model-len 32,768" in out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--trace", "/nonexistent/trace.csv"], "--trace"),
        (["--hours", "0"], "--hours"),
        (["--peak-load", "-1"], "--peak-load"),
        (["--plot", "/nonexistent/dir/x.png"], "--plot"),
        (["--prompt-scale", "0"], "--prompt-scale"),
        (["--long-fraction", "1.5"], "--long-fraction"),
        (["--max-model-len", "1"], "--max-model-len"),
        (["--hours", "0.5"], "--hours"),  # nothing is scored in the first 30 minutes
        (["--profile", "restart", "--hours", "1"], "--hours"),  # the restart's warm-up covered the second half
        (["--hours", "inf"], "--hours"),
        (["--rate-scale", "inf"], "--rate-scale"),
        (["--engine-speedup", "inf"], "--engine-speedup"),
        # within its bound, but 1000 copies of the calibration hour held 17 million requests: a MemoryError, a traceback
        (["--rate-scale", "1000", "--engine-speedup", "1000"], "--rate-scale"),
        (["--plot", "/tmp"], "--plot"),  # a directory
        (["--plot", "timeline.txt"], "--plot"),  # not a PNG name
    ],
)
def test_cli_bad_input_exits_2_naming_the_flag(argv, flag, capsys):
    base = ["--trace", str(packaged_trace("azure_code_sample.csv"))]
    code, _, err = _cli([*base, *argv], capsys)
    assert code == 2
    assert flag in err


def test_a_run_too_large_to_hold_says_how_large_in_millions_and_gigabytes(capsys):
    argv = ["--trace", str(packaged_trace("azure_code_sample.csv")), "--rate-scale", "1000", "--engine-speedup", "1000"]
    code, _, err = _cli(argv, capsys)
    assert code == 2
    assert re.search(r"about \d+\.\d million requests at once \(\d+\.\d GB; at most 5 million\)", err), err



def test_the_plots_legend_sits_beside_its_axes(tmp_path, capsys, monkeypatch):
    # in the upper left of the axes it hid the 0.95 line and the usage of the first half hour
    from matplotlib.figure import Figure

    saved = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), savefig(fig, *a, **k))[1])
    code, _, _ = _cli(["--trace", str(packaged_trace("azure_code_sample.csv")), "--hours", "0.6",
                       "--plot", str(tmp_path / "p.png")], capsys)
    assert code == 0
    (fig,) = saved
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # (the figure is closed after its save)
    ax = fig.axes[0]
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1
    assert ": ramp 0.5→1.3, 0.6 h" in ax.get_title()
    # every line inside the axes, and a line clipped at the top visibly below the frame (it ran along it, hidden)
    top = ax.get_ylim()[1]
    highest = max(max(y for y in line.get_ydata() if y == y) for line in ax.get_lines() if len(line.get_ydata()))
    assert highest < top


def test_plot_without_matplotlib_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    # matplotlib is the plot extra: a run of hours went by before it said so, with exit 1.
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what Python does when the package is absent
    code, _, err = _cli(["--trace", str(packaged_trace("azure_code_sample.csv")), "--plot", str(tmp_path / "x.png")],
                        capsys)
    assert code == 2 and "kvwatch[plot]" in err and "calibrat" not in err.lower()


def test_cli_unreadable_trace_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("not,a,trace\n1,2,3\n")
    code, _, err = _cli(["--trace", str(bad)], capsys)
    assert code == 2 and "--trace" in err
    code, _, err = _cli(["--trace", "/dev/null"], capsys)  # a device, not missing
    assert code == 2 and "/dev/null: not a regular file" in err
    code, _, err = _cli(["--trace", str(tmp_path / "missing.csv")], capsys)
    assert code == 2 and "missing.csv: no such file" in err


def test_long_context_shaping_scales_mixes_and_caps_at_max_model_len(conv):
    trace, _ = conv
    base = Scenario("s", "steady", 1.0, 0, 0.5, 0.5)
    scaled = shape_lengths(trace, replace(base, prompt_scale=100.0, max_model_len=32768), seed=1)
    assert all(r.prompt_tokens + r.output_tokens <= 32768 for r in scaled)
    assert max(r.prompt_tokens for r in scaled) > 10 * max(r.prompt_tokens for r in trace) / 100
    mixed = shape_lengths(trace, replace(base, long_fraction=0.2), seed=1)
    long = [r for r in mixed if r.prompt_tokens >= 16384]
    assert 0.15 < len(long) / len(mixed) < 0.25
    assert all(r.prompt_tokens + r.output_tokens <= 131072 for r in long)
    assert shape_lengths(trace, base, seed=1) == list(trace)  # no shaping: the trace itself
    # a prompt vLLM refuses is left out on every path (the matrix's too, not only the CLI's);
    # one that fits with an output that does not is capped
    refused = replace(trace[0], prompt_tokens=40_000)
    fits = replace(trace[1], prompt_tokens=30_000, output_tokens=5_000)
    # an output no server of the limit generates (1e9 tokens: capped, it sized the simulated cache 18x too large)
    endless = replace(trace[2], output_tokens=10**9)
    shaped = shape_lengths([refused, fits, endless, *trace[3:]], replace(base, max_model_len=32768), seed=1)
    assert len(shaped) == len(trace) - 2 and shaped[0].prompt_tokens + shaped[0].output_tokens == 32768
    assert shaped[0].output_tokens == 5_000  # the output kept, the prompt shortened, as the report says


def test_burst_shapes_last_seconds_or_minutes():
    from kvwatch.backtest.scenarios import BURST_LONG, BURST_SHORT

    short = Scenario("t.csv", "burst-short", 3.0, 0, 0.4, 1.1)
    seconds, _period, extra = BURST_SHORT
    t = 5400.0  # mid-run: the ramp under the spikes is at its midpoint
    assert short.load_at(t + seconds / 2) == pytest.approx(short.load_at(t + seconds + 1) + extra, abs=1e-3)
    long = Scenario("t.csv", "burst-long", 4.0, 0, 0.6, 1.1)
    burst, gap = BURST_LONG[0], BURST_LONG[1]
    assert long.load_at(600.0) == 0.6  # no burst before the warm-up ends
    assert long.load_at(1800.0 + burst / 2) == 1.1 and long.load_at(1800.0 + burst + 60.0) == 0.6
    assert long.load_at(1800.0 + gap + 1.0) == 1.1


def test_a_trace_kvwatch_does_not_know_by_name_is_scaled_from_its_content(tmp_path, capsys):
    from kvwatch.backtest.traces import content_defaults, defaults_for

    renamed = tmp_path / "my_service_trace.csv"
    renamed.write_bytes(packaged_trace("azure_code_sample.csv").read_bytes())
    trace = load_trace(renamed)
    rate_scale, speedup = content_defaults(trace)
    assert defaults_for(renamed, trace) == (rate_scale, speedup) and rate_scale > 1 and speedup > 1
    assert defaults_for(packaged_trace("azure_code_sample.csv"), trace) == (8.0, 8.0)  # a tuned trace's name
    # A rate from --rate-scale sizes the engine from the content, a tuned trace's too: its tuned engine stayed at the
    # tuned rate's size, and 16 x was refused as an engine that cannot keep up.
    assert defaults_for(packaged_trace("azure_code_sample.csv"), trace, rate_scale=16.0) == \
        content_defaults(trace, rate_scale=16.0) != (8.0, 8.0)
    # Long prompts on a tuned trace keep its rate on an engine sized for them: the real Azure code
    # trace at --prompt-scale 4 was refused as compute-bound after 50 s of simulating on the tuned 8x engine.
    rate, engine = defaults_for(packaged_trace("azure_code_sample.csv"), trace, prompt_scale=4.0)
    assert rate == 8.0 and engine == content_defaults(trace, 4.0, rate_scale=8.0)[1] > 8.0
    # never slower than the tuned engine (1 % of 16k-128k prompts needs 7.6x here: the tuned 8x stays)
    assert defaults_for(packaged_trace("azure_code_sample.csv"), trace, long_fraction=0.01) == (8.0, 8.0)
    code, out, _ = _cli(["--trace", str(renamed), "--hours", "0.6", "--json"], capsys)
    scenario = json.loads(out)["scenario"]
    assert code == 0 and scenario["scale_defaults_from"] == "trace content"
    assert (scenario["rate_scale"], scenario["engine_speedup"]) == (rate_scale, speedup)


def test_the_packaged_two_minute_mooncake_sample_backtests_in_blocks_of_its_length(capsys):
    code, out, err = _cli(["--trace", str(packaged_trace("mooncake_conversation_sample.jsonl")), "--hours", "0.6"],
                          capsys)
    assert code == 0, err
    assert "trace format mooncake" in out and "monitored hours" in out and "on 5m before" in out


def test_a_trace_too_sparse_to_calibrate_says_so(tmp_path, capsys):
    sparse = tmp_path / "sparse.csv"
    rows = [f"2023-11-16 {h:02d}:00:00,500,50" for h in range(12)]  # 12 requests over 11 hours
    sparse.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    code, _, err = _cli(["--trace", str(sparse), "--hours", "1", "--rate-scale", "0.001"], capsys)
    assert code == 2 and "too sparse" in err and "--rate-scale" in err


def test_a_trace_longer_than_the_cap_is_read_up_to_it_and_says_so(monkeypatch, capsys):
    # A week-long trace held whole takes gigabytes: the backtest reads the first MAX_TRACE_REQUESTS requests
    # (streamed, never the whole file) and the report says it did.
    from kvwatch.backtest import scenarios

    monkeypatch.setattr(scenarios, "MAX_TRACE_REQUESTS", 500)
    trace, truncated = scenarios.load_trace_head(packaged_trace("azure_conv_sample.csv"))
    assert truncated and len(trace) == 500
    from kvwatch.sim.traces import load_trace as read_whole

    assert trace == read_whole(packaged_trace("azure_conv_sample.csv"))[:500]  # its first 500, as read whole
    code, out, _ = _cli(["--trace", str(packaged_trace("azure_conv_sample.csv")), "--hours", "0.6"], capsys)
    assert code == 0 and "note: read the trace's first 500 requests" in out
    monkeypatch.setattr(scenarios, "MAX_TRACE_REQUESTS", 10_000)
    assert scenarios.load_trace_head(packaged_trace("azure_conv_sample.csv"))[1] is False


def test_tuned_defaults_go_by_exact_file_name_only(tmp_path):
    from kvwatch.backtest.traces import TRACE_DEFAULTS, defaults_for

    trace = load_trace(packaged_trace("mooncake_conversation_sample.jsonl"))
    for name in ("AzureLLMInferenceTrace_conv.csv", "conversation_trace.jsonl", "azure_code_sample.csv.gz"):
        assert defaults_for(tmp_path / name, trace) == TRACE_DEFAULTS[name.lower().removesuffix(".gz")]
    # A Mooncake file saved under a name with "conv" in it got Azure conversation's x4 / x4 and a cache that
    # could not fill; Azure's 2024 week-long files are other traces too.
    for name in ("mc_conv.jsonl", "AzureLLMInferenceTrace_conv_1week.csv"):
        assert defaults_for(tmp_path / name, trace) == defaults_for(tmp_path / "unknown.jsonl", trace)


def test_content_defaults_size_the_engine_for_the_long_context_shaping():
    from kvwatch.backtest.traces import content_defaults

    trace = load_trace(packaged_trace("azure_conv_sample.csv"))
    rate, speedup = content_defaults(trace)
    assert content_defaults(trace, prompt_scale=4.0)[0] == rate
    assert content_defaults(trace, prompt_scale=4.0)[1] > 3 * speedup
    assert content_defaults(trace, long_fraction=0.05)[1] > 2 * speedup


def _uniform_trace(rate: float, prompt: int, output: int, n: int = 2000):
    from kvwatch.sim.config import Request

    return [Request(i / rate, prompt, output) for i in range(n)]


def test_content_defaults_stay_inside_the_engines_limits_and_the_flags_bounds():
    # On traces kvwatch had never seen: 20k-token outputs were refused as compute-bound after
    # simulating the whole run (the step's fixed cost and the sequence cap bound decoding, whatever the speedup);
    # a trace of one request per 2 minutes was refused for a --rate-scale nobody passed; a 200-requests/s one ran at
    # its full rate (1.8 million requests in 3 hours), and a 10x prompt scale asked for a speedup over the bound.
    from kvwatch.backtest.runner import MAX_NUM_SEQS
    from kvwatch.backtest.scenarios import MAX_SCALE
    from kvwatch.backtest.traces import COMPUTE_SHARE, PEAK_LOAD, RUNNING_SHARE, TARGET_RATE, content_defaults
    from kvwatch.sim.config import StepTimeModel

    huge = _uniform_trace(0.5, 2_000, 20_000)
    rate_scale, _ = content_defaults(huge)
    decoded = PEAK_LOAD * 0.5 * rate_scale * 20_000  # output tokens/s at the peak load
    running = decoded * StepTimeModel().fixed_seconds / (1 - COMPUTE_SHARE)
    assert rate_scale < TARGET_RATE / 0.5 and running <= RUNNING_SHARE * MAX_NUM_SEQS * 1.001
    sparse = content_defaults(_uniform_trace(1 / 120, 1_000, 100, n=300))
    assert sparse[0] == MAX_SCALE
    fast = content_defaults(_uniform_trace(200.0, 1_000, 100))
    assert fast[0] == pytest.approx(TARGET_RATE / 200.0)
    rag = _uniform_trace(1.0, 60_000, 300)
    for scale in (10.0, 200.0):
        assert content_defaults(rag, prompt_scale=scale)[1] <= MAX_SCALE
    assert content_defaults(rag, prompt_scale=10.0) == content_defaults(rag, prompt_scale=200.0)  # both at the cap
    given = content_defaults(_uniform_trace(5.0, 1_000, 100), rate_scale=40.0)
    assert given[0] == 40.0 and given[1] > content_defaults(_uniform_trace(5.0, 1_000, 100))[1]


def test_a_compute_bound_engine_is_refused_not_scored():
    from kvwatch.backtest.scenarios import ScenarioError

    trace = load_trace(packaged_trace("azure_conv_sample.csv"))
    with pytest.raises(ScenarioError, match=r"cannot keep up .* raise --engine-speedup"):
        calibrate(trace, 8.0, seed=0, speedup=0.25, seconds=1800.0)


@pytest.mark.parametrize(("rate", "speedup", "said"), [
    # (a rate from the flags sizes the engine from the content, a named trace's too: traces.defaults_for)
    (True, True, "flags"), (False, False, "trace name"), (True, False, "rate from flags, engine from trace content"),
    (False, True, "engine from flags, rate from trace name")])
def test_the_report_says_where_each_scale_came_from(rate, speedup, said):
    from kvwatch.backtest.cli import _defaults_from

    assert _defaults_from(rate, speedup, True) == said


def test_a_named_trace_shaped_long_says_its_engine_came_from_the_content():
    from kvwatch.backtest.cli import _defaults_from

    assert _defaults_from(False, False, True, shaped=True) == "rate from trace name, engine from trace content"
    assert _defaults_from(False, True, True, shaped=True) == "engine from flags, rate from trace name"


@pytest.mark.parametrize(("shaping", "said"), [
    (["--prompt-scale", "4"], "rate from trace name, engine from trace content"),
    # 1 % of long prompts needs no faster engine than the tuned one, which is kept: it said
    # "engine from trace content" all the same
    (["--long-fraction", "0.01", "--max-model-len", "32768"], "trace name")])
def test_a_named_trace_shaped_long_says_where_its_engine_came_from(capsys, shaping, said):
    code, out, _ = _cli(["--trace", str(packaged_trace("azure_code_sample.csv")), "--profile", "steady",
                         "--hours", "0.6", "--start-load", "0.3", "--peak-load", "0.3", "--json", *shaping], capsys)
    assert code == 0 and json.loads(out)["scenario"]["scale_defaults_from"] == said


def test_bad_flags_are_refused_before_the_trace_is_read(tmp_path, capsys):
    # The trace is read first otherwise: a mistyped --hours waited for a million-row file (and here the file
    # does not even exist, which would have been the message).
    code, _, err = _cli(["--trace", str(tmp_path / "missing.csv"), "--hours", "0.1"], capsys)
    assert code == 2 and "--hours must be in" in err


def test_the_plotted_demand_of_a_mixshift_grows_with_its_requests():
    # The plot drew mixshift's "offered load" at the start load after the shift while the cache saturated: its rate
    # stays, its requests grow by sqrt(peak/start), so the offered KV demand reaches about the peak.
    shift = Scenario("t", "mixshift", 2.0, 0, 0.4, 1.2)
    assert shift.demand_at(0.0) == 0.4 and shift.load_at(5000.0) == 0.4
    assert shift.demand_at(5000.0) == pytest.approx(1.2)
    ramp = Scenario("t", "ramp", 2.0, 0, 0.4, 1.2)
    assert [ramp.demand_at(t) for t in (0.0, 3600.0, 7200.0)] == [ramp.load_at(t) for t in (0.0, 3600.0, 7200.0)]


def test_the_report_lists_hash_ids_only_when_the_trace_has_them(tmp_path, capsys):
    lines = [f'{{"timestamp": {i * 50}, "input_length": {800 + i % 7 * 100}, "output_length": {50 + i % 5 * 20}}}'
             for i in range(3000)]
    plain = tmp_path / "no_hashes.jsonl"
    plain.write_text("\n".join(lines) + "\n")
    code, out, err = _cli(["--trace", str(plain), "--hours", "0.6", "--json"], capsys)
    assert code == 0, err
    assert set(json.loads(out)["scenario"]["trace_columns"]) == {"timestamp", "input_length", "output_length"}


def test_the_report_says_how_much_of_a_gapped_trace_holds_requests(tmp_path, capsys):
    # ten minutes, then ten more a day later: 92 % of the blocks were silence to the bootstrap.
    rows = [f"2023-11-{16 + day} 18:{i // 60:02d}:{i % 60:02d}.5,{300 + i % 700},{20 + i % 90}\n"
            for day in (0, 1) for i in range(0, 600, 2) for _ in range(3)]
    trace = tmp_path / "gapped.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows))
    code, out, _ = _cli(["--trace", str(trace), "--hours", "0.6", "--profile", "steady", "--start-load", "0.5",
                         "--peak-load", "0.5"], capsys)
    assert code == 0
    assert not any("are capped" in line for line in out.splitlines())
    note = next(line for line in out.splitlines() if "gaps in its collection" in line)
    assert note.startswith("note: 286 of the trace's 289 5-minute blocks are gaps"), note  # 2 + 1 whole hold requests


def test_the_report_counts_the_requests_capped_at_max_model_len(tmp_path, capsys):
    # six 10,000,000-token prompts were capped at --max-model-len without a word of how many.
    # vLLM refuses such a prompt, and capped it was a request of the whole cache that sized the
    # simulated cache: left out now; a prompt that fits with an output that does not is capped, and counted.
    def row(i: int) -> str:
        prompt, output = {0: (10_000_000, 40), 50: (30_000, 5_000)}.get(i % 100, (300 + i % 700, 40))
        return f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.5,{prompt},{output}\n"
    trace = tmp_path / "huge.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(row(i) for i in range(1200)))
    args = ["--trace", str(trace), "--hours", "0.6", "--profile", "steady", "--start-load", "0.5",
            "--peak-load", "0.5", "--max-model-len", "32768"]
    code, out, _ = _cli(args, capsys)
    assert code == 0
    assert "trace read: 1,188 requests over" in out
    assert " steady at 0.5 for 0.6 h " in out.splitlines()[0]  # a steady run holds the peak (it read "0.5->0.5")
    assert "12 rows left out (prompt of --max-model-len 32,768 tokens or more: vLLM refuses it)" in out
    assert "note: 12 of the 1,188 requests read are longer than --max-model-len 32,768 as the trace has them" in out
    code, out, _ = _cli([*args, "--json"], capsys)
    scenario = json.loads(out)["scenario"]
    assert scenario["trace_rows_left_out"] == {"prompt of --max-model-len 32,768 tokens or more: vLLM refuses it": 12}
    assert scenario["trace_requests_capped"] == 12
    assert scenario["load"] == "at 0.5"


def test_a_tuned_name_on_another_format_takes_the_contents_defaults(tmp_path):
    # A BurstGPT CSV saved as conversation_trace.jsonl took the Mooncake trace's tuning by name (4 requests simulated)
    from kvwatch.backtest.traces import TRACE_DEFAULTS, defaults_for

    burst = tmp_path / "conversation_trace.jsonl"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     + "".join(f"{t * 0.5},m,{500 + t},50,{550 + t},x\n" for t in range(4000)))
    from kvwatch.sim.traces import load_trace

    assert defaults_for(burst, load_trace(burst)) != TRACE_DEFAULTS["conversation_trace.jsonl"]
    mooncake = tmp_path / "m" / "conversation_trace.jsonl"
    mooncake.parent.mkdir()
    mooncake.write_text("".join(f'{{"timestamp": {t * 500}, "input_length": 500, "output_length": 50}}\n'
                                for t in range(100)))
    assert defaults_for(mooncake, load_trace(mooncake)) == TRACE_DEFAULTS["conversation_trace.jsonl"]


def test_cli_notes_a_rate_at_the_bound_as_a_unit_mistake(tmp_path, capsys):
    # Milliseconds in a BurstGPT "seconds" column read as a trace 1000x longer, simulated at the 1000x bound: 0 events
    # and no word. Now the text says what the bound and the span suggest.
    path = tmp_path / "ms.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    + "".join(f"{t * 600},m,500,50,550,x\n" for t in range(400)))
    code, out, _ = _cli(["--trace", str(path), "--hours", "0.6", "--profile", "steady"], capsys)
    assert code == 0 and "simulated at the bound, 1000 x" in out and "milliseconds read as seconds" in out
    # and a run with nothing to score says why its tables are dashes
    assert "note: no saturation event after the 30-minute warm-up, so nothing is scored" in out


def test_the_reported_trace_rate_leaves_out_gaps_in_the_collection_as_its_sizing_does(tmp_path, capsys):
    # Two 20-minute spells of a request a second, three hours apart: the report said 0.1 a second (the gap counted)
    # while the defaults were sized at 1.
    path = tmp_path / "gap.csv"
    times = [*range(1200), *range(12_000, 13_200)]
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    + "".join(f"{t},m,500,50,550,x\n" for t in times))
    code, out, _ = _cli(["--trace", str(path), "--hours", "0.6", "--profile", "steady", "--json"], capsys)
    scenario = json.loads(out)["scenario"]
    assert code == 0 and scenario["trace_empty_blocks"]["empty"] > 0
    assert scenario["trace_requests_per_second"] == pytest.approx(1.0, rel=0.1)


def test_a_run_saturated_from_its_warm_up_is_told_to_lower_the_load_not_raise_it(capsys):
    # The only event began in the warm-up and lasted: the note said to raise --peak-load.
    code, out, _ = _cli(["--trace", str(packaged_trace("azure_conv_sample.csv")), "--hours", "0.6", "--profile",
                         "steady", "--peak-load", "2"], capsys)
    assert code == 0 and "saturation began during the warm-up" in out and "lower --peak-load" in out
    assert "a load that saturates (--peak-load" not in out


def test_cli_notes_a_mooncake_trace_read_implausibly_dense(tmp_path, capsys):
    # A day of Mooncake lines with timestamps in seconds read as 86 s of 232 requests a second,
    # simulated without a word; a trace under a minute got a hint, one over 16.7 h none.
    path = tmp_path / "day.jsonl"
    path.write_text("".join(f'{{"timestamp": {t * 20}, "input_length": 500, "output_length": 50}}\n'
                            for t in range(4400)))  # 88,000 "ms": 50 requests a second
    code, out, _ = _cli(["--trace", str(path), "--hours", "0.6", "--profile", "steady"], capsys)
    assert code == 0 and "requests a second" not in out  # dense, but within what real traces reach
    path.write_text("".join(f'{{"timestamp": {t * 4}, "input_length": 500, "output_length": 50}}\n'
                            for t in range(22000)))  # 88,000 "ms": 250 requests a second
    code, out, _ = _cli(["--trace", str(path), "--hours", "0.6", "--profile", "steady"], capsys)
    assert code == 0 and "requests a second" in out and "timestamp is in milliseconds" in out


def test_a_trace_too_short_gets_the_unit_hint_by_its_format_not_its_name(tmp_path, capsys):
    # the hint went by file name: an Azure CSV named .csv.gz got Mooncake's, a Mooncake file
    # named .json none, and requests all at one time the "seconds" hint
    import gzip

    mooncake = tmp_path / "m.json"
    mooncake.write_text("".join(f'{{"timestamp": {t * 1.3}, "input_length": 100, "output_length": 10}}\n'
                                for t in range(3000)))
    azure = tmp_path / "a.csv.gz"
    azure.write_bytes(gzip.compress(("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:17:{t // 10:02d}.{t % 10}000000,100,10\n" for t in range(300))).encode()))
    same = tmp_path / "same.jsonl"
    same.write_text('{"timestamp": 0, "input_length": 100, "output_length": 10}\n' * 50)
    seconds = tmp_path / "seconds.jsonl"  # 25 minutes in seconds: 1.5 s read as milliseconds, under the jitter's 3 s
    seconds.write_text("".join(f'{{"timestamp": {t}, "input_length": 1000, "output_length": 100}}\n'
                               for t in range(0, 1500)))
    for path, hinted in ((mooncake, True), (azure, False), (same, False), (seconds, True)):
        code, _, err = _cli(["--trace", str(path), "--hours", "0.6"], capsys)
        assert code == 2 and "bootstraps from at least" in err, err
        assert ("timestamp is in milliseconds" in err) == hinted, (path.name, err)


def test_a_trace_emptied_by_max_model_len_says_so(capsys):
    # "--trace ...: 0 requests over 0 s" blamed the trace for what --max-model-len 3 had left out
    code, _, err = _cli(["--trace", "azure_code_sample.csv", "--hours", "0.6", "--max-model-len", "3"], capsys)
    assert code == 2 and "0 requests over 0.0 s" in err
    assert "of its requests left out: a prompt or an output of --max-model-len 3 tokens or more" in err


def test_a_trace_whose_every_row_is_left_out_says_why(tmp_path, capsys):
    path = tmp_path / "failed.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    + "".join(f"{t * 5},m,100,0,100,x\n" for t in range(50)))
    code, _, err = _cli(["--trace", str(path), "--hours", "0.6"], capsys)
    assert code == 2 and "no requests: every row was left out (50 with Response tokens 0 (failed))" in err


def test_a_packaged_sample_is_named_by_its_file_name(tmp_path, capsys, monkeypatch):
    # an installed kvwatch's user got "--trace azure_conv_sample.csv: no such file" and had to
    # find site-packages; a file of that name in the working directory still wins
    monkeypatch.chdir(tmp_path)
    code, out, _ = _cli(["--trace", "azure_code_sample.csv", "--profile", "steady", "--hours", "0.6",
                         "--start-load", "0.3", "--peak-load", "0.3", "--json"], capsys)
    assert code == 0 and json.loads(out)["scenario"]["trace_requests_read"] > 0
    for name in ("no_such_sample.csv", "README.md"):  # (the samples' folder holds a README.md too)
        code, _, err = _cli(["--trace", name, "--hours", "0.6"], capsys)
        assert code == 2 and f"{name}: no such file" in err


def test_a_trace_shorter_than_a_block_is_said_to_repeat(tmp_path, capsys):
    # 3 minutes of requests became every 5-minute block the bootstrap drew: one block, replayed 40 times an hour
    rows = [f"2023-11-16 18:{17 + t // 120:02d}:{(t // 2) % 60:02d}.{(t % 2) * 5}000000,500,50" for t in range(360)]
    trace = tmp_path / "short.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    code, out, _ = _cli(["--trace", str(trace), "--hours", "0.6"], capsys)
    assert code == 0 and "note: the trace makes one block of 180 s" in out and "every draw repeats it whole" in out
    code, out, _ = _cli(["--trace", "azure_code_sample.csv", "--hours", "0.6"], capsys)
    assert code == 0 and "makes one block" not in out


def test_a_trace_simulated_far_above_the_tuned_rates_says_its_times_may_be_in_another_unit(tmp_path, capsys):
    # A BurstGPT file with millisecond timestamps ran at 418 x without a word (the note came only at the 1000 x bound);
    # here the conversation sample stretched 50 x: about 200 x.
    from datetime import datetime

    head, *rows = packaged_trace("azure_conv_sample.csv").read_text().splitlines()
    fmt = "%Y-%m-%d %H:%M:%S.%f"
    t0 = datetime.strptime(rows[0].split(",")[0][:26], fmt)
    stretched = [f"{(t0 + (datetime.strptime(ts[:26], fmt) - t0) * 50).strftime(fmt)}0,{p},{o}"
                 for ts, p, o in (row.split(",") for row in rows)]
    path = tmp_path / "slow.csv"
    path.write_text("\n".join([head, *stretched]) + "\n")
    code, out, _ = _cli(["--trace", str(path), "--hours", "0.6"], capsys)
    assert code == 0 and re.search(r"note: the trace's rate is simulated at \d+(\.\d+)? x to fill the cache", out)
