"""Memory one ``Forecaster`` keeps for its series once warm, under ``tracemalloc``.

Feeds one forecaster the polls of ``bench_forecast_cpu.py`` (a simulated Azure-conversation stream at load 0.7,
10-s polls) for ``--hours`` and prints the memory still allocated after the last poll, less what was allocated
before the first. Two ways of reading the length histograms: every poll (as the backtest does) and once a minute
(as ``kvwatch serve`` does, docs/performance.md "Memory per series"); in the second, the other polls carry none.
The total is a series' forecaster only: the page, the history and the exposition are ``series_memory.py``'s.

    .venv/bin/python benchmarks/forecaster_memory.py [--hours 6]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import tracemalloc
from collections.abc import Iterable

from bench_forecast_cpu import polls

from kvwatch.forecast import Forecaster, ForecastSample

LENGTH_FIELDS = ("prompt_length_bounds", "prompt_length_cumulative", "generation_length_bounds",
                 "generation_length_cumulative")


def once_a_minute(samples: Iterable[ForecastSample]) -> list[ForecastSample]:
    """The polls with length buckets on the first of each minute only, each with bounds of its own (as parsed)."""
    out, minute = [], None
    for s in samples:
        this = int(s.timestamp // 60)
        if this == minute:
            s = dataclasses.replace(s, **dict.fromkeys(LENGTH_FIELDS))
        else:
            own = {f: tuple(float(v) for v in getattr(s, f)) for f in LENGTH_FIELDS if getattr(s, f) is not None}
            s = dataclasses.replace(s, **own)
        minute = this
        out.append(s)
    return out


def kept_kib(samples: list[ForecastSample]) -> float:
    """KiB allocated by feeding ``samples`` to a new forecaster and still held after the last one."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    forecaster = Forecaster()
    for s in samples:
        forecaster.observe(s)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del forecaster
    return held / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=6.0, help="simulated hours of polls (default 6: the "
                        "self-calibration's window, when every per-series store is full)")
    args = parser.parse_args()
    every_poll = polls(args.hours)
    print(f"{len(every_poll)} polls of 10 s ({args.hours:g} simulated hours), one series")
    print(f"length buckets every poll (backtest): {kept_kib(every_poll):.0f} KiB held")
    print(f"length buckets once a minute (serve): {kept_kib(once_a_minute(every_poll)):.0f} KiB held")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
