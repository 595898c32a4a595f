"""Model and GPU presets: JSON data files shipped in ``kvwatch/data``, and the user's own ``config.json`` files
(``--model-config``, or a model path that holds one): the capacity package's only I/O, kept in this module.

``resolve_model`` accepts a Hugging Face id (case-insensitive), vLLM's ``model_name`` label forms (a
local path such as ``/models/Llama-3.1-8B-Instruct``, a served alias), a path to a ``config.json``, or an
already-parsed config dict.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from kvwatch.capacity.architecture import ArchitectureError, ModelArch, arch_from_config
from kvwatch.capacity.units import GIB


class PresetError(LookupError):
    """No preset matches (message suggests --model-config or the closest names)."""


@dataclass(frozen=True)
class GpuPreset:
    name: str
    total_memory_bytes: int  # what vLLM's total_gpu_memory reads (torch.cuda.mem_get_info total)
    source: str
    compute_capability: tuple[int, int] | None = None  # CUDA (major, minor); None for ROCm
    bf16_tflops: float | None = None  # dense BF16 tensor peak (datasheet), for the prefill-time estimate


@dataclass(frozen=True)
class ModelMatch:
    arch: ModelArch
    quantization: str | None  # implied by the name (e.g. a RedHatAI -FP8-dynamic alias); also arch's checkpoint


def _data_dir() -> Any:
    return resources.files("kvwatch") / "data"


@dataclass(frozen=True)
class _Entry:
    target: str  # preset id
    quantization: str | None = None  # scheme a quantized repack implies
    config: tuple[tuple[str, Any], ...] = ()  # config.json fields the alias changes (e.g. a longer context)
    source: str | None = None  # where those come from


@lru_cache(maxsize=1)
def _model_index() -> dict[str, _Entry]:
    """lower-case key -> preset id, implied quantization and config changes."""
    index: dict[str, _Entry] = {}
    for entry in (_data_dir() / "models").iterdir():
        if entry.name.endswith(".json") and entry.name != "aliases.json":
            data = json.loads(entry.read_text(encoding="utf-8"))
            index[data["id"].lower()] = _Entry(data["id"])
    aliases = json.loads((_data_dir() / "models" / "aliases.json").read_text(encoding="utf-8"))
    for alias, target in aliases["aliases"].items():
        if isinstance(target, str):
            index[alias.lower()] = _Entry(target)
        else:
            index[alias.lower()] = _Entry(target["model"], target.get("quantization"),
                                          tuple(sorted((target.get("config") or {}).items())), target.get("source"))
    return index


@cache
def _preset_data(preset_id: str) -> dict[str, Any]:
    for entry in (_data_dir() / "models").iterdir():
        if entry.name.endswith(".json") and entry.name != "aliases.json":
            data = json.loads(entry.read_text(encoding="utf-8"))
            if data["id"] == preset_id:
                return dict(data)
    raise PresetError(f"preset file for {preset_id} is missing")


@cache
def _load_preset(preset_id: str) -> ModelArch:
    data = _preset_data(preset_id)
    return arch_from_config(data["config"] | _extra(data), name=preset_id, source=data["source"])


def _extra(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if data.get("num_parameters"):
        out["num_parameters"] = data["num_parameters"]
    if data.get("checkpoint_quantization"):
        out["checkpoint_quantization"] = data["checkpoint_quantization"]
    return out


def preset_names() -> list[str]:
    return sorted({entry.target for entry in _model_index().values()})


def _candidates(name: str) -> list[str]:
    """Keys to try for a user's or vLLM's model name, most specific first."""
    raw = name.strip().rstrip("/")
    keys = [raw]
    tail = raw.rsplit("/", 1)[-1]
    if "/" in raw:
        keys.append("/".join(raw.split("/")[-2:]))  # /models/org/name -> org/name
    keys.append(tail)
    # drop common suffixes of local copies and served aliases
    keys.append(re.sub(r"[-_.](hf|local|latest|main)$", "", tail, flags=re.I))
    return keys


# Quantization suffixes of repacked checkpoints (Qwen/Qwen3-8B-FP8, ...-AWQ, ...-GPTQ-Int8, RedHatAI's
# ...-quantized.w4a16) and the scheme each implies; tried in this order (longer forms first).
_QUANT_SUFFIXES: tuple[tuple[str, str], ...] = (
    (r"fp8[-_.]?(dynamic|static|block)", "fp8"), (r"fp8", "fp8"),
    (r"(quantized[-_.])?w4a16", "w4a16"), (r"(quantized[-_.])?w8a8", "w8a8"), (r"(quantized[-_.])?w8a16", "w8a16"),
    (r"(quantized[-_.])?w4a8", "w4a8"),
    (r"gptq[-_.]?int8", "w8a16"), (r"gptq[-_.]?(int4|4bit)", "w4a16"), (r"gptq", "w4a16"),
    (r"awq([-_.]?int4)?", "w4a16"), (r"nvfp4", "nvfp4"), (r"mxfp4", "mxfp4"), (r"fp4", "nvfp4"),
    (r"int8", "int8"), (r"int4", "w4a16"), (r"bnb[-_.]?4bit", "bitsandbytes"),
)
# Name parts that do not change the attention geometry: chat/instruct tuning, dated refreshes.
_VARIANT = re.compile(r"[-_.](instruct|chat|it|hf|base|thinking|\d{4})$", re.I)


def _strip_quantization(tail: str) -> tuple[str, str | None]:
    for pattern, scheme in _QUANT_SUFFIXES:
        stripped = re.sub(rf"[-_.]{pattern}$", "", tail, flags=re.I)
        if stripped != tail and stripped:
            return stripped, scheme
    return tail, None


def _normalised(tail: str) -> str:
    """A name's tail without its quantization suffix and variant words (lower case)."""
    tail = _strip_quantization(tail)[0]
    while True:
        shorter = _VARIANT.sub("", tail)
        if shorter == tail or not shorter:
            return tail.lower()
        tail = shorter


