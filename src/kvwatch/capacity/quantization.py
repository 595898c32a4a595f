"""Weight quantization: what a checkpoint's ``quantization_config`` or a ``--quantization`` name costs (pure).

Two kinds of names:

- **schemes** say how many bytes a linear weight takes: ``fp8``, ``int8``, ``w8a8``, ``w8a16``, ``w4a16``,
  ``nvfp4``, ``mxfp4``, ... (any ``w<bits>a<bits>`` is understood);
- **vLLM method names** (``compressed-tensors``, ``gptq``, ``gptq_marlin``, ``awq``, ``awq_marlin``,
  ``modelopt``, ``modelopt_fp4``) say which loader reads the checkpoint; the scheme itself is in the
  checkpoint. Given as ``--quantization``, they defer to the checkpoint's scheme when it is known.

:func:`scheme_from_config` reads a Hugging Face ``quantization_config``: compressed-tensors from its
``config_groups`` (``weights.num_bits``, ``weights.type``, the group or top-level ``format``), GPTQ/AWQ from
``bits`` (``w_bit``), ModelOpt from ``quant_algo`` (FP8 or NVFP4), plus ``fp8``, ``fbgemm_fp8``, ``mxfp4`` and
``bitsandbytes``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Bytes per parameter of quantized linear weights, including typical scale overhead.
_SCHEME_BYTES: dict[str, float] = {
    "fp8": 1.0, "fp8_dynamic": 1.0, "int8": 1.0, "experts_int8": 1.0,
    "int4": 0.5 + 2 / 128, "bitsandbytes": 0.5 + 2 / 64,
    "mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16,
}
# vLLM quantization method names whose scheme lives in the checkpoint, and what they mean without one.
_METHOD_DEFAULTS: dict[str, str | None] = {
    "compressed_tensors": None,  # the scheme is only in config_groups
    "gptq": "w4a16", "gptq_marlin": "w4a16", "awq": "w4a16", "awq_marlin": "w4a16",
    "modelopt": "fp8", "modelopt_fp4": "nvfp4", "fbgemm_fp8": "fp8",
}
# Methods that quantize only the MoE experts (attention and dense layers stay in the model dtype).
EXPERTS_ONLY = frozenset({"mxfp4", "experts_int8"})
_WXAY = re.compile(r"^w(\d+)a(\d+)$")
_SCHEME_EXAMPLES = "fp8, int8, w8a8, w8a16, w4a16, awq, gptq, nvfp4, mxfp4"


class QuantizationError(ValueError):
    """A quantization kvwatch cannot price; ``flag`` is where it came from (the message names the field)."""

    def __init__(self, message: str, flag: str = "--quantization") -> None:
        super().__init__(message)
        self.flag = flag


def normalise(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def known_names() -> list[str]:
    return sorted({*_SCHEME_BYTES, "w8a8", "w8a16", "w4a16", "w4a8",
                   *(m.replace("_", "-") if m == "compressed_tensors" else m for m in _METHOD_DEFAULTS)})


# vLLM's --quantization methods, the union of its QuantizationMethods over 0.11-0.32
# (vllm/model_executor/layers/quantization/__init__.py): `serve` and `check` accept these though kvwatch cannot price
# all of them (the capacity model is then off, with a warning); `plan`, which must price them, refuses those.
VLLM_METHODS = frozenset({
    "auto-round", "auto_awq", "auto_gptq", "awq", "awq_marlin", "bitblas", "bitsandbytes", "compressed-tensors",
    "cpu_awq", "deepseek_v4_fp8", "deepspeedfp", "experts_int8", "fbgemm_fp8", "fp8", "fp8_per_block",
    "fp8_per_channel", "fp8_per_tensor", "fp_quant", "gguf", "gpt_oss_mxfp4", "gptq", "gptq_bitblas", "gptq_marlin",
    "gptq_marlin_24", "hqq", "humming", "inc", "int8_per_channel_weight_only", "ipex", "modelopt", "modelopt_fp4",
    "modelopt_mixed", "modelopt_mxfp8", "moe_wna16", "mxfp4", "mxfp8", "nvfp4_per_token", "online", "petit_nvfp4",
    "ptpc_fp8", "quark", "rtn", "torchao", "tpu_int8",
})

_VLLM_METHODS_NORMALISED = frozenset(normalise(m) for m in VLLM_METHODS)


def is_vllm_method(name: str) -> bool:
    return normalise(name) in _VLLM_METHODS_NORMALISED


def _any_case(text: str) -> str:
    """``fp8`` -> ``[Ff][Pp]8``, ``-`` and ``_`` alike: case-insensitive without ``(?i)``, which JSON schema's
    ECMA-262 dialect does not have."""
    return "".join("[-_]" if c in "-_" else f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in text)


def name_pattern() -> str:
    """A pattern of every name ``serve`` accepts (:func:`check_name` with ``vllm_methods``), for the chart's
    values.schema.json (Go's RE2 and ECMA-262 alike)."""
    names = {normalise(n) for n in (*known_names(), *_SCHEME_BYTES, *_METHOD_DEFAULTS, "none")}
    names |= _VLLM_METHODS_NORMALISED
    return "^\\s*(" + "|".join(_any_case(n) for n in sorted(names)) + "|[Ww][0-9]+[Aa][0-9]+)?\\s*$"


def is_method(name: str) -> bool:
    """A vLLM loader name (compressed-tensors, gptq, awq, modelopt, ...) rather than a scheme."""
    return normalise(name) in _METHOD_DEFAULTS


def scheme_bytes(scheme: str) -> float | None:
    """Bytes per linear parameter of a scheme, None when it is not one kvwatch can price."""
    s = normalise(scheme)
    if s in _SCHEME_BYTES:
        return _SCHEME_BYTES[s]
    match = _WXAY.match(s)
    if match:
        bits = int(match.group(1))
        return bits / 8 + (2 / 128 if bits < 8 else 0.0)  # sub-byte ints carry a 16-bit scale per 128 weights
    return None


# vLLM's method families: a checkpoint of one is loaded by any of its names (awq_marlin is AWQ's faster kernel), and
# ModelConfig._verify_quantization refuses a --quantization of another family ("Quantization method specified in the
# model config (X) does not match the quantization method specified in the `quantization` argument (Y)"). Names that
# override across families on some platforms (marlin, moe_wna16, ipex, bitblas, petit_nvfp4, ...) are in none: not
# judged.
_FAMILIES: tuple[frozenset[str], ...] = (
    frozenset({"awq", "awq_marlin", "auto_awq"}),
    frozenset({"gptq", "gptq_marlin", "gptq_marlin_24", "gptq_bitblas", "auto_gptq"}),
    frozenset({"fp8"}),
    frozenset({"fbgemm_fp8"}),
    frozenset({"mxfp4", "gpt_oss_mxfp4"}),
    frozenset({"compressed_tensors"}),
    frozenset({"modelopt", "modelopt_fp4", "modelopt_mixed", "modelopt_mxfp8"}),
    frozenset({"bitsandbytes"}),
    frozenset({"gguf"}),
)


def method_mismatch(user: str | None, checkpoint_method: str | None) -> str | None:
    """vLLM's refusal of ``--quantization`` ``user`` for a checkpoint quantized with ``checkpoint_method`` (its
    config's ``quant_method``), or None: either unknown, the same family, or a name not judged."""
    if not user or not checkpoint_method or normalise(user) in {"", "none"}:
        return None
    u, m = normalise(user), normalise(checkpoint_method)
    family_u = next((f for f in _FAMILIES if u in f), None)
    family_m = next((f for f in _FAMILIES if m in f), None)
    if family_u is None or family_m is None or family_u is family_m:
        return None
    return (f"--quantization {user}: the checkpoint is quantized with {checkpoint_method} (its quant_method), and vLLM "
            f"refuses another method for it (\"does not match the quantization method specified\"); pass "
            f"--quantization {checkpoint_method} or leave it out")


def check_name(user: str | None, *, vllm_methods: bool = False) -> None:
    """Raise :class:`QuantizationError` when ``--quantization`` is neither a scheme nor a method kvwatch prices
    (with ``vllm_methods``: nor any method vLLM takes, :data:`VLLM_METHODS`)."""
    if user is None or normalise(user) in {"", "none"} or is_method(user) or scheme_bytes(user) is not None:
        return
    if vllm_methods and is_vllm_method(user):
        return
    raise QuantizationError(f"unknown quantization {user!r}; known: {', '.join(known_names())}")


@dataclass(frozen=True)
class Resolved:
    scheme: str  # what the weights are priced as
    bytes_per_param: float
    experts_only: bool
    how: str  # where the scheme came from, for the walk-through


def resolve(user: str | None, checkpoint: str | None, checkpoint_source: str | None,
            checkpoint_flag: str) -> Resolved | None:
    """The scheme that prices the weights, or None when they are unquantized.

    ``user`` is ``--quantization`` (wins, except that a vLLM method name defers to the checkpoint's scheme);
    ``checkpoint`` is the scheme the checkpoint ships with (from its config, or implied by the preset or the
    name), described by ``checkpoint_source``; ``checkpoint_flag`` is the flag that supplied the checkpoint.
    """
    if user is not None and normalise(user) in {"", "none"}:
        user = None
    if checkpoint is not None and _METHOD_DEFAULTS.get(normalise(checkpoint)):
        checkpoint = _METHOD_DEFAULTS[normalise(checkpoint)]  # e.g. a name implying "awq": 4-bit
    if user is not None:
        u = normalise(user)
        if u in _METHOD_DEFAULTS:
            if checkpoint is not None and scheme_bytes(checkpoint) is not None:
                return _resolved(checkpoint, f"--quantization {user}: {_describe(checkpoint, checkpoint_source)}")
            default = _METHOD_DEFAULTS[u]
            if default is None:
                raise QuantizationError(
                    f"--quantization {user}: the scheme (bits, int or float) is in the checkpoint's "
                    "quantization_config.config_groups; pass --model-config with that config.json, or the scheme "
                    f"itself ({_SCHEME_EXAMPLES})")
            return _resolved(default, f"--quantization {user} (assumed {default}: the checkpoint's bits are not known)")
        check_name(user)
        return _resolved(u, f"--quantization {user}")
    if checkpoint is None:
        return None
    if scheme_bytes(checkpoint) is None:
        where = checkpoint_source or "the checkpoint"
        raise QuantizationError(
            f"{where}: {checkpoint!r} is not a quantization kvwatch can price (known schemes: {_SCHEME_EXAMPLES}, "
            "any w<bits>a<bits>); pass --quantization with the scheme that matches its bytes per weight",
            flag=checkpoint_flag)
    return _resolved(checkpoint, _describe(checkpoint, checkpoint_source))


def _describe(scheme: str, source: str | None) -> str:
    return f"{scheme} from {source}" if source else f"{scheme} (the checkpoint's)"


def _resolved(scheme: str, how: str) -> Resolved:
    s = normalise(scheme)
    return Resolved(s, float(scheme_bytes(s) or 0.0), s in EXPERTS_ONLY, how)


# ------------------------------------------------------------------------------------ checkpoint configs

# vLLM's --kv-cache-dtype auto takes an FP8 KV cache a checkpoint declares: llm-compressor's kv_cache_scheme
# from 0.15 (the attention layer sets it; up to 0.2x even over an explicit --kv-cache-dtype, which kvwatch does
# not model), ModelOpt's kv_cache_quant_algo / kv_cache_scheme from 0.14 (resolve_kv_cache_dtype_string at
# argument time). Read off the 0.14, 0.15, 0.16, 0.18, 0.20, 0.30 and 0.33 wheels.
CHECKPOINT_KV_FP8_SINCE = {"compressed-tensors": (0, 15), "modelopt": (0, 14)}


# The lowest GPU compute capability vLLM starts a quantization method on (QuantizationConfig.get_min_capability(),
# checked at start), by vLLM release, as read off the 0.11, 0.14, 0.20, 0.26, 0.28, 0.30, 0.32 and 0.33 wheels:
# (first release, capability) steps; releases between two read ones that differ are not judged (None).
_MIN_CAPABILITY: dict[str, tuple[tuple[tuple[int, int], tuple[int, int] | None], ...]] = {
    "fp8": (((0, 0), (8, 0)), ((0, 12), None), ((0, 14), (7, 5))),
    "modelopt": (((0, 0), (8, 9)), ((0, 27), None), ((0, 28), (8, 0))),  # ModelOpt FP8
    "modelopt_fp4": (((0, 0), (8, 0)), ((0, 12), None), ((0, 14), (7, 5))),
    "mxfp4": (((0, 0), (8, 0)),),
    "compressed_tensors": (((0, 0), (7, 0)),),
}


def capability_refusal(method: str | None, version: tuple[int, int], capability: tuple[int, int] | None,
                       gpu: str | None) -> str | None:
    """vLLM's refusal to start quantization ``method`` on a GPU of ``capability``, or None (an unknown method,
    release or capability: no refusal)."""
    steps = _MIN_CAPABILITY.get(normalise(method or ""))
    if steps is None or capability is None:
        return None
    need = [c for since, c in steps if version >= since][-1]
    if need is None or capability >= need:
        return None
    return (f"vLLM will not start: quantization {method} needs a GPU of compute capability {need[0]}.{need[1]} or "
            f"more ({gpu or 'this GPU'} has {capability[0]}.{capability[1]})")


def _modelopt_inner(qc: dict[str, Any]) -> dict[str, Any]:
    """ModelOpt's nested ``quantization`` block (hf_quant_config.json's shape), or {}."""
    inner = qc.get("quantization")
    return inner if isinstance(inner, dict) else {}


def checkpoint_kv_cache_dtype(qc: dict[str, Any]) -> tuple[str, str] | None:
    """("fp8", the quantization method) when a ``quantization_config`` declares an FP8 KV cache; else None
    (an NVFP4 KV cache, which vLLM also takes from ModelOpt, is not modelled)."""
    method = normalise(str(qc.get("quant_method") or ""))
    if method == "compressed_tensors":
        scheme = qc.get("kv_cache_scheme")
        if isinstance(scheme, dict) and scheme.get("num_bits") == 8 and scheme.get("type") == "float":
            return "fp8", "compressed-tensors"
        return None
    if method.startswith("modelopt"):
        inner = _modelopt_inner(qc)
        algo = (inner.get("kv_cache_scheme") or qc.get("kv_cache_scheme") or inner.get("kv_cache_quant_algo")
                or qc.get("kv_cache_quant_algo"))
        if isinstance(algo, dict):
            fp8 = algo.get("dynamic") is False and algo.get("num_bits") == 8 and algo.get("type") == "float"
        else:
            fp8 = isinstance(algo, str) and algo.lower() == "fp8"
        return ("fp8", "modelopt") if fp8 else None
    return None


def scheme_from_config(qc: dict[str, Any]) -> tuple[str, str]:
    """(scheme, where it was read) from a Hugging Face ``quantization_config``.

    An unknown method or an unreadable compressed-tensors config returns the raw method name and the field
    that says so; :func:`resolve` turns that into an error naming the field.
    """
    method = normalise(str(qc.get("quant_method") or ""))
    field = "config.json quantization_config"
    if method == "compressed_tensors":
        return _compressed_tensors(qc, field)
    if method in {"gptq", "gptq_marlin", "awq", "awq_marlin", "moe_wna16"}:
        raw = qc.get("bits", qc.get("w_bit"))
        if raw is None:
            return "w4a16", f"{field} (quant_method {method}, bits not given: 4 assumed)"
        bits = _bits(raw, f"{field}.bits")
        return f"w{bits}a16", f"{field} (quant_method {method}, bits {bits})"
    if method in {"modelopt", "modelopt_fp4"}:
        algo = qc.get("quant_algo") or _modelopt_inner(qc).get("quant_algo")
        a = str(algo or "").upper()
        if "NVFP4" in a or "FP4" in a:
            return "nvfp4", f"{field} (quant_method {method}, quant_algo {algo})"
        if "FP8" in a:
            return "fp8", f"{field} (quant_method {method}, quant_algo {algo})"
        if not algo and method == "modelopt_fp4":
            return "nvfp4", f"{field} (quant_method {method})"
        return f"modelopt quant_algo {algo}", f"{field}.quant_algo"
    if method in {"fp8", "fbgemm_fp8"}:
        return "fp8", f"{field} (quant_method {method})"
    if method == "bitsandbytes":
        if qc.get("load_in_8bit"):
            return "int8", f"{field} (bitsandbytes, load_in_8bit)"
        return "bitsandbytes", f"{field} (bitsandbytes 4-bit)"
    if method in {"mxfp4", "experts_int8"}:
        return method, f"{field} (quant_method {method})"
    return method or "?", f"{field}.quant_method"


def _compressed_tensors(qc: dict[str, Any], field: str) -> tuple[str, str]:
    groups = qc.get("config_groups")
    top_format = str(qc.get("format") or "")
    found: list[tuple[float, str, str]] = []
    if isinstance(groups, dict):
        for name, group in groups.items():
            if not isinstance(group, dict):
                continue
            weights = group.get("weights") or {}
            bits = weights.get("num_bits") if isinstance(weights, dict) else None
            if bits is None:
                continue
            kind = str(weights.get("type") or "int").lower()
            fmt = str(group.get("format") or top_format)
            acts = group.get("input_activations") or {}
            act_bits = acts.get("num_bits") if isinstance(acts, dict) else None
            bits = _bits(bits, f"{field}.config_groups.{name}.weights.num_bits")
            if act_bits is not None:
                act_bits = _bits(act_bits, f"{field}.config_groups.{name}.input_activations.num_bits")
            scheme = _ct_scheme(bits, kind, fmt, act_bits)
            detail = f"config_groups.{name}.weights: num_bits {bits}, type {kind}"
            detail += f", format {fmt}" if fmt else ""
            found.append((float(scheme_bytes(scheme) or 0.0), scheme, detail))
    if not found:
        return "compressed-tensors", f"{field}.config_groups (compressed-tensors without any weights.num_bits)"
    found.sort(reverse=True)  # several groups: price every linear weight as the widest scheme (conservative)
    _, scheme, detail = found[0]
    extra = f"; {len(found) - 1} more group(s), priced as this widest one" if len(found) > 1 else ""
    return scheme, f"{field} (compressed-tensors, {detail}{extra})"


def _bits(value: Any, field: str) -> int:
    """A bit width from a quantization config; a list or a word is refused naming the field (not int()'s error)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        raise QuantizationError(f"{field} = {value!r:.60}: kvwatch needs a whole number of bits there",
                                flag="--model-config") from None


def _ct_scheme(bits: int, kind: str, fmt: str, act_bits: int | None) -> str:
    if "nvfp4" in fmt or (bits == 4 and kind == "float"):
        return "nvfp4"
    if kind == "float" and bits == 8:
        return "fp8"
    if act_bits == 8:
        return f"w{bits}a8"
    return f"w{bits}a16"
