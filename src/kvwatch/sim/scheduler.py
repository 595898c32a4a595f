"""One simulated vLLM V1 engine core: its ``schedule()`` loop, preemption and step timing (pure).

* The V1 ``schedule()`` loop: running requests first (each gets its remaining tokens, capped by the
  ``max_num_batched_tokens`` budget, i.e. chunked prefill), then FCFS admission from the waiting queue
  while ``max_num_seqs`` and the budget allow and the blocks fit; no admission in a step that preempted.
* Preemption by recompute: when a running request cannot get its next block, the most recently admitted
  running request is evicted, its blocks freed and its computed tokens forgotten; it goes back to the
  front of the waiting queue (its generated tokens are kept and recomputed with the prompt).
* Speed without approximation: when every running request is decoding and nothing can be admitted, the
  steps up to the next event (a completion, a step that would run out of blocks, or the caller's next
  time boundary) are applied in one batch; the result is identical to stepping one by one.

Blocks live in :class:`kvwatch.sim.blocks.BlockPool`, counters and histograms in
:class:`kvwatch.sim.stats.EngineStats`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

from kvwatch.sim.blocks import BlockPool, prefix_keys
from kvwatch.sim.config import EngineConfig, Request
from kvwatch.sim.stats import EngineSnapshot, EngineStats


class RequestState:
    """Mutable per-request state inside one engine."""

    __slots__ = ("arrival", "computed", "first_scheduled", "first_token", "generated", "held", "keys",
                 "last_token", "max_tokens", "num_preemptions", "output", "prefill_kv_computed", "prefix_keys",
                 "prompt", "reason", "registered")

    def __init__(self, request: Request, keys: Sequence[Hashable]) -> None:
        self.arrival = request.arrival_time
        self.prompt = request.prompt_tokens
        self.output = request.output_tokens
        self.reason = request.finish_reason
        self.max_tokens = request.output_tokens
        self.prefix_keys = keys  # cache key per full prompt block (empty without prefix caching)
        self.computed = 0  # tokens whose KV is computed
        self.generated = 0
        self.held = 0  # blocks held, including shared prefix blocks
        self.keys: list[Hashable] = []  # prefix-cache keys among the held blocks (each holds one reference)
        self.registered = 0  # leading prompt blocks already offered to the prefix cache
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token = 0.0
        self.num_preemptions = 0
        self.prefill_kv_computed = 0


class EngineCore:
    """One vLLM engine core (one data-parallel rank): the scheduler over a block pool, keeping statistics."""

    def __init__(self, config: EngineConfig, index: int = 0, *, batch_decode: bool = True) -> None:
        self.config = config
        self.index = index
        self.batch_decode = batch_decode  # False: step one by one (the reference the batching must equal)
        self.now = 0.0  # when the next step can start
        self.started_at = 0.0  # simulated time of the last (re)start
        self._reset_state()

    def _reset_state(self) -> None:
        self.running: list[RequestState] = []
        self.waiting: deque[RequestState] = deque()
        self.blocks = BlockPool(self.config.usable_blocks, self.config.block_size)
        self.stats = EngineStats()

    # ------------------------------------------------------------------ requests

    def fits_ever(self, request: Request) -> bool:
        total = request.prompt_tokens + request.output_tokens
        if self.config.max_model_len is not None and total > self.config.max_model_len:
            return False
        return -(-total // self.config.block_size) <= self.config.usable_blocks

    def add(self, request: Request) -> None:
        """A request reaches this engine (the caller has advanced it to ``arrival_time``)."""
        if not self.fits_ever(request):
            self.stats.rejected_total += 1
            return
        keys: tuple = ()
        if self.config.enable_prefix_caching and request.hash_ids:
            keys = prefix_keys(request, self.config.block_size, self.config.hash_block_tokens)
        self.waiting.append(RequestState(request, keys))
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
        blocks = self.blocks
        req = self.waiting[0]
        hits = blocks.prefix_hits(req) if req.prefix_keys else 0
        computed = hits * self.config.block_size
        new = min(req.prompt + req.generated - computed, budget)
        need = -(-(computed + new) // self.config.block_size) - hits
        touched = blocks.evictable_among(req.prefix_keys[:hits])
        return need + touched <= blocks.free_blocks

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
        blocks = self.blocks
        free = blocks.free_blocks
        if self.waiting and blocks.evictable:
            # Evicting a cached block can make the waiting head admissible (fewer prefix hits to pin), so
            # batch only the steps that take never-cached blocks.
            free = blocks.free_plain

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
        blocks.allocate(need(k))
        start = self.now
        end = start + k * dt
        stats = self.stats
        itl = stats.hist["inter_token_latency_seconds"]
        for r in running:
            r.computed += k
            r.held = -(-r.computed // bs)
            r.generated += k
            itl.observe(start + dt - r.last_token)
            itl.observe(dt, k - 1)
            r.last_token = end
        stats.generation_tokens_total += k * n
        for name in ("iteration_tokens", "iteration_tokens_full_prompt", "iteration_tokens_v0"):
            stats.hist[name].observe(n, k)
        self.now = end
        if steps_left == k:
            self._finish_done(end)
        return True

    def _step(self) -> None:
        """One ``schedule()`` + model step + ``update_from_output()`` of vLLM V1."""
        cfg = self.config
        bs = cfg.block_size
        blocks, stats = self.blocks, self.stats
        budget = cfg.max_num_batched_tokens
        running = self.running
        scheduled: list[tuple[RequestState, int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            new = min(req.prompt + req.generated - req.computed, budget)
            need = -(-(req.computed + new) // bs) - req.held
            while need > blocks.free_blocks:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                blocks.allocate(need)
                req.held += need
                scheduled.append((req, new))
                budget -= new
                i += 1
                continue
            break  # the request itself was preempted: nothing after it is scheduled
        if not preempted:
            while self.waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                req = self.waiting[0]
                hits = blocks.prefix_hits(req) if req.prefix_keys else 0
                computed = hits * bs
                new = min(req.prompt + req.generated - computed, budget)
                need = -(-(computed + new) // bs) - hits
                hit_keys = req.prefix_keys[:hits]
                if need + blocks.evictable_among(hit_keys) > blocks.free_blocks:
                    break  # FCFS: the head blocks the queue
                self.waiting.popleft()
                blocks.pin(hit_keys)
                blocks.allocate(need)
                req.keys = list(hit_keys)
                req.registered = hits
                req.held = hits + need
                req.computed = computed
                # (a request back after a preemption is vLLM's preempted_* stats, left out of the hit-rate counters:
                # its own surviving blocks made the hit rate look better under pressure)
                if (req.prefix_keys or cfg.enable_prefix_caching) and not req.num_preemptions:
                    stats.prefix_query(req.prompt + req.generated, computed, (req.prompt + req.generated) // bs,
                                       hits)
                if req.first_scheduled is None:
                    req.first_scheduled = self.now
                    req.prefill_kv_computed = req.prompt - computed
                    stats.admitted_total += 1
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
        itl = stats.hist["inter_token_latency_seconds"]
        generated = prefills_done = first_prompts = first_prompts_computed = 0
        for (req, new), is_decode in zip(scheduled, decoding, strict=True):
            req.computed += new
            if req.prefix_keys:
                blocks.register_prefix(req)
            if req.computed < req.prompt + req.generated:
                continue  # a prefill chunk: no token yet
            req.generated += 1
            stats.generation_tokens_total += 1
            generated += 1
            prefills_done += not is_decode
            if req.first_token is None:
                req.first_token = end
                stats.prompt_tokens_total += req.prompt
                stats.prompt_tokens_cached_total += req.prompt - req.prefill_kv_computed
                first_prompts += req.prompt
                first_prompts_computed += req.prefill_kv_computed
                stats.hist["time_to_first_token_seconds"].observe(end - req.arrival)
            else:
                itl.observe(end - req.last_token)
            req.last_token = end
            if req.generated >= req.output:
                done = True
        stats.hist["iteration_tokens_v0"].observe(prefill + decode + prefills_done)
        if generated:  # vLLM V1 records iteration stats only for steps whose output has tokens
            stats.hist["iteration_tokens"].observe(first_prompts_computed + generated)
            stats.hist["iteration_tokens_full_prompt"].observe(first_prompts + generated)
        self.now = end
        if done:
            self._finish_done(end)

    def _preempt(self, req: RequestState) -> None:
        self.blocks.release(req)
        req.computed = 0
        req.num_preemptions += 1
        self.stats.preemptions_total += 1
        self.waiting.appendleft(req)

    def _finish_done(self, end: float) -> None:
        keep: list[RequestState] = []
        for req in self.running:
            if req.generated < req.output:
                keep.append(req)
                continue
            self.blocks.release(req)
            self.stats.request_finished(
                reason=req.reason, arrival=req.arrival,
                first_scheduled=req.first_scheduled if req.first_scheduled is not None else req.arrival,
                first_token=req.first_token if req.first_token is not None else end, end=end,
                prompt=req.prompt, generated=req.generated, max_tokens=req.max_tokens,
                prefill_kv_computed=req.prefill_kv_computed, num_preemptions=req.num_preemptions)
        self.running = keep

    # ------------------------------------------------------------------ observation

    @property
    def free_blocks(self) -> int:
        return self.blocks.free_blocks

    def snapshot(self) -> EngineSnapshot:
        used = self.config.usable_blocks - self.blocks.free_blocks
        return self.stats.snapshot(
            engine=self.index, time=self.now, used_blocks=used, usable_blocks=self.config.usable_blocks,
            num_gpu_blocks=self.config.num_gpu_blocks, block_size=self.config.block_size,
            num_running=len(self.running), num_waiting=len(self.waiting),
            running_tokens=sum(r.prompt + r.generated for r in self.running), started_at=self.started_at)

    def restart(self) -> None:
        """A process restart: in-flight work is lost, counters and histograms start from zero."""
        self.started_at = self.now
        self._reset_state()
