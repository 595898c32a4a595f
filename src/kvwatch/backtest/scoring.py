"""Ground truth and scores, following docs/forecasting.md §Evaluation (pure functions).

- A sample is *saturated* when usage ≥ 0.95, or usage ≥ 0.90 with a request waiting, or a preemption
  happened since the previous sample. A sample is in a *sustained* saturation when ≥ 80 % of the samples
  in a trailing 2-minute window are saturated. A *saturation event* begins at the first sustained
  saturated sample after at least ``QUIET_SECONDS`` (N = 10 minutes) without one; saturation that resumes
  sooner continues the previous event.
- *Warm-up* (fair to every method): no method's warning counts during the first ``WARMUP_SECONDS`` after
  the start of monitoring or an engine restart (kvwatch needs that long before it may warn; a baseline
  "warning" in its first minute of data is no forecast). Events whose onset falls inside a warm-up are
  scored separately (``warmup_events``), not in recall; warm-up time is not monitored time.
- False alarms per day are reported only over at least 24 monitored hours (pooled runs add up), never
  extrapolated from a shorter run; the raw count is always reported.
- A *warning episode* is a contiguous run of samples with the method's warning active. It is a true
  positive when an event starts within it or within 60 minutes after it started, a false alarm when
  not; episodes that start during an event are not early warnings and are left out of precision.
- The *lead* of an event is its onset minus the start of the earliest episode that began at most 60
  minutes before it, outside any event, and was still on at the onset (``ONSET_GRACE_SECONDS``, the
  alert's ``keep_firing_for``). A warning that had ended, or that began as a reaction to an earlier
  saturation, warned of nothing: before 2026-12-04 both were credited, and a 1-minute usage threshold
  earned recall at 30 minutes. No such episode: the event was missed early.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvwatch.forecast.robust import quantile
from kvwatch.forecast.thresholds import BUSY_USAGE, SATURATION_USAGE

LEADS_SECONDS: tuple[int, ...] = (0, 300, 900, 1800)
QUIET_SECONDS = 600.0  # N: an event needs this long without sustained saturation before its onset
WARMUP_SECONDS = 1800.0  # every method's warm-up after monitoring starts and after each restart
MIN_DAY_SECONDS = 86400.0  # false alarms per day need at least this much monitored time
ONSET_GRACE_SECONDS = 60.0  # a warning that went off at most this long before an onset still leads it


@dataclass(frozen=True)
class Event:
    onset: float
    end: float


@dataclass(frozen=True)
class Episode:
    start: float
    end: float


def saturated_samples(
    usage: Sequence[float],
    waiting: Sequence[float],
    preemptions_total: Sequence[float],
    *,
    u_sat: float = SATURATION_USAGE,
    u_busy: float = BUSY_USAGE,
) -> list[bool]:
    flags = []
    previous = None
    for u, w, p in zip(usage, waiting, preemptions_total, strict=True):
        preempted = previous is not None and p > previous
        flags.append(u >= u_sat or (u >= u_busy and w >= 1) or preempted)
        previous = p
    return flags


def find_events(
    times: Sequence[float],
    saturated: Sequence[bool],
    *,
    window_seconds: float = 120.0,
    fraction: float = 0.8,
    merge_gap_seconds: float = QUIET_SECONDS,
) -> list[Event]:
    """Sustained saturated stretches (offline, may look at the whole window)."""
    marked = [False] * len(times)
    left = 0
    count = 0
    for right, t in enumerate(times):
        count += saturated[right]
        while times[left] <= t - window_seconds:
            count -= saturated[left]
            left += 1
        span = t - times[left]
        size = right - left + 1
        if size >= 3 and span >= 0.75 * window_seconds and count >= fraction * size:
            for i in range(left, right + 1):
                if saturated[i]:
                    marked[i] = True
    events: list[Event] = []
    for i, t in enumerate(times):
        if not marked[i]:
            continue
        if events and t - events[-1].end < merge_gap_seconds:
            events[-1] = Event(events[-1].onset, t)
        else:
            events.append(Event(t, t))
    return events


def find_episodes(times: Sequence[float], active: Sequence[bool]) -> list[Episode]:
    episodes: list[Episode] = []
    start = None
    last = None
    for t, on in zip(times, active, strict=True):
        if on and start is None:
            start = t
        elif not on and start is not None:
            episodes.append(Episode(start, last if last is not None else start))
            start = None
        last = t
    if start is not None and last is not None:
        episodes.append(Episode(start, last))
    return episodes


@dataclass
class Outcome:
    """Raw tallies of one method over one or more runs (poolable)."""

    leads: list[float | None] = field(default_factory=list)  # one per event; None = missed early
    true_positive_episodes: int = 0
    false_alarm_episodes: int = 0
    late_episodes: int = 0  # started during an event: not scored for precision
    monitored_seconds: float = 0.0
    detect_delays: list[float | None] = field(default_factory=list)  # bottleneck time-to-detect per event
    warmup_events: int = 0  # onset inside a warm-up: scored separately, not in recall
    # per scored event: the warning was on through the whole 5 minutes before the onset (however early it began)
    active_before: list[bool] = field(default_factory=list)

    def add(self, other: Outcome) -> Outcome:
        return Outcome(
            active_before=self.active_before + other.active_before,
            warmup_events=self.warmup_events + other.warmup_events,
            leads=self.leads + other.leads,
            true_positive_episodes=self.true_positive_episodes + other.true_positive_episodes,
            false_alarm_episodes=self.false_alarm_episodes + other.false_alarm_episodes,
            late_episodes=self.late_episodes + other.late_episodes,
            monitored_seconds=self.monitored_seconds + other.monitored_seconds,
            detect_delays=self.detect_delays + other.detect_delays,
        )


def scored_events(events: Sequence[Event], warmup: Sequence[tuple[float, float]]) -> list[Event]:
    """The events every method is scored on: those whose onset is outside warm-up."""
    return [e for e in events if not in_windows(e.onset, warmup)]


def in_windows(t: float, windows: Sequence[tuple[float, float]]) -> bool:
    return any(start <= t < end for start, end in windows)


def warmup_windows(restarts: Sequence[float], end: float, seconds: float = WARMUP_SECONDS) -> list[tuple[float, float]]:
    """Warm-up after the start of monitoring (time 0) and after each restart, clipped to ``end``."""
    return [(t, min(end, t + seconds)) for t in (0.0, *restarts)]


def mask_warmup(times: Sequence[float], active: Sequence[bool], windows: Sequence[tuple[float, float]]) -> list[bool]:
    """A method's warning with every warm-up poll forced off (the same for every method)."""
    return [on and not in_windows(t, windows) for t, on in zip(times, active, strict=True)]


