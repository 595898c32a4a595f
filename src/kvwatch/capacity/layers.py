"""Layer layouts: which decoder layers hold a KV cache, of which kind and size, and which run experts.

Pure readers of an already-flattened config (:func:`kvwatch.capacity.config_fields.text_config`), one per
field a model family uses to say so; :mod:`kvwatch.capacity.architecture` puts them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvwatch.capacity.config_fields import ArchitectureError, first_number, number, positive, real
from kvwatch.capacity.mamba import bailing_v3

FULL = "full_attention"
SLIDING = "sliding_attention"
# Llama-4's chunked local attention (layers with RoPE attend within attention_chunk_size-token chunks). Up to 0.13
# vLLM disabled its hybrid KV cache manager for it by default (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE
# defaulted to 0), so these layers held every token like full attention; from 0.14 they form groups of their own
# (kv.CHUNKED_HYBRID_SINCE).
CHUNKED = "chunked_local_attention"
MAMBA = "mamba"  # a Mamba / linear-attention mixer: state pages, no KV cache
MLP_ONLY = "mlp_only"  # a layer with an MLP and no mixer (Nemotron-H's "-" and "E"): neither KV nor state
NO_KV = frozenset({MAMBA, MLP_ONLY})

# model_type values of hybrid attention + Mamba/linear-attention models (vLLM keeps SSM state pages).
HYBRID_MAMBA_TYPES = frozenset({
    "jamba", "bamba", "nemotron_h", "falcon_h1", "zamba2", "granitemoehybrid", "qwen3_next", "minimax_m1",
    "minimax_text_01", "plamo2", "lfm2", "bailing_hybrid",
})
_MAMBA_LAYER_WORDS = ("mamba", "linear", "ssm", "conv", "deltanet")


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


def word_type(word: str) -> str:
    w = word.lower()
    if w in ("moe", "mlp"):  # Nemotron-H's layers_block_type: a block with an MoE or an MLP and no mixer
        return MLP_ONLY
    if any(m in w for m in _MAMBA_LAYER_WORDS):
        return MAMBA
    if "sliding" in w or "local" in w:
        return SLIDING
    return FULL  # "attention", "full_attention", Zamba2's "hybrid" (a shared attention block + Mamba)


@dataclass(frozen=True)
class Layout:
    types: tuple[str, ...]
    source: str | None = None  # the config field the hybrid layout came from
    mamba_layers: int = 0  # layers with a Mamba / linear mixer (Falcon-H1 and Zamba2: every layer)
    # Nemotron-H's blocks with an MoE and with a dense MLP (each block has one mixer or one MLP); None: the family
    # does not say per layer
    moe_layers: int | None = None
    dense_mlp_layers: int | None = None


def hybrid_layout(cfg: dict[str, Any], num_layers: int, model_type: str) -> Layout | None:
    """Attention vs Mamba / linear-attention layers, from whichever field the model family uses."""
    raw = cfg.get("layer_types")
    if isinstance(raw, list) and raw and any(word_type(str(t)) == MAMBA for t in raw):
        types = tuple(word_type(str(t)) for t in raw[:num_layers])
        return Layout(types, "layer_types", types.count(MAMBA))
    blocks = cfg.get("layers_block_type")  # Jamba-style ("attention"/"mamba"), Zamba2 ("hybrid"/"mamba")
    if isinstance(blocks, list) and blocks:
        words = [str(t).lower() for t in blocks[:num_layers]]
        types = tuple(word_type(w) for w in words)
        mixers = len(types) if model_type == "zamba2" else types.count(MAMBA)
        if "moe" in words or "mlp" in words:  # Nemotron 3: the list transformers builds hybrid_override_pattern from
            return Layout(types, "layers_block_type", mixers, words.count("moe"), words.count("mlp"))
        return Layout(types, "layers_block_type", mixers)
    linear = cfg.get("linear_attn_config")  # Kimi-Linear: KDA where (index + 1) is in kda_layers, else MLA
    if isinstance(linear, dict) and isinstance(linear.get("kda_layers"), list) and linear["kda_layers"]:
        # vllm/transformers_utils/configs/kimi_linear.py is_kda_layer: 1-based layer numbers
        kda = {number(n, "linear_attn_config.kda_layers") for n in linear["kda_layers"]}
        types = tuple(MAMBA if i + 1 in kda else FULL for i in range(num_layers))
        return Layout(types, "linear_attn_config.kda_layers", types.count(MAMBA))
    kinds = cfg.get("attn_type_list")  # MiniMax: 1 = softmax attention, 0 = lightning (linear) attention
    if isinstance(kinds, list) and kinds:
        types = tuple(FULL if number(k, "attn_type_list") == 1 else MAMBA for k in kinds[:num_layers])
        return Layout(types, "attn_type_list", types.count(MAMBA))
    indices = cfg.get("attn_layer_indices")  # Bamba: the attention layers; the rest are Mamba2
    if isinstance(indices, list) and indices:
        wanted = {number(i, "attn_layer_indices") for i in indices}
        types = tuple(FULL if i in wanted else MAMBA for i in range(num_layers))
        return Layout(types, "attn_layer_indices", types.count(MAMBA))
    period = first_number(cfg, "attn_layer_period")  # Jamba: attention every attn_layer_period layers
    if period and model_type in HYBRID_MAMBA_TYPES:
        offset = first_number(cfg, "attn_layer_offset", default=0)
        types = tuple(FULL if i % period == offset else MAMBA for i in range(num_layers))
        return Layout(types, "attn_layer_period", types.count(MAMBA))
    interval = first_number(cfg, "full_attention_interval")  # Qwen3-Next: every interval-th layer is full attention
    if interval and model_type in HYBRID_MAMBA_TYPES:
        types = tuple(FULL if (i + 1) % interval == 0 else MAMBA for i in range(num_layers))
        return Layout(types, "full_attention_interval", types.count(MAMBA))
    pattern = cfg.get("hybrid_override_pattern")  # Nemotron-H: M = Mamba, * = attention, - = MLP, E = MoE
    if isinstance(pattern, str) and pattern:
        mapping = {"M": MAMBA, "*": FULL, "-": MLP_ONLY, "E": MLP_ONLY}
        types = tuple(mapping[ch] for ch in pattern[:num_layers] if ch in mapping)
        return Layout(types, "hybrid_override_pattern", types.count(MAMBA), pattern[:num_layers].count("E"),
                      pattern[:num_layers].count("-"))
    step = first_number(cfg, "mamba_step")  # PLaMo-2 (vLLM's plamo2.py is_mamba, up to 0.26)
    if step and step > 1 and model_type == "plamo2" and cfg.get("mamba_enabled", True) is not False:
        if num_layers <= step // 2:  # attention in the last layer only
            types = tuple(FULL if i == num_layers - 1 else MAMBA for i in range(num_layers))
        else:
            types = tuple(FULL if i % step == step // 2 else MAMBA for i in range(num_layers))
        return Layout(types, "mamba_step", types.count(MAMBA))
    group = first_number(cfg, "layer_group_size")  # Ling/Ring 2.5 and 3.0: one MLA layer closes each group
    if group and model_type == "bailing_hybrid":
        if bailing_v3(cfg):  # bailing_moe_v3.py _is_kda_layer: the layers after the last whole group are MLA too
            whole = num_layers // group * group
            types = tuple(FULL if (i + 1) % group == 0 or i >= whole else MAMBA for i in range(num_layers))
        else:  # bailing_moe_linear.py is_linear_layer (BailingMoeV2_5ForCausalLM): lightning attention
            types = tuple(FULL if (i + 1) % group == 0 else MAMBA for i in range(num_layers))
        return Layout(types, "layer_group_size", types.count(MAMBA))
    if model_type == "falcon_h1":  # attention and a Mamba2 mixer side by side in every layer
        return Layout((FULL,) * num_layers, "model_type falcon_h1 (parallel hybrid)", num_layers)
    if isinstance(raw, list) and raw and model_type in HYBRID_MAMBA_TYPES:
        # A hybrid family whose layer_types name no Mamba layer and no other field says otherwise (Granite-4.0-micro:
        # all "attention") is plain attention: vLLM's ModelConfig.is_hybrid says so too (vllm/config/model.py).
        types = tuple(word_type(str(t)) for t in raw[:num_layers])
        return Layout(types, "layer_types", 0)
    return None


def nas_blocks(cfg: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Nemotron-NAS (DeciLM: Llama-3.3-Nemotron-Super-49B, …) ``block_configs``, one per layer, each with an
    ``attention`` and an ``ffn`` dict; None for any other config."""
    blocks = cfg.get("block_configs")
    if not isinstance(blocks, list) or not blocks or not all(
            isinstance(b, dict) and isinstance(b.get("attention"), dict) and isinstance(b.get("ffn", {}), dict)
            for b in blocks):
        return None
    return blocks


