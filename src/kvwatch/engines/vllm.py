"""vLLM adapter: detect the generation, resolve each concept to the name present, one Reading per series.

Detection reports a range, never a guess: every vLLM era (``ERAS``) whose metrics could have produced the
payload. Each piece of evidence rules eras out: a family, a ``cache_config_info`` label or an ``engine`` label
that an era never emits, an exact HELP phrase (V0's "currently running on GPU", the "DEPRECATED" gpu_* names),
and, in a whole payload only (running, waiting and a usage gauge present), a family every vLLM of an era
emits but that is missing. A partial payload therefore gets a wide range (``>=0.8.5`` for a lone
``num_requests_running{engine=...}``) or ``unknown``; the table and its sources are in docs/metrics.md.

Combining duplicates: in multiprocess mode (``--api-server-count > 1``) gauges without a multiprocess mode
carry a ``pid`` label, one sample per API-server process: ``kv_cache_usage_perc`` in vLLM 0.9.2-0.11.0
(``vllm/v1/metrics/loggers.py``; 0.11.1 declares it ``mostrecent``, as running and waiting are by 0.9.2).
Each copy is a whole-engine snapshot, not a share, and may be arbitrarily old: the engine's scheduler returns
each step's stats to only one front-end (``vllm/v1/core/sched/scheduler.py``, "Return stats to only one of the
front-ends"; client 0 in a step with no request output), and only that process sets its copy. The newest of the
copies is the engine's value, and the payload does not say which one that is. So copies that all hold one value
collapse to it; the usage copies of an engine with requests running are recent (each front-end gets the stats of
the steps with its outputs) and read as the largest when they lie within PID_USAGE_SPREAD of each other; other
copies that disagree leave the series' value unknown
(None, not NaN: it is not an implausible value) rather than a guess. Summing would count the same requests once
per process. With usage in pid copies, the old name ``gpu_cache_usage_perc`` (``mostrecent``) is read instead
when the page has it. Identical
series repeated in a payload never get here: the parser rejects such a payload (:mod:`kvwatch.exposition`).

Capacity per engine: ``kv_cache_size_tokens`` when vLLM reports it, else
``num_gpu_blocks / n_engines × block_size``, because vLLM sums ``num_gpu_blocks`` over data-parallel engines
(on hybrid models ``block_size`` is rewritten, so this fallback over-states; only the reported value is exact).
Label values ``"None"`` read as unknown.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from kvwatch.engines import Selector, SourceOverrides, UnrecognisedPayload
from kvwatch.engines.series import (
    differing_labels,
    engine_order,
    latency_for,
    latency_index,
    sample_named,
    underscore_escaped,
)
from kvwatch.exposition import Exposition, Sample
from kvwatch.model import CAPACITY_UNDETERMINED, VLLM, Detection, Poll, Reading, SeriesKey
from kvwatch.plausible import MAX_COUNT

__all__ = ["ERAS", "FAMILIES", "UnrecognisedPayload", "detect", "eras_in_range", "format_range", "possible_eras",
           "read", "wanted_for"]

KV_USAGE = "vllm:kv_cache_usage_perc"
GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
NIXL_PREFIX = "vllm:nixl_"  # the NIXL KV connector's transfer metrics (PD disaggregation)
SWAPPED = "vllm:num_requests_swapped"
CPU_CACHE_USAGE = "vllm:cpu_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
SUCCESS = "vllm:request_success_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
OLD_PREFIX_QUERIES = "vllm:gpu_prefix_cache_queries_total"
OLD_PREFIX_HITS = "vllm:gpu_prefix_cache_hits_total"
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
CACHE_CONFIG = "vllm:cache_config_info"
SLEEP_STATE = "vllm:engine_sleep_state"
PROCESS_START = "process_start_time_seconds"
LATENCY = {  # kind -> families, newest name first
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "queue": ("vllm:request_queue_time_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
}
LENGTHS = {"prompt": (REQUEST_PROMPT_TOKENS,), "generation": (REQUEST_GENERATION_TOKENS,)}
LENGTH_FAMILIES: frozenset[str] = frozenset({REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS})
LENGTH_SUMS: frozenset[str] = frozenset(
    family + suffix for family in LENGTH_FAMILIES for suffix in ("_sum", "_count"))
"""Of the two token histograms ``kvwatch serve`` reads only these samples; their buckets (``Reading.lengths``)
only when asked (``engines.detect.wanted_for(lengths=True)``: the backtest, the tests)."""

FAMILIES: frozenset[str] = frozenset({
    KV_USAGE, GPU_CACHE_USAGE, RUNNING, WAITING, WAITING_BY_REASON, SWAPPED, CPU_CACHE_USAGE, PREEMPTIONS, SUCCESS,
    PROMPT_TOKENS, GENERATION_TOKENS, PREFIX_QUERIES, PREFIX_HITS, OLD_PREFIX_QUERIES, OLD_PREFIX_HITS,
    REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS, CACHE_CONFIG, SLEEP_STATE, PROCESS_START,
    *(f for families in LATENCY.values() for f in families),
})
"""Every family the adapter reads; pass ``wanted_for(overrides)`` to :func:`kvwatch.exposition.parse`."""


SAMPLE_SUFFIXES = ("_count", "_sum", "_bucket", "_total")
"""How a histogram, summary or counter sample name extends its family's name."""


def families_of(name: str) -> set[str]:
    """The family names a sample called ``name`` may belong to: itself, or it minus a sample suffix."""
    return {name} | {name[: -len(suffix)] for suffix in SAMPLE_SUFFIXES if name.endswith(suffix)}


def wanted_for(overrides: SourceOverrides | None = None, *, adapter: bool = True) -> frozenset[str]:
    """The parser's filter (family and sample names): the adapter's families (the token histograms with their
    buckets, ``Reading.lengths``), and every family an override's sample may be in
    (``--waiting-metric proxy_queue_count`` needs the family ``proxy_queue``); ``adapter=False``: only the
    overrides'."""
    names: set[str] = set()
    if adapter:
        names = set(FAMILIES)
    for name in overrides.names() if overrides else ():
        names |= families_of(name)
    return frozenset(names)


def detect(exposition: Exposition, overrides: SourceOverrides | None = None) -> Detection:
    """Which vLLM generation wrote ``exposition``; raises UnrecognisedPayload when it is not vLLM."""
    overrides = overrides or SourceOverrides()
    override_present = any(f in exposition for n in overrides.names() for f in families_of(n))
    if not override_present and not any(n.startswith("vllm:") for n in exposition.names):
        raise UnrecognisedPayload("no vllm:* metrics in the payload (is the target a vLLM /metrics endpoint?)")
    version = format_range(possible_eras(exposition))
    usage = _usage_name(exposition, overrides)
    return Detection(engine_kind=VLLM, version_range=version, usage_metric=usage)


