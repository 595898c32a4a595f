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

from kvwatch.backtest.scenarios import LONG_PROMPT_RANGE
from kvwatch.sim.config import Request, StepTimeModel
from kvwatch.sim.traces import span_of

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


def defaults_for(path: Path, trace: Sequence[Request] | None = None, *, prompt_scale: float = 1.0,
                 long_fraction: float = 0.0) -> tuple[float, float]:
    """(rate_scale, engine_speedup): the tuned values of a trace named above (its results stay reproducible),
    else, given the trace, :func:`content_defaults` for it with the long-context shaping applied; else (1, 1)."""
    tuned = TRACE_DEFAULTS.get(path.name.lower().removesuffix(".gz"))
    if tuned is not None:
        return tuned
    return content_defaults(trace, prompt_scale, long_fraction) if trace else (1.0, 1.0)


def named(path: Path) -> bool:
    """Whether the defaults come from the trace's name (TRACE_DEFAULTS) rather than its content."""
    return defaults_for(path) != (1.0, 1.0)


def content_defaults(trace: Sequence[Request], prompt_scale: float = 1.0,
                     long_fraction: float = 0.0) -> tuple[float, float]:
    """Defaults from what the trace holds: its rate scaled to ~TARGET_RATE requests/s, and the engine sped up
    until prefill and decode at PEAK_LOAD × that rate take COMPUTE_SHARE of it (the simulator's default step
    costs), so the KV cache, not compute, saturates. A renamed copy of a tuned trace gets about its values
    (Mooncake conversation: 5.9 / 36 against 2 / 12; Azure code 7.8 / 6.0 against 8 / 8). The long-context
    shaping (``--prompt-scale``, ``--long-fraction``'s log-uniform 16k-128k prompts) lengthens the prefill it
    sizes the engine for: without it a ×4 prompt ran on a compute-bound engine whose queue grew for ever."""
    span = span_of(trace)
    if not trace or span <= 0:
        return (1.0, 1.0)
    rate = len(trace) / span
    rate_scale = max(1.0, TARGET_RATE / rate)
    step = StepTimeModel()
    mean_prompt = sum(r.prompt_tokens for r in trace) / len(trace) * prompt_scale
    mean_prompt = (1.0 - long_fraction) * mean_prompt + long_fraction * LONG_PROMPT_MEAN
    seconds_per_request = (mean_prompt * step.per_prefill_token_seconds
                           + sum(r.output_tokens for r in trace) / len(trace) * step.per_decode_token_seconds)
    speedup = max(1.0, PEAK_LOAD * rate_scale * rate * seconds_per_request / COMPUTE_SHARE)
    return (round(rate_scale, 2), round(speedup, 2))