def _lookup(keys: list[str]) -> _Entry | None:
    index = _model_index()
    by_tail: dict[str, list[str]] = {}
    for key in index:
        by_tail.setdefault(key.rsplit("/", 1)[-1], []).append(key)
    for key in keys:
        k = key.lower()
        if k in index:
            return index[k]
        if k in by_tail and len({index[t].target for t in by_tail[k]}) == 1 and len(by_tail[k]) == 1:
            return index[by_tail[k][0]]
    return None


def _geometry(arch: ModelArch) -> tuple[Any, ...]:
    return (arch.num_layers, arch.num_attention_heads, arch.num_kv_heads, arch.head_dim, arch.hidden_size,
            arch.vocab_size, arch.layer_types, arch.kv_lora_rank, arch.num_experts)


@lru_cache(maxsize=1)
def _normalised_index() -> dict[str, frozenset[str]]:
    """Normalised preset name -> preset ids: computed once, not per lookup (each costs ~100 regex passes)."""
    index: dict[str, set[str]] = {}
    for key, entry in _model_index().items():
        index.setdefault(_normalised(key.rsplit("/", 1)[-1]), set()).add(entry.target)
    return {name: frozenset(targets) for name, targets in index.items()}


def _by_normalised_name(raw: str) -> str | None:
    """The one preset whose normalised name equals ``raw``'s (or several with the same architecture)."""
    wanted = _normalised(raw.rsplit("/", 1)[-1])
    targets = sorted(_normalised_index().get(wanted, ()))
    if not targets:
        return None
    exact = [t for t in targets if t.rsplit("/", 1)[-1].lower() == wanted]
    if len(exact) == 1:
        return exact[0]
    return targets[0] if len({_geometry(_load_preset(t)) for t in targets}) == 1 else None


def _is_model_folder(name: str) -> bool:
    """Whether ``name`` is a folder holding a config.json; False for anything the file system refuses (a
    scraped model_name label of 300 bytes raised ENAMETOOLONG and failed every poll)."""
    try:
        return bool(name.strip()) and Path(name, "config.json").is_file()
    except (OSError, ValueError):
        return False


