"""What values a vLLM payload can possibly hold; anything else is dropped to unknown before it is used.

A broken or hostile target can serve ``-1``, ``1e308``, ``NaN`` or ``±Inf`` for any gauge or counter. None of
these can be true of vLLM (usage is a share of the KV cache; queues, counters and capacities are counts), and
passed on they become ``kv_used_tokens -163840`` or a forecast from infinity while ``kvwatch_up`` says 1.
The rule is per value, never per poll: an impossible value becomes ``None`` (unknown: not exported, not
forecast from, and not stored in history), the rest of the poll is used, and each dropped value is listed
in :attr:`kvwatch.model.Poll.implausible` (``kvwatch_implausible_values_total{field}``, docs/metrics.md).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import fields, replace
from types import MappingProxyType
from typing import Any

from kvwatch.model import Poll, Reading

USAGE_TOLERANCE = 0.01
"""A usage a hair outside 0..1 is rounding (vLLM computes ``1 - free/total``); it is clamped, not dropped."""

MAX_COUNT = float(2**53)
"""Above this a float no longer holds every integer: no real count of requests, tokens or blocks gets here."""

_COUNTS = ("requests_running", "requests_waiting", "requests_swapped", "preemptions_total", "prompt_tokens_total",
           "generation_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total",
           "request_prompt_tokens_sum", "request_prompt_tokens_count", "request_generation_tokens_sum",
           "request_generation_tokens_count", "requests_aborted_total")
_POSITIVE = ("kv_capacity_tokens", "kv_max_concurrency", "num_gpu_blocks", "block_size", "max_model_len")
_BY_LABEL = ("waiting_by_reason", "finished_by_reason")
_WHOLE = ("block_size", "max_model_len")  # of _POSITIVE, whole numbers (blocks per engine may not be: a DP total ÷ n)
# Of _COUNTS, whole numbers: a histogram's count of requests (1e-320 made the mean request infinitely long, and the
# concurrency ceiling an internal error). Running and waiting may not be (Triton's waiting fraction).
_WHOLE_COUNTS = ("request_prompt_tokens_count", "request_generation_tokens_count")

assert set(_COUNTS + _POSITIVE + _BY_LABEL) <= {f.name for f in fields(Reading)} and set(_WHOLE) <= set(_POSITIVE)
assert set(_WHOLE_COUNTS) <= set(_COUNTS)

CHECKED_FIELDS = ("kv_usage_ratio", *_COUNTS, *_POSITIVE, *_BY_LABEL, "gpu_memory_utilization",
                  "process_start_time_seconds")
"""Every field :func:`check_reading` can drop (``kvwatch_implausible_values_total`` exports each from 0)."""


def is_count(value: float) -> bool:
    """A number a count of requests, tokens or blocks (or a counter of them) can be."""
    return math.isfinite(value) and 0.0 <= value <= MAX_COUNT


def usage_or_none(usage: float) -> float | None:
    """A KV usage share clamped to 0..1 when it is a hair outside (rounding); None when no usage can be it."""
    if not (math.isfinite(usage) and -USAGE_TOLERANCE <= usage <= 1.0 + USAGE_TOLERANCE):
        return None
    return min(1.0, max(0.0, usage)) + 0.0  # (+ 0.0: -0.0 printed "-0.0%")


def check_reading(reading: Reading) -> tuple[Reading, tuple[tuple[str, float], ...]]:
    """``reading`` with every impossible value set to unknown, and (field, value) of each value dropped."""
    changes: dict[str, Any] = {}
    dropped: list[tuple[str, float]] = []
    usage = reading.kv_usage_ratio
    if usage is not None:
        checked = usage_or_none(usage)
        if checked is None:
            changes["kv_usage_ratio"] = None
            dropped.append(("kv_usage_ratio", usage))
        elif checked != usage or math.copysign(1.0, usage) < 0:
            changes["kv_usage_ratio"] = checked
    for name in _COUNTS:
        value = getattr(reading, name)
        if value is not None and not (is_count(value) and (name not in _WHOLE_COUNTS or value.is_integer())):
            changes[name] = None
            dropped.append((name, value))
    hits = changes.get("prefix_cache_hits_total", reading.prefix_cache_hits_total)
    queries = changes.get("prefix_cache_queries_total", reading.prefix_cache_queries_total)
    if hits is not None and queries is not None and hits > queries:  # a hit is a query answered from the cache
        changes["prefix_cache_hits_total"] = None
        dropped.append(("prefix_cache_hits_total", hits))
    for name in _POSITIVE:
        value = getattr(reading, name)
        whole = name not in _WHOLE or value is None or not math.isfinite(value) or value.is_integer()
        if value is not None and not (is_count(value) and value > 0 and whole):
            changes[name] = None
            dropped.append((name, value))
    for name in _BY_LABEL:
        values = getattr(reading, name)
        bad = [k for k, v in values.items() if not is_count(v)]
        if bad:
            changes[name] = MappingProxyType({k: v for k, v in values.items() if k not in bad})
            dropped.append((name, values[bad[0]]))
    utilization = reading.gpu_memory_utilization
    if utilization is not None and not (math.isfinite(utilization) and 0.0 < utilization <= 1.0):
        changes["gpu_memory_utilization"] = None
        dropped.append(("gpu_memory_utilization", utilization))
    start = reading.process_start_time_seconds
    if start is not None and not (math.isfinite(start) and start >= 0.0):
        changes["process_start_time_seconds"] = None
        dropped.append(("process_start_time_seconds", start))
    return (replace(reading, **changes) if changes else reading), tuple(dropped)


def check_poll(poll: Poll) -> Poll:
    """``poll`` with :func:`check_reading` applied to each reading; ``implausible`` lists what was dropped."""
    readings = []
    implausible = []
    for reading in poll.readings:
        checked, dropped = check_reading(reading)
        readings.append(checked)
        implausible.extend((reading.key, name, value) for name, value in dropped)
    if not implausible and all(a is b for a, b in zip(readings, poll.readings, strict=True)):
        return poll
    return replace(poll, readings=tuple(readings), implausible=tuple(implausible))
