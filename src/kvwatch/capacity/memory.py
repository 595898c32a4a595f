"""The memory budget and the estimates used when a figure was not measured (pure).

vLLM (V1, per GPU worker): ``available_kv = total × gpu_memory_utilization − weights − activation_peak
− non_torch``. The estimates below are simple documented models calibrated on the startup logs in
``tests/fixtures/calibration`` (see docs/capacity.md for the error they leave).
"""

from __future__ import annotations

import math

from kvwatch.capacity import quantization as quant
from kvwatch.capacity.architecture import ModelArch
from kvwatch.capacity.mamba import GATED_DELTA_NET
from kvwatch.capacity.quantization import QuantizationError
from kvwatch.capacity.units import GIB

__all__ = ["QuantizationError"]


_DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4,
                "float": 4}

# Activation model constants (fitted on vLLM 0.19 logs, see docs/capacity.md).
SAMPLER_BYTES_PER_LOGIT = 14  # dummy sampler run: fp32 logits for max_num_seqs rows + ~2.5 working copies
HIDDEN_COPIES = 2  # live hidden-state-sized buffers per batched token during the profile forward pass
ACTIVATION_BASE_BYTES = 64 << 20
ACTIVATION_FIT_MAX_TOKENS = 8192  # the largest profile run (max_num_batched_tokens) among the logs fitted
NON_TORCH_TP1_BYTES = int(0.25 * GIB)  # CUDA context, cuBLAS workspaces
NON_TORCH_MULTI_GPU_BYTES = int(2.1 * GIB)  # + NCCL buffers / custom all-reduce at TP >= 2


def resolve_quantization(quantization: str | None, arch: ModelArch | None) -> quant.Resolved | None:
    """The scheme the weights are priced as: ``--quantization`` (a vLLM method name defers to the checkpoint)
    or the checkpoint's own; None when unquantized. Raises :class:`QuantizationError` naming the source."""
    checkpoint = arch.checkpoint_quantization if arch else None
    source = arch.checkpoint_quantization_source if arch else None
    flag = "--model-config" if arch is not None and arch.from_config_file else "--model"
    return quant.resolve(quantization, checkpoint, source, flag)


def model_dtype_bytes(dtype: str, arch: ModelArch | None) -> int:
    """Bytes per element of the model dtype; ``auto`` follows the checkpoint, float32 downcast to bf16."""
    d = dtype.lower()
    if d == "auto":
        checkpoint = (arch.torch_dtype if arch else "bfloat16").lower()
        return 2 if checkpoint in {"float32", "fp32", "float"} else _DTYPE_BYTES.get(checkpoint, 2)
    return _DTYPE_BYTES.get(d, 2)


def parameter_counts(arch: ModelArch) -> tuple[int, int, int]:
    """(embedding + head, dense linear, expert linear) parameter counts the config implies.

    Attention projections for attention layers only; an MLP for layers without an MoE (all of them in a dense
    model; Jamba's non-expert layers), gated (3 matrices) unless ``arch.gated_mlp`` is False (2); experts for MoE
    layers; Mamba / linear-attention mixers as
    ``3 × hidden × inner`` (in and out projections, the small convolution and SSM parameters ignored), a gated delta
    net's as vLLM builds it (:func:`_mixer_params`).

    When the preset records the model's published total, the linear part is scaled to match it.
    """
    embed = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2) + arch.extra_embedding_params
    h = arch.hidden_size
    attention = sum(_attention_params(arch, kind) for kind in arch.attention_layer_types)
    moe_layers = 0
    if arch.num_experts:
        moe_layers = arch.moe_layers if arch.moe_layers is not None else arch.num_layers - arch.first_k_dense_layers
    dense_mlp_layers = arch.dense_mlp_layers if arch.dense_mlp_layers is not None else arch.num_layers - moe_layers
    mamba = arch.mamba_layers * _mixer_params(arch)
    matrices = 3 if arch.gated_mlp else 2
    dense = attention + dense_mlp_layers * matrices * h * arch.intermediate_size + mamba
    experts = 0
    if arch.num_experts:
        per_expert = matrices * h * arch.moe_intermediate_size
        per_shared = matrices * h * (arch.shared_expert_intermediate_size or arch.moe_intermediate_size)
        experts = moe_layers * (arch.num_experts * per_expert + arch.num_shared_experts * per_shared)
    if arch.num_parameters:
        implied = embed + dense + experts
        scale = (arch.num_parameters - embed) / max(1, implied - embed)
        dense, experts = int(dense * scale), int(experts * scale)
    return embed, dense, experts