def match_model(name: str) -> ModelMatch:
    """A preset by HF id, bare name, path-like label or alias; raises :class:`PresetError`.

    Tried in order: the name as given (and its ``org/name`` and bare tail, so vLLM's ``model_name`` label
    ``/models/Qwen3-8B`` works); the name without a quantization suffix (``Qwen/Qwen3-8B-FP8`` ->
    ``Qwen/Qwen3-8B``, implying fp8); the name without variant words as well (``-Instruct``, ``-Chat``,
    ``-it``, ``-Base``, ``-Thinking``, a 4-digit date). The last two say so in a note on the model. A local
    model folder (vLLM's ``--model /models/x``) that kvwatch can read is its own config.json, before any preset.
    """
    if _is_model_folder(name):
        return ModelMatch(load_config_file(Path(name)), None)
    entry = _lookup(_candidates(name))
    if entry is not None:
        return _matched(name, entry)
    raw = name.strip().rstrip("/")
    head, _, tail = raw.rpartition("/")
    stripped, scheme = _strip_quantization(tail)
    if scheme is not None:
        entry = _lookup(_candidates(f"{head}/{stripped}" if head else stripped))
        if entry is not None:
            implied = entry.quantization or scheme
            note = f"{name!r} is preset {entry.target} with a quantization suffix: weights priced as {implied}"
            return _matched(name, replace(entry, quantization=implied), note)
    target = _by_normalised_name(raw)
    if target is not None:
        note = (f"{name!r} matched preset {target} by its name without variant words"
                + (f" (quantization suffix: {scheme})" if scheme else "")
                + "; its config (e.g. max_position_embeddings) may differ: pass --model-config to be sure")
        return _matched(name, _Entry(target, scheme), note)
    raise PresetError(
        f"no preset for model {name!r}; pass --model-config PATH (its config.json) "
        f"or one of {len(preset_names())} presets (kvwatch plan --list-models)"
    )


def _matched(name: str, entry: _Entry, note: str | None = None) -> ModelMatch:
    """The preset with the alias's config changes, and the scheme a repack's name implies as its checkpoint's."""
    arch = _load_preset(entry.target)
    if entry.config:
        data = _preset_data(entry.target)
        changed = ", ".join(f"{k} {v}" for k, v in entry.config)
        arch = arch_from_config(data["config"] | dict(entry.config) | _extra(data), name=arch.name,
                                source=f"{data['source']}; for {name}: {changed} ({entry.source})")
    if entry.quantization:
        arch = replace(arch, checkpoint_quantization=entry.quantization,
                       checkpoint_quantization_source=f"the model name {name!r}")
    if note:
        arch = replace(arch, notes=(*arch.notes, note))
    return ModelMatch(arch, entry.quantization)


MAX_CONFIG_JSON_BYTES = 16 * 1024 * 1024  # far above any model's config.json (a few KB to ~100 KB)


