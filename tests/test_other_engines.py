"""SGLang and TensorRT-LLM adapters and engine detection, on fixtures built from each engine's own sources
(tests/fixtures/sglang-metrics/README.md, tests/fixtures/tensorrt-llm-metrics/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.check import build_report
from kvwatch.cli import main
from kvwatch.engines import SourceOverrides, UnrecognisedPayload, sglang
from kvwatch.engines.detect import read_payload
from kvwatch.exposition import ParseError, parse
from kvwatch.payload import ScrapeError, interpret

FIXTURES = Path(__file__).parent / "fixtures"
SGLANG = FIXTURES / "sglang-metrics"
TRTLLM = FIXTURES / "tensorrt-llm-metrics"


def poll(path: Path, overrides: SourceOverrides | None = None):
    return read_payload(path.read_text(), overrides, timestamp=1.0)


def test_sglang_2024_name_label_generation() -> None:
    p = poll(SGLANG / "v0.3-2024-name-label.prom")
    d = p.detection
    assert (d.engine_kind, d.version_range) == ("sglang", "2024-name-label")
    assert (d.usage_metric, d.running_metric, d.waiting_metric, d.capacity_metric) == (
        "sglang:token_usage", "sglang:num_requests_running", "sglang:num_requests_waiting",
        "sglang:max_total_num_tokens")
    (r,) = p.readings
    assert (r.model_name, r.engine) == ("google/gemma-2-9b-it", "0")
    assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting) == (0.87, 41.0, 3.0)
    assert r.kv_capacity_tokens == 161721.0
    assert r.kv_used_tokens == pytest.approx(0.87 * 161721)
    # 2024 had no cumulative retraction counter and no cached-token counter: unknown, not 0.
    assert r.preemptions_total is None and r.prefix_cache_hit_ratio is None
    assert (r.request_prompt_tokens_sum, r.request_prompt_tokens_count) == (84000.0, 120.0)


def test_sglang_early_2025_has_no_capacity() -> None:
    p = poll(SGLANG / "v0.4-production-metrics-doc.prom")
    assert (p.detection.engine_kind, p.detection.version_range) == ("sglang", "model-name-label")
    assert p.detection.capacity_metric is None
    (r,) = p.readings
    assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting) == (0.28, 162.0, 2826.0)
    assert r.kv_capacity_tokens is None and r.kv_used_tokens is None
    assert r.prompt_tokens_total == 8.128902e06


def test_sglang_rank_labels_one_series_per_dp_rank_tp_copies_not_summed() -> None:
    p = poll(SGLANG / "gen-rank-labels-dp2.prom")
    assert p.detection.version_range == "rank-labels"
    assert [(r.model_name, r.engine) for r in p.readings] == [("Qwen/Qwen3-8B", "0"), ("Qwen/Qwen3-8B", "1")]
    r0, r1 = p.readings
    assert (r0.requests_running, r1.requests_running) == (40.0, 57.0)  # two tp ranks each: not 80 and 114
    assert (r0.requests_waiting, r1.requests_waiting) == (0.0, 12.0)
    assert r1.kv_usage_ratio == pytest.approx(126976 / 131072)
    assert r1.kv_capacity_tokens == 131072.0
    assert (r0.preemptions_total, r1.preemptions_total) == (0.0, 7.0)
    # Tokenizer counters carry no dp_rank: they apply to each series; hits / queries is cached / prompt tokens.
    assert r0.prefix_cache_hit_ratio == pytest.approx(1.05e6 / 4.2e6)
    assert r0.prefix_cache_unit == "tokens"
    assert dict(r0.finished_by_reason) == {"all": 5000.0}  # num_requests_total: no reasons since 2025


def test_sglang_0_4_10_to_0_5_2_lifetime_retraction_gauge_is_the_preemption_count() -> None:
    # 0.4.10-0.5.2 export the scheduler's lifetime total as the gauge sglang:total_retracted_reqs, not the counter.
    # Both tensor-parallel ranks' schedulers retract the same requests: 37, not 74.
    p = poll(SGLANG / "gen-0.5.2-total-retracted-tp2.prom")
    (r,) = p.readings
    assert (r.model_name, r.engine, r.preemptions_total) == ("Qwen/Qwen2.5-7B-Instruct", "0", 37.0)
    found = {f["id"]: f["message"] for f in build_report(p)["findings"]}
    assert found["preemptions"].startswith("37 preemptions since the engine started")


def test_sglang_0_5_6_per_request_retraction_histogram_is_not_a_total() -> None:
    # 0.5.5-0.5.6's sglang:num_retractions is observed when a request finishes (3 retractions of 3 finished
    # requests here); the interval gauge num_retracted_reqs (2) is no total either: preemptions stay unknown.
    (r,) = poll(SGLANG / "gen-0.5.6-num-retractions-histogram.prom").readings
    assert r.preemptions_total is None
    assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting) == (0.94, 30.0, 12.0)


def test_trtllm_serve_prometheus() -> None:
    p = poll(TRTLLM / "gen-trtllm-serve.prom")
    d = p.detection
    assert (d.engine_kind, d.version_range, d.usage_metric) == (
        "tensorrt-llm", "trtllm-serve", "trtllm_kv_cache_utilization")
    (r,) = p.readings
    assert (r.model_name, r.kv_usage_ratio, r.requests_running, r.requests_waiting) == (
        "nvidia/Llama-3.1-8B-Instruct-FP8", 0.75, 24.0, 0.0)
    assert (r.kv_capacity_tokens, r.num_gpu_blocks, r.block_size) == (8192 * 32, 8192.0, 32.0)
    assert r.prefix_cache_hit_ratio == pytest.approx(0.2) and r.prefix_cache_unit == "blocks"
    assert dict(r.finished_by_reason) == {"length": 20.0, "stop": 1180.0}
    assert r.preemptions_total is None  # TensorRT-LLM counts none


@pytest.mark.parametrize("page", ["prometheus", "json"])
def test_an_engine_that_names_no_model_is_not_looked_up_as_a_preset(page: str, tmp_path: Path, capsys) -> None:
    # trtllm-serve labels every series model_name="undefined" (its openai_server.py), and the JSON statistics carry
    # no name (kvwatch says "unknown"): check answered "no preset for model 'undefined'".
    if page == "prometheus":
        path = tmp_path / "trtllm-serve.prom"
        path.write_text((TRTLLM / "gen-trtllm-serve.prom").read_text().replace(
            'model_name="nvidia/Llama-3.1-8B-Instruct-FP8",engine_type="trtllm"',
            'model_name="undefined",engine_type="undefined"'))
    else:
        path = TRTLLM / "trtllm-serve-iteration-stats.json"
    assert main(["check", "--file", str(path), "--gpu", "H100"]) == 0
    err = capsys.readouterr().err
    name = "undefined" if page == "prometheus" else "unknown"
    assert f"the engine does not name its model (model_name '{name}'): pass --model or --model-config" in err, err
    assert "no preset" not in err


def test_trtllm_colon_prefix_reads_alike() -> None:
    text = (TRTLLM / "gen-trtllm-serve.prom").read_text().replace("trtllm_", "trtllm:")
    p = read_payload(text, timestamp=1.0)
    assert p.detection.version_range == "trtllm-serve-colon"
    assert p.readings[0].kv_usage_ratio == 0.75


def test_trtllm_serve_usage_falls_back_to_blocks() -> None:
    text = "".join(line for line in (TRTLLM / "gen-trtllm-serve.prom").read_text().splitlines(keepends=True)
                   if "kv_cache_utilization" not in line)  # every line keeps its newline (a valid exposition)
    p = read_payload(text, timestamp=1.0)
    assert p.readings[0].kv_usage_ratio == 6144 / 8192
    assert p.detection.usage_metric == "trtllm_kv_cache_used_blocks / trtllm_kv_cache_max_blocks"


@pytest.mark.parametrize(("fixture", "version_range", "family"), [
    ("triton-backend-readme.prom", "triton-backend", "nv_trt_llm_kv_cache_block_metrics"),
    # Triton 23.11 named the families *_statistics: its page was refused as "no nv_trt_llm_*"
    ("triton-23.11-backend-readme.prom", "triton-backend-23.11", "nv_trt_llm_kv_cache_block_statistics"),
])
def test_triton_readme_examples_have_no_waiting_and_usage_from_blocks(fixture: str, version_range: str,
                                                                       family: str) -> None:
    p = poll(TRTLLM / fixture)
    assert (p.detection.engine_kind, p.detection.version_range) == ("tensorrt-llm", version_range)
    assert p.detection.waiting_metric is None
    assert p.detection.capacity_metric is not None and p.detection.capacity_metric.startswith(family)
    (r,) = p.readings
    assert r.model_name == "tensorrt_llm"
    assert r.requests_waiting is None  # unknown: the README's backend has no waiting count
    assert r.requests_running == 0.0
    assert r.kv_usage_ratio == pytest.approx(1 / 6239)
    assert r.kv_capacity_tokens == 6239 * 64


def test_a_triton_page_without_the_families_kvwatch_reads_is_refused_naming_them() -> None:
    # A V1 (not inflight-batching) model or a page of general statistics only: the refusal said the page had no
    # nv_trt_llm_* metrics at all.
    text = "".join(line for line in (TRTLLM / "triton-backend-readme.prom").read_text().splitlines(keepends=True)
                   if "request_metrics" not in line and "kv_cache_block_metrics" not in line)
    with pytest.raises(UnrecognisedPayload, match=r"nv_trt_llm_\* metrics without .*nv_trt_llm_request_statistics"):
        read_payload(text, timestamp=1.0)


@pytest.mark.parametrize("page", [
    # trtllm-serve with enable_iter_perf_stats off (the PyTorch backend's default), in multiprocess mode: the
    # request metrics, no gauge ever set
    "# HELP trtllm_request_success_total Count of successfully processed requests.\n"
    "# TYPE trtllm_request_success_total counter\n"
    'trtllm_request_success_total{model_name="undefined",engine_type="undefined",finished_reason="stop"} 3.0\n',
    # a fresh server: the one counter its collector creates at start-up
    "# HELP trtllm_prompt_cached_tokens_total Number of cached prompt tokens.\n"
    "# TYPE trtllm_prompt_cached_tokens_total counter\n"
    'trtllm_prompt_cached_tokens_total{model_name="undefined",engine_type="undefined"} 0.0\n',
])
def test_a_trtllm_serve_page_without_gauges_says_the_cause_is_unknown(page: str) -> None:
    # it said "this trtllm-serve exports latency only; a newer one": a guess, and for a fresh
    # server's page, which holds no latency histogram, doubly wrong
    with pytest.raises(UnrecognisedPayload) as refused:
        read_payload(page, timestamp=1.0)
    message = str(refused.value)
    assert "cannot say why" in message and "enable_iter_perf_stats" in message and "first iteration" in message
    assert "a newer one" not in message


def test_triton_with_fraction_and_waiting() -> None:
    p = poll(TRTLLM / "gen-triton-waiting-fraction.prom")
    (r,) = p.readings
    assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting) == (0.96875, 48.0, 9.0)
    assert p.detection.usage_metric == 'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}'


def test_iteration_stats_json() -> None:
    p = poll(TRTLLM / "trtllm-serve-iteration-stats.json")
    assert p.detection.version_range == "iteration-stats"
    (r,) = p.readings
    assert r.kv_usage_ratio == pytest.approx(3 / 101256)
    assert r.kv_capacity_tokens == 101256 * 32
    assert r.requests_running == 1.0 and r.requests_waiting is None
    assert r.prefix_cache_hits_total == 4.0 and r.prefix_cache_queries_total == 3125.0


def test_an_integer_past_a_floats_range_in_iteration_stats_is_unknown() -> None:
    # JSON integers have no bound: float() of one overflowed and the adapter's crash path logged a traceback.
    text = '[{"iter": 1, "numActiveRequests": 2, "kvCacheStats": {"maxNumBlocks": 1%s, "usedNumBlocks": 3, ' \
           '"tokensPerBlock": 32}}]' % ("0" * 400)
    (r,) = read_payload(text, timestamp=1.0).readings
    assert (r.kv_capacity_tokens, r.kv_usage_ratio, r.requests_running) == (None, None, 2.0)


def test_an_integer_past_pythons_digit_limit_in_iteration_stats_is_unknown_too() -> None:
    # int() of 5,000 digits raised past Python's limit: counted as reason="internal", a traceback
    text = '[{"iter": 1, "numActiveRequests": 2, "kvCacheStats": {"maxNumBlocks": %s, "usedNumBlocks": 3, ' \
           '"tokensPerBlock": 32}}]' % ("1" * 5000)
    (r,) = interpret(text, None, timestamp=1.0).readings
    assert (r.kv_capacity_tokens, r.kv_usage_ratio, r.requests_running) == (None, None, 2.0)


def test_iteration_stats_empty_list_is_unrecognised_not_empty_cache() -> None:
    with pytest.raises(UnrecognisedPayload, match="no iteration since the last poll"):
        read_payload("[]", timestamp=1.0)
    with pytest.raises(ParseError):
        read_payload("[not json", timestamp=1.0)


def test_iteration_stats_past_what_the_engine_keeps_are_too_large_before_parsing() -> None:
    # Any body opening with "[" or "{" is read as iteration statistics: 16 MiB of "{}," (5.6 million dicts) took the
    # sidecar to 438 MB every poll. trtllm-serve keeps 1,000 iterations of about 40 values by default.
    from kvwatch.engines.trtllm import MAX_JSON_VALUES
    from kvwatch.exposition import TooLarge

    with pytest.raises(TooLarge, match="more than TensorRT-LLM's iteration statistics hold"):
        read_payload("[" + "{}," * (MAX_JSON_VALUES + 1) + "{}]", timestamp=1.0)
    one = (TRTLLM / "trtllm-serve-iteration-stats.json").read_text().strip()
    assert one.startswith("[") and one.endswith("]")
    many = "[" + ",".join([one[1:-1]] * 1000) + "]"  # a full default queue of them reads
    assert many.count(",") + many.count(":") <= MAX_JSON_VALUES
    assert read_payload(many, timestamp=1.0).readings


def test_unknown_payload_names_all_three_engines() -> None:
    with pytest.raises(ScrapeError) as info:
        interpret("# TYPE foo gauge\nfoo 1\n", None, timestamp=1.0)
    assert info.value.reason == "unrecognised"
    assert "sglang" in str(info.value) and "nv_trt_llm" in str(info.value)


@pytest.mark.parametrize(("page", "named"), [
    ("# TYPE tgi_queue_size gauge\ntgi_queue_size 3\ntgi_batch_current_size 8\n", "Hugging Face TGI"),
    ("llamacpp:kv_cache_usage_ratio 0.63\nllamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n",
     "llama.cpp's server"),
])
def test_an_engine_without_an_adapter_is_named(page: str, named: str) -> None:
    # the message listed the engines kvwatch reads and asked whether this was an engine's page
    with pytest.raises(ScrapeError) as info:
        interpret(page, None, timestamp=1.0)
    assert info.value.reason == "unrecognised" and f"this page is {named}" in str(info.value)
    if named.startswith("llama.cpp"):  # and the flags it names read it
        overrides = SourceOverrides.from_strings(usage="llamacpp:kv_cache_usage_ratio",
                                                 running="llamacpp:requests_processing",
                                                 waiting="llamacpp:requests_deferred")
        (r,) = interpret(page, overrides, timestamp=1.0).readings
        assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting) == (0.63, 2.0, 1.0)


def test_overrides_apply_to_sglang() -> None:
    overrides = SourceOverrides.from_strings(waiting="sglang:num_running_reqs")
    p = poll(SGLANG / "v0.4-production-metrics-doc.prom", overrides)
    assert p.readings[0].requests_waiting == 162.0
    assert p.detection.waiting_metric == "sglang:num_running_reqs"


@pytest.mark.parametrize(("path", "kind"), [
    (SGLANG / "gen-rank-labels-dp2.prom", "sglang"),
    (TRTLLM / "gen-trtllm-serve.prom", "tensorrt-llm"),
    (TRTLLM / "triton-23.11-backend-readme.prom", "tensorrt-llm"),
    (TRTLLM / "triton-backend-readme.prom", "tensorrt-llm"),
    (FIXTURES / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom", "vllm"),
])
def test_check_json_same_series_fields_for_every_engine(path: Path, kind: str) -> None:
    report = build_report(poll(path))
    assert report["engine_kind"] == kind
    vllm_fields = set(build_report(poll(FIXTURES / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom"))
                      ["series"][0])
    for series in report["series"]:
        assert set(series) == vllm_fields
        for name in ("requests_running", "kv_usage_ratio", "kv_capacity_tokens"):
            assert name in series
    assert {"running_metric", "waiting_metric", "capacity_metric"} <= set(report)


def test_docs_list_every_name_the_adapters_read() -> None:
    from kvwatch.engines import sglang, trtllm

    doc = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    names = {n for n in sglang.FAMILIES if n.startswith("sglang:")} | {
        n for n in trtllm.FAMILIES if not n.startswith("trtllm:")}
    missing = sorted(n for n in names if f"`{n}" not in doc)
    assert not missing, f"docs/metrics.md does not list {missing}"


def test_a_latency_only_trtllm_page_is_named_as_such() -> None:
    # trtllm-serve 1.1.0rc5 exports a success counter and latency histograms only: unrecognised, and the message
    # says it is TensorRT-LLM without the gauges, not that the page has no engine metrics at all.
    from kvwatch.payload import ScrapeError, interpret

    text = ("# TYPE trtllm_request_success_total counter\n"
            'trtllm_request_success_total{model_name="m",engine_type="pytorch",finished_reason="stop"} 5\n')
    with pytest.raises(ScrapeError) as caught:
        interpret(text, None, timestamp=0.0)
    assert caught.value.reason == "unrecognised" and "TensorRT-LLM metrics without" in str(caught.value)


def test_a_pd_decode_servers_preallocation_queue_waits_for_kv() -> None:
    # SGLang's PD decode server queues requests for KV preallocation (num_decode_prealloc_queue_reqs) while its
    # scheduler queue is empty: those are the requests waiting for KV memory, so the series is KV-bound.
    from kvwatch.payload import interpret

    labels = 'engine_type="decode",model_name="Qwen/Qwen3-32B",pp_rank="0",tp_rank="0"'
    text = "".join(f"sglang:{name}{{{labels}}} {value}\n" for name, value in (
        ("token_usage", 0.985), ("num_running_reqs", 120), ("num_queue_reqs", 0), ("max_total_num_tokens", 400000),
        ("num_decode_prealloc_queue_reqs", 48), ("num_decode_transfer_queue_reqs", 5)))
    poll = interpret(text, None, timestamp=0.0)
    (r,) = poll.readings
    # (the 5 in transfer wait for their KV to arrive, not for room: deferred)
    assert (r.requests_waiting, r.requests_waiting_for_capacity, r.requests_waiting_deferred) == (53, 48, 5)
    assert poll.detection.waiting_metric == ("sglang:num_queue_reqs + sglang:num_decode_prealloc_queue_reqs + "
                                             "sglang:num_decode_transfer_queue_reqs")


def test_several_sglang_workers_on_a_gateways_page_are_refused_not_merged() -> None:
    # sgl-model-gateway's /engine_metrics merges its workers' pages and labels them worker_addr: the maximum over
    # them made up an engine (one worker's 98 % usage beside another's 150 running).
    text = "".join(
        f"# TYPE sglang:{name} gauge\n" + "".join(
            f'sglang:{name}{{model_name="m",tp_rank="0",worker_addr="http://10.0.0.{w}:30000"}} {v}\n'
            for w, v in ((11, a), (12, b)))
        for name, a, b in (("token_usage", 0.98, 0.10), ("num_running_reqs", 20, 150), ("num_queue_reqs", 40, 0)))
    with pytest.raises(UnrecognisedPayload, match="differ in worker_addr"):
        sglang.read(parse(text), timestamp=0.0)


def test_sglang_cached_tokens_add_up_over_their_cache_sources() -> None:
    # Hierarchical caching splits cached_tokens_total by cache_source (device, host, storage_*); the maximum of
    # the tiers under-stated the hit ratio (0.07 for 0.17) and raised prefix_cache_ineffective.
    text = ('# TYPE sglang:token_usage gauge\nsglang:token_usage{model_name="m"} 0.5\n'
            '# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total{model_name="m"} 9000000\n'
            '# TYPE sglang:cached_tokens_total counter\n'
            'sglang:cached_tokens_total{cache_source="device",model_name="m"} 600000\n'
            'sglang:cached_tokens_total{cache_source="host",model_name="m"} 500000\n'
            'sglang:cached_tokens_total{cache_source="storage_file",model_name="m"} 400000\n')
    (reading,) = sglang.read(parse(text), timestamp=0.0).readings
    assert reading.prefix_cache_hit_ratio == pytest.approx(1_500_000 / 9_000_000)


def test_unknown_counts_and_a_prefill_server_raise_no_stuck_or_stuck_queue_finding() -> None:
    from kvwatch.capacity.findings import LIVE_FINDINGS, live_finding

    # trtllm-serve's older collector exports utilization and no queue gauges: unknown is not zero.
    assert all(live_finding(f, 0.97, None, None) is None for f in LIVE_FINDINGS)
    assert all(live_finding(f, 0.02, None, 3.0) is None for f in LIVE_FINDINGS)
    # SGLang's PD prefill loop never enters its running batch: 0 running is its normal state.
    prefill = ('# TYPE sglang:num_running_reqs gauge\n'
               'sglang:num_running_reqs{engine_type="prefill",model_name="m",tp_rank="0"} 0\n')
    (reading,) = sglang.read(parse(prefill), timestamp=0.0).readings
    assert reading.engine_role == "prefill"
    assert all(live_finding(f, 0.02, 0.0, 3.0, prefill_server=True) is None for f in LIVE_FINDINGS)
    assert live_finding("request_exceeds_pool", 0.02, 0.0, 3.0) is not None


def test_sglang_tokenizer_counters_split_by_streaming_and_priority_add_up() -> None:
    # SGLang 0.5.2x splits the tokenizer's request counters and latency histograms by is_streaming, and priority
    # scheduling by each request's priority: disjoint parts, of which the maximum was read (60 % of the prompt
    # tokens, a hit ratio above 1 on such a page, the TTFT of the streaming part alone). The scheduler's
    # gauges (tensor-parallel copies; the total under priority="") still combine by maximum.
    (reading,) = poll(SGLANG / "gen-0.5.23-is-streaming-priority.prom").readings
    assert (reading.requests_running, reading.requests_waiting, reading.kv_usage_ratio) == (40.0, 3.0, 0.5)
    assert reading.preemptions_total == 4.0
    assert (reading.prompt_tokens_total, reading.generation_tokens_total) == (100_000.0, 50_000.0)
    assert dict(reading.finished_by_reason) == {"all": 1000.0}
    assert reading.requests_aborted_total == 5.0
    assert reading.prefix_cache_hit_ratio == pytest.approx(0.6)
    e2e = reading.latency["e2e"]
    assert (e2e.count, e2e.cumulative, e2e.sum) == (1000.0, (700.0, 1000.0, 1000.0), 1850.0)


def test_sglang_length_histograms_are_read_on_a_page_without_type_lines():
    # SGLang's current length histograms are chosen over the 2024 names when the page has them; without # TYPE
    # lines a histogram is only its _sum, _count and _bucket families, and the old name was chosen (nothing read).
    labels = '{model_name="m"}'
    text = (f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{labels} 3\n"
            f"# TYPE sglang:token_usage gauge\nsglang:token_usage{labels} 0.5\n"
            f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{labels} 1\n"
            "# TYPE sglang:prompt_tokens_histogram histogram\n"
            'sglang:prompt_tokens_histogram_bucket{model_name="m",le="100.0"} 2\n'
            'sglang:prompt_tokens_histogram_bucket{model_name="m",le="+Inf"} 4\n'
            f"sglang:prompt_tokens_histogram_sum{labels} 800\nsglang:prompt_tokens_histogram_count{labels} 4\n")
    bare = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    for page in (text, bare):
        [reading] = read_payload(page, timestamp=1.0).readings
        assert (reading.request_prompt_tokens_sum, reading.request_prompt_tokens_count) == (800.0, 4.0)


def test_a_page_with_two_engines_metrics_is_refused_naming_both() -> None:
    # a vLLM page with an SGLang server's gauges appended: the vLLM adapter read its series and
    # the SGLang engine, 99 % full with 30 waiting, vanished without a word while kvwatch_up stayed 1.
    vllm_page = (FIXTURES / "vllm-metrics" / "gen-0.11-kv-only.prom").read_text()
    sglang_page = (SGLANG / "gen-rank-labels-dp2.prom").read_text()
    with pytest.raises(UnrecognisedPayload, match="holds the metrics of vllm and sglang"):
        read_payload(vllm_page + sglang_page, timestamp=1.0)
    assert read_payload(vllm_page, timestamp=1.0).readings and read_payload(sglang_page, timestamp=1.0).readings


def _serve_page_with(**gauges: float) -> str:
    """The trtllm-serve fixture with some of its gauges set (and added when it lacks them)."""
    text = (TRTLLM / "gen-trtllm-serve.prom").read_text()
    labels = '{model_name="nvidia/Llama-3.1-8B-Instruct-FP8",engine_type="trtllm"}'
    for name, value in gauges.items():
        line = f"trtllm_{name}{labels}"
        lines = [x for x in text.splitlines() if not x.startswith(line + " ")]
        text = "\n".join([*lines, f"{line} {value}"]) + "\n"
    return text


def test_trtllm_active_requests_the_scheduler_did_not_fit_are_waiting() -> None:
    # TensorRT-LLM's active requests include those taken from its queue that the scheduler could not fit
    # (py_executor.py: len(self.active_requests)); with a full cache its own queue reads 0. 64 scheduled of 180
    # active at 0.99 is 116 requests waiting for KV: kv_bound, and the per-request footprint is the scheduled 64's.
    text = _serve_page_with(kv_cache_utilization=0.99, num_requests_running=180, num_requests_waiting=0,
                            num_scheduled_requests=64)
    p = read_payload(text, timestamp=1.0)
    (r,) = p.readings
    assert (r.requests_running, r.requests_waiting) == (64, 116)
    assert p.detection.running_metric == "trtllm_num_scheduled_requests"
    assert p.detection.waiting_metric == (
        "trtllm_num_requests_waiting + (trtllm_num_requests_running - trtllm_num_scheduled_requests)")
    report = build_report(p)
    assert "kv_bound" in {f["id"] for f in report["findings"]}


def test_trtllm_split_needs_the_scheduled_count_and_yields_to_overrides() -> None:
    plain = read_payload(_serve_page_with(num_requests_running=180, num_requests_waiting=3), timestamp=1.0)
    assert (plain.readings[0].requests_running, plain.readings[0].requests_waiting) == (180, 3)
    text = _serve_page_with(num_requests_running=180, num_requests_waiting=3, num_scheduled_requests=64)
    overridden = read_payload(text, SourceOverrides.from_strings(running="trtllm_num_requests_running"), timestamp=1.0)
    assert (overridden.readings[0].requests_running, overridden.readings[0].requests_waiting) == (180, 3)
    # a scheduled count above the active one is no split (a stale gauge): the active and queued counts stand
    odd = read_payload(_serve_page_with(num_requests_running=10, num_scheduled_requests=12), timestamp=1.0)
    assert odd.readings[0].requests_running == 10


def test_triton_running_is_the_scheduled_and_waiting_the_unscheduled_never_counted_twice() -> None:
    # NVIDIA's Python backend exports waiting = active - scheduled (tensorrt_llm/1/model.py); its C++ backend exports
    # no waiting, and there kvwatch computes the same. The fixture: active 57, scheduled 48, waiting 9.
    text = (TRTLLM / "gen-triton-waiting-fraction.prom").read_text()
    (python_backend,) = read_payload(text, timestamp=1.0).readings
    assert (python_backend.requests_running, python_backend.requests_waiting) == (48, 9)
    cpp = "".join(line for line in text.splitlines(keepends=True) if 'request_type="waiting"' not in line)
    p = read_payload(cpp, timestamp=1.0)
    assert (p.readings[0].requests_running, p.readings[0].requests_waiting) == (48, 9)
    assert p.detection.waiting_metric == (
        'nv_trt_llm_request_metrics{request_type="active"} - nv_trt_llm_request_metrics{request_type="scheduled"}')
    # The C++ executor counts scheduled and active at different moments: its README's example has scheduled 1,
    # active 0. No split then: the active count and the exported waiting stand, and the names say so.
    readme = read_payload((TRTLLM / "triton-backend-readme.prom").read_text(), timestamp=1.0)
    assert readme.readings[0].requests_running == 0.0 and readme.readings[0].requests_waiting is None
    assert readme.detection.running_metric == 'nv_trt_llm_request_metrics{request_type="active"}'


def test_trtllm_no_split_with_pipeline_parallelism_or_a_bad_scheduled_count() -> None:
    # With pipeline parallelism an iteration schedules one micro-batch of the requests in flight
    # (py_executor.py's PP loop): the unscheduled are not waiting.
    labels = 'model_name="nvidia/Llama-3.1-8B-Instruct-FP8",engine_type="trtllm"'
    info = f'trtllm_parallel_config_info{{{labels},tensor_parallel_size="4",pipeline_parallel_size="4"}} 1.0\n'
    text = _serve_page_with(num_requests_running=128, num_requests_waiting=0, num_scheduled_requests=32)
    (r,) = read_payload(text + info, timestamp=1.0).readings
    assert (r.requests_running, r.requests_waiting) == (128, 0)
    one_stage = info.replace('pipeline_parallel_size="4"', 'pipeline_parallel_size="1"')
    (r,) = read_payload(text + one_stage, timestamp=1.0).readings
    assert (r.requests_running, r.requests_waiting) == (32, 96)
    for bad in ("NaN", "-3"):
        p = read_payload(_serve_page_with(num_requests_running=10, num_scheduled_requests=bad), timestamp=1.0)
        assert p.readings[0].requests_running == 10 and p.detection.running_metric == "trtllm_num_requests_running"


def test_iteration_stats_scheduled_count_splits_the_active_requests() -> None:
    text = ('[{"iter": 7, "numActiveRequests": 30, "numQueuedRequests": 2, "inflightBatchingStats": '
            '{"numScheduledRequests": 20, "numContextRequests": 1, "numGenRequests": 19, "numPausedRequests": 0}, '
            '"kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 99, "tokensPerBlock": 32}}]')
    p = read_payload(text, timestamp=1.0)
    assert (p.readings[0].requests_running, p.readings[0].requests_waiting) == (20, 12)
    assert p.detection.running_metric == "inflightBatchingStats.numScheduledRequests"


def test_iteration_stats_with_attention_data_parallelism_read_rank_0_in_any_order() -> None:
    # With attention DP each iteration is a row per rank (tensorrt_llm's _materialize_frame): rank
    # 0's active count and KV copied into every row, each rank's own scheduled count, the queue zeroed on ranks but
    # 0. The last row was read: 14 running and 50 waiting (the queue of 40 lost), 16 and 88 with the rows reversed.
    import json

    def row(iteration: int, rank: int, scheduled: int) -> dict:
        return {"iter": iteration, "attentionDpRank": rank, "numActiveRequests": 64,
                "numQueuedRequests": 40 if rank == 0 else 0,
                "inflightBatchingStats": {"numScheduledRequests": scheduled},
                "kvCacheStats": {"maxNumBlocks": 1000, "usedNumBlocks": 980, "tokensPerBlock": 32}}

    rows = [row(99, 0, 10), row(99, 1, 9), row(100, 0, 16), row(100, 1, 14)]
    for order in (rows, rows[:2] + rows[:1:-1]):
        (r,) = read_payload(json.dumps(order), timestamp=1.0).readings
        assert (r.requests_running, r.requests_waiting, r.kv_usage_ratio) == (64, 40, 0.98)
    # the rank written as digits, and an iteration whose rank-0 row is not (yet) in
    string_ranks = [{**r, "attentionDpRank": str(r["attentionDpRank"])} for r in rows]
    (r,) = read_payload(json.dumps(string_ranks), timestamp=1.0).readings
    assert (r.requests_running, r.requests_waiting) == (64, 40)
    (r,) = read_payload(json.dumps([*rows[:3], row(101, 1, 3)]), timestamp=1.0).readings
    assert (r.requests_running, r.requests_waiting) == (64, 40)  # rank 0's newest row, unsplit
    # one row per iteration (no attention DP): the split by the scheduled count stands
    (r,) = read_payload(json.dumps([row(100, 0, 16)]), timestamp=1.0).readings
    assert (r.requests_running, r.requests_waiting) == (16, 88)


def test_trtllm_finished_requests_from_the_iteration_counter_without_per_request_metrics():
    # request_success_total needs return_perf_metrics; num_requests_completed_total comes with the iteration
    # statistics alone (tensorrt_llm/metrics/collector.py): without either the arrival rate is unknown.
    text = "".join(line for line in _serve_page_with().splitlines(keepends=True)
                   if not line.startswith("trtllm_request_success_total"))
    labels = '{model_name="nvidia/Llama-3.1-8B-Instruct-FP8",engine_type="trtllm"}'
    (r,) = read_payload(text + f"trtllm_num_requests_completed_total{labels} 950.0\n", timestamp=1.0).readings
    assert dict(r.finished_by_reason) == {"all": 950.0}
    (both,) = read_payload(_serve_page_with() + f"trtllm_num_requests_completed_total{labels} 950.0\n",
                           timestamp=1.0).readings
    assert dict(both.finished_by_reason) == {"length": 20.0, "stop": 1180.0}  # the per-request counter wins


def test_a_pd_prefill_servers_running_count_sets_no_concurrency_limit() -> None:
    # SGLang 0.5.23 reports a prefill server's forward batch as running (8) while 40 requests in transfer to the
    # decode servers hold most of its KV: running / usage (8.9) is no ceiling, and a limit of 8 at the gateway
    # would throttle the whole prefill/decode pipeline.
    from kvwatch.derived import max_concurrency

    p = poll(SGLANG / "gen-0.5.23-pd-prefill.prom")
    (r,) = p.readings
    assert r.prefill_server and r.requests_running == 8
    assert max_concurrency(r, None, None).get("observed_mix") is None
    report = build_report(p)
    (series,) = report["series"]
    assert not any(a["action"] == "limit_concurrency" for a in series["advice"])
    (kv_bound,) = [f for f in report["findings"] if f["id"] == "kv_bound"]
    assert "prefill server" in kv_bound["message"] and "decode" in kv_bound["message"]


@pytest.mark.parametrize("queue", ["num_prefill_inflight_queue_reqs", "num_prefill_bootstrap_queue_reqs",
                                   "num_prefill_prealloc_queue_reqs"])
def test_a_prefill_server_labelled_unified_is_told_by_its_own_queues(queue: str) -> None:
    # SGLang releases before it labelled the role wrote engine_type="unified" on every server:
    # a PD prefill server then got the limit of 8 above. Its transfer or bootstrap queue (named prealloc in those
    # releases) holds requests on a prefill server alone; at 0 it says nothing.
    unified = (SGLANG / "gen-0.5.23-pd-prefill.prom").read_text().replace('engine_type="prefill"',
                                                                         'engine_type="unified"')
    lines = "".join(line + "\n" for line in unified.splitlines() if "num_prefill_" not in line)

    def page(held: int) -> str:
        return lines + (f"# TYPE sglang:{queue} gauge\n"
                        f'sglang:{queue}{{engine_type="unified",model_name="Qwen/Qwen3-8B",tp_rank="0"}} {held}\n')
    (r,) = read_payload(page(40), timestamp=0.0).readings
    assert r.prefill_server
    report = build_report(read_payload(page(40), timestamp=0.0))
    assert not any(a["action"] == "limit_concurrency" for s in report["series"] for a in s["advice"])
    (r,) = read_payload(page(0), timestamp=0.0).readings
    assert not r.prefill_server and r.engine_role is None
    assert any(a["action"] == "limit_concurrency" for s in build_report(read_payload(page(0), timestamp=0.0))["series"]
               for a in s["advice"])


def test_sglang_usage_is_the_fullest_pool_unrounded() -> None:
    # Before 0.5.23 a Mamba hybrid's token_usage was the full-attention pool alone: a full state pool (0.977)
    # behind a 0.12 token pool read as a scheduler limit. 0.5.23's token_usage is the fullest pool rounded to
    # 2 decimals: 0.9466 read 0.95, a saturated poll; its pools' own gauges are not rounded.
    hybrid = poll(SGLANG / "gen-0.5-mamba-hybrid-full-pool-only.prom")
    assert hybrid.readings[0].kv_usage_ratio == pytest.approx(0.977)
    assert hybrid.detection.usage_metric == "max(sglang:mamba_usage, sglang:swa_token_usage, sglang:token_usage)"
    assert "scheduler_limited" not in {f["id"] for f in build_report(hybrid)["findings"]}
    rounded = poll(SGLANG / "gen-0.5.23-rounded-token-usage.prom")
    assert rounded.readings[0].kv_usage_ratio == pytest.approx(0.9466)
    # an explicit --usage-metric reads that metric alone
    text = (SGLANG / "gen-0.5.23-rounded-token-usage.prom").read_text()
    chosen = read_payload(text, SourceOverrides.from_strings(usage="sglang:token_usage"), timestamp=1.0)
    assert chosen.readings[0].kv_usage_ratio == 0.95


def test_a_pd_decode_servers_transfers_are_deferred_not_a_leak() -> None:
    # Requests whose KV is on its way from the prefill server hold their blocks: 97 % used, nothing running or
    # queued, 120 transferring is the decode server waiting for the prefill side, not a KV leak (kv_usage_stuck:
    # "restart the engine"). They are vLLM's "deferred" reason.
    p = poll(SGLANG / "gen-0.5.23-pd-decode-transfers.prom")
    (r,) = p.readings
    assert (r.requests_waiting, r.requests_waiting_for_capacity, r.requests_waiting_deferred) == (120, 0, 120)
    assert "sglang:num_decode_transfer_queue_reqs" in p.detection.waiting_metric
    assert "kv_usage_stuck" not in {f["id"] for f in build_report(p)["findings"]}


@pytest.mark.parametrize(("usage", "likely"), [(0.88, "likely KV"), (0.30, "likely the request slots")])
def test_a_pd_decode_servers_queue_for_room_below_090_is_no_scheduler_limit(usage: float, likely: str) -> None:
    # 120 running, 14 in the prealloc queue at 0.88 was scheduler_limited: "raise --max-running-requests, more KV
    # would not help", where SGLang reserves 512 decode tokens a running request (61,440 > the 36,000 free) and
    # admits a transferred request only beside them.
    from kvwatch.payload import interpret

    labels = 'engine_type="decode",model_name="m",pp_rank="0",tp_rank="0"'
    text = "".join(f"sglang:{name}{{{labels}}} {value}\n" for name, value in (
        ("token_usage", usage), ("num_running_reqs", 120), ("num_queue_reqs", 0), ("max_total_num_tokens", 300000),
        ("num_decode_prealloc_queue_reqs", 14), ("num_decode_transfer_queue_reqs", 6)))
    findings = {f["id"]: f for f in build_report(interpret(text, None, timestamp=0.0))["findings"]}
    assert "scheduler_limited" not in findings
    message = findings["decode_admission_waiting"]["message"]
    assert "14 requests wait to be admitted" in message and likely in message


def test_sglang_context_len_is_the_engines_max_model_len() -> None:
    # SGLang exports its --context-length (sglang:context_len, static): the ceiling at max-model-len is the pool
    # over it, where it read "unknown" on every SGLang page, and the max-model-len advice starts from it.
    from kvwatch.capacity.series import max_model_len_of

    p = poll(SGLANG / "gen-0.5.23-rounded-token-usage.prom")
    (r,) = p.readings
    assert r.max_model_len == 32768 and max_model_len_of(r, None) == 32768
    (series,) = build_report(p)["series"]
    assert series["max_concurrency_max_model_len"] == pytest.approx(200_000 / 32_768)


def test_sglang_realtime_decode_tokens_show_progress_while_requests_run() -> None:
    # 0.5.2x's scheduler counts decode tokens every log interval (sglang:realtime_tokens_total{mode="decode"}): a
    # hang with requests running and none waiting can be told from long requests, as on vLLM. The tokenizer's
    # generation counter moves only when a request finishes. Not on a PD prefill server, which decodes nothing.
    (r,) = poll(SGLANG / "gen-0.5.23-rounded-token-usage.prom").readings
    assert r.tokens_counted_every_step
    decoded = [line for line in (SGLANG / "gen-0.5.23-rounded-token-usage.prom").read_text().splitlines()
               if line.startswith("sglang:realtime_tokens_total") and 'mode="decode"' in line]
    assert r.generation_tokens_total == float(decoded[0].rsplit(" ", 1)[1])
    (prefill,) = poll(SGLANG / "gen-0.5.23-pd-prefill.prom").readings
    assert not prefill.tokens_counted_every_step
    (older,) = poll(SGLANG / "gen-rank-labels-dp2.prom").readings[:1]
    assert not older.tokens_counted_every_step


def _sglang_page(**gauges: float) -> str:
    labels = 'engine_type="decode",model_name="m",tp_rank="0"'
    return "".join(f"sglang:{name}{{{labels}}} {value}\n" for name, value in gauges.items())


def test_sglang_edges_of_the_pools_queues_and_counters() -> None:
    # 0.5.23's host-receive queue is the part of the transfer queue staged on the host: not added to it.
    (r,) = read_payload(_sglang_page(token_usage=0.5, num_running_reqs=4, num_queue_reqs=0,
                                     num_decode_transfer_queue_reqs=3, num_decode_host_receive_queue_reqs=2),
                        timestamp=1.0).readings
    assert (r.requests_waiting, r.requests_waiting_deferred) == (3, 3)
    # requests waiting for their grammar to compile are outside num_queue_reqs: waiting, not for KV room (as vLLM
    # counts its requests waiting for their FSM); 25 read as nothing waiting
    (r,) = read_payload(_sglang_page(token_usage=0.3, num_running_reqs=10, num_queue_reqs=0,
                                     num_grammar_queue_reqs=25), timestamp=1.0).readings
    assert (r.requests_waiting, r.requests_waiting_deferred, r.requests_waiting_for_capacity) == (25, 25, 0)
    (r,) = read_payload(_sglang_page(token_usage=0.3, num_running_reqs=10, num_queue_reqs=4,
                                     num_decode_transfer_queue_reqs=3, num_grammar_queue_reqs=2),
                        timestamp=1.0).readings
    assert (r.requests_waiting, r.requests_waiting_deferred, r.requests_waiting_for_capacity) == (9, 5, 4)
    # a NaN full-pool gauge does not hide token_usage: the largest of what is known
    (r,) = read_payload(_sglang_page(token_usage=0.5, full_token_usage="NaN", mamba_usage=0.3, num_running_reqs=4),
                        timestamp=1.0).readings
    assert r.kv_usage_ratio == 0.5
    # the scheduler declares its realtime counter before the first decode: 0 then, one source from the start (the
    # tokenizer's generation counter, then the decode count, read as a counter going down: a restart)
    declared = "# HELP sglang:realtime_tokens_total Tokens.\n# TYPE sglang:realtime_tokens_total counter\n"
    (r,) = read_payload(declared + _sglang_page(token_usage=0.5, num_running_reqs=4, generation_tokens_total=500),
                        timestamp=1.0).readings
    assert (r.generation_tokens_total, r.tokens_counted_every_step) == (0.0, True)
    # on a page merged with KServe's queue-proxy the unlabelled process start is the proxy's
    proxy = "process_start_time_seconds 1.7e9\n"
    (r,) = read_payload(proxy + _sglang_page(token_usage=0.5, num_running_reqs=4), timestamp=1.0).readings
    assert r.process_start_time_seconds is None
    # two labelled copies that disagree are two processes: unknown, not the last line's
    servers = ('process_start_time_seconds{dp_rank="0",model_name="m"} 1.7e9\n'
               'process_start_time_seconds{dp_rank="1",model_name="m"} 1.8e9\n')
    (r,) = read_payload(servers + _sglang_page(token_usage=0.5, num_running_reqs=4), timestamp=1.0).readings
    assert r.process_start_time_seconds is None
    (r,) = read_payload(servers.replace("1.8e9", "1.7e9") + _sglang_page(token_usage=0.5, num_running_reqs=4),
                        timestamp=1.0).readings
    assert r.process_start_time_seconds == 1.7e9


def test_sglang_context_len_against_a_given_max_model_len() -> None:
    p = poll(SGLANG / "v0.3-2024-name-label.prom")
    (finding,) = [f for f in build_report(p, 4096)["findings"] if f["id"] == "max_model_len_mismatch"]
    assert "8,192 (sglang:context_len)" in finding["message"]


def test_iteration_stats_from_other_ranks_alone_leave_the_queue_unknown() -> None:
    # with attention DP and no rank-0 row on the page, another rank's zeroed queue
    # read as "no queue"
    import json

    rows = [{"iter": 7, "attentionDpRank": 1, "numActiveRequests": 4, "numQueuedRequests": 0,
             "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 50, "tokensPerBlock": 32}}]
    (r,) = read_payload(json.dumps(rows), timestamp=1.0).readings
    assert (r.requests_running, r.requests_waiting) == (4, None)


@pytest.mark.parametrize("name", ["gen-rank-labels-dp2.prom", "gen-0.5.23-pd-decode-transfers.prom",
                                  "v0.4-production-metrics-doc.prom"])
def test_sglang_families_spelled_with_an_underscore_read_as_with_the_colon(name: str) -> None:
    # Re-exports that turn SGLang's colon into an underscore (sglang_token_usage: docs/metrics.md) were refused as
    # no engine's page; the adapter reads them as the colon's, and the detection names the page's own spelling.
    text = (SGLANG / name).read_text()
    colon = read_payload(text, timestamp=1.0)
    underscore = read_payload(text.replace("sglang:", "sglang_"), timestamp=1.0)
    assert underscore.readings == colon.readings and underscore.readings
    assert underscore.detection.version_range == f"{colon.detection.version_range} (sglang_ prefix)"
    assert underscore.detection.usage_metric == colon.detection.usage_metric.replace("sglang:", "sglang_")


def test_an_index_label_of_thousands_of_digits_is_no_internal_error() -> None:
    # int() of a 5,000-digit engine label raised past Python's digit limit: reason "internal"
    huge = "1" * 5000
    page = (f'vllm:num_requests_running{{engine="{huge}",model_name="m"}} 1\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 1\n')
    with pytest.raises(ScrapeError) as info:
        interpret(page, None, timestamp=1.0)
    assert info.value.reason == "too_large"  # the label's length, said as such
    from kvwatch.engines.series import decimal_index

    assert [decimal_index(t) for t in ("0042", "²", huge, " 7 ", "x")] == [42, None, None, 7, None]


def test_a_prefill_and_a_decode_sglang_server_on_one_page_are_refused_not_merged() -> None:
    # One SGLang server has one engine_type (its disaggregation mode). Merged, the page read as an engine of the
    # decode server's usage (0.9) and running (80), the prefill server's queue (10) and pool (500,000 tokens).
    page = "".join(
        f'sglang:{name}{{model_name="m",engine_type="{role}",tp_rank="0",pp_rank="0"}} {value}\n'
        for name, prefill, decode in (("token_usage", 0.1, 0.9), ("num_running_reqs", 3, 80),
                                      ("num_queue_reqs", 10, 0), ("max_total_num_tokens", 500000, 300000))
        for role, value in (("prefill", prefill), ("decode", decode)))
    with pytest.raises(UnrecognisedPayload, match="differ in engine_type: this page holds several servers"):
        read_payload(page, timestamp=1.0)
    one = "".join(line + "\n" for line in page.splitlines() if "decode" in line)
    (r,) = read_payload(one, timestamp=1.0).readings
    assert (r.kv_usage_ratio, r.requests_running, r.requests_waiting) == (0.9, 80.0, 0.0)


def test_a_zero_pool_from_tensorrt_llm_names_no_capacity_source_and_no_flag_json_refuses() -> None:
    # maxNumBlocks 0 is dropped as implausible, but the report still named kvCacheStats as the capacity's source, and
    # check's usage_unknown said to pass --usage-metric, which read_payload refuses for JSON.
    stats = ('[{"iter":5,"numActiveRequests":3,"numQueuedRequests":0,"kvCacheStats":{"maxNumBlocks":0,'
             '"freeNumBlocks":0,"usedNumBlocks":0,"tokensPerBlock":32}}]')
    poll = interpret(stats, None, timestamp=0.0)
    assert poll.detection.capacity_metric is None and poll.readings[0].kv_capacity_tokens is None
    report = build_report(poll, None)
    (unknown,) = [f for f in report["findings"] if f["id"] == "usage_unknown"]
    assert "cannot apply to JSON" in unknown["message"] and "pass --usage-metric" not in unknown["message"]
    page = (FIXTURES / "tensorrt-llm-metrics" / "gen-trtllm-serve.prom").read_text()
    zero = "\n".join(line.rsplit(" ", 1)[0] + " 0" if line.startswith("trtllm_kv_cache_max_blocks") else line
                     for line in page.splitlines()) + "\n"
    assert zero != page
    assert interpret(page, None, timestamp=0.0).detection.capacity_metric is not None
    assert interpret(zero, None, timestamp=0.0).detection.capacity_metric is None


def _counters_unsuffixed(text: str) -> str:
    """``text`` with every counter family declared and sampled without ``_total`` (an OpenTelemetry collector's
    Prometheus exporter with ``add_metric_suffixes: false``)."""
    declared = (line.split()[2:] for line in text.splitlines() if line.startswith("# TYPE "))
    counters = {words[0] for words in declared if words[1:] == ["counter"] and words[0].endswith("_total")}
    out = []
    for line in text.splitlines(keepends=True):
        for name in counters:
            if line.startswith((f"# HELP {name} ", f"# TYPE {name} ", f"{name}{{", f"{name} ")):
                line = line.replace(name, name.removesuffix("_total"), 1)
                break
        out.append(line)
    return "".join(out)


COUNTER_PAGES = sorted(p for d in ("vllm-metrics", "sglang-metrics", "tensorrt-llm-metrics")
                       for p in (FIXTURES / d).glob("*.prom") if "_total counter" in p.read_text())


@pytest.mark.parametrize("path", COUNTER_PAGES, ids=lambda p: p.name)
def test_counters_declared_without_total_read_as_the_engines_own(path: Path) -> None:
    # They were left unread without a word: no preemptions, no finished requests, no token rates.
    text = path.read_text()
    unsuffixed = _counters_unsuffixed(text)
    assert unsuffixed != text and "_total counter" not in unsuffixed
    try:
        own = read_payload(text, timestamp=1.0)
    except UnrecognisedPayload as refused:  # a page refused (a router's) is refused alike
        with pytest.raises(UnrecognisedPayload, match="aggregates several servers"):
            read_payload(unsuffixed, timestamp=1.0)
        assert "aggregates several servers" in str(refused)
        return
    stripped = read_payload(unsuffixed, timestamp=1.0)
    assert stripped.readings == own.readings
    assert stripped.detection == own.detection


def test_a_counter_read_by_its_own_name_and_a_page_with_both_spellings_keep_theirs() -> None:
    base = (SGLANG / "gen-0.5.2-total-retracted-tp2.prom").read_text()
    own = read_payload(base, timestamp=1.0)
    # A lifetime total typed counter by a re-export is still read under its own name, not as "..._total".
    retyped = base.replace("# TYPE sglang:total_retracted_reqs gauge", "# TYPE sglang:total_retracted_reqs counter")
    assert retyped != base
    assert [r.preemptions_total for r in read_payload(retyped, timestamp=1.0).readings] == \
        [r.preemptions_total for r in own.readings] != [None] * len(own.readings)
    # A page with both spellings of a counter keeps the engine's own ``_total`` family.
    assert "# TYPE sglang:num_requests_total counter" in base
    both = base + '# TYPE sglang:num_requests counter\nsglang:num_requests{model_name="x"} 99\n'
    assert read_payload(both, timestamp=1.0).readings == own.readings
