"""Every metric the rule pack and the dashboard read exists: exported by kvwatch (per docs/metrics.md), by
vLLM (per the catalogue of real wire names, src/kvwatch/data/vllm_catalogue.json), recorded by the rule
pack itself, or synthesised by Prometheus (``up``, ``ALERTS``).

This is the test that keeps us from shipping what public vLLM alert packs shipped: a query on
``vllm:num_preemptions``, a name that never exists on the wire (the counter is ``..._total``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from e2e.queries import Query, annotation_queries, dashboard_queries, metric_names, recorded_names, rule_queries

ROOT = Path(__file__).resolve().parents[1]
METRICS_DOC = ROOT / "docs" / "metrics.md"
CATALOGUE = ROOT / "src" / "kvwatch" / "data" / "vllm_catalogue.json"
PROMETHEUS_SYNTHESISED = {"up", "ALERTS", "ALERTS_FOR_STATE"}
# kube-state-metrics' STABLE pod metrics (its docs/metrics/workload/pod-metrics.md), read by VLLMContainerRestartLoop.
KUBE_STATE_METRICS = {"kube_pod_container_status_restarts_total", "kube_pod_container_status_last_terminated_reason"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def documented_kvwatch_metrics() -> set[str]:
    assert METRICS_DOC.is_file(), "docs/metrics.md is missing: it is the contract for kvwatch's metric names"
    return set(re.findall(r"\b(kvwatch_[a-z0-9_]+)\b", METRICS_DOC.read_text()))


def vllm_wire_names() -> set[str]:
    """Every sample name vLLM puts on the wire in any catalogued version (histograms expand to 3 names)."""
    profiles = json.loads(CATALOGUE.read_text())["profiles"]
    names = set()
    for families in profiles.values():
        for family, spec in families.items():
            if spec["type"] == "histogram":
                names.update(family + suffix for suffix in HISTOGRAM_SUFFIXES)
            else:
                names.add(family)
    return names


def known_names() -> set[str]:
    return (documented_kvwatch_metrics() | vllm_wire_names() | recorded_names() | PROMETHEUS_SYNTHESISED
            | KUBE_STATE_METRICS)


def unknown_names(queries: list[Query], known: set[str]) -> dict[str, set[str]]:
    problems: dict[str, set[str]] = {}
    for query in queries:
        missing = metric_names(query.expr) - known
        if missing:
            problems[query.where] = missing
    return problems


def test_catalogue_has_the_names_the_lint_relies_on() -> None:
    names = vllm_wire_names()
    assert {"vllm:num_preemptions_total", "vllm:num_requests_waiting_by_reason", "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket"} <= names
    assert "vllm:num_preemptions" not in names


def test_metrics_doc_documents_the_contract_names() -> None:
    documented = documented_kvwatch_metrics()
    for name in ("kvwatch_up", "kvwatch_kv_usage_ratio", "kvwatch_requests_waiting", "kvwatch_state",
                 "kvwatch_kv_exhaustion_eta_seconds", "kvwatch_build_info"):
        assert name in documented


def test_rule_pack_reads_only_real_metrics() -> None:
    queries = rule_queries()
    assert len(queries) >= 17
    assert unknown_names(queries, known_names()) == {}


def test_alert_annotations_query_only_real_metrics() -> None:
    """Some descriptions run a query (the main poll error reason, whether requests queue): same lint."""
    queries = annotation_queries()
    assert {q.where for q in queries} >= {"annotation summary of KVCacheBottleneck",
                                          "annotation description of KvwatchTargetDown"}
    assert unknown_names(queries, known_names()) == {}


def test_dashboard_reads_only_real_metrics() -> None:
    queries = dashboard_queries()
    assert len(queries) >= 25
    assert unknown_names(queries, known_names()) == {}


@pytest.mark.parametrize(
    ("expr", "unknown"),
    [
        ("rate(vllm:num_preemptions[5m]) > 0", {"vllm:num_preemptions"}),  # the public packs' mistake
        ('sum by (model_name) (vllm:gpu_cache_usage_sys{pod=~".*"})', {"vllm:gpu_cache_usage_sys"}),
        ("kvwatch_kv_usage_percent > 0.95", {"kvwatch_kv_usage_percent"}),
        ("histogram_quantile(0.9, rate(vllm:request_prompt_tokens_bucket[5m]))", set()),
        ('rate(vllm:num_preemptions_total{model_name="x"}[5m]) offset 10m', set()),
        ('kvwatch_up == 0 and on (instance, job) group_left (model_name) kvwatch_build_info', set()),
    ],
)
def test_lint_flags_names_that_do_not_exist(expr: str, unknown: set[str]) -> None:
    assert unknown_names([Query("example", expr)], known_names()) == ({"example": unknown} if unknown else {})


def test_name_extraction_ignores_functions_labels_keywords_and_strings() -> None:
    expr = ('max by (pod, state) (max_over_time(kvwatch_state{state="filling", pod=~"a|b"}[5m] offset 30m)) '
            'and on (instance) (time() - kvwatch_last_success_timestamp_seconds > +Inf)')
    assert metric_names(expr) == {"kvwatch_state", "kvwatch_last_success_timestamp_seconds"}
