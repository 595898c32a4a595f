"""The state machine: reactive detectors over 5-/10-s samples and the latched early warning.

Reactive states (bottleneck, scheduler_limited, stalled) are judged on the raw samples of the last few
minutes, with fire/clear hysteresis so one sample cannot flap them. The early warning (``filling``) is
judged once per minute from the saturation risk and needs ``warn_for_buckets`` consecutive minutes at or above
``risk_on`` to fire and ``clear_for_buckets`` consecutive minutes below ``risk_off`` to clear. It is about the *next*
saturation (v5): a minute with sustained saturation (the ``bottleneck`` state) disarms it, so once that
saturation is over it warns again only after a fresh run of ``rearm_for_buckets`` minutes at or above ``risk_on``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvwatch.forecast.thresholds import SATURATION_USAGE

if TYPE_CHECKING:  # a reading's fields are read; the detector needs no import of it to run
    from kvwatch.model import Reading

OK = "ok"
WARMING_UP = "warming_up"
FILLING = "filling"
BOTTLENECK = "bottleneck"
SCHEDULER_LIMITED = "scheduler_limited"
STALLED = "stalled"
UNKNOWN = "unknown"
STATES: tuple[str, ...] = (OK, WARMING_UP, FILLING, BOTTLENECK, SCHEDULER_LIMITED, STALLED, UNKNOWN)


@dataclass(frozen=True, slots=True)
class SampleFlags:
    timestamp: float
    usage: float
    waiting: float
    # u ≥ u_sat, or requests waiting for KV (u ≥ u_busy, or no room for one more request), or a preemption since
    # the last sample
    saturated: bool
    queued_below_kv_limit: bool  # requests waiting although the KV cache has room for them
    progressed: bool | None  # a request finished, a token was processed or the KV gauge moved; None: no counters
    running: float = 0.0
    # Requests running count toward a stall even with nothing waiting (ForecastSample.tokens_counted_every_step).
    stalls_without_queue: bool = False


def no_room_for_next_request(usage: float, capacity_tokens: float | None, prompt_tokens: float | None,
                             cached_share: float | None = None) -> bool:
    """Fewer free KV tokens than a typical request's prompt needs (the mean prompt, less the share the prefix cache
    serves): a request waiting then waits for KV even below ``u_busy``. With long contexts a handful of requests
    fill the cache, and the next one does not fit at 0.85 where the engine admits a request only when its whole
    prompt fits (vLLM with chunked prefill off) or reserves more (SGLang). False when a figure is unknown."""
    if not (capacity_tokens and prompt_tokens and prompt_tokens > 0 and math.isfinite(prompt_tokens)):
        return False
    cached = cached_share if cached_share is not None and math.isfinite(cached_share) else 0.0
    return (1.0 - usage) * capacity_tokens < prompt_tokens * (1.0 - min(1.0, max(0.0, cached)))


def no_room_in(reading: Reading, usage: float) -> bool:
    """:func:`no_room_for_next_request` for one reading at ``usage``: its capacity, the mean prompt and the prefix
    cache's share since the engine started (check's one poll, serve's TTFT cause; the forecaster takes the last
    30 minutes' mean)."""
    return no_room_for_next_request(usage, reading.kv_capacity_tokens, reading.mean_prompt_tokens,
                                    reading.prefix_cached_share)


@dataclass(frozen=True)
class DetectorParams:
    fire_window_seconds: float = 120.0
    fire_fraction: float = 0.8
    clear_window_seconds: float = 300.0
    clear_fraction: float = 0.2
    stall_seconds: float = 180.0
    u_sat: float = SATURATION_USAGE


