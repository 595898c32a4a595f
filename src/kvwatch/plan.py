"""``kvwatch plan``: the KV capacity sums step by step, then the what-if table (or ``--json``/``--plot``).

Exit codes: 0 the deployment fits, 1 it will not start (the shortfall is printed) or the plot failed,
2 bad usage or config (the message names the flag).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from kvwatch.capacity import (
    ArchitectureError,
    CapacityPlan,
    DeploymentSpec,
    PresetError,
    QuantizationError,
    Scenario,
    SpecError,
    parse_bytes,
    parse_version,
    plan_capacity,
    whatif_scenarios,
)
from kvwatch.capacity import presets as preset_data
from kvwatch.capacity.architecture import ModelArch
from kvwatch.capacity.inverse import InversePlan, inverse_plan
from kvwatch.capacity.kv import (
    TOKENS_FROM_CONCURRENCY_SINCE,
    KVLayout,
    blocks_per_group_tokens,
    indexer_bytes_per_layer,
    indexer_layers,
    kv_bytes_per_token_per_layer,
    kv_dtype_bytes,
    layers_on_rank,
    max_concurrency_terms,
    tokens_needed,
)
from kvwatch.capacity.layers import CHUNKED, MAMBA, SLIDING
from kvwatch.capacity.longcontext import LongContext, long_context
from kvwatch.capacity.memory import model_dtype_bytes, parameter_counts, resolve_quantization
from kvwatch.capacity.planner import CUDA_GRAPHS_SUBTRACTED_SINCE, GRAPH_SUBTRACTING_VLLM, release
from kvwatch.capacity.rules import rules_range
from kvwatch.capacity.units import GIB, decimal_unit_note
from kvwatch.settings import (
    MAX_GPU_MEMORY_GIB,
    DeploymentSettings,
    SettingsError,
    add_settings_flags,
    load_settings,
    path_argument,
    png_output_path,
)

JSON_USAGE_ERRORS = True  # kvwatch.cli: with --json, bad usage is also {"error": {"reason": "usage", ...}}
_GIB_FLAGS = ("weights_gib", "activation_gib", "non_torch_gib", "available_kv_gib", "cuda_graph_gib")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Per-GPU figures. Measured overrides (from vLLM's startup log: 'Model loading took', 'Available KV cache "
        "memory', the memory-profiling line) replace the estimates. Exit 1 when vLLM would not start. "
        "Example (the tutorial): kvwatch plan --gpu-memory-gib 80 --gpu-memory-utilization 0.90 --weights-gib 42 "
        "--activation-gib 4 --non-torch-gib 0 --kv-bytes-per-token 0.0008GiB --avg-seq-len 4096"
    )
    add_settings_flags(parser, DeploymentSettings)
    plan = parser.add_argument_group("plan-only")
    plan.add_argument("--avg-seq-len", type=float, metavar="TOKENS",
                      help="Average KV tokens per request (prompt + output) for the concurrency ceiling.")
    plan.add_argument("--weights-gib", metavar="GIB", help="Measured weights per GPU ('Model loading took X GiB').")
    plan.add_argument("--cpu-offload-gb", metavar="GIB",
                      help="The deployment's vLLM --cpu-offload-gb: that much of each GPU's estimated weights is in "
                           "CPU memory, and the KV budget gains it (a measured --weights-gib already excludes it).")
    plan.add_argument("--activation-gib", metavar="GIB",
                      help="Measured activation peak per GPU (profiling line). With --pipeline-parallel-size > 1 it "
                           "is read as rank 0's, and the last stage's sampler (estimated) is added.")
    plan.add_argument("--non-torch-gib", metavar="GIB", help="Measured non-torch memory per GPU (profiling line).")
    plan.add_argument("--available-kv-gib", metavar="GIB",
                      help="Measured 'Available KV cache memory' per GPU (skips the budget sums).")
    plan.add_argument("--cuda-graph-gib", metavar="GIB",
                      help=f"Measured CUDA-graph memory per GPU that {GRAPH_SUBTRACTING_VLLM} subtracts before "
                           "sizing the cache (its memory-profiling line); default: kvwatch's estimate. Not with "
                           "--non-torch-gib figures that already include it.")
    plan.add_argument("--enforce-eager", action="store_true",
                      help="The deployment runs vLLM with --enforce-eager: no CUDA graphs, nothing subtracted.")
    plan.add_argument("--kv-bytes-per-token", metavar="BYTES",
                      help="KV bytes per token per GPU: a byte count or a number with a unit. KiB/MiB/GiB are "
                           "binary (0.8MiB = 838,861 B, 0.0008GiB = 858,993 B); kB/MB/GB are decimal "
                           "(0.0008GB = 800,000 B) and a note on stderr says so.")
    plan.add_argument("--vllm-version", metavar="X.Y",
                      help="vLLM version whose rules to follow (default utilization, how the token count is "
                           "reported, what sliding-window and chunked layers hold per request, hybrid grouping, "
                           "Mamba state blocks and dtype); default: 0.33 (the 0.32-0.33 rules), the newest whose "
                           "sums kvwatch models (0.34 sizes its KV cache from memory it measures: its plan says "
                           "so).")
    plan.add_argument("--allow-long-max-model-len", action="store_true",
                      help="The deployment sets VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: a --max-model-len past the model's "
                           "length (max_position_embeddings with RoPE scaling) is a warning, not a refusal.")
    plan.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false",
                      help="The deployment turns chunked prefill off: vLLM then refuses --max-num-batched-tokens "
                           "below --max-model-len.")
    caching = plan.add_mutually_exclusive_group()
    caching.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action="store_const", const=True,
                         help="The deployment turns prefix caching on (vLLM's default, except for hybrid Mamba models "
                              "on 0.26 and 0.27): each request then holds 2-3 state blocks per Mamba group.")
    caching.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_const",
                         const=False, help="The deployment turns prefix caching off: on a hybrid Mamba model (vLLM "
                                           ">= 0.26) each request then holds 1 state block per Mamba group instead "
                                           "of 2-3.")
    plan.add_argument("--target-concurrency", type=int, metavar="N",
                      help="Inverse planner: list the deployments that carry N concurrent requests of --avg-seq-len "
                           "tokens, cheapest first (utilization, max-model-len, FP8 KV, FP8 weights, TP within one "
                           "node, then replicas), each with the vLLM arguments to paste.")
    plan.add_argument("--json", action="store_true", help="Print one JSON object instead of the walk-through.")
    plan.add_argument("--plot", metavar="PNG", type=path_argument,
                      help="Write a PNG of the concurrency ceiling against context length (needs kvwatch[plot]).")
    plan.add_argument("--list-models", action="store_true", help="List the model presets and exit.")
    plan.add_argument("--list-gpus", action="store_true", help="List the GPU presets and exit.")


def _gib_flag(args: argparse.Namespace, name: str) -> float | None:
    raw = getattr(args, name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"invalid value {raw!r} for --{name.replace('_', '-')}: must be a number of GiB") from None
    if not math.isfinite(value) or value > MAX_GPU_MEMORY_GIB:  # NaN and inf (and 1e308) crashed or zeroed the sums
        raise SettingsError(f"invalid value {raw!r} for --{name.replace('_', '-')}: must be a finite number of GiB, "
                            f"at most {MAX_GPU_MEMORY_GIB:g} (one GPU's memory)")
    if value < 0:
        raise SettingsError(f"invalid value {raw!r} for --{name.replace('_', '-')}: must not be negative")
    return value * GIB


def build_spec(args: argparse.Namespace, settings: DeploymentSettings) -> DeploymentSpec:
    """Settings + plan-only overrides -> DeploymentSpec; every failure is a SettingsError naming a flag."""
    overrides: dict[str, Any] = {}
    for name in _GIB_FLAGS:
        value = _gib_flag(args, name)
        if value is not None:
            overrides[name.replace("_gib", "_bytes")] = value
    if "available_kv_bytes" in overrides:
        overrides["available_kv_logged_on_rank0"] = True  # vLLM's startup log line, printed by rank 0
    offload = _gib_flag(args, "cpu_offload_gb")
    if offload:
        overrides["cpu_offload_bytes"] = offload
    if args.kv_bytes_per_token is not None:
        try:
            overrides["kv_bytes_per_token"] = parse_bytes(args.kv_bytes_per_token)
        except ValueError as exc:
            raise SettingsError(f"invalid value for --kv-bytes-per-token: {exc}") from None
        if overrides["kv_bytes_per_token"] < 1:  # (0.4 rounded to 0 B: "0 tokens, will start")
            raise SettingsError(f"invalid value for --kv-bytes-per-token: {args.kv_bytes_per_token!r} is less than a "
                                "byte a token")
        note = decimal_unit_note(args.kv_bytes_per_token)
        if note:
            print(f"kvwatch plan: note: --kv-bytes-per-token {note}", file=sys.stderr)
    if args.avg_seq_len is not None and not (math.isfinite(args.avg_seq_len) and args.avg_seq_len >= 1):
        # (1e-9 tokens printed "at 0 tokens per request ... ≈ 30674285714285.71 requests")
        raise SettingsError(f"invalid value {args.avg_seq_len:g} for --avg-seq-len: must be at least 1 token")
    overrides["allow_long_max_model_len"] = bool(getattr(args, "allow_long_max_model_len", False))
    overrides["enforce_eager"] = bool(getattr(args, "enforce_eager", False))
    if overrides["enforce_eager"] and getattr(args, "cuda_graph_gib", None):
        # (--enforce-eager captures no CUDA graphs: the measured figure was dropped without a word)
        raise SettingsError("--enforce-eager and --cuda-graph-gib contradict each other: an eager engine captures "
                            "no CUDA graphs; pass one")
    overrides["enable_chunked_prefill"] = bool(getattr(args, "enable_chunked_prefill", True))
    overrides["enable_prefix_caching"] = getattr(args, "enable_prefix_caching", None)
    try:
        if args.vllm_version is not None and not args.vllm_version.strip():
            raise SpecError("invalid vLLM version '' (expected e.g. 0.19.0)")
        overrides["vllm_version"] = parse_version(args.vllm_version)
    except SpecError as exc:
        raise SettingsError(f"invalid value for --vllm-version: {exc}") from None
    try:
        return DeploymentSpec.from_settings(settings, **overrides)
    except PresetError as exc:
        flag = "--gpu" if "GPU" in str(exc) else "--model"
        raise SettingsError(f"invalid value for {flag}: {exc}") from None
    except ArchitectureError as exc:
        raise SettingsError(f"invalid value for --model-config: {exc}") from None
    except SpecError as exc:
        raise SettingsError(f"{exc} {exc.plan_hint}".rstrip()) from None


def run(args: argparse.Namespace) -> int:
    if args.list_models or args.list_gpus:  # (with --json a JSON list: a script asked for one format)
        names = preset_data.preset_names() if args.list_models else preset_data.gpu_names()
        print(json.dumps(list(names)) if args.json else "\n".join(names))
        return 0
    settings = load_settings(DeploymentSettings, args)
    if args.plot is not None:
        args.plot = png_output_path(args.plot)
    spec = build_spec(args, settings)
    if getattr(args, "target_concurrency", None) is not None:
        if args.plot is not None:  # (it was ignored: exit 0 and no file)
            raise SettingsError("--plot draws one deployment's plan: it cannot be used with --target-concurrency")
        return run_inverse(args, spec, settings.gpus_per_node)
    try:
        plan = plan_capacity(spec)
        scenarios = whatif_scenarios(spec, args.avg_seq_len)
    except SpecError as exc:
        raise SettingsError(f"{exc} {exc.plan_hint}".rstrip()) from None
    except QuantizationError as exc:  # names the flag that brought the quantization in (and the config field)
        raise SettingsError(f"invalid value for {exc.flag}: {exc}") from None
    _check_avg_seq_len(args.avg_seq_len, plan.max_model_len)
    if args.json:
        print(json.dumps(plan_to_dict(plan, scenarios, args.avg_seq_len), indent=2))
    else:
        print(render_text(plan, scenarios, args.avg_seq_len))
        print(render_long_context(long_context(plan)))
    if args.plot is not None:
        try:
            write_plot(args.plot, plan, scenarios, args.avg_seq_len)
        except OSError as exc:
            print(f"kvwatch plan: cannot write {args.plot}: {exc.strerror}", file=sys.stderr)
            return 1
    return 0 if plan.will_start else 1


def _check_avg_seq_len(avg_seq_len: float | None, max_model_len: int | None) -> None:
    """No request holds more than max_model_len tokens: a longer average describes a deployment that cannot exist."""
    if avg_seq_len is not None and max_model_len is not None and avg_seq_len > max_model_len:
        raise SettingsError(f"invalid value for --avg-seq-len: {avg_seq_len:,.0f} tokens is longer than the "
                            f"max_model_len ({max_model_len:,}) that caps every request; pass the mean tokens per "
                            "request, or a longer --max-model-len")


def run_inverse(args: argparse.Namespace, spec: DeploymentSpec, gpus_per_node: int) -> int:
    """``--target-concurrency``: the options table (or JSON); exit 1 when no option exists."""
    if args.target_concurrency < 1:
        raise SettingsError("invalid value for --target-concurrency: must be at least 1")
    if args.avg_seq_len is None:
        raise SettingsError("--target-concurrency needs --avg-seq-len (the tokens one request holds)")
    _check_avg_seq_len(args.avg_seq_len, spec.max_model_len)  # without the flag the planner picks a length ≥ it
    model = args.model or (spec.arch.name if spec.arch else None)
    try:
        result = inverse_plan(spec, args.target_concurrency, args.avg_seq_len, gpus_per_node, model,
                              max_model_len_given=spec.max_model_len is not None)
    except SpecError as exc:
        raise SettingsError(f"{exc} {exc.plan_hint}".rstrip()) from None
    except QuantizationError as exc:
        raise SettingsError(f"invalid value for {exc.flag}: {exc}") from None
    if args.json:
        print(json.dumps(inverse_to_dict(result), indent=2))
    else:
        print(render_inverse(result))
    return 0 if result.options else 1


def inverse_to_dict(result: InversePlan) -> dict[str, Any]:
    return {
        "target_concurrency": result.target_concurrency,
        "avg_seq_len": result.avg_seq_len,
        "why_not": result.why_not,
        "options": [
            {**plan_to_dict(o.plan, [], result.avg_seq_len), "replicas": o.replicas, "vllm_args": list(o.vllm_args),
             "requests_per_replica": o.per_replica, "gpus_per_replica": o.gpus_per_replica,
             "total_gpus": o.total_gpus, "changes": list(o.changes)}
            for o in result.options
        ],
    }


def render_inverse(result: InversePlan) -> str:
    out = [f"kvwatch plan: deployments for {result.target_concurrency} concurrent requests of "
           f"{result.avg_seq_len:,.0f} tokens, cheapest first", "",
           f"   {'#':>2} {'GPUs':>5} {'replicas':>8} {'TP':>3} {'requests/replica':>17}  vLLM arguments"]
    for i, o in enumerate(result.options, 1):
        out.append(f"   {i:>2} {o.total_gpus:>5} {o.replicas:>8} {o.plan.spec.tensor_parallel_size:>3} "
                   f"{o.per_replica:>17.1f}  {' '.join(o.vllm_args)}")
    if result.why_not:
        out.append(f"error: nothing reaches {result.target_concurrency}: {result.why_not}")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- output

def _max_concurrency(plan: CapacityPlan, avg_seq_len: float | None) -> float | None:
    return plan.max_concurrency_at(avg_seq_len) if avg_seq_len else plan.max_concurrency_at_max_model_len


def _runs(ceiling: float | None, plan: CapacityPlan | None) -> float | None:
    """The KV ceiling capped by the scheduler's max_num_seqs (CapacityPlan.running_limit_at, for either basis)."""
    return None if ceiling is None or plan is None else min(ceiling, float(plan.max_num_seqs))


