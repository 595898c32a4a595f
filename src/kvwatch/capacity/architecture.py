"""Model architecture: the KV-relevant fields of a Hugging Face ``config.json``.

Pure: :func:`arch_from_config` takes an already-parsed dict. It handles multimodal configs (the
language model lives in ``text_config``), a missing ``head_dim`` (= hidden / heads), a missing
``num_key_value_heads`` (= heads, i.e. MHA), per-layer ``layer_types`` or a Gemma-3 style
``sliding_window_pattern``, MLA (``kv_lora_rank`` + ``qk_rope_head_dim``) and hybrid Mamba / linear-attention
models, whose attention layers are read from the field each family uses (``layer_types``, ``layers_block_type``
(Jamba, Zamba2's "hybrid"), ``attn_type_list`` (MiniMax), ``attn_layer_indices`` (Bamba), ``attn_layer_period``
(Jamba), ``hybrid_override_pattern`` (Nemotron-H), ``full_attention_interval`` (Qwen3-Next),
``linear_attn_config.kda_layers`` (Kimi-Linear), Falcon-H1's attention in every layer); their state
dimensions (:mod:`kvwatch.capacity.mamba`) size vLLM's state pages. Families whose attention layer types have KV
heads / head sizes of their own (Gemma 4's ``global_head_dim``, MiMo-V2-Flash's ``hybrid_layer_pattern`` and swa_*
fields) get them per type (:attr:`ModelArch.attention_dims`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvwatch.capacity.config_fields import (
    CONFIG_CLASS_DEFAULTS,
    ArchitectureError,
    class_defaults_used,
    first_number,
    language_part,
    number,
    positive,
    real,
    require,
    text_config,
)
from kvwatch.capacity.layers import (
    CHUNKED,
    FULL,
    HYBRID_MAMBA_TYPES,
    MAMBA,
    NO_KV,
    SLIDING,
    AttentionDims,
    Layout,
    attention_dims_by_type,
    hybrid_layout,
    kv_shared_layer_count,
    layer_types_from_config,
    moe_layer_count,
    nas_blocks,
    nas_intermediate_size,
    swa_pattern,
)
from kvwatch.capacity.mamba import MambaConfigError, MambaDims, mamba_dims_from_config
from kvwatch.capacity.max_len import (
    LONGROPE_DEFAULT_SINCE,
    YARN_UNSCALED_SINCE,
    derived_max_model_len,
    length_field,
    rope_scaling,
)
from kvwatch.capacity.quantization import QuantizationError, checkpoint_kv_cache_dtype, scheme_from_config
from kvwatch.capacity.units import DTYPE_BYTES

# Pure state-space models (vLLM's mamba.py, mamba2.py, falcon_mamba): no attention layer at all.
_ATTENTION_FREE_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba"})
# vLLM caches one latent per token (MLA) only for these model_types (ModelArchConfigConvertorBase.is_deepseek_mla in
# vllm/transformers_utils/model_arch_config_convertor.py, 0.34); another model with kv_lora_rank (MiniCPM3)
# decompresses it into ordinary per-head K and V.
_MLA_TYPES = frozenset({
    "axk1", "bailing_hybrid", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "dots3_note", "k3_dspark",
    "glm5_next",
    "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite", "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash",
    "longcat_flash_ngram", "longcat_next",
    "mistral_large_4", "pangu_ultra_moe", "pangu_ultra_moe_mtp", "hy_v4", "hy_v4_mtp",
})
# LongCat-Flash, then the two n-gram models built on it (LongCat-Flash-Lite, LongCat-Next's language model).
_LONGCAT_TYPES = ("longcat_flash", "longcat_flash_ngram", "longcat_next")
# A kv_lora_rank vLLM decompresses into per-head K and V (vLLM's minicpm3.py): any other type outside _MLA_TYPES is
# read that way with a note, since vLLM may cache it as a latent.
_DECOMPRESSED_MLA_TYPES = frozenset({"minicpm3"})
# Families whose MLPs and experts have an up and a down projection and no gate (relu² in vLLM's nemotron.py and
# nemotron_h.py: NemotronHMLP, and FusedMoE loading only up_proj/down_proj): two matrices, not three.
# So are the GPT-2-style MLPs of these (an fc in and an fc out: vLLM's starcoder2.py c_fc/c_proj, falcon.py
# dense_h_to_4h/dense_4h_to_h, phi.py fc1/fc2, gpt_neox, gpt_bigcode, gpt2, gpt_j, opt, bloom, mpt, persimmon), and
# the up/down MLPs of Arcee's AFM (arcee.py, relu²) and Apertus (xIELU):
# priced as gated, StarCoder2-15B read 21.7 B parameters and "vLLM will not start" on an L40S where it starts.
_NON_GATED_MLP_TYPES = frozenset({"nemotron", "nemotron_h", "starcoder2", "falcon", "refinedweb", "refinedwebmodel",
                                  "phi", "gpt_neox", "gpt_bigcode", "gpt2", "gptj", "opt", "bloom", "mpt",
                                  "persimmon", "arcee", "apertus"})
# Top-level model_type values of multimodal models whose preset or config.json may omit the encoder's config.
_MULTIMODAL_TYPES = frozenset({
    "gemma3", "gemma3n", "gemma4", "llama4", "mistral3", "phi3_v", "phi4mm", "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
    "qwen3_vl_moe", "llava", "llava_next", "pixtral", "idefics3", "internvl_chat", "kimi_vl", "glm4v",
})
# vLLM's CONFIG_FIELD_ALIASES["total_num_kv_heads"] (vllm/transformers_utils/config.py), first present wins; without
# any of them the model is MHA.
_KV_HEAD_FIELDS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
# transformers' default for tie_word_embeddings when config.json omits it: PreTrainedConfig's own default is True;
# config classes override it. Read in transformers' configuration_<type>.py: llama, mistral, qwen2, qwen3, phi3,
# gpt_oss, deepseek_v3, falcon_h1 and longcat_flash say False; gemma, gemma2 and gemma3_text say True; zamba2 does
# not set it (True). The other entries belong to the same families (their classes are copies of those) and were not read
# one by one.
_TIE_DEFAULT_FALSE = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "phi3", "gpt_oss",
    "deepseek_v2", "deepseek_v3", "kimi_k2", "falcon_h1", "glm4", "glm4_moe", "granite", "granitemoe",
    "granitemoehybrid", "jamba", "bamba", "nemotron_h", "minimax", "minimax_text_01", "minimax_m1", "longcat_flash",
    "longcat_flash_ngram", "longcat_next",
})
_TIE_DEFAULT_TRUE = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "zamba2"})


def _default_tie(model_type: str) -> tuple[bool, str | None]:
    """(tie_word_embeddings, note) when config.json does not say, as transformers would default it."""
    if model_type in _TIE_DEFAULT_FALSE:
        return False, None
    if model_type in _TIE_DEFAULT_TRUE:
        return True, None
    return True, (f"tie_word_embeddings is not in config.json and model_type {model_type or '(none)'!r} is not one "
                  "kvwatch knows: assumed True (transformers' PreTrainedConfig default), so the LM head is not "
                  "counted; if the model unties it, the weights are vocab × hidden larger")


@dataclass(frozen=True)
class ModelArch:
    """What the capacity model needs to know about one model (whole model, not per rank)."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    intermediate_size: int = 0
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    max_position_embeddings: int | None = None
    # vLLM's derived maximum length (:func:`derived_max_model_len`, current rules) and the config field it came from.
    derived_max_model_len: int | None = None
    max_len_source: str | None = None
    # The same under vLLM < 0.30's rules, where they differ (YaRN scaled original × factor); see max_len_for.
    derived_max_model_len_before_0_30: tuple[int, str] | None = None
    # LongRoPE (Phi-3/3.5/4-mini 128k): vLLM ≥ 0.11.1 defaults --max-model-len to original_max_position_embeddings.
    longrope_default_len: int | None = None
    model_max_length: int | None = None  # config.json's own override ceiling (Command-R style)
    # One entry per decoder layer: FULL, SLIDING or MAMBA.
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    attention_chunk_size: int | None = None  # Llama-4: the chunk of the CHUNKED layers
    # Gemma 3n / Gemma 4 (num_kv_shared_layers): the last N layers attend over earlier layers' KV
    # (kv_sharing_target_layer_name in vllm/model_executor/models/gemma3n.py, gemma4.py) and vLLM's runner gives
    # them no KV cache spec; they still have their weights and attention compute.
    kv_shared_layers: int = 0
    # Attention layer types whose KV heads / head sizes differ from (num_kv_heads, head_dim, head_dim), as
    # (layer type, dims) pairs (:meth:`kv_dims`): Gemma 4's full-attention layers (global_head_dim, and
    # num_global_key_value_heads with attention_k_eq_v), MiMo-V2-Flash's (v_head_dim) and its sliding ones
    # (swa_num_key_value_heads, swa_head_dim, swa_v_head_dim). Empty: every layer has the model's dims.
    attention_dims: tuple[tuple[str, AttentionDims], ...] = ()
    # MLA (DeepSeek-V2/V3, Kimi): one latent vector per token and layer, shared by all heads.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    # DeepSeek sparse attention (V3.2): each MLA layer also caches its indexer's keys, index_head_dim fp8 values
    # plus a float32 scale per 128 (vLLM's DeepseekV32IndexerCache, uint8 whatever the KV cache dtype).
    index_head_dim: int | None = None
    # Which layers build an indexer (IndexCache, vLLM >= 0.21: the others share a "full" layer's top-k and cache
    # no keys): every index_topk_freq-th from index_skip_topk_offset - 1, or index_topk_pattern's "F" layers.
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 2
    index_topk_pattern: str | None = None
    # Mixture of experts.
    num_experts: int = 0
    experts_per_token: int | None = None  # routed experts each token runs (None: config.json does not say)
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_k_dense_layers: int = 0
    # Layers with an MoE / a dense MLP when not all of them have one (Jamba's expert_layer_period, Qwen-MoE's
    # decoder_sparse_step, Nemotron-H's pattern); None = the usual rule (MoE after first_k_dense_layers).
    moe_layers: int | None = None
    dense_mlp_layers: int | None = None
    # MLPs and experts with a gate (gate, up and down: 3 matrices); False for relu² MLPs (up and down: 2).
    gated_mlp: bool = True
    # The shared experts' width when it is not moe_intermediate_size (Nemotron-H); 0: the routed experts' width.
    shared_expert_intermediate_size: int = 0
    # Embedding parameters beside the token embedding (LongCat-Flash-Lite's n-gram tables), in the model dtype.
    extra_embedding_params: int = 0
    # Hybrid Mamba / linear-attention models: layers with such a mixer and its inner width (for the weights),
    # and whether vLLM keeps state pages for them (sized from mamba_dims below).
    mamba_layers: int = 0
    mamba_inner_size: int = 0
    has_mamba_state: bool = False
    # The state dimensions of one such layer (None: the config lacks them; the state pages are then not modelled).
    mamba_dims: MambaDims | None = None
    # Total parameters when the preset knows it better than the config implies (MLA/MoE details).
    num_parameters: int | None = None
    # Quantization scheme the checkpoint ships with (e.g. gpt-oss: mxfp4), and where it was read (a config.json
    # field, or the name that implies it); None source = the preset's own data.
    checkpoint_quantization: str | None = None
    checkpoint_quantization_source: str | None = None
    # An FP8 KV cache the checkpoint declares, and its quantization method (quantization.checkpoint_kv_cache_dtype).
    checkpoint_kv_cache: tuple[str, str] | None = None
    # The checkpoint's quant_method as vLLM names it ("fp8", "modelopt", "compressed-tensors", "mxfp4", ...); a
    # preset's only when its scheme is one (mxfp4): the GPU capability vLLM needs depends on it.
    checkpoint_quant_method: str | None = None
    # A block-quantized FP8 checkpoint's weight blocks [n, k] (quantization_config.weight_block_size: DeepSeek-V3,
    # Qwen3-*-FP8): every GPU's share of a split weight must hold whole blocks (block_quant_split).
    weight_block_size: tuple[int, int] | None = None
    # A GPTQ/AWQ checkpoint's quantization group (quantization_config.group_size; None: per channel, -1): every
    # GPU's share of a row-split weight's input must hold whole groups (group_quant_split).
    weight_group_size: int | None = None
    # One attention layer's projection parameters where the K and V the cache holds are not its projections' shapes
    # (MiniCPM3: low-rank q and kv projections, K and V decompressed per head: decompressed_mla_params); None: from
    # the heads and head sizes.
    attention_params_per_layer: int | None = None
    # Attention that projects an output gate as wide as its queries (Qwen3-Next's and Qwen3.5's attn_output_gate,
    # which vLLM's Qwen3NextAttention reads as on unless the config says false).
    attention_output_gate: bool = False
    from_config_file: bool = False  # built from a user's config.json (--model-config), not a preset
    model_type: str = ""  # config.json's model_type (of the text model), lower case
    architectures: tuple[str, ...] = ()  # config.json's architectures (vLLM picks its model class by these)
    # Hybrid models whose config fixes the temporal SSM state's dtype (NemotronH: mamba_ssm_cache_dtype; Qwen3.5:
    # mamba_ssm_dtype), which vLLM then uses instead of the model dtype (kv.mamba_ssm_dtype_bytes).
    mamba_ssm_cache_dtype: str | None = None
    source: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def derived_len(self, version: tuple[int, int]) -> tuple[int | None, str | None]:
        """(the longest --max-model-len ``version`` accepts, the config fields it came from)."""
        if version < YARN_UNSCALED_SINCE and self.derived_max_model_len_before_0_30 is not None:
            return self.derived_max_model_len_before_0_30
        return self.derived_max_model_len, self.max_len_source

    def default_len(self, version: tuple[int, int]) -> int | None:
        """The --max-model-len ``version`` runs with when none is given."""
        if self.longrope_default_len and version >= LONGROPE_DEFAULT_SINCE:
            return self.longrope_default_len
        return self.derived_len(version)[0]

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def kv_dims(self, layer_type: str) -> AttentionDims:
        """The KV cache dimensions of the attention layers of ``layer_type`` (FULL, SLIDING or CHUNKED)."""
        for kind, dims in self.attention_dims:
            if kind == layer_type:
                return dims
        return AttentionDims(self.num_kv_heads, self.head_dim, self.head_dim)

    @property
    def kv_head_counts(self) -> tuple[int, ...]:
        """The distinct KV head counts of the attention layers, smallest first (one for nearly every model)."""
        kinds = set(self.attention_layer_types) or {FULL}
        return tuple(sorted({self.kv_dims(kind).num_kv_heads for kind in kinds}))

    @property
    def indexer_bytes_per_token(self) -> int:
        """Bytes per token and layer of DeepSeek-V3.2's indexer keys (0 without one)."""
        return self.index_head_dim + self.index_head_dim // 128 * 4 if self.index_head_dim else 0

    def indexer_layers(self, shared_topk: bool = True, offset: int | None = None) -> int:
        """How many of the layers cache indexer keys: all without IndexCache (``shared_topk`` False: vLLM before
        0.21), else those vLLM builds an Indexer for (deepseek_v2.py: a layer is skipped where
        ``max(layer - offset + 1, 0) % index_topk_freq != 0``, ``offset`` the config's index_skip_topk_offset unless
        given, or where index_topk_pattern says "S")."""
        layers = self.num_layers
        if not shared_topk or (self.index_topk_freq == 1 and self.index_topk_pattern is None):
            return layers
        pattern, freq = self.index_topk_pattern, self.index_topk_freq
        offset = self.index_skip_topk_offset if offset is None else offset
        if pattern is not None:
            return sum(1 for layer in range(layers) if layer >= len(pattern) or pattern[layer] != "S")
        return sum(1 for layer in range(layers) if max(layer - offset + 1, 0) % freq == 0)

    @property
    def is_hybrid_mamba(self) -> bool:
        return self.has_mamba_state or MAMBA in self.layer_types

    @property
    def attention_layer_types(self) -> tuple[str, ...]:
        """Layer types of layers that hold a KV cache (Mamba / linear-attention and MLP-only layers excluded)."""
        types = self.layer_types or (FULL,) * self.num_layers
        return tuple(t for t in types if t not in NO_KV)

    @property
    def kv_cache_layer_types(self) -> tuple[str, ...]:
        """Layer types of layers with a KV cache of their own: :attr:`attention_layer_types` without the
        KV-shared ones (vLLM's cache groups and bytes per token count only these)."""
        types = self.layer_types or (FULL,) * self.num_layers
        own = types[:max(0, len(types) - self.kv_shared_layers)]
        return tuple(t for t in own if t not in NO_KV)

    @property
    def has_sliding_window(self) -> bool:
        return SLIDING in self.layer_types


