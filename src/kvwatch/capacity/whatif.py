"""What-if scenarios, cheapest fix first as the tutorial ranks them (pure).

Each scenario changes one thing in the deployment and re-runs :func:`plan_capacity`. Measured
overrides are carried over and adjusted for the change (e.g. FP8 weights scale measured weights by the
estimated ratio), so a plan built from a startup log stays anchored to that log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from kvwatch.capacity import kv, memory
from kvwatch.capacity.architecture import block_quant_split
from kvwatch.capacity.memory import QuantizationError
from kvwatch.capacity.planner import EXPERT_PARALLEL_FLAG, CapacityPlan, DeploymentSpec, SpecError, plan_capacity
from kvwatch.capacity.units import GIB

UTILIZATIONS = (0.85, 0.95)


@dataclass(frozen=True)
class Scenario:
    name: str
    kv_cache_tokens: int | None  # None when the change cannot be computed from what is known (see note)
    max_concurrency: float | None  # at the base's avg_seq_len if given, else at the scenario's max_model_len
    note: str
    plan: CapacityPlan | None = None

    def max_concurrency_at(self, avg_kv_tokens_per_request: float) -> float | None:
        """This scenario's ceiling for a live average of KV tokens per running request."""
        if self.plan is None or avg_kv_tokens_per_request <= 0:
            return None
        return self.plan.max_concurrency_at(avg_kv_tokens_per_request)


def ceiling_ratio(base: CapacityPlan, changed: CapacityPlan | None, avg_kv_tokens_per_request: float) -> float | None:
    """How a change moves the concurrency ceiling at a request size: ``changed``'s ceiling over ``base``'s. The one
    figure for the advice's "the ceiling goes from ... to ..." and ``kvwatch_whatif_max_concurrency``: where the KV
    tokens and the ceiling do not scale alike (a Mamba hybrid's state pages keep their dtype under an FP8 KV cache),
    the tokens' ratio overstated the ceiling's (x1.53 said, x1.28 exported)."""
    if changed is None or avg_kv_tokens_per_request <= 0:
        return None
    now = base.max_concurrency_at(avg_kv_tokens_per_request)
    return changed.max_concurrency_at(avg_kv_tokens_per_request) / now if now > 0 else None


def whatif_ceilings(scenarios: Iterable[Scenario], avg_kv_tokens_per_request: float) -> dict[str, float]:
    """``{scenario name: ceiling}`` at a live average (what ``kvwatch_whatif_max_concurrency`` exports)."""
    out: dict[str, float] = {}
    for s in scenarios:
        value = s.max_concurrency_at(avg_kv_tokens_per_request)
        if value is not None:
            out[s.name] = value
    return out


# vllm/v1/worker/gpu_worker.py determine_available_memory returns kv_cache_memory_bytes as given ("This does not
# respect the gpu_memory_utilization config"): weights freed by FP8 or TP leave the pool as it is too.
FIXED_POOL = "vLLM's --kv-cache-memory-bytes sets the pool"


def _utilization(spec: DeploymentSpec, base: CapacityPlan, util: float) -> tuple[DeploymentSpec | None, str]:
    if spec.kv_pool_fixed:
        return replace(spec), f"{FIXED_POOL}: --gpu-memory-utilization does not change it"
    if spec.available_kv_bytes is not None:
        if base.total_memory_bytes is None:
            return None, "needs the GPU memory (--gpu or --gpu-memory-gib) to re-budget a measured KV pool"
        delta = base.total_memory_bytes * (util - base.gpu_memory_utilization)
        return replace(spec, gpu_memory_utilization=util, available_kv_bytes=spec.available_kv_bytes + delta), ""
    return replace(spec, gpu_memory_utilization=util), ""


def _weights_ratio(spec: DeploymentSpec, quantization: str, dtype_bytes: int) -> float:
    if spec.arch is None:
        return 1.0 / dtype_bytes  # unquantized linear weights, 1 byte each in FP8
    tp, pp = spec.tensor_parallel_size, spec.pipeline_parallel_size
    cc = spec.gpu_compute_capability
    now = memory.estimate_weights_bytes(spec.arch, dtype_bytes, spec.quantization, tp, pp, compute_capability=cc)
    after = memory.estimate_weights_bytes(spec.arch, dtype_bytes, quantization, tp, pp, compute_capability=cc)
    return after / now if now else 1.0


