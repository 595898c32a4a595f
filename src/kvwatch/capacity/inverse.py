"""The inverse planner: which deployments carry N concurrent requests of T tokens, cheapest first (pure).

:func:`inverse_plan` tries every combination of the levers vLLM offers, in the tutorial's order of cost —
``--gpu-memory-utilization`` 0.95, a shorter ``--max-model-len`` (only when the model's own does not start),
an FP8 KV cache, FP8 weights, tensor parallelism within one node (a power of two that divides the attention
heads, at most ``gpus_per_node``) — and then as many replicas as the target needs. Each option is a full
:class:`CapacityPlan` plus the vLLM arguments that produce it.

Ranking: fewest GPUs in total; then the fewest quality-affecting changes (FP8 weights cost more than an FP8 KV
cache, which costs more than a utilization or length change); then the highest ceiling. A replica carries
``min(ceiling at T tokens, max_num_seqs)`` requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvwatch.capacity import memory, quantization
from kvwatch.capacity.architecture import block_quant_split, tensor_parallel_refusal
from kvwatch.capacity.memory import QuantizationError
from kvwatch.capacity.planner import EXPERT_PARALLEL_FLAG, CapacityPlan, DeploymentSpec, SpecError, plan_capacity
from kvwatch.capacity.whatif import UTILIZATIONS

HIGH_UTILIZATION = max(UTILIZATIONS)  # the highest utilization the what-ifs try
MAX_OPTIONS = 10
# What a change costs in model quality or risk (0 = a restart with another flag).
_QUALITY_COST = {"gpu_memory_utilization": 0, "max_model_len": 0, "kv_cache_dtype": 1, "quantization": 2,
                 "tensor_parallel_size": 0}


@dataclass(frozen=True)
class Option:
    plan: CapacityPlan
    replicas: int
    per_replica: float  # requests of avg_seq_len one replica carries (ceiling capped by max_num_seqs)
    changes: tuple[str, ...]  # the DeploymentSpec fields changed from the base
    vllm_args: tuple[str, ...]

    @property
    def gpus_per_replica(self) -> int:
        return self.plan.spec.tensor_parallel_size * self.plan.spec.pipeline_parallel_size

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas


@dataclass(frozen=True)
class InversePlan:
    target_concurrency: int
    avg_seq_len: float
    options: tuple[Option, ...]
    why_not: str | None  # when no option exists


def vllm_args(spec: DeploymentSpec, model: str | None) -> tuple[str, ...]:
    """The flags that make vLLM run ``spec`` (``--flag=value`` strings, ready for a shell or a pod's args)."""
    args = [f"--model={model}"] if model else []
    args.append(f"--tensor-parallel-size={spec.tensor_parallel_size}")
    if spec.arch is not None and (split := block_quant_split(spec.arch, spec.tensor_parallel_size)) and split[1]:
        args.append(EXPERT_PARALLEL_FLAG)  # (FP8 experts whose blocks a TP split would cut: plan_capacity's warning)
    if spec.pipeline_parallel_size > 1:
        args.append(f"--pipeline-parallel-size={spec.pipeline_parallel_size}")
    if spec.gpu_memory_utilization is not None:
        args.append(f"--gpu-memory-utilization={spec.gpu_memory_utilization:g}")
    if spec.max_model_len:
        args.append(f"--max-model-len={spec.max_model_len}")
    if spec.kv_cache_dtype != "auto":
        args.append(f"--kv-cache-dtype={spec.kv_cache_dtype}")
    if spec.quantization:
        args.append(f"--quantization={spec.quantization}")
    if spec.block_size != 16:
        args.append(f"--block-size={spec.block_size}")
    if spec.max_num_seqs:
        args.append(f"--max-num-seqs={spec.max_num_seqs}")
    if spec.max_num_batched_tokens:
        args.append(f"--max-num-batched-tokens={spec.max_num_batched_tokens}")
    return tuple(args)


def _tp_candidates(spec: DeploymentSpec, gpus_per_node: int) -> list[int]:
    """Every power of two vLLM accepts for the model up to a node, from 1: the given size was a floor (the sidecar's
    KVWATCH_TENSOR_PARALLEL_SIZE=2 hid every one-GPU deployment) and one vLLM refuses (3) was let through."""
    if spec.arch is not None and (refusal := tensor_parallel_refusal(spec.arch, spec.tensor_parallel_size)):
        raise SpecError(f"invalid value {spec.tensor_parallel_size} for --tensor-parallel-size: {refusal}")
    out, tp = [], 1
    while tp <= gpus_per_node:
        if spec.arch is None or tensor_parallel_refusal(spec.arch, tp) is None:
            out.append(tp)
        tp *= 2
    return out or [spec.tensor_parallel_size]


def _already_fp8_weights(spec: DeploymentSpec) -> bool:
    try:
        current = memory.resolve_quantization(spec.quantization, spec.arch)
    except QuantizationError:
        return True  # unpriceable: do not offer a change on top of it
    return current is not None and current.bytes_per_param <= 1.0


def _fitting_length(plan: CapacityPlan, avg_seq_len: float) -> int | None:
    """The max_model_len to offer when the model's own does not start: the longest at which 4 requests fit (the
    bar of the plan's own long-context warning), else the longest this pool starts with, as the plan's error
    suggests (None if it has none). The longest that starts alone was 2.8M tokens on Llama-4-Scout, where the
    plan of that option then warned that one request could hold the whole cache."""
    from kvwatch.capacity.longcontext import TARGET_REQUESTS, max_len_for
    from kvwatch.capacity.planner import _fitting_len

    if plan.num_gpu_blocks <= 0:
        return None
    roomy = max_len_for(plan, TARGET_REQUESTS)
    if roomy and roomy >= avg_seq_len:
        return roomy
    return _fitting_len(plan.layout, plan.num_gpu_blocks, plan.in_flight_tokens) or None


def inverse_plan(spec: DeploymentSpec, target_concurrency: int, avg_seq_len: float, gpus_per_node: int = 8,
                 model_name: str | None = None, max_model_len_given: bool = False) -> InversePlan:
    """Options that reach ``target_concurrency`` requests of ``avg_seq_len`` tokens, cheapest first."""
    if target_concurrency < 1 or avg_seq_len <= 0 or gpus_per_node < 1:
        raise SpecError("the target concurrency, average length and GPUs per node must be positive")
    if spec.weights_bytes is not None or spec.available_kv_bytes is not None:
        raise SpecError("the inverse planner changes TP and quantization, which measured --weights-gib/"
                        "--available-kv-gib do not follow: leave them out")
    utils = sorted({spec.gpu_memory_utilization or 0.0, HIGH_UTILIZATION})
    kv_dtypes = [spec.kv_cache_dtype] + ([] if spec.kv_cache_dtype.startswith("fp8") else ["fp8"])
    # (not FP8 weights for a checkpoint of another method: vLLM refuses it, quantization.method_mismatch)
    quants = [spec.quantization] + ([] if _already_fp8_weights(spec) or quantization.method_mismatch(
        "fp8", spec.arch.checkpoint_quant_method if spec.arch else None) else ["fp8"])
    reasons: dict[int, str] = {}  # per TP, the last failure: the most generous settings tried (the closest miss)
    options: dict[tuple[object, ...], Option] = {}
    for tp in _tp_candidates(spec, gpus_per_node):
        for util in utils:
            for kv_dtype in kv_dtypes:
                for quant in quants:
                    candidate = replace(spec, tensor_parallel_size=tp, gpu_memory_utilization=util or None,
                                        kv_cache_dtype=kv_dtype, quantization=quant)
                    # (a reason names the settings it was tried at: TP=8 read twice, 10.96 and 8.59 GiB short)
                    tried = [f"TP={tp}"]
                    if util != utils[0]:
                        tried.append(f"--gpu-memory-utilization {util:.2f}")
                    if kv_dtype != kv_dtypes[0]:
                        tried.append(f"--kv-cache-dtype {kv_dtype}")
                    if quant != quants[0]:
                        tried.append(f"--quantization {quant}")
                    label = ", ".join(tried)
                    option = _option(spec, candidate, target_concurrency, avg_seq_len, model_name,
                                     max_model_len_given, reasons, label)
                    if option is not None:
                        key = (tp, util, kv_dtype, quant)
                        options[key] = option
    ranked = sorted(options.values(), key=lambda o: (o.total_gpus, _quality(o), len(o.changes), -o.per_replica))
    why = None
    if not ranked:
        why = ("no setting starts: " + "; ".join(reasons.values())) if reasons else "no setting starts"
    return InversePlan(target_concurrency, avg_seq_len, tuple(ranked[:MAX_OPTIONS]), why)


def _quality(option: Option) -> int:
    return sum(_QUALITY_COST.get(change, 0) for change in option.changes)


def _option(base: DeploymentSpec, spec: DeploymentSpec, target: int, avg_seq_len: float, model: str | None,
            length_given: bool, reasons: dict[int, str], label: str) -> Option | None:
    try:
        plan = plan_capacity(spec)
        if plan.errors and not length_given and plan.max_model_len and plan.num_gpu_blocks > 0 and \
                not any("greater than the model's maximum" in e for e in plan.errors):
            shorter = _fitting_length(plan, avg_seq_len)  # the model's own length does not start
            if shorter and shorter >= avg_seq_len:
                spec = replace(spec, max_model_len=shorter)
                plan = plan_capacity(spec)
    except (SpecError, QuantizationError) as exc:
        reasons[spec.tensor_parallel_size] = f"{label}: {exc}"
        return None
    if plan.errors:
        reasons[spec.tensor_parallel_size] = f"{label}: {plan.errors[0]}"
        return None
    per_replica = plan.running_limit_at(avg_seq_len)
    if per_replica < 1:
        reasons[spec.tensor_parallel_size] = f"{label}: fewer than one {avg_seq_len:,.0f}-token request fits"
        return None
    replicas = math.ceil(target / math.floor(per_replica))
    changes = tuple(name for name in ("gpu_memory_utilization", "max_model_len", "kv_cache_dtype", "quantization",
                                      "tensor_parallel_size") if getattr(spec, name) != getattr(base, name))
    return Option(plan, replicas, per_replica, changes, vllm_args(spec, model))
