"""Model and GPU presets: JSON data files shipped in ``kvwatch/data`` (the only I/O in this package).

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

GIB = 1 << 30


class PresetError(LookupError):
    """No preset matches (message suggests --model-config or the closest names)."""


@dataclass(frozen=True)
class GpuPreset:
    name: str
    total_memory_bytes: int  # what vLLM's total_gpu_memory reads (torch.cuda.mem_get_info total)
    source: str
    compute_capability: tuple[int, int] | None = None  # CUDA (major, minor); None for ROCm


@dataclass(frozen=True)
class ModelMatch:
    arch: ModelArch
    quantization: str | None  # implied by the name (e.g. a RedHatAI -FP8-dynamic alias); also arch's checkpoint


def _data_dir() -> Any:
    return resources.files("kvwatch") / "data"


@lru_cache(maxsize=1)
def _model_index() -> dict[str, tuple[str, str | None]]:
    """lower-case key -> (preset id, implied quantization)."""
    index: dict[str, tuple[str, str | None]] = {}
    for entry in (_data_dir() / "models").iterdir():
        if entry.name.endswith(".json") and entry.name != "aliases.json":
            data = json.loads(entry.read_text(encoding="utf-8"))
            index[data["id"].lower()] = (data["id"], None)
    aliases = json.loads((_data_dir() / "models" / "aliases.json").read_text(encoding="utf-8"))
    for alias, target in aliases["aliases"].items():
        if isinstance(target, str):
            index[alias.lower()] = (target, None)
        else:
            index[alias.lower()] = (target["model"], target.get("quantization"))
    return index


@cache
def _load_preset(preset_id: str) -> ModelArch:
    for entry in (_data_dir() / "models").iterdir():
        if entry.name.endswith(".json") and entry.name != "aliases.json":
            data = json.loads(entry.read_text(encoding="utf-8"))
            if data["id"] == preset_id:
                return arch_from_config(data["config"] | _extra(data), name=preset_id, source=data["source"])
    raise PresetError(f"preset file for {preset_id} is missing")


def _extra(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if data.get("num_parameters"):
        out["num_parameters"] = data["num_parameters"]
    if data.get("checkpoint_quantization"):
        out["checkpoint_quantization"] = data["checkpoint_quantization"]
    return out


def preset_names() -> list[str]:
    return sorted({target for target, _ in _model_index().values()})


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


def match_model(name: str) -> ModelMatch:
    """A preset by HF id, bare name, path-like label or alias; raises :class:`PresetError`."""
    index = _model_index()
    by_tail: dict[str, list[str]] = {}
    for key in index:
        by_tail.setdefault(key.rsplit("/", 1)[-1], []).append(key)
    for key in _candidates(name):
        k = key.lower()
        if k in index:
            target, quant = index[k]
            return _matched(name, target, quant)
        if k in by_tail and len(by_tail[k]) == 1:
            target, quant = index[by_tail[k][0]]
            return _matched(name, target, quant)
    raise PresetError(
        f"no preset for model {name!r}; pass --model-config PATH (its config.json) "
        f"or one of {len(preset_names())} presets (kvwatch plan --list-models)"
    )


def _matched(name: str, target: str, quantization: str | None) -> ModelMatch:
    """The preset, with the scheme a quantized repack's name implies as its checkpoint quantization."""
    arch = _load_preset(target)
    if quantization:
        arch = replace(arch, checkpoint_quantization=quantization,
                       checkpoint_quantization_source=f"the model name {name!r}")
    return ModelMatch(arch, quantization)


def load_config_file(path: str | Path) -> ModelArch:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ArchitectureError(f"cannot read {p}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ArchitectureError(f"{p} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    name = str(data.get("_name_or_path") or p.parent.name or "custom") if isinstance(data, dict) else "custom"
    return replace(arch_from_config(data, name=name, source=str(p)), from_config_file=True)


def resolve_model(name_or_config: str | Path | dict[str, Any]) -> ModelArch:
    """A :class:`ModelArch` from a preset name, a config.json path or a parsed config dict."""
    if isinstance(name_or_config, dict):
        return arch_from_config(name_or_config)
    text = str(name_or_config)
    if text.endswith(".json") or (Path(text).is_file()):
        return load_config_file(text)
    if Path(text, "config.json").is_file():
        return load_config_file(Path(text, "config.json"))
    return match_model(text).arch


@lru_cache(maxsize=1)
def _gpus() -> dict[str, GpuPreset]:
    data = json.loads((_data_dir() / "gpus.json").read_text(encoding="utf-8"))
    out: dict[str, GpuPreset] = {}
    for gpu in data["gpus"]:
        cc = gpu.get("compute_capability")
        capability = (int(cc.split(".")[0]), int(cc.split(".")[1])) if cc else None
        preset = GpuPreset(gpu["name"], round(gpu["total_gib"] * GIB), gpu["source"], capability)
        for key in [gpu["name"], *gpu.get("aliases", [])]:
            out[_gpu_key(key)] = preset
    return out


def _gpu_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").replace("geforce", ""))


def gpu_names() -> list[str]:
    return sorted({g.name for g in _gpus().values()})


def resolve_gpu(name: str) -> GpuPreset:
    preset = _gpus().get(_gpu_key(name))
    if preset is None:
        raise PresetError(f"unknown GPU {name!r}; use --gpu-memory-gib X or one of: {', '.join(gpu_names())}")
    return preset