def read_config_json(path: str | Path) -> Any:
    """A config.json's JSON (``path`` or a model snapshot folder holding one, as vLLM's --model takes it), or an
    ArchitectureError saying why it cannot be one."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        if p.stat().st_size > MAX_CONFIG_JSON_BYTES:
            raise ArchitectureError(f"{p} is larger than any config.json ({MAX_CONFIG_JSON_BYTES:,} bytes)")
        return json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ArchitectureError(f"cannot read {p}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ArchitectureError(f"{p} is not UTF-8 text (is it a config.json?)") from None
    except json.JSONDecodeError as exc:
        raise ArchitectureError(f"{p} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise ArchitectureError(f"{p} is JSON nested deeper than any config.json") from None


def load_config_file(path: str | Path) -> ModelArch:
    p = Path(path)
    if p.is_dir():  # a model snapshot folder, as vLLM's --model takes it
        p = p / "config.json"
    data = read_config_json(p)
    if isinstance(data, dict) and data.get("quantization_config") is None:
        # ModelOpt 0.29 and before wrote its quantization config beside config.json; vLLM reads it from there.
        legacy = p.parent / "hf_quant_config.json"
        if legacy.is_file():
            try:
                quant = json.loads(legacy.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
                raise ArchitectureError(f"cannot read {legacy}: {exc}") from None
            if isinstance(quant, dict):
                data = {**data, "quantization_config": quant}
    name = config_model_name(data, p) if isinstance(data, dict) else "custom"
    return replace(arch_from_config(data, name=name, source=str(p)), from_config_file=True)


def config_model_name(data: dict[str, Any], path: Path) -> str:
    """The model's name for a config.json: a hub id (``org/name``) when the file or its cache folder tells it,
    else the last part of a local path (the file's own name when it is not config.json), never a folder path or a
    cache hash."""
    for parent in path.resolve().parents:  # the Hugging Face cache: .../models--org--name/snapshots/<hash>/
        if parent.name.startswith("models--"):
            return parent.name[len("models--"):].replace("--", "/")
    given = str(data.get("_name_or_path") or "").strip()
    if given and not given.startswith(("/", ".", "~")) and given.count("/") <= 1 and "\\" not in given:
        return given  # a hub id, as transformers writes it when loading from the hub
    if given:
        return Path(given.rstrip("/\\")).name or "custom"
    if path.name != "config.json":  # a file saved under a name of its own: that name, not its folder's
        return path.stem or "custom"
    return path.resolve().parent.name or "custom"


def resolve_model(name_or_config: str | Path | dict[str, Any]) -> ModelArch:
    """A :class:`ModelArch` from a preset name, a config.json path or a parsed config dict."""
    if isinstance(name_or_config, dict):
        return arch_from_config(name_or_config)
    text = str(name_or_config)
    if text.endswith(".json") or (Path(text).is_file()):
        return load_config_file(text)
    return match_model(text).arch  # a model folder is read there, before the presets


@lru_cache(maxsize=1)
def _gpu_data() -> dict[str, Any]:
    return json.loads((_data_dir() / "gpus.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _gpus() -> dict[str, GpuPreset]:
    out: dict[str, GpuPreset] = {}
    for gpu in _gpu_data()["gpus"]:
        cc = gpu.get("compute_capability")
        capability = (int(cc.split(".")[0]), int(cc.split(".")[1])) if cc else None
        preset = GpuPreset(gpu["name"], round(gpu["total_gib"] * GIB), gpu["source"], capability,
                           gpu.get("bf16_tflops"))
        for key in [gpu["name"], *gpu.get("aliases", [])]:
            out[_gpu_key(key)] = preset
    return out


def _gpu_key(name: str) -> str:
    # The Helm chart normalizes config.gpu the same way (deploy/helm/kvwatch/templates/_helpers.tpl): keep in step.
    # Letters and digits first, then the vendor words: Python lower-cases "İ" to "i" and a combining dot, Go to "i".
    return re.sub(r"[^a-z0-9]", "", name.lower()).replace("nvidia", "").replace("geforce", "")


def gpu_names() -> list[str]:
    return sorted({g.name for g in _gpus().values()})


def gpu_keys() -> list[str]:
    """Every spelling's normalized form (names and aliases) that resolve_gpu accepts."""
    return sorted(_gpus())


@lru_cache(maxsize=1)
def _ambiguous_gpus() -> dict[str, list[str]]:
    """gpus.json's names of cards made in two memory sizes, by normalized name: the presets each may be."""
    return {_gpu_key(name): presets for name, presets in _gpu_data()["ambiguous"].items() if not name.startswith("_")}


def resolve_gpu(name: str) -> GpuPreset:
    key = _gpu_key(name)
    if key in _ambiguous_gpus():
        raise PresetError(f"GPU {name!r} is made in two memory sizes: give {' or '.join(_ambiguous_gpus()[key])} "
                          "(or --gpu-memory-gib X)")
    preset = _gpus().get(key)
    if preset is None:
        raise PresetError(f"unknown GPU {name!r}; use --gpu-memory-gib X or one of: {', '.join(gpu_names())}")
    return preset
