"""SGLang adapter: detect the metric generation, read one Reading per ``(model, dp_rank)``.

Names follow the SGLang repository's ``python/sglang/srt/metrics/collector.py`` (and, for 2024, its
predecessor ``metrics_collector.py``) and its ``docs/references/production_metrics.md``; docs/metrics.md lists
them per generation and tests/fixtures/sglang-metrics/README.md names the sources. Generations, first match wins:

1. ``2024-name-label``: ``sglang:num_requests_running`` / ``sglang:queue_req`` and a ``name`` label (the
   model). ``token_usage`` is a 0..1 ratio; ``cache_hit_rate`` is in percent (read for nothing: it is a
   per-batch figure, not a lifetime ratio).
2. ``model-name-label``: ``sglang:num_running_reqs`` / ``sglang:num_queue_reqs`` with only ``model_name``
   (early 2025): no capacity gauge, so capacity is unknown.
3. ``rank-labels``: scheduler gauges carry ``engine_type``, ``tp_rank``, ``pp_rank`` (and ``dp_rank`` with
   data-parallel attention) and ``sglang:max_total_num_tokens`` reports the KV pool size in tokens (not in
   0.5.2-0.5.5, whose metrics/collector.py has no such gauge: capacity unknown there too).

Series: the model is ``model_name`` (or 2024's ``name``); the engine is ``dp_rank`` (``"0"`` without it).
Tokenizer-side families (prompt/generation/cached tokens, requests, latency and length histograms) carry no rank
label and apply to every series; their copies are disjoint parts of the requests (0.5.2x splits them by
``is_streaming``; priority scheduling and custom labels by each request's values), so they add up.
Tensor- and pipeline-parallel ranks report the same scheduler state, so copies combine by maximum.

Preemption: SGLang "retracts" decode requests when the KV pool runs out. The preemption count is the cumulative
``sglang:num_retracted_requests_total`` counter (0.5.7 on), else 0.4.10-0.5.2's ``sglang:total_retracted_reqs``,
a gauge that holds the scheduler's lifetime total. The ``num_retracted_reqs`` gauge holds only the last logging
interval's count, and the ``sglang:num_retractions`` histogram (0.5.5 on) counts retractions only of requests that
have finished: neither is the total, so neither is read, and 0.5.3-0.5.6 report no preemption total.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from kvwatch.engines import Selector, SourceOverrides, UnrecognisedPayload
from kvwatch.engines.series import (
    SERVER_LABELS,
    Index,
    KeyOf,
    finished_by_reason,
    histogram_samples,
    latency_for,
    latency_index,
    refuse_several_servers,
    sample_named,
    selected,
    series_keys,
    underscore_escaped,
)
from kvwatch.exposition import Exposition
from kvwatch.model import SGLANG, Detection, Poll, Reading, SeriesKey

TOKEN_USAGE = "sglang:token_usage"
# Each pool's own usage (hybrid models; from 0.5.2x every model has the first). token_usage is the fullest pool
# rounded to 2 decimals in 0.5.23 (pool_stats_observer.py, update_scheduler_stats: round(get_max_pool_usage(), 2));
# before, on Mamba/linear-attention hybrids, the full-attention pool alone, with the state pool in mamba_usage.
FULL_TOKEN_USAGE = "sglang:full_token_usage"
POOL_USAGES = (FULL_TOKEN_USAGE, "sglang:swa_token_usage", "sglang:mamba_usage")
MAX_TOTAL_NUM_TOKENS = "sglang:max_total_num_tokens"
CONTEXT_LEN = "sglang:context_len"  # the server's --context-length (static)
RUNNING = "sglang:num_running_reqs"
QUEUE = "sglang:num_queue_reqs"
# A PD-disaggregated decode server's requests waiting to preallocate their KV cache (disaggregation/decode.py's
# DecodePreallocQueue): on such a server they, not num_queue_reqs, are the requests waiting for KV memory.
DECODE_PREALLOC = "sglang:num_decode_prealloc_queue_reqs"
# Its requests whose KV is on its way from the prefill server (DecodeTransferQueue): their blocks are allocated,
# they wait for the transfer, not for room: vLLM's "deferred" reason. 0.5.23's host-receive count is the part of
# that queue staged on the host (metrics_reporter.py: [r for r in transfer_queue if r.host_staged]): read only
# where the transfer count is absent.
DECODE_TRANSFER = ("sglang:num_decode_transfer_queue_reqs", "sglang:num_decode_host_receive_queue_reqs")
# Structured-output requests waiting for their grammar to compile (SGLang's python/sglang/srt/observability/
# metrics_collector.py: "The number of requests in the grammar waiting queue"), outside num_queue_reqs until it is:
# waiting, as vLLM counts its requests waiting for their FSM, and, as there, not for KV room ("deferred").
GRAMMAR_QUEUE = "sglang:num_grammar_queue_reqs"
# A PD prefill server's requests waiting for their decode server (bootstrap; written "prealloc" in releases before the
# bootstrap name) and those whose KV it is sending (inflight). Only a prefill server fills them (the scheduler sets
# them in PREFILL mode alone), which tells such a server where its engine_type says "unified": releases before
# SGLang labelled the role wrote that on every server (scheduler_metrics_mixin.py's init_metrics).
PREFILL_QUEUES = ("sglang:num_prefill_inflight_queue_reqs", "sglang:num_prefill_bootstrap_queue_reqs",
                  "sglang:num_prefill_prealloc_queue_reqs")
RUNNING_2024 = "sglang:num_requests_running"
WAITING_2024 = "sglang:num_requests_waiting"
QUEUE_2024 = "sglang:queue_req"
RETRACTED_TOTAL = "sglang:num_retracted_requests_total"
# 0.4.10-0.5.2: the scheduler's lifetime retraction count as a gauge (python/sglang/srt/metrics/collector.py, "The
# total number of retracted requests due to kvcache full"; the scheduler adds each retraction in scheduler.py).
TOTAL_RETRACTED_GAUGE = "sglang:total_retracted_reqs"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
# The scheduler's tokens by mode (0.5.2x; every decode iteration in 0.5.23, every log interval before): mode="decode"
# moves while a request decodes, where the tokenizer's counters move only when one finishes.
REALTIME_TOKENS = "sglang:realtime_tokens_total"
CACHED_TOKENS = "sglang:cached_tokens_total"
REQUEST_SUCCESS = "sglang:request_success_total"
NUM_REQUESTS = "sglang:num_requests_total"
PROMPT_HISTOGRAM = "sglang:prompt_tokens_histogram"
GENERATION_HISTOGRAM = "sglang:generation_tokens_histogram"
PROMPT_HISTOGRAM_2024 = "sglang:request_prompt_tokens"
GENERATION_HISTOGRAM_2024 = "sglang:request_generation_tokens"
PROCESS_START = "process_start_time_seconds"
ABORTED = "sglang:num_aborted_requests_total"
LATENCY = {  # kind -> families, newest name first
    "ttft": ("sglang:time_to_first_token_seconds",),
    "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    "queue": ("sglang:queue_time_seconds",),
    "e2e": ("sglang:e2e_request_latency_seconds",),
}

FAMILIES: frozenset[str] = frozenset({
    TOKEN_USAGE, *POOL_USAGES, MAX_TOTAL_NUM_TOKENS, CONTEXT_LEN, RUNNING, QUEUE, DECODE_PREALLOC, *DECODE_TRANSFER,
    GRAMMAR_QUEUE,
    *PREFILL_QUEUES,
    RUNNING_2024, WAITING_2024, QUEUE_2024, RETRACTED_TOTAL, TOTAL_RETRACTED_GAUGE,
    PROMPT_TOKENS, GENERATION_TOKENS, REALTIME_TOKENS, CACHED_TOKENS, REQUEST_SUCCESS, NUM_REQUESTS,
    PROMPT_HISTOGRAM, GENERATION_HISTOGRAM, PROMPT_HISTOGRAM_2024, GENERATION_HISTOGRAM_2024, PROCESS_START,
    ABORTED, *(f for families in LATENCY.values() for f in families),
})
"""Every family the adapter reads (the parser keeps only these)."""

_SIGNATURE = (TOKEN_USAGE, RUNNING, QUEUE, RUNNING_2024, WAITING_2024, QUEUE_2024, MAX_TOTAL_NUM_TOKENS)


def claims(exposition: Exposition) -> bool:
    """Whether the payload is SGLang's: one of its scheduler gauges is there."""
    return any(name in exposition for name in _SIGNATURE)


