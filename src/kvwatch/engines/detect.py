"""Which engine wrote a payload, and its reading: vLLM, SGLang or TensorRT-LLM, picked from the payload itself.

NVIDIA NIM for LLMs serves vLLM's families without the ``vllm:`` prefix (its ``/v1/metrics``): a page with no
``vllm:`` at all whose lines start with vLLM's running gauge and a KV usage gauge is read with the prefix put
back (:func:`page_spelling`, :func:`respelled`; vLLM's and SGLang's families spelled ``vllm_*`` and ``sglang_*``
likewise), and the report names the metrics as the page spells them. vLLM-Omni relabels every ``vllm:*`` family's
``engine`` into ``stage`` and ``replica`` (one server running an engine per stage, each with its own KV cache): such
a page is read with ``engine="<stage>.<replica>"`` (:func:`engines_from_stages`).

First match wins: any ``vllm:*`` family → vLLM; SGLang's scheduler gauges → SGLang; ``trtllm_*``,
``trtllm:*`` or Triton's ``nv_trt_llm_*`` families → TensorRT-LLM; a JSON body → TensorRT-LLM iteration
statistics. A payload with none of them but an operator's ``--usage-metric`` (a proxy's renamed metric)
is read by the vLLM adapter, which knows overrides best. Raises ParseError (not an exposition) or
UnrecognisedPayload (no engine kvwatch knows).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import NamedTuple

from kvwatch.engines import SourceOverrides, UnrecognisedPayload, sglang, trtllm, vllm
from kvwatch.exposition import Exposition, Family, ParseError, Sample, TooLarge, parse
from kvwatch.model import SGLANG, TENSORRT_LLM, VLLM, Poll

LATENCY_FAMILIES: frozenset[str] = frozenset(
    {f for families in (*vllm.LATENCY.values(), *sglang.LATENCY.values()) for f in families}
    | {p + f for p in trtllm.PREFIXES for f in trtllm.LATENCY.values()})
"""Every adapter's latency histogram families (what a poll with ``latency=False`` leaves unread)."""


def wanted_for(overrides: SourceOverrides | None = None, *, latency: bool = True,
               lengths: bool = False) -> frozenset[str]:
    """The parser's filter: every adapter's families and the overrides'. A set of names, not a predicate, so
    that the parser can skip whole blocks of the families no adapter reads (:mod:`kvwatch.exposition`).
    Without ``latency`` the latency histograms are left out (an override naming one keeps it). Without
    ``lengths`` (the default) of vLLM's token histograms only the ``_sum``/``_count`` samples are read: their
    buckets (``Reading.lengths``) bound the longest request for the advice (kvwatch.advisor.longest_request_bound)
    and feed v7's request-size tail, and reading them every poll doubled a whole 8-engine page's parse (v7 in
    forecasting.md), so ``serve`` reads them with the latency buckets, once a minute."""
    names = vllm.wanted_for(overrides) | sglang.FAMILIES | trtllm.FAMILIES
    unread = (frozenset() if latency else LATENCY_FAMILIES) | (frozenset() if lengths else vllm.LENGTH_FAMILIES)
    if not unread:
        return names
    names = names - (unread - vllm.wanted_for(overrides, adapter=False))
    return names | vllm.LENGTH_SUMS if not lengths else names


UNPREFIXED_VLLM = frozenset(f.removeprefix("vllm:") for f in vllm.FAMILIES if f.startswith("vllm:"))
"""vLLM's families as NVIDIA NIM serves them, without ``vllm:``."""
_PARTS = ("_total", "_bucket", "_sum", "_count", "_created")
_NAMES = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")  # the metric names in a Detection's text ("max(a, b)", "a + b")


# vllm-omni's vllm_omni/metrics/stat_logger.py (_rewrite_labelnames): ["model_name", "engine", ...] becomes
# ["model_name", "stage", "replica", ...] on every upstream family, cache_config_info included.
STAGE_LABELS = ("stage", "replica")
OMNI_NOTE = "vLLM-Omni: engine is stage.replica"


