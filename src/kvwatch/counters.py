"""The one rule for reading Prometheus counters between two polls (pure).

Like PromQL's ``rate()``: a counter that goes down was reset (vLLM restarted), and its new value is the
increase since the reset. :mod:`kvwatch.history` (rates over a window) and the forecaster's per-minute
buckets both take deltas through :func:`counter_delta`.
"""

from __future__ import annotations


def counter_delta(previous: float | None, current: float | None) -> float | None:
    """Increase of a counter between two reads, like ``rate()``: a decrease is a reset to zero."""
    if previous is None or current is None:
        return None
    return current if current < previous else current - previous
