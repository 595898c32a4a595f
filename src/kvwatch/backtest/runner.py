"""Run one scenario: simulator → 10-s polls → kvwatch's forecaster and the baselines → scores.

The simulator is driven through its library API (no HTTP). Every method sees the same poll stream;
ground truth comes from the same polls (the engine's own usage, queue and preemption counters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvwatch.backtest.baselines import PredictLinearProbability, make_baselines
from kvwatch.backtest.scenarios import Scenario, ScenarioError, block_seconds_for, scenario_arrivals, shape_lengths
from kvwatch.backtest.scoring import (
    QUIET_SECONDS,
    Event,
    Outcome,
    Reliability,
    active_before_onsets,
    detection_delays,
    find_episodes,
    find_events,
    mask_warmup,
    saturated_samples,
    score_probabilities,
    score_run,
    scored_events,
    summarize,
    summarize_reliability,
    warmup_windows,
)
from kvwatch.forecast import Forecaster, ForecastParams, ForecastSample
from kvwatch.forecast.detector import BOTTLENECK, FILLING
from kvwatch.forecast.risk import RISK_HORIZONS_SECONDS
from kvwatch.sim.buckets import build_1_2_5_buckets
from kvwatch.sim.engine import EngineConfig, EngineSnapshot, Request, Simulator, StepTimeModel
from kvwatch.sim.traces import block_bootstrap, scale_rate, span_of

POLL_SECONDS = 10.0
BLOCK_SIZE = 16
CALIBRATION_SECONDS = 3600.0
KVWATCH = "kvwatch"


@dataclass(frozen=True)
class Calibration:
    """Capacity that makes load 1.0 = mean KV demand equal to the cache, measured in an unlimited cache."""

    mean_demand_tokens: float
    capacity_tokens: float
    num_gpu_blocks: int


MAX_REQUESTS = 5_000_000
"""Requests one run may hold at once (the bootstrapped trace and its arrivals, or the calibration hour's), ~340 B
each: about 1.7 GB. --rate-scale 1000 on the conversation sample built 17 million for the calibration hour and died
of a MemoryError after gigabytes; --hours 168 at the conversation trace's default rate needs about as many."""


def check_size(scenario: Scenario, trace: Sequence[Request]) -> None:
    """Refuse, naming the flags, a run whose arrivals would not fit :data:`MAX_REQUESTS` (estimated from the trace's
    rate and the profile's load minute by minute, before anything is built)."""
    rate = len(trace) / max(span_of(trace), 1.0)
    arrivals = rate * scenario.rate_scale * 60.0 * sum(scenario.load_at(60.0 * m + 30.0)
                                                      for m in range(math.ceil(scenario.seconds / 60.0)))
    held = max(rate * scenario.seconds + arrivals, rate * CALIBRATION_SECONDS * (1.0 + scenario.rate_scale))
    if held > MAX_REQUESTS:
        raise ScenarioError(
            f"this run would hold about {held / 1e6:,.1f} million requests at once ({held * 340 / 1e9:,.1f} GB; at "
            f"most {MAX_REQUESTS / 1e6:g} million): lower --rate-scale (now {scenario.rate_scale:g}), --peak-load or "
            "--hours")


MAX_NUM_SEQS = 4096  # the simulated engine's sequence cap: the KV cache, not this, should be the binding limit


def engine_config(num_gpu_blocks: int, speedup: float = 1.0) -> EngineConfig:
    """The simulator's default engine with per-token costs and the token budget scaled by ``speedup``.

    A step over ``speedup`` × the batch then takes as long as the default engine's step over the batch,
    so ``speedup`` × the arrival rate keeps the same latencies with ``speedup`` × more requests in flight:
    a larger, smoother KV population without making the engine compute-bound.
    """
    default = StepTimeModel()
    return EngineConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=BLOCK_SIZE,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=round(8192 * speedup),
        step=StepTimeModel(
            fixed_seconds=default.fixed_seconds,
            per_decode_token_seconds=default.per_decode_token_seconds / speedup,
            per_prefill_token_seconds=default.per_prefill_token_seconds / speedup,
        ),
    )


