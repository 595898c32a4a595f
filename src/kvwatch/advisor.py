"""The advisor: when the KV cache is filling or saturated, the fixes, cheapest first, with their effect.

The tutorial's decision loop, in order of cost: limit concurrency at the gateway (free, immediate), lower
``--max-model-len`` (a restart; only when observed requests sit far below it), quantize the weights (a
restart and a quality check; needs the model to size the gain), add tensor parallelism (another card).
Pure: the caller passes the forecast's numbers and, when the model is known, the capacity plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

LIMIT_CONCURRENCY = "limit_concurrency"
LOWER_MAX_MODEL_LEN = "lower_max_model_len"
QUANTIZE_WEIGHTS = "quantize_weights"
ADD_TENSOR_PARALLELISM = "add_tensor_parallelism"
ACTIONS: tuple[str, ...] = (LIMIT_CONCURRENCY, LOWER_MAX_MODEL_LEN, QUANTIZE_WEIGHTS, ADD_TENSOR_PARALLELISM)
ADVISE_IN_STATES: frozenset[str] = frozenset({"filling", "bottleneck"})
# Lower --max-model-len only when the longest observed request is below this share of it.
MAX_MODEL_LEN_SLACK = 0.5


@dataclass(frozen=True)
class Advice:
    action: str
    rank: int  # 1 = do this first
    message: str  # what to do, in the operator's terms (flags they can paste)
    projected_effect: str  # what it buys, in numbers when they are known


@dataclass(frozen=True)
class RequestLengths:
    """Observed request lengths (from the length histograms); ``max_total_tokens`` when buckets tell it."""

    mean_prompt_tokens: float
    mean_output_tokens: float
    max_total_tokens: float | None = None

    @property
    def mean_total_tokens(self) -> float:
        return self.mean_prompt_tokens + self.mean_output_tokens

    @property
    def longest_estimate(self) -> float:
        # Without histogram buckets, assume the longest request is 4x the mean (a heavy but common tail).
        return self.max_total_tokens if self.max_total_tokens else 4.0 * self.mean_total_tokens


def advise(
    state: str,
    *,
    recommended_max_concurrency: int | None = None,
    running: float | None = None,
    capacity_tokens: float | None = None,
    capacity_plan: Any | None = None,
    request_lengths: RequestLengths | None = None,
    max_model_len: int | None = None,
    kv_tokens_per_request: float | None = None,
) -> list[Advice]:
    """Ranked fixes for ``state`` (empty unless filling or bottleneck).

    ``capacity_plan`` is a :class:`kvwatch.capacity.CapacityPlan` when the model is known; its what-if
    scenarios size the quantization and tensor-parallel gains. ``kv_tokens_per_request`` is the live
    average of KV tokens per running request (the observed mix), used to turn capacities into ceilings.
    """
    if state not in ADVISE_IN_STATES:
        return []
    whatif = _whatif(capacity_plan)
    base_tokens = float(capacity_plan.kv_cache_tokens) if capacity_plan is not None else capacity_tokens
    candidates: list[tuple[str, str, str]] = []

    if recommended_max_concurrency is not None:
        now = f" (now {running:.0f} running)" if running is not None else ""
        candidates.append((
            LIMIT_CONCURRENCY,
            f"Limit concurrency to {recommended_max_concurrency} at the gateway (or --max-num-seqs "
            f"{recommended_max_concurrency}){now}.",
            "KV usage stays under 95% at the observed request mix; excess requests wait at the gateway "
            "instead of being preempted and recomputed.",
        ))

    lowered = _lower_max_model_len(max_model_len, request_lengths)
    if lowered is not None and max_model_len is not None:
        factor = max_model_len / lowered
        ceiling = ""
        if base_tokens:
            ceiling = (f" (from {base_tokens / max_model_len:.1f} to {base_tokens / lowered:.1f} requests "
                       "of full length)")
        candidates.append((
            LOWER_MAX_MODEL_LEN,
            f"Lower --max-model-len from {max_model_len} to {lowered}: observed requests are at most "
            f"~{request_lengths.longest_estimate:.0f} tokens.",
            f"The worst-case concurrency ceiling rises {factor:.1f}x{ceiling}; the KV pool itself is unchanged, "
            "so usage at today's mix does not drop.",
        ))

    quantized = whatif.get("fp8_weights")
    if quantized is not None and base_tokens and quantized.kv_cache_tokens and quantized.kv_cache_tokens > base_tokens:
        gain = quantized.kv_cache_tokens / base_tokens
        kv_fp8 = whatif.get("fp8_kv_cache")
        also = ""
        if kv_fp8 is not None and kv_fp8.kv_cache_tokens and kv_fp8.kv_cache_tokens > base_tokens:
            also = (f" An FP8 KV cache (--kv-cache-dtype fp8) instead gives "
                    f"x{kv_fp8.kv_cache_tokens / base_tokens:.2f} tokens.")
        candidates.append((
            QUANTIZE_WEIGHTS,
            "Quantize the weights to FP8 (--quantization fp8): frees GPU memory for the KV cache.",
            f"KV capacity {base_tokens:.0f} -> {quantized.kv_cache_tokens:.0f} tokens (x{gain:.2f})"
            + _ceiling_text(base_tokens, quantized.kv_cache_tokens, kv_tokens_per_request) + "." + also,
        ))

    tp = whatif.get("tensor_parallel_x2")
    if tp is not None and base_tokens and tp.kv_cache_tokens:
        effect = (f"KV capacity {base_tokens:.0f} -> {tp.kv_cache_tokens:.0f} tokens "
                  f"(x{tp.kv_cache_tokens / base_tokens:.2f})"
                  + _ceiling_text(base_tokens, tp.kv_cache_tokens, kv_tokens_per_request)
                  + ", at the price of a second card.")
    else:
        doubled = 2.0 * base_tokens if base_tokens else None
        effect = ("Roughly doubles the KV capacity"
                  + (_ceiling_text(base_tokens, doubled, kv_tokens_per_request) if base_tokens and doubled else "")
                  + " (more once the weights are split), at the price of a second card.")
    candidates.append((
        ADD_TENSOR_PARALLELISM,
        "Add tensor parallelism (--tensor-parallel-size x2) or another replica behind the gateway.",
        effect,
    ))
    return [Advice(action, rank, message, effect) for rank, (action, message, effect) in enumerate(candidates, 1)]


def _whatif(capacity_plan: Any | None) -> dict[str, Any]:
    if capacity_plan is None:
        return {}
    from kvwatch.capacity import whatif_scenarios

    try:
        return {s.name: s for s in whatif_scenarios(capacity_plan.spec)}
    except (ValueError, ArithmeticError):
        return {}  # a plan the what-if math cannot vary: advise without those numbers


def _lower_max_model_len(max_model_len: int | None, lengths: RequestLengths | None) -> int | None:
    """A power of two with 25 % margin over the longest observed request, if well below the setting."""
    if not max_model_len or lengths is None or lengths.mean_total_tokens <= 0:
        return None
    longest = lengths.longest_estimate
    if longest > MAX_MODEL_LEN_SLACK * max_model_len:
        return None
    proposed = 2 ** math.ceil(math.log2(max(longest * 1.25, 16)))
    return proposed if proposed <= max_model_len // 2 else None


def _ceiling_text(before: float, after: float, kv_tokens_per_request: float | None) -> str:
    if not kv_tokens_per_request:
        return ""
    return (f"; at the observed mix the ceiling goes from {before / kv_tokens_per_request:.0f} to "
            f"{after / kv_tokens_per_request:.0f} concurrent requests")


def advise_from_result(result: Any, reading: Any | None = None, *, capacity_plan: Any | None = None,
                       max_model_len: int | None = None) -> list[Advice]:
    """``advise`` fed from a :class:`kvwatch.forecast.ForecastResult` and core's ``Reading`` (what the
    sidecar, ``kvwatch check`` and the demo call). Lifetime length means come from the reading's histograms."""
    lengths = None
    if reading is not None:
        p_sum, p_count = getattr(reading, "request_prompt_tokens_sum", None), getattr(
            reading, "request_prompt_tokens_count", None)
        g_sum, g_count = getattr(reading, "request_generation_tokens_sum", None), getattr(
            reading, "request_generation_tokens_count", None)
        if p_sum is not None and p_count and g_sum is not None and g_count:
            lengths = RequestLengths(p_sum / p_count, g_sum / g_count)
    running = getattr(reading, "requests_running", None) if reading is not None else None
    return advise(
        result.state,
        recommended_max_concurrency=result.recommended_max_concurrency,
        running=running,
        capacity_tokens=result.estimates.get("capacity_tokens"),
        capacity_plan=capacity_plan,
        request_lengths=lengths,
        max_model_len=max_model_len,
        kv_tokens_per_request=result.estimates.get("tokens_per_running_request"),
    )
