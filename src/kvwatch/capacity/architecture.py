"""Model architecture: the KV-relevant fields of a Hugging Face ``config.json``.

Pure: :func:`arch_from_config` takes an already-parsed dict. It handles multimodal configs (the
language model lives in ``text_config``), a missing ``head_dim`` (= hidden / heads), a missing
``num_key_value_heads`` (= heads, i.e. MHA), per-layer ``layer_types`` or a Gemma-3 style
``sliding_window_pattern``, MLA (``kv_lora_rank`` + ``qk_rope_head_dim``) and hybrid Mamba models,
which are detected but whose state pages are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvwatch.capacity.quantization import scheme_from_config

FULL = "full_attention"
SLIDING = "sliding_attention"
MAMBA = "mamba"

# model_type values of hybrid attention + Mamba/linear-attention models (vLLM keeps SSM state pages).
_HYBRID_MAMBA_TYPES = frozenset({
    "jamba", "bamba", "nemotron_h", "falcon_h1", "zamba2", "granitemoehybrid", "qwen3_next", "minimax_m1",
    "plamo2", "lfm2",
})
_MAMBA_LAYER_WORDS = ("mamba", "linear", "ssm", "conv", "deltanet")
_MLA_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2", "deepseek_v32"})


class ArchitectureError(ValueError):
    """The config lacks a field the capacity model needs (message names it)."""


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
    # One entry per decoder layer: FULL, SLIDING or MAMBA.
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    # MLA (DeepSeek-V2/V3, Kimi): one latent vector per token and layer, shared by all heads.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    # Mixture of experts.
    num_experts: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_k_dense_layers: int = 0
    # Total parameters when the preset knows it better than the config implies (MLA/MoE details).
    num_parameters: int | None = None
    # Quantization scheme the checkpoint ships with (e.g. gpt-oss: mxfp4), and where it was read (a config.json
    # field, or the name that implies it); None source = the preset's own data.
    checkpoint_quantization: str | None = None
    checkpoint_quantization_source: str | None = None
    from_config_file: bool = False  # built from a user's config.json (--model-config), not a preset
    source: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_hybrid_mamba(self) -> bool:
        return MAMBA in self.layer_types

    @property
    def attention_layer_types(self) -> tuple[str, ...]:
        """Layer types of layers that hold a KV cache (Mamba layers excluded)."""
        types = self.layer_types or (FULL,) * self.num_layers
        return tuple(t for t in types if t != MAMBA)

    @property
    def has_sliding_window(self) -> bool:
        return SLIDING in self.layer_types


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a (possibly multimodal) config; top-level keys fill gaps."""
    for key in ("text_config", "llm_config", "language_config"):
        nested = config.get(key)
        if isinstance(nested, dict) and ("num_hidden_layers" in nested or "hidden_size" in nested):
            merged = {k: v for k, v in config.items() if not isinstance(v, dict)}
            merged.update(nested)
            return merged
    return config


def _require(cfg: dict[str, Any], *keys: str) -> int:
    for key in keys:
        if cfg.get(key) is not None:
            return int(cfg[key])
    raise ArchitectureError(f"config.json has no {' / '.join(keys)}")


def _layer_types(cfg: dict[str, Any], num_layers: int, model_type: str) -> tuple[str, ...]:
    raw = cfg.get("layer_types")
    if isinstance(raw, list) and raw:
        out = []
        for item in raw:
            word = str(item).lower()
            if any(w in word for w in _MAMBA_LAYER_WORDS):
                out.append(MAMBA)
            elif "sliding" in word or "local" in word:
                out.append(SLIDING)
            else:
                out.append(FULL)
        return tuple(out[:num_layers])
    # Jamba-style hybrids: attention every `attn_layer_period` layers, Mamba elsewhere.
    period = cfg.get("attn_layer_period")
    if period and model_type in _HYBRID_MAMBA_TYPES:
        offset = int(cfg.get("attn_layer_offset", 0))
        return tuple(FULL if i % int(period) == offset else MAMBA for i in range(num_layers))
    pattern = cfg.get("hybrid_override_pattern")  # Nemotron-H: "M-M*-..." (* = attention)
    if isinstance(pattern, str) and pattern:
        return tuple(FULL if ch == "*" else MAMBA for ch in pattern[:num_layers] if ch in "*M-E")
    window = cfg.get("sliding_window")
    swp = cfg.get("sliding_window_pattern")
    if window and swp:  # Gemma-3: every swp-th layer is global, the others local.
        return tuple(FULL if (i + 1) % int(swp) == 0 else SLIDING for i in range(num_layers))
    if window and model_type == "gemma2":  # Gemma-2 alternates local and global, local first.
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers))
    if window and cfg.get("use_sliding_window") and model_type.startswith(("qwen2", "qwen3")):
        max_window_layers = int(cfg.get("max_window_layers", num_layers))
        return tuple(FULL if i < max_window_layers else SLIDING for i in range(num_layers))
    if window and model_type in {"mistral", "mixtral"} and int(window) < int(cfg.get("max_position_embeddings") or 0):
        return (SLIDING,) * num_layers
    return (FULL,) * num_layers