def engines_from_stages(exposition: Exposition) -> Exposition | None:
    """A vLLM-Omni page with each (stage, replica) as the ``engine`` label; None for any other page. (Its running
    gauge tells: every poll of every vLLM passes here.)"""
    probe = exposition.samples(vllm.RUNNING)
    if not probe or "engine" in probe[0].labels or not all(k in probe[0].labels for k in STAGE_LABELS):
        return None
    families: dict[str, Family] = {}
    for name, family in exposition.families.items():
        if name.startswith("vllm:"):
            family = replace(family, samples=[_staged(s) for s in family.samples])
        families[name] = family
    return Exposition(families=families, names=exposition.names)


# The labels the adapters key a series on: a scraper whose own target labels clash with them (honor_labels: false)
# keeps the engine's values as exported_<label>, and its own under the name.
SERIES_LABELS = ("engine", "model_name", "model", "dp_rank")
_EXPORTED = tuple(f"exported_{label}" for label in SERIES_LABELS)


def scraper_labels_undone(exposition: Exposition) -> Exposition:
    """``exposition`` with each ``exported_<label>`` of :data:`SERIES_LABELS` read as ``<label>`` (the engine's value,
    in place of the scraper's): a page scraped again by a Prometheus, Alloy or agent that adds target labels of those
    names keeps the engine's as ``exported_engine``/``exported_model_name``. Read as they were, the model was
    "unknown" (a gpt-oss page's two KV groups lost: its capacity read twice as large, with no finding) and a
    data-parallel page was refused as several servers."""
    if not any(k in _EXPORTED for family in exposition for sample in family.samples[:1] for k in sample.labels):
        return exposition
    families = {name: replace(family, samples=[_unexported(s) for s in family.samples])
                for name, family in exposition.families.items()}
    return Exposition(families=families, names=exposition.names, spoiled=exposition.spoiled)


def _unexported(sample: Sample) -> Sample:
    labels = sample.labels
    if not any(k in _EXPORTED for k in labels):
        return sample
    kept = {k: v for k, v in labels.items() if k not in SERIES_LABELS or f"exported_{k}" not in labels}
    return Sample(sample.name, {(k.removeprefix("exported_") if k in _EXPORTED else k): v for k, v in kept.items()},
                  sample.value)


def _staged(sample: Sample) -> Sample:
    labels = sample.labels
    if "engine" in labels or not all(k in labels for k in STAGE_LABELS):
        return sample
    engine = ".".join(labels[k] for k in STAGE_LABELS)
    return Sample(sample.name, {**{k: v for k, v in labels.items() if k not in STAGE_LABELS}, "engine": engine},
                  sample.value)


class Spelling(NamedTuple):
    """A re-export's spelling of an engine's family names, read by renaming after the parse (the page's text is not
    copied: a rewrite of a 58 MiB page peaked at 449 MiB)."""

    note: str  # what the report's version_range adds
    page: Callable[[str], str]  # kvwatch's name -> the page's
    ours: Callable[[str], str]  # the page's name -> kvwatch's (others unchanged)
    own_prefix: str  # kvwatch's prefix, which the report's metric names lose again


def _vllm_prefixed(name: str) -> str:
    base = next((name[: -len(p)] for p in _PARTS if name.endswith(p) and name[: -len(p)] in UNPREFIXED_VLLM), name)
    return "vllm:" + name if base in UNPREFIXED_VLLM else name


NIM = Spelling("NIM: no vllm: prefix", lambda n: n.removeprefix("vllm:"), _vllm_prefixed, "vllm:")
"""NVIDIA NIM for LLMs: vLLM's families without ``vllm:``."""
UNDERSCORED_SGLANG = Spelling(
    "sglang_ prefix", lambda n: "sglang_" + n.removeprefix("sglang:") if n.startswith("sglang:") else n,
    lambda n: "sglang:" + n.removeprefix("sglang_") if n.startswith("sglang_") else n, "sglang:")
"""SGLang's families as re-exports spell them, ``sglang_*`` (llm-d, NVIDIA Dynamo: docs/metrics.md). (A page whose
# TYPE lines say ``sglang:`` is prometheus_client's escaping, which ``series.underscore_escaped`` explains.)"""
_SGLANG_CORE = tuple(UNDERSCORED_SGLANG.page(f) for f in (sglang.TOKEN_USAGE, sglang.RUNNING, sglang.QUEUE))
UNDERSCORED_VLLM = Spelling(
    "vllm_ prefix", lambda n: "vllm_" + n.removeprefix("vllm:") if n.startswith("vllm:") else n,
    lambda n: "vllm:" + n.removeprefix("vllm_") if n.startswith("vllm_") else n, "vllm:")