def _weights(spec: DeploymentSpec) -> tuple[float | None, str]:
    """Today's weights per GPU as a what-if re-budgets them: measured (``--weights-gib``); for a measured KV pool,
    which needs no weights to plan, kvwatch's estimate from the model where it is known, with a note saying so (FP8
    and TP re-budget the pool by what they free; without it a what-if asked for ``--model`` with ``--model`` given);
    else None (the changed plan estimates them itself), with why when the estimate cannot stand beside the measured
    pool: the two together past the card (DeepSeek-V3 on one H100 beside 40 GiB measured: TP x2 'freed' half of
    634 GiB, 5.4M tokens on an 80 GB card)."""
    if spec.weights_bytes is not None or spec.available_kv_bytes is None or spec.arch is None:
        return spec.weights_bytes, ""
    try:
        weights = memory.estimate_weights_bytes(
            spec.arch, memory.model_dtype_bytes(spec.dtype, spec.arch), spec.quantization,
            spec.tensor_parallel_size, spec.pipeline_parallel_size, compute_capability=spec.gpu_compute_capability)
    except QuantizationError:
        return None, ""
    card = spec.gpu_memory_bytes
    if card and weights + spec.available_kv_bytes > card:
        return None, (f"kvwatch's estimate of the weights ({weights / GIB:.1f} GiB per GPU) and the measured KV pool "
                      f"({spec.available_kv_bytes / GIB:.1f} GiB) do not fit the {card / GIB:.0f} GiB card: pass "
                      "--weights-gib from vLLM's log")
    return float(weights), f" (weights {weights / GIB:.2f} GiB per GPU, estimated from the model)"


def _fp8_weights(spec: DeploymentSpec, base: CapacityPlan) -> tuple[DeploymentSpec | None, str]:
    dtype_bytes = memory.model_dtype_bytes(spec.dtype, spec.arch)
    try:
        current = memory.resolve_quantization(spec.quantization, spec.arch)
    except QuantizationError as exc:
        return None, f"cannot price today's weights: {exc}"
    # Where the model is known, the weights as priced decide, not the scheme's nominal bytes: experts_int8 on a
    # dense model leaves its weights in the model dtype ("already experts_int8: no gain" beside
    # bf16-priced weights that FP8 would shrink by 11.8 % of the plan's tokens).
    ratio = _weights_ratio(spec, "fp8", dtype_bytes)
    if current is not None and (ratio >= 1.0 if spec.arch is not None else current.bytes_per_param <= 1.0):
        return replace(spec), f"weights are already {current.scheme}: no gain"
    if spec.kv_pool_fixed:
        return replace(spec), f"{FIXED_POOL}: the memory FP8 weights free stays unused unless it is raised"
    quantized_already = _measured_weights_look_quantized(spec, dtype_bytes)
    if quantized_already:
        return replace(spec), quantized_already
    changed = replace(spec, quantization="fp8")
    weights, estimated = _weights(spec)
    if weights is not None:
        saved = weights * (1 - ratio)
        changed = replace(changed, weights_bytes=weights - saved)
        if spec.available_kv_bytes is not None:
            changed = replace(changed, available_kv_bytes=spec.available_kv_bytes + saved)
    elif spec.available_kv_bytes is not None:
        return None, estimated or ("needs the weights (--weights-gib, or --model for kvwatch's estimate) to know what "
                                   "FP8 frees")
    assumed = "; assumes 16-bit weights: pass --quantization if they are not" if spec.arch is None and \
        current is None and spec.weights_bytes is not None else ""
    return changed, f"frees weight memory for KV (quantization does not shrink the KV cache itself){estimated}{assumed}"


QUANTIZED_LOOK = 0.6
"""Measured weights at most this share of kvwatch's estimate for the model's dtype are already 8-bit or smaller
(bf16 to FP8 leaves about 0.52 of them: embeddings and the head stay 16-bit)."""