def _key_of(labels: dict[str, str]) -> tuple[str | None, str | None]:
    return (labels.get("model_name") or labels.get("name"), labels.get("dp_rank") or None)


def version_range(exposition: Exposition) -> str:
    if RUNNING_2024 in exposition or QUEUE_2024 in exposition or any(
            "name" in s.labels and "model_name" not in s.labels
            for name in (TOKEN_USAGE, MAX_TOTAL_NUM_TOKENS) for s in exposition.samples(name)):
        return "2024-name-label"
    if any("tp_rank" in s.labels for name in (TOKEN_USAGE, RUNNING, QUEUE, MAX_TOTAL_NUM_TOKENS)
           for s in exposition.samples(name)) or MAX_TOTAL_NUM_TOKENS in exposition:
        return "rank-labels"
    return "model-name-label"


def _fullest(token_usage: float | None, pools: Mapping[str, float | None]) -> float | None:
    """The fullest pool's usage, what the scheduler waits on (the KV tokens, the sliding-window tokens or the Mamba
    state slots). With full_token_usage the pools' own gauges, unrounded, stand for token_usage (their max rounded
    to 2 decimals); without it token_usage was the full-attention pool, and the others add to it."""
    values = [v for v in pools.values() if v is not None and math.isfinite(v)]
    full = pools.get(FULL_TOKEN_USAGE)
    if full is not None and math.isfinite(full):
        return max(values)
    if token_usage is None or not math.isfinite(token_usage):
        return token_usage  # (unknown, or impossible: kvwatch.plausible drops it and says so)
    return max([token_usage, *values])


