"""Scenarios: a real trace, block-bootstrapped to any length, shaped by a load profile.

Load is offered KV demand as a fraction of the simulated capacity. ``calibrate`` replays the trace at
``rate_scale`` × its native rate through an unlimited cache and measures the mean KV tokens in use; the
capacity is set to that mean, so load 1.0 is the arrival rate whose *mean* demand equals the cache (bursts
saturate it earlier, around 0.85–0.95). A load of X then means X × that arrival rate.

Rate shaping keeps the traffic real: the trace is block-bootstrapped (5-minute blocks, requests keep their
relative times and prompt/output pairs) to the scenario's length, then the simulator's ``scale_rate``
thins it (m < 1) or superposes shifted copies (m > 1) so the rate follows ``load(t) × rate_scale``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kvwatch.backtest.scoring import WARMUP_SECONDS
from kvwatch.sim.engine import Request
from kvwatch.sim.traces import (
    MOONCAKE_UNIT_HINT,
    block_bootstrap,
    detect_format,
    read_mooncake_jsonl,
    scale_rate,
    span_of,
)

PROFILES: tuple[str, ...] = ("ramp", "step", "diurnal", "steady", "restart", "mixshift", "burst-short", "burst-long")
BLOCK_SECONDS = 300.0
DAY_SECONDS = 86400.0
RAMP_LEAD_IN_SECONDS = 1800.0
# Burst shapes (tuning): the forecast must tell bursts that last seconds, which do not make a
# sustained saturation, from bursts that last minutes, which do. (burst seconds, period seconds, extra load)
BURST_SHORT = (20.0, 120.0, 0.5)  # on a ramp from start to peak: spikes of +0.5 for 20 s every 2 minutes
BURST_LONG = (600.0, 2700.0, None)  # from start up to peak for 10 minutes every 45 minutes
DEFAULT_MAX_MODEL_LEN = 131072
MAX_HOURS = 168.0
WARMUP_HOURS = WARMUP_SECONDS / 3600.0
MAX_SCALE = 1000.0
MAX_TRACE_REQUESTS = 1_000_000
MIN_BLOCK_SECONDS = 60.0  # a trace shorter than BLOCK_SECONDS is bootstrapped in blocks of its own length
LONG_PROMPT_RANGE = (16384, 131072)


class ScenarioError(ValueError):
    """Bad scenario input (unreadable trace, impossible profile); the message names the flag."""


@dataclass(frozen=True)
class Scenario:
    trace_name: str
    profile: str
    hours: float
    seed: int
    start_load: float
    peak_load: float
    rate_scale: float = 1.0
    engine_speedup: float = 1.0
    # Long-context stress (tuning scenarios): prompts × prompt_scale, and a share of requests
    # whose prompt is replaced by a log-uniform 16k–128k one; prompt + output never exceed max_model_len.
    prompt_scale: float = 1.0
    long_fraction: float = 0.0
    max_model_len: int = DEFAULT_MAX_MODEL_LEN

    @property
    def seconds(self) -> float:
        return self.hours * 3600.0

    def load_at(self, t: float) -> float:
        """Offered load (fraction of capacity) at ``t`` seconds; for ``mixshift`` the rate stays at start."""
        s, p, total = self.start_load, self.peak_load, self.seconds
        if self.profile == "ramp":
            # Hold the start for a lead-in (the service ran before the ramp; monitors have history).
            lead_in = self.ramp_lead_in
            return s + (p - s) * min(1.0, max(0.0, (t - lead_in) / (total - lead_in)))
        if self.profile == "step":
            return s if t < self.shift_time else p
        if self.profile == "diurnal":
            return s + (p - s) * 0.5 * (1.0 - math.cos(2.0 * math.pi * t / DAY_SECONDS))
        if self.profile in ("steady", "restart"):
            return p
        if self.profile == "mixshift":
            return s
        if self.profile == "burst-short":
            seconds, period, extra = BURST_SHORT
            base = s + (p - s) * min(1.0, max(0.0, (t - self.ramp_lead_in) / (total - self.ramp_lead_in)))
            return base + (extra if (t % period) < seconds else 0.0)
        if self.profile == "burst-long":
            seconds, period, _ = BURST_LONG
            # the first burst after the 30-minute warm-up, so every burst can be forecast
            return p if ((t - RAMP_LEAD_IN_SECONDS) % period) < seconds and t >= RAMP_LEAD_IN_SECONDS else s
        raise ScenarioError(f"unknown --profile {self.profile!r}: choose one of {', '.join(PROFILES)}")

    def demand_at(self, t: float) -> float:
        """Offered KV demand (fraction of capacity) at ``t``: the load, times what ``mixshift``'s longer requests
        add after the shift (token-time grows as the square of the length scale, ≈ peak/start)."""
        grown = self.profile == "mixshift" and t >= self.shift_time
        return self.load_at(t) * (self.length_scale_after_shift ** 2 if grown else 1.0)

    @property
    def load_text(self) -> str:
        """The load as the report and the plot title say it: steady and restart hold the peak alone (``0.5->1.3`` read
        as a ramp on a steady run)."""
        if self.profile in ("steady", "restart"):
            return f"at {self.peak_load:g}"
        return f"{self.start_load:g}->{self.peak_load:g}"

    @property
    def ramp_lead_in(self) -> float:
        """``ramp`` holds ``start_load`` this long first: 30 minutes, at most a fifth of the run."""
        return min(RAMP_LEAD_IN_SECONDS, 0.2 * self.seconds)

    @property
    def shift_time(self) -> float:
        """When ``step`` jumps, ``mixshift`` changes lengths and ``restart`` restarts the engine."""
        return 0.5 * self.seconds

    @property
    def restart_times(self) -> tuple[float, ...]:
        return (self.shift_time,) if self.profile == "restart" else ()

    @property
    def length_scale_after_shift(self) -> float:
        """``mixshift``: scale prompts and outputs by √(peak/start); token-time ∝ P·D + D²/2 grows ≈ peak/start."""
        return math.sqrt(self.peak_load / self.start_load) if self.profile == "mixshift" else 1.0


def validate(scenario: Scenario) -> None:
    if scenario.profile not in PROFILES:
        raise ScenarioError(f"unknown --profile {scenario.profile!r}: choose one of {', '.join(PROFILES)}")
    if not WARMUP_HOURS < scenario.hours <= MAX_HOURS:
        raise ScenarioError(f"--hours must be in ({WARMUP_HOURS:g}, {MAX_HOURS:g}]: every method's first 30 minutes "
                            "are a warm-up nothing is scored in, and a week of polls takes minutes to simulate")
    if scenario.profile == "restart" and scenario.hours <= 2 * WARMUP_HOURS:
        # (the restart at half time starts a second warm-up: at 1 hour both halves are warm-ups, nothing scored)
        raise ScenarioError(f"--profile restart needs --hours above {2 * WARMUP_HOURS:g}: the engine restarts at half "
                            "time and every method warms up again for 30 minutes, so a shorter run has nothing scored")
    if not (0 < scenario.start_load <= 5 and 0 < scenario.peak_load <= 5):
        raise ScenarioError("--start-load and --peak-load must be in (0, 5]")
    if not 0 < scenario.rate_scale <= MAX_SCALE:
        raise ScenarioError(f"--rate-scale must be in (0, {MAX_SCALE:g}]")
    if not 0 < scenario.engine_speedup <= MAX_SCALE:
        raise ScenarioError(f"--engine-speedup must be in (0, {MAX_SCALE:g}]")
    if not (0 < scenario.prompt_scale <= 1000):
        raise ScenarioError("--prompt-scale must be in (0, 1000]")
    if not (0 <= scenario.long_fraction <= 1):
        raise ScenarioError("--long-fraction must be in [0, 1]")
    if scenario.max_model_len < 2:
        raise ScenarioError("--max-model-len must be at least 2")


def refused(request: Request, max_model_len: int) -> bool:
    """A row no server of ``max_model_len`` serves (as the trace has it, before any shaping), left out: vLLM refuses a
    prompt of that many tokens or more, and no such server generates an output that long (prompt + output fit the
    limit). Capped, each made a request of the whole cache: one prompt sized the simulated cache six times too large,
    one output of 1e9 tokens 18 times."""
    return refusal(request, max_model_len) is not None


def refusal(request: Request, max_model_len: int) -> str | None:
    """Why :func:`refused` leaves ``request`` out (the report's reason), or None."""
    if request.prompt_tokens >= max_model_len:
        return f"prompt of --max-model-len {max_model_len:,} tokens or more: vLLM refuses it"
    if request.output_tokens >= max_model_len:
        return f"output of --max-model-len {max_model_len:,} tokens or more: no server with that limit generates it"
    return None


def shape_lengths(requests: Sequence[Request], scenario: Scenario, seed: int) -> list[Request]:
    """Leave out the prompts vLLM refuses (:func:`refused`), apply ``prompt_scale`` and the ``long_fraction``
    mixture; prompt + output capped at ``max_model_len`` (always, so a trace's outlier cannot set the simulated
    cache's size)."""
    limit = scenario.max_model_len
    if scenario.prompt_scale == 1.0 and scenario.long_fraction == 0.0 and \
            all(r.prompt_tokens + r.output_tokens <= limit for r in requests):
        return list(requests)
    rng = random.Random(seed)
    lo, hi = math.log(LONG_PROMPT_RANGE[0]), math.log(LONG_PROMPT_RANGE[1])
    out = []
    for r in requests:
        if refused(r, limit):
            continue
        prompt = r.prompt_tokens * scenario.prompt_scale
        if scenario.long_fraction and rng.random() < scenario.long_fraction:
            prompt = math.exp(rng.uniform(lo, hi))
        prompt_tokens, output_tokens = capped(prompt, r.output_tokens, limit)
        out.append(replace(r, prompt_tokens=prompt_tokens, output_tokens=output_tokens))
    return out


def capped(prompt: float, output: int, limit: int) -> tuple[int, int]:
    """(prompt, output) tokens of one request with prompt + output at most ``limit`` (--max-model-len): the output
    first, at most limit - 1, then the prompt in what is left, at least 1."""
    output = min(output, limit - 1)
    return max(1, min(round(prompt), limit - output)), output


def block_seconds_for(trace: Sequence[Request]) -> float:
    """The bootstrap block: 5 minutes, or the whole trace when it is shorter (the packaged 2-minute sample)."""
    return min(BLOCK_SECONDS, span_of(trace))


def load_trace(path: Path) -> list[Request]:
    """Read an Azure or BurstGPT CSV or a Mooncake JSONL trace (the simulator's readers; times start at 0),
    at most its first MAX_TRACE_REQUESTS requests (:func:`load_trace_head`)."""
    return load_trace_head(path)[0]


def load_trace_head(path: Path, left_out: dict[str, int] | None = None, *,
                    max_model_len: int | None = None) -> tuple[list[Request], bool]:
    """(the trace's first MAX_TRACE_REQUESTS requests in file order, whether it had more); ``left_out`` counts
    the rows the reader left out, by reason (an empty prompt, a failed request, and with ``max_model_len`` a
    prompt vLLM refuses: as long as the limit or longer, which capped made a request of the whole cache that
    sized the simulated one six times too large). The bootstrap draws
    5-minute blocks from them: a week-long trace held whole would take gigabytes (~340 B a request), and a
    million requests are its first hours at the Azure 2024 traces' rates (about 10 h of code at 28 requests/s,
    6 h of conversation at 45); the report says how many hours were read."""
    from kvwatch.sim.traces import TraceError
    from kvwatch.sim.traces import load_trace as read

    if path.is_dir():
        raise ScenarioError(f"--trace {path}: a directory, not a trace file")
    if not path.is_file():
        raise ScenarioError(f"--trace {path}: " + ("not a regular file" if path.exists() else "no such file"))
    try:
        requests = read(path, max_requests=MAX_TRACE_REQUESTS + 1, left_out=left_out)
    except (OSError, TraceError, ValueError) as exc:  # the reader's message names the file already
        raise ScenarioError(f"--trace: {exc}") from exc
    truncated = len(requests) > MAX_TRACE_REQUESTS
    if truncated:
        requests = sorted(requests, key=lambda r: r.arrival_time)[:MAX_TRACE_REQUESTS]
    refused_here = 0
    if max_model_len is not None:  # (counted here for the report; shape_lengths leaves them out on every path)
        kept = []
        for r in requests:
            why = refusal(r, max_model_len)
            if why is None:
                kept.append(r)
            elif left_out is not None:
                left_out[why] = left_out.get(why, 0) + 1
        refused_here = len(requests) - len(kept)
        requests = kept
    span = span_of(requests)
    if len(requests) < 10 or span < MIN_BLOCK_SECONDS:
        hint = ""
        # (not for requests at one time, which the reader's jitter spreads over a few seconds: their times read
        # without it are all one; times in seconds read ~1.5 s for 25 minutes and got no hint below the jitter's 3 s)
        if len(requests) >= 10 and span < MIN_BLOCK_SECONDS and detect_format(path) == "mooncake" and \
                max(r.arrival_time for r in read_mooncake_jsonl(path, jitter_seconds=0.0,
                                                               max_requests=MAX_TRACE_REQUESTS)) > 0:
            hint = f" ({MOONCAKE_UNIT_HINT})"
        if refused_here:  # (the trace was long enough: the limit left too little of it)
            hint += (f" ({refused_here:,} of its requests left out: a prompt or an output of --max-model-len "
                     f"{max_model_len:,} tokens or more, which no such server serves)")
        shown = f"{span:.1f}" if span < 10 else f"{span:,.0f}"
        raise ScenarioError(f"--trace {path}: {len(requests)} requests over {shown} s; a backtest bootstraps "
                            f"from at least 10 requests over {MIN_BLOCK_SECONDS:.0f} s{hint}")
    return requests, truncated


def scenario_arrivals(scenario: Scenario, trace: Sequence[Request]) -> list[Request]:
    """The scenario's arrivals: block bootstrap to its length, then the load profile as a rate multiplier."""
    seconds = scenario.seconds
    base = block_bootstrap(trace, seconds, block_seconds=block_seconds_for(trace), seed=scenario.seed)
    shaped = scale_rate(base, lambda t: scenario.load_at(t) * scenario.rate_scale, seed=scenario.seed + 1,
                        span=seconds)
    shaped = shape_lengths(shaped, scenario, seed=scenario.seed + 2)
    factor = scenario.length_scale_after_shift
    if factor == 1.0:
        return shaped
    shift = scenario.shift_time
    return [
        replace(r, prompt_tokens=max(1, round(r.prompt_tokens * factor)),
                output_tokens=max(1, round(r.output_tokens * factor)))
        if r.arrival_time >= shift else r
        for r in shaped
    ]
