"""CI's deterministic slice of the backtest matrix (benchmarks/forecast_matrix.py runs the whole of it):
one short ramp of the packaged conversation sample through the report's own code path. Scoring the same
simulation twice gives the same leads; the table carries every method, warm-up events and the Brier scores of
the risk against its two references."""

from __future__ import annotations

from pathlib import Path

from kvwatch.backtest.report import CI_SLICE, pooled, simulations, table
from kvwatch.sim.traces import packaged_trace


def test_ci_slice_is_deterministic_and_reports_calibration():
    trace = packaged_trace("azure_conv_sample.csv")
    sims = simulations(trace, CI_SLICE[:1], None)
    result = pooled(sims)
    kv = result.outcomes["all"]["kvwatch"]
    assert kv.leads == pooled(sims).outcomes["all"]["kvwatch"].leads
    assert kv.leads, "a ramp to 1.2 saturates the cache"
    rel = result.reliability["all"]
    for horizon in (300, 900, 1800):
        assert rel[horizon]["kvwatch"].n == rel[horizon]["predict_linear"].n > 0
    text = table("azure_conv_sample.csv", result)
    assert "| ramp | 1 | kvwatch |" in text
    assert "| 30m |" in text and "Reliability of the 30-minute risk" in text


def test_generalization_rows_are_named_by_their_cache_size():
    from kvwatch.backtest.report import GENERALIZATION, case_name
    from kvwatch.backtest.scenarios import Scenario
    from kvwatch.backtest.traces import defaults_for

    rate, speedup = defaults_for(Path("AzureLLMInferenceTrace_conv.csv"))
    names = [case_name(Scenario("AzureLLMInferenceTrace_conv.csv", c.profile, c.hours, c.seeds[0], c.start_load,
                                c.peak_load, rate_scale=rate * c.rate_factor,
                                engine_speedup=speedup * c.speedup_factor, prompt_scale=c.prompt_scale))
             for c in GENERALIZATION]
    assert names == [c.name for c in GENERALIZATION]


def test_the_no_saturation_rows_monitor_a_day_so_false_alarms_per_day_are_counted_not_extrapolated():
    from kvwatch.backtest.report import NO_SATURATION
    from kvwatch.backtest.scoring import MIN_DAY_SECONDS, WARMUP_SECONDS

    for case in NO_SATURATION:
        monitored = len(case.seeds) * (case.hours * 3600.0 - WARMUP_SECONDS)
        assert monitored >= MIN_DAY_SECONDS
        assert case.start_load == case.peak_load == 0.7 and case.rate_factor == case.speedup_factor > 1


def test_the_matrix_can_score_v5_on_the_same_simulations():
    # docs/forecasting.md compares v6 with v5 on the same simulations: v5 is the defaults with the line read as
    # fitted and the first warning after 2 raw minutes, nothing else.
    from dataclasses import replace

    from kvwatch.backtest.report import FORECASTERS
    from kvwatch.forecast import ForecastParams

    v6, v5 = FORECASTERS["v6"], FORECASTERS["v5"]
    assert v6 == ForecastParams()
    assert v6.risk.level_shrink and not v5.risk.level_shrink
    assert (v6.warning.warn_for_buckets, v5.warning.warn_for_buckets) == (3, 2)
    assert replace(v5, risk=v6.risk, warning=v6.warning) == v6