def calibrate(trace: Sequence[Request], rate_scale: float, seed: int, *, speedup: float = 1.0,
              seconds: float = CALIBRATION_SECONDS, lengths: Scenario | None = None) -> Calibration:
    """Mean KV tokens in use at ``rate_scale`` × the native rate, in a cache too large to ever fill.

    ``lengths``: a scenario whose long-context shaping (prompt scale, long mixture) applies here too.
    """
    base = block_bootstrap(trace, seconds, block_seconds=block_seconds_for(trace), seed=seed + 7919)
    requests = scale_rate(base, rate_scale, seed=seed + 7920, span=seconds)
    if lengths is not None:
        requests = shape_lengths(requests, lengths, seed=seed + 7921)
    if not requests:
        raise ScenarioError(f"the trace is too sparse: no request arrived in a {seconds / 3600:g}-hour sample at "
                            f"{rate_scale:g} x its rate; raise --rate-scale")
    largest = max(r.prompt_tokens + r.output_tokens for r in requests)
    unlimited_blocks = max(1 << 22, 4 * math.ceil(largest / BLOCK_SIZE))
    sim = Simulator(engine_config(unlimited_blocks, speedup), seed=seed)
    sim.submit(requests)
    used: list[float] = []
    waiting: list[int] = []
    t = POLL_SECONDS
    while t <= seconds:
        sim.run_until(t)
        if t >= 600.0:  # skip the first 10 minutes: the cache starts empty
            snapshot = sim.snapshot()[0]
            used.append(snapshot.used_blocks * BLOCK_SIZE)
            waiting.append(snapshot.num_waiting)
        t += POLL_SECONDS
    # With a cache that never fills, requests wait only for compute. A minute's arrivals still waiting over the
    # last 10 minutes: the engine cannot keep up at load 1.0, and the scenario would score a compute queue.
    tail = waiting[-max(1, int(600.0 / POLL_SECONDS)):]
    queued = sum(tail) / len(tail) if tail else 0.0
    if queued > 60.0 * len(requests) / seconds:
        raise ScenarioError(
            f"the simulated engine cannot keep up with this trace at {rate_scale:g} x its rate even with a KV cache "
            f"that never fills ({queued:,.0f} requests waiting for compute): the backtest would score a compute "
            f"queue, not the KV cache; raise --engine-speedup (now {speedup:g}) or lower --rate-scale")
    mean = sum(used) / len(used) if used else 0.0
    blocks_needed = max(math.ceil(mean / BLOCK_SIZE), math.ceil(largest / BLOCK_SIZE) + 1) + 1
    return Calibration(mean_demand_tokens=mean, capacity_tokens=(blocks_needed - 1) * BLOCK_SIZE,
                       num_gpu_blocks=blocks_needed)


@dataclass(frozen=True)
class Simulation:
    """The poll stream of one simulated scenario (what a sidecar polling every 10 s would have seen)."""

    scenario: Scenario
    calibration: Calibration
    samples: tuple[ForecastSample, ...]
    requests: int
    # The simulator's own (usage, waiting, preemptions total) per poll when ``samples`` were read through an
    # engine's wire format: the events are what happened, not what that engine's metrics can show
    # (TensorRT-LLM exports no preemption counter). None: the samples are the simulator's own.
    truth: tuple[tuple[float, float, float], ...] | None = None


