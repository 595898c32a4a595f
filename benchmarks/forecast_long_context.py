"""Long-context streams the trace simulations lack, through the pure forecaster per version: a cache of a few
hundred thousand tokens holding 2-10 requests of 16k-128k tokens. The figures of the v9 section of
docs/forecasting-history.md come from here.

    .venv/bin/python benchmarks/forecast_long_context.py [--versions v9,v8] [--scenarios hol,gateway,...]

The engine steps once a second: a first-come queue, prefill of 16,000 tokens/s, decode of 25 tokens/s per
request. ``whole_prompt`` admits a request only when its whole prompt fits beside the running ones' unfinished
prompts (vLLM without chunked prefill; SGLang and TensorRT-LLM reserve more); a request that finds no room for its
next tokens preempts the newest one (recomputed from scratch). Polls every 10 s, counters and histograms as vLLM
keeps them. The scorer counts a ``bottleneck`` onset after 10 quiet minutes as an event, and a ``filling``
episode with no onset within an hour as a false alarm.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvwatch.backtest.report import FORECASTERS
from kvwatch.forecast import Forecaster, ForecastParams, ForecastResult, ForecastSample

HOUR = 3600.0


@dataclass
class Request:
    arrival: float
    prompt: int
    output: int
    prefilled: float = 0.0
    generated: float = 0.0

    @property
    def kv(self) -> float:
        return self.prefilled + self.generated


@dataclass
class Engine:
    capacity: float = 400_000.0
    prefill_per_second: float = 16_000.0
    decode_per_second: float = 25.0
    max_seqs: int = 256
    whole_prompt: bool = True
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Request] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def used(self) -> float:
        return sum(r.kv for r in self.running)

    def step(self, now: float) -> None:
        while self.waiting and len(self.running) < self.max_seqs:
            head = self.waiting[0]
            reserved = sum(r.prompt - r.prefilled for r in self.running) if self.whole_prompt else 0.0
            need = head.prompt + 0.01 * self.capacity if self.whole_prompt else 16
            if self.capacity - self.used() - reserved < need:
                break
            self.running.append(self.waiting.popleft())
        budget, done, i = self.prefill_per_second, [], 0
        while i < len(self.running):
            r = self.running[i]
            take = (min(budget, r.prompt - r.prefilled) if r.prefilled < r.prompt
                    else min(self.decode_per_second, r.output - r.generated))
            if take > self.capacity - self.used() + 1e-9:  # no room: preempt the newest, recompute it later
                victim = self.running.pop()
                self.counts["preemptions"] += 1
                victim.prefilled = victim.generated = 0.0
                self.waiting.appendleft(victim)
                continue
            if r.prefilled < r.prompt:
                r.prefilled += take
                budget -= take
                self.counts["prompt_tokens"] += take
            else:
                r.generated += take
                self.counts["generation_tokens"] += take
                if r.generated >= r.output - 1e-9:
                    done.append(r)
            i += 1
        for r in done:
            self.running.remove(r)
            self.counts.update(finished=1, prompt_sum=r.prompt, generation_sum=r.output, e2e_sum=now + 1 - r.arrival)

    def sample(self, now: float) -> ForecastSample:
        c = self.counts
        return ForecastSample(
            timestamp=now, kv_usage=min(1.0, self.used() / self.capacity), capacity_tokens=self.capacity,
            running=float(len(self.running)), waiting=float(len(self.waiting)),
            preemptions_total=float(c["preemptions"]), finished_total=float(c["finished"]),
            prompt_tokens_total=float(c["prompt_tokens"]), generation_tokens_total=float(c["generation_tokens"]),
            request_prompt_tokens_sum=float(c["prompt_sum"]), request_prompt_tokens_count=float(c["finished"]),
            request_generation_tokens_sum=float(c["generation_sum"]),
            request_generation_tokens_count=float(c["finished"]),
            e2e_latency_seconds_sum=float(c["e2e_sum"]), e2e_latency_seconds_count=float(c["finished"]))


Sizes = Callable[[random.Random], tuple[int, int]]


def long_sizes(rng: random.Random) -> tuple[int, int]:
    """Prompts of 16k-128k tokens (log-uniform), outputs of 2k-8k."""
    return int(min(128_000, 16_000 * 2 ** (rng.random() * 3))), rng.randint(2_000, 8_000)


def rate_for(load: float, capacity: float, sizes: Sizes) -> float:
    """Arrivals per second whose mean KV occupancy is ``load`` of ``capacity`` (token-seconds per request)."""
    rng = random.Random(0)
    draws = [sizes(rng) for _ in range(20_000)]
    per_request = sum(p * (o / 25.0) + o * (o / 25.0) / 2 for p, o in draws) / len(draws)
    return load * capacity / per_request


def poisson(rng: random.Random, mean: float) -> int:
    limit, k, product = math.exp(-mean), 0, 1.0
    while True:
        product *= rng.random()
        if product <= limit:
            return k
        k += 1


def simulate(engine: Engine, seconds: float, arrivals: Callable[[float, random.Random], list[Request]],
             seed: int) -> list[ForecastSample]:
    rng, polls = random.Random(seed), []
    for s in range(int(seconds)):
        engine.waiting.extend(arrivals(float(s), rng))
        engine.step(float(s))
        if s % 10 == 0:
            polls.append(engine.sample(float(s)))
    return polls


def poisson_arrivals(rate: Callable[[float], float], sizes: Sizes) -> Callable[[float, random.Random], list[Request]]:
    return lambda t, rng: [Request(t, *sizes(rng)) for _ in range(poisson(rng, rate(t)))]


def hol() -> list[ForecastSample]:
    """Prompts of 110k in a 400k cache (3 fit, the 4th does not), arrivals at 1.3x the throughput from 60 min."""
    throughput = 3 / (4000 / 25 + 7)
    return simulate(Engine(), 4 * HOUR, lambda t, rng: [Request(t, 110_000, 4_000)] if rng.random() < throughput * (
        0.5 if t < HOUR else 1.3) else [], seed=3)


def gateway() -> list[ForecastSample]:
    """A gateway keeps 5 requests of 66k-72k prompt in flight (its queue is outside vLLM): a steady 0.88."""
    engine = Engine(max_seqs=5)

    def top_up(t: float, rng: random.Random) -> list[Request]:
        missing = 5 - len(engine.running) - len(engine.waiting)
        return [Request(t, rng.randint(66_000, 72_000), rng.randint(3_000, 5_000)) for _ in range(missing)]
    return simulate(engine, 5 * HOUR, top_up, seed=18)


def tiny_cache() -> list[ForecastSample]:
    """A 160k cache holding 2-4 requests of 32k-64k, mean load 0.45."""
    def sizes(rng: random.Random) -> tuple[int, int]:
        return rng.choice([32_000, 48_000, 64_000]), rng.randint(2_000, 6_000)
    rate = rate_for(0.45, 160_000, sizes)
    return simulate(Engine(capacity=160_000), 5 * HOUR, poisson_arrivals(lambda t: rate, sizes), seed=16)


def steady_05() -> list[ForecastSample]:
    """Steady mean load 0.5 with 16k-128k prompts in a 400k cache (about 7 requests)."""
    rate = rate_for(0.5, 400_000, long_sizes)
    return simulate(Engine(), 5 * HOUR, poisson_arrivals(lambda t: rate, long_sizes), seed=11)


SCENARIOS: dict[str, Callable[[], list[ForecastSample]]] = {
    "hol": hol, "gateway": gateway, "tiny_cache": tiny_cache, "steady_05": steady_05}


def score(results: list[ForecastResult], quiet: float = 600.0, window: float = HOUR) -> dict[str, object]:
    """States, bottleneck onsets, filling minutes and false alarms (filling episodes no onset follows within an
    hour)."""
    onsets, fills, last, was_b, was_f, filling = [], [], None, False, False, 0.0
    for i, r in enumerate(results):
        b, f = r.state == "bottleneck", r.state == "filling"
        if b and not was_b and (last is None or r.timestamp - last >= quiet):
            onsets.append(r.timestamp)
        if b:
            last = r.timestamp
        if f and not was_f:
            fills.append(r.timestamp)
        if f and i:
            filling += r.timestamp - results[i - 1].timestamp
        was_b, was_f = b, f
    false = [s for s in fills if not any(s <= o <= s + window for o in onsets)]
    return {"states": dict(Counter(r.state for r in results)), "onsets": len(onsets),
            "filling_minutes": round(filling / 60), "false_alarms": len(false)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="v9,v8", help="comma-separated (default v9,v8)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default all)")
    args = parser.parse_args()
    versions: dict[str, ForecastParams] = {v: FORECASTERS[v] for v in args.versions.split(",")}
    for name in args.scenarios.split(","):
        polls = SCENARIOS[name]()
        for version, params in versions.items():
            forecaster = Forecaster(params)
            print(f"{name:10s} {version}: {score([forecaster.observe(p) for p in polls])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