def score_run(
    events: Sequence[Event],
    episodes: Sequence[Episode],
    *,
    monitored_seconds: float,
    match_seconds: float = 3600.0,
    warmup: Sequence[tuple[float, float]] = (),
) -> Outcome:
    """Score one method's episodes (already masked by ``warmup``) against the events of one run.

    ``monitored_seconds`` is the run's length; warm-up time is subtracted from it here.
    """
    def during_event(t: float) -> bool:
        return any(e.onset <= t <= e.end for e in events)

    scored = scored_events(events, warmup)
    warm_seconds = sum(end - start for start, end in warmup)
    early = [ep for ep in episodes if not during_event(ep.start)]
    outcome = Outcome(late_episodes=len(episodes) - len(early),
                      monitored_seconds=max(0.0, monitored_seconds - warm_seconds),
                      warmup_events=len(events) - len(scored))
    for ep in early:
        matched = any(
            ep.start < e.onset <= ep.start + match_seconds or ep.start <= e.onset <= ep.end for e in events
        )
        if matched:
            outcome.true_positive_episodes += 1
        else:
            outcome.false_alarm_episodes += 1
    for e in scored:
        # An early warning still on at this onset (see the module doc).
        candidates = [ep.start for ep in early
                      if e.onset - match_seconds <= ep.start <= e.onset and ep.end >= e.onset - ONSET_GRACE_SECONDS]
        outcome.leads.append(e.onset - min(candidates) if candidates else None)
    return outcome


