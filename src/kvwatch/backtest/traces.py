"""Per-trace simulation defaults, chosen so the KV cache (not compute) is what saturates.

The simulator's default engine prefills ~16k tokens/s. ``rate_scale`` multiplies the trace's native rate
and ``engine_speedup`` divides the per-token step costs (and multiplies the token budget), so a scenario
runs ``rate_scale`` × the traffic on an engine that stays below ~65 % compute at load 1.3. Larger rates
put more requests in flight, which makes the cache's fill level smoother and closer to a real server
holding hundreds of requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from kvwatch.backtest.runner import MAX_NUM_SEQS
from kvwatch.backtest.scenarios import DEFAULT_MAX_MODEL_LEN, LONG_PROMPT_RANGE, MAX_SCALE, capped
from kvwatch.sim.config import Request, StepTimeModel
from kvwatch.sim.traces import TraceError, active_seconds, detect_format

# The tuned traces and the packaged excerpts of them, by exact file name (lower case, without ".gz") ->
# (rate_scale, engine_speedup). Exact, not a fragment: "conv" in any name (a Mooncake file saved as
# mc_conv.jsonl, Azure's 2024 week-long AzureLLMInferenceTrace_conv_1week.csv) inherited the 2023 trace's
# tuning whatever its rate, and a 12-million-token cache could not fill.
_AZURE_CONV = (4.0, 4.0)  # Azure conversation: 5.5 req/s native, 1.2k-token prompts
_AZURE_CODE = (8.0, 8.0)  # Azure code: 2.6 req/s native, 2k-token prompts, tiny outputs
# Mooncake conversation: 3.4 req/s of 12k-token prompts (p99 85k) needs ~41k prefill tokens/s natively, 2.5x the
# default engine: the engine runs 12x faster so the KV cache, not prefill, is the limit.
_MOONCAKE_CONV = (2.0, 12.0)
TRACE_DEFAULTS: dict[str, tuple[float, float]] = {
    "azurellminferencetrace_conv.csv": _AZURE_CONV, "azure_conv_sample.csv": _AZURE_CONV,
    "azurellminferencetrace_code.csv": _AZURE_CODE, "azure_code_sample.csv": _AZURE_CODE,
    "conversation_trace.jsonl": _MOONCAKE_CONV, "mooncake_conversation_sample.jsonl": _MOONCAKE_CONV,
}


# A trace none of the above names: scaled to about this many requests a second (the tuned traces run 7-22),
# on an engine fast enough that compute stays at this share of it at load PEAK_LOAD.
TARGET_RATE = 20.0
# the mean of --long-fraction's log-uniform prompts
LONG_PROMPT_MEAN = (LONG_PROMPT_RANGE[1] - LONG_PROMPT_RANGE[0]) / math.log(LONG_PROMPT_RANGE[1] / LONG_PROMPT_RANGE[0])
COMPUTE_SHARE = 0.55
PEAK_LOAD = 1.3
# Requests running at PEAK_LOAD, at most this share of the engine's sequence cap (runner.MAX_NUM_SEQS).
RUNNING_SHARE = 0.8


def defaults_for(path: Path, trace: Sequence[Request] | None = None, *, prompt_scale: float = 1.0,
                 long_fraction: float = 0.0, max_model_len: int = DEFAULT_MAX_MODEL_LEN,
                 rate_scale: float | None = None) -> tuple[float, float]:
    """(rate_scale, engine_speedup): the tuned values of a trace named above (its results stay reproducible),
    else, given the trace, :func:`content_defaults` for it with the long-context shaping applied (and the engine
    sized for ``rate_scale`` when the caller set it, a named trace too: its tuned engine kept the tuned rate's
    size, and 16 x that rate was refused as an engine that cannot keep up); else (1, 1). A named trace shaped
    long (``prompt_scale``, ``long_fraction``) keeps its tuned rate on an engine sized for the longer prompts, never
    slower than its tuned one (Azure code at --prompt-scale 4 was refused as compute-bound after 50 s)."""
    tuned = _tuned(path)
    shaped = prompt_scale != 1.0 or long_fraction > 0.0
    if tuned is not None and (rate_scale is None or not trace):
        if not trace or not shaped:
            return tuned
        sized = content_defaults(trace, prompt_scale, long_fraction, max_model_len=max_model_len,
                                 rate_scale=tuned[0])
        return tuned[0], max(tuned[1], sized[1])
    if not trace:
        return (1.0, 1.0)
    return content_defaults(trace, prompt_scale, long_fraction, max_model_len=max_model_len, rate_scale=rate_scale)


def _tuned(path: Path) -> tuple[float, float] | None:
    """The tuned defaults of a trace named in TRACE_DEFAULTS whose content is that trace's format (a BurstGPT CSV
    saved as conversation_trace.jsonl got Mooncake's tuning, and 4 requests were simulated)."""
    name = path.name.lower().removesuffix(".gz")
    tuned = TRACE_DEFAULTS.get(name)
    if tuned is None:
        return None
    try:
        kind = detect_format(path)
    except (OSError, TraceError):
        return tuned  # (the reader will say what is wrong with it)
    return tuned if kind == ("mooncake" if name.endswith(".jsonl") else "azure") else None


