"""Plain data the pure core passes around: what one poll of an inference engine says.

A :class:`Reading` is one series: one ``(model_name, engine)`` pair (``engine`` is the
data-parallel index: vLLM's ``engine`` label, SGLang's ``dp_rank``; ``"0"`` without one). Every value is
optional because every engine family may be missing in some version or configuration; ``None`` means
"not reported", never 0.
Counters are raw cumulative totals; rates come from :mod:`kvwatch.history`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kvwatch.capacity.kv import LayoutPool

SeriesKey = tuple[str, str]
"""``(model_name, engine)``."""

UNNAMED_MODELS = frozenset({"undefined", "unknown"})
"""``model_name`` values that name no model, so no preset is looked up by them: trtllm-serve labels every series
``model_name="undefined"`` (``tensorrt_llm/serve/openai_server.py``), and kvwatch calls the one series of
TensorRT-LLM's JSON iteration statistics, which carry no name, ``unknown``."""

PrefixCacheUnit = Literal["tokens", "blocks"]



def _empty() -> Mapping[str, float]:
    return MappingProxyType({})


def _empty_str() -> Mapping[str, str]:
    return MappingProxyType({})



# Reading.capacity_source of an engine whose page holds two configurations (kvwatch.engines.vllm._cache_configs).
CAPACITY_UNDETERMINED = "undetermined"

@dataclass(frozen=True, slots=True)
class Histogram:
    """One cumulative Prometheus histogram: ascending upper ``bounds`` (the last is ``+Inf``), the cumulative
    count at each, and the ``_count``/``_sum`` samples."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum: float


def _no_histograms() -> Mapping[str, Histogram]:
    return MappingProxyType({})


# The engines kvwatch reads (Detection.engine_kind, Reading.engine_kind): whose flags advice names, and whose
# capacity sums kvwatch's formula is (vLLM's only).
VLLM, SGLANG, TENSORRT_LLM = "vllm", "sglang", "tensorrt-llm"


@dataclass(frozen=True, slots=True)
class Reading:
    """One series' values from one poll (per ``model_name`` and data-parallel ``engine``)."""

    model_name: str
    engine: str = "0"
    engine_kind: str = VLLM  # the adapter that read it (VLLM, SGLANG, TENSORRT_LLM)
    kv_usage_ratio: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    waiting_by_reason: Mapping[str, float] = field(default_factory=_empty)
    requests_swapped: float | None = None
    preemptions_total: float | None = None
    finished_by_reason: Mapping[str, float] = field(default_factory=_empty)
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prefix_cache_unit: PrefixCacheUnit | None = None
    request_prompt_tokens_sum: float | None = None
    request_prompt_tokens_count: float | None = None
    request_generation_tokens_sum: float | None = None
    request_generation_tokens_count: float | None = None
    # Capacity, per engine (vLLM sums num_gpu_blocks over data-parallel engines; this is divided back).
    kv_capacity_tokens: float | None = None
    # None: the engine's own figure (or none); "formula": kvwatch's capacity model filled it in
    # (kvwatch.capacity.series), because the engine reports none; CAPACITY_UNDETERMINED: the page holds two
    # configurations for this engine, so its capacity is unknown and the formula fills nothing in.
    capacity_source: str | None = None
    kv_max_concurrency: float | None = None
    # The engine's own max model length where it exports one as a metric (SGLang's context_len; vLLM's comes from
    # cache_config_info's labels, kvwatch.engines.vllm.engine_max_model_len).
    max_model_len: float | None = None
    num_gpu_blocks: float | None = None
    block_size: float | None = None
    gpu_memory_utilization: float | None = None
    cache_config: Mapping[str, str] = field(default_factory=_empty_str)
    process_start_time_seconds: float | None = None
    # Latency histograms by kind (kvwatch.latency.KINDS: ttft, itl, queue, e2e), each as the engine exports it.
    latency: Mapping[str, Histogram] = field(default_factory=_no_histograms)
    # The request length histograms with their buckets ("prompt": vllm:request_prompt_tokens, "generation":
    # vllm:request_generation_tokens), for the forecast's request-size tail; empty when not exported.
    lengths: Mapping[str, Histogram] = field(default_factory=_no_histograms)
    requests_aborted_total: float | None = None
    # How many tensor-parallel ranks export the series (SGLang's tp_rank copies of its scheduler gauges): the TP size
    # the server runs, where the payload says it; None where it does not (vLLM exports from one process).
    tensor_parallel_ranks: int | None = None
    # A prefill-disaggregated server's role ("prefill" or "decode", SGLang's engine_type label); None: unified.
    engine_role: str | None = None
    # vLLM's sleep mode (vllm:engine_sleep_state, 0.11.1+): "awake", "weights_offloaded" (level 1), "discard_all"
    # (level 2), "asleep" (awake = 0, level not said); None when the engine does not say.
    sleep_state: str | None = None
    # The engine counts tokens while requests run (vLLM every scheduler step; SGLang with realtime_tokens_total every
    # decode iteration or log interval), so requests running while no token is counted and no gauge moves are a
    # hang even with nothing waiting; older SGLang and TensorRT-LLM count at a request's end.
    tokens_counted_every_step: bool = False
    # A waiting request holds no KV blocks (vLLM allocates at admission; kvwatch.capacity.findings.kv_usage_stuck):
    # elsewhere a queue may hold KV (an SGLang PD prefill server's transfers, in releases that label it "unified").
    waiting_holds_no_kv: bool = False
    # The engine's blocks as the model's layout holds them, on a model whose layout counts by group (several KV
    # groups, a window: kvwatch.capacity.kv.LayoutPool, set by kvwatch.capacity.series where kvwatch knows the model
    # and the engine's blocks): the observed-mix ceiling counts a request's tokens by it
    # (kvwatch.derived.max_concurrency). None elsewhere.
    layout_pool: LayoutPool | None = None

    @property
    def key(self) -> SeriesKey:
        return (self.model_name, self.engine)

    @property
    def requests_waiting_for_capacity(self) -> float | None:
        """Requests waiting for room to run: vLLM ≥0.20 splits its queue by reason, and only ``capacity`` waits
        for the scheduler and the KV cache; ``deferred`` requests wait for a LoRA slot or a KV transfer."""
        if self.waiting_by_reason:
            return self.waiting_by_reason.get("capacity", self.requests_waiting)
        return self.requests_waiting

    @property
    def requests_waiting_deferred(self) -> float | None:
        """Requests waiting for something other than room (vLLM >= 0.20's ``deferred``: a LoRA slot or a KV
        transfer, whose blocks may already be allocated; SGLang's KV transfer and grammar queues); None when the
        engine does not split its queue."""
        return self.waiting_by_reason.get("deferred", 0.0) if self.waiting_by_reason else None

    @property
    def prefill_server(self) -> bool:
        """A PD prefill server: its running count (0, or SGLang 0.5.23's forward batch) holds little of its KV, which
        requests in transfer to the decode servers hold; a queue with nothing running is its work."""
        return self.engine_role == "prefill"

    @property
    def asleep(self) -> bool:
        """The engine is in vLLM's sleep mode: its KV cache is released and requests wait until it wakes up."""
        return self.sleep_state not in (None, "awake")

    @property
    def kv_used_tokens(self) -> float | None:
        """Tokens held in the KV cache: usage × capacity (evictable prefix-cache blocks count as free)."""
        if self.kv_usage_ratio is None or self.kv_capacity_tokens is None:
            return None
        return self.kv_usage_ratio * self.kv_capacity_tokens

    @property
    def kv_tokens_per_running_request(self) -> float | None:
        """The live KV footprint: tokens held ÷ running requests (None when either is unknown or zero).

        The one home of this quantity; the forecaster's ``tokens_per_running_request`` estimate is its
        average over the forecast window."""
        used = self.kv_used_tokens
        if used is None or not self.requests_running:
            return None
        return used / self.requests_running

    @property
    def prefix_cache_hit_ratio(self) -> float | None:
        """Lifetime hits / queries, or None when unknown or nothing was queried yet."""
        if not self.prefix_cache_queries_total or self.prefix_cache_hits_total is None:
            return None
        return self.prefix_cache_hits_total / self.prefix_cache_queries_total

    @property
    def mean_prompt_tokens(self) -> float | None:
        """Mean prompt of the requests finished since the engine started (the prompt length histogram's sum and
        count); None before one finished or without the histogram."""
        total, count = self.request_prompt_tokens_sum, self.request_prompt_tokens_count
        return total / count if total is not None and count else None

    @property
    def prefix_cached_share(self) -> float | None:
        """The share of prompt tokens the prefix cache served since the engine started (lifetime hits / queries):
        a waiting prompt needs KV only for the rest. None when prefix caching is off or nothing was queried."""
        return self.prefix_cache_hit_ratio if self.prefix_caching_enabled is not False else None

    @property
    def prefix_caching_enabled(self) -> bool | None:
        value = self.cache_config.get("enable_prefix_caching")
        if value is None or value == "None":
            return None
        return value == "True"


