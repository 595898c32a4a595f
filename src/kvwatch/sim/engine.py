"""A discrete-event model of vLLM V1's scheduler and paged KV cache (pure: no clock, no I/O): the facade.

:class:`Simulator` puts ``data_parallel_size`` engines behind one endpoint, routes timed requests to them as
vLLM's DP load balancer does, and advances them to a requested simulated time. What is modelled, and where
(docs/simulator.md gives the assumptions and limits):

* ``config``: what ``vllm serve`` is started with (EngineConfig, the step-time model
  ``fixed + per_prefill_token * prefill + per_decode_token * decode`` from which every latency follows) and
  the requests (Request).
* ``scheduler``: one engine core (EngineCore): V1's ``schedule()`` loop with chunked prefill, FCFS
  admission, preemption by recompute, and exact batching of decode-only steps.
* ``blocks``: the block pool (BlockPool): ``num_gpu_blocks`` blocks, one the null block, so usage is
  ``1 - free / (num_gpu_blocks - 1)`` as ``vllm:kv_cache_usage_perc`` reports it; optional prefix caching.
* ``stats``: the counters and histograms (EngineStats) and the EngineSnapshot the renderer reads.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import replace

from kvwatch.sim.config import FINISH_REASONS, EngineConfig, Request, StepTimeModel
from kvwatch.sim.scheduler import EngineCore
from kvwatch.sim.stats import HISTOGRAMS, EngineSnapshot, HistogramSnapshot

__all__ = ["FINISH_REASONS", "HISTOGRAMS", "EngineConfig", "EngineCore", "EngineSnapshot", "HistogramSnapshot",
           "Request", "Simulator", "StepTimeModel"]


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
    return replace(snap, time=t)
