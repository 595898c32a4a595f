"""A discrete-event model of vLLM V1's scheduler and paged KV cache (pure: no clock, no I/O).

What is modelled (see docs/simulator.md for the assumptions and limits):

* A block pool of ``num_gpu_blocks`` blocks of ``block_size`` tokens, one of them the null block, so
  usage is ``1 - free / (num_gpu_blocks - 1)`` as ``vllm:kv_cache_usage_perc`` reports it. A request
  holds blocks for the tokens whose KV has been computed (``ceil(num_computed / block_size)``).
* The V1 ``schedule()`` loop: running requests first (each gets its remaining tokens, capped by the
  ``max_num_batched_tokens`` budget, i.e. chunked prefill), then FCFS admission from the waiting queue
  while ``max_num_seqs`` and the budget allow and the blocks fit; no admission in a step that preempted.
* Preemption by recompute: when a running request cannot get its next block, the most recently admitted
  running request is evicted, its blocks freed and its computed tokens forgotten; it goes back to the
  front of the waiting queue (its generated tokens are kept and recomputed with the prompt).
* Optional prefix caching keyed on the trace's ``hash_ids``: computed full prompt blocks are shared;
  blocks no request holds stay cached but evictable, and count as free, as in vLLM.
* A step-time model ``fixed + per_prefill_token * prefill + per_decode_token * decode`` from which
  every latency histogram follows.

Speed without approximation: when every running request is decoding and nothing can be admitted, the
steps up to the next event (a completion, a step that would run out of blocks, or the caller's next
time boundary) are applied in one batch; the result is identical to stepping one by one.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from kvwatch.sim import buckets

FINISH_REASONS = ("stop", "length", "abort")


@dataclass(frozen=True)
class StepTimeModel:
    """Duration of one engine step. Defaults: plausible for an 8B model in bf16 on one H100."""

    fixed_seconds: float = 0.006  # scheduler + launch overhead + weight reads of a small batch
    per_decode_token_seconds: float = 0.00012  # batch 100 decodes in ~18 ms
    per_prefill_token_seconds: float = 0.00006  # ~16k prompt tokens/s

    def __post_init__(self) -> None:
        if not all(math.isfinite(x) for x in (self.fixed_seconds, self.per_decode_token_seconds,
                                              self.per_prefill_token_seconds)):
            raise ValueError("StepTimeModel times must be finite")
        if self.fixed_seconds <= 0:
            raise ValueError("StepTimeModel.fixed_seconds must be > 0")
        if self.per_decode_token_seconds < 0 or self.per_prefill_token_seconds < 0:
            raise ValueError("StepTimeModel per-token costs must be >= 0")

    def duration(self, prefill_tokens: int, decode_tokens: int) -> float:
        return (self.fixed_seconds + self.per_prefill_token_seconds * prefill_tokens
                + self.per_decode_token_seconds * decode_tokens)


@dataclass(frozen=True)
class EngineConfig:
    """What ``vllm serve`` would be started with (per data-parallel engine, except DP size itself)."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    data_parallel_size: int = 1
    enable_prefix_caching: bool = False
    step: StepTimeModel = field(default_factory=StepTimeModel)
    # Longest prompt+output accepted (vLLM's --max-model-len); None: only what fits in the cache.
    max_model_len: int | None = None
    # Token span of one trace hash id (Mooncake: 512); prefix blocks are keyed (hash_id, sub-block).
    hash_block_tokens: int = 512

    def __post_init__(self) -> None:
        checks = {
            "num_gpu_blocks": self.num_gpu_blocks >= 2,
            "block_size": self.block_size >= 1,
            "max_num_seqs": self.max_num_seqs >= 1,
            "max_num_batched_tokens": self.max_num_batched_tokens >= 1,
            "data_parallel_size": self.data_parallel_size >= 1,
            "hash_block_tokens": self.hash_block_tokens >= 1,
            "max_model_len": self.max_model_len is None or self.max_model_len >= 2,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"EngineConfig.{name} has an invalid value {getattr(self, name)!r}")

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can hold: one block of the pool is vLLM's reserved null block."""
        return self.num_gpu_blocks - 1


@dataclass(frozen=True)
class Request:
    """One request as a trace or a load profile describes it."""

    arrival_time: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    finish_reason: str = "stop"  # what vLLM reports when it ends: "stop" (EOS) or "length" (max_tokens)

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("Request needs prompt_tokens >= 1 and output_tokens >= 1")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Request.finish_reason must be one of {FINISH_REASONS}")


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