def plan_to_dict(plan: CapacityPlan, scenarios: list[Scenario], avg_seq_len: float | None) -> dict[str, Any]:
    spec = plan.spec
    lc = long_context(plan)
    return {
        "model": spec.arch.name if spec.arch else None,
        "will_start": plan.will_start,
        "total_memory_bytes": _whole(plan.total_memory_bytes),
        "gpu_memory_utilization": plan.gpu_memory_utilization,
        "usable_bytes": _whole(plan.usable_bytes),
        "weights_bytes": _whole(plan.weights_bytes),
        "activation_bytes": _whole(plan.activation_bytes),
        "non_torch_bytes": _whole(plan.non_torch_bytes),
        "pp_last_stage_extra_bytes": _whole(plan.pp_last_stage_extra_bytes),
        "cuda_graph_bytes": _whole(plan.cuda_graph_bytes),
        "available_kv_bytes": _whole(plan.available_kv_bytes),
        "kv_bytes_per_token": _whole(plan.kv_bytes_per_token),
        "block_size": plan.layout.block_size,
        "kv_cache_groups": plan.layout.num_groups,
        "num_gpu_blocks": plan.num_gpu_blocks,
        "kv_cache_tokens": plan.kv_cache_tokens,
        "avg_seq_len": avg_seq_len,
        "max_model_len": plan.max_model_len,
        "model_max_len": spec.arch.derived_len(spec.vllm_version)[0] if spec.arch else None,
        "max_concurrency": _max_concurrency(plan, avg_seq_len),
        "max_concurrency_at_max_model_len": plan.max_concurrency_at_max_model_len,
        "max_num_seqs": plan.max_num_seqs,
        "running_limit": _runs(_max_concurrency(plan, avg_seq_len), plan),
        "tensor_parallel_size": spec.tensor_parallel_size,
        "pipeline_parallel_size": spec.pipeline_parallel_size,
        "vllm_version": ".".join(map(str, spec.vllm_version)),
        "vllm_rules": rules_range(spec.vllm_version),
        "estimated": list(plan.estimated),
        "warnings": [*plan.warnings, *(lc.warnings if lc else ())],
        "errors": list(plan.errors),
        "notes": list(plan.notes),
        "long_context": _long_context_dict(lc),
        "scenarios": [
            {"name": s.name, "kv_cache_tokens": s.kv_cache_tokens, "max_concurrency": s.max_concurrency,
             "running_limit": _runs(s.max_concurrency, s.plan),
             "will_start": s.plan.will_start if s.plan is not None else None, "note": s.note}
            for s in scenarios
        ],
    }


