"""Backtest benchmark: the forecaster alone over a day of polls, and a whole 24-hour backtest.

Target: a 24-hour backtest finishes in a few minutes on one core.

    .venv/bin/python benchmarks/bench_backtest.py                      # packaged 10-min sample, bootstrapped
    .venv/bin/python benchmarks/bench_backtest.py --trace PATH/AzureLLMInferenceTrace_conv.csv
    .venv/bin/python -m pytest benchmarks/bench_backtest.py --benchmark-only
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from pytest_benchmark.fixture import BenchmarkFixture

from kvwatch.backtest.runner import calibrate, evaluate, simulate
from kvwatch.backtest.scenarios import Scenario, load_trace
from kvwatch.backtest.traces import defaults_for
from kvwatch.forecast import Forecaster, ForecastSample
from kvwatch.sim.traces import packaged_trace

DAY = 86400.0


def day_of_polls(interval: float = 10.0, seed: int = 0) -> list[ForecastSample]:
    """24 h of self-consistent polls: a slow daily swing with noise, counters advancing."""
    rng = random.Random(seed)
    samples, finished, generated = [], 0.0, 0.0
    t = 0.0
    while t < DAY:
        usage = min(1.0, max(0.0, 0.55 + 0.2 * ((t % 21600) / 21600) + rng.gauss(0, 0.05)))
        finished += usage * 50 * interval
        generated += usage * 10_000 * interval
        samples.append(ForecastSample(t, usage, 100_000.0, usage * 100, 0.0, 0.0, finished, generated * 4,
                                      generated, finished * 800, finished, finished * 200, finished))
        t += interval
    return samples


def forecaster_day(samples: list[ForecastSample]) -> float:
    forecaster = Forecaster()
    started = time.perf_counter()
    for sample in samples:
        forecaster.observe(sample)
    return time.perf_counter() - started


def backtest_day(trace_path: Path, hours: float = 24.0) -> dict[str, float]:
    trace = load_trace(trace_path)
    rate_scale, speedup = defaults_for(trace_path)
    scenario = Scenario(trace_path.name, "steady", hours, 0, 0.7, 0.7, rate_scale=rate_scale, engine_speedup=speedup)
    t0 = time.perf_counter()
    calibration = calibrate(trace, rate_scale, 0, speedup=speedup)
    t1 = time.perf_counter()
    simulation = simulate(scenario, trace, calibration=calibration)
    t2 = time.perf_counter()
    evaluate(simulation)
    t3 = time.perf_counter()
    return {"calibrate": t1 - t0, "simulate": t2 - t1, "evaluate": t3 - t2, "total": t3 - t0,
            "requests": float(simulation.requests), "polls": float(len(simulation.samples))}


def test_forecaster_day(benchmark: BenchmarkFixture) -> None:  # pytest-benchmark
    samples = day_of_polls()
    benchmark.pedantic(forecaster_day, args=(samples,), rounds=3, iterations=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=None, help="trace file (default: packaged Azure conv sample)")
    parser.add_argument("--hours", type=float, default=24.0)
    args = parser.parse_args()
    samples = day_of_polls()
    best = min(forecaster_day(samples) for _ in range(3))
    print(f"forecaster: {len(samples)} polls (24 h at 10 s) in {best:.2f} s "
          f"= {best / len(samples) * 1e6:.0f} µs per poll")
    trace = args.trace or packaged_trace("azure_conv_sample.csv")
    r = backtest_day(trace, args.hours)
    print(f"backtest {trace.name} steady 0.7, {args.hours:g} h: {r['requests']:.0f} requests, {r['polls']:.0f} polls; "
          f"calibrate {r['calibrate']:.1f} s, simulate {r['simulate']:.1f} s, kvwatch + 4 baselines + scoring "
          f"{r['evaluate']:.1f} s, total {r['total']:.1f} s")


if __name__ == "__main__":
    main()
