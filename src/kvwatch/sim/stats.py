"""What one simulated engine counts, and the snapshot of it that vLLM's /metrics shows (pure).

The counters and histograms vLLM's stat loggers keep (preemptions, finished requests by reason, prompt and
generation tokens, prefix-cache queries and hits, the latency and size histograms), updated by the scheduler
(kvwatch.sim.scheduler) and frozen into an :class:`EngineSnapshot` for the renderer (kvwatch.sim.metrics).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

from kvwatch.sim import buckets
from kvwatch.sim.config import FINISH_REASONS


@dataclass(frozen=True)
class HistogramSnapshot:
    """Non-cumulative counts per bound of ``bounds`` plus a last +Inf slot; ``sum`` and ``count``."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int

    def cumulative(self, bounds: Sequence[float]) -> list[int]:
        """Cumulative counts at each of ``bounds`` (each must be one of ``self.bounds``), then +Inf."""
        running, out, pos = 0, [], 0
        for bound in bounds:
            while pos < len(self.bounds) and self.bounds[pos] <= bound:
                running += self.counts[pos]
                pos += 1
            out.append(running)
        out.append(self.count)
        return out


class Histogram:
    """A mutable histogram over fixed bounds (observe ``value`` ``n`` times at once)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self.bounds, tuple(self.counts), self.sum, self.count)


HISTOGRAMS: dict[str, tuple[float, ...]] = {
    "time_to_first_token_seconds": buckets.union(buckets.TTFT_SECONDS, buckets.SGLANG_TTFT),
    "inter_token_latency_seconds": buckets.union(buckets.ITL_SECONDS, buckets.SGLANG_ITL),
    "request_time_per_output_token_seconds": buckets.ITL_SECONDS,
    "e2e_request_latency_seconds": buckets.union(buckets.REQUEST_LATENCY_SECONDS, buckets.SGLANG_E2E),
    "request_queue_time_seconds": buckets.union(buckets.REQUEST_LATENCY_SECONDS, buckets.SGLANG_QUEUE),
    "request_inference_time_seconds": buckets.REQUEST_LATENCY_SECONDS,
    "request_prefill_time_seconds": buckets.REQUEST_LATENCY_SECONDS,
    "request_decode_time_seconds": buckets.REQUEST_LATENCY_SECONDS,
    # vllm:iteration_tokens_total, one observation per step, as each generation counts a step's tokens:
    # V1 >= 0.33 (computed prompt tokens + generated tokens; only steps that produced a token), V1 0.8-0.10
    # (full prompt tokens + generated tokens; same steps) and V0 (scheduled tokens + one per finished prefill,
    # every step). The prompt counts when the request's first token comes, not chunk by chunk.
    "iteration_tokens": buckets.ITERATION_TOKENS_UNION,
    "iteration_tokens_full_prompt": buckets.ITERATION_TOKENS_UNION,
    "iteration_tokens_v0": buckets.ITERATION_TOKENS_UNION,
    "request_prompt_tokens": buckets.REQUEST_TOKENS,
    "request_generation_tokens": buckets.REQUEST_TOKENS,
    "request_max_num_generation_tokens": buckets.REQUEST_TOKENS,
    "request_params_max_tokens": buckets.REQUEST_TOKENS,
    "request_prefill_kv_computed_tokens": buckets.REQUEST_TOKENS,
    "request_params_n": buckets.PARAMS_N,
    "request_num_preemptions": buckets.NUM_PREEMPTIONS,
}


@dataclass(frozen=True)
class EngineSnapshot:
    """The state of one data-parallel engine at ``time``: everything vLLM's /metrics shows."""

    engine: int
    time: float
    kv_usage: float  # 1 - free/(num_gpu_blocks - 1), cached-but-evictable blocks counted free
    used_blocks: int
    num_gpu_blocks: int
    block_size: int
    num_running: int
    num_waiting: int
    preemptions_total: int
    finished_by_reason: MappingProxyType[str, int]
    prompt_tokens_total: int
    prompt_tokens_cached_total: int
    generation_tokens_total: int
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    prefix_cache_queries_blocks: int
    prefix_cache_hits_blocks: int
    histograms: MappingProxyType[str, HistogramSnapshot]
    requests_admitted_total: int
    requests_rejected_total: int  # longer than max_model_len or the whole cache: vLLM answers 400
    running_tokens: int  # tokens (prompt + generated) of running requests: KV demand without block rounding
    started_at: float = 0.0  # simulated time of the engine's last (re)start

    @property
    def requests_completed(self) -> int:
        return sum(self.finished_by_reason.values())

    @property
    def num_waiting_capacity(self) -> int:
        return self.num_waiting  # every simulated wait is for scheduling capacity (no LoRA / KV transfer)

    @property
    def request_prompt_tokens_sum(self) -> float:
        return self.histograms["request_prompt_tokens"].sum

    @property
    def request_prompt_tokens_count(self) -> int:
        return self.histograms["request_prompt_tokens"].count

    @property
    def request_generation_tokens_sum(self) -> float:
        return self.histograms["request_generation_tokens"].sum

    @property
    def request_generation_tokens_count(self) -> int:
        return self.histograms["request_generation_tokens"].count