def _long_context_dict(lc: LongContext | None) -> dict[str, Any] | None:
    return None if lc is None else {
        "max_model_len": lc.max_model_len,
        "requests_at_max_model_len": lc.requests_at_max_model_len,
        "prefill_flops": lc.prefill_flops,
        "prefill_seconds_estimate": lc.prefill_seconds_estimate,
        "mfu_assumed": lc.mfu,
        "gpu_bf16_tflops": lc.gpu_bf16_tflops,
        "chunked_prefill_steps": lc.chunked_prefill_steps,
        "probe_initial_delay_seconds": lc.probe_initial_delay_seconds,
        "max_model_len_for_4_requests": lc.max_model_len_for_4,
        "warnings": list(lc.warnings),
        "notes": list(lc.notes),
    }


def _whole(n: float | None) -> int | None:
    """Bytes as a JSON integer (the sums are in float; a fraction of a byte means nothing)."""
    return None if n is None else round(n)


def _g(n_bytes: float | None) -> str:
    return "?" if n_bytes is None else f"{n_bytes / GIB:,.2f} GiB"


def _bytes(n: float) -> str:
    if n >= 1 << 20:
        return f"{n:,.0f} B ({n / (1 << 20):.4g} MiB)"
    return f"{n:,.0f} B ({n / 1024:.4g} KiB)"