def _usage_name(exposition: Exposition, overrides: SourceOverrides) -> str | None:
    if overrides.usage is not None:
        return str(overrides.usage)
    for name in (KV_USAGE, GPU_CACHE_USAGE):
        if exposition.samples(name):
            return name
    return None


def read(exposition: Exposition, overrides: SourceOverrides | None = None, *, timestamp: float,
         max_series: int | None = None, refused_engines: Collection[str] | None = frozenset()) -> Poll:
    """One :class:`Poll` from a parsed vLLM payload: a Reading per ``(model_name, engine)``, for the first
    ``max_series`` of them, those with a KV usage sample first, each group in (model_name, engine) order; the rest
    are counted in ``Poll.series_dropped``. ``refused_engines``: the engines of the series the parse's cap left out
    (kvwatch.engines.detect.SeriesLimit), which the page's engine count includes; None: too many to count, so the
    capacity vLLM sums over them is unknown."""
    overrides = overrides or SourceOverrides()
    detection = detect(exposition, overrides)
    usage = overrides.usage or _first_present(exposition, KV_USAGE, GPU_CACHE_USAGE)
    running = overrides.running or Selector(RUNNING)
    waiting = overrides.waiting or Selector(WAITING)

    usage_samples = _selected(exposition, usage)
    running_samples = _selected(exposition, running)
    waiting_samples = _selected(exposition, waiting)
    keys = _series_keys((usage_samples, running_samples, waiting_samples))
    if not keys:
        escaped = underscore_escaped(exposition, "vllm:")
        if escaped is not None:
            raise UnrecognisedPayload(escaped)
        raise UnrecognisedPayload(
            f"vLLM payload has no {usage or KV_USAGE}, {running} or {waiting} samples "
            "(engine still starting, or renamed: see --usage-metric)"
        )

    configs, conflicted = _cache_configs(exposition)
    # vLLM sums num_gpu_blocks over the data-parallel engines a front-end runs, each of which has its own label set;
    # the one engine="" set of a 0.11 development line stands for them all: its engines are the series'. Beside
    # engines' own sets it is none of theirs (each engine has its own blocks). A page whose engines lack some of
    # their sets still sums over all of them (one set of two engines' page read the sum as engine 0's).
    # (those the series cap left out count too; None: too many to count, and a sum over them cannot be divided)
    engines_with_sets = len(configs.keys() - {None})
    page_engines = None if refused_engines is None else max(1, len({key[1] for key in keys} | set(refused_engines)))
    shared = not engines_with_sets and None in configs and configs[None].get("engine") == ""
    n_engines: int | None = 1
    if engines_with_sets:
        n_engines = None if page_engines is None else max(engines_with_sets, page_engines)
    elif shared:
        n_engines = page_engines
    prefix_queries, prefix_hits, prefix_unit = _prefix_families(exposition, detection.version_range)
    process_start = _process_start(exposition)

    prompt_sum, prompt_count, generation_sum, generation_count = (
        sample_named(exposition, family, family + suffix)
        for family in (REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS) for suffix in ("_sum", "_count"))
    index = {name: _split(exposition.samples(name)) for name in (
        WAITING_BY_REASON, SWAPPED, PREEMPTIONS, SUCCESS, PROMPT_TOKENS, GENERATION_TOKENS, SLEEP_STATE)}
    usage_idx, running_idx, waiting_idx = _split(usage_samples), _split(running_samples), _split(waiting_samples)
    if overrides.usage is None and usage is not None and usage.name == KV_USAGE and \
            any("pid" in s.labels for s in usage_samples):
        # 0.9.2-0.10.x also export the old name, declared mostrecent: one current copy of the same figure. Read
        # whenever the new one comes in pid copies (not only when they disagree: the source must not flip per poll).
        current = _selected(exposition, Selector(GPU_CACHE_USAGE))
        if current and not any("pid" in s.labels for s in current):
            usage, usage_samples = Selector(GPU_CACHE_USAGE), current
            usage_idx = _split(current)
            detection = replace(detection, usage_metric=GPU_CACHE_USAGE)
    _refuse_aggregated(((usage, usage_idx, overrides.usage is not None and "--usage-metric"),
                        (running, running_idx, overrides.running is not None and "--running-metric"),
                        (waiting, waiting_idx, overrides.waiting is not None and "--waiting-metric")))
    unsplit = {}
    for field, selector, gauge in (("kv_usage_ratio", usage, usage_idx), ("requests_running", running, running_idx),
                                   ("requests_waiting", waiting, waiting_idx)):
        why = _unsplittable(selector, gauge, keys)
        if why is not None:
            gauge.clear()  # (unknown for each series: one figure for several cannot be split over them)
            unsplit[field] = why
    prompt_sum, prompt_count, generation_sum, generation_count = (
        _split(x) for x in (prompt_sum, prompt_count, generation_sum, generation_count))
    queries_idx, hits_idx = _split(prefix_queries), _split(prefix_hits)
    latency = latency_index(exposition, LATENCY, lambda labels: (_model_of(labels), labels.get("engine") or None))
    lengths = latency_index(exposition, LENGTHS, lambda labels: (_model_of(labels), labels.get("engine") or None))
    # A waiting request holds no blocks, except one whose KV a connector is receiving (a PD decode server allocates
    # its blocks first, scheduler.py's WAITING_FOR_REMOTE_KV); from 0.20 those are counted apart (reason="deferred"),
    # before, a page with NIXL's transfer metrics (NixlPromMetrics, vllm:nixl_*) cannot say which waiting ones hold KV.
    transfers_in_queue = not exposition.samples(WAITING_BY_REASON) and any(
        name.startswith(NIXL_PREFIX) for name in exposition.names)
    readings = []
    # The series with a KV usage sample first: a label explosion's model names ("a1", "a2", ...) sorted ahead of the
    # engine's own and pushed it past --max-series, its usage gone while kvwatch_up read 1.
    ordered = sorted(keys, key=lambda key: (not (usage_idx.get(key) or _for_key(usage_idx, key)), engine_order(key)))
    dropped = max(0, len(ordered) - max_series) if max_series is not None else 0
    for key in ordered[:len(ordered) - dropped]:
        config = _config_for(configs, key)
        # (the page holds two configurations for this engine: its capacity is unknown, never the formula's either)
        conflict = _config_key(configs, key) in conflicted
        finished = _by_label(index[SUCCESS], key, "finished_reason", sum)
        capacity, blocks, block_size, concurrency = _capacity(config, n_engines)
        running_now = _combine(running_idx, key, sum)
        readings.append(Reading(
            model_name=key[0],
            engine=key[1],
            kv_usage_ratio=_combine(usage_idx, key, max, busy=bool(running_now)),
            requests_running=running_now,
            requests_waiting=_combine(waiting_idx, key, sum),
            # (an operator's --waiting-metric replaces vLLM's queue, and vLLM's split of it with it)
            waiting_by_reason=(_by_label(index[WAITING_BY_REASON], key, "reason", sum) if overrides.waiting is None
                               else MappingProxyType({})),
            requests_swapped=_combine(index[SWAPPED], key, sum),
            preemptions_total=_combine(index[PREEMPTIONS], key, sum),
            finished_by_reason=finished,
            prompt_tokens_total=_combine(index[PROMPT_TOKENS], key, sum),
            generation_tokens_total=_combine(index[GENERATION_TOKENS], key, sum),
            prefix_cache_queries_total=_combine(queries_idx, key, sum),
            prefix_cache_hits_total=_combine(hits_idx, key, sum),
            prefix_cache_unit=prefix_unit if prefix_queries else None,
            request_prompt_tokens_sum=_combine(prompt_sum, key, sum),
            request_prompt_tokens_count=_combine(prompt_count, key, sum),
            request_generation_tokens_sum=_combine(generation_sum, key, sum),
            request_generation_tokens_count=_combine(generation_count, key, sum),
            kv_capacity_tokens=capacity,
            kv_max_concurrency=concurrency,
            num_gpu_blocks=blocks,
            block_size=block_size,
            gpu_memory_utilization=label_number(config.get("gpu_memory_utilization")),
            cache_config=MappingProxyType(dict(config)),
            capacity_source=CAPACITY_UNDETERMINED if conflict else None,
            process_start_time_seconds=process_start,
            latency=latency_for(latency, key),
            lengths=latency_for(lengths, key),
            requests_aborted_total=finished.get("abort"),
            sleep_state=_sleep_state(_by_label(index[SLEEP_STATE], key, "sleep_state", max)),
            tokens_counted_every_step=True,
            waiting_holds_no_kv=not transfers_in_queue,
        ))
    capacity_name = "vllm:cache_config_info{kv_cache_size_tokens}" if any(
        "kv_cache_size_tokens" in c for c in configs.values()) else (
        "vllm:cache_config_info{num_gpu_blocks x block_size}" if any(
            label_number(c.get("num_gpu_blocks")) is not None and label_number(c.get("block_size")) is not None
            for c in configs.values()) else (
            "vllm:cache_config_info{num_gpu_blocks_override x block_size}" if any(
                override_blocks(c) and label_number(c.get("block_size")) is not None for c in configs.values())
            else None))
    detection = replace(detection, running_metric=str(running) if running_samples else None,
                        waiting_metric=str(waiting) if waiting_samples else None, capacity_metric=capacity_name)
    undetermined = tuple((r.key, "kv_usage_ratio", _usage_undetermined(usage, usage_samples, r.key))
                         for r in readings if r.kv_usage_ratio is None and usage_idx.spreads
                         and _disagrees(usage_idx, r.key))
    undetermined += tuple((r.key, "kv_capacity_tokens", CONFLICTING_CONFIGS) for r in readings
                          if r.capacity_source == CAPACITY_UNDETERMINED)
    undetermined += tuple((r.key, field, why) for field, why in unsplit.items() for r in readings)
    declared = next((name for name in (KV_USAGE, GPU_CACHE_USAGE) if name in exposition), None)
    if usage is None and declared is not None:  # (--usage-metric would not help: the name is right)
        undetermined += tuple((r.key, "kv_usage_ratio", f"KV usage is unknown: {declared} is declared with no "
                               "sample (not set yet by the exporter, or the page was cut short); --usage-metric would "
                               "name the same metric") for r in readings)
    return Poll(timestamp=timestamp, detection=detection, readings=tuple(readings), series_dropped=dropped,
                undetermined=undetermined)


