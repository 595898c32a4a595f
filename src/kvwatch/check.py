"""``kvwatch check [URL] [--file PATH] [--json]``: one poll, then a diagnosis a person can act on.

Findings follow the troubleshooting checklist (stable ids, see docs/metrics.md):
``kv_bound`` (a queue at KV ≥ 0.95, a standing one from 0.90, or below with fewer tokens free than a mean prompt
needs: kvwatch.forecast.thresholds.queue_waits_for_kv, the sidecar's rule),
``scheduler_limited`` (a standing queue while KV < 0.9 has room for the next prompt and something runs),
``queue_not_admitted`` (a standing queue while nothing runs: a stall, held blocks or a head too large),
``queue_cause_unknown`` (a standing queue below 0.9 with the KV capacity unknown: whether the next prompt fits, and
so whether the scheduler or the KV cache holds it, cannot be told),
``decode_admission_waiting`` (an SGLang PD decode server's queue for room below 0.90: KV reserve or slots),
``preemptions``
(any preemption, or SGLang retraction, since the engine started), ``prefix_cache_ineffective`` (prefix
caching on, hit ratio < 10 %),
``unbalanced_ranks`` (a full data-parallel rank beside one under half used),
``capacity_unknown``, ``usage_unknown``, ``queue_unknown`` and ``running_unknown`` (kvwatch cannot read them from
this engine; without a waiting count no ``kv_bound`` can be told, without a running count no standing queue or
``kv_full``), ``capacity_groups_unknown``
(a capacity from vLLM's blocks for a model kvwatch does not know: its KV groups may share them), and the capacity
findings ``kv_usage_stuck``, ``request_exceeds_pool``, ``vllm_will_not_start``, ``capacity_mismatch``
(kvwatch.capacity.findings). A ``kv_bound``
series also gets the advisor's fixes, cheapest first (``advice``; the deployment flags ``--model``,
``--gpu``, ``--tensor-parallel-size``, ``--gpus-per-node`` ... size the quantization and tensor-parallel gains).
Exit codes: 0 when the payload was read (whatever the findings, unless ``--fail-on``), 1 when ``--fail-on
SEVERITY`` is given and a finding at or above it exists, 2 bad usage, 3 when the payload could not be read (a
script tells a broken target from findings), 4 when kvwatch itself failed (kvwatch.cli.EXIT_INTERNAL).
"""

from __future__ import annotations

import argparse
import codecs
import json
import math
import re
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.utils import floatToGoString

from kvwatch.advisor import (
    ADD_REPLICA,
    ADD_TENSOR_PARALLELISM,
    DEFAULT_GPUS_PER_NODE,
    ENGINE_NAMES,
    QUANTIZE_KV_CACHE,
    QUANTIZE_WEIGHTS,
    TRITON_TENSORRT_LLM,
    Advice,
    advise_from_result,
    engine_flags,
)
from kvwatch.derived import SeriesState, blocks_shared_by_groups, derive
from kvwatch.engines import SourceOverrides
from kvwatch.engines.detect import OMNI_NOTE
from kvwatch.exposition import printable
from kvwatch.fetch import CappedBody, Fetcher, decode_body, held_text
from kvwatch.forecast import Forecaster, ForecastSample
from kvwatch.forecast.detector import no_room_in
from kvwatch.forecast.thresholds import BUSY_USAGE, SATURATION_USAGE, queue_waits_for_kv, standing_queue
from kvwatch.model import SGLANG, TENSORRT_LLM, VLLM, Detection, Poll, Reading, SeriesKey
from kvwatch.payload import ScrapeError, interpret
from kvwatch.settings import (
    REFUSED_BESIDE,
    CheckSettings,
    SettingsError,
    add_settings_flags,
    load_settings,
    path_argument,
    redact_url,
)

if TYPE_CHECKING:  # the capacity model loads only when a plan is built
    from kvwatch.capacity.planner import CapacityPlan

# The forecaster's thresholds, so that check and serve call the same polls KV-bound: usage at u_busy (0.90) with a
# queue is saturated there (vLLM rarely reads above ~0.95 when full), and below it a queue is the scheduler's.
KV_BOUND_USAGE = BUSY_USAGE
PREFIX_HIT_RATIO_LOW = 0.10
PREFIX_MIN_QUERIES = 1000  # fewer queried tokens/blocks than this says nothing about the hit ratio
SEVERITIES = ("critical", "warning", "info")  # most severe first
JSON_USAGE_ERRORS = True  # kvwatch.cli: with --json, bad usage is also {"error": {"reason": "usage", ...}}
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # critical | warning | info
    message: str
    model_name: str | None = None
    engine: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="?", default=None,
                        help="inference engine /metrics URL: vLLM, SGLang or TensorRT-LLM "
                             "(default: --target-url / KVWATCH_TARGET_URL, "
                             f"{CheckSettings.model_fields['target_url'].default})")
    parser.add_argument("--file", type=path_argument, default=None, metavar="PATH",
                        help="read a saved /metrics payload instead of fetching ('-' for stdin)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    parser.add_argument("--fail-on", choices=("info", "warning", "critical"), default=None, metavar="SEVERITY",
                        help="exit 1 when a finding at or above SEVERITY (info, warning, critical) exists, "
                             "for CI jobs and cron (default: exit 0 whatever the findings; a payload that cannot "
                             "be read exits 3, a --file that cannot be opened 2)")
    # The model/deployment flags (shared with plan and serve) let the advice size quantization and TP.
    add_settings_flags(parser, CheckSettings)


def run(args: argparse.Namespace) -> int:
    if args.url is not None and args.target_url is not None and args.target_url != args.url:
        return _usage_error("give the URL once, as URL or as --target-url")
    if args.url is not None:
        args.target_url = args.url
    if args.file is not None and args.target_url is not None:  # (a URL given is --target-url by now)
        return _usage_error(f"give either {'URL' if args.url is not None else '--target-url'} or --file, not both")
    try:
        settings: CheckSettings = load_settings(CheckSettings, args)
        _check_model_preset(settings.model)
        overrides = SourceOverrides.from_settings(settings)
        saved = _read_file(args.file, settings.max_body_bytes) if args.file is not None else None
    except SettingsError as exc:
        message = str(exc)
        if args.url is not None:  # the URL came as the argument, not as --target-url: name what was typed
            message = message.replace("for --target-url", "for URL").replace(
                REFUSED_BESIDE.format(flag="--target-url"), REFUSED_BESIDE.format(flag="URL"))
        return _usage_error(message)
    except ValueError as exc:
        return _usage_error(f"invalid source-metric override: {exc}")
    now = time.time()
    try:
        text = _file_text(saved, settings.max_body_bytes, str(args.file)) if saved is not None else _fetch(settings)
        poll = interpret(text, overrides, timestamp=now, max_series=settings.max_series)
        if poll.series_dropped:
            _note(f"kvwatch check: note: the page has {poll.series_dropped:,} (model_name, engine) series more than "
                  f"--max-series {settings.max_series}, left out (series_dropped in --json)")
        if saved is not None and text and not text.endswith("\n"):
            # Read as Prometheus reads it; a file cut short (an interrupted curl > file) would end so too.
            name = "standard input" if str(args.file) == "-" else args.file
            _note(f"kvwatch check: note: {name} ends without a newline after its last line, read as written: "
                  "if the file was cut short, that line's value may be cut too")
        for why in poll.unread:
            _note(f"kvwatch check: note: {why}")
    except ScrapeError as exc:
        source = str(args.file) if args.file is not None else redact_url(settings.target_url)
        # (the URL it suggests is the given one's, credentials redacted like the source's: it printed the password)
        hint = _url_hint(redact_url(settings.target_url)) if args.file is None and _another_page(exc) else None
        if args.file is None and exc.reason == "connect" and "target_url" not in settings.model_fields_set:
            # (nothing given, nothing listening at the default: the first run of a newcomer)
            hint = "is vLLM running there? Pass its /metrics URL: kvwatch check http://HOST:PORT/metrics"
        if args.json:
            error = {"reason": exc.reason, "message": str(exc), "source": source}
            print(json.dumps({"error": {**error, **({"hint": hint} if hint else {})}}))
        else:
            _note(f"kvwatch check: {exc.reason}: {exc}" if args.file is None else
                  f"kvwatch check: cannot read {source} ({exc.reason}): {exc}")
            if hint:
                _note(f"kvwatch check: hint: {hint}")
        return EXIT_UNREAD
    plans, kv_groups, unsized = _capacity_plans(settings, poll)
    from kvwatch.serve.sidecar_capacity import one_model_flags_note

    shared = one_model_flags_note(settings, (r.model_name for r in poll.readings))
    if shared:
        _note(f"kvwatch check: note: {shared}")
    from kvwatch.capacity.findings import given_engine_settings

    report = build_report(poll, settings.max_model_len, plans, gpus_per_node=settings.gpus_per_node,
                          kv_groups=kv_groups, max_num_seqs=settings.max_num_seqs,
                          given=given_engine_settings(settings))
    if unsized and (any(getattr(settings, f) is not None for f in ("model", "model_config_path", "gpu",
                                                                     "gpu_memory_gib"))
                    or any(series["advice"] for series in report["series"])):
        # The deployment flags were meant for the advice, or advice was given without a plan (it says the reason
        # is on stderr): say why there is none.
        for reason in unsized:
            _note(f"kvwatch check: no capacity plan for {reason}; advice without quantization and TP sizes")
    print(json.dumps(report, indent=2, allow_nan=False) if args.json else render(report))
    return 1 if args.fail_on is not None and fails(report, args.fail_on) else 0