def _first(exposition: Exposition, override: Selector | None, *names: str) -> Selector | None:
    if override is not None:
        return override
    for name in names:
        if exposition.samples(name):
            return Selector(name)
    return None


def read(exposition: Exposition, overrides: SourceOverrides | None = None, *, timestamp: float) -> Poll:
    """One :class:`Poll` from a parsed SGLang payload; UnrecognisedPayload when it has no usable series."""
    overrides = overrides or SourceOverrides()
    if not claims(exposition) and not any(f in exposition for f in overrides.names()):
        raise UnrecognisedPayload("no SGLang scheduler metrics (sglang:token_usage, sglang:num_running_reqs, ...)")
    key_of: KeyOf = _key_of
    usage = _first(exposition, overrides.usage, TOKEN_USAGE)
    running = _first(exposition, overrides.running, RUNNING, RUNNING_2024)
    waiting = _first(exposition, overrides.waiting, QUEUE, WAITING_2024, QUEUE_2024)
    capacity = _first(exposition, None, MAX_TOTAL_NUM_TOKENS)

    def idx(selector: Selector | None) -> Index:
        return Index.of(selected(exposition, selector), key_of) if selector is not None else Index()

    def fam(name: str) -> Index:
        return Index.of(exposition.samples(name), key_of)

    usage_i, running_i, waiting_i, capacity_i = idx(usage), idx(running), idx(waiting), idx(capacity)
    pools = {name: fam(name) for name in POOL_USAGES if overrides.usage is None and exposition.samples(name)}
    # (one SGLang server has one engine_type, its disaggregation mode: a prefill and a decode server's copies on one
    # page were merged into an engine of the decode's usage and the prefill's queue and pool)
    refuse_several_servers(((str(usage), usage_i), (str(running), running_i), (str(waiting), waiting_i)),
                           SERVER_LABELS | {"engine_type"})
    prealloc_i = fam(DECODE_PREALLOC) if overrides.waiting is None else Index()
    transfer_name = next((name for name in DECODE_TRANSFER if overrides.waiting is None and exposition.samples(name)),
                         None)
    transfer_i = fam(transfer_name) if transfer_name is not None else Index()
    grammar_i = fam(GRAMMAR_QUEUE) if overrides.waiting is None else Index()
    prefill_queues = [fam(name) for name in PREFILL_QUEUES]
    keys = series_keys((usage_i, running_i, waiting_i, capacity_i))

    def tp_ranks(key: SeriesKey) -> int | None:  # every tensor-parallel rank's scheduler exports its gauges
        ranks = {s.labels["tp_rank"] for s in (running_i or usage_i).for_key(key) if "tp_rank" in s.labels}
        return len(ranks) or None
    if not (usage_i or running_i or waiting_i):
        escaped = underscore_escaped(exposition, "sglang:")
        if escaped is not None:
            raise UnrecognisedPayload(escaped)
        raise UnrecognisedPayload("SGLang payload has no token_usage, running or queue samples yet "
                                  "(server started without traffic, or renamed: see --usage-metric)")
    # Both retraction totals carry the scheduler's labels and are read like its gauges: one per dp_rank series,
    # the maximum over tp_rank/pp_rank copies. Every tensor-parallel rank runs the same scheduler loop on the same
    # batch, so each counts the same retractions (python/sglang/srt/managers/scheduler.py, update_running_batch):
    # their sum would count a retraction once per rank. Data-parallel ranks schedule their own requests: each
    # series keeps its own rank's count.
    retracted_family = RETRACTED_TOTAL if exposition.samples(RETRACTED_TOTAL) else TOTAL_RETRACTED_GAUGE
    retracted, prompt, generation, cached, success, finished, aborted, context_len = (fam(n) for n in (
        retracted_family, PROMPT_TOKENS, GENERATION_TOKENS, CACHED_TOKENS, REQUEST_SUCCESS, NUM_REQUESTS, ABORTED,
        CONTEXT_LEN))
    realtime = REALTIME_TOKENS in exposition
    decoded = Index.of(selected(exposition, Selector(REALTIME_TOKENS, MappingProxyType({"mode": "decode"}))), key_of)
    latency = latency_index(exposition, LATENCY, key_of, parts_add=True)
    # (Read by their parts too: on a page without # TYPE lines a histogram is only its _sum, _count and _bucket.)
    prompt_hist = PROMPT_HISTOGRAM if histogram_samples(exposition, PROMPT_HISTOGRAM) else PROMPT_HISTOGRAM_2024
    generation_hist = (GENERATION_HISTOGRAM if histogram_samples(exposition, GENERATION_HISTOGRAM)
                       else GENERATION_HISTOGRAM_2024)
    p_sum, p_count, g_sum, g_count = (
        Index.of(sample_named(exposition, family, family + suffix), key_of)
        for family in (prompt_hist, generation_hist) for suffix in ("_sum", "_count"))
    # (only a sample with the server's model label: on a page merged from two, KServe's queue-proxy, an unlabelled
    # one is the proxy's process; SGLang's multiprocess registry writes none of its own. Copies that disagree are
    # two processes: unknown, as on vLLM's page, rather than whichever line came last)
    starts = {s.value for s in exposition.samples(PROCESS_START) if "model_name" in s.labels or "name" in s.labels}
    process_start = starts.pop() if len(starts) == 1 else None

    readings = []
    for key in keys:
        # cached_tokens_total counts prompt tokens served from the radix cache: hits over prompt tokens. With
        # hierarchical caching it is split by cache_source (device, host, storage_*): the tiers add up.
        hits, queries = _cached_tokens(cached, key), prompt.total(key)
        readings.append(Reading(
            model_name=key[0],
            engine=key[1],
            engine_kind=SGLANG,
            tensor_parallel_ranks=tp_ranks(key),
            kv_usage_ratio=_fullest(usage_i.value(key), {name: i.value(key) for name, i in pools.items()}),
            requests_running=running_i.value(key),
            requests_waiting=_add(for_room := _add(waiting_i.value(key), prealloc_i.value(key)),
                                  deferred := _add(transfer_i.value(key), grammar_i.value(key))),
            waiting_by_reason=MappingProxyType({"capacity": for_room, "deferred": deferred})
            if deferred is not None and for_room is not None else MappingProxyType({}),
            preemptions_total=retracted.value(key),
            finished_by_reason=MappingProxyType(finished_by_reason(success, finished, key)),
            prompt_tokens_total=queries,
            # (the decode count where the scheduler declares the family, 0 before its first decode: one source
            # from the server's start, or the switch would read as a counter going down, a restart)
            generation_tokens_total=(decoded.value(key) or 0.0) if realtime else generation.total(key),
            prefix_cache_queries_total=queries if hits is not None else None,
            prefix_cache_hits_total=hits,
            prefix_cache_unit="tokens" if hits is not None and queries is not None else None,
            request_prompt_tokens_sum=p_sum.total(key),
            request_prompt_tokens_count=p_count.total(key),
            request_generation_tokens_sum=g_sum.total(key),
            request_generation_tokens_count=g_count.total(key),
            kv_capacity_tokens=capacity_i.value(key),
            max_model_len=context_len.value(key),
            process_start_time_seconds=process_start,
            latency=latency_for(latency, key),
            requests_aborted_total=aborted.total(key),
            engine_role=(role := _role(running_i, usage_i, key, prefill_queues)),
            # (a PD prefill server decodes nothing: its decode count never moves)
            tokens_counted_every_step=realtime and role != "prefill",
        ))
    pool_names = sorted(pools) if FULL_TOKEN_USAGE in pools else sorted({*pools, str(usage)}) if usage else []
    detection = Detection(
        engine_kind=SGLANG, version_range=version_range(exposition),
        usage_metric=(f"max({', '.join(pool_names)})" if pools else str(usage) if usage else None),
        running_metric=str(running) if running else None,
        waiting_metric=" + ".join([str(waiting), *([DECODE_PREALLOC] if prealloc_i else []),
                                   *([transfer_name] if transfer_name else [])])
        if waiting else None,
        capacity_metric=str(capacity) if capacity else None)
    return Poll(timestamp=timestamp, detection=detection, readings=tuple(readings))


def _role(running: Index, usage: Index, key: SeriesKey, prefill_queues: list[Index]) -> str | None:
    """``prefill`` or ``decode`` on a PD-disaggregated server (the scheduler gauges' ``engine_type``; where that says
    nothing, ``prefill`` while a prefill server's own queue holds requests), else None."""
    roles = {s.labels.get("engine_type") for index in (running, usage) for s in index.for_key(key)}
    role = roles.pop() if len(roles) == 1 else None
    if role in ("prefill", "decode"):
        return role
    return "prefill" if any((queue.value(key) or 0) > 0 for queue in prefill_queues) else None


def _cached_tokens(cached: Index, key: SeriesKey) -> float | None:
    by_source = cached.by_label(key, "cache_source", parts_add=True)
    if not by_source:
        return cached.total(key)
    if "total" in by_source:  # the collector's fallback label: the whole count already
        return by_source["total"]
    return sum(by_source.values())


def _add(queued: float | None, preallocating: float | None) -> float | None:
    """Two parts of a queue added (the scheduler's queue and a PD decode server's preallocating, or those and the
    requests waiting for something else: transfers, grammars); one unknown part: the other."""
    if preallocating is None:
        return queued
    return preallocating if queued is None else queued + preallocating