def tensor_parallel_refusal(arch: ModelArch, tp: int) -> str | None:
    """Why vLLM refuses ``--tensor-parallel-size tp`` for this model, or None when it accepts it.

    The size must divide the attention heads ("Total number of attention heads (28) must be divisible by tensor
    parallel size (3)"), and the model's QKV projection asserts that the KV heads divide the size or the size
    divides them (beyond the KV head count each head is replicated: vllm/model_executor/models/llama.py). MLA
    caches one latent shared by all heads, so its KV heads do not constrain the size. A block-FP8 checkpoint's dense
    MLP must split into whole weight blocks (:func:`block_quant_split`; experts that do not are a warning naming
    --enable-expert-parallel, under which they load)."""
    if arch.num_attention_heads % tp:
        return f"vLLM requires it to divide the model's {arch.num_attention_heads} attention heads"
    for kv in () if arch.is_mla else arch.kv_head_counts:  # (Gemma 4 asserts it for each layer type's heads)
        if kv and (kv % tp if tp <= kv else tp % kv):
            which = "" if len(arch.kv_head_counts) == 1 else " (on some of its layers)"
            return (f"vLLM requires it to divide the model's {kv} KV heads{which}, or to be a multiple of them (each "
                    "head is then replicated)")
    split = block_quant_split(arch, tp)
    if split is not None and not split[1]:  # (experts kept whole by expert parallelism load: a note, not a refusal)
        return f"vLLM refuses to load it: {split[0]}"
    cut = group_quant_split(arch, tp)
    if cut is not None:
        return f"vLLM refuses to load it: {cut}"
    return None


