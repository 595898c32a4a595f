"""GPU framebuffer memory from NVIDIA dcgm-exporter (pure): which GPUs are the engine's, and how much of their
memory is neither the KV cache nor the weights.

dcgm-exporter runs once per node and lists every GPU there, so the engine's GPUs are picked by its
Kubernetes pod mapping (the ``pod`` and ``namespace`` labels it adds) or by GPU UUID; with neither, kvwatch
cannot tell which GPUs are the engine's and reports nothing (unknown, never a node total). Fields:
``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (MiB; ``DCGM_FI_DEV_FB_RESERVED`` counts toward the total
when present) and ``DCGM_FI_DEV_XID_ERRORS`` (the last Xid code, 0 for none). MIG instances (``GPU_I_ID``)
are separate rows of one UUID.

Non-KV memory is ``used − KV pool − weights`` per GPU: what activations, CUDA graphs, the allocator's cache
and leaks hold. The KV pool and the weights are preallocated and fixed for the engine's life, so growth of
non-KV memory toward the card's limit is the real CUDA out-of-memory risk (a full KV cache only queues).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvwatch.exposition import Exposition

MIB = 1024.0 ** 2
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
XID = "DCGM_FI_DEV_XID_ERRORS"
FAMILIES = frozenset({FB_USED, FB_FREE, FB_RESERVED, XID})


@dataclass(frozen=True)
class GpuMatch:
    """Which GPUs are the engine's: by pod (and namespace) as dcgm-exporter's pod mapping labels them, or
    by UUID. Empty: none can be told apart."""

    pod: str | None = None
    namespace: str | None = None
    uuids: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.pod or self.uuids)

    def matches(self, labels: dict[str, str]) -> bool:
        if self.uuids:
            return labels.get("UUID") in self.uuids
        if self.pod:
            return labels.get("pod") == self.pod and (self.namespace is None or labels.get("namespace") ==
                                                      self.namespace)
        return False


@dataclass(frozen=True)
class GpuMemory:
    uuid: str
    instance: str  # MIG GPU instance id, "" for a whole GPU
    used_bytes: float | None
    free_bytes: float | None
    reserved_bytes: float | None
    xid_last: float | None

    @property
    def total_bytes(self) -> float | None:
        if self.used_bytes is None or self.free_bytes is None:
            return None
        return self.used_bytes + self.free_bytes + (self.reserved_bytes or 0.0)

    @property
    def free_ratio(self) -> float | None:
        total = self.total_bytes
        return self.free_bytes / total if total and self.free_bytes is not None else None


def read_dcgm(exposition: Exposition, match: GpuMatch) -> list[GpuMemory]:
    """The matched GPUs' memory, sorted by UUID; [] when ``match`` is empty or matches nothing."""
    if not match:
        return []
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for family in (FB_USED, FB_FREE, FB_RESERVED, XID):
        for s in exposition.samples(family):
            if not match.matches(s.labels) or "UUID" not in s.labels or math.isnan(s.value):
                continue
            rows.setdefault((s.labels["UUID"], s.labels.get("GPU_I_ID", "")), {})[family] = s.value

    def mib(row: dict[str, float], family: str) -> float | None:
        return row[family] * MIB if family in row else None

    return [GpuMemory(uuid, instance, mib(row, FB_USED), mib(row, FB_FREE), mib(row, FB_RESERVED), row.get(XID))
            for (uuid, instance), row in sorted(rows.items())]


def non_kv_bytes(used_bytes: float | None, kv_pool_bytes: float | None, weights_bytes: float | None) -> float | None:
    """``used − KV pool − weights`` on one GPU; None when any is unknown."""
    if used_bytes is None or kv_pool_bytes is None or weights_bytes is None:
        return None
    return used_bytes - kv_pool_bytes - weights_bytes


# The trend of non-KV memory. The KV pool and the weights are allocated once at startup, so between restarts
# non-KV memory grows exactly as framebuffer used does: its slope is the slope of ``used``, which is known even
# when the model (hence the weights) is not. A least-squares line over the last 10 minutes of polls, with at
# least 2 minutes between the first and last point, rides out the caching allocator's steps.
TREND_WINDOW_SECONDS = 600.0
TREND_MIN_SPAN_SECONDS = 120.0
TREND_MIN_POINTS = 3


def growth_rate(points: Sequence[tuple[float, float]], min_span: float = TREND_MIN_SPAN_SECONDS) -> float | None:
    """Least-squares slope of ``(t, bytes)`` points in bytes per second; None with too few or too short."""
    if len(points) < TREND_MIN_POINTS or points[-1][0] - points[0][0] < min_span:
        return None
    n = float(len(points))
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var <= 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var


def seconds_to_limit(free_bytes: float | None, growth_bytes_per_second: float | None) -> float | None:
    """When the framebuffer fills at the current growth: free ÷ growth; None unless memory grows."""
    if free_bytes is None or growth_bytes_per_second is None or growth_bytes_per_second <= 0:
        return None
    return free_bytes / growth_bytes_per_second


def shared_terms(terms: Iterable[tuple[float | None, float | None]]) -> tuple[float | None, float | None]:
    """The (KV pool, weights) bytes per GPU that every engine series agrees on.

    kvwatch cannot tell which of the pod's GPUs holds which data-parallel engine, so a per-GPU term is only
    known when every live engine reports the same figure (identical engines); otherwise it is unknown.
    """
    pools, weights = set(), set()
    for pool, weight in terms:
        pools.add(pool)
        weights.add(weight)
    pool_value = pools.pop() if len(pools) == 1 else None
    weight_value = weights.pop() if len(weights) == 1 else None
    return pool_value, weight_value
