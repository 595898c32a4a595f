"""The one rule for reading Prometheus counters between two polls (pure).

Like PromQL's ``rate()``: a counter that goes down was reset (vLLM restarted), and its new value is the
increase since the reset. :mod:`kvwatch.history` (rates over a window) and the forecaster's per-minute
buckets both take deltas through :func:`counter_delta`; a histogram's cumulative buckets through
:func:`histogram_delta`, the same rule applied to the histogram as one counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import sub

# A float counter summed over several processes (vLLM's multiprocess mode sums one file per API server) can read
# a rounding lower from one poll to the next, summed in another order: 199999.99999999997 after 200000.0 reset
# the forecaster and cleared its warnings. A decrease within this share of the value is rounding.
ROUNDING = 1e-9


def counter_reset(previous: float, current: float) -> bool:
    """A counter that went down was reset to zero (PromQL ``rate()``), unless by no more than float rounding."""
    return current < previous - ROUNDING * max(1.0, abs(previous))


def sum_count_reset(previous_sum: float, previous_count: float, current_sum: float, current_count: float) -> bool:
    """A histogram's ``_sum`` and ``_count`` are one counter: reset when either went down."""
    return counter_reset(previous_sum, current_sum) or counter_reset(previous_count, current_count)


def counter_delta(previous: float | None, current: float | None) -> float | None:
    """Increase of a counter between two reads, like ``rate()``: a decrease is a reset to zero (a rounding one,
    no increase)."""
    if previous is None or current is None:
        return None
    return current if counter_reset(previous, current) else max(0.0, current - previous)


def histogram_delta(previous: Sequence[float] | None, current: Sequence[float] | None) -> tuple[float, ...] | None:
    """Per-bucket increase of a cumulative histogram (counts at each ``le``, the last ``+Inf``) between two reads.

    The buckets are reset together, so the histogram is one counter: reset (:func:`counter_reset`) when any bucket
    (the ``+Inf`` one is the total) went down, and then every bucket's increase is its current value;
    deciding per bucket would mix counts from before and after a restart. None when either read is missing or
    the bounds differ (a different number of buckets). Runs every poll: the subtraction is one ``map``."""
    if previous is None or current is None or len(previous) != len(current) or not current:
        return None
    increase = tuple(map(sub, current, previous))
    if min(increase) >= 0.0:
        return increase
    if any(map(counter_reset, previous, current)):
        return tuple(current)
    return tuple(max(0.0, d) for d in increase)  # rounding