def group_quant_split(arch: ModelArch, tp: int) -> str | None:
    """Why vLLM cannot load a GPTQ/AWQ checkpoint split over ``tp`` GPUs, or None: a row-parallel weight's input
    per GPU (the MLP's down projection: intermediate ÷ tp; the attention output: heads × head size ÷ tp) must be a
    whole number of quantization groups ("The input size is not aligned with the quantized weight shape. This can be
    caused by too large tensor parallel size": vLLM's awq.py/gptq.py create_weights; the Marlin kernels' "is not
    divisible by group_size"). Qwen2.5-14B-AWQ at TP 8: 13824 ÷ 8 = 1728, not a multiple of 128."""
    group = arch.weight_group_size
    if not group or tp <= 1:
        return None
    for what, width in (("the MLP's intermediate width", 0 if arch.num_experts else arch.intermediate_size),
                        ("the attention output's width", arch.num_attention_heads * arch.head_dim)):
        if width and (width % tp or width // tp % group):
            return (f"each GPU would take {width / tp:g} of {what} {width} as a row-split input, not a whole number "
                    f"of the checkpoint's {group}-wide quantization groups (quantization_config.group_size)")
    return None


DEFAULT_VOCAB_SIZE = CONFIG_CLASS_DEFAULTS["llama"]["vocab_size"]  # (transformers' LlamaConfig: the note says so)


def block_quant_split(arch: ModelArch, tp: int) -> tuple[str, bool] | None:
    """Why vLLM cannot load a block-quantized FP8 checkpoint split over ``tp`` GPUs, and whether
    ``--enable-expert-parallel`` lifts it; None when the split holds whole blocks. Each GPU's share of an MLP's
    intermediate width must be a multiple of the block ("The output_size of gate's and up's weight = 192 is not
    divisible by weight quantization block_n = 128": vLLM's fp8.py create_weights, Qwen3-235B-A22B-FP8 at TP 8).
    Expert parallelism keeps each routed expert whole on one GPU; shared experts and dense layers are still split
    (DeepSeek's shared experts are one MLP of their summed width), so those must split whole either way."""
    if arch.weight_block_size is None or tp <= 1:
        return None
    block = arch.weight_block_size[0]
    if not (arch.num_experts > 0 and arch.moe_intermediate_size > 0):
        split_anyway = [("the MLP's", arch.intermediate_size)]
        routed = 0
    else:
        shared = (arch.shared_expert_intermediate_size * max(1, arch.num_shared_experts)
                  if arch.shared_expert_intermediate_size else arch.num_shared_experts * arch.moe_intermediate_size)
        dense = arch.intermediate_size if arch.first_k_dense_layers or arch.dense_mlp_layers else 0
        split_anyway = [("the shared experts'", shared), ("the dense layers' MLP's", dense)]
        routed = arch.moe_intermediate_size

    def cut(what: str, width: int) -> str | None:
        if not width or (width % tp == 0 and width // tp % block == 0):
            return None
        return (f"each GPU would hold {width / tp:g} of {what} intermediate width {width}, not a whole number of the "
                f"FP8 checkpoint's {block}-wide weight blocks (quantization_config.weight_block_size)")

    for what, width in split_anyway:
        if (why := cut(what, width)) is not None:
            return why, False
    why = cut("each expert's", routed)
    return (why, True) if why is not None else None


def _weight_blocks(qc: dict[str, Any] | None) -> tuple[int, int] | None:
    blocks = qc.get("weight_block_size") if qc else None
    if isinstance(blocks, list) and len(blocks) == 2 and all(type(b) is int and b > 0 for b in blocks):
        return blocks[0], blocks[1]
    return None


def decompressed_mla_params(cfg: dict[str, Any], hidden: int, heads: int) -> int:
    """One attention layer's projections in a model with MLA's low-rank projections whose K and V are cached per head
    (vLLM's minicpm3.py): q_a and q_b through q_lora_rank (or one q_proj), kv_a to kv_lora_rank + the rope part, kv_b
    to each head's nope K and V, o from the heads' V. Priced as full 96-wide projections of 40 + 40 heads, MiniCPM3-4B
    read 5.67 B parameters for its 4.07 B."""
    nope = first_number(cfg, "qk_nope_head_dim") or 0
    rope = first_number(cfg, "qk_rope_head_dim") or 0
    v = first_number(cfg, "v_head_dim") or hidden // heads
    kv_lora = first_number(cfg, "kv_lora_rank") or 0
    q_lora = first_number(cfg, "q_lora_rank")
    q = (hidden * q_lora + q_lora * heads * (nope + rope)) if q_lora else hidden * heads * (nope + rope)
    return q + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v) + heads * v * hidden


def _weight_groups(qc: dict[str, Any] | None) -> int | None:
    """A GPTQ/AWQ checkpoint's quantization group size (None for per-channel, -1, and for other methods)."""
    method = str(qc.get("quant_method") or "").lower() if qc else ""
    if not qc or method not in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        return None
    group = qc.get("group_size", qc.get("q_group_size"))
    return group if type(group) is int and group > 0 else None


def _total_kv_heads(cfg: dict[str, Any], heads: int, model_type: str) -> int:
    """vLLM's total KV heads (ModelArchConfigConvertorBase.get_total_num_kv_heads and the Falcon/DBRX overrides)."""
    if cfg.get("multi_query") and not (model_type in ("falcon", "refinedweb", "refinedwebmodel")
                                       and cfg.get("new_decoder_architecture")):
        return 1  # multi-query attention (Falcon-7B, StarCoder); Falcon-40B's new decoder reads n_head_kv instead
    attn = cfg.get("attn_config")
    blocks = nas_blocks(cfg)
    if blocks:  # Nemotron-NAS: the first block with attention (NemotronNasModelArchConfigConvertor, vLLM 0.32)
        group = next((number(b["attention"].get("n_heads_in_group"), "block_configs n_heads_in_group")
                      for b in blocks if not b["attention"].get("no_op")), None)
        return max(1, heads // group) if group else heads
    if model_type == "dbrx" and isinstance(attn, dict) and attn.get("kv_n_heads"):
        return number(attn["kv_n_heads"], "attn_config.kv_n_heads")
    for name in _KV_HEAD_FIELDS:
        if cfg.get(name) is not None and cfg.get(name) != 0:  # (0 reads as unset, as the ``or`` chain did)
            return positive(cfg, name) or heads
    return heads


def _mamba_inner_size(cfg: dict[str, Any], hidden: int) -> int:
    linear = cfg.get("linear_attn_config")
    if isinstance(linear, dict) and linear.get("num_heads") and linear.get("head_dim"):  # Kimi-Linear's KDA
        return number(linear["num_heads"], "linear_attn_config.num_heads") * number(
            linear["head_dim"], "linear_attn_config.head_dim")
    if cfg.get("mamba_d_ssm"):
        return number(cfg["mamba_d_ssm"], "mamba_d_ssm")
    value_heads, value_dim = first_number(cfg, "linear_num_value_heads"), first_number(cfg, "linear_value_head_dim")
    if value_heads and value_dim:
        return value_heads * value_dim
    return (first_number(cfg, "mamba_expand", "expand", default=2) or 2) * hidden


def _ssm_state_dtype(cfg: dict[str, Any]) -> str | None:
    """The Mamba state dtype a hybrid's config fixes (NemotronH: mamba_ssm_cache_dtype; Qwen3.5: mamba_ssm_dtype), as
    kvwatch sizes it ("torch.float32" is float32); ArchitectureError for a dtype it does not size."""
    dtype = str(cfg.get("mamba_ssm_cache_dtype") or cfg.get("mamba_ssm_dtype") or "").lower().removeprefix("torch.")
    if dtype and dtype != "auto" and dtype not in DTYPE_BYTES:
        raise ArchitectureError(f"mamba_ssm_cache_dtype {dtype!r} is a dtype kvwatch does not size")
    return dtype or None


def arch_from_config(config: dict[str, Any], name: str = "custom", source: str | None = None) -> ModelArch:
    """Build a :class:`ModelArch` from a parsed Hugging Face ``config.json``; ArchitectureError if it is not one."""
    if not isinstance(config, dict):
        raise ArchitectureError("config.json must be a JSON object")
    try:
        return _arch_from_config(config, name, source)
    except ArchitectureError:
        raise
    except (MambaConfigError, QuantizationError) as exc:  # (both name the field)
        raise ArchitectureError(str(exc)) from None
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:  # a field of the wrong type or value
        raise ArchitectureError(f"config.json has a value kvwatch cannot read: {type(exc).__name__}: {exc}") from None


def _arch_from_config(config: dict[str, Any], name: str, source: str | None) -> ModelArch:
    cfg, model_type = _normalized_config(config)
    num_layers = require(cfg, "num_hidden_layers", "n_layer", "num_layers")
    if model_type in _ATTENTION_FREE_TYPES and not cfg.get("num_attention_heads"):
        raise ArchitectureError(f"{model_type} is an attention-free (pure Mamba) model: it holds a fixed state per "
                                "request and no KV cache per token, which kvwatch does not model")
    heads = require(cfg, "num_attention_heads", "n_head")
    hidden = require(cfg, "hidden_size", "n_embd", "d_model")
    kv_heads = _total_kv_heads(cfg, heads, model_type)
    kv_lora_rank = cfg.get("kv_lora_rank")
    is_mla = model_type in _MLA_TYPES
    if not is_mla and (kv_heads > heads or heads % kv_heads):
        # (vLLM's Attention asserts num_heads % num_kv_heads == 0: each KV head serves a whole group of heads)
        raise ArchitectureError(f"config.json gives {kv_heads} KV heads for {heads} attention heads "
                                "(num_key_value_heads or its like): the heads must be a whole multiple of them")
    # Zamba2's shared attention works on 2 x hidden: attention_head_dim = 2 * hidden / heads. MiniCPM3 has MLA's
    # projections but caches per-head K and V of qk_nope + qk_rope (vLLM's minicpm3.py: Attention(..., qk_head_dim)).
    decompressed = ((first_number(cfg, "qk_nope_head_dim") or 0) + (first_number(cfg, "qk_rope_head_dim") or 0)
                    if kv_lora_rank is not None and not is_mla and cfg.get("qk_nope_head_dim")
                    and cfg.get("qk_rope_head_dim") else None)
    head_dim = (first_number(cfg, "head_dim", "attention_head_dim") or decompressed
                or (2 * hidden // heads if model_type == "zamba2" else hidden // heads))
    if not 1 <= head_dim <= 65536:
        raise ArchitectureError(f"config.json gives a head size of {head_dim} (head_dim, or hidden_size {hidden} / "
                                f"num_attention_heads {heads}): it must be a positive count")
    raw_types = cfg.get("layer_types")
    if model_type == "step3p5" and isinstance(raw_types, list) and len(raw_types) > num_layers:
        # Step-3.5's remote-code config lists its MTP layers after the decoder's; vLLM's step3p5.py builds
        # num_hidden_layers layers and reads the first entries
        raw_types = raw_types[:num_layers]
        cfg = {**cfg, "layer_types": raw_types}
    if isinstance(raw_types, list) and raw_types and len(raw_types) != num_layers:
        # transformers refuses such a config too (layer_type_validation): one entry per decoder layer
        raise ArchitectureError(f"config.json has {len(raw_types)} layer_types for num_hidden_layers {num_layers}: "
                                "it needs exactly one per layer")
    layout = hybrid_layout(cfg, num_layers, model_type)
    architectures = tuple(str(a) for a in config.get("architectures") or [] if isinstance(a, str))
    layer_types = (layout.types if layout is not None
                   else layer_types_from_config(cfg, num_layers, model_type, architectures))
    notes: list[str] = []
    if kv_lora_rank is not None and not is_mla and model_type not in _DECOMPRESSED_MLA_TYPES:
        notes.append(f"config.json has kv_lora_rank, and model_type {model_type} is not one vLLM caches as a latent "
                     f"(MLA): sized as per-head K and V of {head_dim}, as vLLM's MiniCPM3; a vLLM that serves it with "
                     "MLA caches kv_lora_rank + qk_rope_head_dim per token and layer, far less")
    cross = cfg.get("cross_attention_layers")
    if isinstance(cross, list) and cross:
        # (Llama-3.2-Vision: its text config lists them among num_hidden_layers; read silently as self-attention)
        notes.append(f"{len(cross)} of the {num_layers} layers are cross-attention layers over the image encoder's "
                     "tokens (cross_attention_layers): counted here as self-attention on every token, as vLLM V0's "
                     "blocks count them; an image request's encoder KV (cross-attention blocks of its own) is not "
                     "counted, so image traffic fits fewer requests than this")
    if model_type in _LONGCAT_TYPES:
        # Each decoder layer runs two MLA attentions, each with a cache of its own (FlashDecoderLayer in vLLM's
        # longcat_flash.py; LongCat-Flash-Lite's n-gram model reuses it, and LongCat-Next's ports build on that
        # n-gram model): 2 x num_hidden_layers KV layers
        layer_types = tuple(kind for kind in layer_types for _ in range(2))
        notes.append(f"LongCat-Flash: two MLA attentions per decoder layer, so {len(layer_types)} KV layers for "
                     f"{num_layers} decoder layers")
    # LongCat-Flash-Lite's n-gram embeddings: emb_split_num × (emb_neighbor_num − 1) tables of ratio × vocab rows,
    # each hidden / that many wide (modeling_longcat_ngram.py's NgramEmbedding): ratio × vocab × hidden in all
    # (LongCat-Next's vocab_size also counts its image tokens; its text model's, text_vocab_size, sizes the tables)
    ratio = cfg.get("ngram_vocab_size_ratio") if model_type in _LONGCAT_TYPES[1:] else None
    vocab = first_number(cfg, *(("text_vocab_size",) if model_type == "longcat_next" else ()), "vocab_size") or 0
    ngram = round(real(ratio, "ngram_vocab_size_ratio") * vocab * hidden) if ratio else 0
    # (Qwen-Omni keeps its encoders in the thinker's config)
    outer = config.get("thinker_config") if isinstance(config.get("thinker_config"), dict) else config
    encoder = next((key for key in ("vision_config", "audio_config") if isinstance(outer.get(key), dict)), None)
    if encoder is not None or str(config.get("model_type", "")).lower() in _MULTIMODAL_TYPES:
        # vLLM's profile run also runs the encoder on a dummy batch and holds its outputs (gpu_model_runner.py
        # profile_run): Qwen2.5-VL-7B on an H100 logged 905,648 KV tokens where this estimate gives 1,022,992.
        counted = "are" if config.get("num_parameters") else "are not"
        notes.append(f"multimodal model ({encoder or config.get('model_type')}): the memory vLLM's profile run keeps "
                     "for the encoder's outputs is not in the activation estimate (the encoder's weights "
                     f"{counted} in the weights), so the KV figures here are high (Qwen2.5-VL-7B from its "
                     "config.json: about 13 %); pass --available-kv-gib from vLLM's startup log")
    if is_mla and (kv_lora_rank is None or cfg.get("qk_rope_head_dim") is None):
        raise ArchitectureError("MLA config.json needs kv_lora_rank and qk_rope_head_dim")
    # A layout field naming no Mamba / linear layer (MiniMax-M2's all-ones attn_type_list) is plain attention.
    is_hybrid = (layout.mamba_layers > 0) if layout is not None else model_type in HYBRID_MAMBA_TYPES
    dims = mamba_dims_from_config(cfg, model_type, hidden) if is_hybrid else None
    kv_shared = kv_shared_layer_count(cfg, num_layers, model_type)
    notes += _layout_notes(cfg, model_type, num_layers, layer_types, layout, is_hybrid, dims, kv_shared)
    num_experts = first_number(cfg, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts",
                         default=0) or 0
    tie = cfg.get("tie_word_embeddings")
    if tie is None:
        tie = config.get("tie_word_embeddings")
    if tie is None:
        tie, tie_note = _default_tie(model_type)
        if tie_note:
            notes.append(tie_note)
    # (ChatGLM's config names it padded_vocab_size, which vLLM's ChatGLMConfig reads as vocab_size)
    vocab = first_number(cfg, "vocab_size", "padded_vocab_size") or first_number(config, "vocab_size",
                                                                                 "padded_vocab_size")
    if vocab is None:
        vocab = DEFAULT_VOCAB_SIZE
        notes.append(f"config.json has no vocab_size: {DEFAULT_VOCAB_SIZE:,} assumed (transformers' LlamaConfig "
                     "default); the embedding weights and the sampler's memory follow it")
    qc = quantization_config_of(config)
    # (a preset has no quantization config: its own scheme as is)
    quant_scheme, quant_source = scheme_from_config(qc) if qc else (config.get("checkpoint_quantization"), None)
    max_len, max_len_how = derived_max_model_len(cfg, model_type)
    if max_len is None:
        notes.append(f"the model's maximum length is unknown: {max_len_how} (vLLM takes that default, or 2048 for a "
                     "class without one): pass --max-model-len; whether vLLM accepts it is not checked")
    elif length_field(cfg) is None:
        notes.append(f"the model's maximum length: {max_len_how} (vLLM reads the config through transformers)")
    if filled := class_defaults_used(language_part(config)):
        notes.append(f"config.json leaves out {', '.join(filled)}: {model_type}'s config class fills "
                     f"{', '.join(f'{k}={v}' for k, v in filled.items())}, as vLLM reads it through transformers")
    before = derived_max_model_len(cfg, model_type, version=(0, 29))
    scaling = rope_scaling(cfg)
    longrope = scaling is not None and scaling[1] in ("longrope", "su")
    original = cfg.get("original_max_position_embeddings") or (
        scaling[0].get("original_max_position_embeddings") if scaling is not None else None)
    return ModelArch(
        name=name,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=vocab,
        # Llama-4: dense layers use intermediate_size_mlp, experts (and the shared expert) intermediate_size
        intermediate_size=first_number(cfg, "intermediate_size_mlp", "intermediate_size", "ffn_hidden_size")
        or 4 * hidden,
        tie_word_embeddings=bool(tie),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16"),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        derived_max_model_len=max_len,
        max_len_source=max_len_how,
        derived_max_model_len_before_0_30=before if before[0] != max_len else None,
        longrope_default_len=int(original) if longrope and isinstance(original, int) and original > 0 else None,
        model_max_length=first_number(cfg, "model_max_length"),
        layer_types=layer_types,
        # (MiMo-V2-Flash's sliding layers take sliding_window_size)
        sliding_window=(first_number(cfg, "sliding_window_size", "sliding_window") if swa_pattern(cfg, num_layers)
                        else first_number(cfg, "sliding_window")) if SLIDING in layer_types else None,
        attention_chunk_size=first_number(cfg, "attention_chunk_size") if CHUNKED in layer_types else None,
        kv_shared_layers=kv_shared,
        attention_dims=() if is_mla else attention_dims_by_type(cfg, model_type, kv_heads, head_dim, layer_types),
        kv_lora_rank=positive(cfg, "kv_lora_rank") if is_mla else None,
        qk_rope_head_dim=positive(cfg, "qk_rope_head_dim") if is_mla else None,
        index_head_dim=first_number(cfg, "index_head_dim") if is_mla else None,
        index_topk_freq=max(1, int(first_number(cfg, "index_topk_freq", default=1) or 1)),
        index_skip_topk_offset=int(first_number(cfg, "index_skip_topk_offset", default=2) or 0),
        index_topk_pattern=cfg.get("index_topk_pattern") if isinstance(cfg.get("index_topk_pattern"), str) else None,
        num_experts=num_experts,
        experts_per_token=_experts_per_token(cfg),
        moe_intermediate_size=(first_number(cfg, "moe_intermediate_size", "expert_ffn_hidden_size", "intermediate_size",
                                      default=0) or 0)
        if num_experts else 0,
        num_shared_experts=first_number(cfg, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts",
                                  "num_shared_expert")
        or (1 if model_type.startswith("llama4") and num_experts else 0),
        first_k_dense_layers=first_number(cfg, "first_k_dense_replace", default=0) or 0,
        moe_layers=moe_layer_count(cfg, num_layers, num_experts, layout),
        dense_mlp_layers=layout.dense_mlp_layers if layout is not None else None,
        gated_mlp=model_type not in _NON_GATED_MLP_TYPES,
        # (Qwen2-MoE and Qwen3-Next name it shared_expert_intermediate_size: one shared expert of that width)
        shared_expert_intermediate_size=first_number(cfg, "moe_shared_expert_intermediate_size",
                                                     "shared_expert_intermediate_size", default=0) or 0,
        extra_embedding_params=ngram,
        mamba_layers=layout.mamba_layers if layout is not None else 0,
        mamba_inner_size=_mamba_inner_size(cfg, hidden) if is_hybrid and layout is not None else 0,
        has_mamba_state=is_hybrid,
        mamba_dims=dims,
        num_parameters=first_number(config, "num_parameters"),
        checkpoint_quantization=quant_scheme,
        checkpoint_quantization_source=quant_source,
        checkpoint_kv_cache=checkpoint_kv_cache_dtype(qc) if qc else None,
        checkpoint_quant_method=(str(qc.get("quant_method") or "") or None) if qc else (
            "mxfp4" if config.get("checkpoint_quantization") == "mxfp4" else None),
        weight_block_size=_weight_blocks(qc),
        weight_group_size=_weight_groups(qc),
        attention_params_per_layer=decompressed_mla_params(cfg, hidden, heads) if decompressed else None,
        attention_output_gate=model_type.startswith(("qwen3_next", "qwen3_5"))
        and cfg.get("attn_output_gate") is not False,
        source=source,
        notes=tuple(notes),
        model_type=model_type,
        architectures=architectures,
        mamba_ssm_cache_dtype=_ssm_state_dtype(cfg) if is_hybrid else None,
    )


def _normalized_config(config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(the text model's config with its sizes in the usual names and per-layer lists as their mean, model_type)."""
    cfg = text_config(config)
    if str(cfg.get("model_type") or "").lower() == "dbrx":
        # DbrxConfig names its sizes its own way and nests the experts' (vLLM's dbrx.py reads config.ffn_config)
        ffn = cfg.get("ffn_config") if isinstance(cfg.get("ffn_config"), dict) else {}
        cfg = {"num_hidden_layers": cfg.get("n_layers"), "num_attention_heads": cfg.get("n_heads"),
               "num_local_experts": ffn.get("moe_num_experts"), "num_experts_per_tok": ffn.get("moe_top_k"),
               "moe_intermediate_size": ffn.get("ffn_hidden_size"), **cfg}
    for key in ("intermediate_size", "moe_intermediate_size", "num_shared_expert", "moe_num_experts",
                "moe_layer_start_index", "moe_layer_end_index"):
        sizes = cfg.get(key)
        if isinstance(sizes, list) and sizes:
            if len(sizes) == cfg.get("num_hidden_layers"):
                # Gemma 3n gives one MLP width per layer, Hunyuan-A13B one expert width and shared-expert count:
                # the weights sum over layers, so the mean is the per-layer figure
                cfg = {**cfg, key: sum(real(s, key) for s in sizes) / len(sizes)}
            elif key.startswith("moe_"):
                # ERNIE-4.5-VL: [text, vision] experts (ernie45_vl_moe.py); the text model's are counted
                cfg = {**cfg, key: sizes[0]}
    model_type = str(cfg.get("model_type") or config.get("model_type") or "").lower()
    blocks = nas_blocks(cfg)
    if blocks is not None and cfg.get("intermediate_size") is None:
        cfg = {**cfg, "intermediate_size": nas_intermediate_size(blocks, require(cfg, "hidden_size", "n_embd"))}
    return cfg, model_type


def _layout_notes(cfg: dict[str, Any], model_type: str, num_layers: int, layer_types: tuple[str, ...],
                  layout: Layout | None, is_hybrid: bool, dims: MambaDims | None, kv_shared: int) -> list[str]:
    """What the layer layout leaves out or approximates, said: a hybrid's state pages (``dims``: its state
    dimensions, None where the config has none), a layout kvwatch did not read, KV sharing and chunked local
    attention."""
    notes: list[str] = []
    attention = sum(1 for t in layer_types if t not in NO_KV)
    not_modelled = ("its Mamba state pages and vLLM's page-size unification are modelled from "
                    f"{dims.source}" if dims is not None else
                    "the config has no Mamba state dimensions kvwatch reads, so vLLM's state pages and the "
                    "page-size unification are NOT modelled and vLLM reports fewer tokens")
    if is_hybrid and layout is None:
        notes.append(f"{model_type} is a hybrid Mamba model but its layer layout was not recognised (no layer_types, "
                     "layers_block_type, attn_type_list, attn_layer_indices, attn_layer_period or "
                     f"hybrid_override_pattern): all {num_layers} layers are counted as attention, which overstates "
                     f"the KV per token; {not_modelled}")
    elif layout is not None and is_hybrid and attention == num_layers:
        notes.append(f"hybrid model ({layout.source}): every one of the {num_layers} layers has attention and a "
                     f"Mamba mixer, so all are counted for the KV cache; {not_modelled}")
    elif layout is not None and is_hybrid:
        notes.append(f"hybrid Mamba/linear-attention model ({layout.source}): the KV cache is counted for its "
                     f"{attention} attention layers of {num_layers}; {not_modelled}")
    unread = unread_layout_fields(cfg) if layout is None and set(layer_types) == {FULL} else []
    if unread:
        notes.append(f"config.json has {', '.join(unread)}: a layer layout kvwatch did not read for model_type "
                     f"{model_type or '(none)'}, so all {num_layers} layers are counted as full attention, which can "
                     "be far off; size it from vLLM's startup log ('GPU KV cache size', --available-kv-gib and "
                     "--kv-bytes-per-token)")
    if kv_shared:
        notes.append(f"KV sharing (num_kv_shared_layers): the last {kv_shared} of {num_layers} layers reuse earlier "
                     "layers' KV cache and hold none of their own, so the KV is counted for the first "
                     f"{num_layers - kv_shared} (the weights for all)")
    if CHUNKED in layer_types:
        notes.append(f"chunked local attention in {layer_types.count(CHUNKED)} of {num_layers} layers "
                     f"(attention_chunk_size {cfg['attention_chunk_size']}): from vLLM 0.14 these layers form KV "
                     "groups of their own and hold a request's current chunk (chunk + the in-flight tokens in "
                     "vLLM's worst case, at max_model_len); before, vLLM "
                     "disabled its hybrid KV cache manager for them "
                     "(VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaulted to 0) and they held every token "
                     "like full attention")
    return notes


# config.json fields that lay out a model's layers differently (some layers without KV, windowed, or sharing
# another's), where kvwatch reads them only for the model types it knows (kvwatch.capacity.layers): on another type
# they mean a layout kvwatch does not model (Ring-mini-linear's layer_group_size, RecurrentGemma's
# block_types, Hunyuan's use_cla were planned as plain attention in every layer without a word).
UNREAD_LAYOUT_FIELDS = ("layer_group_size", "block_types", "attention_window_size", "use_cla", "full_attn_idxs",
                        "layers_block_type", "layer_block_type", "hybrid_override_pattern", "attn_layer_indices",
                        "attn_layer_period", "linear_attn_config")


def unread_layout_fields(cfg: dict[str, Any]) -> list[str]:
    """The :data:`UNREAD_LAYOUT_FIELDS` ``cfg`` sets (a false ``use_cla`` sets nothing)."""
    return [key for key in UNREAD_LAYOUT_FIELDS if cfg.get(key) not in (None, False, "", [], {})]


def _experts_per_token(cfg: dict[str, Any]) -> int | None:
    for key in ("num_experts_per_tok", "num_experts_per_token", "experts_per_token", "moe_topk", "moe_k",
                "moe_top_k"):
        if cfg.get(key):
            value = cfg[key]
            return number(value[0] if isinstance(value, list) else value, key)
    return None


def quantization_config_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """A checkpoint's quantization config as vLLM reads it (``_normalize_quantization_config``): the
    ``quantization_config`` (or compressed-tensors' older ``compression_config``), a ModelOpt one without a
    ``quant_method`` (hf_quant_config.json's ``producer``/``quantization`` shape) given its method; else the
    ``text_config``'s, as vLLM looks there for multimodal checkpoints (model_arch_config_convertor.py,
    get_quantization_config)."""
    qc = config.get("quantization_config")
    if qc is None:
        qc = config.get("compression_config")
    if not isinstance(qc, dict) or not qc:
        text = config.get("text_config")
        return quantization_config_of(text) if isinstance(text, dict) and text is not config else None
    inner = qc.get("quantization")
    producer = qc.get("producer")
    if not qc.get("quant_method") and isinstance(inner, dict) and (
            (isinstance(producer, dict) and producer.get("name") == "modelopt") or "modelopt_quant_config" in inner):
        algo = str(inner.get("quant_algo") or "").upper()
        method = "modelopt_fp4" if algo == "NVFP4" else "modelopt"
        qc = {**qc, "quant_method": method}
    return qc
