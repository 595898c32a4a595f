"""History: bounded rings, counter rates across resets, restart detection."""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType

import pytest

from kvwatch.history import BROKEN_READ_HOLD_SECONDS, History, SeriesHistory, restart_reason
from kvwatch.model import CAPACITY_UNDETERMINED, Detection, Histogram, Poll, Reading

DETECTION = Detection("vllm", "0.12-0.2x", "vllm:kv_cache_usage_perc")


def reading(**fields: object) -> Reading:
    return Reading(model_name="m", engine="0", **fields)  # type: ignore[arg-type]


def test_ring_is_bounded() -> None:
    h = SeriesHistory(max_samples=3)
    for t in range(10):
        h.append(float(t), reading(preemptions_total=float(t)))
    assert [e.timestamp for e in h] == [7.0, 8.0, 9.0]


def test_ring_keeps_only_the_seconds_asked_for_and_windows_within_them_are_unchanged() -> None:
    """keep_seconds drops polls no window up to that length can read; what such a window answers (its first
    point, its increase across a reset) is the same as with the whole ring kept."""
    values = [float(v) for v in [0, 10, 20, 5, 15, 25, 35, 3, 13, 23, 33, 43]]  # two resets
    whole, kept = SeriesHistory(), SeriesHistory(keep_seconds=30.0)
    for i, v in enumerate(values):
        for h in (whole, kept):
            h.append(10.0 * i, reading(preemptions_total=v, prompt_tokens_total=2 * v))
        for window in (10.0, 20.0, 30.0):
            for field in ("preemptions_total", "prompt_tokens_total"):
                assert kept.increase(field, window) == whole.increase(field, window)
            first_whole, first_kept = whole.first(window=window), kept.first(window=window)
            assert first_kept is not None and first_whole is not None
            assert first_kept.timestamp == first_whole.timestamp
    assert [e.timestamp for e in kept] == [80.0, 90.0, 100.0, 110.0]  # newest minus 30 s and after
    assert len(whole) == len(values)
    assert kept.restarts == whole.restarts == 2
    with pytest.raises(ValueError, match="keep_seconds"):
        SeriesHistory(keep_seconds=0.0)


def test_rate_over_window() -> None:
    h = SeriesHistory()
    for t in range(0, 100, 10):
        h.append(float(t), reading(preemptions_total=2.0 * t))
    assert h.rate("preemptions_total") == pytest.approx(2.0)
    assert h.rate("preemptions_total", window=30) == pytest.approx(2.0)
    assert h.increase("preemptions_total", window=30) == (60.0, 30.0)


def test_rate_counts_through_a_reset() -> None:
    h = SeriesHistory()
    for t, v in [(0, 100.0), (10, 110.0), (20, 5.0), (30, 15.0)]:
        h.append(float(t), reading(preemptions_total=v))
    # 10 before the reset, 5 counted from zero at the reset, 10 after: 25 over 30 s.
    assert h.increase("preemptions_total") == (25.0, 30.0)
    assert h.restarts == 1 and h.last_restart_timestamp == 20.0
    assert h.last_restart_reason == "preemptions_total went down"
    assert [e.timestamp for e in h.samples(since_restart=True)] == [20.0, 30.0]


def test_rate_unknown_with_one_point_or_missing_counter() -> None:
    h = SeriesHistory()
    h.append(0.0, reading(preemptions_total=1.0))
    assert h.rate("preemptions_total") is None
    h.append(5.0, reading())
    assert h.rate("preemptions_total") is None


def test_timestamps_must_increase() -> None:
    h = SeriesHistory()
    h.append(1.0, reading())
    with pytest.raises(ValueError, match="increase"):
        h.append(1.0, reading())