def nas_intermediate_size(blocks: list[dict[str, Any]], hidden: int) -> float:
    """The mean MLP width over Nemotron-NAS's blocks: ``int(2·ffn_mult·hidden/3)`` rounded up to a multiple of 256
    (nemotron_nas.py ``_ffn_mult_to_intermediate_size``), 0 where the block has no MLP (``ffn.no_op``)."""
    sizes = []
    for b in blocks:
        ffn = b.get("ffn", {})
        mult = ffn.get("ffn_mult")
        if ffn.get("no_op") or mult is None:
            sizes.append(0)
            continue
        width = int(2 * real(mult, "block_configs ffn_mult") * hidden / 3)
        sizes.append(width + (-width) % 256)
    return sum(sizes) / len(sizes)


def layer_types_from_config(cfg: dict[str, Any], num_layers: int, model_type: str,
                 architectures: tuple[str, ...] = ()) -> tuple[str, ...]:
    blocks = nas_blocks(cfg)
    if blocks is not None:  # vLLM builds no attention layer for a block whose attention is a no-op
        if len(blocks) < num_layers:
            raise ArchitectureError(f"config.json has {len(blocks)} block_configs for num_hidden_layers {num_layers}: "
                                    "it needs one per layer")
        return tuple(MLP_ONLY if b["attention"].get("no_op") else FULL for b in blocks[:num_layers])
    pattern = swa_pattern(cfg, num_layers)
    if pattern is not None:
        # MiMo-V2's configs also carry attention_chunk_size 128, which vLLM deletes (its MimoV2 arch config
        # convertor, _strip_mimo_v2_attention_chunk_size): the model does not use chunked attention
        return pattern
    if cfg.get("attention_chunk_size"):
        # Llama-4 (vLLM's llama4.py): a layer with RoPE uses chunked local attention, a NoPE layer is global.
        # no_rope_layers[i] == 0 marks NoPE; when empty, transformers derives it from no_rope_layer_interval (4).
        nope = cfg.get("no_rope_layers")
        interval = first_number(cfg, "no_rope_layer_interval", default=4) or 4
        uses_rope = ([bool(number(v, "no_rope_layers")) for v in nope[:num_layers]]
                     if isinstance(nope, list) and nope else [(i + 1) % interval != 0 for i in range(num_layers)])
        return tuple(CHUNKED if rope else FULL for rope in uses_rope)
    raw = cfg.get("layer_types")
    if isinstance(raw, list) and raw and "Rnj1ForCausalLM" in architectures:
        # Rnj-1 (a gemma3_text config; vLLM's rnj1.py): a chunked_attention layer attends over sliding_window tokens,
        # any other layer globally (kvwatch read chunked_attention as global: 26 % too few requests at 32k)
        return tuple(SLIDING if str(t) == "chunked_attention" else FULL for t in raw[:num_layers])
    if isinstance(raw, list) and raw:
        return tuple(word_type(str(t)) for t in raw[:num_layers])
    window = first_number(cfg, "sliding_window")
    letters = cfg.get("sliding_window_pattern")
    if isinstance(letters, str) and letters and set(letters.upper()) <= {"L", "G"}:
        # EXAONE 4: "LLLG" repeats from layer 0 (L local, G global) and the last layer is always global, as
        # TensorRT-LLM's modeling_exaone4.py check_is_sliding reads it; no window: every layer global
        return tuple(SLIDING if window and letters[i % len(letters)].upper() == "L" and i < num_layers - 1
                     else FULL for i in range(num_layers))
    every = first_number(cfg, "global_attn_every_n_layers") if model_type == "afmoe" else None
    if window and every:  # AFMoE (Trinity): transformers' AfmoeConfig derives layer_types so when the file omits them
        return tuple(FULL if (i + 1) % every == 0 else SLIDING for i in range(num_layers))
    swp = first_number(cfg, "sliding_window_pattern")
    if window and swp:  # Gemma-3: every swp-th layer is global, the others local.
        return tuple(FULL if (i + 1) % swp == 0 else SLIDING for i in range(num_layers))
    if window and model_type == "gemma2":  # Gemma-2 alternates local and global, local first.
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers))
    if window and cfg.get("use_sliding_window") and model_type.startswith(("qwen2", "qwen3")):
        given = cfg.get("max_window_layers")
        max_window_layers = num_layers if given is None else number(given, "max_window_layers")
        return tuple(FULL if i < max_window_layers else SLIDING for i in range(num_layers))
    if window and cfg.get("use_sliding_window") is not False and not model_type.startswith(("qwen2", "qwen3")) \
            and window < (first_number(cfg, "max_position_embeddings") or 0):
        # A window and no layer_types: vLLM sets CacheConfig.sliding_window (arg_utils: "only ... if the model is
        # all sliding window"), and each attention layer without a window of its own takes it (Mistral, Mixtral,
        # Phi-3-mini-4k's 2047). Qwen2/3's window is off unless use_sliding_window (above).
        return (SLIDING,) * num_layers
    return (FULL,) * num_layers