def _usage_undetermined(usage: Selector | None, samples: list[Sample], key: SeriesKey) -> str:
    """Why a series' usage is unknown when its ``pid`` copies disagree (see the module doc), naming them."""
    copies = ", ".join(f"pid {s.labels['pid']}: {s.value:g}" for s in samples
                       if "pid" in s.labels and _model_of(s.labels) in (key[0], None)
                       and (s.labels.get("engine") or None) in (key[1], None))
    return (f"KV usage is unknown: {usage} has one copy per API-server process ({copies}) and they disagree (while "
            "nothing runs, or by more than a busy engine's recent copies do). vLLM gives each step's stats to one "
            "front-end only, so a front-end without requests keeps an old figure, and the page does not say which "
            "copy is current (vLLM 0.9.2-0.11.0 with --api-server-count > 1; while requests run and the copies lie "
            f"within {PID_USAGE_SPREAD:.0%} of the cache of each other, kvwatch takes the largest). "
            "kvwatch reads vllm:gpu_cache_usage_perc instead when the page has it without pid copies (the same "
            "figure, one current copy; 0.11.0 shows it with --show-hidden-metrics-for-version=0.10), or upgrade to "
            "vLLM >= 0.11.1.")


# ---------------------------------------------------------------- helpers

def _first_present(exposition: Exposition, *names: str) -> Selector | None:
    for name in names:
        if exposition.samples(name):
            return Selector(name)
    return None


def _selected(exposition: Exposition, selector: Selector | None) -> list[Sample]:
    if selector is None:
        return []
    samples = exposition.samples(selector.name)
    if not samples:
        # An override may name a histogram/summary sample or a counter declared oddly: look it up by sample name.
        samples = [s for f in exposition for s in f.samples if s.name == selector.name]
    return [s for s in samples if selector.matches(s.labels)] if selector.labels else samples


def _model_of(labels: Mapping[str, str]) -> str | None:
    """The served model: ``model_name``, or ``model`` where Triton's vLLM backend puts it (its ``vllm:*`` gauges
    are labelled ``{model, version}``, triton-inference-server/vllm_backend ``src/utils/metrics.py``)."""
    return labels.get("model_name") or labels.get("model") or None


