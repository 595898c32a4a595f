"""Request latency from an engine's histograms (pure): TTFT, inter-token latency, queue time, end to end.

Engines export latency as cumulative Prometheus histograms. A quantile over a window is read the way
Prometheus' ``histogram_quantile(q, increase(x_bucket[w]))`` reads it: bucket increases between the
oldest and newest poll in the window, then linear interpolation inside the bucket holding rank ``q``
(an answer in the ``+Inf`` bucket is the largest finite bound, a lower bound). A window with no finished
request, a counter reset or bounds that changed (a restart with other buckets) has no answer: None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kvwatch.model import Histogram

KINDS = ("ttft", "itl", "queue", "e2e")
"""``ttft`` time to first token, ``itl`` inter-token latency (TensorRT-LLM: time per output token, a
per-request mean), ``queue`` time waiting for the scheduler, ``e2e`` end-to-end request latency."""
QUANTILES = (0.5, 0.9, 0.99)
EDGE_SECONDS = 60.0
"""How often (poll-clock seconds) ``kvwatch serve`` reads the latency histograms' buckets: a 5-minute window
quantile needs a fresh edge about once a minute, not every poll (the buckets are ~4/5 of the samples a
poll would read; docs/performance.md). The polls in between skip them (``read_payload(latency=False)``)."""


def delta(old: Histogram | None, new: Histogram) -> Histogram | None:
    """``new - old`` bucket by bucket (``old`` None: since the engine started); None across a reset."""
    if old is None:
        return new
    if old.bounds != new.bounds or new.count < old.count or any(
            n < o for n, o in zip(new.cumulative, old.cumulative, strict=True)):
        return None
    return Histogram(new.bounds, tuple(n - o for n, o in zip(new.cumulative, old.cumulative, strict=True)),
                     new.count - old.count, new.sum - old.sum)


def quantile(q: float, hist: Histogram) -> float | None:
    """Prometheus' ``histogram_quantile`` on one histogram (promql/quantile.go ``bucketQuantile``); None where it
    gives NaN: no observation, fewer than two buckets, no ``+Inf`` bucket, or ``q`` NaN (below 0 it gives -Inf,
    above 1 +Inf). As there, the buckets are sorted, those sharing a bound added up and the counts made monotonic
    (a re-exporter's histogram can break all three; a lone ``+Inf`` bucket read as 0 s, "perfect latency")."""
    if math.isnan(q):
        return None
    if q < 0 or q > 1:
        return -math.inf if q < 0 else math.inf
    merged: dict[float, float] = {}
    for bound, count in zip(hist.bounds, hist.cumulative, strict=True):
        merged[bound] = merged.get(bound, 0.0) + count
    bounds = sorted(merged)
    if not bounds or bounds[-1] != math.inf:
        return None
    counts, highest = [], -math.inf
    for bound in bounds:
        highest = max(highest, merged[bound])
        counts.append(highest)
    if len(bounds) < 2 or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    b = next((i for i in range(len(bounds) - 1) if counts[i] >= rank), len(bounds) - 1)
    if b == len(bounds) - 1:
        return bounds[-2]  # the +Inf bucket: the largest finite bound is all that is known
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start, count, rank = bounds[b - 1], count - counts[b - 1], rank - counts[b - 1]
    return start + (end - start) * (rank / count) if count > 0 else None


def window_means(old: Mapping[str, Histogram], new: Mapping[str, Histogram]) -> dict[str, float]:
    """``{kind: seconds}``: the mean over the window between two readings' histograms (``_sum``/``_count``
    deltas), where a request was observed."""
    out: dict[str, float] = {}
    for kind, hist in new.items():
        window = delta(old.get(kind), hist)
        if window is not None and window.count > 0 and math.isfinite(window.sum) and window.sum >= 0:
            out[kind] = window.sum / window.count
    return out


def window_quantiles(old: Mapping[str, Histogram], new: Mapping[str, Histogram],
                     quantiles: Sequence[float] = QUANTILES) -> dict[tuple[str, float], float]:
    """``{(kind, q): seconds}`` over the window between two readings' histograms (only answerable ones)."""
    out: dict[tuple[str, float], float] = {}
    for kind, hist in new.items():
        window = delta(old.get(kind), hist)
        if window is None:
            continue
        for q in quantiles:
            value = quantile(q, window)
            if value is not None:
                out[(kind, q)] = value
    return out
