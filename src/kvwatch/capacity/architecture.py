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

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

from kvwatch.capacity.mamba import MambaConfigError, MambaDims, bailing_v3, mamba_dims_from_config
from kvwatch.capacity.quantization import QuantizationError, checkpoint_kv_cache_dtype, scheme_from_config

# Pure state-space models (vLLM's mamba.py, mamba2.py, falcon_mamba): no attention layer at all.
_ATTENTION_FREE_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba"})
FULL = "full_attention"
SLIDING = "sliding_attention"
# Llama-4's chunked local attention (layers with RoPE attend within attention_chunk_size-token chunks). Up to 0.13
# vLLM disabled its hybrid KV cache manager for it by default (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE
# defaulted to 0), so these layers held every token like full attention; from 0.14 they form groups of their own
# (kv.CHUNKED_HYBRID_SINCE).
CHUNKED = "chunked_local_attention"
MAMBA = "mamba"  # a Mamba / linear-attention mixer: state pages, no KV cache
MLP_ONLY = "mlp_only"  # a layer with an MLP and no mixer (Nemotron-H's "-" and "E"): neither KV nor state
_NO_KV = frozenset({MAMBA, MLP_ONLY})

# model_type values of hybrid attention + Mamba/linear-attention models (vLLM keeps SSM state pages).
_HYBRID_MAMBA_TYPES = frozenset({
    "jamba", "bamba", "nemotron_h", "falcon_h1", "zamba2", "granitemoehybrid", "qwen3_next", "minimax_m1",
    "minimax_text_01", "plamo2", "lfm2", "bailing_hybrid",
})
_MAMBA_LAYER_WORDS = ("mamba", "linear", "ssm", "conv", "deltanet")
# vLLM caches one latent per token (MLA) only for these model_types (ModelArchConfigConvertorBase.is_deepseek_mla in
# vllm/transformers_utils/model_arch_config_convertor.py, 0.34); another model with kv_lora_rank (MiniCPM3)
# decompresses it into ordinary per-head K and V.
_MLA_TYPES = frozenset({
    "axk1", "bailing_hybrid", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "dots3_note", "k3_dspark",
    "glm5_next",
    "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite", "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash",
    "mistral_large_4", "pangu_ultra_moe", "pangu_ultra_moe_mtp", "hy_v4", "hy_v4_mtp",
})
# Top-level model_type values of multimodal models whose preset or config.json may omit the encoder's config.
_MULTIMODAL_TYPES = frozenset({
    "gemma3", "gemma3n", "gemma4", "llama4", "mistral3", "phi3_v", "phi4mm", "qwen2_vl", "qwen2_5_vl", "qwen3_vl",
    "qwen3_vl_moe", "llava", "llava_next", "pixtral", "idefics3", "internvl_chat", "kimi_vl", "glm4v",
})
# vLLM's CONFIG_FIELD_ALIASES["total_num_kv_heads"] (vllm/transformers_utils/config.py), first present wins; without
# any of them the model is MHA.
_KV_HEAD_FIELDS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
# Defaults of transformers' config classes for fields their config.json files leave out (the class fills them in,
# vLLM reads the result). Gemma3TextConfig (transformers models/gemma3/configuration_gemma3.py): Gemma-3 4B's
# text_config names only its sizes, and no Gemma-3 file names the sliding-window pattern.
_CONFIG_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131_072, "sliding_window": 4096, "sliding_window_pattern": 6,
                    "tie_word_embeddings": True},
}


# transformers' default for tie_word_embeddings when config.json omits it: PreTrainedConfig's own default is True;
# config classes override it. Read in transformers' configuration_<type>.py: llama, mistral, qwen2, qwen3, phi3,
# gpt_oss, deepseek_v3 and falcon_h1 say False; gemma, gemma2 and gemma3_text say True; zamba2 does not set it
# (True). The other entries belong to the same families (their classes are copies of those) and were not read
# one by one.
_TIE_DEFAULT_FALSE = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "phi3", "gpt_oss",
    "deepseek_v2", "deepseek_v3", "kimi_k2", "falcon_h1", "glm4", "glm4_moe", "granite", "granitemoe",
    "granitemoehybrid", "jamba", "bamba", "nemotron_h", "minimax", "minimax_text_01", "minimax_m1",
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


# vLLM's ModelConfig._get_and_verify_max_len (vllm/config): the smallest of these config fields is the model's
# length, "model_max_length" wins outright, and rope_scaling multiplies it unless the type already extends
# max_position_embeddings ("su", "longrope", "llama3") or the model is Gemma-3 (already scaled).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
_ROPE_TYPES_NOT_SCALED = frozenset({"su", "longrope", "llama3"})
VLLM_DEFAULT_MAX_LEN = 2048  # what vLLM assumes (with a warning) when no field is there


YARN_UNSCALED_SINCE = (0, 30)  # YaRN's max_position_embeddings is the scaled length already (before: original × factor)
LONGROPE_DEFAULT_SINCE = (0, 12)  # LongRoPE's default --max-model-len is original_max_position_embeddings
_YARN_TYPES = frozenset({"yarn", "deepseek_yarn", "deepseek_llama_scaling"})