def _key_of(labels: dict[str, str]) -> SeriesKey:
    return (_model_of(labels) or "", labels.get("engine") or "0")  # an empty label is no label (Prometheus)


def _series_keys(groups: Iterable[list[Sample]]) -> set[SeriesKey]:
    keys = {_key_of(s.labels) for group in groups for s in group}
    named = {k for k in keys if k[0]}
    # A proxy-renamed metric without model_name joins the named series instead of inventing one.
    if named:
        return named
    return {("unknown", k[1]) for k in keys}


class _Index(dict[tuple[str | None, str | None], list[Sample]]):
    """Samples by (model_name, engine); ``partial`` when some sample lacks one of the two labels; ``spreads``: the
    groups holding a series whose ``pid`` copies differ (:func:`_dedupe`), by how far (largest minus smallest)."""

    partial = False
    spreads: dict[tuple[str | None, str | None], float]

    def __init__(self) -> None:
        super().__init__()
        self.spreads = {}


def _split(samples: list[Sample]) -> _Index:
    """Samples by (model_name, engine), None where the label is absent (such samples apply to every series);
    each group already reduced to one sample per series (:func:`_dedupe`), once per poll, not per reading."""
    index = _Index()
    multiprocess = False
    for s in samples:
        labels = s.labels
        # An empty label value is no label (Prometheus' rule): model_name="" applies to every series too.
        key = (_model_of(labels), labels.get("engine") or None)
        group = index.get(key)
        if group is None:
            index[key] = [s]
        else:
            group.append(s)
            multiprocess = multiprocess or "pid" in labels or "pid" in group[0].labels
    for key, group in index.items():
        if multiprocess and len(group) > 1:
            index[key], spread = _dedupe(group)
            if spread:
                index.spreads[key] = spread
        if key[0] is None or key[1] is None:
            index.partial = True
    return index


def _refuse_aggregated(gauges: Iterable[tuple[Selector | str | None, _Index, str | bool]]) -> None:
    """One engine has one sample of each gauge (``pid`` copies already collapsed). Several that differ in another
    label (``instance``, a router's ``server``) are several servers on one page, a federated or router /metrics:
    no figure of it describes one engine (summed running over one pod's usage made a ceiling twice too high), so
    the page is refused with the label that tells them apart. So is a sample without ``model_name`` or ``engine``
    (or with it empty) beside samples that have it: it would apply to each of them (a copy without ``engine`` of
    34 running was added to both engines' 16 and 18, with ``kvwatch_up`` 1). An operator's override that selects
    several samples is told to narrow its selector instead."""
    for selector, index, flag in gauges:
        if index.partial:
            _refuse_partial_beside_labelled(selector, index, flag)
        for (model, engine), group in index.items():
            if len(group) < 2:
                continue
            differing = differing_labels(group)
            if flag:
                raise UnrecognisedPayload(
                    f"{flag} {selector} selects {len(group)} samples for one engine that differ in "
                    f"{', '.join(differing) or 'nothing'}: add a label selector, e.g. "
                    f"{getattr(selector, 'name', selector)}{{{differing[0] if differing else 'label'}=\"...\"}}")
            raise UnrecognisedPayload(
                f"{selector} has {len(group)} samples for one engine "
                f"(model_name={model or '?'}, engine={engine or '?'}) that differ in "
                f"{', '.join(differing) or 'nothing'}: this page aggregates several servers (federated, router or "
                "proxy /metrics); point kvwatch at one vLLM server's /metrics")


def _refuse_partial_beside_labelled(selector: Selector | str | None, index: _Index, flag: str | bool) -> None:
    """Refuses a gauge whose samples without ``model_name`` or ``engine`` would join a series that has a sample of
    its own (:func:`_for_key` reads every group that applies to a series): ``(m, None)`` beside ``(m, "1")``, or
    ``(None, None)`` beside anything. A family with the label on none of its samples joins without a word."""
    keys = list(index)
    for i, (model, engine) in enumerate(keys):
        for other_model, other_engine in keys[i + 1:]:
            if (model is None or other_model is None or model == other_model) and \
                    (engine is None or other_engine is None or engine == other_engine):
                pairs = (("model_name", model, other_model), ("engine", engine, other_engine))
                missing = [label for label, a, b in pairs if (a is None) != (b is None)]
                where = f"{flag} {selector}" if flag else str(selector)
                raise UnrecognisedPayload(
                    f"{where} has samples without {' or '.join(missing)} beside samples with it "
                    f"({model or other_model or '?'}, engine {engine or other_engine or '?'}): they would be counted "
                    "into every engine's figure; this page aggregates (a proxy's or a gateway's /metrics), point "
                    "kvwatch at one vLLM server's /metrics" + (", or narrow the selector" if flag else ""))


def _unsplittable(selector: Selector | str | None, index: _Index, keys: Iterable[SeriesKey]) -> str | None:
    """Why a gauge without ``engine`` (or ``model_name``) on any sample cannot be read on a page whose other gauges
    have several engines (models), or None: its one figure would count for each of them (a gateway's 34 running,
    --running-metric router_running, read 34 on both engines of 16 and 18, the ceiling doubled)."""
    if not index:
        return None
    for label, position in (("engine", 1), ("model_name", 0)):
        values = sorted({key[position] for key in keys})
        if len(values) > 1 and all(k[position] is None for k in index):
            return (f"{selector} has no {label} label while the page has {label}s {', '.join(values)}: one figure for "
                    "all of them cannot be split, so it is unknown for each (a gateway's count, or a proxy that "
                    "dropped the label); point kvwatch at one vLLM server's /metrics, or name a gauge that has the "
                    "label")
    return None


def _for_key(index: _Index, key: SeriesKey) -> list[Sample]:
    """The samples that apply to one series. Groups differ in which of model_name/engine their samples carry,
    so no series is in two groups and the concatenation needs no second dedupe."""
    if not index.partial:
        return index.get(key, [])  # type: ignore[arg-type]
    model, engine = key
    return [s for k in ((model, engine), (model, None), (None, engine), (None, None)) for s in index.get(k, ())]