def test_restart_reasons() -> None:
    base = reading(process_start_time_seconds=1.0, cache_config=MappingProxyType({"num_gpu_blocks": "100"}))
    assert restart_reason(base, base) is None
    assert restart_reason(base, reading(process_start_time_seconds=61.0)) == "process_start_time_seconds changed"
    # an exporter computing the start time each scrape wobbles by milliseconds: no restart (each
    # one was, and the forecaster never left its warm-up)
    for wobble in (1.003, 0.998, 1.9):
        assert restart_reason(base, reading(process_start_time_seconds=wobble)) is None
    assert restart_reason(base, reading(cache_config=MappingProxyType({"num_gpu_blocks": "200"}))) == \
        "cache_config_info changed"
    a = reading(finished_by_reason=MappingProxyType({"stop": 10.0}))
    b = reading(finished_by_reason=MappingProxyType({"stop": 3.0}))
    assert restart_reason(a, b) == "request_success_total went down"


def test_history_tracks_series_and_forgets_gone_ones() -> None:
    d = Detection("vllm", "0.12-0.2x", "vllm:kv_cache_usage_perc")
    history = History(forget_after=100.0)
    history.record(Poll(0.0, d, (reading(), Reading("m", "1"))))
    restarted = history.record(Poll(50.0, d, (reading(preemptions_total=1.0),)))
    assert restarted == {} and set(history.keys()) == {("m", "0"), ("m", "1")}
    history.record(Poll(200.0, d, (reading(preemptions_total=0.0),)))
    assert set(history.keys()) == {("m", "0")}
    assert history[("m", "0")].restarts == 1


def test_entries_share_what_did_not_change_since_the_previous_poll() -> None:
    """Each poll parses new strings and mappings; the ring keeps one copy of those that did not change
    (sidecar memory, docs/performance.md) and the new object of those that did."""
    history = SeriesHistory()

    def parsed(waiting: float) -> Reading:  # as a fresh parse makes them: equal, not identical
        return Reading(model_name="".join(["m", "1"]), kv_usage_ratio=0.5,
                       cache_config=MappingProxyType({"block_size": "16", "cache_dtype": "auto"}),
                       waiting_by_reason=MappingProxyType({"capacity": waiting}))

    for t, waiting in enumerate((1.0, 1.0, 2.0)):
        history.append(float(t), parsed(waiting))
    first, second, third = (e.reading for e in history)
    assert second.cache_config is first.cache_config and third.cache_config is first.cache_config
    assert second.model_name is first.model_name
    assert second.waiting_by_reason is first.waiting_by_reason
    assert third.waiting_by_reason is not first.waiting_by_reason and third.waiting_by_reason == {"capacity": 2.0}
    assert third == parsed(2.0)


def test_a_counter_a_rounding_lower_is_no_restart() -> None:
    # vLLM's multiprocess mode sums one file per API server, and a float sum in another order can read a rounding
    # lower: 199999.99999999997 after 200000.0 was "request_prompt_tokens_sum went down", a restart that reset the
    # forecaster and cleared its warnings. A real drop is still one, however small.
    from kvwatch.counters import counter_delta, histogram_delta

    assert counter_delta(200000.0, 199999.99999999997) == 0.0
    assert counter_delta(200000.0, 199999.0) == 199999.0  # a reset: the increase since it is the new value
    assert histogram_delta((1.0, 200000.0), (1.0, 199999.99999999997)) == (0.0, 0.0)
    assert histogram_delta((5.0, 9.0), (4.0, 9.0)) == (4.0, 9.0)
    base = reading(process_start_time_seconds=100.0, request_prompt_tokens_sum=200000.0, preemptions_total=42.0)
    assert restart_reason(base, reading(process_start_time_seconds=100.0, request_prompt_tokens_sum=199999.99999999997,
                                        preemptions_total=42.0)) is None
    assert restart_reason(base, reading(process_start_time_seconds=100.0, request_prompt_tokens_sum=200000.0,
                                        preemptions_total=41.0)) == "preemptions_total went down"