def named(path: Path) -> bool:
    """Whether the defaults come from the trace's name (TRACE_DEFAULTS) rather than its content."""
    return defaults_for(path) != (1.0, 1.0)


def shaped_means(trace: Sequence[Request], prompt_scale: float = 1.0, long_fraction: float = 0.0,
                 max_model_len: int = DEFAULT_MAX_MODEL_LEN) -> tuple[float, float]:
    """(mean prompt, mean output) tokens after the scenario's long-context shaping and its max-model-len cap
    (scenarios.shape_lengths; the long prompts by their mean, capped alike)."""
    prompts = outputs = 0.0
    for r in trace:
        prompt, output = capped(r.prompt_tokens * prompt_scale, r.output_tokens, max_model_len)
        prompts += prompt
        outputs += output
    mean_output = outputs / len(trace)
    long_prompt = max(1.0, min(LONG_PROMPT_MEAN, max_model_len - mean_output))
    return (1.0 - long_fraction) * prompts / len(trace) + long_fraction * long_prompt, mean_output


def content_defaults(trace: Sequence[Request], prompt_scale: float = 1.0, long_fraction: float = 0.0, *,
                     max_model_len: int = DEFAULT_MAX_MODEL_LEN,
                     rate_scale: float | None = None) -> tuple[float, float]:
    """Defaults from what the trace holds: its rate scaled to ~TARGET_RATE requests/s (up or down), and the engine
    sped up until prefill and decode at PEAK_LOAD × that rate take COMPUTE_SHARE of it (the simulator's default
    step costs), so the KV cache, not compute, saturates. A renamed copy of a tuned trace gets about its values
    (Mooncake conversation: 5.9 / 36 against 2 / 12; Azure code 7.8 / 6.0 against 8 / 8). The long-context
    shaping (``--prompt-scale``, ``--long-fraction``'s log-uniform 16k-128k prompts, both capped at
    ``--max-model-len``) lengthens the prefill it sizes the engine for: without it a ×4 prompt ran on a
    compute-bound engine whose queue grew for ever.

    Two limits no speedup lifts set a lower rate: every step's fixed cost with the sequence cap bounds decoding at
    MAX_NUM_SEQS / fixed tokens/s (a trace of 20k-token outputs at 20 requests/s needs more: refused as
    compute-bound after simulating the whole run), and the speedup's own bound (MAX_SCALE). ``rate_scale``, when
    given (``--rate-scale``), is kept and the engine sized for it."""
    span = active_seconds(trace)  # without its empty 5-minute blocks: gaps in the collection are no traffic
    if not trace or span <= 0:
        return (1.0, 1.0)
    rate = len(trace) / span
    mean_prompt, mean_output = shaped_means(trace, prompt_scale, long_fraction, max_model_len)
    step = StepTimeModel()
    seconds_per_request = mean_prompt * step.per_prefill_token_seconds + mean_output * step.per_decode_token_seconds
    if rate_scale is None:
        # Running requests at PEAK_LOAD (Little: rate × output tokens × step) with per-token costs at COMPUTE_SHARE
        # of a step, so the step is fixed / (1 - COMPUTE_SHARE): at most RUNNING_SHARE of the sequence cap.
        decode_cap = RUNNING_SHARE * MAX_NUM_SEQS * (1.0 - COMPUTE_SHARE) / step.fixed_seconds
        rate_scale = min(TARGET_RATE / rate, decode_cap / (PEAK_LOAD * rate * mean_output),
                         MAX_SCALE * COMPUTE_SHARE / (PEAK_LOAD * rate * seconds_per_request), MAX_SCALE)
    speedup = max(1.0, PEAK_LOAD * rate_scale * rate * seconds_per_request / COMPUTE_SHARE)
    return (_rounded(rate_scale), round(min(speedup, MAX_SCALE), 2))


def _rounded(scale: float) -> float:
    """Two decimals, or two significant digits below 0.1 (a 200-requests/s trace runs at 0.1 of its rate)."""
    return round(scale, 2) if scale >= 0.1 else float(f"{scale:.2g}")
