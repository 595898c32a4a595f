"""TensorRT-LLM adapter: trtllm-serve's Prometheus names, Triton's ``nv_trt_llm_*`` families, and the
iteration statistics JSON that trtllm-serve's ``/metrics`` returned before it had a Prometheus endpoint.

Sources (docs/metrics.md lists every name; tests/fixtures/tensorrt-llm-metrics/README.md names the files):

- ``trtllm-serve`` (PyTorch backend): ``tensorrt_llm/metrics/collector.py``'s ``MetricsCollector`` writes
  ``trtllm_*`` names labelled ``model_name`` and ``engine_type`` (version ``trtllm-serve``). NVIDIA Dynamo
  re-exports them with a ``trtllm:`` prefix in some releases (version ``trtllm-serve-colon``); both read alike.
- Triton's TensorRT-LLM backend: gauge families ``nv_trt_llm_request_metrics{request_type}`` and
  ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}``, labelled ``model`` and ``version``
  (version ``triton-backend``); Triton 23.11, the first with them, named them ``..._statistics``
  (version ``triton-backend-23.11``: its README's example, tests/fixtures/tensorrt-llm-metrics).
- Iteration statistics (version ``iteration-stats``): a JSON list of iterations, each with
  ``numActiveRequests``, ``numQueuedRequests`` and ``kvCacheStats`` (``maxNumBlocks``, ``freeNumBlocks``,
  ``usedNumBlocks``, ``tokensPerBlock``, cumulative ``reusedBlocks``/``missedBlocks``). trtllm-serve hands
  each iteration out once (a queue drained by every reader), so the last iteration of a poll is the state;
  an empty list (no iteration since the last poll: the engine is idle or another reader drained it) has
  no state at all and reads as unrecognised, never as an empty cache. The JSON carries no model name.

Meanings, one per quantity: TensorRT-LLM's "active requests" (``numActiveRequests``, which trtllm-serve
exports as ``num_requests_running``) are every request taken from its queue, up to
``max_num_active_requests``, whether or not this iteration's scheduler fitted it
(``tensorrt_llm/_torch/pyexecutor/py_executor.py``: ``len(self.active_requests)``); those it did not fit wait
for KV blocks, a batch slot or the token budget, which is what vLLM counts as waiting, and what NVIDIA's own
Triton backend exports as waiting (``num_waiting_requests = active - scheduled``, tensorrtllm_backend's
``tensorrt_llm/1/model.py``). So where the inflight-batching statistics give the scheduled count, running is the
scheduled requests and waiting the active ones not scheduled, plus trtllm-serve's queue ("queued requests");
without it (or with pipeline parallelism, where an iteration schedules one micro-batch of those in flight),
running is the active requests and waiting the queue. KV usage is the
engine's own utilisation gauge (``kv_cache_utilization`` / ``fraction``) when present, else used ÷ max
blocks; capacity is max blocks × tokens per block. TensorRT-LLM keeps no count of preemptions (its paused
requests, ``trtllm_num_paused_requests``, are one iteration's, and sit in waiting above): unknown.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from kvwatch.engines import Selector, SourceOverrides, UnrecognisedPayload
from kvwatch.engines.series import (
    Index,
    KeyOf,
    decimal_index,
    finished_by_reason,
    latency_for,
    latency_index,
    ratio,
    refuse_several_servers,
    sample_named,
    selected,
    series_keys,
)
from kvwatch.exposition import Exposition, TooLarge
from kvwatch.model import TENSORRT_LLM, Detection, Histogram, Poll, Reading, SeriesKey

PREFIXES = ("trtllm_", "trtllm:")
# Why a trtllm-serve page can lack every gauge kvwatch reads, which the page itself cannot tell apart: they are set
# by the iteration-statistics loop (tensorrt_llm/serve/openai_server.py starts it only where enable_iter_perf_stats
# holds, false by default on the PyTorch backend), and a multiprocess registry shows no gauge before it is set.
ITERATION_GAUGES_WHY = ("the page cannot say why: trtllm-serve writes them after its first iteration, and only "
                        "with enable_iter_perf_stats on (off by default on the PyTorch backend); some releases "
                        "(e.g. 1.1.0rc5) export latency only")
# trtllm-serve's families, without prefix (counters by family name: the wire adds _total).
RUNNING = "num_requests_running"
WAITING = "num_requests_waiting"
SCHEDULED = "num_scheduled_requests"
PARALLEL_INFO = "parallel_config_info"  # its pipeline_parallel_size label turns the split off
UTILIZATION = "kv_cache_utilization"
MAX_BLOCKS = "kv_cache_max_blocks"
USED_BLOCKS = "kv_cache_used_blocks"
TOKENS_PER_BLOCK = "kv_cache_tokens_per_block"
SUCCESS = "request_success"
COMPLETED = "num_requests_completed"  # from the iteration statistics: finished requests without per-request metrics
PROMPT_TOKENS = "prompt_tokens"
GENERATION_TOKENS = "generation_tokens"
REUSED_BLOCKS = "kv_cache_reused_blocks"
MISSED_BLOCKS = "kv_cache_missed_blocks"
SERVE_FAMILIES = (RUNNING, WAITING, SCHEDULED, PARALLEL_INFO, UTILIZATION, MAX_BLOCKS, USED_BLOCKS, TOKENS_PER_BLOCK,
                  SUCCESS, COMPLETED, PROMPT_TOKENS, GENERATION_TOKENS, REUSED_BLOCKS, MISSED_BLOCKS)

TRITON_REQUESTS = "nv_trt_llm_request_metrics"
TRITON_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
# (version_range, request family, KV block family): the same labels in both generations
TRITON_GENERATIONS = (("triton-backend", TRITON_REQUESTS, TRITON_KV_BLOCKS),
                      ("triton-backend-23.11", "nv_trt_llm_request_statistics", "nv_trt_llm_kv_cache_block_statistics"))

LATENCY = {"ttft": "time_to_first_token_seconds", "itl": "time_per_output_token_seconds",
           "queue": "request_queue_time_seconds", "e2e": "e2e_request_latency_seconds"}
_COUNTERS = (SUCCESS, COMPLETED, PROMPT_TOKENS, GENERATION_TOKENS, REUSED_BLOCKS, MISSED_BLOCKS)

FAMILIES: frozenset[str] = frozenset(
    {p + f + ("_total" if f in _COUNTERS else "") for p in PREFIXES for f in (*SERVE_FAMILIES, *LATENCY.values())}
    | {family for _, *families in TRITON_GENERATIONS for family in families})
"""Every family the adapter reads from a Prometheus payload."""


def claims(exposition: Exposition) -> bool:
    return _triton_generation(exposition) is not None or _prefix(exposition) is not None


def _triton_generation(exposition: Exposition) -> tuple[str, str, str] | None:
    return next((g for g in TRITON_GENERATIONS if g[1] in exposition or g[2] in exposition), None)


def _prefix(exposition: Exposition) -> str | None:
    for prefix in PREFIXES:
        if any(prefix + f in exposition for f in (RUNNING, WAITING, UTILIZATION, MAX_BLOCKS)):
            return prefix
    return None


def read(exposition: Exposition, overrides: SourceOverrides | None = None, *, timestamp: float) -> Poll:
    """One :class:`Poll` from a trtllm-serve or Triton Prometheus payload."""
    overrides = overrides or SourceOverrides()
    prefix = _prefix(exposition)
    if prefix is not None:
        return _read_serve(exposition, prefix, overrides, timestamp)
    generation = _triton_generation(exposition)
    if generation is not None:
        return _read_triton(exposition, overrides, timestamp, *generation)
    raise UnrecognisedPayload("no TensorRT-LLM metrics (trtllm_*, nv_trt_llm_*)")


def _pick(exposition: Exposition, override: Selector | None, *candidates: Selector) -> Selector | None:
    if override is not None:
        return override
    return next((c for c in candidates if selected(exposition, c)), None)


def _read_serve(exposition: Exposition, p: str, overrides: SourceOverrides, timestamp: float) -> Poll:
    def key_of(labels: dict[str, str]) -> tuple[str | None, str | None]:
        return (labels.get("model_name"), None)

    def idx(selector: Selector | None) -> Index:
        return Index.of(selected(exposition, selector), key_of) if selector is not None else Index()

    usage = _pick(exposition, overrides.usage, Selector(p + UTILIZATION))
    running = _pick(exposition, overrides.running, Selector(p + RUNNING))
    waiting = _pick(exposition, overrides.waiting, Selector(p + WAITING))
    blocks = {n: idx(Selector(p + n)) for n in (MAX_BLOCKS, USED_BLOCKS, TOKENS_PER_BLOCK)}
    splits = overrides.running is None and overrides.waiting is None and not _pipelined(exposition, p + PARALLEL_INFO)
    scheduled = Selector(p + SCHEDULED) if splits else None
    usage_i, running_i, waiting_i, scheduled_i = idx(usage), idx(running), idx(waiting), idx(scheduled)
    refuse_several_servers(((str(usage), usage_i), (str(running), running_i), (str(waiting), waiting_i)))
    # The text format declares a counter family with its _total name; _created samples share the family.
    counters = {n: Index.of(sample_named(exposition, p + n + "_total", p + n + "_total"), key_of)
                for n in _COUNTERS}
    keys = series_keys((usage_i, running_i, waiting_i, *blocks.values()))
    if not (usage_i or running_i or waiting_i or blocks[USED_BLOCKS]):
        raise UnrecognisedPayload(f"trtllm-serve payload has no {p}{UTILIZATION}, {p}{RUNNING} or {p}{WAITING} "
                                  f"samples yet: {ITERATION_GAUGES_WHY}")
    latency = latency_index(exposition, {kind: (p + f,) for kind, f in LATENCY.items()}, key_of)
    queues = {key: _in_batch(running_i.value(key), waiting_i.value(key), scheduled_i.value(key)) for key in keys}
    readings = [_reading(
        key, usage_i.value(key), *queues[key][:2], blocks[MAX_BLOCKS].value(key),
        blocks[USED_BLOCKS].value(key), blocks[TOKENS_PER_BLOCK].value(key),
        reused=counters[REUSED_BLOCKS].value(key), missed=counters[MISSED_BLOCKS].value(key),
        finished=finished_by_reason(counters[SUCCESS], counters[COMPLETED], key),
        prompt=counters[PROMPT_TOKENS].value(key), generation=counters[GENERATION_TOKENS].value(key),
        latency=latency_for(latency, key),
    ) for key in keys]
    usage_name = str(usage) if usage else (
        f"{p}{USED_BLOCKS} / {p}{MAX_BLOCKS}" if blocks[USED_BLOCKS] and blocks[MAX_BLOCKS] else None)
    capacity_name = f"{p}{MAX_BLOCKS} x {p}{TOKENS_PER_BLOCK}" if blocks[MAX_BLOCKS] and blocks[TOKENS_PER_BLOCK] \
        else None
    running_name, waiting_name = _queue_names(
        str(running) if running else None, str(waiting) if waiting else None, p + SCHEDULED,
        any(split for *_, split in queues.values()))
    detection = Detection(
        engine_kind=TENSORRT_LLM, version_range="trtllm-serve" if p == "trtllm_" else "trtllm-serve-colon",
        usage_metric=usage_name, running_metric=running_name, waiting_metric=waiting_name,
        capacity_metric=capacity_name if any(r.kv_capacity_tokens for r in readings) else None)
    return Poll(timestamp=timestamp, detection=detection, readings=tuple(readings))


def _read_triton(exposition: Exposition, overrides: SourceOverrides, timestamp: float, version_range: str,
                 requests: str, kv_blocks: str) -> Poll:
    key_of: KeyOf = lambda labels: (labels.get("model"), None)  # noqa: E731

    def sel(family: str, label: str, value: str) -> Selector:
        return Selector(family, MappingProxyType({label: value}))

    def idx(selector: Selector | None) -> Index:
        return Index.of(selected(exposition, selector), key_of) if selector is not None else Index()

    usage = _pick(exposition, overrides.usage, sel(kv_blocks, "kv_cache_block_type", "fraction"))
    running = _pick(exposition, overrides.running, sel(requests, "request_type", "active"))
    waiting = _pick(exposition, overrides.waiting, sel(requests, "request_type", "waiting"))
    block = {t: idx(sel(kv_blocks, "kv_cache_block_type", t)) for t in ("max", "used", "tokens_per")}
    scheduled = sel(requests, "request_type", "scheduled")
    splits = overrides.running is None and overrides.waiting is None
    usage_i, running_i, waiting_i = idx(usage), idx(running), idx(waiting)
    scheduled_i = idx(scheduled if splits else None)
    refuse_several_servers(((str(usage), usage_i), (str(running), running_i), (str(waiting), waiting_i),
                            *((f'{kv_blocks}{{kv_cache_block_type="{t}"}}', i) for t, i in block.items())))
    keys = series_keys((usage_i, running_i, waiting_i, *block.values()))
    if not (usage_i or running_i or waiting_i or block["used"]):
        raise UnrecognisedPayload(f"Triton payload has {requests} or {kv_blocks} but no KV block or request samples")
    # The backend's own waiting is active - scheduled of the same iteration (tensorrt_llm/1/model.py); the C++
    # backend exports no waiting, and there it is computed the same way.
    queues = {key: _in_batch(running_i.value(key), None, scheduled_i.value(key)) for key in keys}
    readings = [_reading(key, usage_i.value(key), queues[key][0],
                         queues[key][1] if queues[key][2] else waiting_i.value(key),
                         block["max"].value(key), block["used"].value(key), block["tokens_per"].value(key))
                for key in keys]
    usage_name = str(usage) if usage else (
        f'{kv_blocks}{{kv_cache_block_type="used"}} / {{kv_cache_block_type="max"}}'
        if block["used"] and block["max"] else None)
    capacity_name = f'{kv_blocks}{{kv_cache_block_type="max"}} x {{kv_cache_block_type="tokens_per"}}' \
        if block["max"] and block["tokens_per"] else None
    split = any(s for *_, s in queues.values())
    # (split: the waiting are the unscheduled alone, the backend's own waiting being the same count)
    running_name, waiting_name = _queue_names(str(running) if running else None,
                                              str(waiting) if waiting and not split else None, str(scheduled), split)
    detection = Detection(
        engine_kind=TENSORRT_LLM, version_range=version_range, usage_metric=usage_name,
        running_metric=running_name, waiting_metric=waiting_name,
        capacity_metric=capacity_name if any(r.kv_capacity_tokens for r in readings) else None)
    return Poll(timestamp=timestamp, detection=detection, readings=tuple(readings))


def _reading(key: SeriesKey, usage: float | None, running: float | None, waiting: float | None,
             max_blocks: float | None, used_blocks: float | None, tokens_per_block: float | None, *,
             reused: float | None = None, missed: float | None = None, finished: Mapping[str, float] | None = None,
             prompt: float | None = None, generation: float | None = None,
             latency: Mapping[str, Histogram] | None = None) -> Reading:
    if usage is None:
        usage = ratio(used_blocks, max_blocks)
    capacity = max_blocks * tokens_per_block if max_blocks is not None and tokens_per_block is not None else None
    queries = reused + missed if reused is not None and missed is not None else None
    return Reading(
        model_name=key[0], engine=key[1], engine_kind=TENSORRT_LLM, kv_usage_ratio=usage, requests_running=running,
        requests_waiting=waiting,
        finished_by_reason=MappingProxyType(dict(finished or {})), prompt_tokens_total=prompt,
        generation_tokens_total=generation, prefix_cache_queries_total=queries,
        prefix_cache_hits_total=reused if queries is not None else None,
        prefix_cache_unit="blocks" if queries is not None else None,
        kv_capacity_tokens=capacity, num_gpu_blocks=max_blocks, block_size=tokens_per_block,
        latency=MappingProxyType(dict(latency or {})))


def _in_batch(active: float | None, queued: float | None,
              scheduled: float | None) -> tuple[float | None, float | None, bool]:
    """(running, waiting, split) from the active, queued and scheduled counts (the module's docstring says why).
    ``queued`` None: the waiting are the unscheduled alone. No split without a scheduled count between 0 and the
    active one (an iteration's count read beside another's: C++ executors count them at different moments)."""
    if active is None or scheduled is None or not 0 <= scheduled <= active:
        return active, queued, False
    return scheduled, (active - scheduled) + (queued or 0.0), True


def _queue_names(active: str | None, queued: str | None, scheduled: str,
                 split: bool) -> tuple[str | None, str | None]:
    """The running and waiting metrics' names as :func:`_in_batch` combined them."""
    if not split:
        return active, queued
    unscheduled = f"{active} - {scheduled}"
    return scheduled, f"{queued} + ({unscheduled})" if queued is not None else unscheduled


def _pipelined(exposition: Exposition, info: str) -> bool:
    """True when trtllm-serve's parallel config info says pipeline parallelism (one micro-batch per iteration)."""
    for sample in exposition.samples(info):
        size = sample.labels.get("pipeline_parallel_size") or sample.labels.get("pp_size")
        if size is not None and (decimal_index(size) or 0) > 1:
            return True
    return False


# ---------------------------------------------------------------- iteration statistics JSON

# A text-format sample with a quoted (UTF-8) metric name also starts with "{": `{"vllm:x",model_name="m"} 1`.
_QUOTED_NAME_SAMPLE = re.compile(r'\{\s*"(?:[^"\\]|\\.)*"\s*[,}]')


def looks_like_json(text: str) -> bool:
    start = text.lstrip()
    return start[:1] == "[" or (start[:1] == "{" and not _QUOTED_NAME_SAMPLE.match(start))


# JSON values (counted by their separators) past which a body is no iteration-statistics page: trtllm-serve keeps
# at most --iter-stats-max-iterations (1,000 by default) entries of about 40 values. Every value is a Python object:
# a 16 MiB body of "{}," took 438 MB to parse, where the sidecar's chart allows 256 MiB.
MAX_JSON_VALUES = 250_000


def _dp_rank(row: Mapping[str, Any]) -> int | None:
    """A row's ``attentionDpRank`` as a number (written as one, or as its digits), else None."""
    rank = row.get("attentionDpRank")
    if isinstance(rank, str):
        return decimal_index(rank)
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def read_iteration_stats(text: str, *, timestamp: float, model_name: str = "unknown") -> Poll:
    """One :class:`Poll` from trtllm-serve's iteration statistics (``[{"iter": ..., "kvCacheStats": ...}]``);
    ValueError when the text is not JSON, UnrecognisedPayload when it is not iteration statistics, TooLarge when it
    holds more values than such a page could (:data:`MAX_JSON_VALUES`, checked before any is built)."""
    values = text.count(",") + text.count(":")
    if values > MAX_JSON_VALUES:
        raise TooLarge(f"JSON body with about {values:,} values: more than TensorRT-LLM's iteration statistics hold "
                       f"({MAX_JSON_VALUES:,} at most), not read")
    # (an integer of more digits than any count has is read as a float, infinite past its range and then unknown:
    # int() of one past Python's 4,300 digits raised, counted as a kvwatch bug)
    data: Any = json.loads(text, parse_int=lambda digits: int(digits) if len(digits) <= 20 else float(digits))
    iterations = data if isinstance(data, list) else [data]
    stats = [it for it in iterations if isinstance(it, dict) and ("kvCacheStats" in it or "numActiveRequests" in it)]
    if not stats:
        if isinstance(data, list) and not data:
            raise UnrecognisedPayload("TensorRT-LLM iteration statistics: empty list (no iteration since the last "
                                      "poll; the engine is idle or another reader drained the queue: trtllm-serve's "
                                      "Prometheus collector does on some releases; point kvwatch at its "
                                      "/prometheus/metrics where the release has it)")
        raise UnrecognisedPayload("JSON payload is not TensorRT-LLM iteration statistics (no kvCacheStats)")
    # With attention data parallelism an iteration is one row per rank (`attentionDpRank`), each a copy of rank 0's
    # active count and KV beside the rank's own scheduled count, the queue zeroed on every rank but 0
    # (tensorrt_llm's _materialize_frame). The last row was read: its queue lost, its running count one rank's, and
    # the answer hung on the rows' order. Rank 0's newest row is read, unsplit.
    attention_dp = any(_dp_rank(it) not in (None, 0) for it in stats)
    rank0 = next((it for it in reversed(stats) if _dp_rank(it) == 0), None) if attention_dp else None
    last = rank0 if rank0 is not None else stats[-1]
    kv = last.get("kvCacheStats") if isinstance(last.get("kvCacheStats"), dict) else {}

    def num(source: Mapping[str, Any], name: str) -> float | None:
        value = source.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        try:
            number = float(value)  # JSON integers have no bound: past a float's range this overflows
        except OverflowError:
            return None
        return number if math.isfinite(number) else None

    batching = last.get("inflightBatchingStats") if isinstance(last.get("inflightBatchingStats"), dict) else {}
    active, queued, scheduled = (num(last, "numActiveRequests"),
                                 # (another rank's queue is 0 whatever waits: unknown without rank 0's row)
                                 None if attention_dp and rank0 is None else num(last, "numQueuedRequests"),
                                 None if attention_dp else num(batching, "numScheduledRequests"))
    running, waiting, split = _in_batch(active, queued, scheduled)
    reading = _reading(
        (model_name, "0"), None, running, waiting,
        num(kv, "maxNumBlocks"), num(kv, "usedNumBlocks"), num(kv, "tokensPerBlock"),
        reused=num(kv, "reusedBlocks"), missed=num(kv, "missedBlocks"))
    running_name, waiting_name = _queue_names(
        "numActiveRequests" if active is not None else None, "numQueuedRequests" if queued is not None else None,
        "inflightBatchingStats.numScheduledRequests", split)
    detection = Detection(
        engine_kind=TENSORRT_LLM, version_range="iteration-stats",
        usage_metric="kvCacheStats.usedNumBlocks / maxNumBlocks" if reading.kv_usage_ratio is not None else None,
        running_metric=running_name if reading.requests_running is not None else None,
        waiting_metric=waiting_name if reading.requests_waiting is not None else None,
        capacity_metric="kvCacheStats.maxNumBlocks x tokensPerBlock" if reading.kv_capacity_tokens else None)
    # (--usage-metric cannot apply to JSON: check's usage_unknown said to pass it, and read_payload refuses it)
    why = None if reading.kv_usage_ratio is not None else (
        "No KV usage in the iteration statistics (kvCacheStats without usedNumBlocks, or maxNumBlocks not above 0), "
        "and --usage-metric cannot apply to JSON: point kvwatch at trtllm-serve's /prometheus/metrics if it has "
        "the KV gauges.")
    return Poll(timestamp=timestamp, detection=detection, readings=(reading,),
                undetermined=((reading.key, "kv_usage_ratio", why),) if why else ())
