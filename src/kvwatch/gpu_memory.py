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


def least_free_ratio(gpus: Iterable[GpuMemory]) -> float | None:
    """The smallest free share among the engine's GPUs (the one that runs out first), None when unknown."""
    ratios = [g.free_ratio for g in gpus if g.free_ratio is not None]
    return min(ratios) if ratios else None


def xid_errors(gpus: Sequence[GpuMemory]) -> dict[str, float]:
    """``{uuid: last Xid code}`` for GPUs that reported one (non-zero)."""
    return {g.uuid: g.xid_last for g in gpus if g.xid_last}