@dataclass(frozen=True)
class Detection:
    """Which engine and generation produced the payload, and which names the adapter read.

    ``engine_kind`` is ``vllm``, ``sglang`` or ``tensorrt-llm``; each ``*_metric`` names the source of that
    quantity as the adapter found it (a family, a ``family{label="value"}`` selector or an iteration-stats
    JSON field), None when the payload has none (the quantity is then unknown, never guessed).
    """

    engine_kind: str
    version_range: str
    usage_metric: str | None
    running_metric: str | None = None
    waiting_metric: str | None = None
    capacity_metric: str | None = None


@dataclass(frozen=True)
class Poll:
    """Everything one successful poll produced, stamped with the caller's clock (seconds)."""

    timestamp: float
    detection: Detection
    readings: tuple[Reading, ...]
    # (series, field, value read) of each impossible value the payload held, dropped to None (kvwatch.plausible).
    implausible: tuple[tuple[SeriesKey, str, float], ...] = ()
    # (series, field, why) of each value the payload holds but does not determine (vLLM's pid copies that disagree),
    # left None: unknown, and not implausible.
    undetermined: tuple[tuple[SeriesKey, str, str], ...] = ()
    # Series the payload held beyond the reader's max_series (left out of ``readings``).
    series_dropped: int = 0
    # Why each histogram or summary the page holds was left unread (Exposition.spoiled): its figures are unknown.
    unread: tuple[str, ...] = ()