def arch_from_config(config: dict[str, Any], name: str = "custom", source: str | None = None) -> ModelArch:
    """Build a :class:`ModelArch` from a parsed Hugging Face ``config.json``."""
    if not isinstance(config, dict):
        raise ArchitectureError("config.json must be a JSON object")
    cfg = _text_config(config)
    model_type = str(cfg.get("model_type") or config.get("model_type") or "").lower()
    num_layers = _require(cfg, "num_hidden_layers", "n_layer", "num_layers")
    heads = _require(cfg, "num_attention_heads", "n_head")
    hidden = _require(cfg, "hidden_size", "n_embd", "d_model")
    kv_heads = int(cfg.get("num_key_value_heads") or cfg.get("multi_query_group_num") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layer_types = _layer_types(cfg, num_layers, model_type)
    notes: list[str] = []
    kv_lora_rank = cfg.get("kv_lora_rank")
    is_mla = kv_lora_rank is not None or model_type in _MLA_TYPES
    if is_mla and (kv_lora_rank is None or cfg.get("qk_rope_head_dim") is None):
        raise ArchitectureError("MLA config.json needs kv_lora_rank and qk_rope_head_dim")
    is_hybrid = MAMBA in layer_types or model_type in _HYBRID_MAMBA_TYPES
    if is_hybrid and MAMBA not in layer_types:
        notes.append(f"{model_type} is a hybrid Mamba model but its layer layout was not recognised")
    if is_hybrid:
        notes.append(
            "hybrid Mamba/linear-attention model: only attention layers are counted; vLLM's Mamba state pages "
            "and the page-size unification that pads attention pages are NOT modelled, so vLLM reports fewer tokens"
        )
    num_experts = int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts") or 0)
    tie = cfg.get("tie_word_embeddings")
    quant_scheme, quant_source = _checkpoint_quantization(config)
    return ModelArch(
        name=name,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=int(cfg.get("vocab_size") or config.get("vocab_size") or 32000),
        intermediate_size=int(cfg.get("intermediate_size") or cfg.get("ffn_hidden_size") or 4 * hidden),
        tie_word_embeddings=bool(tie if tie is not None else config.get("tie_word_embeddings", False)),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or "bfloat16"),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        layer_types=layer_types,
        sliding_window=int(cfg["sliding_window"]) if cfg.get("sliding_window") and SLIDING in layer_types else None,
        kv_lora_rank=int(kv_lora_rank) if kv_lora_rank is not None else None,
        qk_rope_head_dim=int(cfg["qk_rope_head_dim"]) if kv_lora_rank is not None else None,
        num_experts=num_experts,
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") or 0)
                                  if num_experts else 0),
        num_shared_experts=int(cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0),
        first_k_dense_layers=int(cfg.get("first_k_dense_replace") or 0),
        num_parameters=int(config["num_parameters"]) if config.get("num_parameters") else None,
        checkpoint_quantization=quant_scheme,
        checkpoint_quantization_source=quant_source,
        source=source,
        notes=tuple(notes),
    )


def _checkpoint_quantization(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(scheme, where it was read) from ``quantization_config``; a preset's ``checkpoint_quantization`` as is."""
    qc = config.get("quantization_config")
    if isinstance(qc, dict) and qc:
        return scheme_from_config(qc)
    return config.get("checkpoint_quantization"), None
