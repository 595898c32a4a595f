"""CPU cost of the forecast per poll per series (target: at most 1 ms).

Feeds one series 24 h of 10-s polls taken from a simulated Azure-conversation stream (the packaged sample,
block-bootstrapped, at load 0.7, so every histogram and counter the risk reads is present) and measures
process CPU time per ``Forecaster.observe``: the mean over all polls and the cost of the polls that close a
minute (where the trend, demand and saturation-risk fits run), which is the worst case.

    .venv/bin/python benchmarks/bench_forecast_cpu.py [--versions v9,v8]
    .venv/bin/python -m pytest benchmarks/bench_forecast_cpu.py --benchmark-only
"""

from __future__ import annotations

import time

from pytest_benchmark.fixture import BenchmarkFixture

from kvwatch.backtest.runner import calibrate, simulate
from kvwatch.backtest.scenarios import Scenario, load_trace
from kvwatch.forecast import Forecaster, ForecastParams, ForecastSample
from kvwatch.sim.traces import packaged_trace

HOURS = 24.0


def polls(hours: float = HOURS) -> list[ForecastSample]:
    trace = load_trace(packaged_trace("azure_conv_sample.csv"))
    scenario = Scenario("azure_conv_sample.csv", "steady", hours, 0, 0.7, 0.7, rate_scale=1.0, engine_speedup=1.0)
    calibration = calibrate(trace, 1.0, 0, seconds=1800.0)
    return list(simulate(scenario, trace, calibration=calibration).samples)


def per_poll_cpu(samples: list[ForecastSample], params: ForecastParams | None = None) -> tuple[float, float, float]:
    """(mean, mean of minute-closing polls, max) process CPU seconds per observe."""
    forecaster = Forecaster(params)
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


def test_forecaster_observe_day(benchmark: BenchmarkFixture) -> None:
    """pytest-benchmark: wall time of a day of polls, one series."""
    samples = polls(6.0)

    def run() -> None:
        forecaster = Forecaster()
        for sample in samples:
            forecaster.observe(sample)

    benchmark.pedantic(run, rounds=3, iterations=1)


def main() -> None:
    """The defaults, or with ``--versions v9,v8`` each version of kvwatch.backtest.report.FORECASTERS, alternated
    round by round on the same polls (best of 3 each)."""
    import argparse

    from kvwatch.backtest.report import FORECASTERS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=None, help="comma-separated forecaster versions (default: the defaults)")
    args = parser.parse_args()
    versions = {v: FORECASTERS[v] for v in args.versions.split(",")} if args.versions else {"defaults": None}
    samples = polls()
    runs: dict[str, list[tuple[float, float, float]]] = {v: [] for v in versions}
    for _ in range(3):
        for version, params in versions.items():
            runs[version].append(per_poll_cpu(samples, params))
    for version, results in runs.items():
        mean, closing, worst = min(results, key=lambda r: r[0])
        print(f"{version}: {len(samples)} polls of one series ({HOURS:g} h at 10 s), best of 3 by mean: CPU per poll "
              f"mean {mean * 1e3:.3f} ms, minute-closing polls {closing * 1e3:.3f} ms, max {worst * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