def active_before_onsets(events: Sequence[Event], times: Sequence[float], active: Sequence[bool],
                         warmup: Sequence[tuple[float, float]] = (), *, seconds: float = 300.0) -> list[bool]:
    """Per scored event: was the warning on at every poll of the ``seconds`` before its onset?

    The steady-load criterion (docs/forecasting.md, "warning active ≥ 5 min before"): unlike the lead, a warning that
    began more than an hour earlier and is still on counts.
    """
    out = []
    for e in events:
        if in_windows(e.onset, warmup):
            continue
        window = [on for t, on in zip(times, active, strict=True) if e.onset - seconds <= t < e.onset]
        out.append(bool(window) and all(window))
    return out


def detection_delays(events: Sequence[Event], times: Sequence[float], firing: Sequence[bool],
                     *, grace_seconds: float = 300.0) -> list[float | None]:
    """Per event: first time the reactive alert fires at or after onset (within the event + grace)."""
    delays: list[float | None] = []
    for e in events:
        delay = None
        for t, on in zip(times, firing, strict=True):
            if t < e.onset:
                continue
            if t > e.end + grace_seconds:
                break
            if on:
                delay = t - e.onset
                break
        delays.append(delay)
    return delays


def _quantile(values: Sequence[float], q: float) -> float | None:
    return quantile(values, q) if values else None


def summarize(outcome: Outcome, *, with_detection: bool = False) -> dict:
    """The JSON block of one method (keys are the ``kvwatch backtest --json`` contract)."""
    n = len(outcome.leads)
    detected = [lead for lead in outcome.leads if lead is not None]
    recall = {str(L): (sum(lead >= L for lead in detected) / n if n else None) for L in LEADS_SECONDS}
    episodes = outcome.true_positive_episodes + outcome.false_alarm_episodes
    days = outcome.monitored_seconds / 86400.0
    enough = outcome.monitored_seconds >= MIN_DAY_SECONDS
    summary: dict = {
        "recall": recall,
        "median_lead_seconds": _quantile(detected, 0.5),
        "p10_lead_seconds": _quantile(detected, 0.1),
        "precision": outcome.true_positive_episodes / episodes if episodes else None,
        "false_alarms_per_day": outcome.false_alarm_episodes / days if enough else None,
        "false_alarms": outcome.false_alarm_episodes,
        "monitored_hours": outcome.monitored_seconds / 3600.0,
        "warmup_events": outcome.warmup_events,
        "episodes": episodes,
        "late_episodes": outcome.late_episodes,
        "episodes_per_event": outcome.true_positive_episodes / len(detected) if detected else None,
        "active_5m_before": (sum(outcome.active_before) / len(outcome.active_before)
                             if outcome.active_before else None),
    }
    if with_detection:
        found = [d for d in outcome.detect_delays if d is not None]
        summary["bottleneck"] = {
            "recall": len(found) / len(outcome.detect_delays) if outcome.detect_delays else None,
            "median_time_to_detect_seconds": _quantile(found, 0.5),
            "p95_time_to_detect_seconds": _quantile(found, 0.95),
        }
    return summary


def pool(outcomes: Iterable[Outcome]) -> Outcome:
    total = Outcome()
    for o in outcomes:
        total = total.add(o)
    return total


# ---------------------------------------------------------------- calibration of probabilities

RELIABILITY_BINS = 10
CALIBRATION_STEP_SECONDS = 60.0  # one forecast per minute is scored (polls within a minute are not independent)