def fails(report: dict[str, Any], fail_on: str) -> bool:
    """Whether a finding of ``report`` is at or above the ``--fail-on`` severity."""
    worst = SEVERITIES.index(fail_on)
    return any(SEVERITIES.index(f["severity"]) <= worst for f in report["findings"])


def _usage_error(message: str) -> int:
    """Exit 2 on bad usage (kvwatch.cli prints it, and with --json as JSON on stdout too: JSON_USAGE_ERRORS)."""
    raise SettingsError(message)


# An engine's other endpoints, which a /metrics URL is often confused with: the hint replaces them.
_OTHER_ENDPOINTS = ("/health", "/ping", "/version", "/v1/models", "/v1", "/docs")


def _another_page(failure: ScrapeError) -> bool:
    """Whether the target may have answered with something other than a metrics page: no such path, or a whole
    body that is no exposition (HTML, JSON). A wrong port refuses whatever the path; a body cut short or
    compressed unannounced, or an engine's 500, came from the right place."""
    return failure.reason == "unrecognised" or failure.status in (404, 405) or (
        failure.reason == "parse" and failure.content)


def _url_hint(url: str) -> str | None:
    """A nudge when the URL does not end in /metrics (engines serve their metrics there, not at the root)."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path.endswith("/metrics"):
        return None
    base = next((path[: -len(e)] for e in _OTHER_ENDPOINTS if path.endswith(e)), None)
    parent, _, last = path.rpartition("/")
    if base is None and last.lower().startswith(("metric", "metrcs", "metics")):
        base = parent  # a misspelt /metrics ("/metric" became "/metric/metrics", which answered 404 too)

    def metrics_at(prefix: str) -> str:
        return urlunsplit((parts.scheme, parts.netloc, prefix + "/metrics", parts.query, ""))

    if base is not None or not path:
        return f"vLLM and SGLang serve their metrics at /metrics: try {metrics_at(base or '')}"
    # Another path: the root's /metrics, or the path's where a gateway mounts the engine under it.
    return f"vLLM and SGLang serve their metrics at /metrics: try {metrics_at('')} (or {metrics_at(path)} where the " \
        f"engine is served under {path})"


def _check_model_preset(model: str | None) -> None:
    """``--model`` here is kvwatch's alone (it sizes the advice): a name no preset matches is a typo, bad usage.
    (serve runs on without the capacity model instead: its model is also the one vLLM serves.)"""
    if model is None:
        return
    from kvwatch.capacity import presets

    try:
        presets.match_model(model)
    except presets.PresetError as exc:
        raise SettingsError(f"invalid value {model!r} for --model: {exc}") from None


def _read_file(path: Path, max_body_bytes: int) -> bytes:
    """At most one byte more than ``--max-body-bytes`` of the file (``-``: stdin): a larger one is refused as a
    scraped body is (:func:`_file_text`), without reading it all."""
    try:
        if str(path) == "-":
            return sys.stdin.buffer.read(max_body_bytes + 1)
        with path.open("rb") as file:
            return file.read(max_body_bytes + 1)
    except OSError as exc:
        raise SettingsError(f"cannot read --file {path}: {exc.strerror}") from None


def _file_text(data: bytes, max_body_bytes: int, source: str) -> str:
    """A saved payload as text. A gzip file (told by its magic bytes: a ``.gz`` copy, or a compressed response
    saved as it came) is inflated as a scraped body would be (fetch.CappedBody): every member, never past
    ``--max-body-bytes``, ``parse`` for a broken or truncated stream or bytes after it. What saving it on Windows
    adds is taken off, as it was never the engine's: a byte-order mark (UTF-16, as ``curl ... > file`` writes
    in Windows PowerShell 5.1, or UTF-8's) and CRLF line ends."""
    if len(data) > max_body_bytes:  # (a gzip file that large inflates past it too: gzip adds at most 0.02 %)
        raise ScrapeError("too_large", f"the file is larger than --max-body-bytes {max_body_bytes}")
    if data[:2] == GZIP_MAGIC:
        reader = CappedBody(zlib.decompressobj(16 + zlib.MAX_WBITS), max_body_bytes, source)
        reader.feed(data)
        data = bytes(reader.finish())
    boms = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
    charset = next((name for bom, name in boms if data.startswith(bom)), None)
    text = held_text(decode_body(data, charset, ""), len(data), max_body_bytes, source)
    return text.replace("\r\n", "\n")


def _fetch(settings: CheckSettings) -> str:
    with Fetcher(settings.target_url, timeout=settings.poll_timeout_seconds,
                 max_body_bytes=settings.max_body_bytes, bearer_token_file=settings.bearer_token_file,
                 ca_file=settings.ca_file, tls_verify=settings.tls_verify) as fetcher:
        return fetcher.fetch()


def _capacity_plans(settings: CheckSettings,
                    poll: Poll) -> tuple[dict[str, CapacityPlan], dict[str, int], list[str]]:
    """Capacity plan per model, as serve builds it: --model/--model-config, else a preset matching the
    model_name label. Returns (plans, the KV groups of known models without a plan, why not) for the models the
    capacity model cannot size."""
    from kvwatch.serve.sidecar_capacity import CapacityResolver

    resolver = CapacityResolver(settings)
    plans: dict[str, CapacityPlan] = {}
    kv_groups: dict[str, int] = {}
    unsized: dict[str, list[str]] = {}  # why -> the models (one line for models that share the reason: a card)
    first = {r.model_name: r for r in reversed(poll.readings)}  # the first engine's cache_config_info labels
    for name in sorted(first):
        capacity, why = resolver.sidecar(first[name])  # the plans serve resolves, the same way
        if capacity is not None:
            plans[name] = capacity.plan
        else:
            unsized.setdefault(why, []).append(name)
            groups = resolver.kv_groups(first[name])
            if groups:
                kv_groups[name] = groups
    return plans, kv_groups, [f"{', '.join(names)}: {why}" for why, names in unsized.items()]


