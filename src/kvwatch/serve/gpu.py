"""GPU memory outside the KV cache inside ``kvwatch serve`` (service wing): read the engine's GPUs from
dcgm-exporter (``--dcgm-url``) or NVML (``--nvml``) on the poll timer, keep each GPU's recent used bytes, and
export framebuffer used/free, non-KV memory, its growth and time to the limit, and the last Xid.

The source is read beside the engine's poll (its own fetcher, same timeout and body cap); its failures are
counted in ``kvwatch_gpu_source_errors_total{source,reason}`` and ``kvwatch_gpu_source_up`` and never touch
the engine's poll or ``kvwatch_up``. The per-GPU terms (KV pool, weights) come from the capacity analyzer's
results (:mod:`kvwatch.serve.capacity`), the one place they are computed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvwatch.exposition import ParseError, parse
from kvwatch.fetch import Fetcher
from kvwatch.gpu_memory import (
    FAMILIES,
    TREND_WINDOW_SECONDS,
    GpuMatch,
    GpuMemory,
    growth_rate,
    non_kv_bytes,
    read_dcgm,
    seconds_to_limit,
)
from kvwatch.nvml import NvmlUnavailable, read_nvml
from kvwatch.payload import REASONS, ScrapeError

# Why a read of the GPU source failed: the fetch reasons, no_match (the source answered but lists none of the
# engine's GPUs: wrong pod/namespace/UUIDs, or dcgm-exporter without its Kubernetes pod mapping) and nvml.
GPU_REASONS: tuple[str, ...] = (*(r for r in REASONS if r not in ("unrecognised", "internal")), "no_match", "nvml")
# The reasons each source can fail for (its counters start at 0 for these only): NVML is no HTTP fetch, and
# dcgm-exporter's reads never fail in NVML.
SOURCE_REASONS: dict[str, tuple[str, ...]] = {"dcgm": tuple(r for r in GPU_REASONS if r != "nvml"),
                                              "nvml": ("timeout", "no_match", "nvml")}
GPU_LABELS = ["uuid", "gpu_instance"]


class GpuReadError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class GpuReading:
    memory: GpuMemory
    non_kv_bytes: float | None
    growth_bytes_per_second: float | None
    seconds_to_limit: float | None


@dataclass(frozen=True)
class GpuState:
    source: str
    up: bool = False
    gpus: tuple[GpuReading, ...] = ()
    errors_total: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(dict.fromkeys(GPU_REASONS, 0)))
    last_error: str | None = None


class DcgmSource:
    name = "dcgm"

    def __init__(self, fetcher: Fetcher, match: GpuMatch) -> None:
        self.fetcher = fetcher
        self.match = match

    def read(self) -> list[GpuMemory]:
        try:
            # Only the framebuffer and Xid families: a node exporter lists hundreds of others.
            exposition = parse(self.fetcher.fetch(), FAMILIES.__contains__)
        except ScrapeError as exc:
            raise GpuReadError(exc.reason, str(exc)) from None
        except ParseError as exc:
            raise GpuReadError("parse", f"{self.fetcher.url}: {exc}") from None
        gpus = read_dcgm(exposition, self.match)
        if not gpus:
            raise GpuReadError("no_match", f"{self.fetcher.url} lists no GPU of {describe(self.match)}")
        return gpus

    def close(self) -> None:
        self.fetcher.close()


class NvmlSource:
    name = "nvml"

    def __init__(self, uuids: frozenset[str] = frozenset(),
                 reader: Callable[[frozenset[str]], list[GpuMemory]] = read_nvml) -> None:
        self.uuids = uuids
        self._reader = reader

    def read(self) -> list[GpuMemory]:
        try:
            gpus = self._reader(self.uuids)
        except NvmlUnavailable as exc:
            raise GpuReadError("nvml", str(exc)) from None
        if not gpus:
            raise GpuReadError("no_match", "NVML sees no GPU" + (f" with UUID in {sorted(self.uuids)}"
                                                                 if self.uuids else ""))
        return gpus

    def close(self) -> None:
        pass


def describe(match: GpuMatch) -> str:
    if match.uuids:
        return "UUIDs " + ", ".join(sorted(match.uuids))
    return f"pod {match.namespace}/{match.pod}" if match.namespace else f"pod {match.pod} (any namespace)"


REMEMBERED_GPUS = 64
"""The most GPUs whose trend points are kept, those in the current read counted first (all of them are kept), the
missing ones after them: a node's 8 GPUs at 7 MIG instances each is 56 (a hostile source listing new UUIDs every
read must not grow memory)."""


class GpuWatcher:
    """Owns the source and each GPU's recent ``(t, used bytes)``; :meth:`update` builds the frozen state."""

    def __init__(self, source: DcgmSource | NvmlSource, window: float = TREND_WINDOW_SECONDS) -> None:
        self.source = source
        self.window = window
        self._used: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self.state = GpuState(source.name, errors_total=MappingProxyType(dict.fromkeys(SOURCE_REASONS[source.name], 0)))

    def read(self) -> list[GpuMemory] | GpuReadError:
        """I/O (run beside the engine's poll); an error is returned, not raised, for :meth:`update`."""
        try:
            return self.source.read()
        except GpuReadError as exc:
            return exc

    def update(self, result: list[GpuMemory] | GpuReadError, now: float, kv_pool_bytes: float | None,
               weights_bytes: float | None, *, engine_serving: bool = True, engine_restarted: bool = False) -> GpuState:
        """``engine_serving``: the engine's poll succeeded. While it does not, the engine may be loading (vLLM serves
        /metrics only once its weights, KV pool and CUDA graphs are allocated), so the memory is shown but adds no
        point to the trend: the load read as growth, and the GPU memory alert fired on every start. A failed poll
        keeps the points it has (one in ten failing hid a leak for good); ``engine_restarted`` drops them, the old
        process's memory being no part of the new one's trend."""
        previous = self.state
        if engine_restarted:
            self._used.clear()
        if isinstance(result, GpuReadError):
            errors = dict(previous.errors_total)
            errors[result.reason] = errors.get(result.reason, 0) + 1
            self.state = GpuState(previous.source, False, (), MappingProxyType(errors), str(result))
            return self.state
        readings = []
        for gpu in result:
            points = self._used.setdefault((gpu.uuid, gpu.instance), deque())
            if gpu.used_bytes is not None and engine_serving:
                points.append((now, gpu.used_bytes))
            while points and points[0][0] < now - self.window:
                points.popleft()
            growth = growth_rate(list(points))
            readings.append(GpuReading(gpu, non_kv_bytes(gpu.used_bytes, kv_pool_bytes, weights_bytes), growth,
                                       seconds_to_limit(gpu.free_bytes, growth)))
        # A GPU missing from a read keeps its points while they are in the window (dropped at once, its trend took 2
        # minutes to come back after a one-read gap, and the alert's `for` started again), at most
        # REMEMBERED_GPUS GPUs in all, the most recently seen first.
        seen = {(g.uuid, g.instance) for g in result}
        missing = []
        for key in [k for k in self._used if k not in seen]:
            points = self._used[key]
            while points and points[0][0] < now - self.window:
                points.popleft()
            if points:
                missing.append((points[-1][0], key))
            else:
                del self._used[key]
        for _, key in sorted(missing, reverse=True)[max(0, REMEMBERED_GPUS - len(seen)):]:
            del self._used[key]
        self.state = GpuState(previous.source, True, tuple(readings), previous.errors_total, previous.last_error)
        return self.state

    def close(self) -> None:
        self.source.close()