def _dedupe(samples: list[Sample]) -> tuple[list[Sample], float]:
    """One sample per series (the largest copy), and how far the copies of a series spread (largest minus smallest;
    0 when they agree, NaN included; inf when a NaN copy stands beside a number): copies that differ only in
    multiprocess mode's ``pid`` collapse to one; when they disagree the series' value is unknown unless
    ``_combine`` may read the largest (see the module doc). The parser has already refused identical series, so
    without ``pid`` there is nothing to collapse."""
    if not any("pid" in s.labels for s in samples):
        return list(samples), 0.0
    by_labels: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {}
    lowest: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    spread = 0.0
    for s in samples:
        if "pid" not in s.labels:
            by_labels[(s.name, tuple(sorted(s.labels.items())))] = s
            continue
        key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "pid")))
        seen = by_labels.setdefault(key, s)
        low = lowest.setdefault(key, s.value)
        if math.isnan(seen.value) != math.isnan(s.value):
            spread = math.inf
        elif not math.isnan(s.value):
            lowest[key] = min(low, s.value)
            if s.value > seen.value:
                by_labels[key] = s
            spread = max(spread, by_labels[key].value - lowest[key])
    return list(by_labels.values()), spread


# How far apart two recent KV usage copies of a busy engine may be (one scheduler step moves usage by a prefill or
# a finished request: a few percent); farther, one copy is stale (a front-end with no requests keeps its last).
PID_USAGE_SPREAD = 0.05


def _close(index: _Index, key: SeriesKey) -> bool:
    model, engine = key
    return all(index.spreads.get(k, 0.0) <= PID_USAGE_SPREAD
               for k in ((model, engine), (model, None), (None, engine), (None, None)))


def _disagrees(index: _Index, key: SeriesKey) -> bool:
    """Whether a group that applies to ``key`` holds ``pid`` copies that disagree (:func:`_dedupe`)."""
    model, engine = key
    return any(k in index.spreads for k in ((model, engine), (model, None), (None, engine), (None, None)))


def _combine(index: _Index, key: SeriesKey, how: Callable[[Iterable[float]], float],
             busy: bool = False) -> float | None:
    """The series' value; None when it has no sample, or pid copies that disagree, unless ``busy`` (requests
    running) and the copies lie within :data:`PID_USAGE_SPREAD` of each other: front-ends that serve requests
    get stats every few steps, so their copies are recent and close, and the largest is taken; a copy far from
    the others is one a front-end without requests kept from an earlier spell, and which is current is unknown."""
    samples = index.get(key) if not index.partial else _for_key(index, key)  # (the common case inline)
    if not samples or (index.spreads and _disagrees(index, key) and not (busy and _close(index, key))):
        return None
    if len(samples) == 1:
        return float(samples[0].value)
    values = [s.value for s in samples]
    values = [v for v in values if not math.isnan(v)] or values
    return float(how(values))


def _by_label(index: _Index, key: SeriesKey, label: str,
              how: Callable[[Iterable[float]], float]) -> MappingProxyType[str, float]:
    if index.spreads and _disagrees(index, key):
        return MappingProxyType({})  # one part unknown: the split is unknown
    groups: dict[str, list[float]] = {}
    for s in _for_key(index, key):
        value = s.labels.get(label)
        if value is not None:
            groups.setdefault(value, []).append(s.value)
    return MappingProxyType({k: float(how(v)) for k, v in sorted(groups.items())})


def _sleep_state(states: Mapping[str, float]) -> str | None:
    """vllm:engine_sleep_state's one-hot labels (its HELP: "awake = 0 means engine is sleeping; ...
    weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2") as one state."""
    for state in ("awake", "weights_offloaded", "discard_all"):
        if states.get(state) == 1:
            return state
    return "asleep" if states.get("awake") == 0 else None


def _process_start(exposition: Exposition) -> float | None:
    """The engine's process start time. On a page merged from two (KServe's queue-proxy: its own unlabelled, the
    server's labelled) the labelled copies, whatever the order; copies that disagree leave it unknown."""
    samples = exposition.samples(PROCESS_START)
    if len(samples) > 1:
        samples = [s for s in samples if s.labels]
    values = {s.value for s in samples}
    return values.pop() if len(values) == 1 else None


def _prefix_families(exposition: Exposition, version: str) -> tuple[list[Sample], list[Sample], str | None]:
    if exposition.samples(PREFIX_QUERIES):
        return exposition.samples(PREFIX_QUERIES), exposition.samples(PREFIX_HITS), "tokens"
    queries = exposition.samples(OLD_PREFIX_QUERIES)
    if not queries:
        return [], [], None
    family = exposition.get(OLD_PREFIX_QUERIES)
    help_text = family.help if family else ""
    # 0.8.x counted blocks; 0.9-0.10 kept the old name but counted tokens (its help says so).
    eras = eras_in_range(version)
    unit = "tokens" if "token" in help_text else "blocks" if "block" in help_text else (
        "tokens" if eras <= TOKEN_PREFIX_ERAS else "blocks" if eras <= BLOCK_PREFIX_ERAS else None)
    return queries, exposition.samples(OLD_PREFIX_HITS), unit


CONFLICTING_CONFIGS = ("the page holds two different vllm:cache_config_info label sets for this engine (a proxy's "
                       "page of several pods?): its capacity is unknown, not one pod's")


def _cache_configs(exposition: Exposition) -> tuple[dict[str | None, dict[str, str]], set[str | None]]:
    """(cache_config_info labels per engine (``None`` when vLLM has no engine label), the engines with two). Two
    different label sets for one engine (a proxy's page of several pods, each with its engine "0") leave that
    engine's config empty: which pod's blocks belong to which model cannot be told, so its capacity is unknown, not
    the last pod's."""
    configs: dict[str | None, dict[str, str]] = {}
    conflicted: set[str | None] = set()
    for s in exposition.samples(CACHE_CONFIG):
        labels = dict(s.labels)
        # (kept in the labels: V1's carry it, V0's never do. A 0.11 development line wrote engine="" on its one
        # label set for every engine (PrometheusStatLogger.log_metrics_info): that is no engine's in particular.)
        engine = labels.get("engine") or None
        labels.pop("model_name", None)
        labels.pop("pid", None)
        if configs.get(engine, labels) != labels:
            conflicted.add(engine)
        configs[engine] = {} if engine in conflicted else labels
    return configs, conflicted


def _config_key(configs: dict[str | None, dict[str, str]], key: SeriesKey) -> str | None:
    """Which set a series reads: its engine's own, else the one without an engine (None)."""
    return key[1] if key[1] in configs else None


def _config_for(configs: dict[str | None, dict[str, str]], key: SeriesKey) -> dict[str, str]:
    """The set a series reads (:func:`_config_key`; empty where the page holds two for its engine: unknown, not the
    engine=\"\" one's)."""
    return configs.get(_config_key(configs, key)) or {}