class EngineStats:
    """The counters and histograms of one engine since its last (re)start."""

    def __init__(self) -> None:
        self.preemptions_total = 0
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.prompt_tokens_total = 0
        self.prompt_tokens_cached_total = 0  # prompt tokens served from the prefix cache at first scheduling
        self.generation_tokens_total = 0
        self.pc_queries_tokens = self.pc_hits_tokens = 0
        self.pc_queries_blocks = self.pc_hits_blocks = 0
        self.admitted_total = 0
        self.rejected_total = 0
        self.hist = {name: Histogram(bounds) for name, bounds in HISTOGRAMS.items()}

    def prefix_query(self, tokens: int, hit_tokens: int, blocks: int, hit_blocks: int) -> None:
        """One admission's prefix-cache lookup, in tokens (V1's counters) and in blocks (0.8's and V0's)."""
        self.pc_queries_tokens += tokens
        self.pc_hits_tokens += hit_tokens
        self.pc_queries_blocks += blocks
        self.pc_hits_blocks += hit_blocks

    def request_finished(self, *, reason: str, arrival: float, first_scheduled: float, first_token: float,
                         end: float, prompt: int, generated: int, max_tokens: int, prefill_kv_computed: int,
                         num_preemptions: int) -> None:
        """A request's per-request histograms, observed when it finishes at ``end``, as vLLM does."""
        self.finished[reason] += 1
        h = self.hist
        decode_time = end - first_token
        h["e2e_request_latency_seconds"].observe(end - arrival)
        h["request_queue_time_seconds"].observe(first_scheduled - arrival)
        h["request_inference_time_seconds"].observe(end - first_scheduled)
        h["request_prefill_time_seconds"].observe(first_token - first_scheduled)
        h["request_decode_time_seconds"].observe(decode_time)
        # vLLM's mean_time_per_output_token: 0 for a request with a single output token.
        h["request_time_per_output_token_seconds"].observe(decode_time / (generated - 1) if generated > 1 else 0.0)
        h["request_prompt_tokens"].observe(prompt)
        h["request_generation_tokens"].observe(generated)
        h["request_max_num_generation_tokens"].observe(max_tokens)
        h["request_params_max_tokens"].observe(max_tokens)
        h["request_params_n"].observe(1)
        h["request_prefill_kv_computed_tokens"].observe(prefill_kv_computed)
        h["request_num_preemptions"].observe(num_preemptions)

    def snapshot(self, *, engine: int, time: float, used_blocks: int, usable_blocks: int, num_gpu_blocks: int,
                 block_size: int, num_running: int, num_waiting: int, running_tokens: int,
                 started_at: float) -> EngineSnapshot:
        """These statistics, frozen, with the scheduler's and the block pool's state at ``time``."""
        return EngineSnapshot(
            engine=engine,
            time=time,
            kv_usage=used_blocks / usable_blocks,
            used_blocks=used_blocks,
            num_gpu_blocks=num_gpu_blocks,
            block_size=block_size,
            num_running=num_running,
            num_waiting=num_waiting,
            preemptions_total=self.preemptions_total,
            finished_by_reason=MappingProxyType(dict(self.finished)),
            prompt_tokens_total=self.prompt_tokens_total,
            prompt_tokens_cached_total=self.prompt_tokens_cached_total,
            generation_tokens_total=self.generation_tokens_total,
            prefix_cache_queries_tokens=self.pc_queries_tokens,
            prefix_cache_hits_tokens=self.pc_hits_tokens,
            prefix_cache_queries_blocks=self.pc_queries_blocks,
            prefix_cache_hits_blocks=self.pc_hits_blocks,
            histograms=MappingProxyType({name: h.snapshot() for name, h in self.hist.items()}),
            requests_admitted_total=self.admitted_total,
            requests_rejected_total=self.rejected_total,
            running_tokens=running_tokens,
            started_at=started_at,
        )