"""vLLM's families with ``:`` written ``_``, as an OpenTelemetry collector's or Grafana Alloy's Prometheus exporter
writes them, and vLLM's own OpenTelemetry names (``_get_sanitized_opentelemetry_name`` in
vllm/v1/metrics/ray_wrappers.py)."""


def page_spelling(names: frozenset[str]) -> Spelling | None:
    """The re-export spelling of a page whose family ``names`` (the filtered parse records every one it sees) hold an
    engine's core gauges in it and none in the engine's own: NIM (vLLM's running gauge and a KV usage gauge
    unprefixed), ``sglang_*`` or ``vllm_*``; None for any other page."""
    if "num_requests_running" in names and {"gpu_cache_usage_perc", "kv_cache_usage_perc"} & names and \
            not any(n.startswith("vllm:") for n in names):
        return NIM
    if any(n in names for n in _SGLANG_CORE) and not any(n.startswith("sglang:") for n in names):
        return UNDERSCORED_SGLANG
    if "vllm_num_requests_running" in names and {"vllm_gpu_cache_usage_perc", "vllm_kv_cache_usage_perc"} & names \
            and not any(n.startswith("vllm:") for n in names):
        return UNDERSCORED_VLLM
    return None


def respelled(exposition: Exposition, spelling: Spelling) -> Exposition:
    """``exposition`` (parsed with the page's names) with every family and sample named as kvwatch's adapters read
    them."""
    rename = spelling.ours
    families = {rename(name): replace(family, name=rename(family.name), samples=[
        Sample(rename(s.name), s.labels, s.value) for s in family.samples]) for name, family in
        exposition.families.items()}
    return Exposition(families=families, names=frozenset(map(rename, exposition.names)), spoiled=exposition.spoiled)


@functools.cache  # (one filter a run: built anew every poll it took 8 µs, 4 % of a small page's parse)
def with_unsuffixed_counters(wanted: frozenset[str]) -> frozenset[str]:
    """``wanted`` and each ``x_total`` in it as ``x``: the names :func:`counters_suffixed` reads."""
    return wanted | {name.removesuffix("_total") for name in wanted if name.endswith("_total")}


def counters_suffixed(exposition: Exposition, wanted: frozenset[str]) -> Exposition:
    """``exposition`` with each counter family that ``wanted`` names ``x_total`` but the page declares without the
    suffix (``# TYPE vllm:num_preemptions counter`` and samples so named: what an OpenTelemetry collector's Prometheus
    exporter writes with ``add_metric_suffixes`` off) keyed and named ``x_total``, as the engines' own pages and
    kvwatch's adapters name counters; a page that also has ``x_total`` keeps its own, and a counter read by its own
    name (SGLang's ``sglang:total_retracted_reqs``) stays. (Left unread, they meant no preemptions and no request
    rate, without a word.)"""
    unsuffixed = [f for f in exposition if f.type == "counter" and f.name + "_total" in wanted
                  and f.name not in wanted and f.name + "_total" not in exposition.families]
    if not unsuffixed:
        return exposition
    families = dict(exposition.families)
    for family in unsuffixed:
        name = family.name + "_total"
        del families[family.name]
        families[name] = replace(family, name=name, samples=[Sample(name, s.labels, s.value) for s in family.samples])
    return Exposition(families=families, names=exposition.names | {f.name + "_total" for f in unsuffixed},
                      spoiled=exposition.spoiled)


def _part_renamed(renames: Mapping[str, str], name: str) -> str:
    """``name`` under ``renames``: a family's, or one of its samples' (``_bucket``, ``_total``, ...)."""
    if name in renames:
        return renames[name]
    for part in _PARTS:
        if name.endswith(part) and name[: -len(part)] in renames:
            return renames[name[: -len(part)]] + part
    return name


def _mentions(exposition: Exposition, name: str) -> bool:
    """The page names ``name`` as a family or a sample, or a family whose samples it names (``x_total``, ``x``)."""
    return any(f in exposition for f in vllm.families_of(name)) or any(name + p in exposition for p in _PARTS)


