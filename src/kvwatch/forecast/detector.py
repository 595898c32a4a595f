"""The state machine: reactive detectors over 5-/10-s samples and the latched early warning.

Reactive states (bottleneck, scheduler_limited, stalled) are judged on the raw samples of the last few
minutes, with fire/clear hysteresis so one sample cannot flap them. The early warning (``filling``) is
judged once per minute from the saturation risk and needs ``warn_for`` consecutive minutes at or above
``risk_on`` to fire and ``clear_for`` consecutive minutes below ``risk_off`` to clear.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

OK = "ok"
WARMING_UP = "warming_up"
FILLING = "filling"
BOTTLENECK = "bottleneck"
SCHEDULER_LIMITED = "scheduler_limited"
STALLED = "stalled"
UNKNOWN = "unknown"
STATES: tuple[str, ...] = (OK, WARMING_UP, FILLING, BOTTLENECK, SCHEDULER_LIMITED, STALLED, UNKNOWN)


@dataclass(frozen=True)
class SampleFlags:
    timestamp: float
    usage: float
    waiting: float
    saturated: bool  # u ≥ u_sat, or u ≥ u_busy with requests waiting, or a preemption since the last sample
    queued_below_kv_limit: bool  # requests waiting although usage < u_busy
    progressed: bool | None  # a request finished or a token was generated; None when counters are absent


@dataclass(frozen=True)
class DetectorParams:
    fire_window_seconds: float = 120.0
    fire_fraction: float = 0.8
    clear_window_seconds: float = 300.0
    clear_fraction: float = 0.2
    stall_seconds: float = 180.0
    u_sat: float = 0.95


class ReactiveDetectors:
    """Bottleneck, scheduler-limited and stalled, each from a sliding window of sample flags."""

    def __init__(self, params: DetectorParams) -> None:
        self.params = params
        self._flags: deque[SampleFlags] = deque()
        self.bottleneck = False
        self.scheduler_limited = False
        self.stalled = False
        self.saturated_fraction = 0.0

    def clear(self) -> None:
        self._flags.clear()
        self.bottleneck = self.scheduler_limited = self.stalled = False
        self.saturated_fraction = 0.0

    def _window(self, now: float, seconds: float) -> list[SampleFlags]:
        return [f for f in self._flags if f.timestamp > now - seconds]

    def _covers(self, window: list[SampleFlags], now: float, seconds: float) -> bool:
        # A window is judged only once samples span most of it (no verdict from one sample).
        return len(window) >= 3 and now - window[0].timestamp >= 0.75 * seconds

    def update(self, flags: SampleFlags) -> None:
        p = self.params
        now = flags.timestamp
        self._flags.append(flags)
        horizon = max(p.clear_window_seconds, p.fire_window_seconds, p.stall_seconds) + 1.0
        while self._flags and self._flags[0].timestamp <= now - horizon:
            self._flags.popleft()

        fire = self._window(now, p.fire_window_seconds)
        if fire:
            self.saturated_fraction = sum(f.saturated for f in fire) / len(fire)
        self.bottleneck = self._hysteresis(self.bottleneck, now, lambda f: f.saturated)
        self.scheduler_limited = self._hysteresis(self.scheduler_limited, now, lambda f: f.queued_below_kv_limit)

        stall = self._window(now, p.stall_seconds)
        self.stalled = (
            self._covers(stall, now, p.stall_seconds)
            and all(f.waiting >= 1 for f in stall)
            and all(f.progressed is False for f in stall[1:])
            and flags.usage < p.u_sat
        )

    def _hysteresis(self, active: bool, now: float, predicate) -> bool:
        p = self.params
        if not active:
            window = self._window(now, p.fire_window_seconds)
            return self._covers(window, now, p.fire_window_seconds) and (
                sum(map(predicate, window)) >= p.fire_fraction * len(window)
            )
        window = self._window(now, p.clear_window_seconds)
        return sum(map(predicate, window)) > p.clear_fraction * len(window)


@dataclass(frozen=True)
class WarningParams:
    """Hysteresis of ``filling`` on the saturation risk at ``horizon_seconds``."""

    horizon_seconds: float = 1800.0
    risk_on: float = 0.7
    risk_off: float = 0.2
    warn_for_buckets: int = 2
    clear_for_buckets: int = 10


class WarningLatch:
    """``filling`` fires after ``warn_for`` raw minutes in a row, clears after ``clear_for`` calm minutes."""

    def __init__(self, params: WarningParams) -> None:
        self.params = params
        self.active = False
        self._raw_run = 0
        self._calm_run = 0

    def clear(self) -> None:
        self.active = False
        self._raw_run = self._calm_run = 0

    def update(self, raw: bool, calm: bool) -> bool:
        """``raw``: the risk is at or above ``risk_on``; ``calm``: below ``risk_off`` (or unknown)."""
        p = self.params
        self._raw_run = self._raw_run + 1 if raw else 0
        if not self.active:
            if self._raw_run >= p.warn_for_buckets:
                self.active = True
                self._calm_run = 0
            return self.active
        self._calm_run = self._calm_run + 1 if calm and not raw else 0
        if self._calm_run >= p.clear_for_buckets:
            self.active = False
            self._raw_run = 0
        return self.active