# What Python's str() of an int or a float writes: float() also takes "20_48", " 2048" and full-width digits.
_LABEL_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def label_number(text: str | None) -> float | None:
    """A numeric ``cache_config_info`` label value; None for ``"None"``, empty, non-numeric or non-finite."""
    if text is None or not _LABEL_NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def _count_label(text: str | None) -> float | None:
    """A count label (blocks, tokens per block): :func:`label_number`, but NaN for a value that is there and no
    whole number (``abc``, ``inf``, ``12.5``): the plausibility check then drops it as impossible and counts it
    (kvwatch.plausible), instead of reading it as absent or as a fraction of a block."""
    if text is None or text in ("None", ""):
        return None
    value = label_number(text)
    return value if value is not None and value.is_integer() else math.nan


def engine_max_model_len(config: Mapping[str, str]) -> int | None:
    """The engine's ``--max-model-len``, from ``cache_config_info``: vLLM (>= 0.25, the versions that label
    ``kv_cache_size_tokens``) computes ``kv_cache_size_tokens = int(kv_cache_max_concurrency × max_model_len)``
    (docs/capacity.md, section 5), so the length is the smallest integer at or above tokens ÷ concurrency.
    None when either label is missing, or below one request (then the division does not pin one length), or the
    tokens no count can be (above 2^53: a 1e308 label made a 1e308-token length, and the plan's sums overflowed)."""
    tokens = label_number(config.get("kv_cache_size_tokens"))
    concurrency = label_number(config.get("kv_cache_max_concurrency"))
    if tokens is None or concurrency is None or tokens <= 0 or concurrency < 1 or tokens > MAX_COUNT:
        return None
    length = tokens / concurrency
    nearest = round(length)
    return int(nearest) if abs(length - nearest) < 1e-6 * length else math.ceil(length)


def override_blocks(config: Mapping[str, str]) -> float | None:
    """The engine's ``--num-gpu-blocks-override`` (``cache_config_info``), or None: when set, vLLM's pool is that
    many blocks whatever the memory (vllm/v1/core/kv_cache_utils.py ``may_override_num_blocks``), so nothing
    that frees memory (lighter weights, more tensor parallelism) adds KV while it is set."""
    value = label_number(config.get("num_gpu_blocks_override"))
    return value if value is not None and value > 0 else None


def _capacity(config: dict[str, str],
              n_engines: int | None) -> tuple[float | None, float | None, float | None, float | None]:
    """(capacity tokens, gpu blocks, block size, max concurrency), all per engine. Without ``num_gpu_blocks`` (0.8.x
    labels before the engine core reports it) a ``--num-gpu-blocks-override`` is the count: vLLM takes it as is
    (``may_override_num_blocks``), per engine."""
    total_blocks = _count_label(config.get("num_gpu_blocks"))
    if total_blocks is None:
        blocks = override_blocks(config)
    else:  # (n_engines None: the page's engines are too many to count, so each one's share is unknown)
        blocks = total_blocks / n_engines if n_engines is not None else None
    block_size = _count_label(config.get("block_size"))
    capacity = label_number(config.get("kv_cache_size_tokens"))
    if capacity is None and blocks is not None and block_size is not None:
        capacity = blocks * block_size
    return capacity, blocks, block_size, label_number(config.get("kv_cache_max_concurrency"))


# ---------------------------------------------------------------- version detection

# vLLM releases grouped into eras whose metrics differ (docs/metrics.md, "How vLLM's metrics are read").
# (name, first release, last release); ``v0`` is the V0 engine, the default up to 0.7.x and opt-in to 0.10.
ERAS: tuple[tuple[str, str | None, str | None], ...] = (
    ("v0", None, "0.10"),
    ("0.7.3-0.8.4", "0.7.3", "0.8.4"),
    ("0.8.5-0.8.x", "0.8.5", "0.8.x"),
    ("0.9-0.10", "0.9", "0.10"),
    ("0.11", "0.11", "0.11"),
    ("0.12-0.13", "0.12", "0.13"),
    ("0.14-0.16", "0.14", "0.16"),
    ("0.17-0.20", "0.17", "0.20"),
    ("0.21-0.25", "0.21", "0.25"),
    ("0.26+", "0.26", None),
)
ERA_NAMES: tuple[str, ...] = tuple(name for name, _, _ in ERAS)