def swa_pattern(cfg: dict[str, Any], num_layers: int) -> tuple[str, ...] | None:
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
    return tuple(SLIDING if number(p, "hybrid_layer_pattern") == 1 else FULL for p in pattern[:num_layers])


def attention_dims_by_type(cfg: dict[str, Any], model_type: str, kv_heads: int, head_dim: int,
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
        global_heads = positive(cfg, "num_global_key_value_heads") if k_eq_v else None
        global_head = positive(cfg, "global_head_dim") or head_dim
        dims[FULL] = AttentionDims(global_heads or kv_heads, global_head, global_head)
    elif cfg.get("hybrid_layer_pattern") is not None:
        v_full = positive(cfg, "v_head_dim") or head_dim
        dims[FULL] = AttentionDims(kv_heads, head_dim, v_full)
        swa_head = positive(cfg, "swa_head_dim") or head_dim
        dims[SLIDING] = AttentionDims(positive(cfg, "swa_num_key_value_heads") or kv_heads, swa_head,
                                      positive(cfg, "swa_v_head_dim") or swa_head)
    default = AttentionDims(kv_heads, head_dim, head_dim)
    return tuple((kind, d) for kind, d in sorted(dims.items()) if d != default)


def kv_shared_layer_count(cfg: dict[str, Any], num_layers: int, model_type: str) -> int:
    """Layers at the end that reuse earlier layers' KV (Gemma 3n and Gemma 4 read num_kv_shared_layers); 0 when
    the model has none, or when no earlier layer is left to share with."""
    if not model_type.startswith(("gemma3n", "gemma4")):
        return 0
    shared = first_number(cfg, "num_kv_shared_layers", default=0) or 0
    return shared if 0 < shared < num_layers else 0


def moe_layer_count(cfg: dict[str, Any], num_layers: int, num_experts: int, layout: Layout | None) -> int | None:
    """Layers with an MoE block when the family says not all have one; None = the usual rule."""
    if not num_experts:
        return None
    period = first_number(cfg, "expert_layer_period")  # Jamba: MoE every expert_layer_period layers
    if period:
        offset = first_number(cfg, "expert_layer_offset", default=0)
        return sum(1 for i in range(num_layers) if i % period == offset)
    ernie = str(cfg.get("model_type") or "").startswith("ernie4_5")
    if ernie or isinstance(cfg.get("moe_layer_start_index"), int) or isinstance(cfg.get("moe_layer_interval"), int):
        # ERNIE-4.5: MoE from start to end (inclusive) when (i + 1) % interval == 0 (ernie45_moe.py), none with
        # use_moe false; transformers' Ernie4_5_MoeConfig starts at layer 1 and reads an end of -1 as the last
        if cfg.get("use_moe") is False:
            return 0
        start, end = cfg.get("moe_layer_start_index"), cfg.get("moe_layer_end_index")
        start = (1 if ernie else 0) if start is None else number(start, "moe_layer_start_index")
        end = num_layers - 1 if end is None or number(end, "moe_layer_end_index") < 0 else number(
            end, "moe_layer_end_index")
        interval = first_number(cfg, "moe_layer_interval", default=1) or 1
        return sum(1 for i in range(num_layers) if start <= i <= end and (i + 1) % interval == 0)
    enum = cfg.get("moe_layers_enum")
    if isinstance(enum, str) and enum.strip():  # Step-3.5's remote-code config: "3,4,...,44" (step3p5.py)
        enum = enum.split(",")
    if isinstance(enum, (list, tuple)) and enum:  # (Step3p5Config's default is a tuple)
        layers = {number(str(i).strip(), "moe_layers_enum") for i in enum}
        return sum(1 for n in layers if 0 <= n < num_layers)
    interleave = first_number(cfg, "interleave_moe_layer_step")  # Llama-4: MoE when (i + 1) % step == 0
    if interleave:
        return sum(1 for i in range(num_layers) if (i + 1) % interleave == 0)
    step, dense_only = first_number(cfg, "decoder_sparse_step"), cfg.get("mlp_only_layers")  # Qwen2/3-MoE
    if (step and step > 1) or dense_only:
        skip = {number(i, "mlp_only_layers") for i in dense_only or []}
        return sum(1 for i in range(num_layers) if i not in skip and (i + 1) % (step or 1) == 0)
    if layout is not None and layout.moe_layers is not None:
        return layout.moe_layers
    freq = cfg.get("moe_layer_freq")
    if isinstance(freq, list):  # MiMo-V2-Flash: a flag per layer (MiMoV2FlashDecoderLayer.is_moe_layer, mimo_v2.py)
        if len(freq) < num_layers:
            raise ArchitectureError(f"config.json's moe_layer_freq has {len(freq)} entries for {num_layers} layers")
        return sum(1 for flag in freq[:num_layers]
                   if flag is True or (flag is not False and number(flag, "moe_layer_freq")))
    step = first_number(cfg, "moe_layer_freq")
    if step and step > 1:  # DeepSeek-MoE / V2: MoE from first_k_dense_replace on, every step-th layer (deepseek_v2.py)
        first = first_number(cfg, "first_k_dense_replace", default=0) or 0
        return sum(1 for i in range(first, num_layers) if i % step == 0)
    return None