class _Histogram:
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
    "time_to_first_token_seconds": buckets.TTFT_SECONDS,
    "inter_token_latency_seconds": buckets.ITL_SECONDS,
    "request_time_per_output_token_seconds": buckets.ITL_SECONDS,
    "e2e_request_latency_seconds": buckets.REQUEST_LATENCY_SECONDS,
    "request_queue_time_seconds": buckets.REQUEST_LATENCY_SECONDS,
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


class _Req:
    """Mutable per-request state inside one engine."""

    __slots__ = ("arrival", "computed", "first_scheduled", "first_token", "generated", "held", "keys",
                 "last_token", "max_tokens", "num_preemptions", "output", "prefill_kv_computed", "prefix_keys",
                 "prompt", "reason", "registered")

    def __init__(self, request: Request, prefix_keys: tuple) -> None:
        self.arrival = request.arrival_time
        self.prompt = request.prompt_tokens
        self.output = request.output_tokens
        self.reason = request.finish_reason
        self.max_tokens = request.output_tokens
        self.prefix_keys = prefix_keys  # cache key per full prompt block (empty without prefix caching)
        self.computed = 0  # tokens whose KV is computed
        self.generated = 0
        self.held = 0  # blocks held, including shared prefix blocks
        self.keys: list = []  # prefix-cache keys among the held blocks (each holds one reference)
        self.registered = 0  # leading prompt blocks already offered to the prefix cache
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token = 0.0
        self.num_preemptions = 0
        self.prefill_kv_computed = 0