def operator_spelling(renames: Mapping[str, str]) -> Spelling:
    """``--rename-metrics``' pairs (the page's name -> the engine's) as a :class:`Spelling`."""
    back = {engine: page for page, engine in renames.items()}
    return Spelling("--rename-metrics", functools.partial(_part_renamed, back),
                    functools.partial(_part_renamed, renames), "")


def _part(name: str) -> str:
    """The sample suffix ``name`` ends in (``_total``, ``_bucket``, ...), or ""."""
    return next((part for part in _PARTS if name.endswith(part)), "")


@functools.cache  # (one read set a run: refused_rename asks for every pair on every poll)
def rename_targets(read: frozenset[str]) -> frozenset[str]:
    """Every engine name a ``--rename-metrics`` pair may name when kvwatch reads ``read``: a family read, one of its
    samples (``x_total``, ``x_bucket``, ...), or a family whose sample is read (the Helm chart checks pairs against
    this list at render: scripts/sync_chart_files.py)."""
    samples = {name + suffix for name in read for suffix in vllm.SAMPLE_SUFFIXES}
    families = {name[: -len(part)] for name in read for part in _PARTS if name.endswith(part) and len(name) > len(part)}
    return frozenset(read) | samples | families


def refused_rename(page: str, engine: str, read: frozenset[str]) -> str | None:
    """Why ``--rename-metrics PAGE=ENGINE`` can name no metric kvwatch reads, whatever the page: a family on one side
    and a sample on the other, or an engine name kvwatch does not ``read`` (every adapter's families and the
    overrides'); None when it can. The settings refuse it at startup (exit 2: a payload-free typo read as an
    unreadable target, exit 3)."""
    if _part(page) != _part(engine):
        return (f"--rename-metrics {page}={engine}: one name ends in a sample's suffix ({', '.join(_PARTS)}) and the "
                "other does not: name both families or both samples (proxy_preemptions_total="
                "vllm:num_preemptions_total)")
    if engine not in rename_targets(read):
        return (f"--rename-metrics {page}={engine}: kvwatch reads no {engine}: name one of the engine's metrics it "
                "reads (docs/metrics.md)")
    return None


def _renamed(exposition: Exposition, renames: Mapping[str, str], spelling: Spelling,
             read: frozenset[str]) -> Exposition:
    """The page read under the operator's renames (``spelling``); a pair naming a family on one side and a sample on
    the other, an engine name kvwatch does not ``read``, a name the page never mentions, or a page holding a family
    under both names stops the read naming the flag (a typo would leave the engine's own metric unread without a
    word: the preemption counter unknown, its alerts silent, kvwatch_up 1)."""
    for page, engine in renames.items():
        if (why := refused_rename(page, engine, read)) is not None:
            raise UnrecognisedPayload(why)
        if not _mentions(exposition, page):
            raise UnrecognisedPayload(f"--rename-metrics {page}={engine}: the payload has no {page} (no sample, no "
                                      "# TYPE or # HELP line): check the name")
        if _mentions(exposition, engine):
            raise UnrecognisedPayload(f"--rename-metrics {page}={engine}: the payload has {engine} too, and kvwatch "
                                      "does not guess which of the two to read")
    return respelled(exposition, spelling)


def engines_of(exposition: Exposition) -> list[str]:
    """Every engine whose metrics the page holds: ``vllm``, ``sglang``, ``tensorrt-llm``, in that order."""
    claims = ((VLLM, any(name.startswith("vllm:") for name in exposition.names)),
              (SGLANG, sglang.claims(exposition)), (TENSORRT_LLM, trtllm.claims(exposition)))
    return [kind for kind, claimed in claims if claimed]


# Engines kvwatch has no adapter for, by their metrics' prefix: named when a page has them alone.
# (its metrics, then how far the override flags get: llama.cpp's server documents its gauges in tools/server's README)
FOREIGN_ENGINES = (
    ("tgi_", "Hugging Face TGI's (tgi_*)", "kvwatch knows no KV-usage gauge of it, which a diagnosis needs"),
    ("llamacpp:", "llama.cpp's server (llamacpp:*)",
     "--usage-metric llamacpp:kv_cache_usage_ratio --running-metric llamacpp:requests_processing --waiting-metric "
     "llamacpp:requests_deferred read it where the build exports them, and the advice is then worded for vLLM"),
)


