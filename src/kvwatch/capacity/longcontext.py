"""What a long ``max_model_len`` does to a deployment: requests that fit, prefill time, probes (pure).

:func:`long_context` reads a :class:`CapacityPlan` and returns ``plan --json``'s ``long_context`` block:

- ``requests_at_max_model_len``: vLLM's "Maximum concurrency" (whole blocks per request);
- ``prefill_seconds_estimate``: one max-length prompt, from its FLOPs at an assumed MFU of the GPU's dense BF16
  peak: ``2 × active_params × n`` for the linear layers plus the causal attention term, per attention layer
  ``heads × (head_dim + v_head_dim) × n²`` at its layer type's head sizes (QKᵀ and AV, ``2·n·d`` per token each,
  halved by the causal mask); a sliding-window layer sees at most its window. The sum is split over TP × PP
  GPUs. It ignores sparse-attention tricks (dual chunk attention, MInference) that long-context releases ship,
  so it is the dense-attention figure (docs/capacity.md, "Long contexts");
- ``chunked_prefill_steps``: engine steps one such prompt takes (``ceil(n / max_num_batched_tokens)``);
- ``probe_initial_delay_seconds``: a startup allowance for the container, :data:`STARTUP_BASE_SECONDS` for
  loading and compiling (not modelled) plus one max-length prefill;
- ``max_model_len_for_4``: the largest max_model_len at which 4 requests fit, and a warning when fewer than
  2 fit at today's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvwatch.capacity import kv, memory
from kvwatch.capacity.architecture import ModelArch
from kvwatch.capacity.layers import SLIDING
from kvwatch.capacity.planner import CapacityPlan

DEFAULT_MFU = 0.4  # assumed share of the dense BF16 peak a long prefill reaches (docs/capacity.md)
STARTUP_BASE_SECONDS = 600  # model download-free load, profiling and CUDA-graph capture: an allowance, not a model
FEW_REQUESTS = 2  # warn below this many requests at max_model_len
TARGET_REQUESTS = 4  # ... and name the max_model_len at which this many fit


@dataclass(frozen=True)
class LongContext:
    max_model_len: int
    requests_at_max_model_len: float
    prefill_flops: float | None
    prefill_seconds_estimate: float | None
    mfu: float
    gpu_bf16_tflops: float | None
    chunked_prefill_steps: int
    probe_initial_delay_seconds: int | None
    max_model_len_for_4: int | None
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def active_linear_params(arch: ModelArch) -> tuple[float, bool]:
    """(linear parameters one token runs through, whether MoE routing was known).

    Embeddings are a lookup (no FLOPs); the LM head runs only for the last token of a prompt, so neither counts.
    An MoE layer runs ``experts_per_token`` routed experts plus the shared ones; without the routing in the
    config every expert is counted (an upper bound).
    """
    _embed, dense, experts = memory.parameter_counts(arch)
    if not arch.num_experts or not experts:
        return float(dense), True
    if not arch.experts_per_token:
        return float(dense + experts), False
    share = (arch.experts_per_token + arch.num_shared_experts) / (arch.num_experts + arch.num_shared_experts)
    return dense + experts * share, True


def attention_flops(arch: ModelArch, n: float) -> float:
    """Causal attention FLOPs of one n-token prompt, summed over attention layers: the score matmul at the
    layer type's K head size, the value matmul at its V head size (ModelArch.kv_dims: Gemma 4's full layers have
    twice the head size)."""
    total = 0.0
    for kind in arch.attention_layer_types:
        d = arch.kv_dims(kind)
        width = arch.num_attention_heads * (d.head_dim + d.v_head_dim)  # score + value, per query token and key
        if kind == SLIDING and arch.sliding_window and arch.sliding_window < n:
            w = arch.sliding_window
            total += 2 * width * (w * n - w * w / 2)  # each token sees at most the window
        else:
            total += width * n * n
    return total


def prefill_flops(arch: ModelArch, n: float) -> tuple[float, bool]:
    """(FLOPs of one n-token prefill for the whole model, MoE routing known)."""
    params, known = active_linear_params(arch)
    return 2 * params * n + attention_flops(arch, n), known


def max_len_for(plan: CapacityPlan, requests: int) -> int | None:
    """Largest max_model_len (a whole number of blocks, at most the model's) at which ``requests`` fit."""
    layout, blocks, in_flight = plan.layout, plan.num_gpu_blocks, plan.in_flight_tokens
    if blocks <= 0:
        return None
    arch = plan.spec.arch
    top_blocks = max(1, blocks // requests)
    hi = top_blocks * layout.block_size
    derived = arch.derived_len(plan.spec.vllm_version)[0] if arch is not None else None
    if derived:
        hi = min(hi * 4, derived)  # sliding groups cost less: look beyond the full-attention bound
    lo = layout.block_size
    if kv.max_concurrency_at_max_model_len(layout, blocks, lo, in_flight) < requests:
        return None
    while lo < hi:  # the ceiling falls as the length grows: bisect the last length that still fits
        mid = (lo + hi + 1) // 2
        if kv.max_concurrency_at_max_model_len(layout, blocks, mid, in_flight) >= requests:
            lo = mid
        else:
            hi = mid - 1
    if derived and lo == derived:
        return lo  # the model's own length fits: rounding it down to whole blocks would advise a needless cut
    return lo // layout.block_size * layout.block_size or lo


def long_context(plan: CapacityPlan, mfu: float = DEFAULT_MFU) -> LongContext | None:
    """The long-context block of a plan; None without a max_model_len."""
    max_len = plan.max_model_len
    if not max_len:
        return None
    spec = plan.spec
    arch: ModelArch | None = spec.arch
    requests = plan.max_concurrency_at_max_model_len or 0.0
    warnings: list[str] = []
    notes: list[str] = []
    flops = seconds = None
    tflops = spec.gpu_bf16_tflops
    if arch is not None:
        flops, routing_known = prefill_flops(arch, max_len)
        if not routing_known:
            notes.append("num_experts_per_tok is not in the model's config: the prefill estimate counts every "
                         "expert, so it is an upper bound")
        if tflops:
            # PP stages run one after another for one prompt: only TP divides its time.
            seconds = flops / (spec.tensor_parallel_size * tflops * 1e12 * mfu)
        else:
            notes.append("no dense BF16 peak for this GPU (gpus.json): prefill time not estimated")
    steps = math.ceil(max_len / max(1, plan.max_num_batched_tokens))
    delay = int(STARTUP_BASE_SECONDS + math.ceil(seconds)) if seconds is not None else None
    fits_4 = max_len_for(plan, TARGET_REQUESTS)
    # Only for a deployment that starts: when vLLM refuses it (the plan's errors), the error is the news.
    if plan.will_start and plan.num_gpu_blocks > 0 and requests < FEW_REQUESTS:
        where = (f"--max-model-len {fits_4} fits {TARGET_REQUESTS}" if fits_4 else
                 f"no max_model_len fits {TARGET_REQUESTS} in this pool")
        warnings.append(f"only {requests:.2f} requests of max_model_len {max_len:,} fit at once: one long "
                        f"request can hold the whole KV cache and the rest wait; {where}")
    return LongContext(max_model_len=max_len, requests_at_max_model_len=requests, prefill_flops=flops,
                       prefill_seconds_estimate=seconds, mfu=mfu, gpu_bf16_tflops=tflops,
                       chunked_prefill_steps=steps, probe_initial_delay_seconds=delay,
                       max_model_len_for_4=fits_4, warnings=tuple(warnings), notes=tuple(notes))
