"""Shared plumbing of the SGLang and TensorRT-LLM adapters: samples grouped by series, one value per series.

Each adapter says how a sample's labels map to a series key ``(model, engine)`` (``None`` where the
label is absent: such a sample applies to every series, as a tokenizer-side counter without a rank
label does). Copies of one series that differ only in other labels (SGLang's ``tp_rank``/``pp_rank``/
``engine_type``/``priority``) are snapshots of the same engine, so they combine by maximum, never by sum:
summing would count one request once per tensor-parallel rank. SGLang's tokenizer-side request counters and
histograms are the exception (:meth:`Index.total`, ``parts_add``): their copies split the requests by
``is_streaming`` (0.5.2x), by each request's ``priority`` and by custom labels, so the parts add up; only copies
that differ in :data:`RANK_LABELS` are the same requests again. Copies that differ in a label naming a server
or a model version (:data:`SERVER_LABELS`: an SGLang gateway's ``worker_addr``, a federation's ``instance``,
Triton's ``version``) are other engines: :func:`refuse_several_servers` refuses the page. NaN reads as unknown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvwatch.engines import Selector, UnrecognisedPayload
from kvwatch.exposition import Exposition, Sample
from kvwatch.model import Histogram, SeriesKey

PartialKey = tuple[str | None, str | None]
KeyOf = Callable[[dict[str, str]], PartialKey]


@dataclass
class Index:
    """Samples of one family (or selector) by partial series key."""

    by_key: dict[PartialKey, list[Sample]] = field(default_factory=dict)

    @classmethod
    def of(cls, samples: Iterable[Sample], key_of: KeyOf) -> Index:
        index = cls()
        for s in samples:
            index.by_key.setdefault(key_of(s.labels), []).append(s)
        return index

    def __bool__(self) -> bool:
        return bool(self.by_key)

    def for_key(self, key: SeriesKey) -> list[Sample]:
        model, engine = key
        return [s for k in ((model, engine), (model, None), (None, engine), (None, None))
                for s in self.by_key.get(k, ())]

    def value(self, key: SeriesKey) -> float | None:
        """The series' value: the largest finite copy, NaN when every copy is NaN, None when absent."""
        values = [s.value for s in self.for_key(key)]
        if not values:
            return None
        finite = [v for v in values if not math.isnan(v)]
        return max(finite) if finite else values[0]

    def by_label(self, key: SeriesKey, label: str, *, parts_add: bool = False) -> dict[str, float]:
        """The series' value per value of ``label``; ``parts_add`` as in :meth:`total`."""
        groups: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
        for s in self.for_key(key):
            value = s.labels.get(label)
            if value is not None and not math.isnan(s.value):
                parts = groups.setdefault(value, {})
                part = _part_of(s.labels) if parts_add else frozenset()
                parts[part] = max(parts.get(part, s.value), s.value)
        return {value: sum(parts.values()) for value, parts in sorted(groups.items())}

    def total(self, key: SeriesKey) -> float | None:
        """The series' value where copies are disjoint parts of its requests (SGLang's tokenizer counters, split by
        ``is_streaming``, ``priority`` and custom labels): the parts add up, copies of one part on several ranks
        combine by maximum. NaN when every copy is NaN, None when absent."""
        samples = self.for_key(key)
        if not samples:
            return None
        parts: dict[frozenset[tuple[str, str]], float] = {}
        for s in samples:
            if not math.isnan(s.value):
                part = _part_of(s.labels)
                parts[part] = max(parts.get(part, s.value), s.value)
        return sum(parts.values()) if parts else samples[0].value

    def partial_keys(self) -> set[PartialKey]:
        return set(self.by_key)


# Labels that tell the ranks of one engine apart: their copies report the same requests (maximum, never sum).
RANK_LABELS = frozenset({"tp_rank", "pp_rank", "dp_rank", "moe_ep_rank", "attn_tp_rank", "attn_dp_rank"})