def read_payload(text: str, overrides: SourceOverrides | None = None, *, timestamp: float,
                 max_series: int | None = None, latency: bool = True, lengths: bool = False) -> Poll:
    """One :class:`Poll` from a ``/metrics`` body of any supported engine, with at most ``max_series``
    readings (the rest counted in ``Poll.series_dropped``; vLLM's adapter skips them before building any).
    With ``latency=False`` the latency histograms are not read (the readings' ``latency`` is empty; a JSON
    body always carries its own); with ``lengths=True`` vLLM's token histograms' buckets are
    (``Reading.lengths``). The parse itself keeps the samples of at most ``ADMIT_FACTOR * max_series``
    series (:class:`SeriesLimit`): beyond that, the exported series are the adapter's first among the first
    ones in payload order."""
    if trtllm.looks_like_json(text):
        if overrides is not None and (overrides.names() or overrides.renames):
            raise UnrecognisedPayload("the target serves TensorRT-LLM's JSON iteration statistics, which have no "
                                      "metric names: --usage-metric, --running-metric, --waiting-metric and "
                                      "--rename-metrics name Prometheus samples and cannot apply")
        try:
            return _capped(trtllm.read_iteration_stats(text, timestamp=timestamp), max_series)
        except json.JSONDecodeError as exc:
            why = f"body starts like JSON but is not: {exc}"
        except RecursionError:
            why = "body is JSON nested deeper than kvwatch reads"
        # (raised past the except block: as its __context__, the JSONDecodeError kept the whole body, its .doc)
        raise ParseError(why)
    renames = overrides.renames if overrides is not None else {}
    operator = operator_spelling(renames) if renames else None
    limit = SeriesLimit(ADMIT_FACTOR * max_series) if max_series is not None else None
    wanted = wanted_for(overrides, latency=latency, lengths=lengths)
    if operator is not None:
        wanted = wanted | frozenset(map(operator.page, wanted))
    exposition = counters_suffixed(parse(text, with_unsuffixed_counters(wanted),
                                         limit.admit if limit is not None else None), wanted)
    if operator is not None:
        exposition = _renamed(exposition, renames, operator, wanted_for(overrides, latency=True, lengths=True))
    # An operator who names the page's own metrics (or labels, {stage="0"}) with the override flags reads the page as
    # it is labelled (no vLLM-Omni stages made engines), and with --rename-metrics as it is spelled.
    own_names = bool(overrides and (overrides.names() or renames))
    given = overrides
    spelling = page_spelling(exposition.names) if not renames else None
    if spelling is not None and overrides is not None and overrides.names():
        # The selectors name the page's spelling (vllm_kv_cache_usage_perc{engine="0"}, NIM's gpu_cache_usage_perc):
        # read in kvwatch's with the rest of the page (read as spelled, the queue, the capacity and the counters were
        # lost, and "no count of waiting requests" was said of a page that has one).
        overrides = overrides.respelled(spelling.ours)
        wanted = wanted_for(overrides, latency=latency, lengths=lengths)
    if spelling is not None:  # read again for the page's own names (the same filter, in its spelling)
        limit = SeriesLimit(ADMIT_FACTOR * max_series) if max_series is not None else None
        page_wanted = frozenset(map(spelling.page, wanted))
        exposition = respelled(counters_suffixed(parse(text, with_unsuffixed_counters(page_wanted),
                                                       limit.admit if limit is not None else None), page_wanted),
                               spelling)
    exposition = scraper_labels_undone(exposition)
    spoiled = exposition.spoiled
    pending = _refuse_unmatched(exposition, overrides, given)
    staged = engines_from_stages(exposition) if not own_names else None
    exposition = staged or exposition
    kinds = engines_of(exposition)
    if len(kinds) > 1:  # one adapter would read its engine's series and the others' would vanish without a word
        raise UnrecognisedPayload(f"this page holds the metrics of {' and '.join(kinds)}: several engines on one "
                                  "page (a gateway's or a shared registry's); point kvwatch at one engine's "
                                  "/metrics")
    kind = kinds[0] if kinds else None
    if kind == SGLANG:
        poll = _capped(sglang.read(exposition, overrides, timestamp=timestamp), max_series)
    elif kind == TENSORRT_LLM:
        poll = _capped(trtllm.read(exposition, overrides, timestamp=timestamp), max_series)
    elif kind is None and not (overrides and overrides.names()):
        if any(n.startswith(("trtllm_", "trtllm:")) for n in exposition.names):
            raise UnrecognisedPayload("TensorRT-LLM metrics without the running, waiting or KV cache gauges kvwatch "
                                      "reads (trtllm_num_requests_running/waiting, trtllm_kv_cache_utilization): "
                                      f"{trtllm.ITERATION_GAUGES_WHY}; --usage-metric, --running-metric and "
                                      "--waiting-metric can name what the page has")
        if any(n.startswith("nv_trt_llm_") for n in exposition.names):
            # e.g. a V1 (not inflight-batching) model's page: nv_trt_llm_v1_metrics beside the general ones
            raise UnrecognisedPayload("nv_trt_llm_* metrics without the request or KV cache block families kvwatch "
                                      "reads (" + ", ".join(f"{r}, {b}" for _, r, b in trtllm.TRITON_GENERATIONS)
                                      + "); --usage-metric, --running-metric and --waiting-metric can name what "
                                      "the page has")
        for engine, usage in (("vllm", "kv_cache_usage_perc"), ("sglang", "token_usage")):
            if any(n.startswith(f"ray_{engine}_") for n in exposition.names):
                # vllm/v1/metrics/ray_wrappers.py, sglang's observability/ray_wrappers.py: the engine's metrics
                # through Ray's exporter, ":" made "_", one series per replica and worker on a node's page
                raise UnrecognisedPayload(
                    f"ray_{engine}_* metrics: {engine}'s metrics re-exported by Ray Serve (one set per replica on the "
                    "node's page), which kvwatch reads only through --usage-metric, --running-metric and "
                    f"--waiting-metric, one replica at a time (e.g. ray_{engine}_{usage}{{ReplicaId=\"...\"}}); "
                    "capacity then stays unknown")
        for prefix, engine, how in FOREIGN_ENGINES:
            if any(n.startswith(prefix) for n in exposition.names):
                raise UnrecognisedPayload(f"this page is {engine}, an engine kvwatch has no adapter for (it reads "
                                          f"vLLM, SGLang and TensorRT-LLM): {how}")
        raise UnrecognisedPayload("no vllm:*, sglang:*, trtllm_*/trtllm:* or nv_trt_llm_* metrics in the payload "
                                  "(is the target an inference engine's /metrics endpoint? A vLLM started with "
                                  "--disable-log-stats exports none of its own)")
    else:
        poll = vllm.read(exposition, overrides, timestamp=timestamp, max_series=max_series,
                         refused_engines=limit.refused_engines if limit is not None else set())
    if staged is not None:
        poll = replace(poll, detection=replace(poll.detection,
                                               version_range=f"{poll.detection.version_range} ({OMNI_NOTE})"))
    if spelling is not None:  # the report names the page's own spelling
        d, theirs = poll.detection, spelling.page(spelling.own_prefix)
        poll = replace(poll, detection=replace(d, version_range=f"{d.version_range} ({spelling.note})", **{
            f: getattr(d, f).replace(spelling.own_prefix, theirs) for f in (
                "usage_metric", "running_metric", "waiting_metric", "capacity_metric") if getattr(d, f)}))
    if operator is not None:  # the report names the page's metrics, as an override's do
        d, page = poll.detection, operator.page
        poll = replace(poll, detection=replace(d, **{f: _NAMES.sub(lambda m: page(m.group()), getattr(d, f)) for f in (
            "usage_metric", "running_metric", "waiting_metric", "capacity_metric") if getattr(d, f)}))
    if limit is not None and limit.refused:
        poll = replace(poll, series_dropped=poll.series_dropped + len(limit.refused))
    if spoiled:
        poll = replace(poll, unread=tuple(f"{name} is not read ({why}): Prometheus stores it as written, but kvwatch "
                                          "cannot read it as a distribution" for name, why in spoiled.items()))
    if pending:
        fields = {"usage": "kv_usage_ratio", "running": "requests_running", "waiting": "requests_waiting"}
        poll = replace(poll, undetermined=poll.undetermined + tuple(
            (r.key, fields[field], why) for field, why in pending for r in poll.readings
            if getattr(r, fields[field]) is None))
    _refuse_many_reasons(poll)
    return poll


