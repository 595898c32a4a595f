"""What ``serve`` needs from the capacity model: built once per engine configuration, asked once per poll.

``build_sidecar_capacity`` resolves the model (``--model``/``--model-config``, else vLLM's ``model_name``
label when a preset matches) and the GPU; it never raises for a missing or unknown model/GPU, it returns
``None`` with the reason to log, so the sidecar keeps running and simply omits the formula metrics.

``serve`` has no measured-memory flags (``--weights-gib`` & co. are ``plan``'s), so weights, activation
and non-torch memory are always estimates there. What the engine does tell is used: the labels of
``vllm:cache_config_info`` (:func:`engine_settings`) fill in ``gpu_memory_utilization``, ``block_size`` and
``cache_dtype`` when kvwatch was not given them, and ``max_model_len`` (kvwatch.engines.vllm.engine_max_model_len:
vLLM >= 0.20) too, ``kv_cache_memory_bytes`` (vLLM skipped profiling and used that pool) replaces the memory
budget, and the label set says which vLLM version's rules apply (kvwatch.engines.vllm.vllm_version_from_cache_config). A
``--max-model-len`` that differs from the engine's is kept (the capacity analyzer warns about it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.capacity.architecture import ArchitectureError
from kvwatch.capacity.kv import VLLM_BLOCK_SIZES, rank_groups
from kvwatch.capacity.memory import QuantizationError
from kvwatch.capacity.planner import CapacityPlan, DeploymentSpec, SpecError, plan_capacity
from kvwatch.capacity.presets import PresetError
from kvwatch.capacity.series import SeriesCapacity
from kvwatch.capacity.series import resolve as resolve_series
from kvwatch.capacity.whatif import MEMORY_SCENARIOS, Scenario, ceiling_ratio, whatif_ceilings, whatif_scenarios
from kvwatch.engines.vllm import (
    VERSION_LABELS,
    engine_max_model_len,
    label_number,
    override_blocks,
    vllm_version_from_cache_config,
)
from kvwatch.model import UNNAMED_MODELS, Reading
from kvwatch.settings import DeploymentSettings, ServeSettings

# cache_config_info labels the formula reads (a change in any of them means another engine configuration).
ENGINE_LABELS = ("gpu_memory_utilization", "block_size", "cache_dtype", "kv_cache_memory_bytes",
                 "enable_prefix_caching", "mamba_cache_mode", "num_gpu_blocks_override")
@dataclass(frozen=True)
class SidecarCapacity:
    plan: CapacityPlan
    scenarios: tuple[Scenario, ...]

    def whatif_max_concurrency(self, avg_kv_tokens_per_request: float | None,
                               today: float | None = None) -> dict[str, float]:
        """``kvwatch_whatif_max_concurrency{scenario}`` at ``avg_kv_tokens_per_request`` (serve passes the size behind
        its observed-mix ceiling, kvwatch.derived.ceiling_request_size). The what-ifs scale ``today``'s ceiling (of
        the pool the series has, the engine's when it reports one), as ``check``'s advice does; they do not replace
        it with the formula's: a scenario's ceiling is today's × the scenario's over the formula's own at the same
        request size. Where the formula holds no request at that size, the ratio is unknown and the scenario left
        out (the plan's own ceilings, 0, read as "no gain" beside an engine holding 25). Without today's ceiling, the
        plan's own. Without the request size (an engine whose pool kvwatch cannot size: SGLang, TensorRT-LLM), today's
        × the plan's KV tokens ratio, the advice's effects' figure (check said 31.9 -> 63.8, serve exported none)."""
        scenarios = self.scenarios
        if self.plan.pool_measured_by_engine:  # (vLLM >= 0.34: freed memory adds to a pool 0.33's sums do not size)
            scenarios = tuple(s for s in scenarios if s.name not in MEMORY_SCENARIOS)
        if not today:
            return whatif_ceilings(scenarios, avg_kv_tokens_per_request) if avg_kv_tokens_per_request else {}
        if not avg_kv_tokens_per_request:
            base = self.plan.kv_cache_tokens
            return {s.name: today * s.plan.kv_cache_tokens / base for s in scenarios
                    if s.plan is not None and base}
        ratios = {s.name: ceiling_ratio(self.plan, s.plan, avg_kv_tokens_per_request) for s in scenarios}
        return {name: today * ratio for name, ratio in ratios.items() if ratio is not None}


def engine_settings(settings: DeploymentSettings,
                    cache_config: Mapping[str, str]) -> tuple[DeploymentSettings, dict[str, Any], list[str]]:
    """(settings with the engine's values for what kvwatch was not given, spec overrides, what was taken).

    A setting passed as a flag or variable (``model_fields_set``) is never replaced.
    """
    given = set(settings.model_fields_set)
    update: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    taken: list[str] = []
    util = label_number(cache_config.get("gpu_memory_utilization"))
    if "gpu_memory_utilization" not in given and util is not None and 0 < util <= 1:
        update["gpu_memory_utilization"] = util
        taken.append(f"gpu_memory_utilization {util:g}")
    block = label_number(cache_config.get("block_size"))
    if "block_size" not in given and block is not None and block in VLLM_BLOCK_SIZES:
        update["block_size"] = int(block)
        taken.append(f"block_size {int(block)}")
    # Any name the engine reports, those the planner cannot size too (it refuses them rather than plan the model's
    # dtype: an nvfp4 cache was offered FP8 as a 2x gain).
    dtype = (cache_config.get("cache_dtype") or "").lower()
    if "kv_cache_dtype" not in given and dtype and dtype != "none":
        update["kv_cache_dtype"] = dtype
        taken.append(f"cache_dtype {dtype}")
    length = engine_max_model_len(cache_config)
    if "max_model_len" not in given and length is not None:
        update["max_model_len"] = length
        overrides["allow_long_max_model_len"] = True  # it runs: past the model's length only if vLLM was allowed
        taken.append(f"max_model_len {length} (kv_cache_size_tokens / kv_cache_max_concurrency)")
    pool = label_number(cache_config.get("kv_cache_memory_bytes"))
    if pool is not None and pool > 0:
        overrides["available_kv_bytes"] = pool
        overrides["kv_pool_fixed"] = True
        taken.append(f"kv_cache_memory_bytes {pool:,.0f} (vLLM skipped profiling)")
    # vLLM 0.34's extensible KV cache, off where the engine says so or a --num-gpu-blocks-override sets the pool: then
    # its classic sums apply, and their checks with them (planner.EXTENSIBLE_KV_SINCE)
    if (cache_config.get("enable_extensible_kv_cache") or "").lower() == "false" or override_blocks(cache_config):
        overrides["extensible_kv_cache"] = False
    caching = (cache_config.get("enable_prefix_caching") or "").lower()
    if caching in ("true", "false"):
        overrides["enable_prefix_caching"] = caching == "true"
    mode = (cache_config.get("mamba_cache_mode") or "").lower()
    if mode in ("none", "align", "all"):
        overrides["mamba_cache_mode"] = mode
    version = vllm_version_from_cache_config(cache_config)
    if version is not None:
        overrides["vllm_version"] = version
        # (the label set of 0.18.0 on, until kv_cache_size_tokens, somewhere in 0.21-0.25.1: vllm.CACHE_LABEL_EVIDENCE)
        shared = ", which 0.18.0 to 0.20.x share: a 0.18 or 0.19 engine may differ, and one from 0.21 that does " \
            "not label kv_cache_size_tokens yet subtracts its CUDA graphs" if version == (0, 20) else ""
        taken.append(f"vLLM {version[0]}.{version[1]}+ rules (from the label set{shared})")
    return (settings.model_copy(update=update) if update else settings), overrides, taken


def build_sidecar_capacity(settings: DeploymentSettings, model_name: str | None = None,
                           cache_config: Mapping[str, str] | None = None,
                           **overrides: Any) -> tuple[SidecarCapacity | None, str]:
    """(capacity, "") when the model and the deployment are known, else (None, why).

    ``cache_config`` is the engine's ``vllm:cache_config_info`` labels (see :func:`engine_settings`).
    """
    original = settings
    if settings.model is None and settings.model_config_path is None:
        if not model_name:
            return None, "model unknown: pass --model or --model-config"
        if model_name in UNNAMED_MODELS:
            return None, (f"the engine does not name its model (model_name {model_name!r}): pass --model or "
                          "--model-config")
        settings = settings.model_copy(update={"model": model_name})
    notes: list[str] = []
    taken: list[str] = []
    if cache_config:
        settings, engine_overrides, taken = engine_settings(settings, cache_config)
        overrides = {**engine_overrides, **overrides}
    if "vllm_version" not in overrides:
        notes.append("no vLLM version in the payload (vllm:cache_config_info): the current vLLM release's rules")
    try:
        spec = DeploymentSpec.from_settings(settings, **overrides)
        if spec.arch is not None and spec.arch.is_hybrid_mamba and spec.block_size != original.block_size:
            # vLLM rewrites block_size after KV init on hybrid models: the label is not the attention block size
            spec = replace(spec, block_size=original.block_size)
            taken = [t for t in taken if not t.startswith("block_size ")]
            notes.append(f"hybrid Mamba model: vLLM rewrites cache_config_info's block_size, so "
                         f"{original.block_size} is used")
        plan = plan_capacity(spec)
        scenarios = tuple(whatif_scenarios(spec))
    except (PresetError, ArchitectureError, SpecError, QuantizationError) as exc:
        return None, str(exc)
    if taken:
        notes.insert(0, "from vllm:cache_config_info: " + ", ".join(taken))
    plan = replace(plan, notes=(*plan.notes, *notes))
    return SidecarCapacity(plan, scenarios), ""


def model_kv_groups(settings: DeploymentSettings, model_name: str | None = None,
                    cache_config: Mapping[str, str] | None = None) -> int | None:
    """How many KV groups share the engine's block pool, from the model's architecture and the vLLM version the
    labels say (no card needed): what divides the engine's blocks when no capacity plan can be built. None when
    the model is not known."""
    if settings.model is None and settings.model_config_path is None:
        if not model_name or model_name in UNNAMED_MODELS:
            return None
        settings = settings.model_copy(update={"model": model_name})
    version = vllm_version_from_cache_config(cache_config or {})
    try:
        spec = DeploymentSpec.from_settings(settings, **({"vllm_version": version} if version else {}))
    except (PresetError, ArchitectureError, SpecError):
        return None
    if spec.arch is None:
        return None
    return len(rank_groups(spec.arch, spec.pipeline_parallel_size, spec.vllm_version)[1]) or None


def one_model_flags_note(settings: DeploymentSettings, model_names: Iterable[str]) -> str | None:
    """What to say when --model/--model-config, which describe one model, meet a page serving several (Triton's
    backend, a proxy): every model there is sized as that one, with the whole card, and kvwatch cannot tell which
    model_name the flags meant (Triton names models after folders: llama3_8b)."""
    given = settings.model or settings.model_config_path
    names = sorted(set(model_names))
    if given is None or len(names) < 2:
        return None
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return (f"--model/--model-config {given} describe one model, and this page serves {len(names)} ({shown}): each is "
            "sized as that model with the whole card; read the one it describes, and size the others by their own "
            "kvwatch runs")


class CapacityResolver:
    """One capacity per series for one set of settings, built once per engine configuration.

    ``sidecar(reading)`` is the formula's plan and what-ifs (``build_sidecar_capacity`` with the engine's
    cache_config_info), cached per ``model_name`` and the labels the formula reads; ``series(reading)`` is the
    capacity every consumer uses (kvwatch.capacity.series: the engine's figures first, then that plan).
    """

    def __init__(self, settings: DeploymentSettings) -> None:
        self._settings = settings
        self._cache: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[SidecarCapacity | None, str]] = {}
        self._groups: dict[tuple[str, tuple[tuple[str, str], ...]], int | None] = {}
        # Bounded like serve's series (--max-series); check's settings have no such cap.
        self._max_plans = 2 * (settings.max_series if isinstance(settings, ServeSettings) else 1000)

    def _key(self, reading: Reading) -> tuple[str, tuple[tuple[str, str], ...]]:
        config = {k: "" if k == "engine" else v  # (its presence tells V1; data-parallel ranks share a plan)
                  for k, v in reading.cache_config.items() if k in ENGINE_LABELS or k in VERSION_LABELS}
        return reading.model_name, tuple(sorted(config.items()))

    def plan_key(self, reading: Reading) -> tuple[str, tuple[tuple[str, str], ...]]:
        """What one plan is cached by: the model name and the engine labels the formula reads."""
        return self._key(reading)

    def sidecar(self, reading: Reading) -> tuple[SidecarCapacity | None, str]:
        """(the formula's plan and what-ifs, why not) for this reading's model and engine configuration."""
        return self._cached(self._cache, reading, build_sidecar_capacity)

    def kv_groups(self, reading: Reading) -> int | None:
        """The model's KV groups (:func:`model_kv_groups`), cached like the plans."""
        return self._cached(self._groups, reading, model_kv_groups)

    def _cached(self, cache: dict[Any, Any], reading: Reading, build: Any) -> Any:
        """``build(settings, model_name, cache_config)`` once per model and engine configuration. Bounded like
        the series (--max-series): a target churning model names must not grow it."""
        key = self._key(reading)
        if key not in cache:
            if len(cache) >= self._max_plans:
                del cache[next(iter(cache))]
            cache[key] = build(self._settings, reading.model_name, reading.cache_config)
        return cache[key]

    def series(self, reading: Reading) -> SeriesCapacity:
        capacity, _ = self.sidecar(reading)
        if capacity is not None:
            return resolve_series(reading, capacity.plan)
        return resolve_series(reading, None, self.kv_groups(reading))
