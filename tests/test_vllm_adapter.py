"""The vLLM adapter: generation detection, name resolution, DP capacity, pid combining, overrides."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.check import build_report
from kvwatch.engines import Selector, SourceOverrides, UnrecognisedPayload, vllm
from kvwatch.engines.detect import page_spelling, read_payload
from kvwatch.exposition import ParseError, parse
from kvwatch.model import CAPACITY_UNDETERMINED, Poll, Reading
from kvwatch.payload import ScrapeError, interpret

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-metrics"


def read_fixture(name: str, overrides: SourceOverrides | None = None) -> Poll:
    text = (FIXTURES / name).read_text()
    return vllm.read(parse(text, vllm.wanted_for(overrides)), overrides, timestamp=100.0)


def only(poll: Poll) -> Reading:
    assert len(poll.readings) == 1
    return poll.readings[0]


def test_real_v0_capture() -> None:
    poll = read_fixture("v0-engine-qwenvl.prom")
    assert poll.timestamp == 100.0
    assert (poll.detection.version_range, poll.detection.usage_metric) == ("v0", "vllm:gpu_cache_usage_perc")
    r = only(poll)
    assert (r.model_name, r.engine) == ("qwenvl", "0")
    assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting, r.requests_swapped) == (0.0, 0.0, 0.0, 0.0)
    # cache_config_info has no model_name in V0: it still applies to the only model.
    assert (r.num_gpu_blocks, r.block_size, r.kv_capacity_tokens) == (2048.0, 16.0, 32768.0)
    assert r.gpu_memory_utilization == 0.9
    assert r.cache_config["swap_space_bytes"] == "0.0"
    assert r.prefix_caching_enabled is False
    assert r.kv_used_tokens == 0.0


def test_real_v1_early_capture() -> None:
    poll = read_fixture("v1-0.8-early-model-name-only.prom")
    assert poll.detection.version_range == "0.7.3-0.8.4"
    r = only(poll)
    assert (r.model_name, r.engine) == ("Qwen/Qwen2.5-Coder-32B-Instruct", "0")
    assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting) == (0.0, 0.0, 0.0)
    assert r.process_start_time_seconds == 1.74262400557e9
    assert r.kv_capacity_tokens is None and r.preemptions_total is None  # missing families are normal


def test_real_0_10_capture_with_deprecated_and_new_names() -> None:
    poll = read_fixture("v0.10.0-glm45-deprecated-and-new.prom")
    assert poll.detection.version_range == "0.9-0.11"  # 0.11 shows the deprecated names with the hidden flag
    assert poll.detection.usage_metric == "vllm:kv_cache_usage_perc"
    r = only(poll)
    assert (r.model_name, r.engine) == ("zai-org/GLM-4.5", "0")
    assert r.kv_usage_ratio == 9.75010481363281e-06
    assert (r.prefix_cache_queries_total, r.prefix_cache_unit) == (32.0, "tokens")
    assert r.requests_running is None


def test_0_8_5_engine_label_blocks_prefix_and_none_blocks() -> None:
    poll = read_fixture("gen-0.8.5-engine-label.prom")
    assert poll.detection.version_range == "0.8.5-0.8.x"
    r = only(poll)
    assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting, r.preemptions_total) == (0.5, 12.0, 3.0, 7.0)
    assert (r.prefix_cache_queries_total, r.prefix_cache_hits_total, r.prefix_cache_unit) == (400.0, 100.0, "blocks")
    assert r.prefix_cache_hit_ratio == 0.25
    assert dict(r.finished_by_reason) == {"abort": 1.0, "length": 9.0, "stop": 90.0}
    assert r.num_gpu_blocks is None and r.kv_capacity_tokens is None  # "None" label value is unknown
    assert r.block_size == 16.0


def test_0_9_both_usage_names_prefers_kv_cache_usage() -> None:
    poll = read_fixture("gen-0.9-both-usage-names.prom")
    detected = vllm.detect(parse((FIXTURES / "gen-0.9-both-usage-names.prom").read_text()))
    assert (poll.detection.engine_kind, poll.detection.version_range, poll.detection.usage_metric) == (
        detected.engine_kind, detected.version_range, detected.usage_metric)
    # read() also names what it read beyond usage; detect() alone cannot (no series chosen yet).
    assert (poll.detection.running_metric, poll.detection.waiting_metric) == (
        "vllm:num_requests_running", "vllm:num_requests_waiting")
    assert (poll.detection.version_range, poll.detection.usage_metric) == ("0.9-0.11", "vllm:kv_cache_usage_perc")
    r = only(poll)
    assert (r.kv_usage_ratio, r.kv_capacity_tokens, r.kv_used_tokens) == (0.25, 192000.0, 48000.0)
    assert (r.prompt_tokens_total, r.generation_tokens_total) == (123456.0, 65432.0)
    assert (r.prefix_cache_unit, r.prefix_cache_hit_ratio) == ("tokens", 0.25)


def test_0_11() -> None:
    assert read_fixture("gen-0.11-kv-only.prom").detection.version_range == "0.11"


def test_0_11_1_sets_the_sleep_gauge_and_the_new_cache_labels() -> None:
    # 0.11.1 sets engine_sleep_state unconditionally and its CacheConfig has kv_offloading_backend and
    # mamba_block_size (both read in its wheel): its page was detected as 0.12-0.20, and with the hidden
    # deprecated gauge (--show-hidden-metrics-for-version=0.10, which points it at 0.9-0.11) as unknown.
    poll = read_fixture("gen-0.11.1-sleep-state.prom")
    assert "0.11" in vllm.eras_in_range(poll.detection.version_range)
    assert only(poll).sleep_state == "awake"
    text = (FIXTURES / "gen-0.11.1-sleep-state.prom").read_text()
    hidden = ("# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use "
              "vllm:kv_cache_usage_perc instead.\n# TYPE vllm:gpu_cache_usage_perc gauge\n"
              'vllm:gpu_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.42\n')
    assert interpret(hidden + text, None, timestamp=0.0).detection.version_range == "0.11"


def test_a_filtered_payload_proves_nothing_by_what_it_lacks() -> None:
    # A federated or gateway-filtered page of three gauges from a vLLM 0.33 lacks sleep state and the rest only
    # because it was cut: read as a whole page it was confidently "0.11".
    text = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    kept = [line for line in text.splitlines()
            if line.split("{")[0].split(" ")[-1] in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                                      "vllm:kv_cache_usage_perc")]
    detection = interpret("\n".join(kept) + "\n", None, timestamp=0.0).detection
    assert detection.version_range not in ("0.11", "unknown") and detection.version_range.startswith(">=")
    assert read_fixture("gen-0.11-kv-only.prom").detection.version_range == "0.11"  # the whole page


def test_0_9_0_and_0_9_1_emit_only_the_gpu_usage_name() -> None:
    # kv_cache_usage_perc came with 0.9.2 (vllm PR 18354): an engine-labelled page with gpu_cache_usage_perc alone
    # (its HELP not yet DEPRECATED) is 0.8.5 to 0.10, not 0.8.x only.
    text = (FIXTURES / "gen-0.11-kv-only.prom").read_text().replace(
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.").replace(
        "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc").replace(
        'kv_cache_memory_bytes="None",', "")  # a label of 0.10.2 on: this page is older
    assert interpret(text, None, timestamp=0.0).detection.version_range == "0.8.5-0.10"


def test_0_16_dp2_divides_summed_blocks() -> None:
    poll = read_fixture("gen-0.16-sleep-state-dp2.prom")
    assert poll.detection.version_range == "0.11-0.25"  # sleep state and its labels: 0.11.1 writes them too
    e0, e1 = poll.readings
    assert (e0.engine, e1.engine) == ("0", "1")
    # num_gpu_blocks=20000 is the sum over 2 engines: 10000 blocks × 16 tokens each.
    assert (e0.num_gpu_blocks, e0.kv_capacity_tokens) == (10000.0, 160000.0)
    assert (e1.kv_usage_ratio, e1.requests_running, e1.requests_waiting) == (0.97, 30.0, 5.0)


def test_a_dp_page_missing_an_engines_set_still_divides_the_sum_by_its_engines() -> None:
    # engine 1's cache_config_info set missing: the summed 20,000 blocks were engine 0's alone
    text = "".join(line + "\n" for line in (FIXTURES / "gen-0.16-sleep-state-dp2.prom").read_text().splitlines()
                   if not (line.startswith("vllm:cache_config_info") and 'engine="1"' in line))
    e0, e1 = interpret(text, None, timestamp=0.0).readings
    assert (e0.num_gpu_blocks, e0.kv_capacity_tokens) == (10000.0, 160000.0)
    assert e1.kv_capacity_tokens is None


def test_0_33_capacity_labels_win_and_histograms() -> None:
    poll = read_fixture("gen-0.33-dp2-capacity-labels.prom")
    assert poll.detection.version_range == ">=0.21"
    # CacheConfig's prefix_match_unit (from 0.26.0) or cache_hit_alignment_tokens (0.32.0) on the page: the range
    # narrows to the era the capacity rules were already read for (it said ">=0.21")
    for label in ("prefix_match_unit", "cache_hit_alignment_tokens"):
        text = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text().replace(
            "vllm:cache_config_info{", f'vllm:cache_config_info{{{label}="16",')
        assert interpret(text, None, timestamp=0.0).detection.version_range == ">=0.26", label
    e0, e1 = poll.readings
    assert (e0.kv_capacity_tokens, e0.kv_max_concurrency, e0.num_gpu_blocks) == (163840.0, 20.0, 10240.0)
    assert dict(e0.waiting_by_reason) == {"capacity": 3.0, "deferred": 1.0}
    assert (e0.request_prompt_tokens_sum, e0.request_prompt_tokens_count) == (200000.0, 100.0)
    assert (e0.request_generation_tokens_sum, e0.request_generation_tokens_count) == (50000.0, 100.0)
    assert e1.request_generation_tokens_sum is None
    assert (e0.preemptions_total, e1.prefix_cache_hits_total) == (42.0, 1500.0)
    assert e0.process_start_time_seconds == e1.process_start_time_seconds == 1.79e9
    # The length histograms' buckets (the forecast's request-size tail, v7), per engine.
    prompt = e0.lengths["prompt"]
    assert (prompt.bounds, prompt.cumulative, prompt.count) == ((1000.0, math.inf), (50.0, 100.0), 100.0)
    assert e0.lengths["generation"].cumulative == (100.0,)
    assert e1.lengths["prompt"].cumulative == (0.0, 0.0) and "generation" not in e1.lengths


def test_a_page_merged_with_kserves_queue_proxy_reads_the_engines_start_in_either_order() -> None:
    # The proxy's own process_start_time_seconds is unlabelled, the server's carries the revision's labels: the
    # proxy's block last used to be read as the engine's start (a restart seen, or one hidden).
    text = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    engines = text.replace("process_start_time_seconds 1.79e+09",
                           'process_start_time_seconds{revision_name="r1"} 1.79e+09')
    proxy = ("# HELP process_start_time_seconds Start time.\n# TYPE process_start_time_seconds gauge\n"
             "process_start_time_seconds 1.5e+09\n")
    wanted = vllm.wanted_for(None)
    for page in (proxy + engines, engines + proxy):
        poll = vllm.read(parse(page, wanted), None, timestamp=100.0)
        assert [r.process_start_time_seconds for r in poll.readings] == [1.79e9, 1.79e9]
    # two labelled copies that disagree say nothing of the engine's start
    both = engines.replace('{revision_name="r1"} 1.79e+09',
                           '{revision_name="r1"} 1.79e+09\nprocess_start_time_seconds{revision_name="r2"} 1.8e+09')
    assert {r.process_start_time_seconds for r in vllm.read(parse(both, wanted), None, timestamp=100.0).readings} \
        == {None}


def test_the_sidecar_skips_the_length_buckets_unless_asked() -> None:
    from kvwatch.engines.detect import wanted_for

    text = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    for latency in (False, True):
        skipped = only_engine0(vllm.read(parse(text, wanted_for(latency=latency)), timestamp=0.0))
        asked = only_engine0(vllm.read(parse(text, wanted_for(latency=latency, lengths=True)), timestamp=0.0))
        assert dict(skipped.lengths) == {} and skipped.request_prompt_tokens_sum == 200000.0
        assert skipped.request_generation_tokens_count == 100.0
        assert asked.lengths["prompt"].cumulative == (50.0, 100.0)


def only_engine0(poll: Poll) -> Reading:
    return next(r for r in poll.readings if r.engine == "0")


def test_length_buckets_reach_the_forecast_sample_through_the_wire() -> None:
    # The simulator rendered as vLLM (1-2-5 bounds up to max-model-len), read by the adapter: the forecast
    # sample's cumulative bucket counts are the simulator's own.
    from kvwatch.backtest.runner import engine_config, sample_from, sample_through_wire
    from kvwatch.sim.buckets import build_1_2_5_buckets
    from kvwatch.sim.engine import Request, Simulator

    sim = Simulator(engine_config(4000), seed=1)
    sim.submit([Request(float(i), 30 + 700 * i, 5 + 40 * i) for i in range(12)])
    sim.run_until(600.0)
    snap = sim.snapshot()[0]
    wire = sample_through_wire(snap, "vllm", restarted=False)
    bounds = (*(float(b) for b in build_1_2_5_buckets(8192)), math.inf)
    direct = sample_from(snap, restarted=False, length_bounds=bounds)
    assert wire.prompt_length_bounds == direct.prompt_length_bounds == bounds
    assert wire.prompt_length_cumulative == direct.prompt_length_cumulative
    assert wire.generation_length_cumulative == direct.generation_length_cumulative
    assert direct.prompt_length_cumulative is not None and direct.prompt_length_cumulative[-1] == 12.0


def test_multiprocess_pid_gauges_are_combined() -> None:
    poll = read_fixture("gen-multiprocess-pid.prom")
    r = only(poll)
    # Each API-server process holds a whole-engine snapshot from the last step it got stats of (2 and 3 waiting,
    # usage 0.4 and 0.6): 0.2 apart, one is stale even with 7 requests running, and which cannot be told, so
    # unknown; a count's copies that disagree stay unknown too; never the sum 5.
    assert (r.requests_waiting, r.kv_usage_ratio) == (None, None)
    assert r.requests_running == 7.0
    assert (r.num_gpu_blocks, r.kv_capacity_tokens) == (500.0, 8000.0)  # cache_config_info's pid copies agree
    assert (r.request_prompt_tokens_sum, r.request_prompt_tokens_count) == (3000.0, 3.0)


def test_pid_copies_that_disagree_are_unknown_never_the_largest_or_the_sum() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.9\n'
        'vllm:num_requests_running{engine="0",model_name="m",pid="1"} 12\n'
        'vllm:num_requests_running{engine="0",model_name="m",pid="2"} 12\n'
        'vllm:num_requests_waiting{engine="0",model_name="m",pid="1"} 3\n'
        'vllm:num_requests_waiting{engine="0",model_name="m",pid="2"} NaN\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",pid="1",reason="capacity"} 4\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",pid="2",reason="capacity"} 3\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",pid="1",reason="deferred"} 1\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",pid="2",reason="deferred"} 1\n'
    )
    r = only(vllm.read(parse(text), timestamp=0.0))
    assert r.requests_running == 12.0  # copies that agree are that value, not 24
    assert r.requests_waiting is None  # a NaN copy may be the newest
    assert dict(r.waiting_by_reason) == {}  # one reason unknown: the split is unknown


def test_a_busy_engines_close_usage_copies_read_as_the_largest_and_far_ones_as_unknown() -> None:
    # Under load the front-ends serving requests get stats within milliseconds and their copies differ slightly:
    # unknown on every busy poll would blind the sidecar on vLLM 0.11.0 with several API servers. A copy far from
    # the other is a front-end without requests keeping an old spell's figure (0.97 beside 0.03 read as full).
    busy = (FIXTURES / "gen-0.11.0-multiproc-pid-disagree.prom").read_text().replace(
        'vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 38.0')
    close = busy.replace('pid="18257"} 0.0', 'pid="18257"} 0.9')
    poll = interpret(close, None, timestamp=0.0)
    assert only(poll).kv_usage_ratio == 0.92 and poll.undetermined == ()
    far = interpret(busy, None, timestamp=0.0)
    assert only(far).kv_usage_ratio is None and far.undetermined


def test_an_idle_engines_stale_pid_copy_is_not_its_usage() -> None:
    # vLLM 0.11.0, --api-server-count 2, idle: the front-end that got the idle step's stats says 0, the other still
    # holds a busy step's 0.92. The largest copy read an idle engine as 92 % full (a leak finding at >= 95 %).
    poll = interpret((FIXTURES / "gen-0.11.0-multiproc-pid-disagree.prom").read_text(), None, timestamp=0.0)
    r = only(poll)
    assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting) == (None, 0.0, 0.0)
    assert r.kv_capacity_tokens == 320000.0 and r.kv_used_tokens is None
    assert poll.implausible == ()  # unknown, not a value the engine could not hold: kvwatch_implausible_values
    assert poll.detection.usage_metric == "vllm:kv_cache_usage_perc"
    ((key, field, why),) = poll.undetermined
    assert (key, field) == (r.key, "kv_usage_ratio") and "pid 18246: 0.92" in why and "pid 18257: 0" in why
    found = {f["id"]: f["message"] for f in build_report(poll)["findings"]}
    assert found["usage_unknown"] == why  # not "No KV usage metric found"


def test_disagreeing_pid_copies_fall_back_to_the_old_names_current_copy() -> None:
    # 0.9.2-0.10.x export the same figure under the old name too, declared mostrecent (one current copy, no
    # pid; vllm/v1/metrics/loggers.py): that is the engine's usage, not a guess.
    text = (FIXTURES / "gen-0.11.0-multiproc-pid-disagree.prom").read_text() + (
        "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.0\n')
    poll = interpret(text, None, timestamp=0.0)
    assert only(poll).kv_usage_ratio == 0.0 and poll.undetermined == ()
    assert poll.detection.usage_metric == "vllm:gpu_cache_usage_perc"
    # An operator's --usage-metric is never replaced.
    chosen = SourceOverrides.from_strings(usage="vllm:kv_cache_usage_perc")
    assert only(interpret(text, chosen, timestamp=0.0)).kv_usage_ratio is None
    # Copies that agree read the old name too: the source follows the page's shape, not its values (it flipped
    # between the two names from one poll to the next, churning kvwatch_source_info).
    agreeing = (FIXTURES / "gen-0.11.0-multiproc-pid-agree.prom").read_text() + (
        'vllm:gpu_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.92\n')
    assert interpret(agreeing, None, timestamp=0.0).detection.usage_metric == "vllm:gpu_cache_usage_perc"


def test_pid_copies_that_agree_collapse_to_their_value() -> None:
    poll = interpret((FIXTURES / "gen-0.11.0-multiproc-pid-agree.prom").read_text(), None, timestamp=0.0)
    r = only(poll)
    assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting) == (0.92, 40.0, 5.0)
    assert r.prompt_tokens_total == 10000.0  # counters: prometheus_client sums the processes, no pid


def test_duplicate_series_are_a_parse_error_not_last_wins() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 4\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 9\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1\n'
    )
    with pytest.raises(ParseError, match="line 2: duplicate series"):
        vllm.read(parse(text, vllm.wanted_for()), timestamp=0.0)


def test_overridden_usage_name_with_label_matcher() -> None:
    text = (
        'gpu_cache_usage_sys{model_name="m",kind="gpu"} 0.7\n'
        'gpu_cache_usage_sys{model_name="m",kind="cpu"} 0.1\n'
        'vllm:num_requests_running{model_name="m"} 3\n'
    )
    overrides = SourceOverrides.from_strings(usage='gpu_cache_usage_sys{kind="gpu"}')
    poll = vllm.read(parse(text, vllm.wanted_for(overrides)), overrides, timestamp=0.0)
    assert poll.detection.usage_metric == 'gpu_cache_usage_sys{kind="gpu"}'
    assert only(poll).kv_usage_ratio == 0.7


def test_override_wins_over_detected_name() -> None:
    text = (FIXTURES / "gen-0.9-both-usage-names.prom").read_text().replace(
        'vllm:gpu_cache_usage_perc{engine="0",model_name="qwen3-8b"} 0.25',
        'vllm:gpu_cache_usage_perc{engine="0",model_name="qwen3-8b"} 0.75')
    overrides = SourceOverrides.from_strings(usage="vllm:gpu_cache_usage_perc", waiting="vllm:num_requests_running")
    r = only(vllm.read(parse(text), overrides, timestamp=0.0))
    assert (r.kv_usage_ratio, r.requests_waiting) == (0.75, 20.0)


def test_proxy_metric_without_labels_gets_a_named_series() -> None:
    overrides = SourceOverrides.from_strings(usage="kv_usage", running="running", waiting="waiting")
    poll = vllm.read(parse("kv_usage 0.5\nrunning 2\nwaiting 1\n"), overrides, timestamp=0.0)
    r = only(poll)
    assert (r.model_name, r.engine, r.kv_usage_ratio, r.requests_waiting) == ("unknown", "0", 0.5, 1.0)


@pytest.mark.parametrize("text", ["", "# HELP x y\n", "node_load1 0.5\nprocess_start_time_seconds 1\n"])
def test_not_vllm_is_unrecognised(text: str) -> None:
    with pytest.raises(UnrecognisedPayload, match="vllm"):
        vllm.read(parse(text), timestamp=0.0)


def test_vllm_without_core_gauges_is_unrecognised() -> None:
    with pytest.raises(UnrecognisedPayload, match="no vllm:kv_cache_usage_perc"):
        vllm.read(parse('vllm:prompt_tokens_total{model_name="m"} 1\n'), timestamp=0.0)


def test_selector_parsing() -> None:
    s = Selector.parse('vllm:x{a="1", b="q\\"x"}')
    assert (s.name, dict(s.labels)) == ("vllm:x", {"a": "1", "b": 'q"x'})
    assert s.matches({"a": "1", "b": 'q"x', "c": "z"}) and not s.matches({"a": "1"})
    with pytest.raises(ValueError):
        Selector.parse("not a name{")
    # The exposition format's escapes: "\n" is a new-line (it stayed two characters, so such a value could never be
    # picked), and the selector written back (logs, kvwatch_source_info) reads as itself.
    for text, value in (('m{gpu="a\\nb"}', "a\nb"), ('m{gpu="x\\\\"}', "x\\"), ('m{gpu="q\\"q"}', 'q"q')):
        s = Selector.parse(text)
        assert s.labels["gpu"] == value and Selector.parse(str(s)) == s and str(s) == text


_VLLM_NAMES = sorted(vllm.FAMILIES)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from([*_VLLM_NAMES, "vllm:request_prompt_tokens_sum", "gpu_cache_usage_sys"]),
    st.dictionaries(st.sampled_from(["model_name", "engine", "pid", "reason", "finished_reason", "num_gpu_blocks",
                                     "block_size", "kv_cache_size_tokens", "enable_prefix_caching"]),
                    st.sampled_from(["0", "1", "m", "None", "nan", "-5", "True", "", "1e400"]), max_size=4),
    st.sampled_from(["0", "1", "NaN", "+Inf", "-Inf", "-3", "1e308"])), max_size=12))
def test_adapter_only_raises_unrecognised(samples: list[tuple[str, dict[str, str], str]]) -> None:
    lines = {}
    for name, labels, value in samples:
        body = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines[f"{name}{{{body}}}"] = f"{name}{{{body}}} {value}\n"  # one line per series (duplicates are errors)
    overrides = SourceOverrides.from_strings(usage="gpu_cache_usage_sys")
    with contextlib.suppress(UnrecognisedPayload):
        vllm.read(parse("".join(lines.values())), overrides, timestamp=0.0)


PROXY = """\
# TYPE proxy_queue summary
proxy_queue_count{model_name="m"} 7
proxy_queue_sum{model_name="m"} 70
# TYPE proxy_running histogram
proxy_running_bucket{model_name="m",le="+Inf"} 3
proxy_running_count{model_name="m"} 3
proxy_running_sum{model_name="m"} 30
# TYPE proxy_served counter
proxy_served_total{model_name="m"} 12
"""


def test_overrides_may_name_a_histogram_summary_or_counter_sample() -> None:
    # Through the parser's family filter, as a poll does: the families are proxy_queue and proxy_running.
    overrides = SourceOverrides.from_strings(usage="proxy_served_total", running="proxy_running_count",
                                             waiting="proxy_queue_count")
    r = only(vllm.read(parse(PROXY, vllm.wanted_for(overrides)), overrides, timestamp=0.0))
    assert (r.requests_running, r.requests_waiting, r.kv_usage_ratio) == (3.0, 7.0, 12.0)


def test_a_payload_of_override_samples_alone_is_recognised() -> None:
    overrides = SourceOverrides.from_strings(waiting="proxy_queue_count")
    assert only(vllm.read(parse(PROXY, vllm.wanted_for(overrides)), overrides, timestamp=0.0)).requests_waiting == 7.0


# The vLLM release (era) each fixture comes from: its first comment line, or the help texts it matches.
FIXTURE_ERAS = {
    "gen-0.11-kv-only.prom": "0.11",
    "gen-0.11.1-sleep-state.prom": "0.11",
    "gen-0.16-sleep-state-dp2.prom": "0.14-0.16",
    "gen-0.33-dp2-capacity-labels.prom": "0.26+",
    "gen-0.34-extensible-kv.prom": "0.26+",
    "gen-0.8.5-engine-label.prom": "0.8.5-0.8.x",
    "gen-0.9-both-usage-names.prom": "0.9-0.10",
    "gen-multiprocess-pid.prom": "0.9-0.10",
    "gen-0.11.0-multiproc-pid-agree.prom": "0.11",
    "gen-0.11.0-multiproc-pid-disagree.prom": "0.11",
    "gen-0.11.0-gptoss-issue28924.prom": "0.11",  # a real 0.11.0 cache_config_info: swap_space and swap_space_bytes
    "gen-0.20.2-gptoss-two-groups.prom": "0.17-0.20",
    "gen-0.14-pd-decode-nixl.prom": "0.14-0.16",  # a few families only: detected as 0.12-0.25
    "neuron-v0-block1024.prom": "v0",  # V0 help texts and swap_space_bytes (a vLLM-Neuron capture)
    "v0-engine-qwenvl.prom": "v0",
    "v0.10.0-glm45-deprecated-and-new.prom": "0.9-0.10",
    "v1-0.8-early-model-name-only.prom": "0.7.3-0.8.4",
    # Triton's backend copies V0's names and help texts, whatever vLLM runs: detected as unknown (any era holds)
    "gen-triton-vllm-backend.prom": "v0",
}
NOT_AN_ENGINE = {"gen-production-stack-router.prom"}  # a router's page: refused (see below)
# NIM's page: vLLM's families without the prefix, of no one vLLM version (test_nim_serves_vllms_families_...)
UNPREFIXED = {"gen-nim-llm.prom"}
# vLLM-Omni's page: engine relabelled stage + replica, a short cache_config_info (test_vllm_omni_stages_...)
STAGED = {"gen-omni-two-stages.prom"}


def family_subsets(text: str) -> dict[str, str]:
    """The payload cut into one text per family: its HELP/TYPE lines and its samples."""
    families: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            current = line.split()[2]
            families.setdefault(current, []).append(line)
        elif line and not line.startswith("#"):
            name = line.split("{")[0].split()[0]
            if current is None or not name.startswith(current):
                current = next((name[: -len(x)] for x in vllm.SAMPLE_SUFFIXES if name.endswith(x)), name)
            families.setdefault(current, []).append(line)
    return {name: "\n".join(lines) + "\n" for name, lines in families.items()}


def test_every_fixture_is_in_its_detected_range_and_the_table_covers_them() -> None:
    assert set(FIXTURE_ERAS) | NOT_AN_ENGINE | UNPREFIXED | STAGED == {p.name for p in FIXTURES.glob("*.prom")}
    for name, era in FIXTURE_ERAS.items():
        detected = vllm.detect(parse((FIXTURES / name).read_text())).version_range
        assert era in vllm.eras_in_range(detected), (name, detected)


@pytest.mark.parametrize("fixture", sorted(FIXTURE_ERAS))
def test_every_single_family_subset_gets_a_range_holding_the_true_version(fixture: str) -> None:
    subsets = family_subsets((FIXTURES / fixture).read_text())
    assert len(subsets) >= 3
    checked = 0
    for family, text in subsets.items():
        try:
            detected = vllm.detect(parse(text)).version_range
        except UnrecognisedPayload:
            # Only a non-vLLM family, or the *_created samples kvwatch ignores, may be unrecognised.
            assert not family.startswith("vllm:") or family.endswith("_created"), family
            continue
        checked += 1
        assert FIXTURE_ERAS[fixture] in vllm.eras_in_range(detected), (fixture, family, detected)
    assert checked >= 2


def test_partial_payloads_of_the_issue_get_honest_ranges() -> None:
    # A lone running gauge with an engine label (a 0.20 capture): any V1 from 0.8.5 on, not "0.8.5-0.8.x".
    running = ('# HELP vllm:num_requests_running Number of requests in model execution batches.\n'
               '# TYPE vllm:num_requests_running gauge\n'
               'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n')
    assert vllm.detect(parse(running)).version_range == ">=0.8.5"
    # A lone waiting gauge with model_name only (a 0.5.3 V0 capture): V0 or early V1, not "v1-0.8-early".
    waiting = ('# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n'
               '# TYPE vllm:num_requests_waiting gauge\n'
               'vllm:num_requests_waiting{model_name="m"} 0.0\n')
    assert vllm.detect(parse(waiting)).version_range == "<=0.10"
    assert "v0" in vllm.eras_in_range("<=0.10")
    # HELP and TYPE alone: nothing rules any era out.
    bare = "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    assert vllm.detect(parse(bare)).version_range == "unknown"


def test_ranges_round_trip_and_contradictions_are_unknown() -> None:
    for i in range(len(vllm.ERAS)):
        for j in range(i, len(vllm.ERAS)):
            eras = frozenset(e[0] for e in vllm.ERAS[i:j + 1])
            assert vllm.eras_in_range(vllm.format_range(eras)) >= eras
    both = ('vllm:num_requests_swapped{model_name="m"} 0\n'  # V0 only
            'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1\n')  # 0.12 on
    assert vllm.detect(parse(both)).version_range == "unknown"


def test_prefix_unit_is_unknown_when_the_range_does_not_tell_it() -> None:
    text = 'vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 10\n' \
           'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
    poll = vllm.read(parse(text), timestamp=0.0)
    assert poll.detection.version_range == "0.8.5-0.11"
    assert poll.readings[0].prefix_cache_unit is None


def test_an_empty_model_name_is_no_model_name() -> None:
    # Prometheus treats label="" as the label being absent; kvwatch read such a page as a series with nothing in it.
    text = ('vllm:num_requests_running{engine="0",model_name=""} 7\n'
            'vllm:num_requests_waiting{engine="0",model_name=""} 3\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name=""} 0.96\n')
    (reading,) = interpret(text, None, timestamp=0.0).readings
    assert (reading.model_name, reading.kv_usage_ratio, reading.requests_running, reading.requests_waiting) == (
        "unknown", 0.96, 7.0, 3.0)


def test_two_pods_cache_configs_for_one_engine_leave_its_capacity_unknown() -> None:
    # A proxy's page of two pods, each vLLM with engine "0": whose blocks are whose cannot be told (the last
    # config used to win for both models).
    lines = []
    for pod, model, blocks in (("a", "llama", 40000), ("b", "qwen", 5000)):
        lines += [f'vllm:num_requests_running{{engine="0",model_name="{model}",pod="{pod}"}} 8',
                  f'vllm:num_requests_waiting{{engine="0",model_name="{model}",pod="{pod}"}} 0',
                  f'vllm:kv_cache_usage_perc{{engine="0",model_name="{model}",pod="{pod}"}} 0.3',
                  f'vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="{blocks}",pod="{pod}"}} 1']
    readings = interpret("\n".join(lines) + "\n", None, timestamp=0.0).readings
    assert {r.model_name: r.kv_capacity_tokens for r in readings} == {"llama": None, "qwen": None}
    one_pod = "\n".join(line for line in lines if 'pod="a"' in line) + "\n"
    assert interpret(one_pod, None, timestamp=0.0).readings[0].kv_capacity_tokens == 40000 * 16


def test_tritons_vllm_backend_names_the_model_in_its_model_label() -> None:
    poll = read_fixture("gen-triton-vllm-backend.prom")
    by_model = {r.model_name: r for r in poll.readings}
    assert set(by_model) == {"llama3_8b", "mistral_7b"}  # two models, not one "unknown" mix
    llama = by_model["llama3_8b"]
    assert (llama.kv_usage_ratio, llama.requests_running, llama.requests_waiting, llama.preemptions_total) == \
        (0.98, 30.0, 9.0, 14.0)
    assert by_model["mistral_7b"].requests_running == 2.0
    # V0's HELP texts are the backend's own, whatever vLLM runs behind it: no version is told ("v0" before)
    assert poll.detection.version_range == "unknown"


def test_a_router_page_of_several_backends_is_refused_not_summed() -> None:
    with pytest.raises(UnrecognisedPayload, match=r"num_requests_running has 2 samples .* differ in server"):
        read_fixture("gen-production-stack-router.prom")


def test_a_federated_page_of_two_pods_is_refused_naming_the_label() -> None:
    pods = ("10.0.0.1:8000", "10.0.0.2:8000")
    text = "".join(
        f"# TYPE {name} gauge\n" + "".join(
            f'{name}{{engine="0",instance="{pod}",model_name="llama"}} {value}\n' for pod in pods)
        for name, value in (("vllm:num_requests_running", 20), ("vllm:num_requests_waiting", 0),
                            ("vllm:kv_cache_usage_perc", 0.5)))
    with pytest.raises(UnrecognisedPayload, match="differ in instance: this page aggregates several servers"):
        vllm.read(parse(text), None, timestamp=100.0)


@pytest.mark.parametrize(("extra", "missing"), [
    ('vllm:num_requests_running{model_name="llama"} 34', "engine"),
    ('vllm:num_requests_running{engine="",model_name="llama"} 7', "engine"),
    ('vllm:num_requests_running{engine="1"} 5', "model_name"),
    ('vllm:num_requests_running{engine="0",model_name=""} 5', "model_name"),
    ('vllm:num_requests_running 5', "model_name or engine"),
])
def test_a_gauge_copy_without_model_name_or_engine_beside_labelled_ones_is_refused(extra: str, missing: str) -> None:
    # The copy applied to every series: 34 running without engine read 50 and 52 for engines of 16 and 18, up 1.
    page = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    line = next(x for x in page.splitlines() if x.startswith('vllm:num_requests_running{engine="1",model_name="ll'))
    with pytest.raises(UnrecognisedPayload, match=f"vllm:num_requests_running has samples without {missing} beside "
                                                  "samples with it"):
        read_payload(page.replace(line, f"{line}\n{extra}"), timestamp=0.0)
    # A family with the label on none of its samples still applies to every series (a proxy's renamed gauge).
    alone = ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
             "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n"
             "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n")
    (reading,) = read_payload(alone, timestamp=0.0).readings
    assert (reading.requests_running, reading.requests_waiting, reading.kv_usage_ratio) == (3, 1, 0.5)


@pytest.mark.parametrize(("states", "expected"), [
    ({"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}, "awake"),
    ({"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0}, "weights_offloaded"),
    ({"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 1.0}, "discard_all"),
    ({"awake": 0.0}, "asleep"),
    ({}, None),
])
def test_the_sleep_state_is_read_from_its_one_hot_gauge(states: dict[str, float], expected: str | None) -> None:
    text = (FIXTURES / "gen-0.16-sleep-state-dp2.prom").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("vllm:engine_sleep_state{")]
    at = lines.index("# TYPE vllm:engine_sleep_state gauge") + 1
    lines[at:at] = [f'vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="{s}"}} {v}'
                    for s, v in states.items()]
    poll = vllm.read(parse("\n".join(lines) + "\n", vllm.wanted_for(None)), None, timestamp=100.0)
    engine0 = next(r for r in poll.readings if r.engine == "0")
    assert engine0.sleep_state == expected
    assert engine0.asleep is (expected not in (None, "awake"))


def test_prometheus_clients_underscore_escaped_openmetrics_gets_its_own_message() -> None:
    om = ("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
          "# TYPE vllm:num_requests_running gauge\n"
          'vllm_num_requests_running{engine="0",model_name="m"} 3.0\n# EOF\n')
    with pytest.raises(UnrecognisedPayload, match="named vllm_\\* while their # TYPE lines say vllm:\\*"):
        vllm.read(parse(om), None, timestamp=100.0)
    # The "values" escaping (U__, _ as __, : as _3a_) said "renamed: see --usage-metric" instead
    values = om.replace("vllm_num_requests_running", "U__vllm_3a_num__requests__running")
    with pytest.raises(UnrecognisedPayload, match=r"named U__vllm_3a_\* while .* with value escaping"):
        vllm.read(parse(values), None, timestamp=100.0)


@pytest.mark.parametrize("engine", ["²", "١"])  # a superscript (isdigit, not int) and an Arabic-Indic digit
def test_an_engine_label_of_unusual_digits_is_read(engine: str) -> None:
    text = (FIXTURES / "gen-0.11-kv-only.prom").read_text().replace('engine="0"', f'engine="{engine}"')
    poll = vllm.read(parse(text, vllm.wanted_for(None)), None, timestamp=100.0)
    assert {r.engine for r in poll.readings} >= {engine}


def test_an_override_selecting_several_samples_is_told_to_narrow_its_selector() -> None:
    text = ('# TYPE gpu_cache_usage_sys gauge\ngpu_cache_usage_sys{gpu="0"} 0.5\ngpu_cache_usage_sys{gpu="1"} 0.6\n'
            '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 3\n')
    with pytest.raises(UnrecognisedPayload, match=r'--usage-metric gpu_cache_usage_sys selects 2 samples .* '
                                                  r'gpu_cache_usage_sys\{gpu="..."\}'):
        vllm.read(parse(text), SourceOverrides(usage=Selector.parse("gpu_cache_usage_sys")), timestamp=100.0)
    narrowed = SourceOverrides(usage=Selector.parse('gpu_cache_usage_sys{gpu="0"}'))
    assert only(vllm.read(parse(text), narrowed, timestamp=100.0)).kv_usage_ratio == 0.5


def test_a_waiting_override_replaces_vllms_split_of_its_queue_too() -> None:
    # The operator's queue metric (a gateway's) is not vLLM's: vLLM's capacity/deferred split of its own queue
    # read beside it said "5 requests waiting" while the waiting count shown was the override's (or unknown).
    page = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    text = page + 'gateway_queue{engine="0",model_name="llama"} 9\ngateway_queue{engine="1",model_name="llama"} 2\n'
    poll = vllm.read(parse(text), SourceOverrides.from_strings(waiting="gateway_queue"), timestamp=0.0)
    r = next(r for r in poll.readings if r.engine == "0")
    assert r.requests_waiting == 9.0 and dict(r.waiting_by_reason) == {}
    assert r.requests_waiting_for_capacity == 9.0
    # One queue for the whole model on a page of two engines cannot be split over them: unknown for each, with why
    # (it was counted as each engine's: 9 waiting on both).
    poll = vllm.read(parse(page + 'gateway_queue{model_name="llama"} 9\n'),
                     SourceOverrides.from_strings(waiting="gateway_queue"), timestamp=0.0)
    assert [r.requests_waiting for r in poll.readings] == [None, None]
    assert {(key, field) for key, field, _ in poll.undetermined} == {
        (("llama", "0"), "requests_waiting"), (("llama", "1"), "requests_waiting")}
    assert all("gateway_queue has no engine label while the page has engines 0, 1" in why
               for *_, why in poll.undetermined)


def test_the_capacity_metric_names_the_label_the_capacity_came_from() -> None:
    # vLLM 0.8.x labels num_gpu_blocks "None" before the engine core reports it; with an override that is the
    # count, and kvwatch_source_info named num_gpu_blocks anyway.
    text = ('vllm:gpu_cache_usage_perc{model_name="m"} 0.5\nvllm:num_requests_running{model_name="m"} 3\n'
            'vllm:num_requests_waiting{model_name="m"} 0\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="None",num_gpu_blocks_override="4000"} 1.0\n')
    poll = vllm.read(parse(text), timestamp=0.0)
    assert poll.detection.capacity_metric == "vllm:cache_config_info{num_gpu_blocks_override x block_size}"
    unknown = vllm.read(parse(text.replace('num_gpu_blocks_override="4000"', 'num_gpu_blocks_override="None"')),
                        timestamp=0.0)
    assert unknown.detection.capacity_metric is None and unknown.readings[0].kv_capacity_tokens is None


@pytest.mark.parametrize(("latency", "lengths"), [(True, True), (True, False), (False, False)])
def test_a_page_without_type_lines_reads_its_histograms_by_name(latency: bool, lengths: bool) -> None:
    # A saved page with its comments stripped (grep -v '^#'), or a re-exporter that sends no # TYPE: each
    # histogram part is a family of its own. Prometheus reads x_bucket, x_sum and x_count by name whatever the
    # type; kvwatch lost the mean request length and every latency histogram.
    from kvwatch.engines.detect import read_payload

    text = (FIXTURES / "gen-0.20.2-gptoss-two-groups.prom").read_text()
    bare = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    typed = only(read_payload(text, timestamp=1.0, latency=latency, lengths=lengths))
    untyped = only(read_payload(bare, timestamp=1.0, latency=latency, lengths=lengths))
    assert typed.request_prompt_tokens_sum is not None and typed.request_generation_tokens_count is not None
    assert (untyped.request_prompt_tokens_sum, untyped.request_generation_tokens_count) == (
        typed.request_prompt_tokens_sum, typed.request_generation_tokens_count)
    assert dict(untyped.latency) == dict(typed.latency) and (not latency or "e2e" in typed.latency)
    assert dict(untyped.lengths) == dict(typed.lengths) and (not lengths or "prompt" in typed.lengths)
    assert untyped.kv_usage_ratio == typed.kv_usage_ratio


def test_an_empty_engine_label_is_engine_0_as_no_label_is() -> None:
    # Prometheus drops an empty label; kvwatch read engine="" as an engine of its own and exported engine="".
    text = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="",model_name="m"} 3\n'
            '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="",model_name="m"} 1\n'
            '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="",model_name="m"} 0.5\n'
            '# TYPE vllm:e2e_request_latency_seconds histogram\n'
            'vllm:e2e_request_latency_seconds_bucket{engine="",le="1.0",model_name="m"} 2\n'
            'vllm:e2e_request_latency_seconds_bucket{engine="",le="+Inf",model_name="m"} 4\n'
            'vllm:e2e_request_latency_seconds_count{engine="",model_name="m"} 4\n'
            'vllm:e2e_request_latency_seconds_sum{engine="",model_name="m"} 6\n')
    r = only(interpret(text, None, timestamp=1.0))
    assert (r.model_name, r.engine, r.requests_running, r.kv_usage_ratio) == ("m", "0", 3.0, 0.5)
    assert r.latency["e2e"].count == 4.0


def test_nim_serves_vllms_families_without_the_prefix() -> None:
    # NVIDIA NIM for LLMs (/v1/metrics): gpu_cache_usage_perc, num_requests_running, ... without "vllm:". It was
    # refused as unrecognised; the report names the metrics as the page spells them
    text = (FIXTURES / "gen-nim-llm.prom").read_text()
    poll = interpret(text, None, timestamp=0.0)
    (reading,) = poll.readings
    assert (reading.kv_usage_ratio, reading.requests_running, reading.requests_waiting) == (0.97, 24, 6)
    assert poll.detection.usage_metric == "gpu_cache_usage_perc" and "NIM" in poll.detection.version_range
    assert sum(reading.finished_by_reason.values()) == 900
    # A page that is not NIM's keeps its answer: a gauge of that name without a KV usage gauge, or a vLLM page
    with pytest.raises(ScrapeError, match="no vllm"):
        interpret("# TYPE num_requests_running gauge\nnum_requests_running 3\n", None, timestamp=0.0)
    vllm_page = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    assert interpret(vllm_page + "# a comment: num_requests_running\n", None, timestamp=0.0).detection == interpret(
        vllm_page, None, timestamp=0.0).detection


@pytest.mark.parametrize("name", ["gen-0.33-dp2-capacity-labels.prom", "gen-0.11.0-gptoss-issue28924.prom",
                                  "v0-engine-qwenvl.prom"])
def test_vllms_families_with_underscores_for_colons_read_as_vllms(name: str) -> None:
    # An OpenTelemetry collector's or Grafana Alloy's Prometheus exporter writes vllm:x as vllm_x (so does vLLM's own
    # OpenTelemetry naming, vllm/v1/metrics/ray_wrappers.py). It was refused: "no vllm:* ... metrics in the payload
    # (... --disable-log-stats ...)", the wrong thing to look at.
    text = (FIXTURES / name).read_text()
    underscored = text.replace("vllm:", "vllm_")
    own, read = interpret(text, None, timestamp=0.0), interpret(underscored, None, timestamp=0.0)
    assert read.readings == own.readings
    assert read.detection.version_range == f"{own.detection.version_range} (vllm_ prefix)"
    assert read.detection.usage_metric == own.detection.usage_metric.replace("vllm:", "vllm_")
    # An operator's selector in the page's spelling narrows that gauge and reads the rest of the page as well: it
    # turned the spelling off, the queue, the capacity and the counters were lost, and "no count of waiting
    # requests" was said of a page that has one.
    ours = SourceOverrides.from_strings(usage='vllm:kv_cache_usage_perc{engine="0"}')
    theirs = SourceOverrides.from_strings(usage='vllm_kv_cache_usage_perc{engine="0"}')
    if "vllm:kv_cache_usage_perc" in text:
        narrowed, read_narrowed = interpret(text, ours, timestamp=0.0), interpret(underscored, theirs, timestamp=0.0)
        assert read_narrowed.readings == narrowed.readings
        assert read_narrowed.detection.usage_metric == 'vllm_kv_cache_usage_perc{engine="0"}'
        assert any(r.requests_waiting is not None and r.kv_capacity_tokens for r in read_narrowed.readings)
        # A typo is named as typed (it read "vllm:kv_cache_usage_percX", a name the operator never wrote).
        with pytest.raises(UnrecognisedPayload, match=r"--usage-metric vllm_kv_cache_usage_percX matches no sample"):
            read_payload(underscored, SourceOverrides.from_strings(usage="vllm_kv_cache_usage_percX"), timestamp=0.0)
    # prometheus_client's underscore escaping (samples vllm_x under # TYPE vllm:x) keeps its own message.
    escaped = "# TYPE vllm:num_requests_running gauge\nvllm_num_requests_running 3\n"
    assert page_spelling(parse(escaped).names) is None


@pytest.mark.parametrize("name", ["gen-0.11.0-gptoss-issue28924.prom", "gen-0.33-dp2-capacity-labels.prom",
                                  "gen-triton-vllm-backend.prom"])
@pytest.mark.parametrize("scraper_labels", [False, True])
def test_labels_a_scraper_renamed_to_exported_are_the_engines(name: str, scraper_labels: bool) -> None:
    # A Prometheus (or Alloy) that scrapes the page again with target labels of the same names keeps the engine's as
    # exported_engine / exported_model_name (honor_labels: false). Read as they were, gpt-oss's model was "unknown"
    # and its capacity twice as large with no finding, and a data-parallel page was refused as "several servers".
    import re

    text = (FIXTURES / name).read_text()
    renamed = re.sub(r'([{,])(engine|model_name|model)="', r'\1exported_\2="', text)
    assert renamed != text
    if scraper_labels:  # the scraper's own labels of the names it renamed, on every series
        clashing = sorted(set(re.findall(r'exported_(engine|model_name|model)="', renamed)))
        added = "".join(f'{label}="scraper-{label}",' for label in clashing)
        renamed = re.sub(r'^([a-z_:]+)\{', r'\1{' + added, renamed, flags=re.MULTILINE)
    own, read = interpret(text, None, timestamp=0.0), interpret(renamed, None, timestamp=0.0)
    assert read.readings == own.readings and read.detection == own.detection


def test_pages_kvwatch_cannot_read_say_what_they_are() -> None:
    # Ray Serve re-exports vLLM's metrics as ray_vllm_* (vllm/v1/metrics/ray_wrappers.py sanitises ":" to "_"), one
    # set per replica; SGLang's page in OpenMetrics with underscore escaping names its samples sglang_*. Both were
    # "no vllm:* ..." or "no token_usage samples yet (server started without traffic)"
    ray = ('# TYPE ray_vllm_num_requests_running gauge\n'
           'ray_vllm_num_requests_running{ReplicaId="a",engine="0",model_name="q"} 18.0\n')
    with pytest.raises(ScrapeError, match="Ray Serve"):
        interpret(ray, None, timestamp=0.0)
    # SGLang through Ray (its observability/ray_wrappers.py) was "no vllm:*, sglang:* ... metrics in the payload"
    ray_sglang = 'ray_sglang_num_running_reqs{ReplicaId="a",model_name="q",tp_rank="0"} 18.0\n'
    with pytest.raises(ScrapeError, match=r"ray_sglang_\* metrics: sglang's metrics re-exported by Ray Serve.*"
                                          r"ray_sglang_token_usage"):
        interpret(ray_sglang, None, timestamp=0.0)
    sglang = ('# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\n'
              'sglang_num_running_reqs{model_name="Qwen3",tp_rank="0"} 5.0\n# EOF\n')
    with pytest.raises(ScrapeError, match=r"named sglang_\* while their # TYPE lines say sglang:\*"):
        interpret(sglang, None, timestamp=0.0)


def test_nim_read_through_the_override_flags_reads_as_before() -> None:
    # Before NIM was recognised, the override flags named its unprefixed gauges; putting the prefix back made
    # those names vanish and the page was refused ("matches no sample")
    text = (FIXTURES / "gen-nim-llm.prom").read_text()
    overrides = SourceOverrides(usage=Selector("gpu_cache_usage_perc"), running=Selector("num_requests_running"),
                                waiting=Selector("num_requests_waiting"))
    (reading,) = interpret(text, overrides, timestamp=0.0).readings
    assert (reading.kv_usage_ratio, reading.requests_running, reading.requests_waiting) == (0.97, 24, 6)


def test_vllm_omni_stages_are_engines_each_with_its_own_pool(capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM-Omni relabels engine into stage + replica: one server's page was refused as "several
    # servers", and the workaround's selectors lost each stage's capacity
    from kvwatch.cli import main

    text = (FIXTURES / "gen-omni-two-stages.prom").read_text()
    poll = read_payload(text, timestamp=1.0)
    assert "vLLM-Omni" in poll.detection.version_range
    by_engine = {r.engine: r for r in poll.readings}
    assert set(by_engine) == {"0.0", "1.0"}
    assert (by_engine["0.0"].kv_usage_ratio, by_engine["0.0"].kv_capacity_tokens) == (0.91, 128000)
    assert (by_engine["1.0"].requests_waiting, by_engine["1.0"].kv_capacity_tokens) == (0.0, 320000)
    # An operator's selector names the page's own labels, and reads it as it is.
    staged = read_payload(text, SourceOverrides.from_strings(usage='vllm:kv_cache_usage_perc{stage="1"}',
                                                             running='vllm:num_requests_running{stage="1"}',
                                                             waiting='vllm:num_requests_waiting{stage="1"}'),
                          timestamp=1.0)
    assert [r.kv_usage_ratio for r in staged.readings] == [0.2]
    # The stages are a pipeline's engines, not data-parallel ranks: no server total in the advice.
    assert main(["check", "--file", str(FIXTURES / "gen-omni-two-stages.prom"), "--json"]) == 0
    fixes = json.loads(capsys.readouterr().out)["series"][0]["advice"]
    assert fixes and "data-parallel" not in fixes[0]["message"]


def test_a_block_count_label_python_would_read_but_vllm_never_writes_is_unknown() -> None:
    # float() reads "20_48", " 2048" and full-width digits, and 12.5 blocks were a capacity of 100 tokens.
    # vLLM writes str() of an int or float; a fraction of a block is impossible and counted.
    assert [vllm.label_number(t) for t in ("2048", "0.9", "1e3", "-1", ".5")] == [2048.0, 0.9, 1000.0, -1.0, 0.5]
    assert [vllm.label_number(t) for t in ("20_48", " 2048", "２０４８", "inf", "nan", "abc", "None", "")] == [None] * 8
    from kvwatch.plausible import check_reading

    checked, dropped = check_reading(Reading("m", kv_usage_ratio=0.5, block_size=12.5, max_model_len=math.nan))
    assert checked.block_size is None and checked.max_model_len is None  # (a NaN length is no crash either)
    assert [name for name, _ in dropped] == ["block_size", "max_model_len"]
    text = (FIXTURES / "gen-0.16-sleep-state-dp2.prom").read_text()
    for garbage in ("abc", "inf", "12.5"):  # read as absent, uncounted, before
        poll = interpret(text.replace('num_gpu_blocks="20000"', f'num_gpu_blocks="{garbage}"'), None, timestamp=0.0)
        assert all(r.num_gpu_blocks is None and r.kv_capacity_tokens is None for r in poll.readings)
        assert {name for _, name, _ in poll.implausible} == {"num_gpu_blocks", "kv_capacity_tokens"}
    odd = interpret(text.replace('num_gpu_blocks="20000"', 'num_gpu_blocks="20001"'), None, timestamp=0.0)
    assert odd.implausible == () and odd.readings[0].num_gpu_blocks == 10000.5  # a DP total over 2 engines


def test_a_cache_config_labelled_engine_empty_is_every_engines() -> None:
    # A 0.11 development line's PrometheusStatLogger wrote metrics_info["engine"] = "" on its one cache_config_info
    # for every engine: keyed by "", no series ("engine" "0") found it and the capacity went unknown.
    text = (FIXTURES / "gen-0.11.0-gptoss-issue28924.prom").read_text()
    text = text.replace('engine="0",gpu_memory_utilization', 'engine="",gpu_memory_utilization')
    assert 'engine=""' in text
    reading = vllm.read(parse(text, vllm.wanted_for(None)), None, timestamp=0.0).readings[0]
    assert reading.num_gpu_blocks == 9271 and reading.cache_config["engine"] == ""
    # With data parallelism that one set carries every engine's blocks summed (vLLM's front-end sums them): each
    # engine gets its share, not the total (twice the capacity on two engines).
    lines = []
    for line in text.replace('num_gpu_blocks="9271"', 'num_gpu_blocks="18542"').splitlines():
        lines.append(line)
        if 'engine="0"' in line:
            lines.append(line.replace('engine="0"', 'engine="1"'))
    readings = vllm.read(parse("\n".join(lines) + "\n", vllm.wanted_for(None)), None, timestamp=0.0).readings
    assert [(r.engine, r.num_gpu_blocks) for r in readings] == [("0", 9271), ("1", 9271)]
    # Beside an engine's own set it is nobody's share: engine 0's blocks were halved.
    both = (FIXTURES / "gen-0.11.0-gptoss-issue28924.prom").read_text()
    config = next(line for line in both.splitlines() if line.startswith("vllm:cache_config_info{"))
    both = both.replace(config, config + "\n" + config.replace('engine="0"', 'engine=""'))
    reading = vllm.read(parse(both, vllm.wanted_for(None)), None, timestamp=0.0).readings[0]
    assert reading.num_gpu_blocks == 9271 and reading.cache_config["engine"] == "0"


def test_two_configurations_for_one_engine_leave_its_capacity_undetermined_and_say_why() -> None:
    # A proxy's page of several pods, each with its engine "0": the capacity is unknown, and the poll says why (the
    # sidecar's history must not fill in the last configuration)
    text = (FIXTURES / "gen-0.11.0-gptoss-issue28924.prom").read_text()
    config = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    poll = vllm.read(parse(text.replace(config, config + "\n" + config.replace('num_gpu_blocks="9271"',
                                                                             'num_gpu_blocks="9000"')),
                           vllm.wanted_for(None)), None, timestamp=0.0)
    assert poll.readings[0].kv_capacity_tokens is None
    assert [(name, why) for _, name, why in poll.undetermined] == [("kv_capacity_tokens", vllm.CONFLICTING_CONFIGS)]
    assert vllm.read(parse(text, vllm.wanted_for(None)), None, timestamp=0.0).undetermined == ()
    assert poll.readings[0].capacity_source == CAPACITY_UNDETERMINED  # the formula fills nothing in either
    # Only the engine the page holds two for: engine 1, without a set of its own, is no conflict
    lines = []
    for line in text.splitlines():
        lines.append(line)
        if 'engine="0"' in line and not line.startswith("vllm:cache_config_info"):
            lines.append(line.replace('engine="0"', 'engine="1"'))
    page = "\n".join(lines).replace(config, config + "\n" + config.replace('num_gpu_blocks="9271"',
                                                                          'num_gpu_blocks="9000"')) + "\n"
    both = vllm.read(parse(page, vllm.wanted_for(None)), None, timestamp=0.0)
    assert [(key[1], name) for key, name, _ in both.undetermined] == [("0", "kv_capacity_tokens")]
    # with an engine="" set beside: still unknown, not that set's
    shared = page.replace(config, config + "\n" + config.replace('engine="0"', 'engine=""'), 1)
    torn = vllm.read(parse(shared, vllm.wanted_for(None)), None, timestamp=0.0).readings[0]
    assert torn.engine == "0" and torn.kv_capacity_tokens is None


def test_a_respelled_page_is_read_with_the_same_filter_and_other_pages_not_at_all() -> None:
    # Reading NIM's unprefixed names by adding them to every parse's filter read the latency
    # histograms a poll leaves out (serve reads them once a minute) on NIM pages, and on any other page parsed a
    # foreign num_requests_running: two series of it with one label set refused a whole vLLM page as a duplicate.
    nim = (FIXTURES / "gen-nim-llm.prom").read_text()
    assert read_payload(nim, timestamp=0.0, latency=False).readings[0].latency == {}
    assert read_payload(nim, timestamp=0.0).readings[0].latency
    page = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    foreign = '# TYPE num_requests_running gauge\nnum_requests_running{pool="a"} 1\nnum_requests_running{pool="a"} 2\n'
    assert read_payload(page + foreign, timestamp=0.0).readings == read_payload(page, timestamp=0.0).readings


def test_blocks_without_a_block_size_name_no_capacity_source_and_the_finding_says_which_is_missing() -> None:
    # the detection named num_gpu_blocks x block_size and the finding blamed num_gpu_blocks
    page = ('vllm:num_requests_running{engine="0",model_name="m"} 3\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
            'vllm:cache_config_info{cache_dtype="fp8_e4m3",engine="0",num_gpu_blocks="1000"} 1.0\n')
    poll = interpret(page, None, timestamp=0.0)
    assert poll.detection.capacity_metric is None and poll.readings[0].kv_capacity_tokens is None
    overridden = interpret(page.replace('num_gpu_blocks="1000"', 'num_gpu_blocks="1000",num_gpu_blocks_override="500"'),
                           None, timestamp=0.0)
    assert overridden.detection.capacity_metric is None
    (finding,) = [f for f in build_report(poll)["findings"] if f["id"] == "capacity_unknown"]
    assert "num_gpu_blocks or block_size is None or absent" in finding["message"]


def test_a_usage_family_declared_without_a_sample_is_unknown_for_that_reason() -> None:
    # the finding said "No KV usage metric found: pass --usage-metric", which names the same one
    page = ("# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 0\n')
    poll = interpret(page, None, timestamp=0.0)
    assert poll.readings[0].kv_usage_ratio is None
    (finding,) = [f for f in build_report(poll)["findings"] if f["id"] == "usage_unknown"]
    assert "vllm:kv_cache_usage_perc is declared with no sample" in finding["message"]
    assert "No KV usage metric found" not in finding["message"]


def test_a_renamed_histogram_is_read_whole_under_the_engines_name() -> None:
    # --rename-metrics names a family: its _bucket, _sum and _count samples follow it.
    from kvwatch.engines.detect import read_payload

    text = (FIXTURES / "gen-0.20.2-gptoss-two-groups.prom").read_text()
    own = read_payload(text, timestamp=0.0).readings
    proxied = text.replace("vllm:time_to_first_token_seconds", "proxy_ttft")
    assert "ttft" not in read_payload(proxied, timestamp=0.0).readings[0].latency
    renamed = read_payload(proxied, SourceOverrides.from_strings(renames="proxy_ttft=vllm:time_to_first_token_seconds"),
                           timestamp=0.0)
    assert renamed.readings == own and "ttft" in own[0].latency
