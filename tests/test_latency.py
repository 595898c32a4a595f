"""Latency quantiles from engine histograms (window deltas, Prometheus' interpolation), the analyzer's
gauges and the TTFT objective's cause, for every engine's wire names."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from kvwatch.engines.detect import read_payload
from kvwatch.history import History
from kvwatch.latency import EDGE_SECONDS, delta, quantile, window_means, window_quantiles
from kvwatch.model import Histogram
from kvwatch.serve.latency import LatencyAnalyzer, classify
from kvwatch.sim.engine import EngineConfig, Request, Simulator
from kvwatch.sim.engines_wire import render_any

INF = float("inf")


def test_quantile_interpolates_like_histogram_quantile() -> None:
    # 10 observations: 4 in (0, 1], 4 in (1, 2], 2 in (2, +Inf]
    h = Histogram((1.0, 2.0, INF), (4.0, 8.0, 10.0), 10.0, 14.0)
    assert quantile(0.5, h) == pytest.approx(1.25)  # rank 5: a quarter into (1, 2]
    assert quantile(0.2, h) == pytest.approx(0.5)
    assert quantile(0.99, h) == 2.0  # in +Inf: the largest finite bound
    assert quantile(0.5, Histogram((1.0, INF), (0.0, 0.0), 0.0, 0.0)) is None


def test_a_malformed_histogram_gets_prometheus_answer() -> None:
    # what promql's bucketQuantile gives, on histograms no prometheus_client emits but a
    # re-exporter or a hand-written exporter behind --*-metric overrides can.
    assert quantile(0.5, Histogram((INF,), (10.0,), 10.0, 5.0)) is None  # one bucket: NaN there (kvwatch said 0 s)
    assert quantile(0.5, Histogram((0.1, 1.0, INF), (100.0, 100.0, 10.0), 10.0, 5.0)) == pytest.approx(0.05)
    assert quantile(0.6, Histogram((0.1, 1.0, 2.0, INF), (5.0, 3.0, 10.0, 10.0), 10.0, 9.0)) == pytest.approx(1.2)
    assert quantile(0.5, Histogram((-1.0, INF), (10.0, 10.0), 10.0, -10.0)) == -1.0
    # A bound twice (le="1" and le="1.0" in one series): one bucket with the counts added up, as Prometheus does.
    assert quantile(0.5, Histogram((1.0, 1.0, INF), (2.0, 2.0, 4.0), 4.0, 4.0)) == pytest.approx(0.5)
    assert quantile(0.5, Histogram((1.0, 2.0), (2.0, 4.0), 4.0, 4.0)) is None  # no +Inf bucket
    h = Histogram((1.0, 2.0, INF), (4.0, 8.0, 10.0), 10.0, 14.0)
    assert (quantile(-0.5, h), quantile(1.5, h), quantile(float("nan"), h)) == (-INF, INF, None)
    assert quantile(0.5, Histogram((2.0, INF, 1.0), (8.0, 10.0, 4.0), 10.0, 14.0)) == pytest.approx(1.25)  # sorted
    assert quantile(0.5, Histogram((1.0, 2.0, INF), (-4.0, 8.0, 10.0), 10.0, 5.0)) == pytest.approx(1.75)


def test_window_delta_and_reset() -> None:
    old = Histogram((1.0, INF), (5.0, 6.0), 6.0, 3.0)
    new = Histogram((1.0, INF), (5.0, 16.0), 16.0, 33.0)
    d = delta(old, new)
    assert d is not None and d.cumulative == (0.0, 10.0) and d.count == 10.0
    assert quantile(0.5, d) == 1.0  # every new observation is above 1 s: the old ones do not count
    assert delta(new, old) is None  # a reset: no answer for this window
    assert window_quantiles({"ttft": new}, {"ttft": old}) == {}


def test_slo_cause() -> None:
    q = {("ttft", 0.9): 4.0, ("queue", 0.9): 3.0}
    assert classify(q, 0.99, 2.0) == (True, "kv_cache")
    assert classify(q, 0.50, 2.0) == (True, "other")  # queueing, but the cache has room: the scheduler limits
    assert classify({("ttft", 0.9): 4.0, ("queue", 0.9): 0.2}, 0.99, 2.0) == (True, "other")  # prefill-bound
    assert classify(q, 0.99, 5.0) == (True, None)
    # Below 0.95 with no room for the next prompt (long contexts, v9): the KV cache, as kvwatch_state says.
    assert classify(q, 0.85, 2.0, no_room=True) == (True, "kv_cache")
    assert classify({}, 0.99, 5.0) == (False, None)


def test_slo_cause_compares_the_mean_waits_not_p90s_of_different_buckets() -> None:
    # vLLM's TTFT buckets (.., 160, 640, ..) and queue-time buckets (.., 120, 240, 480, ..) differ: waits of 170-220 s
    # read a TTFT p90 of 592 s beside a queue p90 of 228 s, and a TTFT that was 99.9 % waiting was "other".
    ttft_bounds = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                   40.0, 80.0, 160.0, 640.0, 2560.0, INF)
    queue_bounds = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                    480.0, 960.0, 1920.0, 7680.0, INF)

    def histogram(bounds: tuple[float, ...], values: list[float]) -> Histogram:
        return Histogram(bounds, tuple(float(sum(v <= b for v in values)) for b in bounds), float(len(values)),
                         float(sum(values)))

    waits = [170 + i * 0.5 for i in range(100)]
    old = {"ttft": histogram(ttft_bounds, []), "queue": histogram(queue_bounds, [])}
    new = {"ttft": histogram(ttft_bounds, [w + 0.2 for w in waits]), "queue": histogram(queue_bounds, waits)}
    q = window_quantiles(old, new)
    assert q[("ttft", 0.9)] > 2 * q[("queue", 0.9)]  # the p90s alone say "other"
    assert classify(q, 0.98, 2.0) == (True, "other")
    means = window_means(old, new)
    assert means["queue"] == pytest.approx(194.75) and means["ttft"] == pytest.approx(194.95)
    assert classify(q, 0.98, 2.0, means=means) == (True, "kv_cache")
    # a prefill-bound TTFT stays "other" by the means too
    fast = {"ttft": histogram(ttft_bounds, [w + 0.2 for w in waits]), "queue": histogram(queue_bounds, [1.0] * 100)}
    assert classify(q, 0.98, 2.0, means=window_means(old, fast)) == (True, "other")


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tensorrt-llm"])
def test_analyzer_quantiles_from_each_engine(engine: str) -> None:
    sim = Simulator(EngineConfig(num_gpu_blocks=200), seed=2)
    sim.submit([Request(arrival_time=i * 0.05, prompt_tokens=150, output_tokens=300) for i in range(1200)])
    history, analyzer = History(), LatencyAnalyzer(ttft_slo_seconds=0.5)
    result = None
    for t in range(5, 65, 5):
        sim.run_until(t)
        poll = read_payload(render_any(sim.snapshot(), engine=engine, model_name="m"), timestamp=float(t))
        history.record(poll)
        (reading,) = poll.readings
        result = analyzer.analyze(reading.key, history[reading.key], reading, float(t))
    assert result is not None
    kinds = {kind for kind, _ in result.quantiles}
    assert kinds == {"ttft", "itl", "queue", "e2e"}
    for kind in kinds:
        assert 0 < result.quantiles[(kind, 0.5)] <= result.quantiles[(kind, 0.9)] <= result.quantiles[(kind, 0.99)]
    # The load saturates this small cache (median usage over the polls >= 0.95) and requests queue for KV
    # room, so TTFT breaks a 0.5 s objective because of the KV cache.
    usages = sorted(e.reading.kv_usage_ratio for e in history[reading.key].samples())
    assert usages[len(usages) // 2] >= 0.95, usages
    assert result.slo_known and result.slo_breach_cause == "kv_cache", dict(result.quantiles)
    families = {f.name: f for f in analyzer.families({reading.key: result}, 60.0)}
    assert {"kvwatch_latency_seconds", "kvwatch_ttft_slo_breach"} <= set(families)
    breach = {s.labels["cause"]: s.value for s in families["kvwatch_ttft_slo_breach"].samples}
    assert breach == {"kv_cache": 1.0, "other": 0.0}
    # As Prometheus' own linter reads them: a gauge with a "quantile" label (reserved for summaries) was refused.
    assert {s.labels["percentile"] for s in families["kvwatch_latency_seconds"].samples} == {"50", "90", "99"}
    _promtool_check_metrics(families.values())


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tensorrt-llm"])
def test_a_poll_without_latency_reads_everything_else(engine: str) -> None:
    sim = Simulator(EngineConfig(num_gpu_blocks=200), seed=2)
    sim.submit([Request(arrival_time=i * 0.05, prompt_tokens=150, output_tokens=300) for i in range(400)])
    sim.run_until(20.0)
    text = render_any(sim.snapshot(), engine=engine, model_name="m")
    full, light = read_payload(text, timestamp=1.0), read_payload(text, timestamp=1.0, latency=False)
    assert set(full.readings[0].latency) == {"ttft", "itl", "queue", "e2e"}
    assert not light.readings[0].latency
    assert light.detection == full.detection
    assert [replace(r, latency=MappingProxyType({})) for r in full.readings] == list(light.readings)


class _Endpoint:
    """The simulator's /metrics at the test's clock (what the sidecar's fetcher would get)."""

    last_body_bytes = 0

    def __init__(self) -> None:
        self.sim = Simulator(EngineConfig(num_gpu_blocks=200), seed=2)
        self.sim.submit([Request(arrival_time=i * 0.05, prompt_tokens=150, output_tokens=300) for i in range(9000)])
        self.now = 0.0
        self.bodies: list[tuple[float, str]] = []

    def fetch(self) -> str:
        self.sim.run_until(self.now)
        body = render_any(self.sim.snapshot(), engine="vllm", model_name="m")
        self.bodies.append((self.now, body))
        return body


def test_sidecar_reads_latency_once_per_edge_and_quantiles_span_the_edges() -> None:
    from kvwatch.serve.app import Sidecar
    from kvwatch.settings import ServeSettings

    endpoint = _Endpoint()
    sidecar = Sidecar(ServeSettings(poll_interval_seconds=5.0), endpoint, lambda: endpoint.now,  # type: ignore[arg-type]
                      [LatencyAnalyzer()])
    results = {}
    edges = []
    for t in range(5, 425, 5):
        endpoint.now = float(t)
        state = sidecar.poll()
        results[t] = state.series[("m", "0")].extra.get("latency")
        latest = sidecar.history[("m", "0")].latest
        if latest is not None and latest.reading.latency:
            edges.append(latest.timestamp)
    assert edges == [float(t) for t in range(5, 425, 60)]  # the first poll, then one per EDGE_SECONDS
    # The sidecar keeps the polls of the longest window its readers ask for (this analyzer's 300 s), no more.
    assert [e.timestamp for e in sidecar.history[("m", "0")]] == [float(t) for t in range(120, 425, 5)]
    assert EDGE_SECONDS == 60.0
    # The last poll's quantiles: the window between the oldest and newest edge within the last 300 s,
    # exactly what reading both bodies in full gives.
    bodies = dict(endpoint.bodies)
    first_edge, last_edge = next(t for t in edges if t >= 420 - 300), edges[-1]
    old, new = (read_payload(bodies[t], timestamp=t).readings[0].latency for t in (first_edge, last_edge))
    expected = window_quantiles(old, new)
    assert expected and dict(results[420].quantiles) == expected
    # Before a second edge there is no window: no quantile.
    assert results[5] is None or not results[5].quantiles


def _promtool_check_metrics(families: Iterable[Any]) -> None:
    import shutil
    import subprocess

    from prometheus_client import CollectorRegistry, generate_latest

    promtool = shutil.which("promtool")
    assert promtool, "promtool not found on PATH: run `make tools` (installs Debian's prometheus package)"

    class Families:
        def collect(self) -> Iterable[Any]:
            return families

    registry = CollectorRegistry()
    registry.register(Families())  # type: ignore[arg-type]
    result = subprocess.run([promtool, "check", "metrics"], input=generate_latest(registry).decode(),
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_engine_reads_only_the_documented_latency_kinds() -> None:
    from kvwatch.engines import sglang, trtllm, vllm
    from kvwatch.latency import KINDS

    assert set(vllm.LATENCY) == set(KINDS)
    for engine in (sglang, trtllm):
        assert set(engine.LATENCY) <= set(KINDS), engine.__name__
