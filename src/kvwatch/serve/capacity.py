"""The capacity model inside ``serve``: the formula's KV capacity beside vLLM's, and what-if ceilings.

Exports, per (``model_name``, ``engine``), when the model and the card are known:
``kvwatch_formula_kv_capacity_tokens`` (what the formula says vLLM should have, from kvwatch's settings plus
the engine's own ``cache_config_info`` values for what was not given; a large gap to
``kvwatch_kv_capacity_tokens`` means the settings kvwatch was given do not match the engine) and
``kvwatch_whatif_max_concurrency{scenario}`` (each scenario's ceiling at the live average KV tokens per
running request).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from kvwatch.history import SeriesHistory
from kvwatch.model import Reading, SeriesKey
from kvwatch.serve.sidecar_capacity import ENGINE_LABELS, VERSION_LABELS, SidecarCapacity, build_sidecar_capacity

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapacityResult:
    formula_kv_capacity_tokens: int
    whatif_max_concurrency: Mapping[str, float]


class CapacityAnalyzer:
    name = "capacity"

    def __init__(self, settings: Any) -> None:
        self._settings = settings
        # One plan per vLLM model_name and engine configuration (the cache_config_info labels the formula
        # reads): a preset may only match once the engine names its model, and a restart may change them.
        self._plans: dict[tuple[str, tuple[tuple[str, str], ...]], SidecarCapacity | None] = {}

    def _plan(self, reading: Reading) -> SidecarCapacity | None:
        config = {k: v for k, v in reading.cache_config.items() if k in ENGINE_LABELS or k in VERSION_LABELS}
        key = (reading.model_name, tuple(sorted(config.items())))
        if key not in self._plans:
            capacity, why = build_sidecar_capacity(self._settings, reading.model_name, reading.cache_config)
            if capacity is None:
                log.info("capacity model off for %s: %s", reading.model_name, why)
            else:
                log.info("capacity model for %s: %s", reading.model_name,
                         "; ".join(n for n in capacity.plan.notes if "cache_config_info" in n) or "kvwatch's settings")
            self._plans[key] = capacity
        return self._plans[key]

    def analyze(self, key: SeriesKey, history: SeriesHistory, reading: Reading, now: float) -> CapacityResult | None:
        capacity = self._plan(reading)
        if capacity is None:
            return None
        per_request = reading.kv_tokens_per_running_request
        whatif = capacity.whatif_max_concurrency(per_request) if per_request else {}
        return CapacityResult(capacity.formula_kv_capacity_tokens, MappingProxyType(whatif))

    def families(self, results: Mapping[SeriesKey, CapacityResult], now: float) -> Iterable[GaugeMetricFamily]:
        formula = GaugeMetricFamily(
            "kvwatch_formula_kv_capacity_tokens",
            "KV cache capacity in tokens per engine as the capacity model computes it from the model, the GPU and "
            "the deployment flags kvwatch was given, with gpu_memory_utilization, block_size, cache_dtype and the "
            "vLLM version's rules taken from vllm:cache_config_info where not given; weights and activations are "
            "estimates, and the CUDA-graph memory vLLM >= 0.21 subtracts before sizing the cache is not modelled, "
            "so on those versions this is higher than vLLM's figure by the tokens that memory would hold (compare "
            "with kvwatch_kv_capacity_tokens).",
            labels=["model_name", "engine"])
        whatif = GaugeMetricFamily(
            "kvwatch_whatif_max_concurrency",
            "Concurrency ceiling under a what-if scenario, at the live average KV tokens per running request.",
            labels=["model_name", "engine", "scenario"])
        for (model_name, engine), result in sorted(results.items()):
            formula.add_metric([model_name, engine], float(result.formula_kv_capacity_tokens))
            for scenario, ceiling in result.whatif_max_concurrency.items():
                whatif.add_metric([model_name, engine, scenario], ceiling)
        yield formula
        yield whatif


def make_analyzer(settings: Any) -> CapacityAnalyzer:
    return CapacityAnalyzer(settings)