def test_a_restart_is_told_against_each_signals_last_known_value() -> None:
    # One page with only the gauges (a transitional page, an override-only target) between two
    # engines: each signal was compared with the previous poll's only, so the next engine's start (counters from 0,
    # a new start time, 4x the blocks) went unseen and its forecast mixed both engines' history.
    config = MappingProxyType({"num_gpu_blocks": "2048", "block_size": "16"})
    old = reading(process_start_time_seconds=1.0, preemptions_total=500.0, cache_config=config)
    new = reading(process_start_time_seconds=61.0, preemptions_total=0.0,
                  cache_config=MappingProxyType({"num_gpu_blocks": "8192", "block_size": "16"}))
    for changed in (new, replace(new, process_start_time_seconds=None, cache_config=MappingProxyType({})),
                    replace(new, preemptions_total=None, cache_config=MappingProxyType({}))):
        h = SeriesHistory()
        h.append(0.0, old)
        assert h.append(5.0, reading(kv_usage_ratio=0.5)) is None  # only the gauges
        assert h.append(10.0, changed) is not None, changed
    h = SeriesHistory()  # the same engine again after the page without them: no restart
    h.append(0.0, old)
    h.append(5.0, reading())
    assert h.append(10.0, replace(old, preemptions_total=510.0)) is None and h.restarts == 0


def test_a_page_without_cache_config_keeps_the_processs_engine_configuration() -> None:
    # One page without vllm:cache_config_info took the capacity from the engine's blocks to the
    # formula's (448,000 -> 449,872 tokens): the forecaster read a new capacity as a restart and cleared its warning.
    d = Detection("vllm", "0.12-0.2x", "vllm:kv_cache_usage_perc")
    config = MappingProxyType({"num_gpu_blocks": "28000", "block_size": "16"})
    engine = reading(process_start_time_seconds=1.0, cache_config=config, kv_capacity_tokens=448000.0,
                     num_gpu_blocks=28000.0, block_size=16.0, kv_max_concurrency=3.4, max_model_len=131072.0)
    history = History()
    history.record(Poll(0.0, d, (engine,)))
    bare = reading(process_start_time_seconds=1.0, kv_usage_ratio=0.6)
    assert history.record(Poll(5.0, d, (bare,))) == {}
    kept = history.completed(Poll(5.0, d, (bare,))).readings[0]
    assert (kept.cache_config, kept.kv_capacity_tokens, kept.num_gpu_blocks, kept.block_size,
            kept.kv_max_concurrency, kept.max_model_len, kept.kv_usage_ratio) == (
        config, 448000.0, 28000.0, 16.0, 3.4, 131072.0, 0.6)
    # after a restart the old process's configuration is nobody's
    restarted = reading(process_start_time_seconds=9.0)
    assert history.record(Poll(10.0, d, (restarted,))) != {}
    assert history.completed(Poll(10.0, d, (restarted,))).readings[0] is restarted
    # Two label sets for one engine on the page (a proxy of several pods): unknown, as the adapter said, not the
    # last configuration's
    history = History()
    history.record(Poll(0.0, d, (engine,)))
    torn_reading = replace(bare, capacity_source=CAPACITY_UNDETERMINED)
    torn = Poll(5.0, d, (torn_reading,))
    history.record(torn)
    assert history.completed(torn).readings[0] is torn_reading


