"""Two forecaster versions on the same (cached) simulations, per row, in the format of
docs/forecasting-history.md's tables ("A [B]"): recall at 5 and 15 minutes, warning on 5 minutes before, false
alarms, Brier.

    .venv/bin/python benchmarks/forecast_compare.py AzureLLMInferenceTrace_code.csv --cache-dir /tmp/kvwatch-bt \
        --seeds 500,501,502 --versions v7,v6 [--no-saturation]

A held-out trace is scored by this once, after the freeze (forecasting.md, Results: discipline).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvwatch.backtest.report import FORECASTERS, MATRIX, NO_SATURATION, Pooled, pooled, simulations
from kvwatch.backtest.runner import KVWATCH
from kvwatch.backtest.scoring import summarize

HORIZONS = (300, 900, 1800)


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _brier(p: Pooled, key: str, method: str) -> str:
    rel = p.reliability.get(key, {})
    if not rel:
        return "– / – / –"
    if method == "climatology":
        return " / ".join(_f(rel[h][KVWATCH].climatology_brier, 4) for h in HORIZONS)
    return " / ".join(_f(rel[h][method].brier, 4) for h in HORIZONS)


def rows(a: Pooled, b: Pooled) -> list[str]:
    lines = ["| profile | runs | events | recall@5m A [B] | @15m A [B] | `predict_linear` @5m / @15m | on 5 min before "
             "A [B] | false alarms A [B] (monitored h) | Brier 5m / 15m / 30m A | B | climatology | `predict_linear` |",
             "|---|---:|---:|---|---|---|---|---|---|---|---|---|"]
    for key in [k for k in a.outcomes if k != "all"] + ["all"]:
        sa, sb = summarize(a.outcomes[key][KVWATCH]), summarize(b.outcomes[key][KVWATCH])
        pl = summarize(a.outcomes[key]["predict_linear"])
        fa = f"{sa['false_alarms']}" + ("" if sa["false_alarms_per_day"] is None
                                        else f", {sa['false_alarms_per_day']:.2f}/day")
        fb = f"{sb['false_alarms']}" + ("" if sb["false_alarms_per_day"] is None
                                        else f", {sb['false_alarms_per_day']:.2f}/day")
        lines.append(
            f"| {key} | {a.seeds[key]} | {len(a.outcomes[key][KVWATCH].leads)} | {_f(sa['recall']['300'])} "
            f"[{_f(sb['recall']['300'])}] | {_f(sa['recall']['900'])} [{_f(sb['recall']['900'])}] | "
            f"{_f(pl['recall']['300'])} / {_f(pl['recall']['900'])} | {_f(sa['active_5m_before'])} "
            f"[{_f(sb['active_5m_before'])}] | {fa} [{fb}] ({sa['monitored_hours']:.1f}) | "
            f"{_brier(a, key, KVWATCH)} | {_brier(b, key, KVWATCH)} | {_brier(a, key, 'climatology')} | "
            f"{_brier(a, key, 'predict_linear')} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--versions", default="v7,v6", help="A,B: two of " + ", ".join(sorted(FORECASTERS)))
    parser.add_argument("--no-saturation", action="store_true", help="steady 0.7 in a 2x cache instead of the matrix")
    args = parser.parse_args()
    a, b = args.versions.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    sims = simulations(args.trace, NO_SATURATION if args.no_saturation else MATRIX, args.cache_dir, seeds=seeds)
    print(f"A = {a}, B = {b}")
    print("\n".join(rows(pooled(sims, FORECASTERS[a]), pooled(sims, FORECASTERS[b]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