def _mixer_params(arch: ModelArch) -> int:
    """One Mamba / linear-attention layer's projection parameters.

    A gated delta net (Qwen3-Next, Qwen3.5: vLLM's ``QwenGatedDeltaNetAttention``) projects the hidden state to its
    queries and keys (the key heads), its values and output gate (the value heads), and a decay and a beta per value
    head, and back from the values: 1.0 B parameters more than ``3 × hidden × inner`` on Qwen3.5-27B's 48 such layers
    (its attention's output gate, :func:`_attention_params`, another 0.5 B).
    Others: in_proj (2 × inner) + out_proj, roughly.
    """
    h, d = arch.hidden_size, arch.mamba_dims
    if d is not None and d.kind == GATED_DELTA_NET:
        keys, values = d.num_k_heads * d.head_k_dim, d.num_heads * d.head_dim
        return h * (2 * keys + 2 * values + 2 * d.num_heads) + values * h
    return 3 * h * arch.mamba_inner_size


def _attention_params(arch: ModelArch, layer_type: str) -> int:
    """One attention layer's projection parameters.

    Per layer type (Gemma 4's global heads, MiMo-V2-Flash's sliding ones, ModelArch.kv_dims): q and o of the
    model's query heads at the type's K and V head sizes, k and v of its KV heads. Gemma 4's full layers load K
    into V (attention_k_eq_v) and have no v_proj; it is counted anyway (under 0.4 % of Gemma 4 31B).
    """
    h = arch.hidden_size
    if arch.attention_params_per_layer is not None:
        return arch.attention_params_per_layer
    if arch.is_mla:
        attn = h * (arch.num_attention_heads * 192 + int(arch.kv_lora_rank or 0) + int(arch.qk_rope_head_dim or 0))
        return attn + int(arch.kv_lora_rank or 0) * arch.num_attention_heads * 256 + arch.num_attention_heads * 128 * h
    d = arch.kv_dims(layer_type)
    # Qwen3-Next's attention (Qwen3.5's too) projects a gate as wide as its queries (attn_output_gate, on by default)
    gate = h * arch.num_attention_heads * d.head_dim if arch.attention_output_gate else 0
    return h * (arch.num_attention_heads + d.num_kv_heads) * (d.head_dim + d.v_head_dim) + gate


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def mxfp4_moe_padding(hidden: int, intermediate_per_rank: int,
                      compute_capability: tuple[int, int] | None) -> tuple[int, int]:
    """(hidden, intermediate per TP rank) as vLLM allocates MXFP4 MoE expert weights on this GPU.

    vLLM's ``Mxfp4MoEMethod.create_weights`` pads by kernel: Marlin (CUDA below SM90 or from SM110, where the
    Triton kernels are not supported) rounds hidden up to 256 and the per-rank intermediate to 128; the SM100
    FlashInfer kernels round both to 256; the SM90 Triton path pads the intermediate to 64, and the H100 logs
    (gpt-oss-20b 13.47 GiB, gpt-oss-120b 64.38 GiB) show the hidden dimension padded to 256 as well (2880 ->
    3072; 12.82 / 60.77 GiB without it), which is what is modelled for SM90, ROCm and unknown cards.
    """
    if compute_capability is not None and (compute_capability < (9, 0) or compute_capability >= (11, 0)):
        return _round_up(hidden, 256), _round_up(intermediate_per_rank, 128)
    if compute_capability is not None and compute_capability >= (10, 0):
        return _round_up(hidden, 256), _round_up(intermediate_per_rank, 256)
    return _round_up(hidden, 256), _round_up(intermediate_per_rank, 64)


def embedding_bytes(arch: ModelArch, dtype_bytes: int, tp: int, pp: int) -> float:
    """The embeddings' and LM head's share of :func:`estimate_weights_bytes` per GPU (always in the model dtype):
    with pipeline parallelism, the heaviest stage's."""
    if pp <= 1:
        return parameter_counts(arch)[0] * dtype_bytes / tp
    return _heaviest_stage(arch, 0.0, dtype_bytes, pp)[1] / tp


def _heaviest_stage(arch: ModelArch, layer_bytes: float, dtype_bytes: int, pp: int) -> tuple[float, float]:
    """(bytes, of which embeddings) of the heaviest pipeline stage before the TP split, ``layer_bytes`` being the
    decoder layers' whole. vLLM splits the layers as :func:`kvwatch.capacity.kv.pp_stage_sizes` says and builds the
    embeddings on the first stage (with whatever else the config counts there, a vision tower) and the LM head on
    the last (the embeddings again there where they are tied): each end holds a whole vocabulary matrix, which
    splitting everything over the stages put a quarter of on each at PP 4 (Llama-3.1-8B: 3.74 GiB a stage where
    vLLM logged 4.26; Gemma-3-27B's tied 2.63 GiB matrix counted 0.66)."""
    from kvwatch.capacity.kv import pp_stage_sizes

    matrix = arch.vocab_size * arch.hidden_size * dtype_bytes
    extra = arch.extra_embedding_params * dtype_bytes
    sizes = pp_stage_sizes(arch.num_layers, pp)
    per_layer = layer_bytes / max(1, arch.num_layers)
    stages = [(n * per_layer + (matrix + extra if i == 0 else 0.0) + (matrix if i == pp - 1 else 0.0),
               (matrix + extra if i == 0 else 0.0) + (matrix if i == pp - 1 else 0.0)) for i, n in enumerate(sizes)]
    return max(stages)