class _Window:
    """The flags of the last ``seconds`` (timestamp > now - seconds), with running counts: O(1) per sample.

    Recounting a time window on every sample costs as many steps as the window holds samples, which at a
    fast poll interval is thousands (CPU per poll grew with the samples kept, docs/reliability.md).

    At a slow poll interval the window keeps the older samples it needs to be judged at all (three, spanning
    most of it): at 60-s polls a 2-minute window held two and bottleneck never fired. Never older than
    ``STRETCH`` windows: polls further apart than that cannot see a saturation of the window's length."""

    STRETCH = 4.0

    # Slots: three windows per series, up to --max-series of them (memory under a label explosion, docs/reliability.md).
    __slots__ = ("flags", "idle", "progress", "queued", "saturated", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.flags: deque[SampleFlags] = deque()
        self.saturated = 0
        self.queued = 0
        self.idle = 0  # samples with nothing that can stall: none waiting (nor running, where that counts)
        self.progress = 0  # samples whose progress is not known False (True or unknown)

    def _count(self, f: SampleFlags, sign: int) -> None:
        self.saturated += sign * f.saturated
        self.queued += sign * f.queued_below_kv_limit
        # Where counters move only when a request finishes (older SGLang, TensorRT-LLM) a stall needs a queue: a few
        # long requests with none waiting look frozen for minutes. vLLM counts tokens every step (SGLang's realtime
        # counter every iteration or log interval), so there requests running with no token counted and the KV
        # gauge still (a hung engine core freezes both) are a stall too.
        self.idle += sign * (f.waiting < 1 and not (f.stalls_without_queue and f.running >= 1))
        self.progress += sign * (f.progressed is not False)

    def add(self, f: SampleFlags) -> None:
        flags = self.flags
        if flags and f.timestamp - flags[-1].timestamp > self.seconds:
            self.clear()  # a gap longer than the window: the polls before it say nothing about this stretch
        flags.append(f)
        self._count(f, 1)
        now = f.timestamp
        while flags[0].timestamp <= now - self.seconds and (
                flags[0].timestamp <= now - self.STRETCH * self.seconds
                or (len(flags) > 3 and now - flags[1].timestamp >= 0.75 * self.seconds)):
            self._count(flags.popleft(), -1)

    def clear(self) -> None:
        self.flags.clear()
        self.saturated = self.queued = self.idle = self.progress = 0

    def covers(self, now: float) -> bool:
        # A window is judged only once samples span most of it (no verdict from one sample).
        return len(self.flags) >= 3 and now - self.flags[0].timestamp >= 0.75 * self.seconds


class ReactiveDetectors:
    """Bottleneck, scheduler-limited and stalled, each from a sliding window of sample flags."""

    __slots__ = ("_clear", "_fire", "_stall", "bottleneck", "params", "saturated_fraction", "scheduler_limited",
                 "stalled", "sustained")

    def __init__(self, params: DetectorParams) -> None:
        self.params = params
        self._fire = _Window(params.fire_window_seconds)
        self._clear = _Window(params.clear_window_seconds)
        self._stall = _Window(params.stall_seconds)
        self.bottleneck = False
        self.scheduler_limited = False
        self.stalled = False
        self.saturated_fraction = 0.0
        # This poll's fire window is saturated enough to turn ``bottleneck`` on (sustained saturation, the
        # scorer's rule), whatever the state's hysteresis says: the state stays on minutes after it ends.
        self.sustained = False

    def clear(self) -> None:
        for window in (self._fire, self._clear, self._stall):
            window.clear()
        self.bottleneck = self.scheduler_limited = self.stalled = self.sustained = False
        self.saturated_fraction = 0.0

    def update(self, flags: SampleFlags) -> None:
        p = self.params
        now = flags.timestamp
        for window in (self._fire, self._clear, self._stall):
            window.add(flags)
        fire = self._fire
        self.saturated_fraction = fire.saturated / len(fire.flags)
        self.sustained = self._fires(now, "saturated")
        self.bottleneck = self._hysteresis(self.bottleneck, now, "saturated")
        # A queue with KV room is a scheduler limit only while the cache is not the limit as often: with saturated
        # polls (a full cache, a queue waiting for KV, a preemption) as many as those with a queue and room over the
        # last 5 minutes, more sequences would only preempt, and a heavy-tailed prompt at the queue's head needs
        # more room than the mean one. It gives way there and fires again only below half as many (hysteresis).
        clear = self._clear
        kv_share = 1.0 if self.scheduler_limited else 0.5
        self.scheduler_limited = (self._hysteresis(self.scheduler_limited, now, "queued")
                                  and clear.saturated < kv_share * clear.queued)

        stall = self._stall
        first_progress = stall.flags[0].progressed is not False
        self.stalled = (
            stall.covers(now)
            and stall.idle == 0
            and stall.progress - first_progress == 0  # no progress after the window's first sample
            # A full cache of long requests finishes none for minutes where only finished requests are counted
            # (SGLang, TensorRT-LLM); vLLM counts tokens every step, so there no token for 3 minutes is a hang
            # however full the cache reads (a hung engine core freezes its gauges, at 0.97 as at 0.5).
            and (flags.usage < p.u_sat or flags.stalls_without_queue)
        )

    def _fires(self, now: float, count: str) -> bool:
        """The fire window, covered, holds enough polls with the ``count`` flag to turn its state on."""
        fire = self._fire
        return fire.covers(now) and getattr(fire, count) >= self.params.fire_fraction * len(fire.flags)

    def _hysteresis(self, active: bool, now: float, count: str) -> bool:
        if not active:
            return self._fires(now, count)
        clear = self._clear
        return getattr(clear, count) > self.params.clear_fraction * len(clear.flags)


@dataclass(frozen=True)
class WarningParams:
    """Hysteresis of ``filling`` on the saturation risk at ``horizon_seconds``."""

    horizon_seconds: float = 1800.0
    risk_on: float = 0.7
    risk_off: float = 0.2
    # v6: 3 (v5: 2). The first warning needs the 30-minute risk at or above ``risk_on`` for 3 minutes in a row;
    # with the shrunk level (RiskParams.level_shrink) it no longer fires on a risk that touches 0.7 for two
    # minutes on a steady load (docs/forecasting-history.md, v6 sweep). The re-arm after a saturation is unchanged.
    warn_for_buckets: int = 3
    clear_for_buckets: int = 10
    # v5: a minute in sustained saturation (the forecast came true, ``bottleneck`` speaks for it) ends the
    # warning; afterwards it fires again only after this many fresh minutes at or above ``risk_on``. False: v4's
    # latch, which stayed on through repeated saturations until ``clear_for_buckets`` calm minutes.
    rearm: bool = True
    rearm_for_buckets: int = 2
    # True (v5): the warning follows the exported risk, recurrence included (the series' own recent
    # saturations say another is coming), which the re-arm makes usable: v4 (False, the excursion risk alone)
    # could not, because with the recurrence its latch stayed on from one saturation to the next.
    with_recurrence: bool = True


class WarningLatch:
    """``filling`` fires after ``warn_for_buckets`` raw minutes in a row, clears after ``clear_for_buckets`` calm
    minutes.

    With ``rearm``, a saturated minute clears it and the next warning needs ``rearm_for_buckets`` raw minutes counted
    from after the saturation: one warning episode per forecast saturation, not one for a whole overloaded
    afternoon (docs/forecasting.md, "Decision rules")."""

    def __init__(self, params: WarningParams) -> None:
        self.params = params
        self.active = False
        self._raw_run = 0
        self._calm_run = 0
        self._after_saturation = False  # disarmed by a saturation and not fired since

    def clear(self) -> None:
        self.active = False
        self._raw_run = self._calm_run = 0
        self._after_saturation = False

    def update(self, raw: bool, calm: bool, saturated: bool = False, hold: bool = False) -> bool:
        """``raw``: the risk is at or above ``risk_on``; ``calm``: below ``risk_off``, or nothing to forecast from
        (not while re-warming: that is neither);
        ``saturated``: the series was in sustained saturation during this minute; ``hold``: while no warning
        stands, the minute neither adds to nor resets the run towards one (a level read from a fall's first minutes,
        RiskEstimate.level_from_fall: a one-minute drain on a ramp reset the run and the warning came too late); a
        standing warning counts it as any other minute (held, a fall for good cleared it 3 minutes later)."""
        p = self.params
        if saturated and p.rearm:
            self.active = False
            self._raw_run = self._calm_run = 0
            self._after_saturation = True
            return False
        if hold and not self.active:
            return False
        self._raw_run = self._raw_run + 1 if raw else 0
        if not self.active:
            needed = p.rearm_for_buckets if self._after_saturation else p.warn_for_buckets
            if self._raw_run >= needed:
                self.active = True
                self._after_saturation = False
                self._calm_run = 0
            return self.active
        self._calm_run = self._calm_run + 1 if calm and not raw else 0
        if self._calm_run >= p.clear_for_buckets:
            self.active = False
            self._raw_run = 0
        return self.active
