"""Reading config.json: the language model's part of a (multimodal) config, and its fields as checked numbers.

Every reader names the field in the :class:`ArchitectureError` it raises, so a broken config.json is refused
with a message, never a TypeError from deep inside the capacity model.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any


class ArchitectureError(ValueError):
    """The config lacks a field the capacity model needs (message names it)."""


# Defaults of transformers' config classes for fields their config.json files leave out (the class fills them in,
# vLLM reads the result). Gemma3TextConfig (transformers models/gemma3/configuration_gemma3.py): Gemma-3 4B's
# text_config names only its sizes, and no Gemma-3 file names the sliding-window pattern.
CONFIG_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "sliding_window": 4096, "sliding_window_pattern": 6, "tie_word_embeddings": True},
    # The hybrids' layouts where the file leaves them to the class (vLLM reads the transformers config, which fills
    # them): without them every layer was sized as attention, 4-8x the KV per token (Qwen3NextConfig, JambaConfig).
    "qwen3_next": {"full_attention_interval": 4},
    "jamba": {"attn_layer_period": 8, "attn_layer_offset": 4},
    # LlamaConfig (transformers' src/transformers/models/llama/configuration_llama.py; its length, 2048, is in
    # CLASS_MAX_POSITION_EMBEDDINGS below with every class's): Llava-1.5's text_config names only its vocabulary and
    # length, and vLLM builds a LlamaConfig from it (num_key_value_heads unset: the attention heads, head_dim
    # hidden / heads), so kvwatch refused a model vLLM serves.
    "llama": {"vocab_size": 32_000, "hidden_size": 4096, "intermediate_size": 11_008, "num_hidden_layers": 32,
              "num_attention_heads": 32},
}

# max_position_embeddings of transformers' config classes (transformers' src/transformers/models/<type>/
# configuration_<type>.py), by model_type (their other defaults, where kvwatch needs them: CONFIG_CLASS_DEFAULTS):
# vLLM's _get_and_verify_max_len reads the length off the config object, so a config.json that leaves it out gets
# its class's default. vLLM's own fallback of 2048 is for a class with no length field at all; for a model_type
# not listed here kvwatch does not know which applies and leaves the model's length unknown (max_len.py).
CLASS_MAX_POSITION_EMBEDDINGS: dict[str, int] = {
    "llama": 2048, "mistral": 131_072, "mixtral": 131_072, "mistral3": 131_072, "qwen2": 32_768, "qwen2_moe": 32_768,
    "qwen3": 32_768, "qwen3_moe": 32_768, "qwen3_next": 32_768, "gemma": 8192, "gemma2": 8192,
    "gemma3_text": 131_072, "phi": 2048, "phi3": 4096, "phimoe": 131_072, "deepseek_v2": 2048, "deepseek_v3": 4096,
    "falcon": 2048, "gpt_neox": 2048, "starcoder2": 4096, "olmo": 2048, "olmo2": 2048, "cohere": 8192,
    "granite": 2048, "granitemoe": 2048, "gpt_bigcode": 1024, "gpt2": 1024, "mpt": 2048, "dbrx": 2048,
    "glm": 131_072, "glm4": 131_072, "exaone4": 2048, "stablelm": 4096, "persimmon": 16_384, "jetmoe": 4096,
    "nemotron": 4096, "gpt_oss": 131_072, "llama4_text": 131_072, "smollm3": 32_768, "ernie4_5": 131_072,
    "hunyuan_v1_dense": 2048,
}


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a (possibly multimodal) config; top-level keys fill gaps, and the defaults of
    its transformers config class fill what the file leaves out (:data:`CONFIG_CLASS_DEFAULTS`)."""
    cfg = language_part(config)
    return {**cfg, **class_defaults_used(cfg)}


def class_defaults_used(cfg: dict[str, Any]) -> dict[str, Any]:
    """The defaults of ``cfg``'s config class (:data:`CONFIG_CLASS_DEFAULTS`) for the fields it leaves out."""
    defaults = CONFIG_CLASS_DEFAULTS.get(str(cfg.get("model_type") or ""), {})
    return {key: value for key, value in defaults.items() if cfg.get(key) is None}


def language_part(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a (possibly multimodal) config, as its file gives it (no class defaults)."""
    thinker = config.get("thinker_config")
    if isinstance(thinker, dict):  # Qwen2.5/3-Omni: the thinker's text_config is the LLM (vLLM's get_hf_text_config)
        config = {**{k: v for k, v in config.items() if not isinstance(v, dict)}, **thinker}
    for key in ("text_config", "llm_config", "language_config"):
        nested = config.get(key)
        if isinstance(nested, dict) and ("num_hidden_layers" in nested or "hidden_size" in nested
                                         or nested.get("model_type") in CONFIG_CLASS_DEFAULTS):
            cfg = {k: v for k, v in config.items() if not isinstance(v, dict)}
            cfg.update({k: v for k, v in nested.items() if v is not None})  # (null: not given)
            return cfg
    return config


# Past these no released model goes; a config beyond them is broken (num_hidden_layers 1e9 never returned).
_MAX_COUNT = {"num_hidden_layers": 10_000, "n_layer": 10_000, "num_layers": 10_000}
_MAX_ANY = 10_000_000


def require(cfg: dict[str, Any], *keys: str) -> int:
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


def positive(cfg: dict[str, Any], key: str) -> int | None:
    """``cfg[key]`` as a positive whole count (a head count or size), None when unset (null); anything else (0,
    negative, fractional, not a number) is an ArchitectureError naming the field, not a silent fallback."""
    if cfg.get(key) is None:
        return None
    value = _count(cfg, key)
    if value is None:
        raise ArchitectureError(f"config.json has {key} = {cfg[key]!r}: it must be a whole number from 1 to "
                                f"{_MAX_COUNT.get(key, _MAX_ANY):,}")
    return value


def real(value: Any, field: str) -> float:
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


def number(value: Any, field: str) -> int:
    """:func:`real`, as the whole number ``int()`` makes of it."""
    return int(real(value, field))


def first_number(cfg: dict[str, Any], *keys: str, default: int | None = None) -> int | None:
    """The first of ``keys`` that ``cfg`` sets (null, 0 and empty count as unset, like the ``or`` chains this
    replaces) as a number (:func:`number`); ``default`` when none is. Every field read so is a size, a count or an
    offset: a negative one is an ArchitectureError naming it (a sliding_window of -1 made every layer slide)."""
    for key in keys:
        if cfg.get(key):
            value = number(cfg[key], key)
            if value < 0:
                raise ArchitectureError(f"config.json has {key} = {cfg[key]!r}: it cannot be negative")
            return value
    return default


