"""How independent the polls inside a minute are, on the tuning family's simulations (docs/forecasting.md, Limits,
"Independent jitter around a high mean"): per run, over sliding 30-minute windows, the lag-1 autocorrelation of
the polls' deviations from their own minute's mean (six independent polls give about −1/6), and the variance of
the minute means around their line over what averaging independent polls would give (each minute's variance of its
polls over their number, averaged over the window; 1 = the minute means move only as much as the polls' own noise).

    .venv/bin/python benchmarks/forecast_poll_noise.py AzureLLMInferenceTrace_conv.csv --cache-dir /tmp/kvwatch-bt
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

from forecast_sweep import tuning_family

from kvwatch.backtest.report import case_name
from kvwatch.forecast.forecaster import ForecastSample
from kvwatch.forecast.robust import least_squares

WINDOW = 30  # minutes, the risk's window


def minutes(samples: Sequence[ForecastSample]) -> list[list[float]]:
    """The polls' usage per minute (minutes with at least 3 polls)."""
    by_minute: dict[int, list[float]] = {}
    for s in samples:
        if s.kv_usage is not None:
            by_minute.setdefault(int(s.timestamp // 60), []).append(s.kv_usage)
    return [polls for _, polls in sorted(by_minute.items()) if len(polls) >= 3]


def lag1_and_ratio(window: list[list[float]]) -> tuple[float | None, float | None]:
    squares = products = 0.0
    for polls in window:
        mean = sum(polls) / len(polls)
        deviations = [u - mean for u in polls]
        squares += sum(d * d for d in deviations)
        products += sum(a * b for a, b in pairwise(deviations))
    lag1 = products / squares if squares > 0 else None
    means = [sum(p) / len(p) for p in window]
    residuals = least_squares([(float(i), m) for i, m in enumerate(means)])[4]
    residual = sum(r * r for r in residuals) / (len(window) - 2)
    averaging = statistics.fmean(statistics.variance(p) / len(p) for p in window)
    return lag1, residual / averaging if averaging > 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tuning", type=Path, help="the tuning trace (Azure conversation CSV)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="keep simulations here between runs")
    args = parser.parse_args()
    print("| run | seed | lag-1 autocorrelation within minutes (median) | minute means' variance / averaging "
          "(median) |")
    print("|---|---:|---:|---:|")
    for sim in tuning_family(args.tuning, args.cache_dir):
        mins = minutes(sim.samples)
        pairs = [lag1_and_ratio(mins[i - WINDOW:i]) for i in range(WINDOW, len(mins) + 1)]
        lags = [a for a, _ in pairs if a is not None]
        ratios = [b for _, b in pairs if b is not None]
        print(f"| {case_name(sim.scenario)} | {sim.scenario.seed} | {statistics.median(lags):.2f} | "
              f"{statistics.median(ratios):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
