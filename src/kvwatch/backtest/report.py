"""The full backtest table of docs/forecasting.md, reproducibly: ``python -m kvwatch.backtest.report``.

Runs a fixed suite of scenarios (profiles × seeds) on each full trace, pools the outcomes per trace and
profile, and prints a markdown table. Simulations are cached (pickle, keyed by the scenario) so parameter
sweeps re-run only the forecasters.
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvwatch.backtest.runner import KVWATCH, Simulation, evaluate, simulate
from kvwatch.backtest.scenarios import DEFAULT_MAX_MODEL_LEN, Scenario, load_trace
from kvwatch.backtest.scoring import Outcome, pool, summarize
from kvwatch.backtest.traces import defaults_for
from kvwatch.forecast import ForecastParams

METHODS: tuple[str, ...] = (KVWATCH, "threshold", "predict_linear", "guarded_predict_linear", "holt")


@dataclass(frozen=True)
class Case:
    name: str  # the row label: the profile, with the load for ``steady``
    profile: str
    hours: float
    start_load: float
    peak_load: float
    seeds: tuple[int, ...] = (0, 1, 2)
    prompt_scale: float = 1.0
    long_fraction: float = 0.0
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    speedup_factor: float = 1.0  # × the trace's engine speedup (longer prompts need more prefill compute)


# The issue-14 matrix: 7 profiles × 3 seeds per trace family. Steady 0.7 totals 24 simulated hours so its
# false alarms per day are counted, not extrapolated; diurnal runs the rising 8 hours of the daily cosine.
MATRIX: tuple[Case, ...] = (
    Case("ramp", "ramp", 3.0, 0.5, 1.3),
    Case("step", "step", 3.0, 0.6, 1.1),
    Case("diurnal", "diurnal", 8.0, 0.35, 1.25),
    Case("mixshift", "mixshift", 3.0, 0.55, 1.1),
    Case("steady 0.7", "steady", 8.0, 0.7, 0.7),
    Case("steady 0.9", "steady", 4.0, 0.9, 0.9),
    Case("restart", "restart", 4.0, 0.7, 0.7),
)
# Long-context tuning scenarios (run on the tuning trace only): 0.5 % of prompts 16k–32k, or prompts × 4
# (with a 4× faster engine, so prefill compute does not become the limit).
LONG_CONTEXT: tuple[Case, ...] = (
    Case("long-mix ramp", "ramp", 3.0, 0.5, 1.3, long_fraction=0.005, max_model_len=32768),
    Case("long-mix steady 0.7", "steady", 8.0, 0.7, 0.7, long_fraction=0.005, max_model_len=32768),
    Case("prompt×4 ramp", "ramp", 3.0, 0.5, 1.3, prompt_scale=4.0, speedup_factor=4.0),
    Case("prompt×4 steady 0.7", "steady", 8.0, 0.7, 0.7, prompt_scale=4.0, speedup_factor=4.0),
)
SUITE = MATRIX
# CI's deterministic slice (tests/test_backtest_matrix.py): one short ramp and one short steady run.
CI_SLICE: tuple[Case, ...] = (
    Case("ramp", "ramp", 2.0, 0.4, 1.2, seeds=(0,)),
    Case("steady 0.6", "steady", 2.0, 0.6, 0.6, seeds=(0,)),
)


# Bump when scenario generation or the simulator changes, so cached simulations are not reused.
CACHE_VERSION = 3


def _cache_path(cache_dir: Path, scenario: Scenario) -> Path:
    key = hashlib.sha256(f"{CACHE_VERSION}:{scenario!r}".encode()).hexdigest()[:16]
    return cache_dir / f"{scenario.trace_name}-{scenario.profile}-{key}.pickle"


def simulations(trace_path: Path, cases: Iterable[Case], cache_dir: Path | None) -> list[Simulation]:
    trace = None
    rate_scale, speedup = defaults_for(trace_path)
    out = []
    for case in cases:
        for seed in case.seeds:
            scenario = Scenario(trace_path.name, case.profile, case.hours, seed, case.start_load, case.peak_load,
                                rate_scale=rate_scale, engine_speedup=speedup * case.speedup_factor,
                                prompt_scale=case.prompt_scale, long_fraction=case.long_fraction,
                                max_model_len=case.max_model_len)
            path = _cache_path(cache_dir, scenario) if cache_dir else None
            if path is not None and path.is_file():
                out.append(pickle.loads(path.read_bytes()))
                continue
            trace = trace if trace is not None else load_trace(trace_path)
            print(f"simulating {scenario}", file=sys.stderr)
            simulation = simulate(scenario, trace)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(pickle.dumps(simulation))
            out.append(simulation)
    return out


def pooled(sims: Sequence[Simulation], params: ForecastParams | None = None) -> dict[str, dict[str, Outcome]]:
    """Outcomes per profile (and ``all``) per method."""
    by_profile: dict[str, dict[str, list[Outcome]]] = {}
    for sim in sims:
        result = evaluate(sim, params)
        for method, outcome in result.outcomes.items():
            for key in (sim.scenario.profile, "all"):
                by_profile.setdefault(key, {}).setdefault(method, []).append(outcome)
    return {key: {m: pool(o) for m, o in methods.items()} for key, methods in by_profile.items()}


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _minutes(value: float | None) -> str:
    return "–" if value is None else f"{value / 60:.1f}"


def table(trace_name: str, results: dict[str, dict[str, Outcome]]) -> str:
    lines = [
        f"#### {trace_name}",
        "",
        "| profile | method | events | recall@0 | @5m | @15m | @30m | median lead (min) | P10 lead (min) "
        "| precision | false alarms/day |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for profile in [c.profile for c in SUITE if c.profile in results] + ["all"]:
        for method in METHODS:
            outcome = results[profile][method]
            s = summarize(outcome)
            r = s["recall"]
            lines.append(
                f"| {profile} | {method} | {len(outcome.leads)} | {_fmt(r['0'])} | {_fmt(r['300'])} | "
                f"{_fmt(r['900'])} | {_fmt(r['1800'])} | {_minutes(s['median_lead_seconds'])} | "
                f"{_minutes(s['p10_lead_seconds'])} | {_fmt(s['precision'])} | {_fmt(s['false_alarms_per_day'])} |"
            )
    kv = summarize(results["all"][KVWATCH], with_detection=True)["bottleneck"]
    lines += [
        "",
        f"Bottleneck state: recall {_fmt(kv['recall'])}, median time to detect "
        f"{_fmt(kv['median_time_to_detect_seconds'], 0)} s, P95 {_fmt(kv['p95_time_to_detect_seconds'], 0)} s.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvwatch.backtest.report", description=__doc__)
    parser.add_argument("traces", nargs="+", type=Path, help="full trace files (Azure CSV or Mooncake JSONL)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="keep simulations here between runs")
    parser.add_argument("--profiles", default=None, help="comma-separated subset of the suite's profiles")
    args = parser.parse_args(argv)
    cases = [c for c in SUITE if args.profiles is None or c.profile in args.profiles.split(",")]
    for trace_path in args.traces:
        sims = simulations(trace_path, cases, args.cache_dir)
        print(table(trace_path.name, pooled(sims)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