# Per era, in ERAS order: A = every vLLM of that era emits it, M = it may (a hidden or conditional family, or a
# release boundary the sources do not pin down), N = none does. Present evidence rules out the N eras; absent
# evidence rules out the A eras, and only where absence can be seen: family rows in a whole payload (running,
# waiting and a usage gauge all present), cache_config_info label rows wherever cache_config_info has a sample.
# From vLLM's vllm/v1/metrics/loggers.py and vllm/engine/metrics.py per release (the catalogue,
# kvwatch/data/vllm_catalogue.json, and docs/metrics.md).
# Families every vLLM release emits (the catalogue's profiles all have them): a payload without them is not
# a whole /metrics page, so what it lacks proves nothing.
ALWAYS_EMITTED = ("vllm:e2e_request_latency_seconds", "vllm:prompt_tokens_total", "vllm:request_success_total")
FAMILY_EVIDENCE: dict[str, str] = {
    SWAPPED: "MNNNNNNNNN",  # V0 only, hidden from 0.8 and gone from V0 by 0.9
    CPU_CACHE_USAGE: "MNNNNNNNNN",
    "vllm:gpu_prefix_cache_hit_rate": "MNNNNNNNNN",
    GPU_CACHE_USAGE: "AAAAMNNNNN",  # deprecated in 0.9-0.10, hidden in 0.11, removed in 0.12
    KV_USAGE: "NNNMAAAAAA",  # added in 0.9.2 (vllm PR 18354): 0.9.0 and 0.9.1 emit only the gpu_* name
    OLD_PREFIX_QUERIES: "NMMMMNNNNN",
    OLD_PREFIX_HITS: "NMMMMNNNNN",
    PREFIX_QUERIES: "NNNMMMMMMM",
    PREFIX_HITS: "NNNMMMMMMM",
    # Set unconditionally from 0.11.1 (vllm PR 27867; absent from the 0.11.0 wheel, present in 0.11.1's loggers.py)
    SLEEP_STATE: "NNNNMAAAAA",
    WAITING_BY_REASON: "NNNNNNNMMM",  # first in 0.20.0 (absent from the 0.19.0 wheel), so "may" for the 0.17-0.20 era
    "vllm:inter_token_latency_seconds": "NNNMMMMMMM",  # 0.10.1/0.10.2
    "vllm:request_time_per_output_token_seconds": "NNNNMMMMMM",  # 0.11
    "vllm:time_per_output_token_seconds": "MMMMMMMNNN",  # hidden in 0.12-0.13, absent in 0.16
    "vllm:request_prefill_kv_computed_tokens": "NNNNNMMMMM",  # 0.13
    "vllm:prompt_tokens_by_source_total": "NNNNNNMMMM",  # by 0.16
    "vllm:num_requests_kv_fetch_by_stage": "NNNNNNNNNM",  # by 0.32 (not 0.29; vllm/v1/metrics/loggers.py)
    "vllm:admission_rejections_total": "NNNNNNNNNM",  # by 0.32 (labels model_name and reason: no engine)
    "vllm:request_num_preemptions": "NNNNNNNNNM",
}
CACHE_LABEL_EVIDENCE: dict[str, str] = {
    "kv_cache_size_tokens": "NNNNNNNNMA",  # between 0.20.2 and 0.25.1
    "kv_cache_max_concurrency": "NNNNNNNNMA",
    "user_specified_block_size": "NNNNNNNMMM",  # 0.18.0 (read in its released wheel's vllm/config/cache.py)
    # V0's CacheConfig set swap_space_bytes alone; from 0.8.5 (a dataclass) __post_init__ sets it beside swap_space
    # (vllm-project/vllm#28924 quotes a real 0.11.0 line with both): alone, it is V0-or-0.8.4 (V0_SWAP_BYTES_ALONE).
    "swap_space_bytes": "MMMMMMMMNN",
    "swap_space": "MMMMMMMMNN",  # dropped in 0.18.0
    "cpu_offload_gb": "MMMMMMMMNN",
    "cpu_kvcache_space_bytes": "MNNMMMMMMM",  # 0.9.2
    "kv_cache_memory_bytes": "MNNMMMMMMM",  # 0.10.2
    "kv_offloading_backend": "NNNNMMMMMM",  # 0.11.1 (in its wheel's vllm/config/cache.py, not in 0.11.0's)
    # CacheConfig's fields from 0.26.0 and 0.32.0 (vllm_version_from_cache_config; they set the capacity rules too):
    # present, the page is 0.26 or later, which the range said ">=0.21" of. ("M": nothing is said of their absence.)
    "prefix_match_unit": "NNNNNNNNNM",
    "cache_hit_alignment_tokens": "NNNNNNNNNM",
    "enable_extensible_kv_cache": "NNNNNNNNNM",  # 0.34.0 (read in its wheel's vllm/config/cache.py)
}
V0_SWAP_BYTES_ALONE = "MMNNNNNNNN"  # swap_space_bytes without swap_space: CacheConfig before the 0.8.5 dataclass

# Labels whose presence tells the vLLM version (vllm_version_from_cache_config).
VERSION_LABELS = ("kv_cache_size_tokens", "kv_cache_max_concurrency", "user_specified_block_size",
                  "swap_space_bytes", "cpu_offload_gb", "swap_space", "kv_offloading_backend", "mamba_block_size",
                  "kv_cache_memory_bytes", "kv_sharing_fast_prefill", "cpu_kvcache_space_bytes", "prefix_match_unit",
                  "cache_hit_alignment_tokens", "enable_extensible_kv_cache", "engine")


def vllm_version_from_cache_config(labels: Mapping[str, str]) -> tuple[int, int] | None:
    """The vLLM version whose capacity rules apply, from the ``cache_config_info`` label set; None if unknown.

    ``CacheConfig`` gained and lost fields over time (docs/capacity.md, section 5, read in the released wheels):
    ``enable_extensible_kv_cache`` from 0.34.0,
    ``cache_hit_alignment_tokens`` from 0.32.0, ``prefix_match_unit`` from 0.26.0, ``kv_cache_size_tokens``
    from ~0.25 (the adapter reports ``>=0.21``), ``user_specified_block_size`` from 0.18.0, when ``cpu_offload_gb``
    and ``swap_space`` were dropped (0.18-0.20.x share that set: kvwatch applies 0.20's rules to it, and compares
    an engine's blocks with the formula's in blocks, whose rule did not change); ``kv_offloading_backend``/
    ``mamba_block_size`` appeared in 0.11.1 (0.12's rules apply to it: LongRoPE's default length came with it),
    ``kv_cache_memory_bytes``/``kv_sharing_fast_prefill`` in 0.10.2, ``cpu_kvcache_space_bytes`` in 0.9 and
    ``swap_space_bytes`` without ``swap_space`` is V0's. Finer than the eras the payload is detected in
    (:data:`CACHE_LABEL_EVIDENCE`): the detected range ``0.12-0.25`` spans several changes of the capacity rules.
    """
    if "enable_extensible_kv_cache" in labels:  # in CacheConfig from 0.34.0 (its extensible KV cache)
        return (0, 34)
    if "cache_hit_alignment_tokens" in labels:  # in CacheConfig from 0.32.0
        return (0, 32)
    if "prefix_match_unit" in labels:  # in CacheConfig from 0.26.0
        return (0, 26)
    if "kv_cache_size_tokens" in labels or "kv_cache_max_concurrency" in labels:
        return (0, 25)
    if "user_specified_block_size" in labels:  # 0.18.0 to 0.20.x
        return (0, 20)
    if "swap_space_bytes" in labels and "swap_space" not in labels:  # (0.8.5 to 0.19 set both)
        return (0, 7)
    if "cpu_offload_gb" in labels or "swap_space" in labels:
        if "kv_offloading_backend" in labels or "mamba_block_size" in labels:
            return (0, 12)
        if "engine" not in labels:
            # V1 adds an engine label to cache_config_info (its index, or "" on a 0.11 development line); the V0
            # engine (to 0.10, VLLM_USE_V1=0) never does, and shares no blocks among KV groups: its rules are 0.8's
            # whatever CacheConfig's fields say.
            return (0, 8)
        if "kv_cache_memory_bytes" in labels or "kv_sharing_fast_prefill" in labels:
            return (0, 10)
        if "cpu_kvcache_space_bytes" in labels:
            return (0, 9)
        return (0, 8)
    return None


# Samples of these families carry an ``engine`` label in every V1 from 0.8.5 and in no earlier vLLM.
ENGINE_LABELLED: tuple[str, ...] = (KV_USAGE, GPU_CACHE_USAGE, RUNNING, WAITING, WAITING_BY_REASON, PREEMPTIONS,
                                    SUCCESS, PROMPT_TOKENS, GENERATION_TOKENS, PREFIX_QUERIES, PREFIX_HITS,
                                    OLD_PREFIX_QUERIES, OLD_PREFIX_HITS, SLEEP_STATE)
