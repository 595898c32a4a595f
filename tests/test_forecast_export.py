"""kvwatch_* forecast families: names and labels are contract (alerts and dashboards read them)."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest

from kvwatch.advisor import advise
from kvwatch.forecast import STATES, Forecaster, ForecastSample
from kvwatch.serve.forecast_export import forecast_metric_families


class _Collector:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def _exposition(families) -> str:
    registry = CollectorRegistry()
    registry.register(_Collector(families))
    return generate_latest(registry).decode()


def _steady_result(seconds=3600.0, usage=0.6):
    f = Forecaster()
    result = None
    finished = 0.0
    for i in range(int(seconds / 10)):
        finished += 30.0
        result = f.observe(ForecastSample(i * 10.0, usage, 100_000.0, 60.0, 0.0, 0.0, finished, 1e6 + i, 1e5 + i))
    return f, result


def test_state_is_one_hot_over_all_seven_states_and_eta_is_inf_when_ok():
    _, result = _steady_result()
    assert result.state == "ok"
    text = _exposition(forecast_metric_families([({"model_name": "m", "engine": "0"}, result, [])]))
    for state in STATES:
        value = 1.0 if state == "ok" else 0.0
        assert f'kvwatch_state{{engine="0",model_name="m",state="{state}"}} {value}' in text
    assert 'kvwatch_kv_exhaustion_eta_seconds{engine="0",model_name="m"} +Inf' in text
    assert 'kvwatch_kv_usage_forecast_ratio{engine="0",horizon="10m",model_name="m"}' in text
    assert 'kvwatch_kv_usage_forecast_ratio{engine="0",horizon="30m",model_name="m"}' in text
    for name in ("kvwatch_request_rate_per_second", "kvwatch_headroom_requests_per_second",
                 "kvwatch_recommended_max_concurrency", "kvwatch_forecast_token_seconds_per_request",
                 "kvwatch_forecast_burst_factor", 'kvwatch_forecast_eta_seconds{engine="0",method="demand"'):
        assert name in text
    assert 'kvwatch_recommendation{action="limit_concurrency",engine="0",model_name="m"} 0.0' in text


def test_unknown_exports_only_the_state():
    f, last = _steady_result(seconds=600)
    stale = f.status(last.timestamp + 60)
    families = forecast_metric_families([({"model_name": "m", "engine": "1"}, stale, [])])
    assert [fam.name for fam in families] == ["kvwatch_state"]
    assert {s.labels["state"]: s.value for s in families[0].samples}["unknown"] == 1.0


def test_a_busy_series_without_a_risk_exports_no_eta_but_its_other_figures():
    # Warm, busy, no finished-request counter: no arrival rate, no risk, so no ETA (+Inf claimed a calm hour);
    # the state and the trend's forecast ratio are still exported.
    f = Forecaster()
    result = None
    for i in range(360):
        result = f.observe(ForecastSample(i * 10.0, 0.3 + 0.5 * i / 360, 100_000.0, 60.0, 0.0))
    assert result is not None and result.state == "ok" and result.eta_seconds is None
    text = _exposition(forecast_metric_families([({"model_name": "m", "engine": "0"}, result, [])]))
    assert "kvwatch_kv_exhaustion_eta_seconds{" not in text
    assert 'kvwatch_state{engine="0",model_name="m",state="ok"} 1.0' in text
    assert 'kvwatch_kv_usage_forecast_ratio{engine="0",horizon="30m",model_name="m"}' in text


def test_one_family_per_name_across_series_and_recommendation_ranks():
    _, result = _steady_result()
    bottleneck = type(result)(**{**result.__dict__, "state": "bottleneck", "eta_seconds": 0.0})
    advice = advise("bottleneck", recommended_max_concurrency=57, capacity_tokens=100_000.0)
    families = forecast_metric_families([
        ({"model_name": "m", "engine": "0"}, result, []),
        ({"model_name": "m", "engine": "1"}, bottleneck, advice),
    ])
    names = [f.name for f in families]
    assert len(names) == len(set(names))
    recs = {(s.labels["engine"], s.labels["action"]): s.value
            for f in families if f.name == "kvwatch_recommendation" for s in f.samples}
    assert recs[("1", "limit_concurrency")] == 1.0
    assert recs[("1", "add_replica")] == 2.0 and recs[("1", "add_tensor_parallelism")] == 0.0
    assert recs[("1", "quantize_weights")] == 0.0
    eta = {s.labels["engine"]: s.value for f in families if f.name == "kvwatch_kv_exhaustion_eta_seconds"
           for s in f.samples}
    assert eta["1"] == 0.0 and math.isinf(eta["0"])


def test_saturation_risk_per_horizon_is_a_probability_and_the_eta_follows_it():
    _, result = _steady_result()
    text = _exposition(forecast_metric_families([({"model_name": "m", "engine": "0"}, result, [])]))
    for label in ("5m", "15m", "30m"):
        line = next(x for x in text.splitlines()
                    if x.startswith(f'kvwatch_kv_saturation_risk{{engine="0",horizon="{label}",model_name="m"}}'))
        assert 0.0 <= float(line.split()[-1]) < 0.5  # a steady 0.6 cache: low risk, ETA +Inf
    assert result.risk[300] <= result.risk[900] <= result.risk[1800]


def test_no_limit_is_exported_while_kv_is_held_with_nothing_running() -> None:
    # The advice dropped its concurrency limit with nothing running (it frees no KV held by transfers or a leak),
    # but kvwatch_recommended_max_concurrency, "the same figure", still said 29.
    from kvwatch.history import SeriesHistory
    from kvwatch.model import Reading
    from kvwatch.serve.forecast import ForecastAnalyzer

    analyzer, history, finished, t = ForecastAnalyzer(max_model_len=32768), SeriesHistory(), 0.0, 0.0

    def poll(usage: float, running: float, waiting: float):
        nonlocal finished, t
        finished += 10
        reading = Reading(model_name="m", kv_usage_ratio=usage, requests_running=running, requests_waiting=waiting,
                          preemptions_total=0, finished_by_reason={"stop": finished},
                          generation_tokens_total=finished * 100, kv_capacity_tokens=50_000.0)
        history.append(t, reading)
        out = analyzer.analyze(reading.key, history, reading, t)
        t += 5
        return out

    for _ in range(240):
        busy = poll(0.5, 40, 0)
    assert busy.result.recommended_max_concurrency is not None
    for _ in range(60):
        held = poll(0.97, 0, 64)
    assert held.result.state == "bottleneck" and held.result.recommended_max_concurrency is None
    assert "limit_concurrency" not in [a.action for a in held.advice]
