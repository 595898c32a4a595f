"""The forecast analyzer as ``kvwatch serve`` runs it: per-series forecasters fed from core's Readings."""

from __future__ import annotations

from kvwatch.history import SeriesHistory
from kvwatch.model import Reading
from kvwatch.serve.forecast import ForecastAnalyzer, make_analyzer
from kvwatch.serve.sidecar_capacity import CapacityResolver
from kvwatch.settings import ServeSettings


def _reading(usage: float, finished: float, engine: str = "0", waiting: float = 0.0) -> Reading:
    return Reading(model_name="m", engine=engine, kv_usage_ratio=usage, requests_running=40, requests_waiting=waiting,
                   preemptions_total=0, finished_by_reason={"stop": finished}, generation_tokens_total=finished * 100,
                   kv_capacity_tokens=50_000.0)


def _feed(analyzer, history, start, seconds, usage, counter, engine="0", waiting=0.0):
    out = None
    for i in range(int(seconds / 5)):
        now = start + i * 5.0
        counter[0] += 10
        reading = _reading(usage, counter[0], engine, waiting)
        history.append(now, reading)
        out = analyzer.analyze(reading.key, history, reading, now)
    return out


def _states(families, engine):
    return {s.labels["state"]: s.value for f in families if f.name == "kvwatch_state"
            for s in f.samples if s.labels["engine"] == engine}


def test_serve_analyzer_exports_state_and_unknown_for_missing_or_stale_series():
    settings = ServeSettings()
    analyzer = make_analyzer(settings, CapacityResolver(settings))
    assert analyzer.params.stale_after_seconds == 15.0  # 3 x the default 5 s poll interval
    # With an accelerated poll clock (demo, e2e), stale-after stays real seconds: 15 s = 600 clock seconds.
    fast = ServeSettings(clock_speed=40, poll_interval_seconds=1, stale_after_seconds=15)
    assert make_analyzer(fast, CapacityResolver(fast)).params.stale_after_seconds == 600.0
    h0, h1 = SeriesHistory(), SeriesHistory()
    c0, c1 = [0.0], [0.0]
    r0 = _feed(analyzer, h0, 0.0, 600, 0.5, c0, "0")
    _feed(analyzer, h1, 2.5, 600, 0.5, c1, "1")
    assert r0.result.state == "warming_up" and r0.advice == ()
    fams = list(analyzer.families({("m", "0"): r0}, 600.0))
    assert _states(fams, "0")["warming_up"] == 1.0
    assert _states(fams, "1")["unknown"] == 1.0  # engine 1 missing from this poll
    stale = list(analyzer.families({}, 700.0))  # no fresh results: the collector found the data stale
    assert _states(stale, "0")["unknown"] == 1.0 and _states(stale, "1")["unknown"] == 1.0
    assert not any(f.name == "kvwatch_kv_exhaustion_eta_seconds" for f in stale)
    assert list(analyzer.families({}, 600.0 + 7200.0)) == []  # long gone: forgotten
    # Missing for longer than stale-after from pages that are read (an engine scaled down, a model
    # renamed): gone, not exported as unknown for an hour; its forecaster is kept in case it comes back.
    h0, h1, analyzer = SeriesHistory(), SeriesHistory(), make_analyzer(settings, CapacityResolver(settings))
    _feed(analyzer, h1, 2.5, 600, 0.5, [0.0], "1")
    r0 = _feed(analyzer, h0, 0.0, 700, 0.5, [0.0], "0")
    assert "1" not in {s.labels["engine"] for f in analyzer.families({("m", "0"): r0}, 700.0) for s in f.samples}
    back = _feed(analyzer, h1, 705.0, 10, 0.5, [6000.0], "1")
    assert back.result.state == "warming_up" and analyzer._forecasters[("m", "1")].restarts == 0
    # Read in every page with its usage unknown for a while, then missing from one: unknown, not gone at once (it
    # went at once: the forecaster's last sample with a usage was long past)
    for i in range(40):
        reading = Reading(model_name="m", engine="1", kv_usage_ratio=None, requests_running=40)
        h1.append(715.0 + 5 * i, reading)
        analyzer.analyze(reading.key, h1, reading, 715.0 + 5 * i)
    assert _states(analyzer.families({("m", "0"): r0}, 915.0 + 5), "1")["unknown"] == 1.0


def test_restart_from_history_and_advice_in_bottleneck():
    analyzer = ForecastAnalyzer(max_model_len=32768)
    history = SeriesHistory()
    counter = [0.0]
    _feed(analyzer, history, 0.0, 600, 0.5, counter)
    counter[0] = 0.0  # vLLM restarted: counters from zero
    after = _feed(analyzer, history, 600.0, 300, 0.97, counter, waiting=5.0)
    assert history.restarts == 1
    assert after.result.state == "bottleneck"
    assert after.advice[0].action == "limit_concurrency"
    assert after.advice[-1].action == "add_replica"


