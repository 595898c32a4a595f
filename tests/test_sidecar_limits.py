"""The sidecar's limits against a hostile target: the series cap, impossible values, a flapping target's log,
a parse abandoned at SIGTERM, and history that stays bounded when label values churn."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.engines import detect
from kvwatch.engines.detect import read_payload
from kvwatch.exposition import Exposition
from kvwatch.history import History
from kvwatch.model import Detection, Poll, Reading
from kvwatch.payload import ScrapeError, interpret
from kvwatch.serve.app import ChangeLog, Sidecar
from kvwatch.serve.collector import KvwatchCollector, make_registry
from kvwatch.settings import ServeSettings

FIXTURE = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom").read_text()


def label_explosion(models: int) -> str:
    """A vLLM-shaped payload with ``models`` model_name label values, one engine each."""
    lines = ["# TYPE vllm:kv_cache_usage_perc gauge"]
    lines += [f'vllm:kv_cache_usage_perc{{engine="0",model_name="m{i:05d}"}} 0.5' for i in range(models)]
    lines += ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="0",model_name="m{i:05d}"}} 3' for i in range(models)]
    return "\n".join(lines) + "\n"


class Served:
    """The fetcher's place in the sidecar: returns whatever body the test sets (or raises its ScrapeError)."""

    last_body_bytes = 0

    def __init__(self, body: str | ScrapeError) -> None:
        self.body = body

    def fetch(self) -> str:
        if isinstance(self.body, ScrapeError):
            raise self.body
        return self.body

    def close(self) -> None:
        pass


def scrape(sidecar: Sidecar) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    collector = KvwatchCollector(lambda: sidecar.state, now=time.time, stale_after=60.0)
    text = generate_latest(make_registry(collector)).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_series_beyond_max_series_are_dropped_counted_and_warned_once(caplog: pytest.LogCaptureFixture,
                                                                     no_kvwatch_env: None) -> None:
    sidecar = Sidecar(ServeSettings(max_series=50), Served(label_explosion(5000)), time.time)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="kvwatch"):
        for _ in range(3):
            sidecar.poll()
    samples = scrape(sidecar)
    usage = [k for k in samples if k[0] == "kvwatch_kv_usage_ratio"]
    assert len(usage) == 50 and ("model_name", "m00000") in usage[0][1]
    assert samples[("kvwatch_up", ())] == 1.0
    assert samples[("kvwatch_series_dropped_total", ())] == 3 * (5000 - 50)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "more than --max-series 50" in warnings[0].getMessage()
    assert len(caplog.records) <= 15  # no line per model (the capacity analyzer's included)


def test_the_parse_keeps_samples_of_at_most_twice_max_series_series() -> None:
    # Memory under a label explosion is bounded by --max-series, not by the body: the parse refuses
    # the samples of series beyond ADMIT_FACTOR * max_series instead of materialising all 100,000.
    kept: list[int] = []
    real_parse = detect.parse

    def counting_parse(*args: object, **kwargs: object) -> Exposition:
        exposition = real_parse(*args, **kwargs)  # type: ignore[arg-type]
        kept.append(sum(len(f.samples) for f in exposition))
        return exposition

    detect.parse = counting_parse  # type: ignore[assignment]
    try:
        poll = read_payload(label_explosion(50_000), timestamp=0.0, max_series=100)
    finally:
        detect.parse = real_parse  # type: ignore[assignment]
    assert kept == [2 * detect.ADMIT_FACTOR * 100]  # two families, one sample per series each
    assert len(poll.readings) == 100 and poll.readings[0].model_name == "m00000"
    assert poll.series_dropped == 50_000 - 100  # every series left out is still counted, once
    assert read_payload(label_explosion(150), timestamp=0.0, max_series=100).series_dropped == 50


def test_a_low_max_series_keeps_the_capacity_of_the_series_it_exports() -> None:
    # vLLM's cache_config_info is per engine without a model name: a label set that describes series, not a
    # series of its own. Refused as one, engine 0 lost its capacity and every poll counted 3 drops, not 1.
    text = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.16-sleep-state-dp2.prom").read_text()
    everything = read_payload(text, timestamp=0.0)
    capped = read_payload(text, timestamp=0.0, max_series=1)
    assert [r.engine for r in capped.readings] == ["0"] and capped.series_dropped == 1
    assert capped.readings[0].kv_capacity_tokens == everything.readings[0].kv_capacity_tokens == 160000
    assert capped.readings[0].num_gpu_blocks == everything.readings[0].num_gpu_blocks