def _measured_weights_look_quantized(spec: DeploymentSpec, dtype_bytes: int) -> str:
    """Why FP8 weights would gain nothing when ``--weights-gib`` is a fraction of what the model weighs unquantized
    (a FP8 checkpoint planned as its bf16 base: +44 % of the concurrency promised, and nothing to gain), else ''."""
    if spec.weights_bytes is None or spec.arch is None or spec.quantization is not None:
        return ""
    try:
        estimate = memory.estimate_weights_bytes(
            spec.arch, dtype_bytes, None, spec.tensor_parallel_size, spec.pipeline_parallel_size,
            compute_capability=spec.gpu_compute_capability)
    except QuantizationError:
        return ""
    if not estimate or spec.weights_bytes > QUANTIZED_LOOK * estimate:
        return ""
    share = spec.weights_bytes / estimate
    return (f"the measured weights ({spec.weights_bytes / GIB:.2f} GiB per GPU) are {share:.0%} of the model's at "
            f"{dtype_bytes} bytes a parameter ({estimate / GIB:.2f} GiB): they look quantized already, so no gain "
            "is shown (pass --quantization with the checkpoint's scheme)")


def _tp_x2(spec: DeploymentSpec, base: CapacityPlan) -> tuple[DeploymentSpec | None, str]:
    return _tensor_parallel(spec, spec.tensor_parallel_size * 2)


def _tensor_parallel(spec: DeploymentSpec, tp: int) -> tuple[DeploymentSpec | None, str]:
    """``spec`` re-sharded over ``tp`` GPUs per replica (weights and, up to the KV head count, KV split), and what
    changes, naming the flag vLLM then needs to load block-FP8 experts (the plan's warning)."""
    changed, how = _resharded(spec, tp)
    if spec.arch is not None and (split := block_quant_split(spec.arch, tp)) is not None and split[1]:
        how += f"; with {EXPERT_PARALLEL_FLAG} (its FP8 experts split {tp} ways would cut their weight blocks)"
    return changed, how


def _resharded(spec: DeploymentSpec, tp: int) -> tuple[DeploymentSpec | None, str]:
    share = spec.tensor_parallel_size / tp  # what one GPU keeps of today's per-GPU weights
    doubled = tp == 2 * spec.tensor_parallel_size
    times, part = ("twice", "half") if doubled else (f"{tp / spec.tensor_parallel_size:g}x", "less")
    changed = replace(spec, tensor_parallel_size=tp)
    kv_share = _kv_share(spec, tp)
    if spec.kv_pool_fixed:  # each GPU keeps its pool in bytes: only the KV per token is split
        split = spec.arch is None or (not spec.arch.is_mla and max(spec.arch.kv_head_counts) >= tp)
        if spec.kv_bytes_per_token is not None and split:
            changed = replace(changed, kv_bytes_per_token=spec.kv_bytes_per_token * kv_share)
        return changed, (f"{times} the GPUs per replica; {FIXED_POOL} on each, so only "
                         f"{'the KV per token split' if split else 'a KV split, which this model does not get,'} "
                         "adds tokens")
    weights, estimated = _weights(spec)
    if spec.available_kv_bytes is not None and weights is None:
        return None, estimated or ("needs the weights (--weights-gib, or --model for kvwatch's estimate) to re-budget "
                                   "a measured KV pool")
    if weights is not None:
        changed = replace(changed, weights_bytes=weights * share)
    if spec.non_torch_bytes is not None and spec.tensor_parallel_size == 1:
        changed = replace(changed, non_torch_bytes=float(memory.estimate_non_torch_bytes(tp, 1)))
    if spec.available_kv_bytes is not None and weights is not None:
        extra_non_torch = (memory.estimate_non_torch_bytes(tp, 1) - (spec.non_torch_bytes or memory.NON_TORCH_TP1_BYTES)
                           if spec.tensor_parallel_size == 1 else 0.0)
        changed = replace(changed, available_kv_bytes=spec.available_kv_bytes + weights * (1 - share)
                          - max(0.0, extra_non_torch))
    if spec.kv_bytes_per_token is not None:
        changed = replace(changed, kv_bytes_per_token=spec.kv_bytes_per_token * kv_share)
        if spec.arch is None:
            kv_note = (f"{part} the KV per token if the model's KV heads split (not for MLA, nor past as many ranks "
                       "as KV heads: pass --model to know)")
        elif kv_share == 1:
            kv_note = "the KV per token unchanged (MLA KV is not split by TP)" if spec.arch.is_mla else \
                "the KV per token unchanged (KV heads already replicated)"
        elif kv_share == share:
            kv_note = f"{part} the KV per token"
        else:
            kv_note = f"{kv_share:.2g}x the KV per token (some layers' KV heads are replicated)"
        return changed, f"{times} the GPUs per replica: {part} the weights per GPU; {kv_note}{estimated}"
    arch = spec.arch
    if arch is not None and arch.is_mla:
        kv_note = "MLA KV is not split by TP, so only the freed weight memory helps"
    elif arch is not None and max(arch.kv_head_counts) < tp:
        most = max(arch.kv_head_counts)
        kv_note = f"only {most} KV heads: they are replicated beyond TP={most}"
    elif arch is not None and min(arch.kv_head_counts) < tp:
        kv_note = (f"{part} the KV heads per GPU in the layers with more than {min(arch.kv_head_counts)} (the others' "
                   "are replicated)")
    else:
        kv_note = f"{part} the KV heads per GPU"
    return changed, f"{times} the GPUs per replica: {part} the weights per GPU; {kv_note}{estimated}"