# Values of a reason label (finished_reason, waiting's reason) one series may hold: vLLM has a handful (stop,
# length, abort, error; capacity, deferred). Thousands, changing every poll, cost memory in every reading kept
# (656 MiB with kvwatch_up 1 from 16 series of 5,000; docs/reliability.md).
REASONS_PER_SERIES = 64


def _refuse_many_reasons(poll: Poll) -> None:
    for reading in poll.readings:
        for field, label in (("finished_by_reason", "finished_reason"), ("waiting_by_reason", "reason")):
            count = len(getattr(reading, field))
            if count > REASONS_PER_SERIES:
                raise TooLarge(f"{count:,} values of {label} for model {reading.model_name!r}, engine "
                               f"{reading.engine!r}: more than {REASONS_PER_SERIES} (an engine has a handful)")


OVERRIDE_FLAGS = (("usage", "--usage-metric"), ("running", "--running-metric"), ("waiting", "--waiting-metric"))


def _refuse_unmatched(exposition: Exposition, overrides: SourceOverrides | None,
                      given: SourceOverrides | None) -> list[tuple[str, str]]:
    """An operator's source metric whose name the payload never mentions stops the read, naming the flag: a typo
    used to drop the engine's own metric without a word ("KV usage from nonexist", then "pass --usage-metric").
    One whose family is there without a matching sample is read as unknown, not refused: prometheus_client shows
    a labelled gauge only once it is set (a proxy before its first request), and refusing would take the whole
    engine down; returned as (field, why) for the report. The messages name each selector as ``given`` (the
    operator's spelling, where a re-spelled page's selectors are read in kvwatch's)."""
    pending: list[tuple[str, str]] = []
    for field, flag in OVERRIDE_FLAGS:
        selector = getattr(overrides, field) if overrides is not None else None
        if selector is None:
            continue
        shown = getattr(given or overrides, field)
        samples = exposition.samples(selector.name) or [
            s for family in exposition for s in family.samples if s.name == selector.name]
        if any(selector.matches(s.labels) for s in samples):
            continue
        if not samples and not any(f in exposition for f in vllm.families_of(selector.name)):
            raise UnrecognisedPayload(f"{flag} {shown} matches no sample in the payload, and no family of that "
                                      "name is declared: check the metric name (without the flag kvwatch reads the "
                                      "engine's own metric)")
        pending.append((field, f"{flag} {shown} matches no sample in this payload yet (its family is there: a "
                               "labelled gauge appears once it is set), so that value is unknown"))
    return pending