def _group_caps(layout: KVLayout) -> str:
    """What caps a request's tokens in each kind of group the layout has (the ceiling line's parenthesis)."""
    kinds = {g.kind for g in layout.groups}
    caps = [text for kind, text in ((SLIDING, "sliding groups capped at the window"),
                                    (CHUNKED, "chunked groups at the chunk"),
                                    (MAMBA, f"{layout.mamba_blocks_per_request} state block(s) per Mamba group"
                                            if layout.mamba_blocks_per_request else
                                            "a state per block in each Mamba group"))
            if kind in kinds]
    return "; ".join(caps) or "every group holds every token"


def _kv_formula(plan: CapacityPlan) -> str:
    spec, arch, layout = plan.spec, plan.spec.arch, plan.layout
    if spec.kv_bytes_per_token is not None or arch is None:
        return f"given (--kv-bytes-per-token) = {_bytes(plan.kv_bytes_per_token)}"
    elem = layout.bytes_per_token_per_layer
    layers = layout.num_attention_layers
    if arch.is_mla:
        indexer = indexer_bytes_per_layer(arch, spec.vllm_version)
        latent_bytes = elem - indexer
        if spec.kv_cache_dtype.lower() == "fp8_ds_mla":
            latent = f"{latent_bytes} B fp8_ds_mla"
        else:
            dims = int(arch.kv_lora_rank or 0) + int(arch.qk_rope_head_dim or 0)
            latent = (f"({arch.kv_lora_rank} kv_lora_rank + {arch.qk_rope_head_dim} rope dims) × "
                      f"{latent_bytes // dims} B")
        holding = indexer_layers(arch, spec.vllm_version)
        shared = (f", {holding} of {arch.num_layers} layers' {arch.indexer_bytes_per_token} B"
                  if holding < arch.num_layers else "")
        inner = f"({latent} + {indexer} B indexer keys{shared})" if indexer else latent
        per = f"{layers} layers × {inner} (MLA, not split by TP)"
    elif arch.attention_dims:
        per = " + ".join(_per_type_term(plan, kind) for kind in dict.fromkeys(arch.kv_cache_layer_types))
    else:
        heads = max(1, arch.num_kv_heads // spec.tensor_parallel_size)
        per = f"2 × {layers} layers × {heads} KV heads × {arch.head_dim} head_dim × " \
              f"{elem // (2 * heads * arch.head_dim)} B"
    return f"{per} = {_bytes(plan.kv_bytes_per_token)}"


def _per_type_term(plan: CapacityPlan, kind: str) -> str:
    """One layer type's share of the KV bytes per token where types have dims of their own (Gemma 4, MiMo)."""
    spec, arch = plan.spec, plan.spec.arch
    assert arch is not None
    tp = spec.tensor_parallel_size
    types = arch.kv_cache_layer_types
    layers = layers_on_rank(len(types), spec.pipeline_parallel_size)
    count = types[:layers].count(kind)
    element = kv_dtype_bytes(spec.kv_cache_dtype, model_dtype_bytes(spec.dtype, arch))
    per_layer = kv_bytes_per_token_per_layer(arch, tp, element, spec.kv_cache_dtype, kind, spec.vllm_version)
    heads = max(1, arch.kv_dims(kind).num_kv_heads // tp)
    sizes = per_layer // (heads * element)
    return f"{count} {kind.split('_')[0]} layers × {heads} KV heads × {sizes} (K + V head sizes) × {element} B"


def _weights_detail(arch: ModelArch | None, plan: CapacityPlan) -> str:
    if "weights" not in plan.estimated or arch is None:
        return "measured"
    embed, dense, experts = parameter_counts(arch)
    resolved = resolve_quantization(plan.spec.quantization, arch)
    quant = resolved.how if resolved else plan.spec.dtype
    offload = ", minus --cpu-offload-gb" if plan.spec.cpu_offload_bytes else ""
    split = ("/ TP, the heaviest pipeline stage's (a vocabulary matrix at each end)"
             if plan.spec.pipeline_parallel_size > 1 else "/ TP")
    return f"estimated: {(embed + dense + experts) / 1e9:.2f} B params, {quant}, {split}{offload}"


def _cuda_graph_detail(plan: CapacityPlan) -> str:
    if "cuda_graphs" in plan.estimated:
        return f"estimated: {GRAPH_SUBTRACTING_VLLM} subtracts it before sizing the cache"
    if plan.cuda_graph_bytes:
        return "measured"
    if plan.spec.enforce_eager:
        return "--enforce-eager"
    if plan.spec.vllm_version >= CUDA_GRAPHS_SUBTRACTED_SINCE:
        return "not estimated without the model: pass --cuda-graph-gib"
    return f"not subtracted before vLLM {release(CUDA_GRAPHS_SUBTRACTED_SINCE)}"


def _activation_detail(plan: CapacityPlan) -> str:
    if "activation" in plan.estimated:
        return f"estimated: profile run of {plan.max_num_batched_tokens} batched tokens and the sampler"
    if plan.pp_last_stage_extra_bytes:
        rank0 = (plan.activation_bytes or 0) - plan.pp_last_stage_extra_bytes
        return (f"measured on rank 0: {_g(rank0)} + {_g(plan.pp_last_stage_extra_bytes)} estimated for the last "
                "PP stage's sampler")
    return "measured"


def render_text(plan: CapacityPlan, scenarios: list[Scenario], avg_seq_len: float | None) -> str:
    spec, layout = plan.spec, plan.layout
    name = spec.arch.name if spec.arch else "model given by its KV bytes per token"
    out = [f"kvwatch plan: {name}, TP={spec.tensor_parallel_size} PP={spec.pipeline_parallel_size}, "
           f"vLLM {rules_range(spec.vllm_version)} rules (figures per GPU)", ""]
    out.append("1. KV budget = total × gpu_memory_utilization − weights − activation peak − non-torch − CUDA graphs")
    if spec.available_kv_bytes is not None and plan.pp_last_stage_extra_bytes:
        out += [f"   given       {_g(spec.available_kv_bytes):>12}  (--available-kv-gib: rank 0's)",
                f"   − sampler   {_g(plan.pp_last_stage_extra_bytes):>12}  (estimated: the last stage's, the "
                "tightest, whose pool vLLM keeps)",
                f"   = KV budget                                        = {_g(plan.available_kv_bytes)}"]
    elif spec.available_kv_bytes is not None:
        out.append(f"   given (--available-kv-gib)                         = {_g(plan.available_kv_bytes)}")
    else:
        out += [
            f"   usable      {_g(plan.total_memory_bytes)} × {plan.gpu_memory_utilization:.2f}"
            f"{'':>18}= {_g(plan.usable_bytes)}",
            f"   − weights     {_g(plan.weights_bytes):>12}  ({_weights_detail(spec.arch, plan)})",
            f"   − activation  {_g(plan.activation_bytes):>12}  ({_activation_detail(plan)})",
            f"   − non-torch   {_g(plan.non_torch_bytes):>12}  "
            f"({'estimated' if 'non_torch' in plan.estimated else 'measured'})",
            f"   − CUDA graphs {_g(plan.cuda_graph_bytes):>12}  ({_cuda_graph_detail(plan)})",
            f"   = KV budget                                        = {_g(plan.available_kv_bytes)}",
        ]
    out += ["", "2. KV bytes per token per GPU", f"   {_kv_formula(plan)}"]
    if layout.is_hybrid:
        kinds = ", ".join(f"{g.kind.split('_')[0]}{'(' + str(g.sliding_window) + ')' if g.kind == SLIDING else ''}"
                          for g in layout.groups)
        out.append(f"   layers grouped by attention type: {layout.num_groups} groups of {layout.group_size} "
                   f"layer slots [{kinds}]; one block row = {layout.group_size} pages")
    out += ["", "3. Blocks and tokens"]
    if layout.is_hybrid:
        out += [f"   blocks = floor({_g(plan.available_kv_bytes)} ÷ ({layout.block_size} tokens × {layout.group_size} "
                f"layer slots × {_bytes(layout.bytes_per_token_per_layer)})) = {plan.num_gpu_blocks:,}",
                f"   tokens as vLLM reports them ({_tokens_rule(plan)}) = {plan.kv_cache_tokens:,}"]
        if plan.spec.vllm_version == TOKENS_FROM_CONCURRENCY_SINCE and plan.max_model_len:
            # 0.20.2 changed the rule in a patch release: 0.20.0 and 0.20.1 still log the blocks per group
            older = blocks_per_group_tokens(plan.num_gpu_blocks, layout.num_groups, layout.block_size)
            out.append(f"   (vLLM 0.20.2 and later; 0.20.0 and 0.20.1 log blocks // {layout.num_groups} groups × "
                       f"{layout.block_size} = {older:,})")
    else:
        out += [f"   blocks = floor({_g(plan.available_kv_bytes)} ÷ ({layout.block_size} tokens × "
                f"{_bytes(plan.kv_bytes_per_token)})) = {plan.num_gpu_blocks:,}",
                f"   {_uniform_tokens_line(plan)}"]
    out += ["", "4. Concurrency ceiling"]
    if avg_seq_len and layout.counts_by_group:
        # (every layer sliding is one group, no hybrid: the plain sum printed beside the window's result)
        reserve = max_concurrency_terms(layout, plan.num_gpu_blocks, avg_seq_len, plan.in_flight_tokens)[1]
        pool = f"{plan.num_gpu_blocks:,} blocks × {layout.block_size}"
        if reserve >= 0.5:
            pool = f"({pool} − {reserve:,.0f} tokens prefill steps hold beyond the windows)"
        out.append(f"   at {avg_seq_len:,.0f} tokens per request: {pool}"
                   f" ÷ tokens one request holds in "
                   + (f"all {layout.num_groups} groups" if layout.num_groups > 1 else "its one group")
                   + f" ({_group_caps(layout)}) "
                   f"≈ {plan.max_concurrency_at(avg_seq_len):.2f} requests")
    elif avg_seq_len:
        ceiling = plan.max_concurrency_at(avg_seq_len)
        held = tokens_needed(layout, avg_seq_len)  # a request holds whole blocks
        blocks = f" ({held:,.0f} in whole {layout.block_size}-token blocks)" if held != avg_seq_len else ""
        out.append(f"   at {avg_seq_len:,.0f} tokens per request{blocks}: {_g(plan.available_kv_bytes)} ÷ "
                   f"({held:,.0f} × {_bytes(plan.kv_bytes_per_token)}) ≈ {ceiling:.2f} requests")
    if plan.max_concurrency_at_max_model_len is not None:
        out.append(f"   at max_model_len {plan.max_model_len:,}: {plan.max_concurrency_at_max_model_len:.2f} requests "
                   "(vLLM's 'Maximum concurrency')")
    if not avg_seq_len and plan.max_concurrency_at_max_model_len is None:
        out.append("   pass --avg-seq-len or --max-model-len for a ceiling")
    ceiling = _max_concurrency(plan, avg_seq_len)
    given = "" if plan.spec.max_num_seqs else ", vLLM's default on this card"
    out.append(f"   vLLM runs at most {plan.max_num_seqs:,} requests at once (max_num_seqs{given})"
               + ("" if ceiling is None else
                  ": the scheduler, not the KV cache, is the limit here, and more KV buys no concurrency"
                  if ceiling > plan.max_num_seqs else ": the KV cache is the limit"))
    basis = f"at {avg_seq_len:,.0f} tokens" if avg_seq_len else "at max_model_len"
    out += ["", f"What-if, cheapest first (ceiling {basis}; runs: capped by max_num_seqs):",
            f"   {'scenario':<30} {'KV tokens':>12} {'ceiling':>9} {'runs':>7}  note",
            f"   {'(now)':<30} {plan.kv_cache_tokens:>12,} {_fmt(ceiling):>9} {_fmt(_runs(ceiling, plan)):>7}"
            + ("  vLLM will not start (the error below)" if plan.errors else "")]
    for s in scenarios:
        tokens = f"{s.kv_cache_tokens:,}" if s.kv_cache_tokens is not None else "-"
        runs = _runs(s.max_concurrency, s.plan)
        out.append(f"   {s.name:<30} {tokens:>12} {_fmt(s.max_concurrency):>9} {_fmt(runs):>7}  {s.note}")
    for label, items in (("error", plan.errors), ("warning", plan.warnings), ("note", plan.notes)):
        out += [f"{label}: {item}" for item in items]
    return "\n".join(out)


def render_long_context(lc: LongContext | None) -> str:
    """The long_context block as text (after the walk-through, so it stays apart from its layout)."""
    if lc is None:
        return ""
    estimate = lc.prefill_seconds_estimate
    minutes = f" ({estimate / 60:.1f} min)" if estimate is not None and estimate >= 60 else ""
    if estimate is None:
        seconds = "not estimated"
    else:
        shown = f"~{estimate:,.0f} s" if estimate >= 10 else f"~{estimate:.1f} s"  # not "~0 s" for a short prompt
        seconds = f"{shown}{minutes} at {lc.mfu:.0%} of {lc.gpu_bf16_tflops:g} TFLOPS per GPU"
    out = ["", f"Long context (max_model_len {lc.max_model_len:,}):",
           f"   requests that fit at max_model_len   {lc.requests_at_max_model_len:.2f}",
           f"   one max-length prefill                {seconds}",
           f"   chunked-prefill steps                 {lc.chunked_prefill_steps:,}",
           "   startup probe allowance               "
           + ("-" if lc.probe_initial_delay_seconds is None else f"{lc.probe_initial_delay_seconds:,} s"),
           "   max_model_len that fits 4 requests    "
           + ("-" if lc.max_model_len_for_4 is None else f"{lc.max_model_len_for_4:,}")]
    out += [f"warning: {w}" for w in lc.warnings] + [f"note: {n}" for n in lc.notes]
    return "\n".join(out)


def _uniform_tokens_line(plan: CapacityPlan) -> str:
    """The token figure of a one-group model, with the arithmetic of the rule that produced it."""
    from kvwatch.capacity.kv import TOKENS_FROM_CONCURRENCY_SINCE, blocks_needed

    layout, blocks = plan.layout, plan.num_gpu_blocks
    slots = blocks * layout.block_size
    if plan.spec.vllm_version >= TOKENS_FROM_CONCURRENCY_SINCE and plan.max_model_len:
        per_request = blocks_needed(layout, plan.max_model_len, plan.in_flight_tokens)
        line = (f"tokens as vLLM ≥ 0.20 reports them = int({blocks:,} blocks ÷ {per_request:,} blocks per "
                f"{plan.max_model_len:,}-token request × {plan.max_model_len:,}) = {plan.kv_cache_tokens:,}")
        if plan.kv_cache_tokens != slots:
            line += f" ({blocks:,} × {layout.block_size} = {slots:,} token slots)"
        return line
    return f"tokens = {blocks:,} × {layout.block_size} = {plan.kv_cache_tokens:,}"


def _tokens_rule(plan: CapacityPlan) -> str:
    from kvwatch.capacity.kv import TOKENS_FROM_CONCURRENCY_SINCE

    if plan.spec.vllm_version >= TOKENS_FROM_CONCURRENCY_SINCE and plan.max_model_len:
        return "max concurrency × max_model_len"
    return f"blocks // {plan.layout.num_groups} groups × {plan.layout.block_size}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def write_plot(path: Path, plan: CapacityPlan, scenarios: list[Scenario], avg_seq_len: float | None) -> list[str]:
    """Concurrency ceiling against context length, base and every computable scenario, and the scheduler's
    ``max_num_seqs`` above which no more requests run; returns the legend.

    A deployment that won't start (plan errors: weights do not fit, one request at max_model_len does not
    fit) is drawn dashed and labelled "(won't start)": its ceiling is what the pool would hold, not a promise.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = max(plan.max_model_len or 0, int(4 * (avg_seq_len or 0)), 8192)
    lengths = [float(2 ** (i / 8)) for i in range(7 * 8, int(8 * math.log2(top)) + 1)]
    fig, ax = plt.subplots(figsize=(8, 5))
    labels: list[str] = []
    drawn: list[tuple[float, float]] = []

    def draw(label: str, p: CapacityPlan, **style: Any) -> None:
        if not p.will_start:
            label, style = f"{label} (won't start)", {**style, "linestyle": "--"}
        labels.append(label)
        points = [(x, y) for x in lengths if (y := p.max_concurrency_at(x)) > 0]  # a log axis shows no zero
        drawn.extend(points)
        ax.plot([x for x, _ in points], [y for _, y in points], label=label, **style)

    draw("now", plan, linewidth=2.5, color="black")
    for s in scenarios:
        if s.plan is not None and s.plan.num_gpu_blocks > 0 and s.name != "max_model_len_halved":
            draw(s.name, s.plan)
    if avg_seq_len:
        ax.axvline(avg_seq_len, linestyle=":", color="grey", label=f"avg {avg_seq_len:,.0f} tokens")
    if drawn and plan.max_num_seqs:
        # The scheduler runs no more than this, whatever the KV holds (the text's running limit, _runs).
        cap = f"--max-num-seqs {plan.max_num_seqs:,} (vLLM runs no more)"
        labels.append(cap)
        ax.axhline(plan.max_num_seqs, linestyle="-.", color="grey", label=cap)
    ax.set_xscale("log", base=2)
    if drawn:  # nothing holds a request when no deployment starts: an empty linear axis then
        ax.set_yscale("log")
    ax.set_xlabel("KV tokens per request (context length)")
    ax.set_ylabel("max concurrent requests (per replica)")
    name = plan.spec.arch.name if plan.spec.arch else "given KV bytes/token"
    ax.set_title(f"KV concurrency ceiling: {name}" + ("" if plan.will_start else " (won't start as configured)"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
    return labels


