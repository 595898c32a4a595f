"""``--plot PNG``: usage, forecast, warnings and events on one timeline (matplotlib, optional extra)."""

from __future__ import annotations

import math
from pathlib import Path

from kvwatch.backtest.runner import KVWATCH, RunResult
from kvwatch.backtest.scoring import find_episodes
from kvwatch.forecast.thresholds import SATURATION_USAGE
from kvwatch.settings import SettingsError


def plot_run(result: RunResult, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - the plot extra is installed in dev
        raise SettingsError("--plot needs matplotlib: pip install 'kvwatch[plot]'") from exc

    tl = result.timeline
    minutes = [t / 60.0 for t in tl.times]
    fig, (ax, lanes) = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True, height_ratios=[3, 1.4])
    load = [result.scenario.demand_at(t) for t in tl.times]
    # Every line stays inside the axes: the top covers usage and load; the demand forecast is clipped to it.
    top = max(1.3, max(load) * 1.05)
    ax.plot(minutes, tl.usage, lw=0.6, color="0.55", label="KV usage (10-s polls)")
    # A value kvwatch does not give (warm-up, after a restart) is a gap, NaN: left out, the line joined its ends
    # across the gap with a straight segment no data backs.
    nan = float("nan")
    forecast = [nan if v is None else min(v, top) for v in tl.forecast_30m]
    if not all(math.isnan(v) for v in forecast):
        ax.plot(minutes, forecast, lw=1.0, color="tab:blue",
                label=f"kvwatch demand forecast, 30 min ahead (clipped at {top:.2f})")
    risks = tl.probabilities.get(KVWATCH, {}).get(1800, [])
    risk = [nan if v is None else v for v in risks]
    if not all(math.isnan(v) for v in risk):
        ax.plot(minutes[:len(risk)], risk, lw=1.4, color="tab:green", label="kvwatch saturation risk within 30 min")
    ax.plot(minutes, load, lw=1.0, ls=":", color="k", label="offered KV demand (scenario)")
    ax.axhline(SATURATION_USAGE, color="tab:red", lw=0.8, ls="--", label=f"saturation threshold {SATURATION_USAGE:g}")
    for i, event in enumerate(result.events):
        ax.axvspan(event.onset / 60, event.end / 60, color="tab:red", alpha=0.12,
                   label="saturation event" if i == 0 else None)
        ax.axvline(event.onset / 60, color="tab:red", lw=1.0)
    for i, restart in enumerate(result.scenario.restart_times):
        ax.axvline(restart / 60, color="tab:purple", lw=1.0, ls="-.", label="engine restart" if i == 0 else None)
    ax.set_ylabel("fraction of KV capacity / probability")
    ax.set_ylim(0, top * 1.03)  # the clipped forecast runs just under the frame, not hidden on it
    ax.set_xlim(0, result.scenario.seconds / 60.0)
    # beside the axes, not over them: upper left hid the 0.95 line and the first half hour
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8)
    s = result.scenario
    shaping = "".join((f", prompts ×{s.prompt_scale:g}" if s.prompt_scale != 1.0 else "",
                       f", {100 * s.long_fraction:.3g} % long prompts" if s.long_fraction > 0.0 else ""))
    ax.set_title(f"{s.trace_name}: {s.profile} {s.load_text.replace('->', '→')}, {s.hours:g} h, seed {s.seed}{shaping}")

    methods = list(tl.warnings)
    for row, method in enumerate(methods):
        y = len(methods) - 1 - row
        for ep in find_episodes(tl.times, tl.warnings[method]):
            lanes.broken_barh([(ep.start / 60, max(ep.end - ep.start, 10) / 60)], (y - 0.35, 0.7),
                              color="tab:orange" if method == KVWATCH else "tab:gray")
    for event in result.events:
        lanes.axvline(event.onset / 60, color="tab:red", lw=1.0)
    lanes.set_yticks(range(len(methods)), list(reversed(methods)), fontsize=8)
    lanes.set_xlabel("minutes")
    lanes.set_ylim(-0.6, len(methods) - 0.4)
    lanes.set_title("warnings (kvwatch: filling or bottleneck)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
