"""``kvwatch check [URL] [--file PATH] [--json]``: one poll, then a diagnosis a person can act on.

Findings follow the troubleshooting checklist (stable ids, see docs/metrics.md):
``kv_bound`` (KV ≥ 0.95 with a queue), ``scheduler_limited`` (a queue while KV < 0.9), ``preemptions``
(any preemption since vLLM started), ``prefix_cache_ineffective`` (prefix caching on, hit ratio < 10 %),
``capacity_unknown`` and ``usage_unknown`` (kvwatch cannot read them from this vLLM).
Exit codes: 0 when the payload was read (whatever the findings), 1 when it could not be, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvwatch.engines import SourceOverrides
from kvwatch.fetch import Fetcher, ScrapeError, interpret
from kvwatch.model import Poll
from kvwatch.settings import ServeSettings, SettingsError, add_settings_flags, load_settings
from kvwatch.state import SeriesState, derive

KV_BOUND_USAGE = 0.95
SCHEDULER_LIMITED_BELOW = 0.9
PREFIX_HIT_RATIO_LOW = 0.10
PREFIX_MIN_QUERIES = 1000  # fewer queried tokens/blocks than this says nothing about the hit ratio

_FLAGS = {"usage_metric", "running_metric", "waiting_metric", "poll_timeout_seconds", "max_body_bytes",
          "bearer_token_file", "ca_file", "tls_verify", "max_model_len"}


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str  # critical | warning | info
    message: str
    model_name: str | None = None
    engine: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="?", default=None,
                        help="vLLM /metrics URL (default: --target-url / KVWATCH_TARGET_URL, "
                             "http://127.0.0.1:8000/metrics)")
    parser.add_argument("--file", type=Path, default=None, metavar="PATH",
                        help="read a saved /metrics payload instead of fetching ('-' for stdin)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    add_settings_flags(parser, ServeSettings, only=_FLAGS | {"target_url"})


def run(args: argparse.Namespace) -> int:
    if args.url is not None:
        args.target_url = args.url
    if args.file is not None and args.url is not None:
        raise SettingsError("give either URL or --file, not both")
    # check runs once, so the serve-only rule "timeout below the poll interval" must not bite here.
    args.poll_interval_seconds = "1e9"
    settings: ServeSettings = load_settings(ServeSettings, args)
    try:
        overrides = SourceOverrides.from_settings(settings)
    except ValueError as exc:
        raise SettingsError(f"invalid source-metric override: {exc}") from None
    now = time.time()
    try:
        text = _read_file(args.file) if args.file is not None else _fetch(settings)
        poll = interpret(text, overrides, timestamp=now)
    except ScrapeError as exc:
        source = str(args.file) if args.file is not None else settings.target_url
        if args.json:
            print(json.dumps({"error": {"reason": exc.reason, "message": str(exc), "source": source}}))
        else:
            print(f"kvwatch check: {exc.reason}: {exc}" if args.file is None else
                  f"kvwatch check: cannot read {source} ({exc.reason}): {exc}", file=sys.stderr)
        return 1
    report = build_report(poll, settings.max_model_len)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def _read_file(path: Path) -> str:
    try:
        if str(path) == "-":
            return sys.stdin.read()
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SettingsError(f"cannot read --file {path}: {exc.strerror}") from None


def _fetch(settings: ServeSettings) -> str:
    with Fetcher(settings.target_url, timeout=float(settings.poll_timeout_seconds or 4.0),
                 max_body_bytes=settings.max_body_bytes, bearer_token_file=settings.bearer_token_file,
                 ca_file=settings.ca_file, tls_verify=settings.tls_verify) as fetcher:
        return fetcher.fetch()


def build_report(poll: Poll, max_model_len: int | None = None) -> dict[str, Any]:
    """The ``--json`` object (pure)."""
    states = [derive(r, None, max_model_len) for r in poll.readings]
    d = poll.detection
    return {
        "engine_kind": d.engine_kind,
        "version_range": d.version_range,
        "usage_metric": d.usage_metric,
        "series": [_series_json(s) for s in states],
        "findings": [f.__dict__ for f in findings(states)],
    }


def _series_json(s: SeriesState) -> dict[str, Any]:
    r = s.reading
    return {
        "model_name": r.model_name,
        "engine": r.engine,
        "kv_usage_ratio": r.kv_usage_ratio,
        "requests_running": r.requests_running,
        "requests_waiting": r.requests_waiting,
        "waiting_by_reason": dict(r.waiting_by_reason),
        "requests_swapped": r.requests_swapped,
        "kv_capacity_tokens": r.kv_capacity_tokens,
        "kv_used_tokens": r.kv_used_tokens,
        "max_concurrency": s.max_concurrency.get("observed_mix"),
        "max_concurrency_max_model_len": s.max_concurrency.get("max_model_len"),
        "concurrency_headroom": s.concurrency_headroom,
        "mean_request_tokens": s.mean_request_tokens,
        "num_gpu_blocks": r.num_gpu_blocks,
        "block_size": r.block_size,
        "preemptions_total": r.preemptions_total,
        "prefix_cache_hit_ratio": r.prefix_cache_hit_ratio,
        "prefix_cache_unit": r.prefix_cache_unit,
        "prefix_caching_enabled": r.prefix_caching_enabled,
    }


def findings(states: Iterable[SeriesState]) -> list[Finding]:
    """Checklist findings per series, most severe first (pure)."""
    out: list[Finding] = []
    for s in states:
        r = s.reading
        where = {"model_name": r.model_name, "engine": r.engine}
        usage, waiting = r.kv_usage_ratio, r.requests_waiting or 0.0
        if usage is None:
            out.append(Finding("usage_unknown", "warning", "No KV usage metric found: pass --usage-metric with the "
                               "name your vLLM (or proxy) exports.", **where))
        elif usage >= KV_BOUND_USAGE and waiting > 0:
            out.append(Finding("kv_bound", "critical", (
                f"KV cache is {usage:.0%} full with {waiting:g} requests waiting: the KV cache is the bottleneck. "
                "Cheapest fixes first: limit concurrency (--max-num-seqs or the router), lower --max-model-len, "
                "quantize (--kv-cache-dtype fp8, then weights), add tensor parallelism."), **where))
        elif usage < SCHEDULER_LIMITED_BELOW and waiting > 0:
            out.append(Finding("scheduler_limited", "warning", (
                f"{waiting:g} requests wait while KV is only {usage:.0%} used: the scheduler limits, not KV. "
                "Raise --max-num-seqs or --max-num-batched-tokens (token budget); more KV would not help."),
                **where))
        if r.preemptions_total:
            out.append(Finding("preemptions", "warning", (
                f"{r.preemptions_total:g} preemptions since vLLM started: requests are evicted and recomputed "
                "(KV thrash). Lower concurrency or free KV memory."), **where))
        ratio = r.prefix_cache_hit_ratio
        if r.prefix_caching_enabled is not False and ratio is not None and ratio < PREFIX_HIT_RATIO_LOW and \
                (r.prefix_cache_queries_total or 0) >= PREFIX_MIN_QUERIES:
            out.append(Finding("prefix_cache_ineffective", "info", (
                f"Prefix cache hit ratio is {ratio:.1%} ({r.prefix_cache_unit}): prefix caching will not add "
                "capacity for this traffic; do not count on it when sizing."), **where))
        if r.kv_capacity_tokens is None:
            out.append(Finding("capacity_unknown", "info", (
                "vLLM does not report KV capacity here (no kv_cache_size_tokens, or num_gpu_blocks is None): "
                "use `kvwatch plan` with --model and --gpu to estimate it."), **where))
    order = {"critical": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda f: order[f.severity])


def _fmt(value: Any, spec: str = "g") -> str:
    return "unknown" if value is None else format(value, spec)


def render(report: dict[str, Any]) -> str:
    lines = [f"Detected: {report['engine_kind']} {report['version_range']}, KV usage from "
             f"{report['usage_metric'] or 'nothing (no usage metric found)'}"]
    for s in report["series"]:
        lines.append(f"\n{s['model_name']} engine {s['engine']}:")
        usage = s["kv_usage_ratio"]
        lines.append(f"  KV usage        {_fmt(usage, '.1%')}"
                     + (f" ({s['kv_used_tokens']:,.0f} of {s['kv_capacity_tokens']:,.0f} tokens)"
                        if s["kv_used_tokens"] is not None else ""))
        lines.append(f"  queue           {_fmt(s['requests_running'])} running, {_fmt(s['requests_waiting'])} waiting"
                     + (f" {s['waiting_by_reason']}" if s["waiting_by_reason"] else ""))
        lines.append(f"  KV capacity     {_fmt(s['kv_capacity_tokens'], ',.0f')} tokens")
        lines.append(f"  max concurrency {_fmt(s['max_concurrency'], '.1f')} at the observed mix, "
                     f"{_fmt(s['max_concurrency_max_model_len'], '.1f')} at max-model-len")
    lines.append("\nFindings:" if report["findings"] else "\nFindings: none, nothing to fix.")
    for f in report["findings"]:
        lines.append(f"  [{f['severity']}] {f['id']} ({f['model_name']}/{f['engine']}): {f['message']}")
    return "\n".join(lines)
