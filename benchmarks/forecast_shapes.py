"""Synthetic load shapes the trace simulations lack (steps to a plateau, a dip, a step then a ramp), run through
the pure forecaster per version: minutes of ``filling``, the warning's lead on saturation, and ``filling`` long
after the last saturation. The figures of the v8 and v10 sweeps in docs/forecasting-history.md come from here.

    .venv/bin/python benchmarks/forecast_shapes.py [--versions v11,v10]
    .venv/bin/python benchmarks/forecast_shapes.py --versions "v8,ratio 2,ratio 4,constant after the shift"

The v10 sweep adds "recurrence at ≥ 0.5 of the load" and "recurrence at ≥ 0.8 of the load" beside v9 and v10 (0.7).

Each stream is self-consistent, as in tests/test_forecast_states.py: usage × 100k tokens in the cache, requests
of 1,000 tokens held 2 s each (departures by Little's law), polls every 10 s with Gaussian noise on the usage.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import pairwise

from kvwatch.backtest.report import FORECASTERS
from kvwatch.forecast import Forecaster, ForecastParams, ForecastSample

CAPACITY, HOLD_SECONDS, TOKENS = 100_000.0, 2.0, 1_000.0
STEP = 5400.0  # every change happens 90 minutes in: warm by then


def _v8_with(ratio: float | None = None, post_line: bool = True) -> ForecastParams:
    v8 = FORECASTERS["v8"]
    risk = replace(v8.risk, shift_post_line=post_line, **({"shift_ratio": ratio} if ratio else {}))
    return replace(v8, risk=risk, demand=replace(v8.demand, **({"shift_ratio": ratio} if ratio else {})))


# v8's sweep on these shapes (docs/forecasting-history.md): the versions, and v8 with one thing changed.
VERSIONS: dict[str, ForecastParams] = {
    **FORECASTERS,
    "ratio 2": _v8_with(2.0),
    "ratio 4": _v8_with(4.0),
    "constant after the shift": _v8_with(post_line=False),
    # The recurrence counts an onset only while the load is at least this share of the onset's.
    **{f"recurrence at ≥ {r:g} of the load": replace(
        FORECASTERS["v9"], risk=replace(FORECASTERS["v9"].risk, recurrence_load_ratio=r)) for r in (0.5, 0.8)},
    "the window's mean at the onset, not the lowest": replace(
        FORECASTERS["v10"], risk=replace(FORECASTERS["v10"].risk, recurrence_load_trough=False)),
    # A fall of level read from the 1st (v11, round 37), the 2nd or not before the shift's 5th minute after it.
    **{("v11 without the fall" if m == 0 else f"v11 with a fall read after {m} min"): replace(
        FORECASTERS["v11"], risk=replace(FORECASTERS["v11"].risk, fall_min_buckets=m)) for m in (0, 2)},
}

Shape = Callable[[float], float]


def _climbing_bursts(base: float, period: float, ramp: float, start: float = 1800.0, length: float = 600.0) -> Shape:
    """``base``, climbing over ``ramp`` seconds to 0.95 before each saturation of ``length`` seconds every
    ``period`` from ``start``."""
    def usage(t: float) -> float:
        if t < start - ramp:
            return base
        phase = (t - start) % period
        if phase < length:
            return 1.0
        to_next = period - phase
        return base + (0.95 - base) * (1.0 - to_next / ramp) if to_next <= ramp else base
    return usage

SHAPES: dict[str, tuple[Shape, float]] = {  # usage at time t, noise sd
    **{f"step {lo:.1f} -> {hi:.1f}, noise {sd}": ((lambda t, lo=lo, hi=hi: lo if t < STEP else hi), sd)
       for lo, hi in ((0.0, 0.6), (0.2, 0.6), (0.3, 0.7), (0.4, 0.8)) for sd in (0.0, 0.02)},
    "0.7 with a 5-minute drop to 0": ((lambda t: 0.0 if STEP <= t < STEP + 300 else 0.7), 0.02),
    # Traffic that falls for good from a high, unsaturated load (a batch job ending).
    **{f"fall {hi} -> {lo}, noise {sd}": ((lambda t, hi=hi, lo=lo: hi if t < STEP else lo), sd)
       for hi, lo in ((0.9, 0.2), (0.85, 0.4)) for sd in (0.0, 0.02)},
    "ramp 0.4 -> 1.0 over 2 h": ((lambda t: min(1.0, 0.4 + 0.6 * t / 7200)), 0.02),
    # ... and a 20-minute ramp whose engine drains for one minute (to 0.2) 13 or 14 minutes in
    **{f"ramp 0.76 -> 1.0 in 20 min, drained for a minute at its {m}th, noise 0.04": (
        (lambda t, m=m: 0.2 if STEP + m * 60 <= t < STEP + m * 60 + 60
         else 0.76 if t < STEP else min(1.0, 0.76 + 0.24 * (t - STEP) / 1200)), 0.04) for m in (13, 14)},
    "step 0.3 -> 0.75, then a ramp to 1.0 in 60 min": (
        (lambda t: 0.3 if t < STEP else min(1.0, 0.75 + 0.25 * (t - STEP) / 3600)), 0.02),
    "step 0.3 -> 0.8, then a ramp to 1.0 in 30 min": (
        (lambda t: 0.3 if t < STEP else min(1.0, 0.8 + 0.2 * (t - STEP) / 1800)), 0.02),
    "square 0.3 / 0.85, period 60 min": ((lambda t: 0.85 if t % 3600 >= 1800 else 0.3), 0.01),
    # Saturations that stop because the load went away (the end of a busy day).
    "0.7, saturated 5 of every 25 min, then 0.3 from 2.5 h": (
        (lambda t: 0.3 if t >= 9000 else 1.0 if t >= 1800 and (t - 1800) % 1500 < 300 else 0.7), 0.02),
    "0.7, saturated 5 of every 25 min, then 0.55 from 2.5 h": (
        (lambda t: 0.55 if t >= 9000 else 1.0 if t >= 1800 and (t - 1800) % 1500 < 300 else 0.7), 0.02),
    "0.7, saturated 5 of every 25 min, then a fall to 0.1 over an hour from 2.5 h": (
        (lambda t: max(0.1, 0.7 - 0.6 * (t - 9000) / 3600) if t >= 9000
         else 1.0 if t >= 1800 and (t - 1800) % 1500 < 300 else 0.7), 0.02),
    # ... and saturations that come back: a climb from a low base, and a restart into a saturated cache.
    **{f"{base}, a {ramp // 60}-min climb to 0.95 and 10 min saturated every {period // 60} min": (
        _climbing_bursts(base, period, ramp), 0.02)
       for base, period, ramp in ((0.3, 3600, 1200), (0.3, 3600, 600), (0.5, 3600, 1200), (0.4, 5400, 1500))},
    "saturated from the start, then 0.55 saturated 5 of every 25 min": (
        (lambda t: 1.0 if t < 300 or (t >= 1800 and (t - 1800) % 1500 < 300) else 0.55), 0.02),
}


def stream(usage: Shape, sd: float, seconds: float = 4 * 3600.0, dt: float = 10.0,
           seed: int = 5) -> Iterator[ForecastSample]:
    rng = random.Random(seed)
    finished = 0.0
    for i in range(int(seconds / dt)):
        t = i * dt
        u = min(1.0, max(0.0, usage(t) + rng.gauss(0.0, sd))) if sd else usage(t)
        finished += u * CAPACITY / TOKENS / HOLD_SECONDS * dt
        yield ForecastSample(timestamp=t, kv_usage=u, capacity_tokens=CAPACITY, running=u * CAPACITY / TOKENS,
                             finished_total=finished, prompt_tokens_total=finished * 800,
                             generation_tokens_total=finished * 200, request_prompt_tokens_sum=finished * 800,
                             request_prompt_tokens_count=finished, request_generation_tokens_sum=finished * 200,
                             request_generation_tokens_count=finished)


def summary(params: ForecastParams, usage: Shape, sd: float) -> str:
    """Minutes in ``filling``, the lead of the first warning on the first ``bottleneck`` (if both), and the minutes
    of ``filling`` more than 30 minutes after the last one (the next saturation it would stand for never comes)."""
    forecaster = Forecaster(params)
    results = [forecaster.observe(s) for s in stream(usage, sd)]
    filling = sum(r.state == "filling" for r in results) * 10 / 60
    saturated = next((r.timestamp for r in results if r.state == "bottleneck"), None)
    warned = next((r.timestamp for r in results if r.state == "filling"), None)
    if saturated is None:
        return f"{filling:.0f} min filling, no saturation"
    lead = "no warning" if warned is None or warned > saturated else f"warned {(saturated - warned) / 60:.1f} min ahead"
    last = max(r.timestamp for r in results if r.state == "bottleneck")
    after = sum(r.state == "filling" and r.timestamp > last + 1800 for r in results) * 10 / 60
    state_at = {r.timestamp: r.state for r in results}
    onsets = [b.timestamp for a, b in pairwise(results) if b.state == "bottleneck" != a.state]
    later = f", warned 5 min ahead of {sum(state_at.get(t - 300) == 'filling' for t in onsets[1:])} of " \
            f"{len(onsets) - 1} later saturations" if len(onsets) > 1 else ""
    return f"{filling:.0f} min filling, {lead}, {after:.0f} min filling 30+ min after the last saturation{later}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", default="v11,v10", help="comma-separated: " + ", ".join(VERSIONS))
    versions = parser.parse_args().versions.split(",")
    print("| shape | " + " | ".join(versions) + " |")
    print("|---|" + "---|" * len(versions))
    for name, (usage, sd) in SHAPES.items():
        print(f"| {name} | " + " | ".join(summary(VERSIONS[v], usage, sd) for v in versions) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