def test_the_exported_limit_is_the_advices_and_never_above_95_percent_of_the_ceiling_shown():
    # Half an hour of light requests (375 KV tokens each), then a heavy mix: the forecaster's 30-minute figure
    # still says ~126 requests, but the cache holds 40 / 0.97 ≈ 41 of today's; the gauge and the advice say 39.
    import math

    analyzer = ForecastAnalyzer()
    history = SeriesHistory()
    counter = [0.0]
    _feed(analyzer, history, 0.0, 2400, 0.3, counter)
    after = _feed(analyzer, history, 2400.0, 180, 0.97, counter, waiting=5.0)
    ceiling = 40 / 0.97
    limit = after.result.recommended_max_concurrency
    assert limit == math.floor(0.95 * ceiling) == 39
    assert after.result.state == "bottleneck" and after.advice[0].concurrency == limit


def test_without_a_reported_capacity_the_ceiling_alone_sets_the_exported_limit():
    # A NIM page reports no KV capacity: the forecaster has no limit of its own, the advice said
    # "limit concurrency to 23" from the observed-mix ceiling, and kvwatch_recommended_max_concurrency was absent.
    import math
    from dataclasses import replace

    analyzer = ForecastAnalyzer()
    history = SeriesHistory()
    after = None
    for i in range(60):
        now, finished = i * 5.0, 10.0 * i
        reading = replace(_reading(0.97, finished, waiting=5.0), kv_capacity_tokens=None)
        history.append(now, reading)
        after = analyzer.analyze(reading.key, history, reading, now)
    limit = after.result.recommended_max_concurrency
    assert after.result.state == "bottleneck" and limit == math.floor(0.95 * 40 / 0.97) == 39
    assert after.advice[0].concurrency == limit


def test_the_longest_request_read_once_a_minute_holds_for_the_polls_between():
    # serve reads the length histograms' buckets with the latency ones, once a minute: the max-model-len fix,
    # sized from them, must not vanish (and its rank flap) on the polls in between.
    from dataclasses import replace

    from kvwatch.model import Histogram

    inf = float("inf")
    lengths = {"prompt": Histogram((1_000, 5_000, inf), (90, 100, 100), 100, 100_000),
               "generation": Histogram((500, inf), (100, 100), 100, 20_000)}
    analyzer = ForecastAnalyzer(max_model_len=32768)
    history = SeriesHistory()
    counter = [0.0]
    _feed(analyzer, history, 0.0, 600, 0.5, counter)
    advice = []
    for i in range(40):  # 200 s at 0.97 with a queue: bottleneck; the buckets only in the first poll
        now = 600.0 + 5.0 * i
        counter[0] += 10
        reading = replace(_reading(0.97, counter[0], waiting=5.0), request_prompt_tokens_sum=100_000.0,
                          request_prompt_tokens_count=100.0, request_generation_tokens_sum=20_000.0,
                          request_generation_tokens_count=100.0, lengths=lengths if i == 0 else {})
        history.append(now, reading)
        advice.append(analyzer.analyze(reading.key, history, reading, now).advice)
    assert advice[-1] and all(a == advice[-1] for a in advice[-10:])
    lower = [a for a in advice[-1] if a.action == "lower_max_model_len"]
    assert lower and lower[0].engine_args == ("--max-model-len", "8192")  # at most 5,500 tokens, with margin


def test_a_series_missing_from_one_slow_poll_is_unknown_not_gone():
    # "Gone" counted from the page that last had the series to the scrape: polls of 7 s starting
    # 10 s apart, a scrape at the end of the first poll without engine 1 found it 17 s old and dropped it (gone after
    # one page) rather than read it unknown. Now it counts between pages: 10 s, within stale-after (15 s).
    settings = ServeSettings()
    analyzer = make_analyzer(settings, CapacityResolver(settings))
    h0, h1 = SeriesHistory(), SeriesHistory()
    _feed(analyzer, h0, 0.0, 600, 0.5, [0.0], "0")
    _feed(analyzer, h1, 0.0, 600, 0.5, [0.0], "1")  # both read by the poll that began at 595
    r0 = _feed(analyzer, h0, 605.0, 5, 0.5, [6000.0], "0")  # the next poll (605) has engine 0 only
    assert _states(list(analyzer.families({("m", "0"): r0}, 612.1)), "1")["unknown"] == 1.0
    r0 = _feed(analyzer, h0, 615.0, 5, 0.5, [6100.0], "0")  # a page 20 s after engine 1's last: gone
    assert "1" not in {s.labels["engine"] for f in analyzer.families({("m", "0"): r0}, 615.5) for s in f.samples}
    # the target then goes down (no results: every series unknown): engine 1, judged gone, stays gone, where it came
    # back as unknown at every outage for an hour (a removed model in the state panel and its recording rule)
    assert _states(list(analyzer.families({}, 640.0)), "0")["unknown"] == 1.0
    assert "1" not in {s.labels["engine"] for f in analyzer.families({}, 640.0) for s in f.samples}
