"""The capacity model inside ``serve``: the formula's KV capacity beside vLLM's, and what-if ceilings.

Exports, per (``model_name``, ``engine``), when the model and the card are known: ``kvwatch_formula_kv_capacity_tokens``
(what the formula says vLLM should have, from kvwatch's settings plus the engine's own ``cache_config_info`` values for
what was not given; a large gap to ``kvwatch_kv_capacity_tokens`` means the settings kvwatch was given do not match the
engine) and ``kvwatch_whatif_max_concurrency{scenario}`` (each scenario's ceiling: today's observed-mix ceiling × the
scenario's over the formula's own at its request size, kvwatch.derived.ceiling_request_size). For every series whose
capacity is known by any means: ``kvwatch_capacity_source_info{source}`` (the engine's figures first, then the formula:
kvwatch.capacity.series) and ``kvwatch_kv_cache_pool_bytes``. For every series whose usage, running and waiting are
known: ``kvwatch_capacity_finding{finding}``, 1 once a finding's condition (kvwatch.capacity.findings.live_finding, the
same as ``check``'s) has held on every poll for SUSTAINED_SECONDS of the poll clock, else 0.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.core import GaugeMetricFamily

from kvwatch.capacity.findings import (
    EMPTY_USAGE,
    LIVE_FINDINGS,
    STUCK_USAGE,
    SUSTAINED_SECONDS,
    HeldSince,
    deployment_mismatches,
    given_engine_settings,
    live_finding,
    vllm_refusals,
)
from kvwatch.capacity.planner import GRAPH_SUBTRACTING_VLLM
from kvwatch.capacity.series import formula_in_engine_terms, max_model_len_of
from kvwatch.derived import ceiling_request_size, observed_mix_ceiling
from kvwatch.engines.vllm import override_blocks
from kvwatch.history import SeriesHistory
from kvwatch.model import VLLM, Reading, SeriesKey
from kvwatch.serve.sidecar_capacity import CapacityResolver, SidecarCapacity
from kvwatch.serve.state import SERIES_LABELS
from kvwatch.settings import ServeSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapacityResult:
    formula_kv_capacity_tokens: float | None
    whatif_max_concurrency: Mapping[str, float]
    source: str = "unknown"  # kvwatch.capacity.series.SOURCES: where the series' capacity comes from
    pool_bytes: float | None = None  # per GPU; also the KV term of kvwatch.serve.gpu's non-KV memory
    pool_source: str | None = None
    # LIVE_FINDINGS id -> 1.0 when its condition held for SUSTAINED_SECONDS, else 0.0; empty when not judged
    findings: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    weights_bytes: float | None = None  # per GPU, the plan's (estimated) weights: kvwatch.serve.gpu's other term


MAX_LOGGED_PLANS = 10


class CapacityAnalyzer:
    name = "capacity"
    history_seconds = 0.0  # the newest reading and the restart stamp only

    def __init__(self, settings: ServeSettings, capacity: CapacityResolver | None = None) -> None:
        # One plan per vLLM model_name and engine configuration (the cache_config_info labels the formula
        # reads): a preset may only match once the engine names its model, and a restart may change them. The
        # resolver is the sidecar's one, shared with the forecaster's advice (kvwatch.serve.app.run).
        self._capacity = capacity or CapacityResolver(settings)
        self._max_model_len = settings.max_model_len  # as given (None: the engine's is taken, see sidecar_capacity)
        self._given = given_engine_settings(settings)  # the others the engine's labels tell, as given
        # A model kvwatch was told of and cannot plan is a setting to fix (a warning); one it guessed from the
        # engine's model name is not.
        self._model_given = settings.model is not None or settings.model_config_path is not None
        self._logged = 0
        # Model and engine configurations whose plan this analyzer has announced: its own record, not the resolver's
        # cache, which the sidecar's series capacity fills first (every line was lost that way), bounded like it.
        self._announced: dict[object, None] = {}
        self._max_announced = 2 * settings.max_series
        # Per series and finding: since when its condition has held (O(1) per poll, bounded like the plans).
        self._held: dict[tuple[SeriesKey, str], HeldSince] = {}
        self._max_held = 2 * len(LIVE_FINDINGS) * settings.max_series

    def _plan(self, reading: Reading) -> SidecarCapacity | None:
        key = self._capacity.plan_key(reading)
        new = key not in self._announced
        if new:
            if len(self._announced) >= self._max_announced:
                del self._announced[next(iter(self._announced))]
            self._announced[key] = None
        capacity, why = self._capacity.sidecar(reading)
        if new:
            # One line per model for the first few; a target serving thousands of models gets no more.
            self._logged += 1
            loud = self._logged <= MAX_LOGGED_PLANS
            say, warn = (log.info, log.warning) if loud else (log.debug, log.debug)
            if self._logged == MAX_LOGGED_PLANS + 1:
                log.info("capacity model: more models than %d, further per-model lines at DEBUG", MAX_LOGGED_PLANS)
            for mismatch in deployment_mismatches(self._max_model_len, self._given, reading,
                                                  capacity.plan if capacity else None):
                warn("capacity model for %s: %s", reading.model_name, mismatch.message)
            if capacity is None:
                (warn if self._model_given else say)("capacity model off for %s: %s", reading.model_name, why)
            else:
                # e.g. a --max-model-len vLLM refuses: the settings are wrong; vLLM's refusals only where vLLM serves
                # (an SGLang page read "vLLM will not start" beside the engine serving it, as check never says)
                for error in vllm_refusals(capacity.plan) if reading.engine_kind == VLLM else ():
                    warn("capacity model for %s: %s", reading.model_name, error)
                say("capacity model for %s: %s", reading.model_name,
                    "; ".join(n for n in capacity.plan.notes if "cache_config_info" in n) or "kvwatch's settings")
        return capacity

    def analyze(self, key: SeriesKey, history: SeriesHistory, reading: Reading, now: float) -> CapacityResult | None:
        capacity = self._plan(reading)
        series = self._capacity.series(reading)
        reading = series.apply(reading)  # the series' one capacity, as the forecaster and the exporter use it
        findings = self._live_findings(key, history, reading, now)
        if capacity is None and series.source == "unknown" and not findings:
            return None
        whatif: dict[str, float] = {}
        # The request size behind kvwatch_max_concurrency{basis="observed_mix"} (the smaller of the live footprint
        # and the finished mean, net of the prefix cache): a what-if starting from the live footprint alone
        # read above today's ceiling for a change that does nothing at this mix (max_model_len_halved at +7 %).
        headline = observed_mix_ceiling(reading, history)
        size = ceiling_request_size(reading, headline) or reading.kv_tokens_per_running_request
        # (no ceiling yet, at 1 % usage with no request finished: today's is the pool at the live footprint, which
        # the what-ifs scale; the plan's own ceilings replaced the engine's pool)
        today = headline or (reading.kv_capacity_tokens / size if reading.kv_capacity_tokens and size else None)
        if capacity is not None and (size or today):
            whatif = capacity.whatif_max_concurrency(size, today)
            if override_blocks(reading.cache_config) and today:
                # --num-gpu-blocks-override fixes the pool: no scenario adds KV while it is set (kvwatch.advisor)
                whatif = dict.fromkeys(whatif, today)
        # (no formula figure where vLLM >= 0.34 measures its pool: 0.33's sums are not its, planner.EXTENSIBLE_KV_SINCE)
        formula = capacity is not None and not capacity.plan.pool_measured_by_engine
        return CapacityResult(formula_in_engine_terms(capacity.plan, series.source) if formula else None,
                              MappingProxyType(whatif), series.source, series.pool_bytes, series.pool_source,
                              MappingProxyType(findings),
                              capacity.plan.weights_bytes if capacity is not None else None)

    def _live_findings(self, key: SeriesKey, history: SeriesHistory | None, reading: Reading,
                       now: float) -> dict[str, float]:
        """Each live finding: 1.0 once its condition held for SUSTAINED_SECONDS of polls since the last restart."""
        if (history is None or reading.kv_usage_ratio is None or reading.requests_running is None
                or reading.requests_waiting is None):
            return {}
        max_model_len = max_model_len_of(reading, self._max_model_len)
        restarted = history.last_restart_timestamp == now
        out: dict[str, float] = {}
        for finding_id in LIVE_FINDINGS:
            holds = live_finding(finding_id, reading.kv_usage_ratio, reading.requests_running,
                                 reading.requests_waiting, reading.kv_capacity_tokens, max_model_len,
                                 asleep=reading.asleep, prefill_server=reading.prefill_server,
                                 deferred=reading.requests_waiting_deferred,
                                 queue_holds_no_kv=reading.waiting_holds_no_kv) is not None
            timer = self._held.get((key, finding_id))
            if timer is None:
                if len(self._held) >= self._max_held:
                    del self._held[next(iter(self._held))]
                timer = self._held[(key, finding_id)] = HeldSince()
            out[finding_id] = 1.0 if timer.update(now, holds, restarted) >= SUSTAINED_SECONDS else 0.0
        return out

    def families(self, results: Mapping[SeriesKey, CapacityResult], now: float) -> Iterable[GaugeMetricFamily]:
        formula = GaugeMetricFamily(
            "kvwatch_formula_kv_capacity_tokens",
            "KV cache capacity in tokens per engine as the capacity model computes it from the model, the GPU and "
            "the deployment flags kvwatch was given, with gpu_memory_utilization, block_size, cache_dtype and the "
            "vLLM version's rules taken from vllm:cache_config_info where not given; weights and activations are "
            f"estimates, as is the CUDA-graph memory {GRAPH_SUBTRACTING_VLLM} subtracts before sizing the cache. "
            "In the terms of "
            "kvwatch_kv_capacity_tokens, to compare with it (blocks / KV groups x block size where that comes from "
            "the engine's blocks).",
            labels=SERIES_LABELS)
        whatif = GaugeMetricFamily(
            "kvwatch_whatif_max_concurrency",
            "Concurrency ceiling under a what-if scenario, at the request size behind "
            "kvwatch_max_concurrency{basis=\"observed_mix\"} (today's ceiling scaled by the scenario's).",
            labels=[*SERIES_LABELS, "scenario"])
        source = GaugeMetricFamily(
            "kvwatch_capacity_source_info",
            "Where the series' KV capacity (kvwatch_kv_capacity_tokens, and what the forecaster and advice use) "
            "comes from: engine_kv_cache_size_tokens, engine_num_gpu_blocks (vllm:cache_config_info), engine_metric "
            "(another engine figure: SGLang's max_total_num_tokens, TensorRT-LLM's blocks, vLLM's "
            "num_gpu_blocks_override), formula (kvwatch's capacity model) or unknown. Always 1.",
            labels=[*SERIES_LABELS, "source"])
        pool = GaugeMetricFamily(
            "kvwatch_kv_cache_pool_bytes",
            "KV cache pool per GPU in bytes (vLLM logs it as 'Available KV cache memory' but does not export it): "
            "vLLM's kv_cache_memory_bytes when it was given, else the engine's num_gpu_blocks x the capacity "
            "model's bytes per block, else an engine's reported tokens x the model's bytes per token, else the "
            "capacity model's budget; `source` says which.",
            labels=[*SERIES_LABELS, "source"])
        finding = GaugeMetricFamily(
            "kvwatch_capacity_finding",
            f"1 when a capacity finding's condition has held on every poll for {SUSTAINED_SECONDS:g} s (poll "
            f"clock), else 0: finding=kv_usage_stuck (KV usage >= {STUCK_USAGE:.0%} with nothing running: blocks not "
            "freed, vllm issue 27073), finding=request_exceeds_pool (requests waiting, nothing running, KV usage "
            f"<= {EMPTY_USAGE:.0%}: the head of the queue needs more KV than the whole pool, vllm issue 39734). "
            "Same conditions as `kvwatch check`'s findings.",
            labels=[*SERIES_LABELS, "finding"])
        for (model_name, engine), result in sorted(results.items()):
            if result.formula_kv_capacity_tokens is not None:
                formula.add_metric([model_name, engine], float(result.formula_kv_capacity_tokens))
            for scenario, ceiling in result.whatif_max_concurrency.items():
                whatif.add_metric([model_name, engine, scenario], ceiling)
            for finding_id, value in sorted(result.findings.items()):
                finding.add_metric([model_name, engine, finding_id], value)
            if result.source != "unknown" or result.formula_kv_capacity_tokens is not None:
                source.add_metric([model_name, engine, result.source], 1.0)
            if result.pool_bytes is not None and result.pool_source is not None:
                pool.add_metric([model_name, engine, result.pool_source], result.pool_bytes)
        yield formula
        yield whatif
        yield source
        yield pool
        yield finding


def make_analyzer(settings: ServeSettings, capacity: CapacityResolver) -> CapacityAnalyzer:
    return CapacityAnalyzer(settings, capacity)