def test_a_low_max_series_divides_the_summed_blocks_by_every_engine_on_the_page() -> None:
    # vLLM sums num_gpu_blocks over its data-parallel engines; with --max-series 1 the cap kept 2 of 4 engines' label
    # sets and the sum was divided by 2: each engine read twice its capacity, without a word.
    engines = range(4)
    text = "".join(f'vllm:{family}{{engine="{i}",model_name="m"}} {value}\n' for family, value in (
        ("num_requests_running", 3), ("num_requests_waiting", 1), ("kv_cache_usage_perc", 0.5)) for i in engines)
    text += "".join(f'vllm:cache_config_info{{block_size="16",engine="{i}",num_gpu_blocks="16000"}} 1\n'
                    for i in engines)
    for cap in (64, 2, 1):
        poll = read_payload(text, timestamp=0.0, max_series=cap)
        assert {(r.num_gpu_blocks, r.kv_capacity_tokens) for r in poll.readings} == {(4000, 64000)}, cap
    # Past what the cap counts, the page's engines and so each one's share are unknown, never a guess.
    many = range(detect.MAX_COUNTED_ENGINES + 10)
    text = "".join(f'vllm:{family}{{engine="{i}",model_name="m"}} {value}\n' for family, value in (
        ("num_requests_running", 3), ("kv_cache_usage_perc", 0.5)) for i in many)
    text += "".join(f'vllm:cache_config_info{{block_size="16",engine="{i}",num_gpu_blocks="16000"}} 1\n' for i in many)
    poll = read_payload(text, timestamp=0.0, max_series=2)
    assert [(r.num_gpu_blocks, r.kv_capacity_tokens) for r in poll.readings] == [(None, None)] * 2


def test_the_series_with_kv_usage_are_kept_ahead_of_a_label_explosion() -> None:
    # 70 model names without a usage gauge ("a00", ...) sorted ahead of the engine's own and pushed it past
    # --max-series: its KV usage was gone while kvwatch_up read 1.
    junk = "".join(f'vllm:num_requests_running{{engine="0",model_name="a{i:02d}"}} 1\n' for i in range(70))
    poll = read_payload(FIXTURE.replace("# EOF\n", "") + junk, timestamp=0.0, max_series=64)
    own = {r.key for r in read_payload(FIXTURE, timestamp=0.0).readings}  # (llama, engines 0 and 1)
    assert own <= {r.key for r in poll.readings if r.kv_usage_ratio is not None}
    assert len(poll.readings) == 64 and poll.series_dropped == len(own) + 70 - 64


def test_partial_label_sets_are_bounded_too() -> None:
    # A payload inventing engines without a model name (cache_config_info{engine="N"} for 5,000 values) keeps
    # at most the cap's number of them, and they are not counted as dropped series.
    limit = detect.SeriesLimit(10)
    kept = [limit.admit({"engine": str(i), "num_gpu_blocks": "10"}) for i in range(5_000)]
    assert sum(kept) == 10 and not limit.refused


def test_refused_samples_are_still_validated() -> None:
    body = label_explosion(300) + 'vllm:num_requests_running{engine="0",model_name="m00299"} x\n'
    with pytest.raises(ScrapeError) as info:
        interpret(body, None, timestamp=0.0, max_series=10)  # m00299 is beyond the 20 series the parse keeps
    assert info.value.reason == "parse" and "line 603" in str(info.value)


@pytest.mark.parametrize(("usage", "waiting"), [("NaN", "2"), ("-1", "-5"), ("1e308", "+Inf"), ("+Inf", "1e308"),
                                                ("-Inf", "NaN")])
def test_impossible_values_are_not_exported_while_up(usage: str, waiting: str, no_kvwatch_env: None,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    body = FIXTURE.replace('vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.96',
                           f'vllm:kv_cache_usage_perc{{engine="0",model_name="llama"}} {usage}')
    body = body.replace('vllm:num_requests_waiting{engine="0",model_name="llama"} 4.0',
                        f'vllm:num_requests_waiting{{engine="0",model_name="llama"}} {waiting}')
    sidecar = Sidecar(ServeSettings(), Served(body), time.time)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="kvwatch"):
        sidecar.poll()
        sidecar.poll()
    samples = scrape(sidecar)
    engine0 = (("engine", "0"), ("model_name", "llama"))
    assert samples[("kvwatch_up", ())] == 1.0
    assert ("kvwatch_kv_usage_ratio", engine0) not in samples
    assert ("kvwatch_kv_used_tokens", engine0) not in samples
    assert samples[("kvwatch_kv_usage_ratio", (("engine", "1"), ("model_name", "llama")))] == 0.5
    exported = [v for (name, _), v in samples.items() if name.startswith("kvwatch_")]
    assert all(v == v and abs(v) != float("inf") for v in exported)  # no NaN, no ±Inf anywhere
    assert all(v >= 0 for (name, _), v in samples.items() if name.startswith(("kvwatch_kv_", "kvwatch_requests_")))
    assert samples[("kvwatch_implausible_values_total", (("field", "kv_usage_ratio"),))] == 2
    waiting_ok = waiting in ("2",)
    assert (("kvwatch_requests_waiting", engine0) in samples) == waiting_ok
    assert sum("impossible values" in r.getMessage() for r in caplog.records) == 1  # once, not per poll