V0_ERAS = frozenset({"v0"})
V1_ERAS = frozenset(ERA_NAMES) - V0_ERAS
BLOCK_PREFIX_ERAS = frozenset({"0.7.3-0.8.4", "0.8.5-0.8.x"})  # gpu_prefix_cache_* counted blocks
TOKEN_PREFIX_ERAS = frozenset({"0.9-0.10", "0.11"})  # the same names counted tokens


@functools.cache  # a pure function of two short strings, asked ~30 times a poll
def _eras(row: str, marks: str) -> frozenset[str]:
    return frozenset(name for name, mark in zip(ERA_NAMES, row, strict=True) if mark in marks)


def possible_eras(exposition: Exposition) -> frozenset[str]:
    """Every era that could have written ``exposition`` (empty when none could: not a vLLM we know)."""
    if _tritons_backend(exposition):
        return frozenset(ERA_NAMES)
    return _eras_of(*_evidence(exposition))


def _tritons_backend(exposition: Exposition) -> bool:
    """Whether Triton's vLLM backend wrote the page (series labelled ``{model, version}``, no ``model_name``): it
    defines the families itself, with V0's names and HELP texts whatever vLLM it runs, so they tell no version."""
    return any("version" in s.labels and "model" in s.labels and "model_name" not in s.labels
               for name in (RUNNING, WAITING) for s in exposition.samples(name))


def _evidence(exposition: Exposition) -> tuple[frozenset[str], bool, frozenset[str] | None, bool | None,
                                               frozenset[str]]:
    """What the eras are told from: the family names, whether the payload is whole (running, waiting and a
    usage gauge present, and families every vLLM emits beside them: a federated or filtered payload of a few
    gauges shows no absence), cache_config_info's label names (None without a sample), whether the
    engine-labelled families carry ``engine`` (None without a ``model_name`` sample) and what the HELP texts
    say. A sidecar sees the same evidence every poll, so the eras are computed once per distinct evidence."""
    whole = all(exposition.samples(n) for n in (RUNNING, WAITING)) and bool(
        exposition.samples(KV_USAGE) or exposition.samples(GPU_CACHE_USAGE)) and all(
        n in exposition.names for n in ALWAYS_EMITTED)
    configs = exposition.samples(CACHE_CONFIG)
    config_labels = frozenset().union(*(s.labels for s in configs)) if configs else None
    has_engine: bool | None = None
    for name in ENGINE_LABELLED:
        for s in exposition.samples(name):
            if _model_of(s.labels) is not None:
                has_engine = "engine" in s.labels
                if has_engine:
                    break
        if has_engine:
            break
    return exposition.names, whole, config_labels, has_engine, _help_eras(exposition)


@functools.lru_cache(maxsize=64)
def _eras_of(names: frozenset[str], whole: bool, config_labels: frozenset[str] | None, has_engine: bool | None,
             help_eras: frozenset[str]) -> frozenset[str]:
    eras = frozenset(ERA_NAMES)
    for name, row in FAMILY_EVIDENCE.items():
        if name in names:
            eras &= _eras(row, "AM")
        elif whole:
            eras -= _eras(row, "A")
    if config_labels is not None:
        for label, row in CACHE_LABEL_EVIDENCE.items():
            eras &= _eras(row, "AM") if label in config_labels else frozenset(ERA_NAMES) - _eras(row, "A")
        if "swap_space_bytes" in config_labels and "swap_space" not in config_labels:
            eras &= _eras(V0_SWAP_BYTES_ALONE, "AM")
    if has_engine is not None:
        eras &= frozenset(ERA_NAMES[2:]) if has_engine else frozenset(ERA_NAMES[:2])
    return eras & help_eras


def _help_eras(exposition: Exposition) -> frozenset[str]:
    """What the HELP texts tell (only exact phrases: multiprocess mode replaces HELP with its own)."""
    eras = frozenset(ERA_NAMES)
    running = exposition.get(RUNNING)
    if running is not None and "currently running on GPU" in running.help:
        eras &= V0_ERAS
    elif running is not None and "model execution batches" in running.help:
        eras &= V1_ERAS
    old = exposition.get(OLD_PREFIX_QUERIES)
    if old is not None and "DEPRECATED" in old.help:
        eras &= TOKEN_PREFIX_ERAS
    elif old is not None and "block" in old.help:
        eras &= BLOCK_PREFIX_ERAS
    gpu = exposition.get(GPU_CACHE_USAGE)
    if gpu is not None and "DEPRECATED" in gpu.help:
        eras &= TOKEN_PREFIX_ERAS
    return eras


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(99 if part == "x" else int(part) for part in release.split("."))


def format_range(eras: frozenset[str]) -> str:
    """``v0``, ``0.11``, ``0.9-0.10``, ``<=0.10``, ``>=0.21``, or ``unknown`` (no era, or every era)."""
    if not eras or eras == frozenset(ERA_NAMES):
        return "unknown"
    if eras == V0_ERAS:
        return "v0"
    chosen = [(lo, hi) for name, lo, hi in ERAS if name in eras]
    los = [lo for lo, _ in chosen]
    his = [hi for _, hi in chosen]
    lo = None if None in los else min((x for x in los if x is not None), key=_release_key)
    hi = None if None in his else max((x for x in his if x is not None), key=_release_key)
    if lo is None:
        return f"<={hi}"
    if hi is None:
        return f">={lo}"
    return lo if lo == hi else f"{lo}-{hi}"


def eras_in_range(text: str) -> frozenset[str]:
    """The eras a ``version_range`` string spans (the inverse of :func:`format_range`, for callers and tests)."""
    if text == "unknown":
        return frozenset(ERA_NAMES)
    if text == "v0":
        return V0_ERAS
    lo: str | None
    hi: str | None
    if text.startswith("<="):
        lo, hi = None, text[2:]
    elif text.startswith(">="):
        lo, hi = text[2:], None
    else:
        lo, _, hi = text.partition("-")
        hi = hi or lo
    out = set()
    for name, era_lo, era_hi in ERAS:
        above = lo is None or (era_lo is not None and _release_key(era_lo) >= _release_key(lo))
        below = hi is None or (era_hi is not None and _release_key(era_hi) <= _release_key(hi))
        if above and below:
            out.add(name)
    return frozenset(out)