@dataclass
class Reliability:
    """Brier score and reliability bins of one probabilistic forecast at one horizon (poolable).

    Outcome ``y`` at time ``t``: an event is in progress at some time in ``(t, t + h]``. Scored only at
    times after warm-up, outside events and the ``QUIET_SECONDS`` after each (see score_probabilities),
    with ``t + h`` inside the run.
    """

    n: int = 0
    squared_error: float = 0.0
    outcomes: float = 0.0
    bin_n: list[int] = field(default_factory=lambda: [0] * RELIABILITY_BINS)
    bin_p: list[float] = field(default_factory=lambda: [0.0] * RELIABILITY_BINS)
    bin_y: list[float] = field(default_factory=lambda: [0.0] * RELIABILITY_BINS)

    def add_pair(self, p: float, y: bool) -> None:
        p = min(1.0, max(0.0, p))
        self.n += 1
        self.squared_error += (p - y) ** 2
        self.outcomes += y
        i = min(RELIABILITY_BINS - 1, int(p * RELIABILITY_BINS))
        self.bin_n[i] += 1
        self.bin_p[i] += p
        self.bin_y[i] += y

    def add(self, other: Reliability) -> Reliability:
        return Reliability(
            self.n + other.n, self.squared_error + other.squared_error, self.outcomes + other.outcomes,
            [a + b for a, b in zip(self.bin_n, other.bin_n, strict=True)],
            [a + b for a, b in zip(self.bin_p, other.bin_p, strict=True)],
            [a + b for a, b in zip(self.bin_y, other.bin_y, strict=True)],
        )

    @property
    def brier(self) -> float | None:
        return self.squared_error / self.n if self.n else None

    @property
    def climatology_brier(self) -> float | None:
        """Brier of the constant base rate of these same outcomes (in-sample: the best constant)."""
        if not self.n:
            return None
        rate = self.outcomes / self.n
        return rate * (1.0 - rate)

    def table(self) -> list[dict]:
        """Predicted-probability bins: count, mean predicted, observed frequency."""
        return [
            {"bin": f"{i / RELIABILITY_BINS:.1f}-{(i + 1) / RELIABILITY_BINS:.1f}", "n": n,
             "mean_predicted": self.bin_p[i] / n, "observed": self.bin_y[i] / n}
            for i, n in enumerate(self.bin_n) if n
        ]


def outcome_within(t: float, horizon: float, events: Sequence[Event]) -> bool:
    """An event is in progress at some time in ``(t, t + horizon]``."""
    return any(e.onset <= t + horizon and e.end > t for e in events)


def score_probabilities(
    times: Sequence[float],
    probabilities: Sequence[float | None],
    horizon: float,
    events: Sequence[Event],
    *,
    end: float,
    warmup: Sequence[tuple[float, float]] = (),
    step: float = CALIBRATION_STEP_SECONDS,
    quiet_after: float = QUIET_SECONDS,
) -> Reliability:
    """Reliability of one method's ``probabilities`` (per poll; None = no forecast, counted as 0).

    The ``quiet_after`` seconds after an event are not scored (v4 rule, every method): saturation resuming
    there continues the event, so a minute in that gap is scored only if no saturation follows within it,
    and its outcome is then 0 by construction — a forecast that (rightly) expects the saturation to resume
    was penalized for it. ``quiet_after=0`` is the rule before v4.
    """
    out = Reliability()
    next_t = 0.0
    for t, p in zip(times, probabilities, strict=True):
        if t < next_t:
            continue
        next_t = t + step - 1e-6
        if (t + horizon > end or in_windows(t, warmup)
                or any(e.onset <= t <= e.end + quiet_after for e in events)):
            continue
        out.add_pair(p if p is not None else 0.0, outcome_within(t, horizon, events))
    return out


def summarize_reliability(by_method: dict[str, Reliability]) -> dict:
    """``{method: {brier, n, table}}`` plus the constant-rate climatology on the same outcomes."""
    out: dict = {}
    any_rel = None
    for method, rel in by_method.items():
        out[method] = {"brier": rel.brier, "n": rel.n, "reliability": rel.table()}
        any_rel = rel
    if any_rel is not None:
        base = any_rel.outcomes / any_rel.n if any_rel.n else None
        out["climatology"] = {"brier": any_rel.climatology_brier, "n": any_rel.n, "base_rate": base}
    return out
