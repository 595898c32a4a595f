"""The Grafana dashboard is a valid schemaVersion-39 dashboard whose queries parse and show what the
issue asks for. The schema (tests/fixtures/grafana/) is written from Grafana's documented dashboard
model; query metric names are linted in test_metric_lint.py."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

from e2e.queries import dashboard_queries, promtool_parse_errors

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = json.loads((ROOT / "dashboards" / "kvwatch.json").read_text())
SCHEMA = json.loads((ROOT / "tests" / "fixtures" / "grafana" / "dashboard-v39.schema.json").read_text())
DOC = (ROOT / "docs" / "dashboards.md").read_text()
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# What the issue lists, and the panel (by title) that shows it.
REQUIRED_PANELS = {
    "KV usage with the 0.95 line": "KV cache usage",
    "KV usage vs concurrency curve": "KV usage vs running requests ($pod)",
    "forecast vs actual": "Forecast vs actual",
    "the ETA": "Earliest ETA",
    "the saturation risk": "KV saturation risk",
    "queue: running, waiting, by reason": "Requests: running and waiting",
    "preemption rate": "Preemption rate",
    "engine-reported vs formula capacity": "KV capacity: engine-reported vs formula",
    "concurrency ceiling and headroom": "Concurrency ceiling and headroom",
    "what-if ceilings": "What-if concurrency ceilings",
    "state timeline": "Forecast state",
    "kvwatch health": "kvwatch reads vLLM (kvwatch_up)",
}


def panels() -> list[dict]:
    return [p for p in DASHBOARD["panels"] if p["type"] != "row"]


def panel(title: str) -> dict:
    return next(p for p in panels() if p["title"] == title)


def validator() -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    return jsonschema.Draft202012Validator(SCHEMA)


def test_dashboard_validates_against_the_schema_version_it_declares() -> None:
    assert DASHBOARD["schemaVersion"] == 39
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator().iter_errors(DASHBOARD)]
    assert errors == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["panels"][1].__setitem__("gridpos", d["panels"][1].pop("gridPos")),  # misspelt key
        lambda d: d["panels"][1]["gridPos"].__setitem__("w", 25),  # wider than the grid
        lambda d: d["panels"][1]["fieldConfig"]["defaults"]["thresholds"]["steps"][0].__setitem__("value", 0),
        lambda d: d["templating"]["list"][1].__setitem__("type", "querry"),
        lambda d: d.__setitem__("schemaVersion", 41),
    ],
    ids=["misspelt-key", "too-wide", "first-threshold-not-base", "bad-variable-type", "other-schema-version"],
)
def test_schema_rejects_broken_dashboards(mutate) -> None:
    broken = copy.deepcopy(DASHBOARD)
    mutate(broken)
    assert list(validator().iter_errors(broken)), "the schema should have rejected this dashboard"


def test_variables_datasource_namespace_model_pod() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "model", "pod"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, label in (("namespace", "namespace"), ("model", "model_name"), ("pod", "pod")):
        variable = variables[name]
        assert variable["type"] == "query" and variable["datasource"] == DATASOURCE
        assert variable["includeAll"] and variable["multi"] and variable["allValue"] == ".*"
        query = variable["query"]["query"]
        by_regex = query.startswith("query_result(") and f'{label}="' in variable["regex"]
        assert query.endswith(f", {label})") or by_regex
    # Each variable narrows the next one.
    assert '$namespace' in variables["model"]["query"]["query"]
    assert '$model' in variables["pod"]["query"]["query"]
    # ... and the model narrows the series without a model_name too, with pod on All (kvwatch_up
    # of a pod serving another model showed red beside the one picked)
    other = ('unless on (instance, job) (max_over_time(kvwatch_kv_usage_ratio{namespace=~"$namespace", '
             'model_name!~"$model"}[$__range]) unless on (instance, job) max_over_time(kvwatch_kv_usage_ratio'
             '{namespace=~"$namespace", model_name=~"$model"}[$__range]))')
    queries = [t["expr"] for p in panels() for t in p["targets"]]
    queries += [a["expr"] for a in DASHBOARD["annotations"]["list"] if "expr" in a]
    for query in queries:
        assert 'model_name=~"$model"' in query or other in query, query


def test_every_query_uses_the_datasource_variable_and_the_filters() -> None:
    for p in panels():
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"], p["title"]
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), p["title"]
        for target in p["targets"]:
            assert target["datasource"] == DATASOURCE
            assert 'namespace=~"$namespace"' in target["expr"], (p["title"], target["refId"])
            per_pod = not target["expr"].startswith("namespace_model_name")  # fleet panels aggregate pods
            assert ('pod=~"$pod"' in target["expr"]) == per_pod, (p["title"], target["refId"])


def test_layout_ids_unique_and_no_overlap() -> None:
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(set(ids)) == len(ids)
    cells: dict[tuple[int, int], str] = {}
    for p in DASHBOARD["panels"]:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, p["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


@pytest.mark.parametrize(("item", "title"), REQUIRED_PANELS.items(), ids=list(REQUIRED_PANELS))
def test_issue_panels_present_and_described(item: str, title: str) -> None:
    p = panel(title)
    assert len(p["description"]) > 40


def test_usage_panel_draws_the_095_line() -> None:
    defaults = panel("KV cache usage")["fieldConfig"]["defaults"]
    assert defaults["custom"]["thresholdsStyle"]["mode"] == "line"
    assert {"color": "red", "value": 0.95} in defaults["thresholds"]["steps"]
    assert defaults["unit"] == "percentunit"


def test_usage_vs_concurrency_is_an_xy_chart_per_pod() -> None:
    p = panel("KV usage vs running requests ($pod)")
    assert p["type"] == "xychart" and p["repeat"] == "pod"
    assert {t["legendFormat"] for t in p["targets"]} == {"running", "usage"}
    assert p["options"]["dims"]["x"] == "running"


def test_state_timeline_maps_every_state() -> None:
    p = panel("Forecast state")
    states = {"ok", "warming_up", "filling", "bottleneck", "scheduler_limited", "stalled", "unknown"}
    expr = p["targets"][0]["expr"]
    assert set(re.findall(r'state="(\w+)"', expr)) == states
    texts = {r["text"] for m in p["fieldConfig"]["defaults"]["mappings"] for r in m["options"].values()}
    assert states <= texts


def test_earliest_eta_maps_what_kvwatch_exports() -> None:
    """kvwatch exports the ETA as 0 in bottleneck, +Inf when the risk reaches 0.5 within no hour (or the engine is
    idle) and nothing while unknown (also while warming up): the stat maps 0, the 24-h cap and no value, and the docs
    say which."""
    p = panel("Earliest ETA")
    assert p["targets"][0]["expr"].startswith("clamp_max(min(kvwatch_kv_exhaustion_eta_seconds{")
    defaults = p["fieldConfig"]["defaults"]
    texts = {}
    for mapping in defaults["mappings"]:
        if mapping["type"] == "value":
            texts.update({float(k): v["text"] for k, v in mapping["options"].items()})
        else:
            texts[float(mapping["options"]["from"])] = mapping["options"]["result"]["text"]
    assert texts == {0.0: "saturated", 86400.0: "none within 1 h"}
    assert defaults["noValue"] == "unknown"
    doc = DOC[DOC.index("**Earliest ETA**"):].split("\n- ", 1)[0]
    assert '"none within 1 h" when no engine\'s saturation risk reaches 0.5 within 60 minutes' in \
        " ".join(doc.split())
    assert "can show while the state is still `ok`" in doc
    assert "unknown" in doc and "absent" in doc


def test_queue_panel_shows_waiting_by_reason() -> None:
    exprs = [t["expr"] for t in panel("Requests: running and waiting")["targets"]]
    assert any(e.startswith("vllm:num_requests_waiting_by_reason") for e in exprs)


def test_every_panel_is_described_in_the_docs() -> None:
    for p in panels():
        assert f"**{p['title']}**" in DOC, f"docs/dashboards.md does not describe {p['title']!r}"
    for row in (p for p in DASHBOARD["panels"] if p["type"] == "row"):
        assert f'### Row "{row["title"]}"' in DOC


def test_queries_parse_with_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found on PATH: run `make tools` (installs Debian's prometheus package)")
    queries = dashboard_queries()
    assert promtool_parse_errors(queries, promtool, tmp_path) == ""
    # and the check is real: a broken query is reported with its panel
    broken = [*queries[:1], type(queries[0])("panel 'Broken' A", "sum by (pod (kvwatch_up)")]
    assert "panel 'Broken' A" in promtool_parse_errors(broken, promtool, tmp_path)


def test_the_alert_annotations_show_every_alert_of_the_pack() -> None:
    import yaml

    rules = yaml.safe_load((ROOT / "alerts" / "kvwatch-rules.yaml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    expr = next(a["expr"] for a in DASHBOARD["annotations"]["list"] if "ALERTS" in a.get("expr", ""))
    pattern = re.search(r'alertname=~"([^"]+)"', expr).group(1)
    assert alerts and all(re.fullmatch(pattern, name) for name in alerts), sorted(
        name for name in alerts if not re.fullmatch(pattern, name))


def test_pods_are_told_apart_by_namespace_and_stats_show_the_current_value() -> None:
    # One chart per namespace repeats pod names: "max by (pod, ...)" merged prod's bottleneck with staging's ok
    # and legends showed two lines of one name. A stat reduced from a range kept a stale time to the GPU limit.
    import re

    for p in panels():
        for target in p["targets"]:
            legend, expr = target.get("legendFormat", ""), target["expr"]
            assert "{{pod}}" not in legend or "{{namespace}}/{{pod}}" in legend, (p["title"], legend)
            for group in re.findall(r"by \(([^)]*)\)", expr):
                labels = [g.strip() for g in group.split(",")]
                assert "pod" not in labels or "namespace" in labels, (p["title"], expr)
                # Outside Kubernetes there is no pod label: "max by (namespace, pod, ...)" merged two static
                # sidecars into one row, where a stale one's "unknown" hid the other's bottleneck.
                assert "pod" not in labels or "instance" in labels, (p["title"], expr)
        if p["type"] == "stat":
            assert all(t.get("instant") and not t.get("range") for t in p["targets"]), p["title"]
    annotation = next(a for a in DASHBOARD["annotations"]["list"] if a.get("expr"))
    assert "{{namespace}}/{{pod}}" in annotation["textFormat"]


def _unit(panel: dict, ref_id: str) -> str | None:
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        if override["matcher"] == {"id": "byFrameRefID", "options": ref_id}:
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    return prop["value"]
    return panel.get("fieldConfig", {}).get("defaults", {}).get("unit")


def test_every_rate_is_drawn_per_second_and_errors_are_not_requests() -> None:
    # Poll errors showed as "req/s" beside vLLM's own request rates, and a panel of dropped-series rates
    # (and the aborted requests per second under a 0/1 breach line) had no unit at all.
    per_second = {"reqps", "ops", "cps", "Bps"}
    for p in panels():
        for target in p["targets"]:
            expr, unit = target["expr"], _unit(p, target["refId"])
            if re.search(r"\b(i?rate)\(|_per_second\b", expr):
                assert unit in per_second or (unit or "").endswith("/s"), (p["title"], target["refId"], unit)
            if re.search(r"rate\([a-z_:]*errors_total", expr):
                assert unit != "reqps", (p["title"], unit)


def test_the_pod_list_has_sidecars_that_never_read_their_engine(tmp_path: Path) -> None:
    # The list came from kvwatch_kv_usage_ratio, which a sidecar exports only once it has read its engine:
    # the pod an SRE most needs to pick (kvwatch_up 0 since it started) was not in it. Evaluated by promtool's
    # own PromQL engine with the model variable set to one model.
    import yaml

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found on PATH: run `make tools` (installs Debian's prometheus package)")
    variable = next(v for v in DASHBOARD["templating"]["list"] if v["name"] == "pod")
    expr = re.fullmatch(r"query_result\((.*)\)", variable["query"]["query"], re.S).group(1)
    expr = expr.replace("$namespace", ".*").replace("$model", "llama").replace("$__range", "1h")
    series = [
        ('kvwatch_up{namespace="prod", pod="reads"}', "1x5"),
        ('kvwatch_kv_usage_ratio{namespace="prod", pod="reads", model_name="llama", engine="0"}', "0.5x5"),
        ('kvwatch_up{namespace="prod", pod="other-model"}', "1x5"),
        ('kvwatch_kv_usage_ratio{namespace="prod", pod="other-model", model_name="qwen", engine="0"}', "0.5x5"),
        ('kvwatch_up{namespace="prod", pod="never-read"}', "0x5"),
        # replaced during the dashboard's range: query_result is one instant query, at the range's end
        ('kvwatch_up{namespace="prod", pod="replaced"}', "1 1 1 stale"),
        ('kvwatch_kv_usage_ratio{namespace="prod", pod="replaced", model_name="llama", engine="0"}',
         "0.7 0.7 0.7 stale"),
    ]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(
        {"groups": [{"name": "pods", "rules": [{"record": "dashboard:pod_variable", "expr": expr}]}]}))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                   "promql_expr_test": [{"expr": "dashboard:pod_variable", "eval_time": "10m", "exp_samples": [
                       {"labels": 'dashboard:pod_variable{namespace="prod", pod="reads"}', "value": 0.5},
                       {"labels": 'dashboard:pod_variable{namespace="prod", pod="never-read"}', "value": 0},
                       {"labels": 'dashboard:pod_variable{namespace="prod", pod="replaced"}', "value": 0.7},
                   ]}]}]}))
    result = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.fullmatch(variable["regex"].strip("/"), 'pod="never-read"').group(1) == "never-read"


def test_a_picked_model_narrows_the_health_panel_with_pod_on_all(tmp_path: Path) -> None:
    # With pod on All ('.*') the health, GPU and alert panels showed every pod: a pod serving
    # another model read red ("down") beside the one picked. Evaluated by promtool with model=llama, pod=All. Matched
    # by the sidecar (instance, job): outside Kubernetes there is no pod label, and a sidecar that had the model at
    # any time in the range stays (a first version, on a pod's other model, hid both).
    import yaml

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found on PATH: run `make tools` (installs Debian's prometheus package)")
    expr = panel("kvwatch reads vLLM (kvwatch_up)")["targets"][0]["expr"]
    expr = expr.replace("$namespace", ".*").replace("$model", "llama").replace("$pod", ".*").replace(
        "$__range", "1h")

    def sidecar(name: str, k8s: bool = True) -> str:
        return f'instance="{name}:9747", job="kvwatch"' + (f', namespace="prod", pod="{name}"' if k8s else "")

    series = [
        (f"kvwatch_up{{{sidecar('llama-0')}}}", "1x5"),
        (f'kvwatch_kv_usage_ratio{{{sidecar("llama-0")}, model_name="llama", engine="0"}}', "0.5x5"),
        (f"kvwatch_up{{{sidecar('qwen-0')}}}", "1 1 0 0 0 0"),  # down now: its usage gone, not its model
        (f'kvwatch_kv_usage_ratio{{{sidecar("qwen-0")}, model_name="qwen", engine="0"}}', "0.5 0.5 stale"),
        (f"kvwatch_up{{{sidecar('never-read')}}}", "0x5"),
        (f"kvwatch_up{{{sidecar('switched')}}}", "1x5"),  # qwen, then llama from 3m
        (f'kvwatch_kv_usage_ratio{{{sidecar("switched")}, model_name="qwen", engine="0"}}', "0.5 0.5 stale"),
        (f'kvwatch_kv_usage_ratio{{{sidecar("switched")}, model_name="llama", engine="0"}}', "_ _ _ 0.5x2"),
        (f"kvwatch_up{{{sidecar('static-a', k8s=False)}}}", "1x5"),  # a static config: no namespace, no pod
        (f'kvwatch_kv_usage_ratio{{{sidecar("static-a", k8s=False)}, model_name="llama", engine="0"}}', "0.5x5"),
        (f"kvwatch_up{{{sidecar('static-b', k8s=False)}}}", "1x5"),
        (f'kvwatch_kv_usage_ratio{{{sidecar("static-b", k8s=False)}, model_name="qwen", engine="0"}}', "0.5x5"),
    ]
    kept = [("llama-0", True, 1), ("never-read", True, 0), ("switched", True, 1), ("static-a", False, 1)]
    # The alert annotations too: kvwatch's alerts by their sidecar, kube-state-metrics' restart loops by their pod
    # (their instance and job are kube-state-metrics': matched by the sidecar, none was ever left out).
    annotation = next(a for a in DASHBOARD["annotations"]["list"] if a.get("name") == "kvwatch alerts")["expr"]
    annotation = annotation.replace("$namespace", ".*").replace("$model", "llama").replace("$pod", ".*").replace(
        "$__range", "1h")
    ksm = 'instance="ksm:8080", job="kube-state-metrics", namespace="prod"'
    alerts = [
        (f'ALERTS{{alertname="KVCacheBottleneck", alertstate="firing", {sidecar("llama-0")}}}', True),
        (f'ALERTS{{alertname="KVCacheBottleneck", alertstate="firing", {sidecar("qwen-0")}}}', False),
        (f'ALERTS{{alertname="VLLMContainerRestartLoop", alertstate="firing", {ksm}, pod="llama-0"}}', True),
        (f'ALERTS{{alertname="VLLMContainerRestartLoop", alertstate="firing", {ksm}, pod="qwen-0"}}', False),
    ]
    series += [(labels, "1x5") for labels, _ in alerts]
    # Prometheus' own up: a sidecar it cannot scrape has no kvwatch_up at all, only the "not scraped" row
    not_scraped = panel("kvwatch reads vLLM (kvwatch_up)")["targets"][1]["expr"]
    not_scraped = not_scraped.replace("$namespace", ".*").replace("$model", "llama").replace("$pod", ".*").replace(
        "$__range", "1h")
    series += [(f"up{{{sidecar('llama-0')}}}", "1x5"), (f"up{{{sidecar('gone')}}}", "0x5"),
               (f"up{{{sidecar('qwen-0')}}}", "1 1 0 0 0 0")]  # (down, but it served another model)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(
        {"groups": [{"name": "panel", "rules": [{"record": "dashboard:health", "expr": expr},
                                                {"record": "dashboard:alerts", "expr": annotation},
                                                {"record": "dashboard:not_scraped", "expr": not_scraped}]}]}))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                   "promql_expr_test": [
                       {"expr": "dashboard:health", "eval_time": "5m", "exp_samples": [
                           {"labels": f"dashboard:health{{{sidecar(name, k8s)}}}", "value": value}
                           for name, k8s, value in kept]},
                       {"expr": "dashboard:alerts", "eval_time": "5m", "exp_samples": [
                           {"labels": labels.replace("ALERTS{", "dashboard:alerts{"), "value": 1}
                           for labels, shown in alerts if shown]},
                       {"expr": "dashboard:not_scraped", "eval_time": "5m", "exp_samples": [
                           {"labels": f"dashboard:not_scraped{{{sidecar('gone')}}}", "value": -1}]}]}]}))
    result = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_error_panels_draw_only_what_is_not_zero() -> None:
    # Every reason and field is exported from 0: 22 flat lines a sidecar buried the one rising, mid-incident.
    for title in ("Poll errors by reason", "GPU source errors by reason", "Series dropped and impossible values"):
        p = panel(title)
        assert all(t["expr"].endswith(" > 0") for t in p["targets"]), title
        assert p["fieldConfig"]["defaults"]["noValue"], title


def test_the_thresholds_drawn_and_alerted_are_the_forecasters() -> None:
    # One truth per threshold: the 0.95 the forecaster, the risk and the advice aim at, the 0.90 at which a queue
    # means KV, and the risk at which `filling` starts, are written again in the alert config and the dashboard.
    import yaml

    from kvwatch.advisor import LIMIT_USAGE
    from kvwatch.capacity.findings import STUCK_USAGE
    from kvwatch.forecast import ForecastParams
    from kvwatch.serve.latency import KV_SATURATED

    params = ForecastParams()
    config = yaml.safe_load((ROOT / "alerts" / "config.yaml").read_text())
    assert config["bottleneck"]["usage"] == params.u_sat == LIMIT_USAGE == KV_SATURATED == STUCK_USAGE
    assert config["scheduler_limited"]["usage_below"] == params.u_busy
    def lines(p: dict) -> dict[str, float]:
        steps = p.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
        return {step["color"]: step["value"] for step in steps if step["value"] is not None}

    usage = [lines(p) for p in panels() if "kvwatch_kv_usage_ratio" in str(p.get("targets"))
             and p["fieldConfig"]["defaults"].get("unit") == "percentunit" and lines(p)]
    assert len(usage) >= 3 and all(u == {"orange": params.u_busy, "red": params.u_sat} for u in usage)
    risk = panel("KV saturation risk")
    assert lines(risk) == {"red": params.warning.risk_on}
    # the alerts' own lines, and the ETA's colours from its own range (none past the hour)
    assert lines(panel("Preemption rate")) == {"red": config["preemption_storm"]["rate"]}
    assert lines(panel("Time to GPU memory limit")) == {"green": config["gpu_memory_pressure"]["seconds_to_limit"]}
    assert lines(panel("Earliest ETA")) == {"orange": 1, "green": 86400}
    assert "), 86400)" in panel("Earliest ETA")["targets"][0]["expr"]
    assert f"reaches {params.u_sat} of capacity" in risk["description"]
    assert f"at or above {params.warning.risk_on}" in risk["description"]