def estimate_weights_bytes(arch: ModelArch, dtype_bytes: int, quantization: str | None, tp: int, pp: int,
                           compute_capability: tuple[int, int] | None = None) -> int:
    """Weights per GPU: parameters × bytes per parameter, split over TP ranks and, with pipeline parallelism, the
    heaviest stage's (:func:`_heaviest_stage`).

    Embeddings and the LM head stay in the model dtype under every quantization method here. MXFP4 experts
    are priced at the padded sizes vLLM allocates on this GPU (:func:`mxfp4_moe_padding`).
    """
    embed, dense, experts = parameter_counts(arch)
    resolved = resolve_quantization(quantization, arch)
    q = resolved.bytes_per_param if resolved else None
    experts_only = resolved.experts_only if resolved else False
    dense_bytes = dense * (q if q is not None and not experts_only else dtype_bytes)
    expert_bytes = experts * (q if q is not None else dtype_bytes)
    if resolved is not None and resolved.scheme == "mxfp4" and arch.num_experts and arch.moe_intermediate_size:
        per_rank = max(1, arch.moe_intermediate_size // tp)
        h_pad, i_pad = mxfp4_moe_padding(arch.hidden_size, per_rank, compute_capability)
        expert_bytes *= (h_pad * i_pad) / (arch.hidden_size * per_rank)
    if pp > 1:
        return int(_heaviest_stage(arch, dense_bytes + expert_bytes, dtype_bytes, pp)[0] / tp)
    return int((embed * dtype_bytes + dense_bytes + expert_bytes) / tp)


# vLLM >= 0.21 subtracts its CUDA-graph memory estimate (``profile_cudagraph_memory``, gpu_worker.py) before sizing
# the KV cache. Its size, per GPU: a least-squares line through the "cuda_graph est" that vLLM 0.19 printed for the
# 15 distinct deployments of the calibration sweep (tests/fixtures/calibration/vllm_kv_capacity.csv; 0.49-1.82 GiB):
# 0.226 GiB + 0.0189 GiB per decoder layer on the rank. Median error 0.08 GiB, worst 0.86 GiB (Llama-3.1-8B at
# TP 2 printed 1.69); in-sample, docs/capacity.md has the table.
CUDA_GRAPH_BASE_GIB = 0.226
CUDA_GRAPH_GIB_PER_LAYER = 0.0189


def estimate_cuda_graph_bytes(arch: ModelArch, pp: int) -> int:
    """The CUDA-graph memory vLLM >= 0.21 subtracts before sizing the KV cache, per GPU (fitted, see above)."""
    layers = math.ceil(arch.num_layers / max(1, pp))
    return int((CUDA_GRAPH_BASE_GIB + CUDA_GRAPH_GIB_PER_LAYER * layers) * GIB)


def default_batch_limits(gpu_memory_bytes: float, gpu_name: str | None = None) -> tuple[int, int]:
    """vLLM's V1 serving defaults: (max_num_batched_tokens, max_num_seqs).

    vLLM uses the larger pair on cards of 70 GiB or more except A100s (H100, H200, MI300X, ...).
    """
    if gpu_memory_bytes >= 70 * GIB and "a100" not in (gpu_name or "").lower():
        return 8192, 1024
    return 2048, 256


def estimate_activation_bytes(arch: ModelArch, dtype_bytes: int, max_num_batched_tokens: int,
                              max_num_seqs: int, tp: int, pp: int) -> int:
    """Peak activation of vLLM's profile run, per GPU.

    Two terms: the dummy sampler run holds fp32 logits for ``max_num_seqs`` rows of the vocabulary (plus
    working copies), which dominates for large vocabularies; the forward pass holds a few hidden-state
    sized buffers per batched token. Only the last PP stage samples, and it is the tightest rank.
    """
    sampler = max_num_seqs * arch.vocab_size * SAMPLER_BYTES_PER_LOGIT
    hidden = max_num_batched_tokens * arch.hidden_size * HIDDEN_COPIES * dtype_bytes
    del tp, pp  # vocab logits are gathered on every rank; hidden states are not split by TP
    return int(sampler + hidden + ACTIVATION_BASE_BYTES)


def estimate_non_torch_bytes(tp: int, pp: int) -> int:
    """CUDA context and communication buffers per GPU: ~0.25 GiB alone, ~2.1 GiB with TP >= 2."""
    if tp >= 2:
        return NON_TORCH_MULTI_GPU_BYTES
    if pp >= 2:
        return int(0.07 * GIB)  # PP-only runs logged ~0.07 GiB (no all-reduce buffers)
    return NON_TORCH_TP1_BYTES


def pp_last_stage_extra_bytes(arch: ModelArch, max_num_seqs: int) -> int:
    """With PP, stage 0 logs its figures but the last stage also runs the sampler: the tightest rank."""
    return max_num_seqs * arch.vocab_size * SAMPLER_BYTES_PER_LOGIT // 2