def _rope(cfg: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """(the RoPE scaling block, its type) of a config; None without one (transformers v5 renamed the key)."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict) or not rope:
        return None
    return rope, str(rope.get("rope_type") or rope.get("type") or "default")


def derived_max_model_len(cfg: dict[str, Any], model_type: str = "", *,
                          version: tuple[int, int] | None = None) -> tuple[int, str]:
    """(the longest --max-model-len vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN, how it was derived).

    Follows vLLM's ``_get_and_verify_max_len``: the smallest of :data:`MAX_LEN_KEYS`, ``model_max_length``
    taking precedence, then the RoPE scaling factor (dynamic/linear: ``max_len × factor``; llama3/longrope/su:
    no change, their max_position_embeddings is already the extended length; YaRN: no change from vLLM 0.30
    (``version`` None: the current rules), ``original_max_position_embeddings × factor`` before). The sliding
    window only limits it under ``--disable-sliding-window``, which kvwatch does not model.
    """
    derived: float = float("inf")
    key: str | None = None
    for name in MAX_LEN_KEYS:
        value = cfg.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < derived:
            derived, key = float(value), name
    if isinstance(cfg.get("model_max_length"), (int, float)) and cfg["model_max_length"]:
        derived, key = float(cfg["model_max_length"]), "model_max_length"
    how = f"{key}={int(derived)}" if key else f"no length field in config.json: vLLM assumes {VLLM_DEFAULT_MAX_LEN}"
    if key is None:
        derived = float(VLLM_DEFAULT_MAX_LEN)
    scaling = _rope(cfg)
    yarn_unscaled = version is None or version >= YARN_UNSCALED_SINCE
    if scaling is not None and "gemma3" not in model_type:
        rope, rope_type = scaling
        if rope_type not in _ROPE_TYPES_NOT_SCALED and not (yarn_unscaled and rope_type in _YARN_TYPES):
            factor = _real(rope.get("factor") or 1.0, "rope_scaling.factor")  # (null: vLLM falls back to 1.0)
            if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
                original = _number(rope["original_max_position_embeddings"],
                                   "rope_scaling.original_max_position_embeddings")
                derived = original * factor
                how = f"rope_scaling {rope_type}: original_max_position_embeddings={original} × factor {factor:g}"
            elif factor != 1.0:
                how = f"{how} × rope_scaling {rope_type} factor {factor:g}"
                derived *= factor
    return int(derived), how


class ArchitectureError(ValueError):
    """The config lacks a field the capacity model needs (message names it)."""


@dataclass(frozen=True)
class AttentionDims:
    """The KV cache dimensions of one attention layer type (whole model, not per rank), as the layer's
    ``Attention(num_kv_heads=..., head_size=..., head_size_v=...)`` gets them in vLLM."""

    num_kv_heads: int
    head_dim: int  # K head size
    v_head_dim: int  # V head size (vLLM's head_size_v; the K head size for nearly every model)

    def bytes_per_token(self, tp: int, kv_bytes: int, *, separate_v: bool = True) -> int:
        """One layer's K and V for one token on one rank: ``max(1, heads // TP) × (head_size + head_size_v) ×
        kv_bytes`` (vLLM's ``FullAttentionSpec.real_page_size_bytes`` ÷ block size; heads are replicated once TP
        exceeds them). ``separate_v`` False: V takes the K head size (MiMo-V2-Flash before vLLM 0.20)."""
        v = self.v_head_dim if separate_v else self.head_dim
        return max(1, self.num_kv_heads // tp) * (self.head_dim + v) * kv_bytes


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
    # LongRoPE (Phi-3/3.5/4-mini 128k): vLLM ≥ 0.12 defaults --max-model-len to original_max_position_embeddings.
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

    @property
    def is_hybrid_mamba(self) -> bool:
        return self.has_mamba_state or MAMBA in self.layer_types

    @property
    def attention_layer_types(self) -> tuple[str, ...]:
        """Layer types of layers that hold a KV cache (Mamba / linear-attention and MLP-only layers excluded)."""
        types = self.layer_types or (FULL,) * self.num_layers
        return tuple(t for t in types if t not in _NO_KV)

    @property
    def kv_cache_layer_types(self) -> tuple[str, ...]:
        """Layer types of layers with a KV cache of their own: :attr:`attention_layer_types` without the
        KV-shared ones (vLLM's cache groups and bytes per token count only these)."""
        types = self.layer_types or (FULL,) * self.num_layers
        own = types[:max(0, len(types) - self.kv_shared_layers)]
        return tuple(t for t in own if t not in _NO_KV)

    @property
    def has_sliding_window(self) -> bool:
        return SLIDING in self.layer_types


def tensor_parallel_refusal(arch: ModelArch, tp: int) -> str | None:
    """Why vLLM refuses ``--tensor-parallel-size tp`` for this model, or None when it accepts it.

    The size must divide the attention heads ("Total number of attention heads (28) must be divisible by tensor
    parallel size (3)"), and the model's QKV projection asserts that the KV heads divide the size or the size
    divides them (beyond the KV head count each head is replicated: vllm/model_executor/models/llama.py). MLA
    caches one latent shared by all heads, so its KV heads do not constrain the size."""
    if arch.num_attention_heads % tp:
        return f"vLLM requires it to divide the model's {arch.num_attention_heads} attention heads"
    for kv in () if arch.is_mla else arch.kv_head_counts:  # (Gemma 4 asserts it for each layer type's heads)
        if kv and (kv % tp if tp <= kv else tp % kv):
            which = "" if len(arch.kv_head_counts) == 1 else " (on some of its layers)"
            return (f"vLLM requires it to divide the model's {kv} KV heads{which}, or to be a multiple of them (each "
                    "head is then replicated)")
    return None


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a (possibly multimodal) config; top-level keys fill gaps, and the defaults of
    its transformers config class fill what the file leaves out (:data:`_CONFIG_CLASS_DEFAULTS`)."""
    thinker = config.get("thinker_config")
    if isinstance(thinker, dict):  # Qwen2.5/3-Omni: the thinker's text_config is the LLM (vLLM's get_hf_text_config)
        config = {**{k: v for k, v in config.items() if not isinstance(v, dict)}, **thinker}
    cfg = config
    for key in ("text_config", "llm_config", "language_config"):
        nested = config.get(key)
        if isinstance(nested, dict) and ("num_hidden_layers" in nested or "hidden_size" in nested
                                         or nested.get("model_type") in _CONFIG_CLASS_DEFAULTS):
            cfg = {k: v for k, v in config.items() if not isinstance(v, dict)}
            cfg.update({k: v for k, v in nested.items() if v is not None})  # (null: not given)
            break
    defaults = _CONFIG_CLASS_DEFAULTS.get(str(cfg.get("model_type") or ""))
    return {**defaults, **{k: v for k, v in cfg.items() if v is not None}} if defaults else cfg


def _total_kv_heads(cfg: dict[str, Any], heads: int, model_type: str) -> int:
    """vLLM's total KV heads (ModelArchConfigConvertorBase.get_total_num_kv_heads and the Falcon/DBRX overrides)."""
    if cfg.get("multi_query") and not (model_type in ("falcon", "refinedweb", "refinedwebmodel")
                                       and cfg.get("new_decoder_architecture")):
        return 1  # multi-query attention (Falcon-7B, StarCoder); Falcon-40B's new decoder reads n_head_kv instead
    attn = cfg.get("attn_config")
    blocks = _nas_blocks(cfg)
    if blocks:  # Nemotron-NAS: the first block with attention (NemotronNasModelArchConfigConvertor, vLLM 0.32)
        group = next((_number(b["attention"].get("n_heads_in_group"), "block_configs n_heads_in_group")
                      for b in blocks if not b["attention"].get("no_op")), None)
        return max(1, heads // group) if group else heads
    if model_type == "dbrx" and isinstance(attn, dict) and attn.get("kv_n_heads"):
        return _number(attn["kv_n_heads"], "attn_config.kv_n_heads")
    for name in _KV_HEAD_FIELDS:
        if cfg.get(name) is not None and cfg.get(name) != 0:  # (0 reads as unset, as the ``or`` chain did)
            return _positive(cfg, name) or heads
    return heads


# Past these no released model goes; a config beyond them is broken (num_hidden_layers 1e9 never returned).
_MAX_COUNT = {"num_hidden_layers": 10_000, "n_layer": 10_000, "num_layers": 10_000}
_MAX_ANY = 10_000_000


def _require(cfg: dict[str, Any], *keys: str) -> int:
    for key in keys:
        if cfg.get(key) is not None:
            value = _count(cfg, key)
            if value is None:
                raise ArchitectureError(f"config.json has {key} = {cfg[key]!r}: it must be a whole number from 1 to "
                                        f"{_MAX_COUNT.get(key, _MAX_ANY):,}")
            return value
    raise ArchitectureError(f"config.json has no {' / '.join(keys)}")


def _count(cfg: dict[str, Any], key: str) -> int | None:
    """``cfg[key]`` as a positive count within reason, else None."""
    value = cfg[key]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)  # (a count written as a string reads as before)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    if not 1 <= value <= _MAX_COUNT.get(key, _MAX_ANY) or value != int(value):
        return None
    return int(value)


def _positive(cfg: dict[str, Any], key: str) -> int | None:
    """``cfg[key]`` as a positive whole count (a head count or size), None when unset (null); anything else (0,
    negative, fractional, not a number) is an ArchitectureError naming the field, not a silent fallback."""
    if cfg.get(key) is None:
        return None
    value = _count(cfg, key)
    if value is None:
        raise ArchitectureError(f"config.json has {key} = {cfg[key]!r}: it must be a whole number from 1 to "
                                f"{_MAX_COUNT.get(key, _MAX_ANY):,}")
    return value


def _real(value: Any, field: str) -> float:
    """A config value as a finite number (one written as a string reads too). Anything else (a list, a word, a
    bool) is an ArchitectureError naming the field, not a TypeError from ``int()`` deep inside."""
    number: float | None = None
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    if number is None or not math.isfinite(number):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
        raise ArchitectureError(f"config.json has {field} = {shown}: kvwatch needs a number there")
    return number


def _number(value: Any, field: str) -> int:
    """:func:`_real`, as the whole number ``int()`` makes of it."""
    return int(_real(value, field))


def _field(cfg: dict[str, Any], *keys: str, default: int | None = None) -> int | None:
    """The first of ``keys`` that ``cfg`` sets (null, 0 and empty count as unset, like the ``or`` chains this
    replaces) as a number (:func:`_number`); ``default`` when none is."""
    for key in keys:
        if cfg.get(key):
            return _number(cfg[key], key)
    return default


def _word_type(word: str) -> str:
    w = word.lower()
    if any(m in w for m in _MAMBA_LAYER_WORDS):
        return MAMBA
    if "sliding" in w or "local" in w:
        return SLIDING
    return FULL  # "attention", "full_attention", Zamba2's "hybrid" (a shared attention block + Mamba)


@dataclass(frozen=True)
class _Layout:
    types: tuple[str, ...]
    source: str | None = None  # the config field the hybrid layout came from
    mamba_layers: int = 0  # layers with a Mamba / linear mixer (Falcon-H1 and Zamba2: every layer)


def _hybrid_layout(cfg: dict[str, Any], num_layers: int, model_type: str) -> _Layout | None:
    """Attention vs Mamba / linear-attention layers, from whichever field the model family uses."""
    raw = cfg.get("layer_types")
    if isinstance(raw, list) and raw and any(_word_type(str(t)) == MAMBA for t in raw):
        types = tuple(_word_type(str(t)) for t in raw[:num_layers])
        return _Layout(types, "layer_types", types.count(MAMBA))
    blocks = cfg.get("layers_block_type")  # Jamba-style ("attention"/"mamba"), Zamba2 ("hybrid"/"mamba")
    if isinstance(blocks, list) and blocks:
        types = tuple(_word_type(str(t)) for t in blocks[:num_layers])
        mixers = len(types) if model_type == "zamba2" else types.count(MAMBA)
        return _Layout(types, "layers_block_type", mixers)
    linear = cfg.get("linear_attn_config")  # Kimi-Linear: KDA where (index + 1) is in kda_layers, else MLA
    if isinstance(linear, dict) and isinstance(linear.get("kda_layers"), list) and linear["kda_layers"]:
        # vllm/transformers_utils/configs/kimi_linear.py is_kda_layer: 1-based layer numbers
        kda = {_number(n, "linear_attn_config.kda_layers") for n in linear["kda_layers"]}
        types = tuple(MAMBA if i + 1 in kda else FULL for i in range(num_layers))
        return _Layout(types, "linear_attn_config.kda_layers", types.count(MAMBA))
    kinds = cfg.get("attn_type_list")  # MiniMax: 1 = softmax attention, 0 = lightning (linear) attention
    if isinstance(kinds, list) and kinds:
        types = tuple(FULL if _number(k, "attn_type_list") == 1 else MAMBA for k in kinds[:num_layers])
        return _Layout(types, "attn_type_list", types.count(MAMBA))
    indices = cfg.get("attn_layer_indices")  # Bamba: the attention layers; the rest are Mamba2
    if isinstance(indices, list) and indices:
        wanted = {_number(i, "attn_layer_indices") for i in indices}
        types = tuple(FULL if i in wanted else MAMBA for i in range(num_layers))
        return _Layout(types, "attn_layer_indices", types.count(MAMBA))
    period = _field(cfg, "attn_layer_period")  # Jamba: attention every attn_layer_period layers
    if period and model_type in _HYBRID_MAMBA_TYPES:
        offset = _field(cfg, "attn_layer_offset", default=0)
        types = tuple(FULL if i % period == offset else MAMBA for i in range(num_layers))
        return _Layout(types, "attn_layer_period", types.count(MAMBA))
    interval = _field(cfg, "full_attention_interval")  # Qwen3-Next: every interval-th layer is full attention
    if interval and model_type in _HYBRID_MAMBA_TYPES:
        types = tuple(FULL if (i + 1) % interval == 0 else MAMBA for i in range(num_layers))
        return _Layout(types, "full_attention_interval", types.count(MAMBA))
    pattern = cfg.get("hybrid_override_pattern")  # Nemotron-H: M = Mamba, * = attention, - = MLP, E = MoE
    if isinstance(pattern, str) and pattern:
        mapping = {"M": MAMBA, "*": FULL, "-": MLP_ONLY, "E": MLP_ONLY}
        types = tuple(mapping[ch] for ch in pattern[:num_layers] if ch in mapping)
        return _Layout(types, "hybrid_override_pattern", types.count(MAMBA))
    group = _field(cfg, "layer_group_size")  # Ling/Ring 2.5 and 3.0: one MLA layer closes each group
    if group and model_type == "bailing_hybrid":
        if bailing_v3(cfg):  # bailing_moe_v3.py _is_kda_layer: the layers after the last whole group are MLA too
            whole = num_layers // group * group
            types = tuple(FULL if (i + 1) % group == 0 or i >= whole else MAMBA for i in range(num_layers))
        else:  # bailing_moe_linear.py is_linear_layer (BailingMoeV2_5ForCausalLM): lightning attention
            types = tuple(FULL if (i + 1) % group == 0 else MAMBA for i in range(num_layers))
        return _Layout(types, "layer_group_size", types.count(MAMBA))
    if model_type == "falcon_h1":  # attention and a Mamba2 mixer side by side in every layer
        return _Layout((FULL,) * num_layers, "model_type falcon_h1 (parallel hybrid)", num_layers)
    if isinstance(raw, list) and raw and model_type in _HYBRID_MAMBA_TYPES:
        # A hybrid family whose layer_types name no Mamba layer and no other field says otherwise (Granite-4.0-micro:
        # all "attention") is plain attention: vLLM's ModelConfig.is_hybrid says so too (vllm/config/model.py).
        types = tuple(_word_type(str(t)) for t in raw[:num_layers])
        return _Layout(types, "layer_types", 0)
    return None


def _nas_blocks(cfg: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Nemotron-NAS (DeciLM: Llama-3.3-Nemotron-Super-49B, …) ``block_configs``, one per layer, each with an
    ``attention`` and an ``ffn`` dict; None for any other config."""
    blocks = cfg.get("block_configs")
    if not isinstance(blocks, list) or not blocks or not all(
            isinstance(b, dict) and isinstance(b.get("attention"), dict) and isinstance(b.get("ffn", {}), dict)
            for b in blocks):
        return None
    return blocks


def _nas_intermediate_size(blocks: list[dict[str, Any]], hidden: int) -> float:
    """The mean MLP width over Nemotron-NAS's blocks: ``int(2·ffn_mult·hidden/3)`` rounded up to a multiple of 256
    (nemotron_nas.py ``_ffn_mult_to_intermediate_size``), 0 where the block has no MLP (``ffn.no_op``)."""
    sizes = []
    for b in blocks:
        ffn = b.get("ffn", {})
        mult = ffn.get("ffn_mult")
        if ffn.get("no_op") or mult is None:
            sizes.append(0)
            continue
        width = int(2 * _real(mult, "block_configs ffn_mult") * hidden / 3)
        sizes.append(width + (-width) % 256)
    return sum(sizes) / len(sizes)


def _layer_types(cfg: dict[str, Any], num_layers: int, model_type: str,
                 architectures: tuple[str, ...] = ()) -> tuple[str, ...]:
    blocks = _nas_blocks(cfg)
    if blocks is not None:  # vLLM builds no attention layer for a block whose attention is a no-op
        if len(blocks) < num_layers:
            raise ArchitectureError(f"config.json has {len(blocks)} block_configs for num_hidden_layers {num_layers}: "
                                    "it needs one per layer")
        return tuple(MLP_ONLY if b["attention"].get("no_op") else FULL for b in blocks[:num_layers])
    if cfg.get("attention_chunk_size"):
        # Llama-4 (vLLM's llama4.py): a layer with RoPE uses chunked local attention, a NoPE layer is global.
        # no_rope_layers[i] == 0 marks NoPE; when empty, transformers derives it from no_rope_layer_interval (4).
        nope = cfg.get("no_rope_layers")
        interval = _field(cfg, "no_rope_layer_interval", default=4) or 4
        uses_rope = ([bool(_number(v, "no_rope_layers")) for v in nope[:num_layers]]
                     if isinstance(nope, list) and nope else [(i + 1) % interval != 0 for i in range(num_layers)])
        return tuple(CHUNKED if rope else FULL for rope in uses_rope)
    pattern = _swa_pattern(cfg, num_layers)
    if pattern is not None:
        return pattern
    raw = cfg.get("layer_types")
    if isinstance(raw, list) and raw and "Rnj1ForCausalLM" in architectures:
        # Rnj-1 (a gemma3_text config; vLLM's rnj1.py): a chunked_attention layer attends over sliding_window tokens,
        # any other layer globally (kvwatch read chunked_attention as global: 26 % too few requests at 32k)
        return tuple(SLIDING if str(t) == "chunked_attention" else FULL for t in raw[:num_layers])
    if isinstance(raw, list) and raw:
        return tuple(_word_type(str(t)) for t in raw[:num_layers])
    window = _field(cfg, "sliding_window")
    letters = cfg.get("sliding_window_pattern")
    if isinstance(letters, str) and letters and set(letters.upper()) <= {"L", "G"}:
        # EXAONE 4: "LLLG" repeats from layer 0 (L local, G global) and the last layer is always global, as
        # TensorRT-LLM's modeling_exaone4.py check_is_sliding reads it; no window: every layer global
        return tuple(SLIDING if window and letters[i % len(letters)].upper() == "L" and i < num_layers - 1
                     else FULL for i in range(num_layers))
    swp = _field(cfg, "sliding_window_pattern")
    if window and swp:  # Gemma-3: every swp-th layer is global, the others local.
        return tuple(FULL if (i + 1) % swp == 0 else SLIDING for i in range(num_layers))
    if window and model_type == "gemma2":  # Gemma-2 alternates local and global, local first.
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers))
    if window and cfg.get("use_sliding_window") and model_type.startswith(("qwen2", "qwen3")):
        given = cfg.get("max_window_layers")
        max_window_layers = num_layers if given is None else _number(given, "max_window_layers")
        return tuple(FULL if i < max_window_layers else SLIDING for i in range(num_layers))
    if window and cfg.get("use_sliding_window") is not False and not model_type.startswith(("qwen2", "qwen3")) \
            and window < (_field(cfg, "max_position_embeddings") or 0):
        # A window and no layer_types: vLLM sets CacheConfig.sliding_window (arg_utils: "only ... if the model is
        # all sliding window"), and each attention layer without a window of its own takes it (Mistral, Mixtral,
        # Phi-3-mini-4k's 2047). Qwen2/3's window is off unless use_sliding_window (above).
        return (SLIDING,) * num_layers
    return (FULL,) * num_layers


def _swa_pattern(cfg: dict[str, Any], num_layers: int) -> tuple[str, ...] | None:
    """MiMo-V2-Flash's layer types: ``hybrid_layer_pattern[i] == 1`` makes layer i a sliding-window layer with the
    swa_* dimensions, 0 a full-attention one (MiMoV2FlashDecoderLayer.is_compressed_softmax_layer in
    vllm/model_executor/models/mimo_v2_flash.py); None without such a pattern."""
    pattern = cfg.get("hybrid_layer_pattern")
    if pattern is None:
        return None
    if not isinstance(pattern, list) or not pattern:
        raise ArchitectureError(f"config.json has hybrid_layer_pattern = {str(pattern)[:60]!r}: it must be a list "
                                "with one 0 (full) or 1 (sliding) per layer")
    if len(pattern) < num_layers:  # vLLM indexes it by layer: a short list fails there too
        raise ArchitectureError(f"config.json has {len(pattern)} hybrid_layer_pattern entries for num_hidden_layers "
                                f"{num_layers}: it needs one per layer")
    return tuple(SLIDING if _number(p, "hybrid_layer_pattern") == 1 else FULL for p in pattern[:num_layers])


def _attention_dims(cfg: dict[str, Any], model_type: str, kv_heads: int, head_dim: int,
                    layer_types: tuple[str, ...]) -> tuple[tuple[str, AttentionDims], ...]:
    """Per layer type KV dimensions where a family gives its layer types different ones (ModelArch.attention_dims).

    Gemma 4 (Gemma4DecoderLayer in vllm/model_executor/models/gemma4.py, 0.20; gemma4_layer_config in
    vllm/transformers_utils/configs/gemma4.py from 0.30): full-attention layers use ``global_head_dim`` (else
    head_dim) and, only with ``attention_k_eq_v``, ``num_global_key_value_heads`` (else num_key_value_heads). With
    k_eq_v the checkpoint has no v_proj: K's weights are loaded into V's slot too, and the cache still stores K and
    V (a plain Attention layer, head_size_v = head_size). MiMo-V2-Flash (mimo_v2_flash.py): sliding layers use
    ``swa_num_key_value_heads``, ``swa_head_dim`` and ``swa_v_head_dim``, full ones the model's heads and
    ``v_head_dim`` (each else the K head size)."""
    dims: dict[str, AttentionDims] = {}
    if model_type.startswith("gemma4") and FULL in layer_types:
        k_eq_v = cfg.get("attention_k_eq_v")
        if k_eq_v is not None and not isinstance(k_eq_v, bool):
            raise ArchitectureError(f"config.json has attention_k_eq_v = {k_eq_v!r}: it must be true or false")
        global_heads = _positive(cfg, "num_global_key_value_heads") if k_eq_v else None
        global_head = _positive(cfg, "global_head_dim") or head_dim
        dims[FULL] = AttentionDims(global_heads or kv_heads, global_head, global_head)
    elif cfg.get("hybrid_layer_pattern") is not None:
        v_full = _positive(cfg, "v_head_dim") or head_dim
        dims[FULL] = AttentionDims(kv_heads, head_dim, v_full)
        swa_head = _positive(cfg, "swa_head_dim") or head_dim
        dims[SLIDING] = AttentionDims(_positive(cfg, "swa_num_key_value_heads") or kv_heads, swa_head,
                                      _positive(cfg, "swa_v_head_dim") or swa_head)
    default = AttentionDims(kv_heads, head_dim, head_dim)
    return tuple((kind, d) for kind, d in sorted(dims.items()) if d != default)


def _kv_shared_layers(cfg: dict[str, Any], num_layers: int, model_type: str) -> int:
    """Layers at the end that reuse earlier layers' KV (Gemma 3n and Gemma 4 read num_kv_shared_layers); 0 when
    the model has none, or when no earlier layer is left to share with."""
    if not model_type.startswith(("gemma3n", "gemma4")):
        return 0
    shared = _field(cfg, "num_kv_shared_layers", default=0) or 0
    return shared if 0 < shared < num_layers else 0


def _moe_layers(cfg: dict[str, Any], num_layers: int, num_experts: int, layout: _Layout | None) -> int | None:
    """Layers with an MoE block when the family says not all have one; None = the usual rule."""
    if not num_experts:
        return None
    period = _field(cfg, "expert_layer_period")  # Jamba: MoE every expert_layer_period layers
    if period:
        offset = _field(cfg, "expert_layer_offset", default=0)
        return sum(1 for i in range(num_layers) if i % period == offset)
    ernie = str(cfg.get("model_type") or "").startswith("ernie4_5")
    if ernie or isinstance(cfg.get("moe_layer_start_index"), int) or isinstance(cfg.get("moe_layer_interval"), int):
        # ERNIE-4.5: MoE from start to end (inclusive) when (i + 1) % interval == 0 (ernie45_moe.py), none with
        # use_moe false; transformers' Ernie4_5_MoeConfig starts at layer 1 and reads an end of -1 as the last
        if cfg.get("use_moe") is False:
            return 0
        start, end = cfg.get("moe_layer_start_index"), cfg.get("moe_layer_end_index")
        start = (1 if ernie else 0) if start is None else _number(start, "moe_layer_start_index")
        end = num_layers - 1 if end is None or _number(end, "moe_layer_end_index") < 0 else _number(
            end, "moe_layer_end_index")
        interval = _field(cfg, "moe_layer_interval", default=1) or 1
        return sum(1 for i in range(num_layers) if start <= i <= end and (i + 1) % interval == 0)
    enum = cfg.get("moe_layers_enum")
    if isinstance(enum, str) and enum.strip():  # Step-3.5's remote-code config: "3,4,...,44" (step3p5.py)
        enum = enum.split(",")
    if isinstance(enum, (list, tuple)) and enum:  # (Step3p5Config's default is a tuple)
        layers = {_number(str(i).strip(), "moe_layers_enum") for i in enum}
        return sum(1 for n in layers if 0 <= n < num_layers)
    interleave = _field(cfg, "interleave_moe_layer_step")  # Llama-4: MoE when (i + 1) % step == 0
    if interleave:
        return sum(1 for i in range(num_layers) if (i + 1) % interleave == 0)
    step, dense_only = _field(cfg, "decoder_sparse_step"), cfg.get("mlp_only_layers")  # Qwen2/3-MoE
    if (step and step > 1) or dense_only:
        skip = {_number(i, "mlp_only_layers") for i in dense_only or []}
        return sum(1 for i in range(num_layers) if i not in skip and (i + 1) % (step or 1) == 0)
    if layout is not None and layout.source == "hybrid_override_pattern":
        return str(cfg.get("hybrid_override_pattern"))[:num_layers].count("E")
    freq = cfg.get("moe_layer_freq")
    if isinstance(freq, list):  # MiMo-V2-Flash: a flag per layer (MiMoV2FlashDecoderLayer.is_moe_layer, mimo_v2.py)
        if len(freq) < num_layers:
            raise ArchitectureError(f"config.json's moe_layer_freq has {len(freq)} entries for {num_layers} layers")
        return sum(1 for flag in freq[:num_layers]
                   if flag is True or (flag is not False and _number(flag, "moe_layer_freq")))
    step = _field(cfg, "moe_layer_freq")
    if step and step > 1:  # DeepSeek-MoE / V2: MoE from first_k_dense_replace on, every step-th layer (deepseek_v2.py)
        first = _field(cfg, "first_k_dense_replace", default=0) or 0
        return sum(1 for i in range(first, num_layers) if i % step == 0)
    return None


def _mamba_inner_size(cfg: dict[str, Any], hidden: int) -> int:
    linear = cfg.get("linear_attn_config")
    if isinstance(linear, dict) and linear.get("num_heads") and linear.get("head_dim"):  # Kimi-Linear's KDA
        return _number(linear["num_heads"], "linear_attn_config.num_heads") * _number(
            linear["head_dim"], "linear_attn_config.head_dim")
    if cfg.get("mamba_d_ssm"):
        return _number(cfg["mamba_d_ssm"], "mamba_d_ssm")
    value_heads, value_dim = _field(cfg, "linear_num_value_heads"), _field(cfg, "linear_value_head_dim")
    if value_heads and value_dim:
        return value_heads * value_dim
    return (_field(cfg, "mamba_expand", "expand", default=2) or 2) * hidden


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
    except (TypeError, ValueError, ZeroDivisionError) as exc:  # a field of the wrong type or value ("bits": "4bit")
        raise ArchitectureError(f"config.json has a value kvwatch cannot read: {type(exc).__name__}: {exc}") from None


def _arch_from_config(config: dict[str, Any], name: str, source: str | None) -> ModelArch:
    cfg = _text_config(config)
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
                cfg = {**cfg, key: sum(_real(s, key) for s in sizes) / len(sizes)}
            elif key.startswith("moe_"):
                # ERNIE-4.5-VL: [text, vision] experts (ernie45_vl_moe.py); the text model's are counted
                cfg = {**cfg, key: sizes[0]}
    model_type = str(cfg.get("model_type") or config.get("model_type") or "").lower()
    blocks = _nas_blocks(cfg)
    if blocks is not None and cfg.get("intermediate_size") is None:
        cfg = {**cfg, "intermediate_size": _nas_intermediate_size(blocks, _require(cfg, "hidden_size", "n_embd"))}
    num_layers = _require(cfg, "num_hidden_layers", "n_layer", "num_layers")
    if model_type in _ATTENTION_FREE_TYPES and not cfg.get("num_attention_heads"):
        raise ArchitectureError(f"{model_type} is an attention-free (pure Mamba) model: it holds a fixed state per "
                                "request and no KV cache per token, which kvwatch does not model")
    heads = _require(cfg, "num_attention_heads", "n_head")
    hidden = _require(cfg, "hidden_size", "n_embd", "d_model")
    kv_heads = _total_kv_heads(cfg, heads, model_type)
    kv_lora_rank = cfg.get("kv_lora_rank")
    is_mla = model_type in _MLA_TYPES
    # Zamba2's shared attention works on 2 x hidden: attention_head_dim = 2 * hidden / heads. MiniCPM3 has MLA's
    # projections but caches per-head K and V of qk_nope + qk_rope (vLLM's minicpm3.py: Attention(..., qk_head_dim)).
    decompressed = ((_field(cfg, "qk_nope_head_dim") or 0) + (_field(cfg, "qk_rope_head_dim") or 0)
                    if kv_lora_rank is not None and not is_mla and cfg.get("qk_nope_head_dim")
                    and cfg.get("qk_rope_head_dim") else None)
    head_dim = (_field(cfg, "head_dim", "attention_head_dim") or decompressed
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
    layout = _hybrid_layout(cfg, num_layers, model_type)
    architectures = tuple(str(a) for a in config.get("architectures") or [] if isinstance(a, str))
    layer_types = layout.types if layout is not None else _layer_types(cfg, num_layers, model_type, architectures)
    notes: list[str] = []
    if model_type == "longcat_flash":
        # Each decoder layer runs two MLA attentions, each with a cache of its own (FlashDecoderLayer in vLLM's
        # longcat_flash.py): 2 x num_hidden_layers KV layers
        layer_types = tuple(kind for kind in layer_types for _ in range(2))
        notes.append(f"LongCat-Flash: two MLA attentions per decoder layer, so {len(layer_types)} KV layers for "
                     f"{num_layers} decoder layers")
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
    is_hybrid = (layout.mamba_layers > 0) if layout is not None else model_type in _HYBRID_MAMBA_TYPES
    attention = sum(1 for t in layer_types if t not in _NO_KV)
    dims = mamba_dims_from_config(cfg, model_type, hidden) if is_hybrid else None
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
    kv_shared = _kv_shared_layers(cfg, num_layers, model_type)
    if kv_shared:
        notes.append(f"KV sharing (num_kv_shared_layers): the last {kv_shared} of {num_layers} layers reuse earlier "
                     "layers' KV cache and hold none of their own, so the KV is counted for the first "
                     f"{num_layers - kv_shared} (the weights for all)")
    if CHUNKED in layer_types:
        notes.append(f"chunked local attention in {layer_types.count(CHUNKED)} of {num_layers} layers "
                     f"(attention_chunk_size {cfg['attention_chunk_size']}): from vLLM 0.14 these layers form KV "
                     "groups of their own and hold at most chunk + the in-flight tokens per request; before, vLLM "
                     "disabled its hybrid KV cache manager for them "
                     "(VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaulted to 0) and they held every token "
                     "like full attention")
    num_experts = _field(cfg, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts",
                         default=0) or 0
    tie = cfg.get("tie_word_embeddings")
    if tie is None:
        tie = config.get("tie_word_embeddings")
    if tie is None:
        tie, tie_note = _default_tie(model_type)
        if tie_note:
            notes.append(tie_note)
    qc = quantization_config_of(config)
    # (a preset has no quantization config: its own scheme as is)
    quant_scheme, quant_source = scheme_from_config(qc) if qc else (config.get("checkpoint_quantization"), None)
    max_len, max_len_how = derived_max_model_len(cfg, model_type)
    before = derived_max_model_len(cfg, model_type, version=(0, 29))
    scaling = _rope(cfg)
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
        vocab_size=_field(cfg, "vocab_size") or _field(config, "vocab_size", default=32000) or 32000,
        # Llama-4: dense layers use intermediate_size_mlp, experts (and the shared expert) intermediate_size
        intermediate_size=_field(cfg, "intermediate_size_mlp", "intermediate_size", "ffn_hidden_size")
        or 4 * hidden,
        tie_word_embeddings=bool(tie),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16"),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        derived_max_model_len=max_len,
        max_len_source=max_len_how,
        derived_max_model_len_before_0_30=before if before[0] != max_len else None,
        longrope_default_len=int(original) if longrope and isinstance(original, int) and original > 0 else None,
        model_max_length=_field(cfg, "model_max_length"),
        layer_types=layer_types,
        # (MiMo-V2-Flash's sliding layers take sliding_window_size)
        sliding_window=(_field(cfg, "sliding_window_size", "sliding_window") if _swa_pattern(cfg, num_layers)
                        else _field(cfg, "sliding_window")) if SLIDING in layer_types else None,
        attention_chunk_size=_field(cfg, "attention_chunk_size") if CHUNKED in layer_types else None,
        kv_shared_layers=kv_shared,
        attention_dims=() if is_mla else _attention_dims(cfg, model_type, kv_heads, head_dim, layer_types),
        kv_lora_rank=_number(kv_lora_rank, "kv_lora_rank") if is_mla else None,
        qk_rope_head_dim=_number(cfg["qk_rope_head_dim"], "qk_rope_head_dim") if is_mla else None,
        index_head_dim=_field(cfg, "index_head_dim") if is_mla else None,
        num_experts=num_experts,
        experts_per_token=_experts_per_token(cfg),
        moe_intermediate_size=(_field(cfg, "moe_intermediate_size", "expert_ffn_hidden_size", "intermediate_size",
                                      default=0) or 0)
        if num_experts else 0,
        num_shared_experts=_field(cfg, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts",
                                  "num_shared_expert")
        or (1 if model_type.startswith("llama4") and num_experts else 0),
        first_k_dense_layers=_field(cfg, "first_k_dense_replace", default=0) or 0,
        moe_layers=_moe_layers(cfg, num_layers, num_experts, layout),
        dense_mlp_layers=(str(cfg.get("hybrid_override_pattern"))[:num_layers].count("-")
                          if layout is not None and layout.source == "hybrid_override_pattern" else None),
        mamba_layers=layout.mamba_layers if layout is not None else 0,
        mamba_inner_size=_mamba_inner_size(cfg, hidden) if is_hybrid and layout is not None else 0,
        has_mamba_state=is_hybrid,
        mamba_dims=dims,
        num_parameters=_field(config, "num_parameters"),
        checkpoint_quantization=quant_scheme,
        checkpoint_quantization_source=quant_source,
        checkpoint_kv_cache=checkpoint_kv_cache_dtype(qc) if qc else None,
        checkpoint_quant_method=(str(qc.get("quant_method") or "") or None) if qc else (
            "mxfp4" if config.get("checkpoint_quantization") == "mxfp4" else None),
        source=source,
        notes=tuple(notes),
        model_type=model_type,
        architectures=architectures,
        mamba_ssm_cache_dtype=(str(cfg.get("mamba_ssm_cache_dtype") or cfg.get("mamba_ssm_dtype") or "") or None)
        if is_hybrid else None,
    )


def _experts_per_token(cfg: dict[str, Any]) -> int | None:
    for key in ("num_experts_per_tok", "num_experts_per_token", "experts_per_token", "moe_topk", "moe_k",
                "moe_top_k"):
        if cfg.get(key):
            value = cfg[key]
            return _number(value[0] if isinstance(value, list) else value, key)
    return None


def quantization_config_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """A checkpoint's quantization config as vLLM reads it (``_normalize_quantization_config``): the
    ``quantization_config`` (or compressed-tensors' older ``compression_config``), a ModelOpt one without a
    ``quant_method`` (hf_quant_config.json's ``producer``/``quantization`` shape) given its method."""
    qc = config.get("quantization_config")
    if qc is None:
        qc = config.get("compression_config")
    if not isinstance(qc, dict) or not qc:
        return None
    inner = qc.get("quantization")
    producer = qc.get("producer")
    if not qc.get("quant_method") and isinstance(inner, dict) and (
            (isinstance(producer, dict) and producer.get("name") == "modelopt") or "modelopt_quant_config" in inner):
        algo = str(inner.get("quant_algo") or "").upper()
        method = "modelopt_fp4" if algo == "NVFP4" else "modelopt"
        qc = {**qc, "quant_method": method}
    return qc