# Series the parse keeps, per --max-series: twice the cap, so that a series spelled with and without one of
# its labels (an engine label on some families only) still fits, and so that the adapter still picks the
# exported ones in its own order among twice as many as it exports.
ADMIT_FACTOR = 2
# Samples of the read families one series may hold (and the unlabelled ones together): an engine's page has a few
# hundred (143 in the fixtures, buckets included), and an SGLang server with a per-request custom label on its
# tokenizer metrics (a tenant) about 76 per value and stream mode: 300 tenants, 23,000. A label kvwatch does not key
# on (pod, x) multiplies them past the series cap: 410,000 label sets of process_start_time_seconds took the
# sidecar to 310 MB with kvwatch_up 1, and the allocator kept most of it after the target healed; at this cap the
# parse refuses such a page having grown by 25 MB (docs/reliability.md).
SAMPLES_PER_SERIES = 32_768
# And all of them together: 128 series (twice --max-series) under that cap each held 8.4M samples, 277 MiB at the
# parse's peak. 64 full series of an engine's page hold about 10,000; a --max-series raised for a
# target that serves more raises it too, by SAMPLES_PER_ADMITTED_SERIES a series the parse keeps (a vLLM series
# holds 119-143).
SAMPLES_PER_PAGE = 65_536
SAMPLES_PER_ADMITTED_SERIES = 256


MAX_COUNTED_ENGINES = 4096
"""Engines of refused series the page's engine count remembers (vLLM's data parallelism runs a few to a few hundred);
past it the count, and with it the capacity vLLM sums over them, is unknown."""