def build_report(poll: Poll, max_model_len: int | None = None,
                 capacity_plans: Mapping[str, CapacityPlan] | None = None, *,
                 gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                 kv_groups: Mapping[str, int] | None = None, max_num_seqs: int | None = None,
                 given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``--json`` object (pure). ``capacity_plans`` maps model_name to a CapacityPlan, for the advice;
    ``kv_groups`` the KV groups of known models without one (kvwatch.capacity.series.resolve); ``max_num_seqs``
    the engine's --max-num-seqs when kvwatch was given it (which limit a standing queue points at); ``given`` the
    deployment settings kvwatch was given that the engine's labels also tell (kvwatch.capacity.findings)."""
    from kvwatch.capacity.series import resolve

    plans = capacity_plans or {}
    # one capacity per series (kvwatch.capacity.series): the engine's figures first, then the plan
    groups = kv_groups or {}
    capacities = {r.key: resolve(r, plans.get(r.model_name), groups.get(r.model_name)) for r in poll.readings}
    from kvwatch.capacity.series import max_model_len_of

    states = [derive(applied, None, max_model_len_of(applied, max_model_len))
              for applied in (capacities[r.key].apply(r) for r in poll.readings)]
    found = findings(states, poll.implausible, _advice_kind(poll.detection), max_num_seqs,
                     undetermined=poll.undetermined) + _capacity_findings(
        states, plans, max_model_len, capacities, poll.detection.engine_kind, given or {},
        poll.detection.version_range)
    found += _groups_unknown(poll, capacities, set(plans) | set(groups))
    found += _tensor_parallel_unlike_the_plan(poll.readings, plans)
    d = poll.detection
    ranks = _ranks_per_model(states, d.engine_kind, stages=OMNI_NOTE in d.version_range)
    found += _unbalanced_ranks(states, found, ranks)
    found.sort(key=lambda f: _SEVERITY_ORDER[f.severity])
    stuck = {(f.model_name, f.engine) for f in found if f.id == "request_exceeds_pool"}
    found = [f for f in found
             if not (f.id in ("scheduler_limited", "queue_not_admitted") and (f.model_name, f.engine) in stuck)]
    bound = {(f.model_name, f.engine) for f in found if f.id in ("kv_bound", "kv_full")}
    # (per series for capacity_mismatch; the tensor-parallel and given-settings findings are said once per model, of
    # all its engines and ranks)
    unlike = {f.model_name for f in found if f.id in ("tensor_parallel_mismatch", "engine_setting_mismatch")}
    mismatched = {(f.model_name, f.engine) for f in found if f.id == "capacity_mismatch"}
    mismatched |= {(r.model_name, r.engine) for r in poll.readings if r.model_name in unlike}
    # The same mismatch of every data-parallel rank is said once (the same paragraph per rank); every rank's fixes
    # still carry its caveat (``mismatched``, above)
    said: set[tuple[str, str]] = set()
    once: list[Finding] = []
    for f in found:
        if f.id == "capacity_mismatch":
            if (f.model_name, f.message) in said:
                continue
            said.add((f.model_name, f.message))
        once.append(f)
    found = once
    advice_kind = _advice_kind(d)
    report = {
        "engine_kind": d.engine_kind,
        "version_range": d.version_range,
        "usage_metric": d.usage_metric,
        "running_metric": d.running_metric,
        "waiting_metric": d.waiting_metric,
        "capacity_metric": d.capacity_metric,
        "series_dropped": poll.series_dropped,
        "series": [_series_json(s, _plan_caveat(
                                    advice(s, poll.timestamp, max_model_len, plans.get(s.reading.model_name),
                                           gpus_per_node=gpus_per_node, engine_kind=advice_kind,
                                           ranks_per_flag=ranks.get(s.reading.model_name, 1),
                                           other_ranks=_other_ranks(s, states)),
                                    (s.reading.model_name, s.reading.engine) in mismatched)
                                if (s.reading.model_name, s.reading.engine) in bound else [],
                                capacities[s.reading.key].source)
                   for s in states],
        "findings": [f.__dict__ for f in found],
    }
    return _json_safe(report)


_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
PLAN_CAVEAT = (" (The ratio is kvwatch's plan's, and the findings say that plan does not describe this engine: "
               "check the flags kvwatch was given before counting on it.)")


UNBALANCED_IDLE_USAGE = 0.5
"""A data-parallel rank this empty beside a full one of the same server is room the gateway's load does not reach."""


def _unbalanced_ranks(states: Sequence[SeriesState], found: Iterable[Finding],
                      ranks: Mapping[str, int]) -> list[Finding]:
    """``unbalanced_ranks``, once per model: a data-parallel rank is full (``kv_bound``/``kv_full``) while another
    of the same server has its KV cache under half used. A fix for more capacity (a replica, more GPUs) was advised
    while half the pod's KV sat idle: the requests are not spread (vLLM's DP load balancing, session affinity)."""
    full = {(f.model_name, f.engine) for f in found if f.id in ("kv_bound", "kv_full")}
    out: list[Finding] = []
    for model in sorted({m for m, e in full if ranks.get(m, 1) > 1}):
        mine = [s.reading for s in states if s.reading.model_name == model]
        # (an asleep rank has no room to offer: engine_asleep speaks for it)
        idle = [r for r in mine if r.kv_usage_ratio is not None and r.kv_usage_ratio < UNBALANCED_IDLE_USAGE
                and not r.asleep]
        if not idle:
            continue
        from kvwatch.capacity.units import percent

        hot = next(r for r in mine if (r.model_name, r.engine) in full)
        emptiest = min(idle, key=lambda r: r.kv_usage_ratio or 0.0)
        out.append(Finding("unbalanced_ranks", "warning", (
            f"Engine {printable(hot.engine)} is full while engine {printable(emptiest.engine)} of the same server "
            f"uses {percent(emptiest.kv_usage_ratio or 0.0)} of its KV cache: the requests are not spread over the "
            "data-parallel ranks (vLLM's DP load balancing, or session affinity pinning them), so the server has "
            "room the gateway's load does not reach. Look at that before adding capacity: the limits and fixes "
            "below assume ranks loaded alike."), model, hot.engine))
    return out


def _tensor_parallel_unlike_the_plan(readings: Iterable[Reading], plans: Mapping[str, Any]) -> list[Finding]:
    """``tensor_parallel_mismatch``, once per model: the payload shows more tensor-parallel ranks (SGLang's tp_rank
    copies) than the plan kvwatch was given (--tensor-parallel-size), so its sums, and a fix that raises the size
    "from" it, are for another deployment. Only more: a release may export from its first rank alone."""
    out: list[Finding] = []
    for r in readings:
        plan = plans.get(r.model_name)
        if plan is None or not r.tensor_parallel_ranks or r.model_name in {f.model_name for f in out}:
            continue
        tp = plan.spec.tensor_parallel_size
        if r.tensor_parallel_ranks > tp:
            out.append(Finding("tensor_parallel_mismatch", "warning", (
                f"The payload shows {r.tensor_parallel_ranks} tensor-parallel ranks (tp_rank), and kvwatch planned "
                f"for --tensor-parallel-size {tp}: pass --tensor-parallel-size {r.tensor_parallel_ranks} so that "
                "the capacity sums and the fixes describe this server."), r.model_name, r.engine))
    return out


def _plan_caveat(fixes: list[Advice], mismatched: bool) -> list[Advice]:
    """The plan-sized gains, marked where the plan does not describe the engine (``capacity_mismatch``,
    ``tensor_parallel_mismatch``): advice never quotes a figure without what the report says of its source. (A TP
    fix where the payload shows more ranks than the plan is the advisor's: kvwatch.advisor.as_shown_ranks.)"""
    if not mismatched:
        return fixes
    sized = (QUANTIZE_WEIGHTS, QUANTIZE_KV_CACHE, ADD_TENSOR_PARALLELISM, ADD_REPLICA)
    return [replace(a, projected_effect=a.projected_effect + PLAN_CAVEAT)
            if a.action in sized and re.search(r"\bx\d", a.projected_effect) else a for a in fixes]


# A running count below this share of --max-num-seqs is not held back by that cap (a few requests finish
# between the scheduler's steps and the poll).
SCHEDULER_CAP_SHARE = 0.9
EXIT_UNREAD = 3  # the payload could not be read (1 is --fail-on's findings, 2 bad usage)


def _groups_unknown(poll: Poll, capacities: Mapping[Any, Any], known_models: set[str]) -> list[Finding]:
    """``capacity_groups_unknown``, once per model: the capacity is vLLM's blocks × block size for a model kvwatch
    does not know, so it cannot tell whether the blocks are shared among KV groups (kvwatch.capacity.series)."""
    from kvwatch.capacity.kv import HYBRID_GROUPING_SINCE
    from kvwatch.engines.vllm import vllm_version_from_cache_config

    def groups_possible(reading: Reading) -> bool:  # vLLM >= 0.9: the hybrid allocator shares the blocks
        version = vllm_version_from_cache_config(reading.cache_config)
        if version is not None:
            return version >= HYBRID_GROUPING_SINCE
        return not poll.detection.version_range.startswith(("v0", "0.7", "0.8"))

    out: list[Finding] = []
    for r in poll.readings:
        if poll.detection.engine_kind != VLLM or r.model_name in known_models or \
                r.model_name in {f.model_name for f in out}:
            continue
        if capacities[r.key].source == "engine_num_gpu_blocks" and groups_possible(r):
            out.append(Finding("capacity_groups_unknown", "info", (
                "KV capacity is num_gpu_blocks x block_size, which assumes one KV cache group: on a sliding-window "
                "or hybrid model (Gemma-2/3, gpt-oss, Mamba hybrids) vLLM (0.9 and later) shares the blocks among "
                "its groups and the real figure is that divided by their number. kvwatch does not know this model: "
                "pass --model (a preset) or --model-config (its config.json) to divide them."),
                r.model_name, r.engine))
        elif capacities[r.key].source == "unknown" and blocks_shared_by_groups(r.cache_config):
            out.append(Finding("capacity_groups_unknown", "info", (
                "KV capacity unknown: vllm:cache_config_info sets mamba_page_size_padded, so this is a Mamba hybrid "
                "whose blocks vLLM shares among its KV groups, and num_gpu_blocks x block_size over-states the pool "
                "by their number, which kvwatch does not know for this model: pass --model (a preset) or "
                "--model-config (its config.json)."), r.model_name, r.engine))
    return out


def _capacity_findings(states: Iterable[SeriesState], plans: Mapping[str, Any], max_model_len: int | None,
                       capacities: Mapping[Any, Any], engine_kind: str = VLLM,
                       given: Mapping[str, Any] | None = None, version_range: str = "") -> list[Finding]:
    """kvwatch.capacity.findings per series: refused settings, formula vs engine, a leak, a request too big. The
    refusals and the formula are vLLM's sums: not given for SGLang or TensorRT-LLM, which size their pools
    their own way (--mem-fraction-static, free_gpu_memory_fraction)."""
    from kvwatch.capacity import findings as capacity
    from kvwatch.capacity.series import formula_in_engine_terms, max_model_len_of
    from kvwatch.engines.vllm import label_number, override_blocks

    out: list[Finding] = []
    refused: set[str] = set()
    page_at_most = _range_upper(version_range)
    for s in states:
        r = s.reading
        plan = plans.get(r.model_name)
        found = [capacity.live_finding(f, r.kv_usage_ratio, r.requests_running, r.requests_waiting,
                                       r.kv_capacity_tokens, max_model_len_of(r, max_model_len), asleep=r.asleep,
                                       prefill_server=r.prefill_server, deferred=r.requests_waiting_deferred,
                                       queue_holds_no_kv=r.waiting_holds_no_kv)
                 for f in capacity.LIVE_FINDINGS]
        if r.model_name not in refused:  # per model, not per engine
            refused.add(r.model_name)
            found += capacity.deployment_mismatches(max_model_len, given or {}, r, plan)
            found += capacity.plan_refusals(plan) if plan is not None and engine_kind == VLLM else []
            found.append(capacity.block_size_label_stale(label_number(r.cache_config.get("block_size")),
                                                         r.block_size))
        if plan is not None and engine_kind == VLLM and not plan.pool_measured_by_engine:
            # (vLLM >= 0.34 measures its pool: 0.33's sums are no yardstick for it, planner.EXTENSIBLE_KV_SINCE)
            found.append(capacity.capacity_mismatch(formula_in_engine_terms(plan, capacities[r.key].source),
                                                    r.kv_capacity_tokens, plan, override_blocks(r.cache_config),
                                                    label_number(r.cache_config.get("gpu_memory_utilization")),
                                                    page_at_most=page_at_most))
        out += [Finding(f.id, f.severity, f.message, r.model_name, r.engine) for f in found if f is not None]
    return out


def _range_upper(version_range: str) -> tuple[int, int] | None:
    """The newest vLLM release a detected generation can be ("0.9-0.11" and "0.11": 0.11), or None when it is open
    (">=0.26", "0.12-0.2x") or not one of vLLM's version numbers."""
    match = re.fullmatch(r"(?:\d+\.\d+-)?(\d+)\.(\d+)", version_range.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def _json_safe(value: Any) -> Any:
    """NaN and ±Inf (a vLLM gauge can read NaN) become None: JSON has no such numbers, and both mean unknown."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def advice(state: SeriesState, timestamp: float, max_model_len: int | None = None,
           capacity_plan: CapacityPlan | None = None, *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
           engine_kind: str = VLLM, ranks_per_flag: int = 1,
           other_ranks: Sequence[tuple[str | None, float]] = ()) -> list[Advice]:
    """The advisor's fixes for a series ``check`` found KV-bound, cheapest first (pure).

    One poll has no forecast history: the forecaster's one-sample result supplies the concurrency limit
    (95 % of the cache at this poll's mix), capped by the observed-mix ceiling the report shows beside it,
    and the state is the bottleneck ``check`` diagnosed.
    """
    from kvwatch.capacity.series import max_model_len_of

    reading = state.reading
    result = Forecaster().observe(ForecastSample.from_reading(reading, timestamp))
    estimates = dict(result.estimates)
    if reading.kv_tokens_per_running_request:
        estimates["tokens_per_running_request"] = reading.kv_tokens_per_running_request
    return advise_from_result(replace(result, state="bottleneck", estimates=estimates), reading,
                              capacity_plan=capacity_plan, max_model_len=max_model_len_of(reading, max_model_len),
                              concurrency_ceiling=state.max_concurrency.get("observed_mix"),
                              gpus_per_node=gpus_per_node, engine_kind=engine_kind, ranks_per_flag=ranks_per_flag,
                              other_ranks=other_ranks)


def _advice_kind(detection: Detection) -> str:
    """Whose settings the advice names: Triton's TensorRT-LLM backend is configured in its engine build and
    config.pbtxt, not by trtllm-serve's flags."""
    if detection.engine_kind == TENSORRT_LLM and detection.version_range.startswith("triton-backend"):
        return TRITON_TENSORRT_LLM
    return detection.engine_kind


def _series_json(s: SeriesState, fixes: Iterable[Advice] = (), capacity_source: str = "unknown") -> dict[str, Any]:
    r = s.reading
    return {
        "model_name": r.model_name,
        "engine": r.engine,
        "kv_usage_ratio": r.kv_usage_ratio,
        "requests_running": _count(r.requests_running),
        "requests_waiting": _count(r.requests_waiting),
        "waiting_by_reason": {k: _count(v) for k, v in r.waiting_by_reason.items()},
        "requests_swapped": _count(r.requests_swapped),
        "kv_capacity_tokens": _count(r.kv_capacity_tokens),
        "capacity_source": capacity_source,
        "kv_used_tokens": _count(r.kv_used_tokens),
        "max_concurrency": s.max_concurrency.get("observed_mix"),
        "max_concurrency_max_model_len": s.max_concurrency.get("max_model_len"),
        "concurrency_headroom": s.concurrency_headroom,
        "mean_request_tokens": s.mean_request_tokens,
        "num_gpu_blocks": _count(r.num_gpu_blocks),
        "block_size": _count(r.block_size),
        "preemptions_total": _count(r.preemptions_total),
        "prefix_cache_hit_ratio": r.prefix_cache_hit_ratio,
        "prefix_cache_unit": r.prefix_cache_unit,
        "prefix_caching_enabled": r.prefix_caching_enabled,
        "sleep_state": r.sleep_state,
        "advice": [a.as_json() for a in fixes],
    }


def _count(value: float | None) -> int | float | None:
    """A count (requests, tokens, blocks) as a JSON integer; a non-finite reading stays for _json_safe."""
    if value is None or not math.isfinite(value):
        return value
    return round(value)


def findings(states: Iterable[SeriesState],
             implausible: Iterable[tuple[tuple[str, str], str, float]] = (), engine_kind: str = VLLM,
             max_num_seqs: int | None = None,
             undetermined: Iterable[tuple[tuple[str, str], str, str]] = ()) -> list[Finding]:
    """Checklist findings per series, most severe first (pure). ``implausible`` is the poll's list of
    impossible values dropped to unknown (:mod:`kvwatch.plausible`); ``engine_kind`` names whose flags the
    messages give; ``max_num_seqs`` (given to kvwatch) tells which scheduler limit a standing queue hits.
    Each series gets at most one headline finding (:func:`_headline`), then the context beside it (:func:`_context`)."""
    states = list(states)
    ranks = _ranks_per_model(states, engine_kind)
    flags = engine_flags(engine_kind)
    dropped = _per_series(implausible)
    why = _per_series(undetermined)  # ``undetermined``: why a value the payload holds is unknown
    out: list[Finding] = []
    for s in states:
        r = s.reading
        bad, unknown = dropped.get(r.key, {}), why.get(r.key, {})
        # (built only if the headline is scheduler_limited; an engine kind without data-parallel ranks has 0: one)
        scheduler_fix = partial(_scheduler_fix, r.requests_running, max_num_seqs, flags, engine_kind,
                                ranks[r.model_name] or 1)
        headline = _headline(r, bad, unknown, scheduler_fix)
        if headline is not None:
            out.append(headline)
        out.extend(_context(r, bad, unknown))
    return sorted(out, key=lambda f: SEVERITIES.index(f.severity))


_V = TypeVar("_V")


def _per_series(values: Iterable[tuple[SeriesKey, str, _V]]) -> dict[SeriesKey, dict[str, _V]]:
    """``(series key, name, value)`` triples as ``{series key: {name: value}}``."""
    out: dict[SeriesKey, dict[str, _V]] = {}
    for key, name, value in values:
        out.setdefault(key, {})[name] = value
    return out


def _finding(r: Reading, finding_id: str, severity: str, message: str) -> Finding:
    return Finding(finding_id, severity, message, model_name=r.model_name, engine=r.engine)


def _headline(r: Reading, bad: Mapping[str, float], unknown: Mapping[str, str],
              scheduler_fix: Callable[[], str]) -> Finding | None:
    """The finding that says what holds a series back, or None: the first check that holds wins. A sleeping engine,
    or a KV usage kvwatch cannot read, gets no KV diagnosis; else the queue is diagnosed. ``bad``: the series'
    impossible values dropped to unknown; ``unknown``: why values the payload holds are unknown;
    ``scheduler_fix``: scheduler_limited's advice (:func:`_scheduler_fix`)."""
    from kvwatch.capacity.findings import leaking

    if r.asleep:
        return _finding(r, "engine_asleep", "info", _asleep_message(r))
    usage, waiting = r.kv_usage_ratio, r.requests_waiting_for_capacity or 0.0
    if usage is None or "kv_usage_ratio" in bad:
        return _finding(r, "usage_unknown", "warning", _usage_unknown_message(bad, unknown))
    if queue_waits_for_kv(usage, waiting, r.requests_running, no_room=no_room_in(r, usage)) and not leaking(r):
        return _finding(r, "kv_bound", "critical", _kv_bound_message(r, usage, waiting))
    in_transfer = r.requests_running == 0 and (r.requests_waiting_deferred or 0) > 0 and not leaking(r)
    # (no running count: serve reads such a poll as saturated too, and ranked its fixes where check gave none)
    if usage >= SATURATION_USAGE and (r.requests_running or in_transfer or r.requests_running is None) and \
            not r.prefill_server and r.requests_waiting is not None:
        # (check said "nothing to fix" at 97 % with no queue while serve read the same page as `bottleneck` and
        # advised a limit: the forecaster's saturated poll is usage at the line, queue or not)
        # info: one poll of a full cache with nothing waiting is a well-used GPU too (`--fail-on warning` would fail
        # a cron run at every busy minute); the fixes are for when it lasts
        # (nothing running, and requests in KV transfer holding it: a PD decode server's incoming transfers, which
        # serve read as saturated too, `bottleneck` and its fixes, while check said nothing of the KV)
        return _finding(r, "kv_full", "info", _kv_full_message(usage, r.requests_waiting_deferred if in_transfer
                                                               else None, running_unknown=r.requests_running is None))
    if r.requests_running == 0 and _standing_queue(r) and not r.prefill_server and not leaking(r):
        # No scheduler cap holds back a queue while nothing runs ("raise --max-num-seqs" was
        # said of 40 waiting beside 0 running at 30 %); at 5 % or less request_exceeds_pool says more, and a full
        # cache no request holds is kv_usage_stuck's.
        return _finding(r, "queue_not_admitted", "warning", _queue_not_admitted_message(r, usage, waiting))
    if r.engine_role == "decode" and r.engine_kind == SGLANG and not _waits_for_kv(r, usage) and \
            _standing_queue(r):
        return _finding(r, "decode_admission_waiting", "warning", _decode_admission(r, usage, waiting))
    if not _waits_for_kv(r, usage) and _standing_queue(r) and not r.prefill_server:
        if not r.kv_capacity_tokens:
            # Below 0.9 a queue waits for KV when the next prompt does not fit in the free tokens, which the page
            # cannot say without the capacity: "raise --max-num-seqs, more KV would not help" was said of one request
            # running at 0.40 with 25,000-token prompts, kv_bound once the capacity was known.
            return _finding(r, "queue_cause_unknown", "warning", _queue_cause_unknown_message(r, usage, waiting))
        return _finding(r, "scheduler_limited", "warning",
                        _scheduler_limited_message(r, usage, waiting, scheduler_fix()))
    if r.requests_waiting is None and "requests_waiting" not in unknown and "requests_waiting" not in bad and \
            not r.prefill_server:
        # (a 97 % full cache with no queue count raised no finding at all: kv_bound needs a waiting request)
        full = _waits_for_kv(r, usage)
        return _finding(r, "queue_unknown", "warning" if full else "info", _queue_unknown_message(usage, full))
    if r.requests_running is None and "requests_running" not in unknown and "requests_running" not in bad and \
            not r.prefill_server:
        # (93 % full with 5 waiting and no running family read "nothing to fix": a standing queue needs the running
        # count; from 0.95 it is kv_bound or kv_full, above)
        full = waiting >= 1 and usage >= BUSY_USAGE
        return _finding(r, "running_unknown", "warning" if full else "info", _running_unknown_message(usage, full))
    return None


def _asleep_message(r: Reading) -> str:
    if r.sleep_state == "asleep":
        # awake 0 with neither level: vLLM's sleep level 0 (scheduling paused, the KV kept) or
        # /release_kv_cache_memory (the KV freed, the weights kept) write the same labels (its record_sleep_state)
        return ("The engine is paused (vLLM's sleep level 0: its KV cache is kept) or has released its KV cache "
                "(release_kv_cache_memory); the page cannot say which. Requests wait until it is woken up "
                "(POST /wake_up), so no KV diagnosis is made for it.")
    return (f"The engine is in vLLM's sleep mode ({r.sleep_state}): its KV cache is released and requests wait "
            "until it is woken up (POST /wake_up), so no KV diagnosis is made for it.")


def _usage_unknown_message(bad: Mapping[str, float], unknown: Mapping[str, str]) -> str:
    """Why the KV usage is unknown: an impossible reading, a reason the payload gave, or no usage metric."""
    if "kv_usage_ratio" in bad:
        return (f"KV usage reads {floatToGoString(bad['kv_usage_ratio'])} this poll, which no KV cache can be "
                "(usage is 0..1): kvwatch cannot tell how full the KV cache is. Look at the engine (is it serving?), "
                "or point --usage-metric at a metric that has a value.")
    if "kv_usage_ratio" in unknown:
        return unknown["kv_usage_ratio"]
    return "No KV usage metric found: pass --usage-metric with the name your engine (or proxy) exports."


_FIXES_FOLLOW = "The advisor's fixes for this series follow, cheapest first (\"advice\" in --json)."


def _kv_bound_message(r: Reading, usage: float, waiting: float) -> str:
    """kv_bound's message: on a PD prefill server, with nothing running, below the KV-bound line (the next prompt
    does not fit), or at it."""
    from kvwatch.capacity.units import percent

    # Nothing running on an engine whose queue may hold KV (kvwatch.capacity.findings.kv_usage_stuck): a
    # PD prefill server's transfers, or a leak; the payload cannot tell which, so the message says both.
    fixes = _FIXES_FOLLOW
    if r.prefill_server:
        return (f"KV cache is {percent(usage)} full with {_requests(waiting)} waiting on this PD prefill "
                "server: its KV is held by requests whose KV is still being sent to the decode servers, "
                "so prefill waits for the decode side (more or faster decode servers, or a faster KV "
                f"transfer); no concurrency limit follows from its running count. {fixes}")
    if r.requests_running == 0:
        return (f"KV cache is {percent(usage)} full with {_requests(waiting)} waiting and nothing running. "
                "On a PD-disaggregated server these are its KV transfers (a prefill server's outgoing, a "
                "decode server's incoming) and the KV cache is the bottleneck. "
                f"{fixes} On any other server finished requests' blocks are not being freed (a KV "
                "leak: restart the engine), and those fixes would not help.")
    if usage < KV_BOUND_USAGE:
        mean, cached = r.mean_prompt_tokens or 0.0, r.prefix_cached_share or 0.0
        return (f"KV cache is {percent(usage)} full with {_requests(waiting)} waiting, and the "
                f"{_free_tokens(r, usage):,.0f} tokens free are fewer than the {mean * (1 - cached):,.0f} "
                f"a mean prompt needs (the mean since the engine started: {mean:,.0f} tokens"
                + (f", {cached:.0%} of them from the prefix cache" if cached else "") + "): the next "
                "request does not fit, so the KV cache is the bottleneck (a higher concurrency limit "
                f"would not start it). {fixes}")
    return (f"KV cache is {percent(usage)} full with {_requests(waiting)} waiting: the KV cache is the "
            f"bottleneck. {fixes}")


def _kv_full_message(usage: float, in_transfer: float | None = None, *, running_unknown: bool = False) -> str:
    from kvwatch.capacity.units import percent

    serve = f"kvwatch serve reads such a poll as saturated, and `bottleneck` once it lasts. {_FIXES_FOLLOW}"
    if in_transfer:
        return (f"KV cache is {percent(usage)} full with nothing running and {_requests(in_transfer)} in KV "
                "transfer (deferred): on a PD decode server its incoming transfers hold it, so new transfers wait for "
                "room and the prefill side waits for this server (more or faster decode servers, a faster KV "
                f"transfer, or more KV per server); no concurrency limit frees it. {serve}")
    unknown = (" (The page has no running count: a full cache no request holds, a leak, would read the same; "
               "pass --running-metric if the engine or its proxy exports one.)" if running_unknown else "")
    return (f"KV cache is {percent(usage)} full and no request waits for it yet: the running requests' growing "
            "outputs and the next arrivals need blocks it does not have, so the engine will queue or preempt (kv_bound "
            f"then). {serve}{unknown}")


def _queue_not_admitted_message(r: Reading, usage: float, waiting: float) -> str:
    from kvwatch.capacity.units import percent

    free = f" than the {_free_tokens(r, usage):,.0f} tokens free" if r.kv_capacity_tokens else " than is free"
    return (f"{_requests(waiting)} {_verb(waiting)} and none runs while KV is {percent(usage)} used: no scheduler "
            "cap holds them back, as nothing runs. The engine core may be stalled (kvwatch serve's state "
            "`stalled` tells over 3 minutes), blocks may be held by no running request (a leak, or a "
            f"PD-disaggregated server's KV transfers), or the request at the head of the queue needs more{free}. "
            "Look at the engine's log; if it persists, cancel the request at the head or restart the engine.")


def _queue_cause_unknown_message(r: Reading, usage: float, waiting: float) -> str:
    from kvwatch.capacity.units import percent

    mean = r.mean_prompt_tokens
    prompt = f" (the mean prompt since the engine started: {mean:,.0f} tokens)" if mean else ""
    return (f"{_requests(waiting)} {_verb(waiting)} while KV is {percent(usage)} used, and kvwatch cannot tell "
            "why: the KV cache's size is unknown, and below 90 % a queue waits for KV when the free tokens are "
            f"fewer than the next prompt needs{prompt}. If it fits, the scheduler limits; if not, the KV cache does. "
            + ("kvwatch's capacity model estimates it with --gpu and the model (--model, --model-config, or a preset "
               "matching model_name); where they were given, the notes on stderr say why it could not."
               if r.engine_kind == VLLM else "kvwatch's capacity model is vLLM's sums and does not size this engine's "
               "pool: its startup log gives the pool's size."))


def _scheduler_limited_message(r: Reading, usage: float, waiting: float, fix: str) -> str:
    from kvwatch.capacity.units import percent

    return (f"{_requests(waiting)} {_verb(waiting)} while KV is only {percent(usage)} used: the scheduler limits, "
            f"not KV. {fix}"
            "; more KV would not help"
            # (a lifetime count: at 0.885 beside preemptions the cache may swing full between polls)
            + (f", unless the {_plural(r.preemptions_total, 'preemption')} since the engine started go on "
               "(kvwatch serve's kvwatch_preemptions_per_second): then KV is full between polls"
               if r.preemptions_total else "")
            + ". One poll: watch kvwatch_state{state=\"scheduler_limited\"} (kvwatch serve) to see it persist.")


def _queue_unknown_message(usage: float, full: bool) -> str:
    from kvwatch.capacity.units import percent

    return ("The payload has no count of waiting requests, so kvwatch cannot tell whether requests wait for the "
            "KV cache" + (f", which is {percent(usage)} full: it may be the bottleneck" if full else "")
            + ". Pass --waiting-metric (and --running-metric) with the names the engine or its proxy exports, "
            "if it has them.")


def _running_unknown_message(usage: float, full: bool) -> str:
    from kvwatch.capacity.units import percent

    return ("The payload has no count of running requests, so kvwatch cannot tell a standing queue from arrivals the "
            "next step admits, nor a full cache its requests hold from one no request holds (a leak)"
            + (f": at {percent(usage)} full, the KV cache may be the bottleneck" if full else "")
            + ". Pass --running-metric with the name the engine or its proxy exports, if it has one.")


def _context(r: Reading, bad: Mapping[str, float], unknown: Mapping[str, str]) -> Iterator[Finding]:
    """The findings beside a series' headline, in this order: values unknown (and why), impossible values ignored,
    preemptions, an ineffective prefix cache, no KV capacity reported."""
    from kvwatch.capacity.units import percent

    for name, reason in sorted(unknown.items()):
        if name != "kv_usage_ratio":  # (usage has its own finding: the headline usage_unknown)
            yield _finding(r, "value_unknown", "warning", reason)
    others = sorted(n for n in bad if n != "kv_usage_ratio")
    if others:
        yield _finding(r, "implausible_values", "warning", (
            "Impossible values ignored (read as unknown): "
            + ", ".join(f"{n} = {floatToGoString(bad[n])}" for n in others)
            + ". Counts cannot be negative, infinite or NaN, and a pool, its blocks or a length cannot be 0 (or a "
            "fraction where whole): the target is not serving sane metrics."))
    if r.preemptions_total:
        yield _preemptions(r, r.preemptions_total)
    ratio = r.prefix_cache_hit_ratio
    if r.prefix_caching_enabled is not False and ratio is not None and ratio < PREFIX_HIT_RATIO_LOW and \
            (r.prefix_cache_queries_total or 0) >= PREFIX_MIN_QUERIES:
        yield _finding(r, "prefix_cache_ineffective", "info", (
            f"Prefix cache hit ratio is {percent(ratio)}"
            + (f" (of {r.prefix_cache_unit})" if r.prefix_cache_unit else "") + ": prefix caching will not add "
            "capacity for this traffic; do not count on it when sizing."))
    if r.kv_capacity_tokens is None and "kv_capacity_tokens" not in unknown and \
            not (r.num_gpu_blocks and blocks_shared_by_groups(r.cache_config)):  # (capacity_groups_unknown)
        # (an undetermined capacity has its own finding, saying why: not one to estimate with `plan`)
        yield _finding(r, "capacity_unknown", "info", _capacity_unknown_message(r.engine_kind))


def _capacity_unknown_message(engine_kind: str) -> str:
    """capacity_unknown's message for the engine on the page (it listed all three engines' cases on each, and sent an
    SGLang page's reader to `kvwatch plan`, whose vLLM sums kvwatch itself does not take for SGLang's pool)."""
    own_pool = {SGLANG: ("SGLang", "without max_total_num_tokens: early 2025, 0.5.2-0.5.5"),
                TENSORRT_LLM: ("TensorRT-LLM", "without its max blocks and tokens per block")}
    if engine_kind in own_pool:
        engine, when = own_pool[engine_kind]
        return (f"The engine does not report KV capacity here ({engine} {when}): the KV usage is its own, so the "
                "usage findings and alerts hold, and so do the observed-mix ceiling and the limit, but the used tokens "
                f"and the max-model-len ceiling are unknown; kvwatch's capacity model is vLLM's sums and does not size "
                f"{engine}'s pool.")
    return ("The engine does not report a usable KV capacity here (no kv_cache_size_tokens, and num_gpu_blocks or "
            "block_size is None or absent, or one implausible_values names): kvwatch's capacity model estimates it "
            "with --model (or a preset matching model_name) and --gpu; where they were given, the findings or the "
            "notes on stderr say why it could not.")


def _preemptions(r: Reading, preemptions: float) -> Finding:
    from kvwatch.capacity.units import percent

    usage = r.kv_usage_ratio
    # A lifetime count: one poll cannot tell whether the thrash goes on, unless the cache is full now (the
    # rule kv_bound uses: then it warns beside it); else it is context, or `--fail-on warning` failed every
    # cron run until the engine restarted.
    thrashing = usage is not None and _waits_for_kv(r, usage)
    if thrashing and r.prefill_server:  # ("lower concurrency" beside kv_bound's "no concurrency limit follows")
        now = ("On this PD prefill server its KV is held for the transfers to the decode servers: a concurrency limit "
               "would not free it; more or faster decode servers, or a faster KV transfer, would.")
    elif thrashing and r.requests_running == 0:  # (the advisor gives no limit then: it would free none of the KV)
        now = ("With nothing running, a concurrency limit would free none of the KV held: KV transfers hold it (a "
               "PD-disaggregated server), or it leaked (restart the engine).")
    elif thrashing:
        now = "Lower concurrency or free KV memory."
    else:
        full = f"The cache is {percent(usage)} full now" if usage is not None else "KV usage is unknown now"
        now = f"{full}: one poll cannot tell whether it goes on; kvwatch serve's " \
              "kvwatch_preemptions_per_second does."
    return _finding(r, "preemptions", "warning" if thrashing else "info", (
        f"{_plural(preemptions, 'preemption')} since the engine started: requests are evicted and "
        f"recomputed (KV thrash). {now}"))


def _other_ranks(state: SeriesState, states: Iterable[SeriesState]) -> list[tuple[str | None, float]]:
    """(engine, observed-mix ceiling) of the same model's other ranks that have a ceiling and are awake (an asleep
    rank's frozen mix set the server's gateway total; serve exports no limit for it either)."""
    return [(s.reading.engine, c) for s in states if s.reading.model_name == state.reading.model_name
            and s.reading.engine != state.reading.engine and not s.reading.asleep
            and (c := s.max_concurrency.get("observed_mix"))]


def _ranks_per_model(states: Iterable[SeriesState], engine_kind: str, *, stages: bool = False) -> Counter[str]:
    """The data-parallel ranks of one server, per model: SGLang's dp_rank series (its flags name the server's total,
    and --enable-dp-attention divides them over the ranks) and vLLM's engine series (the engine cores one API server
    fronts, each scheduling its own requests: the gateway's limit is theirs together); TensorRT-LLM: none; nor
    vLLM-Omni's ``stages``, a pipeline's engines, each configured apart (kvwatch.engines.detect.OMNI_NOTE)."""
    if engine_kind not in (SGLANG, VLLM) or stages:
        return Counter()
    return Counter(s.reading.model_name for s in states)


def _scheduler_fix(running: float | None, max_num_seqs: int | None, flags: Mapping[str, str | None],
                   engine_kind: str, ranks: int = 1) -> str:
    """Which scheduler limit to raise: with ``max_num_seqs`` known and well above the running count, the running
    cap is not what holds requests back, so the token budget is (a step's prefill tokens); at the cap, the cap.
    SGLang with ``ranks`` data-parallel ranks may divide its cap over them (--enable-dp-attention, which the payload
    does not say): when the running count is near that share, either may hold requests back."""
    sglang = " or lower --schedule-conservativeness" if engine_kind == SGLANG else ""
    concurrency, budget = flags["concurrency"], flags["token_budget"]
    if max_num_seqs and running is not None and running > max_num_seqs:
        return (f"{_requests(running)} {_run(running)}, more than the {concurrency} {max_num_seqs} kvwatch was given, "
                f"so the engine does not run with it (give kvwatch the engine's value): raise {concurrency} or "
                f"{budget} (token budget){sglang}")
    share = max_num_seqs / ranks if max_num_seqs else 0.0
    if engine_kind == SGLANG and max_num_seqs and ranks > 1 and running is not None and \
            min(SCHEDULER_CAP_SHARE * share, share - 1) <= running <= share:  # (a margin of one request, as below)
        return (f"{_requests(running)} {_run(running)} on this rank: under {concurrency} {max_num_seqs}, but at "
                f"the {max_num_seqs // ranks} each of its {ranks} ranks gets with --enable-dp-attention (the payload "
                f"does not say which runs): raise {concurrency} if it is on, else {budget} (token budget){sglang}")
    if max_num_seqs and running is not None and running < min(SCHEDULER_CAP_SHARE * max_num_seqs, max_num_seqs - 1):
        # (a margin of at least one request: 7 running of --max-num-seqs 8 would read "well under" it)
        return (f"{_requests(running)} {_run(running)}, well under {concurrency} {max_num_seqs}, so that cap is "
                f"not it: raise {budget} (token budget){sglang}")
    if max_num_seqs and running is not None:
        return f"{_requests(running)} {_run(running)}, at {concurrency} {max_num_seqs}: raise {concurrency}{sglang}"
    return f"Raise {concurrency} or {budget} (token budget){sglang}"


def _free_tokens(r: Reading, usage: float) -> float:
    return (1.0 - usage) * (r.kv_capacity_tokens or 0.0)


SGLANG_DECODE_RESERVE_TOKENS = 512  # SGLang's --num-reserved-decode-tokens default (its srt/server_args.py)


def _decode_admission(r: Reading, usage: float, waiting: float) -> str:
    """An SGLang PD decode server's queue for room below the KV-bound line: its prealloc queue admits a transferred
    request only when its tokens fit beside the room reserved for each running request's decode, and a request slot is
    free (SGLang's srt/disaggregation/decode.py). Which of the two holds it the payload does not say:
    scheduler_limited's "raise --max-running-requests, more KV would not help" adds reservations where the reserve is
    what is full."""
    from kvwatch.capacity.units import percent  # (lazy: check loads the capacity model only where it sizes something)

    text = (f"{_requests(waiting)} {_verb(waiting)} to be admitted on this PD decode server while KV is "
            f"{percent(usage)} used. A decode server admits a transferred request only when its tokens fit beside the "
            "room reserved for each running request's decode (--num-reserved-decode-tokens) and a request slot is "
            "free (--max-running-requests); the payload does not say which holds them.")
    running = r.requests_running or 0.0
    if r.kv_capacity_tokens and running:
        reserved, free = running * SGLANG_DECODE_RESERVE_TOKENS, _free_tokens(r, usage)
        text += (f" At the default reserve of {SGLANG_DECODE_RESERVE_TOKENS} tokens, the {_requests(running)} running "
                 f"hold back {reserved:,.0f} tokens, " + (
                     f"more than the {free:,.0f} free: likely KV (add KV to this server, or lower the reserve)."
                     if reserved > free else
                     f"fewer than the {free:,.0f} free: likely the request slots (raise --max-running-requests)."))
    return text


def _waits_for_kv(r: Reading, usage: float) -> bool:
    """Whether the cache is full enough that a queue there may wait for KV: ``u_busy`` (0.90) used, or fewer tokens
    free than a mean prompt needs (detector.no_room_for_next_request): no scheduler limit then, and preemptions are
    current (kv_bound itself asks queue_waits_for_kv, which also weighs the queue). One poll has only the mean since
    the engine started; serve's state takes the last 30 minutes', so after a change of mix the two can differ (the
    message says which mean it used)."""
    return usage >= KV_BOUND_USAGE or no_room_in(r, usage)


def _standing_queue(r: Reading) -> bool:
    """Requests waiting for scheduling capacity in a queue one poll can trust (kvwatch.forecast.thresholds);
    requests deferred for a LoRA slot or a KV transfer are not helped by --max-num-seqs
    (Reading.requests_waiting_for_capacity)."""
    return standing_queue(r.requests_waiting_for_capacity, r.requests_running)


def _plural(n: float, noun: str) -> str:
    return f"{n:,.0f} {noun}{'' if n == 1 else 's'}"


def _requests(n: float) -> str:
    return _plural(n, "request")


def _run(n: float) -> str:
    return "runs" if n == 1 else "run"


def _verb(n: float) -> str:
    return "waits" if n == 1 else "wait"


def _fmt(value: Any, spec: str = "g") -> str:
    return "unknown" if value is None else format(value, spec)


def _note(text: str) -> None:
    """A line on stderr: its scraped parts (model names, label values in a refusal) on that one line."""
    print(printable(text), file=sys.stderr)


def render(report: dict[str, Any]) -> str:
    from kvwatch.capacity.units import percent

    lines = [f"Detected: {report['engine_kind']} {report['version_range']}, KV usage from "
             f"{report['usage_metric'] or 'nothing (no usage metric found)'}"]
    for s in report["series"]:
        lines.append(f"\n{printable(s['model_name'])} engine {printable(s['engine'])}:")
        usage, used, capacity = s["kv_usage_ratio"], s["kv_used_tokens"], s["kv_capacity_tokens"]
        lines.append(f"  KV usage        {'unknown' if usage is None else percent(usage)}"
                     + (f" ({used:,} of {capacity:,} tokens)" if used is not None and capacity is not None else ""))
        running, waiting = s["requests_running"], s["requests_waiting"]
        # (vLLM's reasons: "capacity" read as the cache's size, not as what the requests wait for)
        reasons = ", ".join(f"{n:,} for {reason}" for reason, n in s["waiting_by_reason"].items() if n)
        lines.append(f"  queue           {_fmt(running, ',')} running, {_fmt(waiting, ',')} waiting"
                     + (f" ({reasons})" if reasons else ""))
        # (the formula's figure read as the engine's own; --json said "formula" only)
        estimated = " (kvwatch's estimate from the model and the card: the engine reports none)" \
            if s["capacity_source"] == "formula" else ""
        # ("740 more fit" stood above a finding that the sleeping engine's cache is released)
        sleep = s["sleep_state"]
        asleep = "" if sleep in (None, "awake") else \
            " once awake (the engine is asleep" + ("" if sleep == "asleep" else f": {sleep}") + ")"
        lines.append("  KV capacity     " + (f"{capacity:,} tokens{estimated}{asleep}" if capacity is not None
                                             else "unknown"))
        mix, worst = s["max_concurrency"], s["max_concurrency_max_model_len"]
        lines.append(f"  max concurrency {_fmt(mix, '.1f')} at the observed mix, {_fmt(worst, '.1f')} at max-model-len"
                     + asleep
                     # No request is longer than max-model-len: a mix below it counts KV that no running request
                     # holds (a request waiting with its KV, transfers), which the limit must leave room for.
                     + (" (the mix is below it: KV held by no running request counts against it)"
                        if mix is not None and worst is not None and mix < worst else ""))
    lines.append("\nFindings:" if report["findings"] else "\nFindings: none, nothing to fix.")
    for f in report["findings"]:
        lines.append(f"  [{f['severity']}] {f['id']} ({printable(f['model_name'])}/{printable(f['engine'])}): "
                     f"{printable(f['message'])}")
    for s in report["series"]:
        if s["advice"]:
            lines.append(f"\nFixes for {printable(s['model_name'])} engine {printable(s['engine'])}, cheapest first:")
            for a in s["advice"]:
                lines.append(f"  {a['rank']}. {printable(a['message'])}")
                if a["engine_args"]:
                    engine = ENGINE_NAMES.get(report["engine_kind"], report["engine_kind"])
                    lines.append(f"     {engine} flags: {' '.join(a['engine_args'])}")
                lines.append(f"     Effect: {a['projected_effect']}")
    return "\n".join(lines)
