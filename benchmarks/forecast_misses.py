"""Why the forecast misses the saturations it misses: every scored event of a family, classified.

For each event (onset outside warm-up) of each (cached) simulation, with the forecaster given by
``--forecaster`` (default v10, the defaults):

- ``caught``: a warning episode began 5 to 60 minutes before the onset, outside any saturation, and was still
  on at the onset (the scorer's lead ≥ 5 min);
- ``at a shift``: the onset is within 5 minutes after the scenario's step, mix shift or restart, with no
  warning: nothing before it announced the change, so no forecast could have led it by 5 minutes;
- ``on since a saturation``: the warning was on through the 5 minutes before the onset, in one episode that
  began during an earlier saturation (``bottleneck`` lingering into the quiet gap, then the warning): a
  reaction, which the scorer's lead does not credit (the steady-load criterion "on 5 min before" does);
- ``on > 60 min``: the warning was on through the 5 minutes before the onset but its episode began over an
  hour earlier, which the scorer's lead does not credit either;
- ``late``: a warning began less than 5 minutes before the onset;
- otherwise by the largest 30-minute risk from 20 to 5 minutes before the onset: ``no sign`` (< 0.3),
  ``sub-threshold`` (0.3 to the warning's 0.7), ``above, not held`` (≥ 0.7 but no warning: the 3-minute hold
  or the re-arm after a saturation).

``--arrivals`` adds a second table: per class, the median of the largest single request (prompt + output
tokens, as a share of the cache) arriving in the 5 minutes before each onset, next to the same over random
5-minute windows of the same runs. A saturation made by one request too large for the headroom would show
here as a larger request before onsets than anywhere else (a "jump" the length histograms could price).

    .venv/bin/python benchmarks/forecast_misses.py CONV.csv --cache-dir /tmp/kvwatch-bt              # tuning family
    .venv/bin/python benchmarks/forecast_misses.py CODE.csv --cache-dir /tmp/kvwatch-bt --seeds 700,701,702

A tuning trace (the Azure conversation CSV) is read as forecast_sweep.py's whole tuning family; any other
trace as the issue-14 matrix and its no-saturation rows with ``--seeds``. Diagnosis only: a held-out
family's classes explain its recall, and no parameter may be changed because of them.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

from kvwatch.backtest.report import FORECASTERS, MATRIX, NO_SATURATION, case_name, simulations
from kvwatch.backtest.runner import KVWATCH, RunResult, Simulation, evaluate
from kvwatch.backtest.scenarios import load_trace, scenario_arrivals
from kvwatch.backtest.scoring import find_episodes, scored_events, warmup_windows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forecast_sweep import tuning_family  # a sibling script, not part of the package

LEAD_SECONDS = 300.0
MATCH_SECONDS = 3600.0
SHIFTED = ("step", "mixshift", "restart")
RANDOM_WINDOWS_PER_RUN = 50
CLASSES = ("caught", "at a shift", "on since a saturation", "on > 60 min", "late", "no sign", "sub-threshold",
           "above, not held")


def classify(run: RunResult, risk_on: float = 0.7) -> list[str]:
    """One class per scored event of ``run`` (in onset order)."""
    scenario, timeline = run.scenario, run.timeline
    warmup = warmup_windows(scenario.restart_times, scenario.seconds)
    scored = scored_events(run.events, warmup)
    active = timeline.warnings[KVWATCH]
    risk = timeline.probabilities[KVWATCH][1800]
    episodes = find_episodes(timeline.times, active)
    classes = []
    for event, lead in zip(scored, run.outcomes[KVWATCH].leads, strict=True):
        before = [i for i, t in enumerate(timeline.times) if event.onset - LEAD_SECONDS <= t < event.onset]
        if lead is not None:
            classes.append("caught" if lead >= LEAD_SECONDS else "late")
        elif scenario.profile in SHIFTED and 0.0 <= event.onset - scenario.shift_time <= LEAD_SECONDS:
            classes.append("at a shift")
        elif before and all(active[i] for i in before):
            start = max(ep.start for ep in episodes if ep.start <= event.onset)
            reaction = any(e.onset <= start <= e.end for e in run.events)
            classes.append("on since a saturation" if reaction else "on > 60 min")
        else:
            window = [risk[i] or 0.0 for i, t in enumerate(timeline.times)
                      if event.onset - 4 * LEAD_SECONDS <= t <= event.onset - LEAD_SECONDS]
            worst = max(window, default=0.0)
            classes.append("no sign" if worst < 0.3 else "sub-threshold" if worst < risk_on else "above, not held")
    return classes


def table(sims: list[Simulation], forecaster: str) -> str:
    params = FORECASTERS[forecaster]
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    for sim in sims:
        run = evaluate(sim, params)
        for name in (case_name(sim.scenario), "all"):
            rows[name].update(classify(run, params.warning.risk_on))
    lines = ["| row | events | " + " | ".join(CLASSES) + " |", "|---|---:|" + "---:|" * len(CLASSES)]
    for name in sorted(rows, key=lambda n: (n == "all", n)):
        counts = rows[name]
        lines.append(f"| {name} | {sum(counts.values())} | " + " | ".join(str(counts[c]) for c in CLASSES) + " |")
    return "\n".join(lines)


def largest_arrival(arrivals: list[tuple[float, int]], start: float, end: float) -> int:
    """The largest footprint among ``(arrival time, tokens)`` pairs arriving in ``[start, end)``; 0 if none."""
    return max((tokens for t, tokens in arrivals if start <= t < end), default=0)


def arrivals_table(sims: list[Simulation], forecaster: str, trace: Path) -> str:
    params, requests = FORECASTERS[forecaster], load_trace(trace)
    rng = random.Random(0)
    by_class: dict[str, list[float]] = defaultdict(list)
    for sim in sims:
        capacity = next(s.capacity_tokens for s in sim.samples if s.capacity_tokens)
        arrivals = [(r.arrival_time, r.prompt_tokens + r.output_tokens)
                    for r in scenario_arrivals(sim.scenario, requests)]
        run = evaluate(sim, params)
        warmup = warmup_windows(run.scenario.restart_times, run.scenario.seconds)
        scored = scored_events(run.events, warmup)
        for event, name in zip(scored, classify(run, params.warning.risk_on), strict=True):
            by_class[name].append(largest_arrival(arrivals, event.onset - LEAD_SECONDS, event.onset) / capacity)
        for _ in range(RANDOM_WINDOWS_PER_RUN):
            end = rng.uniform(LEAD_SECONDS, sim.scenario.seconds)
            by_class["random 5-min windows"].append(largest_arrival(arrivals, end - LEAD_SECONDS, end) / capacity)
    lines = ["| before | n | largest arrival / cache: median | 90th percentile |", "|---|---:|---:|---:|"]
    for name in (*CLASSES, "random 5-min windows"):
        shares = sorted(by_class[name])
        if shares:
            p90 = shares[min(len(shares) - 1, int(0.9 * len(shares)))]
            lines.append(f"| {name} | {len(shares)} | {statistics.median(shares):.3f} | {p90:.3f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, help="a trace: the tuning CSV, or a held-out trace with --seeds")
    parser.add_argument("--cache-dir", type=Path, default=None, help="the simulations' cache (as forecast_matrix.py)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds of the matrix (a held-out trace)")
    parser.add_argument("--forecaster", choices=sorted(FORECASTERS), default="v11")
    parser.add_argument("--arrivals", action="store_true",
                        help="also the largest single arrival before each onset, per class, against random windows")
    args = parser.parse_args()
    if args.seeds is None:
        sims = tuning_family(args.trace, args.cache_dir)
    else:
        seeds = [int(s) for s in args.seeds.split(",")]
        sims = simulations(args.trace, MATRIX, args.cache_dir, seeds=seeds)
        sims += simulations(args.trace, NO_SATURATION, args.cache_dir, seeds=seeds)
    print(table(sims, args.forecaster))
    if args.arrivals:
        print()
        print(arrivals_table(sims, args.forecaster, args.trace))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
