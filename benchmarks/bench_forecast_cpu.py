"""CPU cost of the forecast per poll per series (issue 14 target: at most 1 ms).

Feeds one series 24 h of 10-s polls taken from a simulated Azure-conversation stream (the packaged sample,
block-bootstrapped, at load 0.7, so every histogram and counter the risk reads is present) and measures
process CPU time per ``Forecaster.observe``: the mean over all polls and the cost of the polls that close a
minute (where the trend, demand and saturation-risk fits run), which is the worst case.

    .venv/bin/python benchmarks/bench_forecast_cpu.py
    .venv/bin/python -m pytest benchmarks/bench_forecast_cpu.py --benchmark-only
"""

from __future__ import annotations

import time

from kvwatch.backtest.runner import calibrate, simulate
from kvwatch.backtest.scenarios import Scenario, load_trace
from kvwatch.forecast import Forecaster, ForecastSample
from kvwatch.sim.traces import packaged_trace

HOURS = 24.0


def polls(hours: float = HOURS) -> list[ForecastSample]:
    trace = load_trace(packaged_trace("azure_conv_sample.csv"))
    scenario = Scenario("azure_conv_sample.csv", "steady", hours, 0, 0.7, 0.7, rate_scale=1.0, engine_speedup=1.0)
    calibration = calibrate(trace, 1.0, 0, seconds=1800.0)
    return list(simulate(scenario, trace, calibration=calibration).samples)


def per_poll_cpu(samples: list[ForecastSample]) -> tuple[float, float, float]:
    """(mean, mean of minute-closing polls, max) process CPU seconds per observe."""
    forecaster = Forecaster()
    costs: list[float] = []
    closing: list[float] = []
    previous_minute = None
    for sample in samples:
        started = time.process_time_ns()
        forecaster.observe(sample)
        cost = (time.process_time_ns() - started) / 1e9
        costs.append(cost)
        minute = int(sample.timestamp // 60)
        if previous_minute is not None and minute != previous_minute:
            closing.append(cost)
        previous_minute = minute
    return sum(costs) / len(costs), sum(closing) / len(closing), max(costs)


def test_forecaster_observe_day(benchmark):  # pytest-benchmark: wall time of a day of polls, one series
    samples = polls(6.0)

    def run() -> None:
        forecaster = Forecaster()
        for sample in samples:
            forecaster.observe(sample)

    benchmark.pedantic(run, rounds=3, iterations=1)


def main() -> None:
    samples = polls()
    best = min((per_poll_cpu(samples) for _ in range(3)), key=lambda r: r[0])
    mean, closing, worst = best
    print(f"{len(samples)} polls of one series ({HOURS:g} h at 10 s), best of 3 by mean: CPU per poll mean "
          f"{mean * 1e3:.3f} ms, minute-closing polls {closing * 1e3:.3f} ms, max {worst * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