def test_a_counter_that_went_down_within_one_process_is_unknown_for_that_poll_not_a_restart() -> None:
    # A finished counter halved for one poll, the start time unchanged, was "request_success_total went down": a
    # restart, the forecast cleared into 30 minutes of warm-up, and the rate counted the halved value from zero.
    history = History()

    def poll(t: float, finished: float, step: float, start: float | None = 1000.0) -> Poll:
        return Poll(timestamp=t, detection=DETECTION, readings=(reading(
            kv_usage_ratio=0.5, finished_by_reason={"stop": finished}, preemptions_total=step,
            prompt_tokens_total=100 * step, generation_tokens_total=50 * step, process_start_time_seconds=start),))

    for i, finished in enumerate([1000.0, 1010.0, 510.0, 1030.0, 1040.0]):
        screened = history.screen(poll(10.0 * i, finished, float(i)))
        assert history.record(screened) == {}
        reasons = screened.readings[0].finished_by_reason
        assert (dict(reasons) == {} if i == 2 else reasons["stop"] == finished)
        assert screened.implausible == (((("m", "0"), "finished_by_reason", 510.0),) if i == 2 else ())
    assert history[("m", "0")].restarts == 0
    # A counter that stays lower is unknown for BROKEN_READ_HOLD_SECONDS, then read from its new level: no decrease,
    # no restart, no jump.
    history.record(history.screen(poll(50.0, 1050.0, 5.0)))

    def low(t: float, prompt: float) -> Poll:
        return Poll(timestamp=t, detection=DETECTION, readings=(reading(
            kv_usage_ratio=0.5, finished_by_reason={"stop": 1000.0 + t}, preemptions_total=t / 10,
            prompt_tokens_total=prompt, generation_tokens_total=5 * t, process_start_time_seconds=1000.0),))

    for t in (60.0, 70.0, 110.0):
        held = history.screen(low(t, 100.0))
        assert held.implausible == ((("m", "0"), "prompt_tokens_total", 100.0),) and history.record(held) == {}
    level = history.screen(low(60.0 + BROKEN_READ_HOLD_SECONDS, 100.0))
    assert level.implausible == () and history.record(level) == {}
    assert history.record(history.screen(low(130.0, 110.0))) == {}
    assert history[("m", "0")].increase("prompt_tokens_total", window=10.0) == (10.0, 10.0)
    assert history[("m", "0")].restarts == 0
    # A new start time: a restart, and the new process's counts are no impossible values.
    restart = history.screen(poll(140.0, 3.0, 0.0, start=2000.0))
    assert restart.implausible == ()
    assert history.record(restart) == {("m", "0"): "process_start_time_seconds changed"}


def test_a_broken_read_over_several_polls_counts_only_what_the_counter_rose_when_it_returns() -> None:
    # Forgotten at the first lower read, the counter's second lower read became its baseline, and its return to the
    # true value was counted as one increase of the whole way back up (420 prompt tokens in 10 s instead of 20).
    history = History()
    for t, prompt in [(50.0, 500.0), (60.0, 100.0), (70.0, 100.0), (80.0, 520.0)]:
        screened = history.screen(Poll(timestamp=t, detection=DETECTION, readings=(
            reading(prompt_tokens_total=prompt, process_start_time_seconds=1000.0),)))
        assert screened.implausible == (((("m", "0"), "prompt_tokens_total", 100.0),) if prompt == 100.0 else ())
        assert history.record(screened) == {}
    assert history[("m", "0")].increase("prompt_tokens_total", window=30.0) == (20.0, 30.0)


def test_a_held_counter_stays_held_on_a_page_without_the_start_time() -> None:
    # Compared with its kept value, a held counter on a page that lacked process_start_time_seconds for a poll made
    # a restart, the forecaster's state cleared (a reviewer's case: 1000, 100, 110, 120 without the start time, 1040).
    history = History()
    for t, prompt, start in [(0.0, 1000.0, 1000.0), (10.0, 100.0, 1000.0), (20.0, 110.0, 1000.0), (30.0, 120.0, None),
                             (40.0, 1040.0, 1000.0)]:
        screened = history.screen(Poll(timestamp=t, detection=DETECTION, readings=(
            reading(prompt_tokens_total=prompt, process_start_time_seconds=start),)))
        assert history.record(screened) == {}, t
    assert history[("m", "0")].restarts == 0
    assert history[("m", "0")].increase("prompt_tokens_total", window=40.0) == (40.0, 40.0)