class EngineCore:
    """One vLLM engine core (one data-parallel rank): scheduler, block pool, metrics state."""

    def __init__(self, config: EngineConfig, index: int = 0, *, batch_decode: bool = True) -> None:
        self.config = config
        self.index = index
        self.batch_decode = batch_decode  # False: step one by one (the reference the batching must equal)
        self.now = 0.0  # when the next step can start
        self.started_at = 0.0  # simulated time of the last (re)start
        self._reset_state()

    def _reset_state(self) -> None:
        self.running: list[_Req] = []
        self.waiting: deque[_Req] = deque()
        self.free_plain = self.config.usable_blocks  # free blocks that hold no cached prefix
        self.cache_refs: dict = {}  # prefix key -> number of running requests holding it
        self.evictable: OrderedDict = OrderedDict()  # cached keys no request holds, LRU first
        self.preemptions_total = 0
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.prompt_tokens_total = 0
        self.prompt_tokens_cached_total = 0  # prompt tokens served from the prefix cache at first scheduling
        self.generation_tokens_total = 0
        self.pc_queries_tokens = self.pc_hits_tokens = 0
        self.pc_queries_blocks = self.pc_hits_blocks = 0
        self.admitted_total = 0
        self.rejected_total = 0
        self.hist = {name: _Histogram(bounds) for name, bounds in HISTOGRAMS.items()}

    # ------------------------------------------------------------------ blocks

    @property
    def free_blocks(self) -> int:
        return self.free_plain + len(self.evictable)

    def _allocate(self, n: int) -> None:
        """Take ``n`` blocks: never-cached ones first, then evict least recently used cached blocks."""
        take = min(n, self.free_plain)
        self.free_plain -= take
        for _ in range(n - take):
            key, _ = self.evictable.popitem(last=False)
            del self.cache_refs[key]

    def _free(self, req: _Req) -> None:
        # Reverse order, as vLLM frees: a prefix's tail blocks are evicted before its head.
        for key in reversed(req.keys):
            refs = self.cache_refs[key] - 1
            self.cache_refs[key] = refs
            if refs == 0:
                self.evictable[key] = None
        self.free_plain += req.held - len(req.keys)
        req.held = 0
        req.keys = []

    def _register_prefix(self, req: _Req) -> None:
        """Prompt blocks that just became full become shareable (only then, as vLLM caches full blocks)."""
        full = min(req.computed // self.config.block_size, len(req.prefix_keys))
        for i in range(req.registered, full):
            key = req.prefix_keys[i]
            if key not in self.cache_refs:  # else computed twice concurrently: this copy stays private
                self.cache_refs[key] = 1
                req.keys.append(key)
        req.registered = max(req.registered, full)

    def _prefix_hits(self, req: _Req) -> int:
        """Leading prompt blocks already cached; the last prompt token is always recomputed."""
        limit = min(len(req.prefix_keys), (req.prompt + req.generated - 1) // self.config.block_size)
        hits = 0
        while hits < limit and req.prefix_keys[hits] in self.cache_refs:
            hits += 1
        return hits

    # ------------------------------------------------------------------ requests

    def fits_ever(self, request: Request) -> bool:
        total = request.prompt_tokens + request.output_tokens
        if self.config.max_model_len is not None and total > self.config.max_model_len:
            return False
        return -(-total // self.config.block_size) <= self.config.usable_blocks

    def add(self, request: Request) -> None:
        """A request reaches this engine (the caller has advanced it to ``arrival_time``)."""
        if not self.fits_ever(request):
            self.rejected_total += 1
            return
        keys: tuple = ()
        if self.config.enable_prefix_caching and request.hash_ids:
            keys = _prefix_keys(request, self.config.block_size, self.config.hash_block_tokens)
        self.waiting.append(_Req(request, keys))
        self.now = max(self.now, request.arrival_time)

    def load_score(self) -> int:
        """vLLM's DP load balancer score: waiting requests weigh four times running ones."""
        return 4 * len(self.waiting) + len(self.running)

    # ------------------------------------------------------------------ stepping

    def advance_to(self, t: float) -> None:
        """Run every step that starts before ``t``; an idle engine jumps to ``t``."""
        while self.now < t:
            if not self.running and not self.waiting:
                self.now = t
                return
            if not (self.batch_decode and self._decode_batch(t)):
                self._step()

    def _head_admissible(self, budget: int) -> bool:
        if not self.waiting or len(self.running) >= self.config.max_num_seqs or budget <= 0:
            return False
        req = self.waiting[0]
        hits = self._prefix_hits(req) if req.prefix_keys else 0
        computed = hits * self.config.block_size
        new = min(req.prompt + req.generated - computed, budget)
        need = -(-(computed + new) // self.config.block_size) - hits
        touched = sum(1 for k in req.prefix_keys[:hits] if k in self.evictable)
        return need + touched <= self.free_blocks

    def _decode_batch(self, t: float) -> bool:
        """Apply k identical decode-only steps at once when nothing else can happen; False if not possible."""
        running = self.running
        n = len(running)
        if n == 0 or n > self.config.max_num_batched_tokens:
            return False
        steps_left = None
        for r in running:
            if r.computed != r.prompt + r.generated - 1 or r.generated == 0:
                return False  # someone is prefilling
            left = r.output - r.generated
            if steps_left is None or left < steps_left:
                steps_left = left
        if self._head_admissible(self.config.max_num_batched_tokens - n):
            return False
        dt = self.config.step.duration(0, n)
        k = min(steps_left, max(1, int(-(-(t - self.now) // dt))))
        if k <= 1:
            return False
        bs = self.config.block_size
        free = self.free_blocks
        if self.waiting and self.evictable:
            # Evicting a cached block can make the waiting head admissible (fewer prefix hits to pin), so
            # batch only the steps that take never-cached blocks.
            free = self.free_plain

        def need(steps: int) -> int:
            return sum(-(-(r.computed + steps) // bs) - r.held for r in running)

        if need(k) > free:
            lo, hi = 0, k  # need(lo) <= free < need(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if need(mid) <= free:
                    lo = mid
                else:
                    hi = mid
            k = lo
            if k <= 1:
                return False
        self._allocate(need(k))
        start = self.now
        end = start + k * dt
        itl = self.hist["inter_token_latency_seconds"]
        for r in running:
            r.computed += k
            r.held = -(-r.computed // bs)
            r.generated += k
            itl.observe(start + dt - r.last_token)
            itl.observe(dt, k - 1)
            r.last_token = end
        self.generation_tokens_total += k * n
        for name in ("iteration_tokens", "iteration_tokens_full_prompt", "iteration_tokens_v0"):
            self.hist[name].observe(n, k)
        self.now = end
        if steps_left == k:
            self._finish_done(end)
        return True

    def _step(self) -> None:
        """One ``schedule()`` + model step + ``update_from_output()`` of vLLM V1."""
        cfg = self.config
        bs = cfg.block_size
        budget = cfg.max_num_batched_tokens
        running = self.running
        scheduled: list[tuple[_Req, int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            new = min(req.prompt + req.generated - req.computed, budget)
            need = -(-(req.computed + new) // bs) - req.held
            while need > self.free_blocks:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                self._allocate(need)
                req.held += need
                scheduled.append((req, new))
                budget -= new
                i += 1
                continue
            break  # the request itself was preempted: nothing after it is scheduled
        if not preempted:
            while self.waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                req = self.waiting[0]
                hits = self._prefix_hits(req) if req.prefix_keys else 0
                computed = hits * bs
                new = min(req.prompt + req.generated - computed, budget)
                need = -(-(computed + new) // bs) - hits
                hit_keys = req.prefix_keys[:hits]
                touched = sum(1 for k in hit_keys if k in self.evictable)
                if need + touched > self.free_blocks:
                    break  # FCFS: the head blocks the queue
                self.waiting.popleft()
                for key in hit_keys:
                    if key in self.evictable:
                        del self.evictable[key]
                    self.cache_refs[key] = self.cache_refs.get(key, 0) + 1
                self._allocate(need)
                req.keys = list(hit_keys)
                req.registered = hits
                req.held = hits + need
                req.computed = computed
                if req.prefix_keys or cfg.enable_prefix_caching:
                    self.pc_queries_tokens += req.prompt + req.generated
                    self.pc_hits_tokens += computed
                    self.pc_queries_blocks += (req.prompt + req.generated) // bs
                    self.pc_hits_blocks += hits
                if req.first_scheduled is None:
                    req.first_scheduled = self.now
                    req.prefill_kv_computed = req.prompt - computed
                    self.admitted_total += 1
                running.append(req)
                scheduled.append((req, new))
                budget -= new
        if not scheduled:
            # Nothing fits and nothing runs (cannot happen for requests that passed fits_ever); idle a step.
            self.now += cfg.step.fixed_seconds
            return
        prefill = decode = 0
        decoding = []
        for req, new in scheduled:
            is_decode = new == 1 and req.generated > 0 and req.computed == req.prompt + req.generated - 1
            decoding.append(is_decode)
            if is_decode:
                decode += 1
            else:
                prefill += new
        end = self.now + cfg.step.duration(prefill, decode)
        done = False
        itl = self.hist["inter_token_latency_seconds"]
        generated = prefills_done = first_prompts = first_prompts_computed = 0
        for (req, new), is_decode in zip(scheduled, decoding, strict=True):
            req.computed += new
            if req.prefix_keys:
                self._register_prefix(req)
            if req.computed < req.prompt + req.generated:
                continue  # a prefill chunk: no token yet
            req.generated += 1
            self.generation_tokens_total += 1
            generated += 1
            prefills_done += not is_decode
            if req.first_token is None:
                req.first_token = end
                self.prompt_tokens_total += req.prompt
                self.prompt_tokens_cached_total += req.prompt - req.prefill_kv_computed
                first_prompts += req.prompt
                first_prompts_computed += req.prefill_kv_computed
                self.hist["time_to_first_token_seconds"].observe(end - req.arrival)
            else:
                itl.observe(end - req.last_token)
            req.last_token = end
            if req.generated >= req.output:
                done = True
        self.hist["iteration_tokens_v0"].observe(prefill + decode + prefills_done)
        if generated:  # vLLM V1 records iteration stats only for steps whose output has tokens
            self.hist["iteration_tokens"].observe(first_prompts_computed + generated)
            self.hist["iteration_tokens_full_prompt"].observe(first_prompts + generated)
        self.now = end
        if done:
            self._finish_done(end)

    def _preempt(self, req: _Req) -> None:
        self._free(req)
        req.computed = 0
        req.num_preemptions += 1
        self.preemptions_total += 1
        self.waiting.appendleft(req)

    def _finish_done(self, end: float) -> None:
        keep: list[_Req] = []
        h = self.hist
        for req in self.running:
            if req.generated < req.output:
                keep.append(req)
                continue
            self._free(req)
            self.finished[req.reason] += 1
            first_scheduled = req.first_scheduled if req.first_scheduled is not None else req.arrival
            first_token = req.first_token if req.first_token is not None else end
            decode_time = end - first_token
            h["e2e_request_latency_seconds"].observe(end - req.arrival)
            h["request_queue_time_seconds"].observe(first_scheduled - req.arrival)
            h["request_inference_time_seconds"].observe(end - first_scheduled)
            h["request_prefill_time_seconds"].observe(first_token - first_scheduled)
            h["request_decode_time_seconds"].observe(decode_time)
            # vLLM's mean_time_per_output_token: 0 for a request with a single output token.
            h["request_time_per_output_token_seconds"].observe(
                decode_time / (req.generated - 1) if req.generated > 1 else 0.0)
            h["request_prompt_tokens"].observe(req.prompt)
            h["request_generation_tokens"].observe(req.generated)
            h["request_max_num_generation_tokens"].observe(req.max_tokens)
            h["request_params_max_tokens"].observe(req.max_tokens)
            h["request_params_n"].observe(1)
            h["request_prefill_kv_computed_tokens"].observe(req.prefill_kv_computed)
            h["request_num_preemptions"].observe(req.num_preemptions)
        self.running = keep

    # ------------------------------------------------------------------ observation

    def snapshot(self) -> EngineSnapshot:
        used = self.config.usable_blocks - self.free_blocks
        return EngineSnapshot(
            engine=self.index,
            time=self.now,
            kv_usage=used / self.config.usable_blocks,
            used_blocks=used,
            num_gpu_blocks=self.config.num_gpu_blocks,
            block_size=self.config.block_size,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
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
            running_tokens=sum(r.prompt + r.generated for r in self.running),
            started_at=self.started_at,
        )

    def restart(self) -> None:
        """A process restart: in-flight work is lost, counters and histograms start from zero."""
        self.started_at = self.now
        self._reset_state()


def _prefix_keys(request: Request, block_size: int, hash_block_tokens: int) -> tuple:
    """Cache key of each full prompt block: the trace's prefix hash covering it and the offset inside it.

    Mooncake's ``hash_ids`` are prefix hashes (same id means same prefix up to there), so the pair
    identifies a block's content and its whole prefix, like vLLM's chained block hash.
    """
    keys = []
    for i in range(request.prompt_tokens // block_size):
        start = i * block_size
        h = start // hash_block_tokens
        if h >= len(request.hash_ids):
            break
        keys.append((request.hash_ids[h], start % hash_block_tokens))
    return tuple(keys)


class Simulator:
    """Several data-parallel engines behind one endpoint, fed by timed requests."""

    def __init__(self, config: EngineConfig, seed: int = 0, *, batch_decode: bool = True) -> None:
        self.config = config
        self.seed = seed
        self._rng = random.Random(seed)  # breaks load-balancer ties deterministically
        self.engines = [EngineCore(config, i, batch_decode=batch_decode) for i in range(config.data_parallel_size)]
        self._pending: list[Request] = []  # sorted by arrival time, consumed from _next
        self._next = 0
        self.time = 0.0

    def submit(self, requests: Iterable[Request]) -> None:
        """Queue future arrivals (any order; each arrives at its ``arrival_time``)."""
        new = sorted(requests, key=lambda r: r.arrival_time)
        if not new:
            return
        if new[0].arrival_time < self.time:
            raise ValueError(f"request arrives at {new[0].arrival_time} before the simulated time {self.time}")
        rest = self._pending[self._next:]
        if rest and new[0].arrival_time < rest[-1].arrival_time:
            self._pending = sorted(rest + new, key=lambda r: r.arrival_time)
        else:
            self._pending = rest + new
        self._next = 0

    @property
    def pending(self) -> int:
        return len(self._pending) - self._next

    def run_until(self, t: float) -> None:
        """Advance simulated time to ``t``, delivering every arrival with ``arrival_time <= t``."""
        if t < self.time:
            raise ValueError(f"cannot run back in time from {self.time} to {t}")
        pending, engines = self._pending, self.engines
        while self._next < len(pending) and pending[self._next].arrival_time <= t:
            request = pending[self._next]
            self._next += 1
            for engine in engines:
                engine.advance_to(request.arrival_time)
            self._route(request).add(request)
        if self._next > 4096:  # drop consumed arrivals now and then
            del pending[: self._next]
            self._next = 0
        for engine in engines:
            engine.advance_to(t)
        self.time = t

    def _route(self, request: Request) -> EngineCore:
        if len(self.engines) == 1:
            return self.engines[0]
        scores = [e.load_score() for e in self.engines]
        best = min(scores)
        choices = [e for e, s in zip(self.engines, scores, strict=True) if s == best]
        return choices[0] if len(choices) == 1 else self._rng.choice(choices)

    def snapshot(self) -> tuple[EngineSnapshot, ...]:
        snaps = tuple(e.snapshot() for e in self.engines)
        # Engines may have finished a step slightly past the requested time; report the wall of the clock.
        return tuple(_at(s, self.time) for s in snaps)

    def restart(self) -> None:
        """Restart every engine (e.g. a pod restart): drops in-flight work, resets counters and histograms."""
        for engine in self.engines:
            engine.restart()


def _at(snap: EngineSnapshot, t: float) -> EngineSnapshot:
    from dataclasses import replace

    return replace(snap, time=t)
