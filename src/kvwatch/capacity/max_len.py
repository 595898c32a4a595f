"""The longest --max-model-len vLLM derives from a config.json (its RoPE scaling included)."""

from __future__ import annotations

from typing import Any

from kvwatch.capacity.config_fields import CLASS_MAX_POSITION_EMBEDDINGS, ArchitectureError, number, real

# vLLM's ModelConfig._get_and_verify_max_len (vllm/config): the smallest of these config fields is the model's
# length, "model_max_length" wins outright, and rope_scaling multiplies it unless the type already extends
# max_position_embeddings ("su", "longrope", "llama3") or the model is Gemma-3 (already scaled).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
_ROPE_TYPES_NOT_SCALED = frozenset({"su", "longrope", "llama3"})

YARN_UNSCALED_SINCE = (0, 30)  # YaRN's max_position_embeddings is the scaled length already (before: original × factor)
LONGROPE_DEFAULT_SINCE = (0, 12)  # LongRoPE's default --max-model-len is original_max_position_embeddings (0.11.1 on:
# its cache_config_info reads as 0.12, vllm_version_from_cache_config)
_YARN_TYPES = frozenset({"yarn", "deepseek_yarn", "deepseek_llama_scaling"})


MAX_LENGTH = 2**40
"""A model length kvwatch reads from a config (a trillion tokens, a thousand times today's longest): above it the
config is broken, and the KV sums of one such request overflow a float."""

def rope_scaling(cfg: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """(the RoPE scaling block, its type) of a config; None without one (transformers v5 renamed the key)."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict) or not rope:
        return None
    return rope, str(rope.get("rope_type") or rope.get("type") or "default")


def length_field(cfg: dict[str, Any]) -> tuple[str, float] | None:
    """(the config.json field vLLM takes the model's length from, its value), None when the file names none: the
    smallest of :data:`MAX_LEN_KEYS`, ``model_max_length`` taking precedence."""
    found: tuple[str, float] | None = None
    for name in MAX_LEN_KEYS:
        value = cfg.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (found is None or value < found[1]):
            found = (name, float(value))
    if isinstance(cfg.get("model_max_length"), (int, float)) and cfg["model_max_length"]:
        found = ("model_max_length", float(cfg["model_max_length"]))
    return found


def derived_max_model_len(cfg: dict[str, Any], model_type: str = "", *,
                          version: tuple[int, int] | None = None) -> tuple[int | None, str]:
    """(the longest --max-model-len vLLM accepts without VLLM_ALLOW_LONG_MAX_MODEL_LEN, how it was derived).

    Follows vLLM's ``_get_and_verify_max_len``: the smallest of :data:`MAX_LEN_KEYS`, ``model_max_length``
    taking precedence, then the RoPE scaling factor (dynamic/linear: ``max_len × factor``; llama3/longrope/su:
    no change, their max_position_embeddings is already the extended length; YaRN: no change from vLLM 0.30
    (``version`` None: the current rules), ``original_max_position_embeddings × factor`` before). The sliding
    window only limits it under ``--disable-sliding-window``, which kvwatch does not model. With no length field,
    the config class's default (:data:`CLASS_MAX_POSITION_EMBEDDINGS`), or None (unknown) for a class not listed.
    """
    field = length_field(cfg)
    if field is not None:
        key, derived = field
        how = f"{key}={int(derived)}"
    else:
        default = CLASS_MAX_POSITION_EMBEDDINGS.get(model_type)
        if default is None:
            return None, (f"config.json has no length field ({', '.join(MAX_LEN_KEYS[:3])}, ...) and kvwatch does "
                          f"not know the default of transformers' config class for model_type "
                          f"{model_type or '(none)'!r}")
        derived, how = float(default), (f"max_position_embeddings={default}, the default of {model_type}'s config "
                                        "class: config.json leaves it out")
    scaling = rope_scaling(cfg)
    yarn_unscaled = version is None or version >= YARN_UNSCALED_SINCE
    if scaling is not None and "gemma3" not in model_type:
        rope, rope_type = scaling
        if rope_type not in _ROPE_TYPES_NOT_SCALED and not (yarn_unscaled and rope_type in _YARN_TYPES):
            factor = real(rope.get("factor") or 1.0, "rope_scaling.factor")  # (null: vLLM falls back to 1.0)
            if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
                original = number(rope["original_max_position_embeddings"],
                                   "rope_scaling.original_max_position_embeddings")
                derived = original * factor
                how = f"rope_scaling {rope_type}: original_max_position_embeddings={original} × factor {factor:g}"
            elif factor != 1.0:
                how = f"{how} × rope_scaling {rope_type} factor {factor:g}"
                derived *= factor
    if derived < 1:  # (a length of -1 divided by zero in the ceiling; a factor of -2 planned -27 requests)
        raise ArchitectureError(f"config.json gives the model a length of {int(derived)} ({how}): it must be positive")
    if not derived <= MAX_LENGTH:  # (a factor of 1e300: the plan's sums of its KV overflowed a float; inf, NaN)
        raise ArchitectureError(f"config.json gives the model a length of {derived:g} tokens ({how}): more than any "
                                f"model holds (at most {MAX_LENGTH:,})")
    return int(derived), how