def _kv_share(spec: DeploymentSpec, tp: int) -> float:
    """How much of a rank's KV per token is left at ``tp`` ranks (a given --kv-bytes-per-token scales by it): the
    model's own per-layer sum at both sizes (MLA KV is not split, heads fewer than the ranks are replicated); without
    the model, the ranks' ratio."""
    arch = spec.arch
    if arch is None:
        return spec.tensor_parallel_size / tp

    def per_token(ranks: int) -> int:
        types = arch.attention_layer_types or (None,)
        return sum(kv.kv_bytes_per_token_per_layer(arch, ranks, 1, layer_type=t) for t in types)

    return per_token(tp) / per_token(spec.tensor_parallel_size)


def tensor_parallel_plan(spec: DeploymentSpec, tp: int) -> CapacityPlan | None:
    """The plan at ``--tensor-parallel-size tp`` (what the advisor sizes its TP fix with); None if unknown."""
    changed, _ = _tensor_parallel(spec, tp)
    if changed is None:
        return None
    try:
        plan = plan_capacity(changed)
    except (SpecError, ValueError, ArithmeticError):
        return None
    return plan if plan.kv_cache_tokens else None


# The scenarios that change the memory left for the KV cache: where vLLM >= 0.34 measures its own pool
# (CapacityPlan.pool_measured_by_engine) kvwatch's 0.33 sums do not size them (serve leaves them out there).
MEMORY_SCENARIOS = frozenset({"gpu_memory_utilization_0.85", "gpu_memory_utilization_0.95", "fp8_weights",
                              "tensor_parallel_x2"})