_WINDOW_NOTE = (" Least-squares slope of framebuffer used over the last 10 minutes of the polls the engine answered "
                "(poll-clock seconds; needs 2 minutes of them), afresh after an engine restart: the KV pool and the "
                "weights are allocated once, before the engine answers, so this is the growth of non-KV memory.")


def families(state: GpuState) -> Iterator[Metric]:
    """The GPU families for one scrape (the source's health always; memory only from a good read)."""
    up = GaugeMetricFamily("kvwatch_gpu_source_up", "1 if kvwatch's last read of the GPU memory source "
                           "(dcgm-exporter or NVML) succeeded and matched the engine's GPUs, else 0.",
                           labels=["source"])
    up.add_metric([state.source], 1.0 if state.up else 0.0)
    yield up
    errors = CounterMetricFamily("kvwatch_gpu_source_errors", "Failed reads of the GPU memory source, by reason "
                                 "(dcgm: connect, timeout, http_status, too_large, parse, no_match; nvml: timeout, "
                                 "no_match, nvml).",
                                 labels=["source", "reason"])
    for reason, count in state.errors_total.items():
        errors.add_metric([state.source, reason], float(count))
    yield errors
    gauges = {
        "used": GaugeMetricFamily("kvwatch_gpu_memory_used_bytes", "Framebuffer memory used on each of the "
                                  "engine's GPUs, in bytes.", labels=GPU_LABELS),
        "free": GaugeMetricFamily("kvwatch_gpu_memory_free_bytes", "Framebuffer memory free on each of the "
                                  "engine's GPUs, in bytes.", labels=GPU_LABELS),
        "non_kv": GaugeMetricFamily(
            "kvwatch_gpu_non_kv_memory_bytes", "Framebuffer used minus the KV cache pool minus the weights on "
            "each GPU (activations, CUDA graphs, the allocator's cache, leaks), in bytes. The pool is the "
            "engine's own size in bytes per GPU, the weights the capacity model's estimate; absent when either "
            "is unknown (no model or no engine capacity figure, or data-parallel engines that disagree).",
            labels=GPU_LABELS),
        "growth": GaugeMetricFamily("kvwatch_gpu_non_kv_memory_growth_bytes_per_second",
                                    "Growth of non-KV memory on each GPU, bytes per second." + _WINDOW_NOTE,
                                    labels=GPU_LABELS),
        "eta": GaugeMetricFamily("kvwatch_gpu_memory_limit_eta_seconds",
                                 "Seconds until the framebuffer is full at the current non-KV growth (free ÷ "
                                 "growth): the CUDA out-of-memory horizon. Absent while memory does not grow.",
                                 labels=GPU_LABELS),
        "xid": GaugeMetricFamily("kvwatch_gpu_last_xid", "The last Xid error code dcgm-exporter reports for "
                                 "each GPU (0: none); absent from NVML.", labels=GPU_LABELS),
    }
    for r in state.gpus:
        labels = [r.memory.uuid, r.memory.instance]
        values = {"used": r.memory.used_bytes, "free": r.memory.free_bytes, "non_kv": r.non_kv_bytes,
                  "growth": r.growth_bytes_per_second, "eta": r.seconds_to_limit, "xid": r.memory.xid_last}
        for name, value in values.items():
            if value is not None:
                gauges[name].add_metric(labels, value)
    yield from (g for g in gauges.values() if g.samples)
