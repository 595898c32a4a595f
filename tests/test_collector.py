"""The collector: exported families from one State, staleness, analyzers, never raising."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.derived import derive
from kvwatch.engines import vllm
from kvwatch.exposition import parse
from kvwatch.history import History, SeriesHistory
from kvwatch.model import Reading, SeriesKey
from kvwatch.serve.collector import KvwatchCollector, make_registry
from kvwatch.serve.state import Health, State

FIXTURE = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom").read_text()


def state_at(t: float) -> State:
    poll = vllm.read(parse(FIXTURE), timestamp=t)
    history = History()
    history.record(poll)
    series = {r.key: derive(r, history[r.key], max_model_len=8192, extra={"demo": r.kv_usage_ratio})
              for r in poll.readings}
    return State(timestamp=t, health=Health(up=True, last_success_timestamp=t, last_success_wall_seconds=t,
                                            scrape_duration_seconds=0.01),
                 detection=poll.detection, series=series)


def scrape(collector: KvwatchCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(make_registry(collector)).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


class DemoAnalyzer:
    name = "demo"
    history_seconds = 0.0

    def analyze(self, key: SeriesKey, history: SeriesHistory, reading: Reading, now: float) -> Any:
        return reading.kv_usage_ratio

    def families(self, results: Mapping[SeriesKey, Any], now: float) -> Iterable[Any]:
        family = GaugeMetricFamily("kvwatch_demo_ratio", "demo", labels=["model_name", "engine"])
        for key, result in results.items():
            family.add_metric(list(key), result * 2)
        yield family


def test_fresh_state_exports_health_and_series() -> None:
    samples = scrape(KvwatchCollector(lambda: state_at(1000.0), now=lambda: 1001.0, stale_after=15.0,
                                      analyzers=[DemoAnalyzer()]))
    e0 = {"model_name": "llama", "engine": "0"}
    assert value(samples, "kvwatch_up") == 1.0
    assert value(samples, "kvwatch_last_success_timestamp_seconds") == 1000.0
    assert value(samples, "kvwatch_scrape_errors_total", reason="timeout") == 0.0
    assert value(samples, "kvwatch_source_info", engine_kind="vllm", version_range=">=0.21",
                 usage_metric="vllm:kv_cache_usage_perc", running_metric="vllm:num_requests_running",
                 waiting_metric="vllm:num_requests_waiting",
                 capacity_metric="vllm:cache_config_info{kv_cache_size_tokens}") == 1.0
    assert value(samples, "kvwatch_kv_usage_ratio", **e0) == 0.96
    assert value(samples, "kvwatch_kv_capacity_tokens", **e0) == 163840.0
    assert value(samples, "kvwatch_kv_used_tokens", **e0) == 0.96 * 163840.0
    assert value(samples, "kvwatch_requests_waiting", **e0) == 4.0
    # Live footprint: 16 running hold 96 % of the cache, so 16 / 0.96 fit. (The mean finished request,
    # 2000 + 500 tokens, would claim 163840 / 2500 = 65.5: long requests stay longer than that mean says.)
    assert value(samples, "kvwatch_max_concurrency", basis="observed_mix", **e0) == pytest.approx(16 / 0.96)
    assert value(samples, "kvwatch_max_concurrency", basis="max_model_len", **e0) == 20.0
    assert value(samples, "kvwatch_concurrency_headroom", **e0) == pytest.approx(16 / 0.96 - 16)
    assert value(samples, "kvwatch_demo_ratio", **e0) == 1.92
    assert value(samples, "kvwatch_build_info", version=__import__("kvwatch").__version__) == 1.0


def test_stale_state_keeps_only_health() -> None:
    samples = scrape(KvwatchCollector(lambda: state_at(1000.0), now=lambda: 1016.0, stale_after=15.0,
                                      analyzers=[DemoAnalyzer()]))
    names = {name for name, _ in samples}
    assert "kvwatch_up" in names and "kvwatch_scrape_errors_total" in names
    assert not any(n.startswith(("kvwatch_kv_", "kvwatch_requests_", "kvwatch_demo", "kvwatch_max_c"))
                   for n in names)


def test_up_is_0_once_no_poll_has_finished_for_stale_after() -> None:
    # The last poll succeeded, then polling stopped (a poll thread blocked in a log call): up stayed
    # 1 for as long as the process lived.
    assert value(scrape(KvwatchCollector(lambda: state_at(1000.0), now=lambda: 1015.0, stale_after=15.0)),
                 "kvwatch_up") == 1.0
    assert value(scrape(KvwatchCollector(lambda: state_at(1000.0), now=lambda: 1016.0, stale_after=15.0)),
                 "kvwatch_up") == 0.0


def test_empty_state_before_first_poll() -> None:
    samples = scrape(KvwatchCollector(State, now=lambda: 0.0, stale_after=15.0))
    assert value(samples, "kvwatch_up") == 0.0
    assert value(samples, "kvwatch_last_success_timestamp_seconds") is None


def test_collector_never_raises() -> None:
    class Broken:
        name = "demo"

        def families(self, results: Any, now: float) -> Iterable[Any]:
            raise RuntimeError("bug")

    def bad_state() -> State:
        raise RuntimeError("bug")

    assert value(scrape(KvwatchCollector(bad_state, now=lambda: 0.0, stale_after=1.0)),
                 "kvwatch_build_info", version=__import__("kvwatch").__version__) == 1.0
    samples = scrape(KvwatchCollector(lambda: state_at(10.0), now=lambda: 10.0, stale_after=1.0,
                                      analyzers=[Broken()]))  # type: ignore[list-item]
    assert value(samples, "kvwatch_kv_usage_ratio", model_name="llama", engine="1") == 0.5


def test_preemption_rate_from_history() -> None:
    history = SeriesHistory()
    for t in range(0, 70, 10):
        history.append(float(t), Reading("m", preemptions_total=3.0 * t, kv_usage_ratio=0.5, requests_running=10.0))
    state = derive(history.latest.reading, history)  # type: ignore[union-attr]
    assert state.preemptions_per_second == 3.0
    # No histograms: the ceiling at the observed mix falls back to running / usage.
    assert state.max_concurrency["observed_mix"] == 20.0 and math.isclose(state.concurrency_headroom or 0, 10.0)


# ---------------------------------------------------------------- the poll loop (Sidecar) with a driven clock

class ManualClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def payload(preemptions: float, usage: float = 0.5) -> str:
    return (
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 4\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
        f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {preemptions}\n'
    )


def test_sidecar_polls_swap_state_and_count_errors(no_kvwatch_env: None) -> None:
    import httpx
    import respx

    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar
    from kvwatch.settings import ServeSettings

    url = "http://vllm.test/metrics"
    settings = ServeSettings(target_url=url, poll_interval_seconds=5)
    clock = ManualClock()
    with respx.mock, Fetcher(url, timeout=1.0, max_body_bytes=1 << 20) as fetcher:
        route = respx.get(url)
        sidecar = Sidecar(settings, fetcher, clock, analyzers=[DemoAnalyzer()])
        states = []
        for preemptions in (0, 10, 20):
            route.mock(return_value=httpx.Response(200, text=payload(preemptions)))
            states.append(sidecar.poll())
            clock.t += 5.0
        assert sidecar.state is states[-1] and states[0] is not states[1]
        series = states[-1].series[("m", "0")]
        assert series.preemptions_per_second == 2.0  # 20 preemptions over 10 poll-clock seconds
        assert series.extra == {"demo": 0.5}
        route.mock(return_value=httpx.Response(503))
        down = sidecar.poll()
        assert (down.health.up, down.health.last_error_reason, down.health.errors_total["http_status"]) == (
            False, "http_status", 1)
        assert down.series is states[-1].series  # kept until stale, then the collector hides them
        assert down.health.last_success_timestamp == 1010.0 and down.health.polls_total == 4


def test_clock_speed_scales_elapsed_time() -> None:
    import time

    from kvwatch.serve.app import Clock

    clock = Clock(speed=100.0)
    start = clock()
    time.sleep(0.05)
    assert clock() - start >= 100.0 * 0.05 * 0.9  # at least, never asserting an upper bound on a busy machine


def test_every_per_series_help_says_kvwatch_polls_on_its_own_timer() -> None:
    collector = KvwatchCollector(lambda: state_at(1000.0), now=lambda: 1001.0, stale_after=15.0)
    text = generate_latest(make_registry(collector)).decode()
    per_series = [f for f in text_string_to_metric_families(text)
                  if any("engine" in s.labels for s in f.samples)]
    assert {f.name for f in per_series} >= {"kvwatch_max_concurrency", "kvwatch_kv_usage_ratio"}
    assert [f.name for f in per_series if "on its own timer" not in f.documentation] == []


def test_a_failure_inside_kvwatch_is_counted_and_reported_down_not_a_frozen_up(
        no_kvwatch_env: None, caplog: pytest.LogCaptureFixture) -> None:
    # An exception outside the ScrapeError path (here the history refusing a poll whose clock did not advance,
    # met with --clock-speed 1e-9, and a charset=idna body) was logged by the poller's catch-all: the
    # state was never replaced, kvwatch_up stayed 1 and no error was counted, so KvwatchTargetDown never fired.
    import httpx
    import respx

    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar
    from kvwatch.settings import ServeSettings

    url = "http://vllm.test/metrics"
    settings = ServeSettings(target_url=url, poll_interval_seconds=5)
    clock = ManualClock()
    with respx.mock, Fetcher(url, timeout=1.0, max_body_bytes=1 << 20) as fetcher:
        route = respx.get(url).mock(return_value=httpx.Response(200, text=payload(0)))
        sidecar = Sidecar(settings, fetcher, clock, analyzers=[DemoAnalyzer()])
        assert sidecar.poll().health.up
        with caplog.at_level(logging.ERROR):
            stuck = sidecar.poll()  # the same clock reading again
        assert (stuck.health.up, stuck.health.last_error_reason, stuck.health.errors_total["internal"]) == (
            False, "internal", 1)
        assert "kvwatch failed on this poll" in stuck.health.last_error and "Traceback" in caplog.text
        clock.t += 5.0
        assert sidecar.poll().health.up
        # A charset that is no text encoding (undefined, idna) or decodes in quadratic time (punycode) is read as
        # UTF-8, as Prometheus reads every body (punycode held the fetcher's loop for minutes).
        for charset in ("undefined", "punycode"):
            route.mock(return_value=httpx.Response(200, content=payload(0).encode(),
                                                   headers={"Content-Type": f"text/plain; charset={charset}"}))
            clock.t += 5.0
            assert sidecar.poll().health.up, charset


def test_an_adapter_bug_is_internal_with_its_traceback(no_kvwatch_env: None, caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # (Standing in for a bug no test knows yet: the adapter raising on a payload.) It was counted as
    # "unrecognised" and logged with a traceback on every poll, unlimited.
    import httpx
    import respx

    from kvwatch.engines import vllm
    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar
    from kvwatch.settings import ServeSettings

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(vllm, "read", broken)
    url = "http://vllm.test/metrics"
    clock = ManualClock()
    with respx.mock, Fetcher(url, timeout=1.0, max_body_bytes=1 << 20) as fetcher, caplog.at_level(logging.INFO):
        respx.get(url).mock(return_value=httpx.Response(200, text=payload(0)))
        sidecar = Sidecar(ServeSettings(target_url=url, poll_interval_seconds=5), fetcher, clock,
                          analyzers=[DemoAnalyzer()])
        for _ in range(5):
            state = sidecar.poll()
            clock.t += 5.0
    assert (state.health.up, state.health.errors_total["internal"]) == (False, 5)
    assert caplog.text.count("Traceback") == 1 and "KeyError: 'a bug'" in caplog.text


def poll_pages(texts: Iterable[str], caplog: pytest.LogCaptureFixture) -> list[State]:
    """A sidecar polling each page in turn, 5 s apart, logging at INFO into ``caplog``."""
    import httpx
    import respx

    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar
    from kvwatch.settings import ServeSettings

    url = "http://vllm.test/metrics"
    clock = ManualClock()
    states = []
    with respx.mock, Fetcher(url, timeout=1.0, max_body_bytes=1 << 20) as fetcher, caplog.at_level(logging.INFO):
        route = respx.get(url)
        sidecar = Sidecar(ServeSettings(target_url=url, poll_interval_seconds=5), fetcher, clock,
                          analyzers=[DemoAnalyzer()])
        for text in texts:
            route.mock(return_value=httpx.Response(200, text=text))
            states.append(sidecar.poll())
            clock.t += 5.0
    return states


def test_a_new_cause_of_an_outage_is_logged_and_a_moving_number_is_not(no_kvwatch_env: None,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    # The down line's status was its reason alone: a 503 while vLLM loaded, then a 401 after an auth change, read
    # "answered HTTP 503" in the log for good (and a deleted, then empty, token file logged only the first).
    import httpx
    import respx

    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar
    from kvwatch.settings import ServeSettings

    url = "http://vllm.test/metrics"
    clock = ManualClock()
    answers = [httpx.Response(503), httpx.Response(503), httpx.Response(401), httpx.Response(401),
               *(httpx.Response(200, content=b"vllm:x 1\n" * lines + b"\xff\n") for lines in (3, 7))]
    with respx.mock, Fetcher(url, timeout=1.0, max_body_bytes=1 << 20) as fetcher, caplog.at_level(logging.INFO):
        route = respx.get(url)
        sidecar = Sidecar(ServeSettings(target_url=url, poll_interval_seconds=5), fetcher, clock,
                          analyzers=[DemoAnalyzer()])
        for answer in answers:
            route.mock(return_value=answer)
            sidecar.poll()
            clock.t += 5.0
    downs = [line for line in caplog.text.splitlines() if "is down" in line]
    assert ["HTTP 503" in downs[0], "HTTP 401" in downs[1], "(parse)" in downs[2], len(downs)] == [True] * 3 + [3]


def test_every_restart_of_a_series_is_logged(no_kvwatch_env: None, caplog: pytest.LogCaptureFixture) -> None:
    # The restart line's status was (series, reason), the same every time: only the first restart was ever logged.
    poll_pages((payload(preemptions) for preemptions in (50, 0, 50, 0, 50, 0)), caplog)  # (counters going down)
    assert caplog.text.count("restarted") == 3


def test_a_family_without_samples_is_left_out_whole() -> None:
    # kvwatch_formula_kv_capacity_tokens & co. had HELP and TYPE lines with no sample when kvwatch was not given a
    # model; the docs call such a metric absent.
    class Sparse:
        name = "sparse"

        def families(self, results: Any, now: float) -> Iterable[Any]:
            full = GaugeMetricFamily("kvwatch_test_full", "has a sample.")
            full.add_metric([], 1.0)
            return [GaugeMetricFamily("kvwatch_test_empty", "has none."), full]

    collector = KvwatchCollector(lambda: state_at(10.0), now=lambda: 10.0, stale_after=1.0,
                                 analyzers=[Sparse()])  # type: ignore[list-item]
    text = generate_latest(make_registry(collector)).decode()
    assert "kvwatch_test_full 1.0" in text and "kvwatch_test_empty" not in text
    # The health families have their samples: no impossible value served yet is every field at 0 (a
    # counter appearing at its first increment starts at 1, and rate() never counts that value).
    from kvwatch.plausible import CHECKED_FIELDS

    for field in CHECKED_FIELDS:
        assert f'kvwatch_implausible_values_total{{field="{field}"}} 0.0' in text
    assert "kvwatch_scrape_errors_total" in text


def test_a_histogram_kvwatch_cannot_read_is_logged_once_and_the_page_is_up(
        no_kvwatch_env: None, caplog: pytest.LogCaptureFixture) -> None:
    # Prometheus stores a negative bucket as written (up 1); the sidecar was down ("parse").
    import httpx
    import respx

    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar
    from kvwatch.settings import ServeSettings

    url = "http://vllm.test/metrics"
    bad = ('# TYPE vllm:e2e_request_latency_seconds histogram\n'
           'vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} -1\n'
           'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2\n')
    clock = ManualClock()
    with respx.mock, Fetcher(url, timeout=1.0, max_body_bytes=1 << 20) as fetcher, caplog.at_level(logging.INFO):
        route = respx.get(url)
        sidecar = Sidecar(ServeSettings(target_url=url, poll_interval_seconds=5), fetcher, clock,
                          analyzers=[DemoAnalyzer()])
        for page in (bad, "# TYPE other gauge\nother 1\n" + bad, ""):
            route.mock(return_value=httpx.Response(200, text=payload(0) + page))
            state = sidecar.poll()
            assert state.health.up and state.series[("m", "0")].reading.kv_usage_ratio == 0.5
            clock.t += 5.0
    # once, though the line moves when a series comes earlier on the page
    assert caplog.text.count("vllm:e2e_request_latency_seconds is not read (negative bucket") == 1
    assert "every value it holds is read again" in caplog.text


def test_a_page_without_cache_config_for_a_poll_keeps_the_engines_capacity(no_kvwatch_env: None) -> None:
    # The capacity went from the engine's 448,000 tokens to the formula's 449,872 for that poll,
    # and the forecaster, reading a new capacity as a restart, cleared a `filling` warning.
    import httpx
    import respx

    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar
    from kvwatch.settings import ServeSettings

    url = "http://vllm.test/metrics"
    labels = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
    config = (f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",{labels.split(",")[0]},'
              'gpu_memory_utilization="0.92",num_gpu_blocks="28000"} 1.0\n')

    def page(with_config: bool | None) -> str:  # None: two configurations for the engine (a proxy's page)
        two = config + config.replace('num_gpu_blocks="28000"', 'num_gpu_blocks="9000"')
        return (f"vllm:kv_cache_usage_perc{{{labels}}} 0.5\nvllm:num_requests_running{{{labels}}} 4\n"
                f"vllm:num_requests_waiting{{{labels}}} 0\nprocess_start_time_seconds 1.7e9\n"
                + (config if with_config else two if with_config is None else ""))

    clock = ManualClock()
    with respx.mock, Fetcher(url, timeout=1.0, max_body_bytes=1 << 20) as fetcher:
        route = respx.get(url)
        sidecar = Sidecar(ServeSettings(target_url=url, poll_interval_seconds=5, gpu="H100"), fetcher, clock)
        capacities = []
        for with_config in (True, True, False, True, None, True):
            route.mock(return_value=httpx.Response(200, text=page(with_config)))
            reading = sidecar.poll().series[("meta-llama/Llama-3.1-8B-Instruct", "0")].reading
            capacities.append((reading.kv_capacity_tokens, reading.capacity_source))
            clock.t += 5.0
    # two configurations: unknown, neither one's nor the formula's (a switch to the formula restarted the forecaster)
    assert capacities == [(448000.0, None)] * 4 + [(None, "undetermined"), (448000.0, None)]


def test_every_field_the_plausibility_check_can_drop_is_exported_from_zero() -> None:
    # kvwatch_implausible_values_total is exported from 0 for plausible.CHECKED_FIELDS, a list
    # written beside the checks themselves: a reading with every value impossible drops exactly those fields.
    import dataclasses
    import math
    from types import MappingProxyType

    from kvwatch.model import Reading
    from kvwatch.plausible import CHECKED_FIELDS, check_reading

    values: dict[str, object] = {}
    for f in dataclasses.fields(Reading):
        if f.name in ("waiting_by_reason", "finished_by_reason"):
            values[f.name] = MappingProxyType({"x": -1.0})
        elif f.type in ("float | None", float | None):
            values[f.name] = math.nan
    _, dropped = check_reading(Reading("m", **values))  # type: ignore[arg-type]
    # (more hits than queries is a check of its own)
    _, more_hits = check_reading(Reading("m", prefix_cache_queries_total=1.0, prefix_cache_hits_total=2.0))
    assert sorted({name for name, _ in dropped + more_hits}) == sorted(CHECKED_FIELDS)


def test_a_page_without_a_usage_metric_is_up_with_a_warning(no_kvwatch_env: None,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    # An engine restarted on a version that renames its usage gauge to a name kvwatch does not know: kvwatch_up 1,
    # state unknown and every KV alert blind, and the only log line was INFO "usage from None".
    renamed = payload(0).replace("kv_cache_usage_perc", "kv_cache_utilization")
    assert all(state.health.up for state in poll_pages((payload(0), renamed, payload(0)), caplog))
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "no KV usage metric" in r.getMessage()]
    assert len(warned) == 1 and "--usage-metric" in warned[0].getMessage()
    assert caplog.text.count("usage from vllm:kv_cache_usage_perc") == 2  # (up with it, before and after: INFO)


def test_an_asleep_engine_is_exported_as_such_and_adds_no_headroom() -> None:
    # vLLM's sleep mode: the rules need to know (a sleeping engine at 0.97 with a queue paged KVCacheBottleneck), and
    # a released cache is no room for the fleet's headroom sum. An unknown usage is no room either: "ceiling -
    # running" was exported uncapped.
    page = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.16-sleep-state-dp2.prom").read_text()
    page = page.replace('vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0',
                        'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0')
    page = page.replace('vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.97',
                        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} NaN')
    from kvwatch.plausible import check_poll

    poll = check_poll(vllm.read(parse(page), timestamp=1000.0))
    series = {r.key: derive(r, None) for r in poll.readings}
    state = State(timestamp=1000.0, health=Health(up=True, last_success_timestamp=1000.0,
                                                  last_success_wall_seconds=1000.0, scrape_duration_seconds=0.01),
                  detection=poll.detection, series=series)
    samples = scrape(KvwatchCollector(lambda: state, now=lambda: 1001.0, stale_after=15.0))
    e0, e1 = {"model_name": "m", "engine": "0"}, {"model_name": "m", "engine": "1"}
    assert (value(samples, "kvwatch_engine_asleep", **e0), value(samples, "kvwatch_engine_asleep", **e1)) == (1.0, 0.0)
    assert "observed_mix" in series[("m", "0")].max_concurrency
    assert value(samples, "kvwatch_concurrency_headroom", **e0) is None  # asleep
    # Usage unknown (NaN) beside a finished mean that gives a ceiling: no headroom (it was 27.6 of 30.6).
    from dataclasses import replace

    unknown = replace(poll.readings[1], request_prompt_tokens_sum=800.0 * 50, request_prompt_tokens_count=50.0,
                      request_generation_tokens_sum=200.0 * 50, request_generation_tokens_count=50.0)
    assert unknown.kv_usage_ratio is None and derive(unknown, None).max_concurrency["observed_mix"] > 30
    assert derive(unknown, None).concurrency_headroom is None
    # Awake with a known usage: the headroom is there.
    awake = {r.key: derive(r, None) for r in vllm.read(parse(FIXTURE), timestamp=1000.0).readings}
    assert all(s.concurrency_headroom is not None for s in awake.values())
    # A page that does not say whether it sleeps (vLLM before 0.12) exports no kvwatch_engine_asleep.
    old = vllm.read(parse((Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.11-kv-only.prom").read_text()),
                    timestamp=1000.0)
    assert all(r.sleep_state is None for r in old.readings)
    before = replace(state, detection=old.detection, series={r.key: derive(r, None) for r in old.readings})
    assert not any(name == "kvwatch_engine_asleep"
                   for name, _ in scrape(KvwatchCollector(lambda: before, now=lambda: 1001.0, stale_after=15.0)))