def whatif_scenarios(spec: DeploymentSpec, avg_seq_len: float | None = None) -> list[Scenario]:
    """Utilization 0.85 and 0.95, max-model-len halved, FP8 KV cache, FP8 weights, TP x2 (in that order)."""
    base = plan_capacity(spec)
    candidates: list[tuple[str, DeploymentSpec | None, str]] = []
    planned: dict[str, CapacityPlan] = {}  # the rows whose plan a note needed already
    for util in UTILIZATIONS:
        changed, why = _utilization(spec, base, util)
        now = f"{base.gpu_memory_utilization:.2f}"
        # (a row of today's setting stays, as fp8_kv_cache's does where the cache is FP8: the scenarios are fixed)
        setting = (f"--gpu-memory-utilization {now} is the current setting: no change" if f"{util:.2f}" == now else
                   f"--gpu-memory-utilization {util:.2f} (now {now})")
        candidates.append((f"gpu_memory_utilization_{util:.2f}", changed, why or setting))
    if base.max_model_len and base.max_model_len <= spec.block_size:
        candidates.append(("max_model_len_halved", None, f"--max-model-len {base.max_model_len} is within one block "
                           f"of {spec.block_size} tokens: halving it frees nothing"))
    elif base.max_model_len:
        half = max(spec.block_size, base.max_model_len // 2)
        # On a hybrid (sliding-window, chunked or Mamba) model past its window a request's windowed layers hold
        # their window whatever its length, so halving it does not halve what it needs (within the window it does:
        # gemma-2 at 4096); and vLLM from 0.20 reports such a pool's tokens from max-model-len (the planner's note),
        # so that column moves though the pool does not.
        full_need = kv.blocks_needed(base.layout, base.max_model_len, base.in_flight_tokens)
        # (within a block per KV group of half: an odd number of blocks halves to one over half; Llama-4 Scout's
        # chunked layers, at 0.535 of the blocks, are not half)
        halves = kv.blocks_needed(base.layout, half, base.in_flight_tokens) <= full_need / 2 + len(base.layout.groups)
        # With chunked prefill off a step holds a whole max-model-len prompt, so its profiling peak halves too,
        # unless --max-num-batched-tokens or a measured activation fixes it: the note follows the pool planned.
        halved = replace(spec, max_model_len=half)
        try:
            planned["max_model_len_halved"] = plan_capacity(halved)  # (the row's own plan, below)
            grows = planned["max_model_len_halved"].num_gpu_blocks > base.num_gpu_blocks
        except SpecError:
            grows = False
        if grows:
            pool = ("with chunked prefill off a step holds a whole prompt, so the profiling peak shrinks and the pool "
                    "grows" if not spec.enable_chunked_prefill else "the pool grows")
        else:
            pool = "the pool is unchanged" + ("" if spec.enable_chunked_prefill else " (the profiled step is fixed "
                                              "here by --max-num-batched-tokens or the measured activation)")
        need = ("each worst-case request needs half" if halves else "each worst-case request needs less, though "
                "not half (its windowed or state layers do not shrink with it)")
        candidates.append(("max_model_len_halved", halved, f"--max-model-len {half}: {pool}; {need}"))
    else:
        candidates.append(("max_model_len_halved", None, "needs --max-model-len"))
    already_fp8 = base.spec.kv_cache_dtype.startswith("fp8")  # (the dtype vLLM serves: DeepSeek-V3.2's auto may be)
    if already_fp8:
        candidates.append(("fp8_kv_cache", replace(spec), f"KV cache is already FP8 ({base.spec.kv_cache_dtype}): "
                                                           "no gain"))
    else:
        fp8 = replace(spec, kv_cache_dtype="fp8")
        if spec.kv_bytes_per_token is not None:
            fp8 = replace(fp8, kv_bytes_per_token=spec.kv_bytes_per_token * 1 / max(1, kv_element_bytes(spec)))
        state = (" (Mamba state pages keep their dtype, so requests shorter than max-model-len gain less than the "
                 "tokens)"
                 if spec.arch is not None and spec.arch.is_hybrid_mamba else "")
        candidates.append(("fp8_kv_cache", fp8,
                           f"--kv-cache-dtype fp8: one byte per KV element{state}"))
    candidates.append(("fp8_weights", *_fp8_weights(spec, base)))
    candidates.append(("tensor_parallel_x2", *_tp_x2(spec, base)))

    out: list[Scenario] = []
    for name, changed, note in candidates:
        if changed is None:
            out.append(Scenario(name, None, None, note))
            continue
        try:
            plan = planned.get(name) or plan_capacity(changed)
        except SpecError as exc:
            out.append(Scenario(name, None, None, str(exc)))
            continue
        if avg_seq_len and plan.max_model_len and avg_seq_len > plan.max_model_len:
            # Requests of the average length do not fit under this max-model-len: no ceiling of them to show.
            out.append(Scenario(name, plan.kv_cache_tokens, None, f"{note}; requests of --avg-seq-len "
                                f"{avg_seq_len:,.0f} tokens are longer than --max-model-len {plan.max_model_len:,}, "
                                "so vLLM would refuse them", plan))
            continue
        ceiling = plan.max_concurrency_at(avg_seq_len) if avg_seq_len else plan.max_concurrency_at_max_model_len
        if name == "fp8_kv_cache" and not already_fp8 and base.kv_cache_tokens and plan.kv_cache_tokens:
            # (the gain as planned: DeepSeek-V3.2's fp8_ds_mla keeps rope dims, scales and its indexer: x1.63)
            note = f"{note}, x{plan.kv_cache_tokens / base.kv_cache_tokens:.2f} the tokens"
        if plan.errors:
            note = f"{note}; {plan.errors[0]}"
        out.append(Scenario(name, plan.kv_cache_tokens, ceiling, note, plan))
    return out


def kv_element_bytes(spec: DeploymentSpec) -> int:
    """Bytes per KV element the spec stores (its --kv-cache-dtype; auto: the model's dtype)."""
    from kvwatch.capacity.kv import kv_dtype_bytes

    return kv_dtype_bytes(spec.kv_cache_dtype, memory.model_dtype_bytes(spec.dtype, spec.arch))
