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
    sims = simulations(trace, CI_SLICE, None)
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


def test_the_rows_of_a_trace_kvwatch_does_not_know_by_name_are_named_by_their_cache_size(tmp_path):
    # A trace scaled from its content (rate x 6.65, say) had every row called "large-cache ...": the label
    # compared the rate scale with the (1, 1) of an unknown name.
    from kvwatch.backtest.report import Case, case_name

    renamed = tmp_path / "my_service.csv"
    renamed.write_bytes(packaged_trace("azure_code_sample.csv").read_bytes())
    cases = (Case("steady 0.7", "steady", 0.6, 0.7, 0.7, seeds=(0,)),
             Case("large-cache steady 0.7", "steady", 0.6, 0.7, 0.7, seeds=(0,), rate_factor=2.0, speedup_factor=2.0))
    sims = simulations(renamed, cases, None)
    assert sims[0].scenario.rate_scale > 1
    assert [case_name(sim.scenario) for sim in sims] == ["steady 0.7", "large-cache steady 0.7"]


def test_the_no_saturation_rows_monitor_a_day_so_false_alarms_per_day_are_counted_not_extrapolated():
    from kvwatch.backtest.report import NO_SATURATION
    from kvwatch.backtest.scoring import MIN_DAY_SECONDS, WARMUP_SECONDS

    for case in NO_SATURATION:
        monitored = len(case.seeds) * (case.hours * 3600.0 - WARMUP_SECONDS)
        assert monitored >= MIN_DAY_SECONDS
        assert case.start_load == case.peak_load == 0.7 and case.rate_factor == case.speedup_factor > 1


def test_the_matrix_can_score_v6_and_v5_on_the_same_simulations():
    # docs/forecasting.md compares v11 with v10, forecasting-history.md v10 with v9, v9 with v8, v8 with v6, and v6
    # with v5, on the same simulations: v10 is the defaults without v11's self-calibration, v9 is v10 without its
    # recurrence that follows the load, v8 is v9 without its room for the next request and floor by the running
    # count's dispersion, v6 is v8 without the shift of level; v5 is v6 with the line read as fitted and the first
    # warning after 2 raw minutes.
    from dataclasses import replace

    from kvwatch.backtest.report import FORECASTERS
    from kvwatch.forecast import ForecastParams

    v11, v10, v9, v8, v6, v5 = (FORECASTERS[v] for v in ("v11", "v10", "v9", "v8", "v6", "v5"))
    assert v11 == ForecastParams() and v11.calibration.prior_sd == 1.0 and v11.calibration.warning_reads == "model"
    # v11 also reads a fall of level at once (round 37); v10 and earlier do not
    assert (v11.risk.fall_min_buckets, v10.risk.fall_min_buckets) == (1, 0)
    assert replace(v10, calibration=v11.calibration, risk=replace(v10.risk, fall_min_buckets=1)) == v11
    assert v10.calibration.prior_sd == 0.0
    assert v10.risk.recurrence_load_ratio == 0.7
    assert replace(v9, risk=replace(v9.risk, recurrence_load_ratio=0.7)) == v10
    assert v9.room_for_next_request and v9.risk.floor_by_running_dispersion
    assert replace(v8, room_for_next_request=True, risk=replace(v8.risk, floor_by_running_dispersion=True)) == v9
    assert v8.risk.shift_ratio == v8.demand.shift_ratio == 3.0
    assert replace(v6, risk=replace(v6.risk, shift_ratio=3.0), demand=replace(v6.demand, shift_ratio=3.0)) == v8
    assert v6.risk.level_shrink and not v5.risk.level_shrink
    assert (v6.warning.warn_for_buckets, v5.warning.warn_for_buckets) == (3, 2)
    assert replace(v5, risk=v6.risk, warning=v6.warning) == v6


def test_each_missed_event_is_classified_by_what_preceded_it():
    from kvwatch.backtest.runner import KVWATCH, RunResult, Timeline
    from kvwatch.backtest.scenarios import Scenario
    from kvwatch.backtest.scoring import Event, Outcome
    from repo_scripts import load_script

    misses = load_script("benchmarks/forecast_misses.py", "kvwatch_forecast_misses")
    scenario = Scenario("t.csv", "step", 6.0, 0, 0.6, 1.1)  # the step at 3 h (10,800 s)
    onsets = {3000: ("caught", 600.0), 10860: ("at a shift", None), 7000: ("on > 60 min", None),
              13000: ("late", 120.0), 15000: ("no sign", None), 17000: ("sub-threshold", None),
              19500: ("above, not held", None)}
    times = [float(t) for t in range(0, 21600, 60)]
    active = [6700 <= t < 7000 for t in times]  # on before 7000 (the episode began over an hour earlier)
    risk = [0.5 if 15800 <= t <= 16700 else 0.8 if 18300 <= t <= 19200 else 0.1 for t in times]
    timeline = Timeline(times=times, warnings={KVWATCH: active}, probabilities={KVWATCH: {1800: risk}})
    ordered = sorted(onsets)
    run = RunResult(scenario, None, timeline, [Event(t, t + 120.0) for t in ordered],  # type: ignore[arg-type]
                    {KVWATCH: Outcome(leads=[onsets[t][1] for t in ordered])}, 0)
    assert misses.classify(run) == [onsets[t][0] for t in ordered]


def test_the_largest_arrival_before_an_onset_counts_only_its_window():
    from repo_scripts import load_script

    misses = load_script("benchmarks/forecast_misses.py", "kvwatch_forecast_misses")
    arrivals = [(10.0, 500), (100.0, 9000), (299.0, 700), (300.0, 20000)]
    assert misses.largest_arrival(arrivals, 0.0, 300.0) == 9000  # [start, end): the arrival at 300 is after it
    assert misses.largest_arrival(arrivals, 150.0, 300.0) == 700
    assert misses.largest_arrival(arrivals, 400.0, 700.0) == 0


def test_poll_noise_tells_independent_polls_from_drifting_ones():
    # benchmarks/forecast_poll_noise.py backs docs/forecasting.md's measurement that the simulator's polls are as
    # independent within a minute as random draws: six independent polls a minute read about −1/6 and a ratio
    # near 1; polls drifting across the minute read positive, and minute means that move on their own a large ratio.
    import random
    import sys

    from repo_scripts import ROOT, load_script

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        noise = load_script("benchmarks/forecast_poll_noise.py", "kvwatch_forecast_poll_noise")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rng = random.Random(1)
    independent = [[0.7 + rng.gauss(0.0, 0.03) for _ in range(6)] for _ in range(30)]
    lag1, ratio = noise.lag1_and_ratio(independent)
    assert -0.3 < lag1 < -0.05 and 0.4 < ratio < 2.0, (lag1, ratio)
    drifting = [[0.5 + 0.01 * i + 0.2 * ((m % 7) / 7) for i in range(6)] for m in range(30)]
    lag1, ratio = noise.lag1_and_ratio(drifting)
    assert lag1 > 0.3 and ratio > 10, (lag1, ratio)
    # independent polls around a steep line: the minute means are measured around the line, not their mean
    ramp = [[0.3 + 0.02 * m + rng.gauss(0.0, 0.03) for _ in range(6)] for m in range(30)]
    assert 0.4 < noise.lag1_and_ratio(ramp)[1] < 2.0
