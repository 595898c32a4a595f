"""The issue-14 backtest matrix in one command: 3 trace families × 7 profiles × 3 seeds, plus the
long-context and generalization tuning rows on the tuning trace and, per family, steady 0.7 in a cache
twice as large (NO_SATURATION: 3 × 9 h, the false alarms per day where nothing saturates). Prints the
markdown tables of docs/forecasting-history.md (earlier rounds) and docs/forecasting.md.

    .venv/bin/python benchmarks/forecast_matrix.py CONV.csv CODE.csv MOONCAKE.jsonl --cache-dir /tmp/kvwatch-bt

The default scores the current forecaster (v11, self-calibrated); ``--forecaster v10`` the same risk without the
self-calibration, ``v5`` to ``v9`` earlier versions on the same (cached) simulations (``v7``: the request-size tail
from the length buckets, tried, not the default: docs/forecasting.md).

CONV is the tuning trace (Azure 2023 conversation); CODE (Azure 2023 code) and MOONCAKE (Mooncake
conversation) are held out. The traces are not in the repository (see src/kvwatch/data/traces/README.md
for where they come from). ``--cache-dir`` keeps each simulation, so re-scoring after a change takes
seconds; simulating everything takes hours of one core (about 2 minutes per simulated 3-hour conversation
ramp on a shared 2-core machine). CI runs the deterministic slice in tests/test_backtest_matrix.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvwatch.backtest.report import (
    FORECASTERS,
    GENERALIZATION,
    LONG_CONTEXT,
    MATRIX,
    NO_SATURATION,
    pooled,
    simulations,
    table,
)
from kvwatch.forecast import ForecastParams


def tuning_tables(tuning: Path, cache_dir: Path | None, seeds: list[int], params: ForecastParams) -> None:
    """The tuning trace's tables: the matrix, the long-context rows, the generalization shapes, no saturation."""
    print(table(f"{tuning.name} (tuning)",
                pooled(simulations(tuning, MATRIX, cache_dir, seeds=seeds), params)))
    print(table(f"{tuning.name}, long-context rows (tuning)",
                pooled(simulations(tuning, LONG_CONTEXT, cache_dir, seeds=seeds), params)))
    print(table(f"{tuning.name}, generalization shapes (tuning)",
                pooled(simulations(tuning, GENERALIZATION, cache_dir), params)))
    print(table(f"{tuning.name}, steady 0.7 where nothing saturates (tuning)",
                pooled(simulations(tuning, NO_SATURATION, cache_dir, seeds=seeds), params)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tuning", type=Path, help="the tuning trace (Azure conversation CSV)")
    parser.add_argument("held_out", type=Path, nargs="+", help="held-out traces (Azure code CSV, Mooncake JSONL)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="keep simulations here between runs")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--held-out-seeds", default=None,
                        help="seeds for the held-out traces (default: --seeds); fresh ones once a seed was seen")
    parser.add_argument("--forecaster", choices=sorted(FORECASTERS), default="v11",
                        help="the version to score (default v11, the current defaults; older ones for comparison)")
    parser.add_argument("--held-out-only", action="store_true",
                        help="score only the held-out traces (the tuning tables need the tuning simulations)")
    args = parser.parse_args()
    params = FORECASTERS[args.forecaster]
    seeds = [int(s) for s in args.seeds.split(",")]
    held_out_seeds = [int(s) for s in args.held_out_seeds.split(",")] if args.held_out_seeds else seeds
    if not args.held_out_only:
        tuning_tables(args.tuning, args.cache_dir, seeds, params)
    for path in args.held_out:
        print(table(f"{path.name} (held out)",
                    pooled(simulations(path, MATRIX, args.cache_dir, seeds=held_out_seeds), params)))
        print(table(f"{path.name}, steady 0.7 in a cache twice as large (held out)",
                    pooled(simulations(path, NO_SATURATION, args.cache_dir, seeds=held_out_seeds), params)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