def test_usage_a_hair_outside_0_1_is_rounding_and_clamped(no_kvwatch_env: None) -> None:
    body = FIXTURE.replace('model_name="llama"} 0.96', 'model_name="llama"} 1.004')
    sidecar = Sidecar(ServeSettings(), Served(body), time.time)  # type: ignore[arg-type]
    sidecar.poll()
    assert scrape(sidecar)[("kvwatch_kv_usage_ratio", (("engine", "0"), ("model_name", "llama")))] == 1.0


def test_a_flapping_target_logs_a_burst_then_one_summary_per_window(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    changes = ChangeLog(logging.getLogger("kvwatch.test"), burst=3, window=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="kvwatch.test"):
        for i in range(600):  # up/down every 0.5 s for 5 minutes
            now[0] = i * 0.5
            changes.change("up" if i % 2 else "down", logging.WARNING, "target is %s", "up" if i % 2 else "down")
            changes.change("up" if i % 2 else "down", logging.WARNING, "same status: never logged")
            changes.tick()
    messages = [r.getMessage() for r in caplog.records]
    summaries = [m for m in messages if "not logged (flapping)" in m]
    assert 4 <= len(summaries) <= 6 and len(messages) == 3 + len(summaries)
    assert not any("same status" in m for m in messages)


def test_sigterm_abandons_a_parse_in_progress(no_kvwatch_env: None) -> None:
    """A parse of a body that takes seconds must not hold the poll (and so the process) at SIGTERM."""
    big = label_explosion(200_000)  # valid (the parser refuses a family declared twice) and slow to parse
    sidecar = Sidecar(ServeSettings(), Served(big), time.time)  # type: ignore[arg-type]
    finished = threading.Event()
    thread = threading.Thread(target=lambda: (sidecar.poll(), finished.set()), daemon=True)
    started = time.monotonic()
    thread.start()
    time.sleep(0.3)
    assert not finished.is_set(), "the parse must still be running for this test to mean anything"
    sidecar.stop()
    assert finished.wait(1.0)
    assert time.monotonic() - started < 1.5
    assert sidecar.state.health.polls_total == 0  # nothing half-done was published


def test_history_keeps_at_most_max_series_when_labels_churn() -> None:
    history = History(max_series=100)
    detection = Detection("vllm", ">=0.25", "vllm:kv_cache_usage_perc")
    for t in range(50):
        readings = tuple(Reading(model_name=f"m{t}-{i}", kv_usage_ratio=0.5) for i in range(40))
        history.record(Poll(timestamp=float(t), detection=detection, readings=readings))
    keys = list(history.keys())
    assert len(keys) == 100 and ("m49-0", "0") in keys and ("m0-0", "0") not in keys


def test_history_of_max_series_series_costs_what_their_readings_hold() -> None:
    """1000 series (a --max-series well above the default) of a label explosion report no counters: their
    history must not hold a running-total ring per counter anyway (~600 bytes each, ~9 MB for 1000 series).

    Measured in a fresh interpreter: in this process, threads left by other tests (servers winding down) allocate
    in kvwatch's code in the same window (a full run once read 3.4 MB against 1.25 MB alone)."""
    code = textwrap.dedent("""
        import tracemalloc
        from kvwatch.history import History
        from kvwatch.model import Detection, Poll, Reading
        history = History(max_series=1000)
        detection = Detection("vllm", ">=0.25", "vllm:kv_cache_usage_perc")
        readings = tuple(Reading(model_name=f"m{i:05d}", kv_usage_ratio=0.5, requests_running=3) for i in range(1000))
        tracemalloc.start()
        for t in range(2):
            history.record(Poll(timestamp=float(t), detection=detection, readings=readings))
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*/kvwatch/*")])
        print(sum(stat.size for stat in snapshot.statistics("filename")))
        print(history[("m00000", "0")].increase("preemptions_total"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    held = int(out[0])
    assert held < 3 * 2**20, held
    assert out[1] == "None"


def _lines_run(call: object) -> int:
    """Python lines executed by ``call()``: a machine-independent measure of work (not wall time)."""
    import sys

    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        call()  # type: ignore[operator]
    finally:
        sys.settrace(None)
    return count


def test_work_per_poll_does_not_grow_with_history(no_kvwatch_env: None) -> None:
    """At a 0.05 s interval the rate windows (60 s) and the detectors' windows (up to 300 s) hold thousands of
    samples: a poll must not walk them all (CPU per poll went 8 -> 23 ms over 3,000 polls)."""
    from kvwatch.serve.app import load_analyzers

    settings = ServeSettings(poll_interval_seconds=0.05)
    now = [1.7e9]
    sidecar = Sidecar(settings, Served(FIXTURE), lambda: now[0], load_analyzers(settings))  # type: ignore[arg-type]

    def poll() -> None:
        now[0] += 0.05
        sidecar.poll()

    for _ in range(30):
        poll()
    early = min(_lines_run(poll) for _ in range(5))
    for _ in range(3000):
        poll()
    late = min(_lines_run(poll) for _ in range(5))
    assert late < 1.5 * early, f"a poll ran {early} lines after 35 polls and {late} after 3035"


def test_a_page_of_endless_family_names_stops_at_the_family_cap_as_too_large() -> None:
    # 500,000 distinct unwanted names in a 16 MiB body: the parse kept metadata for each (~300 MB), over the
    # chart's 256 MiB limit. One engine's page has ~60 families; past MAX_FAMILIES the payload is refused.
    from kvwatch.exposition import MAX_FAMILIES

    good = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.11-kv-only.prom").read_text()
    body = good + "".join(f'other_metric_{i}{{a="x"}} {i}\n' for i in range(MAX_FAMILIES + 10))
    tracemalloc.start()
    try:
        with pytest.raises(ScrapeError) as caught:
            interpret(body, None, timestamp=0.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.reason == "too_large" and "metric families" in str(caught.value)
    assert peak < 32 * 2**20, f"{peak / 2**20:.1f} MiB held"  # the families up to the cap, not the body
    assert interpret(good + "".join(f'other_metric_{i} {i}\n' for i in range(1000)), None, timestamp=0.0).readings


def test_a_model_name_longer_than_any_real_one_is_too_large() -> None:
    # A 5 MiB model_name, repeated in every kvwatch_* series, made a 110 MB exposition and 522 MB of RSS.
    from kvwatch.payload import MAX_LABEL_CHARS

    def page(name: str) -> str:
        return ("# TYPE vllm:kv_cache_usage_perc gauge\n"
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="{name}"}} 0.5\n')

    assert interpret(page("m" * MAX_LABEL_CHARS), None, timestamp=0.0).readings
    with pytest.raises(ScrapeError) as caught:
        interpret(page("m" * (MAX_LABEL_CHARS + 1)), None, timestamp=0.0)
    assert caught.value.reason == "too_large" and "model_name label of 1,025 characters" in str(caught.value)


def test_an_outsized_config_or_reason_label_is_left_out_and_no_message_quotes_megabytes() -> None:
    # A 7 MB cache_dtype new every poll was kept in each history entry (+6.7 MB of RSS a poll, kvwatch_up 1); a
    # disagreeing pid copy's 2 MB label made a 4 MB warning line.
    from kvwatch.payload import MAX_LABEL_CHARS, MAX_MESSAGE_CHARS

    fixtures = Path(__file__).parent / "fixtures" / "vllm-metrics"
    huge = "x" * (MAX_LABEL_CHARS + 1)
    page = (fixtures / "gen-0.11-kv-only.prom").read_text().replace('cache_dtype="auto"', f'cache_dtype="{huge}"')
    page += (f"# TYPE vllm:num_requests_waiting_by_reason gauge\nvllm:num_requests_waiting_by_reason{{engine=\"0\","
             f'model_name="m",reason="{huge}"}} 2\nvllm:num_requests_waiting_by_reason{{engine="0",model_name="m",'
             'reason="capacity"} 1\n')
    poll = interpret(page, None, timestamp=0.0)
    (r,) = poll.readings
    assert "cache_dtype" not in r.cache_config and r.cache_config["num_gpu_blocks"] == "1000"
    assert dict(r.waiting_by_reason) == {"capacity": 1.0} and r.kv_usage_ratio == 0.1
    assert {field for _, field, _ in poll.undetermined} == {"cache_config", "waiting_by_reason"}
    pid = (fixtures / "gen-0.11.0-multiproc-pid-disagree.prom").read_text()
    pid = pid.replace('pid="18257"', f'pid="{huge * 2000}"')
    poll = interpret(pid, None, timestamp=0.0)
    assert poll.undetermined and all(len(why) < MAX_MESSAGE_CHARS + 100 for _, _, why in poll.undetermined)


def test_a_value_the_page_does_not_determine_is_logged_once_not_counted(no_kvwatch_env: None,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    # An override whose labelled gauge has no sample yet: unknown, not implausible, and the sidecar says why once.
    body = "# TYPE proxy_waiting gauge\n" + FIXTURE
    sidecar = Sidecar(ServeSettings(waiting_metric='proxy_waiting{pool="a"}'), Served(body),  # type: ignore[arg-type]
                      time.time)
    with caplog.at_level(logging.WARNING, logger="kvwatch"):
        for _ in range(3):
            sidecar.poll()
    samples = scrape(sidecar)
    assert samples[("kvwatch_up", ())] == 1.0
    assert not any(name == "kvwatch_requests_waiting" for name, _ in samples)
    assert not any(value for (name, _), value in samples.items() if name == "kvwatch_implausible_values_total")
    assert sum("--waiting-metric" in r.getMessage() for r in caplog.records) == 1


def test_the_sidecar_logs_its_capacity_model_once(no_kvwatch_env: None, caplog: pytest.LogCaptureFixture) -> None:
    # The sidecar's series capacity filled the plan cache first, so the analyzer never saw a plan as new: no
    # "capacity model" line, and no max_model_len_mismatch warning, ever reached the log.
    body = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom").read_text()
    from kvwatch.serve.app import load_analyzers
    from kvwatch.serve.sidecar_capacity import CapacityResolver

    settings = ServeSettings(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100", max_model_len=4096,
                             kv_cache_dtype="fp8")
    capacity = CapacityResolver(settings)  # one resolver for the sidecar and its analyzers, as run() wires them
    sidecar = Sidecar(settings, Served(body), time.time, load_analyzers(settings, capacity),  # type: ignore[arg-type]
                      capacity=capacity)
    with caplog.at_level(logging.INFO, logger="kvwatch"):
        for _ in range(3):
            sidecar.poll()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("capacity model for llama: kvwatch was given --max-model-len 4096," in m for m in messages) == 1
    assert sum(m.startswith("capacity model for llama: from vllm:cache_config_info") for m in messages) == 1
    # a setting other than the engine's, once too (the what-ifs went stale without a word)
    assert sum("capacity model for llama: kvwatch was given --kv-cache-dtype fp8 where the engine runs cache_dtype "
               "auto" in m for m in messages) == 1


@pytest.mark.parametrize("extra", ["process_start_time_seconds", "vllm:request_prompt_tokens_bucket"])
def test_a_label_kvwatch_does_not_key_on_cannot_multiply_a_series_past_the_cap(extra: str) -> None:
    # The series cap counts (model_name, engine) pairs: an extra label on a read family (x, pod) was never limited.
    # 410,000 values of one took the sidecar to 310 MB with kvwatch_up 1. Now a series holding more samples than an
    # engine's page ever has refuses the page as too large, within a bounded parse.
    page = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom").read_text()
    series = 'engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct",'
    labels = "" if extra.startswith("process") else series
    rows = "".join(f'{extra}{{{labels}x="{i}"}} 1\n' for i in range(detect.SAMPLES_PER_SERIES + 1))
    family = extra.removesuffix("_bucket")
    assert f"# TYPE {family} " in page
    at = page.index("\n", page.index(f"# TYPE {family} ")) + 1
    with pytest.raises(ScrapeError) as info:
        interpret(page[:at] + rows + page[at:], None, timestamp=0.0, max_series=64)
    assert info.value.reason == "too_large" and "does not key on" in str(info.value)
    assert interpret(page, None, timestamp=0.0, max_series=64).readings  # the page itself reads


def _sglang_tenants_page(tenants: int) -> str:
    """One SGLang server whose tokenizer metrics carry a per-request custom label (--tokenizer-metrics-allowed-
    custom-labels tenant, filled from the x-custom-labels header), rendered by prometheus_client from the names,
    labels and buckets of sglang's python/sglang/srt/metrics/collector.py (TokenizerMetricsCollector)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    registry = CollectorRegistry()
    model = "Qwen/Qwen3-8B"
    scheduler = {"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
    for name, value in (("num_running_reqs", 40), ("num_queue_reqs", 2), ("token_usage", 0.8),
                        ("max_total_num_tokens", 400000)):
        Gauge(f"sglang:{name}", name, list(scheduler), registry=registry).labels(**scheduler).set(value)
    labels = ["model_name", "engine_type", "is_streaming", "tenant"]
    counters = [Counter(f"sglang:{n}", n, labels, registry=registry)
                for n in ("prompt_tokens", "generation_tokens", "num_requests")]
    histograms = [Histogram("sglang:time_to_first_token_seconds", "ttft", labels, registry=registry,
                            buckets=[0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]),
                  Histogram("sglang:e2e_request_latency_seconds", "e2e", labels, registry=registry,
                            buckets=[0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
                                     1200, 1800, 2400])]
    for tenant in range(tenants):
        for streaming in ("true", "false"):
            values = {"model_name": model, "engine_type": "unified", "is_streaming": streaming,
                      "tenant": f"team-{tenant}"}
            for counter, amount in zip(counters, (1000, 200, 1), strict=True):
                counter.labels(**values).inc(amount)
            for histogram in histograms:
                histogram.labels(**values).observe(0.3)
    return generate_latest(registry).decode()


def test_a_server_with_many_tenant_labels_reads_within_the_cap() -> None:
    # 27 tenants' copies of SGLang's tokenizer counters and histograms (parts the adapter adds up) passed 4,096
    # samples of one series: serve refused the page every poll, for good, while `check` read it.
    page = _sglang_tenants_page(60)
    assert page.count("_bucket{") > 4096
    reading = interpret(page, None, timestamp=0.0, max_series=64).readings[0]
    assert reading.prompt_tokens_total == 60 * 2 * 1000 and reading.requests_running == 40
    assert reading.latency["e2e"].count == 120


def test_the_latency_log_keeps_at_most_its_series_when_labels_churn() -> None:
    # Model names new every poll grew LatencyAnalyzer's per-series log by ~850 bytes a series ever seen (a
    # target churning names: 36 to 150 MiB in 90 s at 64 new names a poll, kvwatch_up 1, nothing said).
    from kvwatch.history import SeriesHistory
    from kvwatch.model import Histogram
    from kvwatch.serve.latency import LatencyAnalyzer, make_analyzer

    analyzer = LatencyAnalyzer(max_series=100)
    latency = {"e2e": Histogram(bounds=(1.0, float("inf")), cumulative=(1.0, 2.0), count=2.0, sum=3.0)}
    for t in range(50):
        for i in range(40):
            history = SeriesHistory()
            reading = Reading(model_name=f"m{t}-{i}", kv_usage_ratio=0.5, latency=latency)
            history.append(float(t), reading)
            analyzer.analyze(reading.key, history, reading, float(t))
    assert len(analyzer._edge_log) == 100 and ("m49-39", "0") in analyzer._edge_log
    assert make_analyzer(ServeSettings(max_series=64), None).max_series == 128  # type: ignore[arg-type]


def test_the_parsers_caches_hold_no_long_lines_across_polls() -> None:
    # The caches shared between parses were bounded in entries, not size: an 8 MiB HELP line (or a 4 MiB label
    # value) new every poll grew the sidecar 12-16 MiB a poll with kvwatch_up 1.
    from kvwatch import exposition

    page = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom").read_text()
    for poll in range(5):
        junk = f"# HELP junk_family {poll} " + "h" * 100_000 + "\n# TYPE junk_family gauge\njunk_family 1\n"
        label = f'vllm:num_requests_running{{engine="9",model_name="other",x="{poll}{"x" * 100_000}"}} 1\n'
        exposition.parse(junk + page + label)
    cached = [k for cache in (exposition._COMMENTS, exposition._PREFIXES) for k in cache]
    assert cached and max(len(k) for k in cached) < 10_000


def test_many_series_under_the_per_series_cap_are_too_large_together() -> None:
    # 336,000 samples over 128 series, each under SAMPLES_PER_SERIES: 277 MiB at the parse's peak,
    # then refused as unrecognised
    per_series = detect.SAMPLES_PER_PAGE // 100 + 1
    rows = "".join(f'vllm:num_requests_running{{engine="{e}",x="{i}"}} 1\n'
                   for e in range(100) for i in range(per_series))
    with pytest.raises(ScrapeError) as info:
        interpret("# TYPE vllm:num_requests_running gauge\n" + rows, None, timestamp=0.0, max_series=64)
    assert info.value.reason == "too_large" and f"more than {detect.SAMPLES_PER_PAGE:,} samples" in str(info.value)


def test_a_reason_label_with_more_values_than_an_engine_has_is_too_large() -> None:
    # 5,000 finished_reason values per series, counts moving every poll: 656 MiB, kvwatch_up 1
    def page(reasons: int) -> str:
        rows = "".join(f'vllm:request_success_total{{engine="0",finished_reason="r{i}",model_name="m"}} {i}\n'
                       for i in range(reasons))
        return ('# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
                "# TYPE vllm:request_success_total counter\n" + rows)

    assert len(interpret(page(detect.REASONS_PER_SERIES), None, timestamp=0.0).readings[0].finished_by_reason) == 64
    with pytest.raises(ScrapeError) as info:
        interpret(page(detect.REASONS_PER_SERIES + 1), None, timestamp=0.0)
    assert info.value.reason == "too_large" and "values of finished_reason" in str(info.value)


def test_only_the_newest_entry_keeps_its_per_reason_counts() -> None:
    from kvwatch.history import SeriesHistory

    history = SeriesHistory()
    for t in range(3):
        history.append(float(t), Reading(model_name="m", kv_usage_ratio=0.5,
                                         finished_by_reason={"stop": 10.0 - 5 * (t == 2)},
                                         waiting_by_reason={"capacity": float(t)}))
    entries = list(history)
    assert [dict(e.reading.finished_by_reason) for e in entries] == [{}, {}, {"stop": 5.0}]
    assert not entries[0].reading.waiting_by_reason and entries[-1].reading.waiting_by_reason == {"capacity": 2.0}
    assert history.last_restart_reason == "request_success_total went down"  # read from the newest one before


def test_a_failure_message_quoting_a_huge_label_is_cut() -> None:
    # a duplicate series with a 1 MiB label made each warning a 1 MiB log line
    label = "v" * 2**20
    page = (f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="m",x="{label}"}} 1\n'
            f'vllm:num_requests_running{{model_name="m",x="{label}"}} 2\n')
    with pytest.raises(ScrapeError) as info:
        interpret(page, None, timestamp=0.0)
    assert "duplicate series" in str(info.value) and len(str(info.value)) < 1100


def test_a_max_series_raised_for_a_target_serving_more_raises_the_page_cap_too() -> None:
    # 600 real series of ~125 samples each (75,000) were refused at a fixed 65,536 cap although
    # --max-series 1000 admitted them, as docs/reliability.md tells such an operator to do
    bounds = [f"{0.01 * 1.06 ** i:.6g}" for i in range(120)] + ["+Inf"]
    lines = ["# TYPE vllm:kv_cache_usage_perc gauge", "# TYPE vllm:num_requests_running gauge",
             "# TYPE vllm:e2e_request_latency_seconds histogram"]
    for i in range(600):
        series = f'engine="0",model_name="m{i:03d}"'
        lines += [f"vllm:kv_cache_usage_perc{{{series}}} 0.5", f"vllm:num_requests_running{{{series}}} 3"]
        lines += [f'vllm:e2e_request_latency_seconds_bucket{{{series},le="{b}"}} {n}' for n, b in enumerate(bounds)]
        lines += [f"vllm:e2e_request_latency_seconds_sum{{{series}}} 5", f"vllm:e2e_request_latency_seconds_count"
                  f"{{{series}}} {len(bounds) - 1}"]
    page = "\n".join(lines) + "\n"
    assert page.count("\n") > detect.SAMPLES_PER_PAGE
    assert len(interpret(page, None, timestamp=0.0, max_series=1000).readings) == 600
    assert len(interpret(page, None, timestamp=0.0, max_series=64).readings) == 64  # the parse kept 128 of them


def test_a_long_comment_line_is_read_without_copies_of_it() -> None:
    # Telling a plain comment from HELP/TYPE sliced the line twice and scanned it a character at a
    # time: a 16 MiB comment held 3 copies of itself beside the text (a 60 MiB page peaked at 275 MB of RSS) and
    # took seconds. The page text and the line split from it are what a poll of it holds.
    line = "# " + "x" * (16 << 20)
    body = FIXTURE + line + "\n"
    tracemalloc.start()
    try:
        poll = interpret(body, None, timestamp=0.0, max_series=64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert poll.readings
    assert peak < 1.3 * len(line), f"{peak / 2**20:.1f} MiB held for a {len(line) >> 20} MiB line"


def test_the_fetcher_frees_a_bodys_bytes_once_it_is_text() -> None:
    # The bytes were copied (bytes(body)) to decode them, and the buffer kept through the parse:
    # bytes, copy and text together
    from kvwatch.fetch import Fetcher

    fetcher = Fetcher.__new__(Fetcher)
    fetcher.url, fetcher.max_body_bytes = "http://vllm:8000/metrics", 64 << 20
    body = bytearray(FIXTURE.encode()) + bytearray(b"# " + b"x" * (8 << 20) + b"\n")
    tracemalloc.start()
    try:
        text = fetcher._text(body, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text.startswith(FIXTURE) and not body  # the buffer is emptied: only the text is held after it
    assert peak < 1.2 * len(text), f"{peak / 2**20:.1f} MiB to decode {len(text) >> 20} MiB"


def test_a_bad_byte_in_a_comment_is_read_without_a_copy_of_the_page_per_line() -> None:
    # Telling whether undecodable bytes are all in plain comments split the page into lines beside
    # two decoded texts: 6 times the body. Only their lines are looked at now, in place, one text alive at a time.
    from kvwatch.fetch import decode_body

    body = bytearray(FIXTURE.encode() + b"# bad \xff comment\n" + (b"# " + b"x" * 100 + b"\n") * 40000)
    tracemalloc.start()
    try:
        text = decode_body(body, None, "http://vllm:8000/metrics")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "bad \ufffd comment" in text
    assert peak < 4.5 * len(body), f"{peak / len(body):.1f} x the body"


def test_a_poll_running_past_the_interval_leaves_its_series_fresh_until_stale_after_its_end(
        no_kvwatch_env: None) -> None:
    # Freshness counted from the start of the last good poll: a poll of 9 s at a 5-s interval
    # (its next tick skipped, polls starting 10 s apart) left its series stale from 15 s after it began until the
    # next one ended, kvwatch_state "unknown" and usage absent with kvwatch_up 1: a pending alert's `for` restarted.
    clock = [0.0]

    class Slow(Served):
        def fetch(self) -> str:
            clock[0] += 9.0  # the fetch (and GPU read) take 9 s of poll clock
            return super().fetch()

    sidecar = Sidecar(ServeSettings(poll_interval_seconds=5.0), Slow(FIXTURE), lambda: clock[0])  # type: ignore
    stale_after = 15.0  # (3 x the interval, the default)
    sidecar.poll()  # from 0 to 9
    clock[0] = 10.0
    sidecar.poll()  # the next tick (at 10): from 10 to 19
    for now in (19.0, 24.0, 27.0, 33.9):  # while the second runs, and after it, until 15 s after it ended
        assert sidecar.state.fresh(now, stale_after), now
    assert not sidecar.state.fresh(34.1, stale_after)
    collector = KvwatchCollector(lambda: sidecar.state, now=lambda: 27.0, stale_after=stale_after)
    text = generate_latest(make_registry(collector)).decode()
    assert 'kvwatch_kv_usage_ratio{engine="0",model_name="llama"}' in text


def test_model_flags_meeting_a_page_of_several_models_are_warned_once(caplog: pytest.LogCaptureFixture,
                                                                     no_kvwatch_env: None) -> None:
    # --model describes one model; Triton's page served two and both were sized as it, with the
    # whole card, without a word. kvwatch cannot tell which model_name the flag meant (Triton names models after
    # folders), so it says so, once, and again when the page serves one model
    triton = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-triton-vllm-backend.prom").read_text()
    served = Served(triton)
    sidecar = Sidecar(ServeSettings(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100"), served,  # type: ignore
                      time.time)
    with caplog.at_level(logging.INFO, logger="kvwatch"):
        sidecar.poll()
        sidecar.poll()
        served.body = "\n".join(line for line in triton.splitlines() if "mistral_7b" not in line) + "\n"
        sidecar.poll()
    said = [r.getMessage() for r in caplog.records if "describe one model" in r.getMessage()]
    assert len(said) == 1 and "this page serves 2 (llama3_8b, mistral_7b)" in said[0]
    assert any("serves one model again" in r.getMessage() for r in caplog.records)


def test_a_counter_that_went_down_alone_is_counted_as_impossible_not_a_restart(
        no_kvwatch_env: None, caplog: pytest.LogCaptureFixture) -> None:
    # The page's process_start_time_seconds is unchanged, so the engine did not restart: its preemption counter
    # halved for a poll is a broken read (unknown, counted), not "preemptions_total went down".
    preempted = 'vllm:num_preemptions_total{engine="0",model_name="llama"} '
    sidecar = Sidecar(ServeSettings(), Served(FIXTURE), time.time)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="kvwatch"):
        sidecar.poll()
        sidecar.fetcher.body = FIXTURE.replace(preempted + "42.0", preempted + "21.0")
        sidecar.poll()
        sidecar.fetcher.body = FIXTURE
        sidecar.poll()
    assert not [r for r in caplog.records if "restarted" in r.getMessage()]
    assert scrape(sidecar)[("kvwatch_implausible_values_total", (("field", "preemptions_total"),))] == 1
    assert sidecar.history[("llama", "0")].restarts == 0
    # A new start time with the counters down is a restart, as before.
    with caplog.at_level(logging.WARNING, logger="kvwatch"):
        sidecar.fetcher.body = FIXTURE.replace(preempted + "42.0", preempted + "1.0").replace(
            "process_start_time_seconds 1.79e+09", "process_start_time_seconds 1.8e+09")
        sidecar.poll()
    assert sidecar.history[("llama", "0")].restarts == 1
    assert scrape(sidecar)[("kvwatch_implausible_values_total", (("field", "preemptions_total"),))] == 1
