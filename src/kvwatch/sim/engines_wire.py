"""Render simulator snapshots as SGLang's or trtllm-serve's ``/metrics`` text (pure), beside vLLM's in
:mod:`kvwatch.sim.metrics`.

The engine model is the same for every engine (a paged KV cache, a running batch, a queue); only the wire
names differ, so kvwatch's adapters, the demo and the end-to-end tests can run against each engine.

- ``sglang``: the current ``python/sglang/srt/metrics/collector.py`` names and HELP texts; scheduler
  gauges labelled ``model_name``, ``engine_type="unified"``, ``tp_rank``, ``pp_rank`` (and ``dp_rank`` with
  more than one data-parallel engine); tokenizer counters and histograms labelled ``model_name`` only,
  summed over the engines (one tokenizer manager serves all ranks). The KV pool holds
  ``(num_gpu_blocks - 1) x block_size`` tokens (the simulator's usable blocks, so usage x capacity is
  the used token count); preemptions are SGLang's retractions.
- ``tensorrt-llm``: trtllm-serve's ``tensorrt_llm/metrics/collector.py`` names (``trtllm_`` prefix, labels
  ``model_name`` and ``engine_type="trtllm"``); one engine only (trtllm-serve exposes no rank label).

Histogram bounds are each engine's defaults: the simulator records every bound of each (TensorRT-LLM's equal vLLM's;
SGLang's sub-second steps and its queue and e2e bounds past 60 s were left out, and a quantile past 60 s read 60).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from kvwatch.sim.buckets import (
    ITL_SECONDS,
    REQUEST_LATENCY_SECONDS,
    SGLANG_E2E,
    SGLANG_ITL,
    SGLANG_QUEUE,
    SGLANG_TTFT,
    TTFT_SECONDS,
)
from kvwatch.sim.engine import EngineSnapshot, HistogramSnapshot
from kvwatch.sim.metrics import render

ENGINES = ("vllm", "sglang", "tensorrt-llm")


class _Families:
    def __init__(self) -> None:
        self.families: list[Metric] = []

    def gauge(self, name: str, help_text: str, rows: Iterable[tuple[dict[str, str], float]]) -> None:
        metric = Metric(name, help_text, "gauge")
        for labels, value in rows:
            metric.add_sample(name, labels, float(value))
        self.families.append(metric)

    def counter(self, name: str, help_text: str, rows: Iterable[tuple[dict[str, str], float]]) -> None:
        """``name`` without ``_total``; the wire name gets it, as prometheus_client writes counters."""
        metric = Metric(name, help_text, "counter")
        for labels, value in rows:
            metric.add_sample(name + "_total", labels, float(value))
        self.families.append(metric)

    def histogram(self, name: str, help_text: str, bounds: Sequence[float],
                  rows: Iterable[tuple[dict[str, str], HistogramSnapshot]]) -> None:
        metric = Metric(name, help_text, "histogram")
        for labels, hist in rows:
            shared = [b for b in bounds if float(b) in hist.bounds]
            for bound, count in zip((*shared, float("inf")), hist.cumulative(shared), strict=True):
                metric.add_sample(name + "_bucket", {**labels, "le": floatToGoString(bound)}, float(count))
            metric.add_sample(name + "_count", labels, float(hist.count))
            metric.add_sample(name + "_sum", labels, hist.sum)
        self.families.append(metric)

    def text(self) -> str:
        families = self.families

        class _Registry:
            def collect(self) -> Iterable[Metric]:
                return iter(families)

        return generate_latest(_Registry()).decode()  # type: ignore[arg-type]


def _merged(hists: Sequence[HistogramSnapshot]) -> HistogramSnapshot:
    first = hists[0]
    counts = [sum(h.counts[i] for h in hists) for i in range(len(first.counts))]
    return HistogramSnapshot(first.bounds, tuple(counts), sum(h.sum for h in hists), sum(h.count for h in hists))


def kv_pool_tokens(s: EngineSnapshot) -> int:
    """Tokens the simulated KV pool holds (usable blocks x block size): usage x this = tokens in use."""
    return (s.num_gpu_blocks - 1) * s.block_size


def render_sglang(snaps: Sequence[EngineSnapshot], *, model_name: str) -> str:
    """The ``/metrics`` body of an SGLang server with one scheduler per snapshot (dp ranks)."""
    f = _Families()
    with_dp = len(snaps) > 1

    def sched(s: EngineSnapshot) -> dict[str, str]:
        labels = {"model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
        return {**labels, "dp_rank": str(s.engine)} if with_dp else labels

    def per(fn: Callable[[EngineSnapshot], float]) -> list[tuple[dict[str, str], float]]:
        return [(sched(s), fn(s)) for s in snaps]

    tok = {"model_name": model_name}
    f.gauge("sglang:num_running_reqs", "The number of running requests.", per(lambda s: s.num_running))
    f.gauge("sglang:num_used_tokens", "The number of used tokens.",
            per(lambda s: round(s.kv_usage * kv_pool_tokens(s))))
    f.gauge("sglang:token_usage", "The token usage.", per(lambda s: s.kv_usage))
    f.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", per(lambda s: s.num_waiting))
    f.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
            per(kv_pool_tokens))
    f.counter("sglang:num_retracted_requests", "Total number of retracted requests.",
              per(lambda s: s.preemptions_total))
    f.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", SGLANG_QUEUE,
                per(lambda s: s.histograms["request_queue_time_seconds"]))
    f.counter("sglang:prompt_tokens", "Number of prefill tokens processed.",
              [(tok, sum(s.prompt_tokens_total for s in snaps))])
    f.counter("sglang:generation_tokens", "Number of generation tokens processed.",
              [(tok, sum(s.generation_tokens_total for s in snaps))])
    f.counter("sglang:cached_tokens", "Number of cached prompt tokens.",
              [(tok, sum(s.prompt_tokens_cached_total for s in snaps))])
    f.counter("sglang:num_requests", "Number of requests processed.",
              [(tok, sum(s.requests_completed for s in snaps))])
    f.counter("sglang:num_aborted_requests", "Number of requests aborted.",
              [(tok, sum(s.finished_by_reason.get("abort", 0) for s in snaps))])
    for name, help_text, bounds, key in (
        ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", SGLANG_TTFT,
         "time_to_first_token_seconds"),
        ("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", SGLANG_ITL,
         "inter_token_latency_seconds"),
        ("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", SGLANG_E2E,
         "e2e_request_latency_seconds"),
    ):
        f.histogram(name, help_text, bounds, [(tok, _merged([s.histograms[key] for s in snaps]))])
    return f.text()


def render_trtllm(snaps: Sequence[EngineSnapshot], *, model_name: str) -> str:
    """The ``/metrics`` body trtllm-serve's MetricsCollector writes for one engine."""
    if len(snaps) != 1:
        raise ValueError("trtllm-serve exposes one engine (no rank label): use one data-parallel engine")
    (s,) = snaps
    b = {"model_name": model_name, "engine_type": "trtllm"}
    f = _Families()
    max_blocks = s.num_gpu_blocks - 1
    used = round(s.kv_usage * max_blocks)
    f.counter("trtllm_request_success", "Count of successfully processed requests.",
              [({**b, "finished_reason": r}, v) for r, v in sorted(s.finished_by_reason.items())])
    # (trtllm-serve's defaults equal vLLM's: named, not the recorded bounds, which hold SGLang's too)
    for name, help_text, key, bounds in (
        ("trtllm_e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
         "e2e_request_latency_seconds", REQUEST_LATENCY_SECONDS),
        ("trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         "time_to_first_token_seconds", TTFT_SECONDS),
        ("trtllm_time_per_output_token_seconds", "Histogram of time per output token in seconds.",
         "request_time_per_output_token_seconds", ITL_SECONDS),
        ("trtllm_request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
         "request_queue_time_seconds", REQUEST_LATENCY_SECONDS),
    ):
        hist = s.histograms[key]
        f.histogram(name, help_text, bounds, [(b, hist)])
    f.counter("trtllm_prompt_tokens", "Cumulative number of prompt (input) tokens processed.",
              [(b, s.prompt_tokens_total)])
    f.counter("trtllm_generation_tokens", "Cumulative number of generation (output) tokens produced.",
              [(b, s.generation_tokens_total)])
    f.counter("trtllm_kv_cache_reused_blocks", "Cumulative number of KV cache blocks reused (cache hits)",
              [(b, s.prefix_cache_hits_blocks)])
    f.counter("trtllm_kv_cache_missed_blocks", "Cumulative number of KV cache blocks missed (cache misses)",
              [(b, s.prefix_cache_queries_blocks - s.prefix_cache_hits_blocks)])
    f.gauge("trtllm_kv_cache_utilization", "KV cache utilization", [(b, s.kv_usage)])
    # TensorRT-LLM takes requests from its queue into its active list up to max_num_active_requests (here:
    # all of them) and schedules those that fit: the simulator's waiting requests are active, not scheduled.
    f.gauge("trtllm_num_requests_running", "Number of active requests", [(b, s.num_running + s.num_waiting)])
    f.gauge("trtllm_num_requests_waiting", "Number of queued requests", [(b, 0)])
    f.gauge("trtllm_num_scheduled_requests", "Number of scheduled requests", [(b, s.num_running)])
    f.gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", [(b, max_blocks)])
    f.gauge("trtllm_kv_cache_free_blocks", "Number of free KV cache blocks", [(b, max_blocks - used)])
    f.gauge("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks", [(b, used)])
    f.gauge("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block", [(b, s.block_size)])
    return f.text()


def render_any(snaps: Sequence[EngineSnapshot], engine: str = "vllm", **options: object) -> str:
    """The hook :class:`kvwatch.sim.server.SimulationService` calls: vLLM's renderer, or one of the above."""
    if engine == "sglang":
        return render_sglang(snaps, model_name=str(options["model_name"]))
    if engine == "tensorrt-llm":
        return render_trtllm(snaps, model_name=str(options["model_name"]))
    return render(snaps, **options)  # type: ignore[arg-type]