def _part_of(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    """Which part of a series' requests a sample counts: its labels but the ranks'."""
    return frozenset((k, v) for k, v in labels.items() if k not in RANK_LABELS)


# Labels that tell servers (or loaded model versions) apart, never the ranks of one engine: sgl-model-gateway's
# /engine_metrics adds worker_addr (metrics_aggregator.rs), a Prometheus federation instance/job, a proxy server
# or pod; Triton's tensorrtllm_backend reports each loaded version of a model as a metric group of its own.
SERVER_LABELS = frozenset({"worker_addr", "worker", "instance", "server", "pod", "host", "hostname", "endpoint",
                           "url", "version"})


def differing_labels(samples: Sequence[Sample], among: Iterable[str] | None = None) -> list[str]:
    """The labels (of ``among``, default all) whose values differ between copies of one series, sorted."""
    names = sorted(set(among) if among is not None else {k for s in samples for k in s.labels})
    return [k for k in names if len({s.labels.get(k) for s in samples}) > 1]


def refuse_several_servers(indexes: Iterable[tuple[str, Index]], labels: frozenset[str] = SERVER_LABELS) -> None:
    """UnrecognisedPayload when copies of one series differ in a server label (``labels``, default
    :data:`SERVER_LABELS`): their maximum made up an engine (one worker's usage beside another's running count)."""
    for name, index in indexes:
        for (model, engine), group in index.by_key.items():
            if len(group) < 2:
                continue
            differing = differing_labels(group, labels)
            if differing:
                raise UnrecognisedPayload(
                    f"{name} has samples for one engine (model {model or '?'}, engine {engine or '?'}) that differ in "
                    f"{', '.join(differing)}: this page holds several servers or model versions (a gateway's, a "
                    "federation's); point kvwatch at one engine's /metrics")


def selected(exposition: Exposition, selector: Selector) -> list[Sample]:
    """Samples a selector picks: by family name, else by sample name (``x_count`` of a histogram)."""
    samples = exposition.samples(selector.name)
    if not samples:
        samples = [s for f in exposition for s in f.samples if s.name == selector.name]
    return [s for s in samples if selector.matches(s.labels)]


def sample_named(exposition: Exposition, family: str, sample_name: str) -> list[Sample]:
    """The samples of ``family`` called ``sample_name`` (a histogram's ``_sum`` or ``_count``); a histogram's
    parts on a page without its ``# TYPE`` line are families of their own (``x_sum``), and are read there."""
    samples = exposition.samples(family)
    if not samples and sample_name != family:
        return exposition.samples(sample_name)
    return [s for s in samples if s.name == sample_name]


HISTOGRAM_PARTS = ("_bucket", "_count", "_sum")


def histogram_samples(exposition: Exposition, family: str) -> list[Sample]:
    """A histogram family's samples, or its parts where the page has no ``# TYPE`` line for it (a saved page with
    its comments stripped, some re-exporters): Prometheus reads ``x_bucket``, ``x_sum`` and ``x_count`` by name
    whatever the type, and the text format then makes each a family of its own."""
    return exposition.samples(family) or [s for part in HISTOGRAM_PARTS for s in exposition.samples(family + part)]


def decimal_index(text: str) -> int | None:
    """``text`` as a count or index where it is one (an engine, a rank, a parallel size: at most 18 digits once its
    leading zeros are gone; int() of a label of thousands of digits raised past Python's limit, an internal error),
    else None."""
    digits = text.strip()
    if not digits.isdecimal():
        return None
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else None


def engine_order(key: SeriesKey) -> tuple[str, int, str]:
    """A series' place: by model, then by engine index (engine "10" after "9"), a non-index engine last."""
    index = decimal_index(key[1])
    return (key[0], 1 << 62 if index is None else index, key[1])


def series_keys(indexes: Iterable[Index], default_engine: str = "0") -> list[SeriesKey]:
    """Every series the indexes name, sorted; a sample without a model label joins the named series."""
    partial = {k for index in indexes for k in index.partial_keys()}
    models = sorted({m for m, _ in partial if m})
    engines = {e for _, e in partial if e is not None} or {default_engine}
    if not models:
        models = ["unknown"]
    keys = {(m, e) for m in models for e in engines
            if any((pm in (m, None)) and (pe in (e, None)) for pm, pe in partial)}
    return sorted(keys, key=engine_order)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is unknown or the denominator is not positive."""
    if numerator is None or denominator is None or not denominator > 0:
        return None
    return numerator / denominator


def finished_by_reason(by_reason: Index, total: Index, key: SeriesKey) -> dict[str, float]:
    """Finished requests by ``finished_reason`` where the engine counts them so, else its one total of finished
    requests under reason ``all`` (later SGLang's ``num_requests_total``, TensorRT-LLM's iteration statistics)."""
    reasons = by_reason.by_label(key, "finished_reason")
    if reasons:
        return reasons
    count = total.total(key)
    return {"all": count} if count is not None else {}


def histograms(exposition: Exposition, family: str, key_of: KeyOf, *,
               parts_add: bool = False) -> dict[PartialKey, Histogram]:
    """A histogram family's series by partial key; of several copies of one key (ranks, processes) the one
    with the most observations (the copies are snapshots of one engine, as for gauges). With ``parts_add``
    copies that differ in other labels than :data:`RANK_LABELS` are disjoint parts (:meth:`Index.total`) and add
    up, bucket by bucket, when their bounds agree."""
    bucket_name, count_name, sum_name = family + "_bucket", family + "_count", family + "_sum"
    # One group per label set without ``le`` (the key follows from the labels). Runs every poll over every
    # bucket of the latency histograms, hence the plain loop: one frozenset per sample, the key per group.
    groups: dict[frozenset[tuple[str, str]], dict[str, Any]] = {}
    for s in histogram_samples(exposition, family):
        labels = s.labels
        le = labels.get("le")
        ident = frozenset(labels.items()) if le is None else frozenset(labels.items()) - {("le", le)}
        group = groups.get(ident)
        if group is None:
            group = groups[ident] = {"key": key_of(dict(ident)), "buckets": []}
        name = s.name
        if name == bucket_name and "le" in labels:
            try:
                group["buckets"].append((float(labels["le"]), s.value))
            except ValueError:
                continue
        elif name == count_name:
            group["count"] = s.value
        elif name == sum_name:
            group["sum"] = s.value
    parts: dict[PartialKey, dict[frozenset[tuple[str, str]], Histogram]] = {}
    for ident, group in groups.items():
        key = group["key"]
        buckets = sorted(group["buckets"])
        if not buckets or not math.isinf(buckets[-1][0]):
            continue
        hist = Histogram(tuple(b for b, _ in buckets), tuple(v for _, v in buckets),
                         group.get("count", buckets[-1][1]), group.get("sum", math.nan))
        by_part = parts.setdefault(key, {})
        part = _part_of(dict(ident)) if parts_add else frozenset()
        if part not in by_part or hist.count > by_part[part].count:
            by_part[part] = hist
    return {key: _added(list(by_part.values())) for key, by_part in parts.items()}


def _added(parts: list[Histogram]) -> Histogram:
    """Disjoint parts of one histogram, added bucket by bucket; the largest part alone when their bounds differ."""
    first = parts[0]
    if len(parts) == 1 or any(h.bounds != first.bounds for h in parts):
        return max(parts, key=lambda h: h.count)
    return Histogram(first.bounds, tuple(map(sum, zip(*(h.cumulative for h in parts), strict=True))),
                     sum(h.count for h in parts), sum(h.sum for h in parts))


def histogram_for(by_key: dict[PartialKey, Histogram], key: SeriesKey) -> Histogram | None:
    model, engine = key
    for k in ((model, engine), (model, None), (None, engine), (None, None)):
        if k in by_key:
            return by_key[k]
    return None


LatencyIndex = dict[str, dict[PartialKey, Histogram]]


def latency_index(exposition: Exposition, families: dict[str, tuple[str, ...]], key_of: KeyOf, *,
                  parts_add: bool = False) -> LatencyIndex:
    """Each latency kind's histograms: from the first of its candidate families the payload has."""
    out: LatencyIndex = {}
    for kind, candidates in families.items():
        for family in candidates:
            if histogram_samples(exposition, family):
                out[kind] = histograms(exposition, family, key_of, parts_add=parts_add)
                break
    return out


_NO_LATENCY: MappingProxyType[str, Histogram] = MappingProxyType({})


def latency_for(index: LatencyIndex, key: SeriesKey) -> MappingProxyType[str, Histogram]:
    if not index:
        return _NO_LATENCY  # a typical poll (no latency histograms read): one shared, read-only empty mapping
    found = {kind: histogram_for(by_key, key) for kind, by_key in index.items()}
    return MappingProxyType({kind: h for kind, h in found.items() if h is not None})


def underscore_escaped(exposition: Exposition, prefix: str) -> str | None:
    """Why a page whose samples are named ``vllm_*`` (or ``U__vllm_3a_*``) under ``# TYPE vllm:*`` lines has none
    of the names an adapter reads, or None: prometheus_client's OpenMetrics output with underscore (or value)
    escaping of the names."""
    escaped = prefix.replace(":", "_")
    if any(n.startswith(escaped) and prefix + n[len(escaped):] in exposition.names for n in exposition.names):
        scheme, shown = "underscore", escaped
    elif any((name := _unescape_values(n)) is not None and name.startswith(prefix) and name in exposition.names
             for n in exposition.names):
        scheme, shown = "value", "U__" + prefix.replace("_", "__").replace(":", "_3a_")
    else:
        return None
    return (f"the samples are named {shown}* while their # TYPE lines say {prefix}*: prometheus_client's OpenMetrics "
            f"output with {scheme} escaping, served when the request asks for application/openmetrics-text; "
            "fetch /metrics without that Accept header (kvwatch's own requests ask for the text format)")


_VALUE_ESCAPE = re.compile(r"__|_([0-9a-fA-F]{1,6})_")


def _unescape_values(name: str) -> str | None:
    """A name under OpenMetrics' "values" escaping (``U__``, ``_`` as ``__``, another character as ``_<hex>_``),
    decoded; None for any other name."""
    if not name.startswith("U__"):
        return None
    try:
        return _VALUE_ESCAPE.sub(lambda m: "_" if m.group(1) is None else chr(int(m.group(1), 16)), name[3:])
    except ValueError:  # (past chr's range)
        return None