def test_a_lasting_drop_counts_what_the_counter_rose_at_its_new_level_during_the_hold() -> None:
    # A counter rising 1 a second that drops by 500 for good: the held minute's rise at the new level was counted as
    # nothing, and the 300 s rate read 0.78 instead of about 1.
    history = History()
    for t in range(0, 310, 10):
        value = t - 500.0 * (t >= 100) + 1000.0
        screened = history.screen(Poll(timestamp=float(t), detection=DETECTION, readings=(
            reading(prompt_tokens_total=value, process_start_time_seconds=1000.0),)))
        assert history.record(screened) == {}
    assert history[("m", "0")].increase("prompt_tokens_total", window=300.0) == (290.0, 300.0)  # (one poll's: lost)


def test_a_reason_that_leaves_the_page_mid_hold_is_held_anew_when_it_comes_back_low() -> None:
    # Its hold's clock kept running while it was away: back low more than a minute after its first low read, it was
    # taken at once as its new level, uncounted.
    history = History()
    pages = [(0.0, {"stop": 1000.0, "length": 500.0}), (10.0, {"stop": 1010.0, "length": 100.0}),
             (20.0, {"stop": 1020.0}), (80.0, {"stop": 1080.0, "length": 520.0}),
             (90.0, {"stop": 1090.0, "length": 100.0})]
    for t, finished in pages:
        screened = history.screen(Poll(timestamp=t, detection=DETECTION, readings=(
            reading(finished_by_reason=finished, process_start_time_seconds=1000.0),)))
        history.record(screened)
    assert screened.implausible == ((("m", "0"), "finished_by_reason", 100.0),)


def _e2e_page(t: float, total: float, seconds: float, start: float | None = 1000.0) -> Poll:
    """A 10-s poll; the e2e histogram (``total`` requests, ``seconds`` summed) on one poll a minute (as serve)."""
    latency = {} if t % 60 else {"e2e": Histogram((10.0, math.inf), (total, total), total, seconds)}
    return Poll(timestamp=t, detection=DETECTION, readings=(reading(
        prompt_tokens_total=t, latency=MappingProxyType(latency), process_start_time_seconds=start),))


def test_an_e2e_histogram_read_lower_within_one_process_is_held_like_a_counter() -> None:
    # Its _sum and _count halved for one read reached the forecaster: the residence went 20x off for half an hour,
    # and nothing was counted as implausible.
    history = History()
    for t, total, seconds, dropped in [(0.0, 1000.0, 20_000.0, False), (60.0, 500.0, 10_000.0, True),
                                       (120.0, 1100.0, 22_000.0, False), (180.0, 1200.0, 12_000.0, True),
                                       (240.0, 1300.0, 13_000.0, False), (300.0, 1400.0, 14_000.0, False)]:
        # (a sum alone lower at 180 s, and still lower a minute later: its new level, BROKEN_READ_HOLD_SECONDS)
        edge = history.screen(_e2e_page(t, total, seconds))
        assert edge.implausible == (((("m", "0"), "latency", total),) if dropped else ()), t
        assert ("e2e" in edge.readings[0].latency) is not dropped
        assert history.record(edge) == {}
        assert history.record(history.screen(_e2e_page(t + 10.0, total, seconds))) == {}  # a poll between reads
    assert history[("m", "0")].restarts == 0
    # a restart on a page without the start time (vLLM's multiprocess mode): any decrease is one
    history = History()
    for t, total in [(0.0, 1000.0), (60.0, 10.0)]:
        restarted = history.record(history.screen(_e2e_page(t, total, 20.0 * total, start=None)))
    assert restarted == {("m", "0"): "the e2e latency histogram went down"}


def test_without_a_start_time_any_counter_going_down_is_a_restart() -> None:
    # Nothing on such a page tells a broken read from a new process (counters that were 0 rise after a restart too).
    history = History()
    for t, finished, prompt in [(0.0, 10.0, 5000.0), (10.0, 12.0, 300.0)]:
        screened = history.screen(Poll(timestamp=t, detection=DETECTION, readings=(
            reading(finished_by_reason={"stop": finished}, prompt_tokens_total=prompt),)))
        assert screened.implausible == ()
        restarted = history.record(screened)
    assert restarted == {("m", "0"): "prompt_tokens_total went down"}