def simulate(scenario: Scenario, trace: Sequence[Request], *, calibration: Calibration | None = None,
             engine: str | None = None) -> Simulation:
    """``engine`` (vllm, sglang, tensorrt-llm): read each poll through that engine's wire names and kvwatch's
    adapter, as ``kvwatch serve`` would, instead of straight from the simulator's snapshot."""
    check_size(scenario, trace)
    calibration = calibration or calibrate(trace, scenario.rate_scale, scenario.seed, speedup=scenario.engine_speedup,
                                           lengths=scenario)
    requests = scenario_arrivals(scenario, trace)
    sim = Simulator(engine_config(calibration.num_gpu_blocks, scenario.engine_speedup), seed=scenario.seed)
    sim.submit(requests)
    restarts = list(scenario.restart_times)
    restarted = False
    samples: list[ForecastSample] = []
    truth: list[tuple[float, float, float]] = []
    # The length histograms' bounds as vLLM exposes them: 1-2-5 up to max-model-len, then +Inf.
    length_bounds = (*(float(b) for b in build_1_2_5_buckets(scenario.max_model_len)), math.inf)
    for i in range(1, int(scenario.seconds // POLL_SECONDS) + 1):
        t = i * POLL_SECONDS
        while restarts and restarts[0] <= t:
            sim.run_until(restarts.pop(0))
            sim.restart()
            restarted = True
        sim.run_until(t)
        snap = sim.snapshot()[0]
        own = sample_from(snap, restarted=restarted, length_bounds=length_bounds)
        samples.append(own if engine is None else sample_through_wire(snap, engine, restarted=restarted))
        truth.append((own.kv_usage or 0.0, own.waiting, own.preemptions_total or 0.0))
        restarted = False
    return Simulation(scenario, calibration, tuple(samples), len(requests),
                      tuple(truth) if engine is not None else None)


@dataclass
class Timeline:
    """Per-poll series for scoring and plotting."""

    times: list[float] = field(default_factory=list)
    usage: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)
    preemptions_total: list[float] = field(default_factory=list)
    forecast_30m: list[float | None] = field(default_factory=list)
    eta_seconds: list[float | None] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    warnings: dict[str, list[bool]] = field(default_factory=dict)
    # method -> horizon -> probability per poll (kvwatch's risk; predict_linear as a probability)
    probabilities: dict[str, dict[int, list[float | None]]] = field(default_factory=dict)


@dataclass
class RunResult:
    scenario: Scenario
    calibration: Calibration
    timeline: Timeline
    events: list[Event]
    outcomes: dict[str, Outcome]
    requests: int
    reliability: dict[int, dict[str, Reliability]] = field(default_factory=dict)  # horizon -> method -> tally

    def to_json(self) -> dict:
        return {
            "calibration": {
                _horizon_label(h): summarize_reliability(by_method) for h, by_method in self.reliability.items()
            },
            "events": len(self.events),
            "hours": self.scenario.hours,
            "methods": {
                name: summarize(outcome, with_detection=name == KVWATCH) for name, outcome in self.outcomes.items()
            },
            "scenario": {
                "trace": self.scenario.trace_name,
                "profile": self.scenario.profile,
                "seed": self.scenario.seed,
                "start_load": self.scenario.start_load,
                "peak_load": self.scenario.peak_load,
                "load": self.scenario.load_text,
                "rate_scale": self.scenario.rate_scale,
                "engine_speedup": self.scenario.engine_speedup,
                "capacity_tokens": self.calibration.capacity_tokens,
                "mean_demand_tokens": round(self.calibration.mean_demand_tokens),
                "prompt_scale": self.scenario.prompt_scale,
                "long_fraction": self.scenario.long_fraction,
                "max_model_len": self.scenario.max_model_len,
                "requests": self.requests,
                "event_onsets_seconds": [e.onset for e in self.events],
            },
        }


def sample_from(snap: EngineSnapshot, *, restarted: bool,
                length_bounds: tuple[float, ...] | None = None) -> ForecastSample:
    """The poll straight from the simulator's snapshot; ``length_bounds`` (upper bounds of the length
    histograms as vLLM exposes them, 1-2-5 up to max-model-len, the last +Inf): their cumulative counts too."""
    prompt = generation = None
    if length_bounds is not None:
        finite = length_bounds[:-1]
        prompt = tuple(float(c) for c in snap.histograms["request_prompt_tokens"].cumulative(finite))
        generation = tuple(float(c) for c in snap.histograms["request_generation_tokens"].cumulative(finite))
    return ForecastSample(
        timestamp=snap.time,
        kv_usage=snap.kv_usage,
        capacity_tokens=float((snap.num_gpu_blocks - 1) * snap.block_size),
        running=float(snap.num_running),
        waiting=float(snap.num_waiting),
        preemptions_total=float(snap.preemptions_total),
        finished_total=float(snap.requests_completed),
        prompt_tokens_total=float(snap.prompt_tokens_total),
        generation_tokens_total=float(snap.generation_tokens_total),
        request_prompt_tokens_sum=float(snap.request_prompt_tokens_sum),
        request_prompt_tokens_count=float(snap.request_prompt_tokens_count),
        request_generation_tokens_sum=float(snap.request_generation_tokens_sum),
        request_generation_tokens_count=float(snap.request_generation_tokens_count),
        e2e_latency_seconds_sum=float(snap.histograms["e2e_request_latency_seconds"].sum),
        e2e_latency_seconds_count=float(snap.histograms["e2e_request_latency_seconds"].count),
        restarted=restarted,
        prompt_length_bounds=length_bounds if prompt is not None else None,
        prompt_length_cumulative=prompt,
        generation_length_bounds=length_bounds if generation is not None else None,
        generation_length_cumulative=generation,
    )


def sample_through_wire(snap: EngineSnapshot, engine: str, *, restarted: bool) -> ForecastSample:
    """The poll as kvwatch serve sees it: rendered in ``engine``'s names, parsed and read by its adapter."""
    from kvwatch.engines.detect import read_payload
    from kvwatch.sim.engines_wire import render_any

    (reading,) = read_payload(render_any([snap], engine=engine, model_name="backtest"), timestamp=snap.time,
                              lengths=True).readings
    return ForecastSample.from_reading(reading, snap.time, restarted=restarted)


def evaluate(simulation: Simulation, params: ForecastParams | None = None, *,
             calibration_quiet_after: float = QUIET_SECONDS) -> RunResult:
    """Run kvwatch and every baseline over the same polls; find the events; score each method.

    ``calibration_quiet_after=0``: the calibration rule before v4 (minutes just after an event scored too)."""
    forecaster = Forecaster(params or ForecastParams())
    baselines = make_baselines()
    linear_probability = PredictLinearProbability()
    timeline = Timeline(warnings={KVWATCH: [], **{name: [] for name in baselines}},
                        probabilities={m: {h: [] for h in RISK_HORIZONS_SECONDS} for m in (KVWATCH, "predict_linear")})
    bottleneck: list[bool] = []
    for sample in simulation.samples:
        result = forecaster.observe(sample)
        t, usage = sample.timestamp, sample.kv_usage or 0.0
        timeline.times.append(t)
        timeline.usage.append(usage)
        timeline.waiting.append(sample.waiting)
        timeline.running.append(sample.running)
        timeline.preemptions_total.append(sample.preemptions_total or 0.0)
        timeline.forecast_30m.append(result.forecast_ratio.get(1800))
        timeline.eta_seconds.append(result.eta_seconds)
        timeline.states.append(result.state)
        timeline.warnings[KVWATCH].append(result.state in (FILLING, BOTTLENECK))
        bottleneck.append(result.state == BOTTLENECK)
        for name, baseline in baselines.items():
            timeline.warnings[name].append(baseline.observe(t, usage))
        linear = linear_probability.observe(t, usage, RISK_HORIZONS_SECONDS)
        for h in RISK_HORIZONS_SECONDS:
            timeline.probabilities[KVWATCH][h].append(result.risk.get(h))
            timeline.probabilities["predict_linear"][h].append(linear[h])
    # Counters restart with the engine: a drop is a reset, not a preemption count going backwards.
    usage, waiting, preempted = (timeline.usage, timeline.waiting, timeline.preemptions_total) \
        if simulation.truth is None else (list(column) for column in zip(*simulation.truth, strict=True))
    saturated = saturated_samples(usage, waiting, _monotone(preempted))
    events = find_events(timeline.times, saturated)
    outcomes: dict[str, Outcome] = {}
    seconds = simulation.scenario.seconds
    warmup = warmup_windows(simulation.scenario.restart_times, seconds)
    for name, active in timeline.warnings.items():
        active = timeline.warnings[name] = mask_warmup(timeline.times, active, warmup)
        outcome = score_run(events, find_episodes(timeline.times, active), monitored_seconds=seconds,
                            warmup=warmup)
        outcome.active_before = active_before_onsets(events, timeline.times, active, warmup)
        if name == KVWATCH:
            # the events the warnings are scored on: one in warm-up counted 100 s into a run as a detection
            outcome.detect_delays = detection_delays(scored_events(events, warmup), timeline.times, bottleneck)
        outcomes[name] = outcome
    reliability = {
        h: {m: score_probabilities(timeline.times, by_h[h], h, events, end=seconds, warmup=warmup,
                                   quiet_after=calibration_quiet_after)
            for m, by_h in timeline.probabilities.items()}
        for h in RISK_HORIZONS_SECONDS
    }
    return RunResult(simulation.scenario, simulation.calibration, timeline, events, outcomes, simulation.requests,
                     reliability)


def _horizon_label(seconds: int) -> str:
    return f"{seconds // 60}m"


def _monotone(counter: Sequence[float]) -> list[float]:
    """Undo counter resets (like PromQL's rate): add the value before each reset."""
    out: list[float] = []
    offset = previous = 0.0
    for value in counter:
        if value < previous:
            offset += previous
        out.append(value + offset)
        previous = value
    return out


def run_scenario(scenario: Scenario, trace: Sequence[Request], *, params: ForecastParams | None = None,
                 calibration: Calibration | None = None, engine: str | None = None) -> RunResult:
    return evaluate(simulate(scenario, trace, calibration=calibration, engine=engine), params)
