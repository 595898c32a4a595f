"""Every kvwatch_* family's HELP text is in step with the code and with docs/metrics.md.

The numbers in the forecast HELP texts are derived from the parameter objects the forecaster runs with; this
test checks that derivation against the parameters, and that docs/metrics.md documents every exported family
with every number its HELP text states (so a changed parameter changes the HELP and fails here until the
docs follow).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.derived import derive
from kvwatch.engines import vllm
from kvwatch.exposition import parse
from kvwatch.forecast import Forecaster, ForecastParams, ForecastSample
from kvwatch.history import History
from kvwatch.serve.app import load_analyzers
from kvwatch.serve.collector import KvwatchCollector, make_registry
from kvwatch.serve.forecast_export import forecast_metric_families
from kvwatch.serve.state import Health, State
from kvwatch.settings import ServeSettings

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "metrics.md").read_text()
FIXTURE = (ROOT / "tests" / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom").read_text()
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")


class _Families:
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self):
        return iter(self.families)


def _helps(text: str) -> dict[str, str]:
    return {f.name: f.documentation for f in text_string_to_metric_families(text) if f.name.startswith("kvwatch_")}


@pytest.fixture(scope="module")
def exported() -> dict[str, str]:
    """HELP text by family: the serve collector with its real analyzers, plus every forecast family."""
    settings = ServeSettings(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100", max_model_len=8192)
    analyzers = load_analyzers(settings)
    poll = vllm.read(parse(FIXTURE), timestamp=1000.0)
    history = History()
    history.record(poll)
    series = {r.key: derive(r, history[r.key], max_model_len=8192,
                            extra={a.name: a.analyze(r.key, history[r.key], r, 1000.0) for a in analyzers})
              for r in poll.readings}
    state = State(timestamp=1000.0, health=Health(up=True, last_success_timestamp=1000.0,
                                                  scrape_duration_seconds=0.01),
                  detection=poll.detection, series=series)
    collector = KvwatchCollector(lambda: state, now=lambda: 1000.0, stale_after=15.0, analyzers=analyzers)
    helps = _helps(generate_latest(make_registry(collector)).decode())
    # A steady hour of polls: every forecast gauge has a value.
    forecaster, result, finished = Forecaster(), None, 0.0
    for i in range(360):
        finished += 30.0
        result = forecaster.observe(ForecastSample(i * 10.0, 0.6, 100_000.0, 60.0, 0.0, 0.0, finished,
                                                   1e6 + i, 1e5 + i))
    registry = CollectorRegistry()
    registry.register(_Families(forecast_metric_families([({"model_name": "m", "engine": "0"}, result, [])])))
    helps.update(_helps(generate_latest(registry).decode()))
    return helps


def _doc_row(name: str) -> str:
    rows = [line for line in DOC.splitlines() if line.startswith("|") and f"`{name}" in line.split("|")[1]]
    assert rows, f"{name} has no row in docs/metrics.md"
    return rows[0]


def test_the_scrape_covers_the_forecast_and_capacity_families(exported: dict[str, str]) -> None:
    assert {"kvwatch_forecast_burst_factor", "kvwatch_forecast_usage_slope_lower_per_second", "kvwatch_state",
            "kvwatch_up", "kvwatch_formula_kv_capacity_tokens"} <= set(exported)


def test_every_exported_family_is_documented_with_the_numbers_its_help_states(exported: dict[str, str]) -> None:
    problems = {}
    for name, help_text in sorted(exported.items()):
        row = _doc_row(name)
        numbers = {n for n in NUMBER.findall(help_text) if float(n) not in (0.0, 1.0)}
        missing = {n for n in numbers if n not in NUMBER.findall(row)}
        if missing:
            problems[name] = (sorted(missing), help_text)
    assert not problems, problems


def test_forecast_help_numbers_are_the_parameters(exported: dict[str, str]) -> None:
    p = ForecastParams()
    burst = exported["kvwatch_forecast_burst_factor"]
    assert f"{round(p.demand.burst_quantile * 100)}th percentile" in burst
    assert f"last {p.demand.burst_window_buckets} minutes" in burst
    assert f"over the last {p.trend_window_buckets} minutes" in exported["kvwatch_forecast_usage_slope_per_second"]
    assert f"{p.trend_confidence:.0%} confidence" in exported["kvwatch_forecast_usage_slope_lower_per_second"]
    assert f"{p.demand.confidence:.0%} confidence" in exported["kvwatch_forecast_request_rate_slope_lower_per_second"]
    assert f"last {p.demand.rate_window_buckets} minutes" in exported["kvwatch_forecast_request_rate_slope_per_second"]
    assert f"last {p.level_buckets} " in exported["kvwatch_forecast_usage_level_ratio"]
    assert ("mix-corrected" in exported["kvwatch_forecast_token_seconds_per_request"]) == p.demand.mix_correction
    # The three the issue found wrong: p90 (is 0.98), 30 min (is 45), 80 % (is 90 %).
    assert "p90 to mean" not in burst
    assert "30 minutes" not in exported["kvwatch_forecast_usage_slope_per_second"]
    assert "80%" not in exported["kvwatch_forecast_usage_slope_lower_per_second"]