class SeriesLimit:
    """The parse's series cap (:func:`kvwatch.exposition.parse`'s ``admit``): samples of the first ``limit``
    series in payload order are kept, samples of any later series are refused, so that a payload with 50,000
    label sets costs memory for ``limit`` of them, not for all (docs/reliability.md). A series is the engine-neutral
    ``(model, engine)`` pair of the adapters: ``model_name`` (SGLang 2024: ``name``; Triton: ``model``) and
    ``engine`` (SGLang: ``dp_rank``). Samples with neither label (process gauges) are always kept. Samples
    with one of the two (vLLM's per-engine ``cache_config_info`` has no model; its admission rejections no
    engine) describe series rather than being ones: they are kept up to ``limit`` label sets of their own,
    and never counted as dropped series (counting them dropped each engine's capacity with a low
    ``--max-series``). ``refused`` holds the hashes of the refused series, to count them once each. A series
    (or the unlabelled samples together) with more than :data:`SAMPLES_PER_SERIES` samples makes the whole page
    :class:`~kvwatch.exposition.TooLarge`: a label kvwatch does not key on multiplies them, and which ones to keep
    would be a guess; so does a page with more kept samples in all than :data:`SAMPLES_PER_PAGE` or
    :data:`SAMPLES_PER_ADMITTED_SERIES` a series the parse keeps, whichever is more."""

    __slots__ = ("admitted", "limit", "most", "partial", "refused", "refused_engines", "samples", "total")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.admitted: set[tuple[str | None, str | None]] = set()
        self.partial: set[tuple[str | None, str | None]] = set()
        self.refused: set[int] = set()
        # The engine labels of refused samples, for the page's engine count (None: more than MAX_COUNTED_ENGINES)
        self.refused_engines: set[str] | None = set()
        self.samples: dict[tuple[str | None, str | None], int] = {}
        self.total = 0
        self.most = max(SAMPLES_PER_PAGE, SAMPLES_PER_ADMITTED_SERIES * limit)

    def admit(self, labels: dict[str, str]) -> bool:
        get = labels.get
        series = (get("model_name") or get("name") or get("model"), get("engine") or get("dp_rank"))
        if series in self.admitted or series == (None, None):
            self._count(series)
            return True
        if series[0] is None or series[1] is None:
            if series in self.partial or len(self.partial) < self.limit:
                self.partial.add(series)
                self._count(series)
                return True
            self._note_engine(series[1])
            return False
        if len(self.admitted) < self.limit:
            self.admitted.add(series)
            self._count(series)
            return True
        self.refused.add(hash(series))
        self._note_engine(series[1])
        return False

    def _note_engine(self, engine: str | None) -> None:
        """A refused sample's engine: vLLM sums num_gpu_blocks over the page's engines, refused ones included
        (with --max-series 1 four engines' sum was divided by the 2 kept: twice each engine's capacity)."""
        if engine is not None and self.refused_engines is not None and engine not in self.refused_engines:
            if len(self.refused_engines) >= MAX_COUNTED_ENGINES:
                self.refused_engines = None  # more than the bound: the page's engine count is unknown
            else:
                self.refused_engines.add(engine)

    def _count(self, series: tuple[str | None, str | None]) -> None:
        count = self.samples.get(series, 0) + 1
        self.samples[series] = count
        self.total += 1
        if self.total > self.most:
            raise TooLarge(f"more than {self.most:,} samples in the families kvwatch reads, over "
                           f"{len(self.samples):,} series: not one engine's page (64 series of one hold about 10,000; "
                           "--max-series raises the cap)")
        if count > SAMPLES_PER_SERIES:
            which = "samples without a model or engine label" if series == (None, None) else \
                f"samples for model {series[0]!r}, engine {series[1]!r}"
            raise TooLarge(f"more than {SAMPLES_PER_SERIES:,} {which} in the families kvwatch reads: a label it "
                           "does not key on multiplies them (an engine's page has a few hundred)")


def _capped(poll: Poll, max_series: int | None) -> Poll:
    """At most ``max_series`` readings, those with a KV usage first (as vllm.read keeps them), in adapter order."""
    if max_series is None or len(poll.readings) <= max_series:
        return poll
    kept = {id(r) for r in sorted(poll.readings, key=lambda r: r.kv_usage_ratio is None)[:max_series]}
    return replace(poll, readings=[r for r in poll.readings if id(r) in kept],
                   series_dropped=poll.series_dropped + len(poll.readings) - max_series)
