"""The chart's integrations: ServiceMonitor / PodMonitor select the right ports and give the jobs the rule pack
expects; the PrometheusRule and the dashboard ConfigMap carry the repository's own files.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from helm_helpers import (
    CHART,
    MINIMAL,
    NAMESPACE,
    ROOT,
    containers,
    merged_values,
    only,
    render,
    render_fails,
    run_helm,
    values_args,
)

# ---------------------------------------------------------------- monitors, rules, dashboard

def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_service_monitor_selects_the_metrics_port_of_the_service() -> None:
    objects = render(*values_args("sidecar-full-values.yaml"))
    service, monitor = only(objects, "Service"), only(objects, "ServiceMonitor")
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert _matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert _matches(service["spec"]["selector"], pod_labels)
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    assert set(endpoints) == {"metrics", "http"}  # kvwatch, and vLLM's own /metrics (scrapeVllm)
    assert ports["metrics"]["port"] == 9747 and ports["metrics"]["targetPort"] == "metrics"
    assert endpoints["metrics"]["path"] == "/metrics"
    assert endpoints["metrics"]["interval"] == "10s" and endpoints["metrics"]["scrapeTimeout"] == "5s"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_pod_monitor_selects_the_kvwatch_container_port() -> None:
    objects = render(*values_args("podmonitor-values.yaml"))
    monitor = only(objects, "PodMonitor")
    pod = only(objects, "Deployment")["spec"]["template"]
    assert _matches(monitor["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    kvwatch = containers(objects)["kvwatch"]
    assert kvwatch["ports"][0] == {"name": "metrics", "containerPort": 9800, "protocol": "TCP"}
    assert monitor["metadata"]["labels"]["team"] == "inference"
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]


def relabel(labels: dict[str, str], configs: list[dict[str, Any]]) -> dict[str, str]:
    """Prometheus' `replace` relabelling (the only action the chart writes), applied in order."""
    out = dict(labels)
    for config in configs:
        assert config.get("action", "replace") == "replace", config
        value = config.get("separator", ";").join(out.get(name, "") for name in config.get("sourceLabels", []))
        match = re.fullmatch(config.get("regex", "(.*)"), value)
        if match:
            groups = (match.group(0), *match.groups())

            def expand(ref: re.Match[str], groups: tuple[str | None, ...] = groups) -> str:
                return "$" if ref.group(0) == "$$" else groups[int(ref.group(1))] or ""

            out[config["targetLabel"]] = re.sub(r"\$\$|\$(\d+)", expand, config.get("replacement", "$1"))
    return out


def absent_job_regex() -> str:
    rules = yaml.safe_load((ROOT / "alerts" / "kvwatch-rules.yaml").read_text())
    expr = next(r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("alert") == "KvwatchAbsent")
    found = re.search(r'up\{job=~"([^"]+)"\}', expr)
    assert found, expr
    return found.group(1)


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
@pytest.mark.parametrize("name_override", ["", "llama"])
def test_monitors_give_kvwatch_and_vllm_the_jobs_the_rule_pack_expects(monitor: str, name_override: str) -> None:
    """KvwatchAbsent pages on up == 0 of kvwatch's job: vLLM's own endpoint (down while a model loads) must
    not share it, and nameOverride (the operator's default job source) must not move kvwatch out of it."""
    kind, key = ("ServiceMonitor", "endpoints") if monitor == "serviceMonitor" else ("PodMonitor",
                                                                                      "podMetricsEndpoints")
    user = [{"targetLabel": "cluster", "replacement": "eu-1"}]
    objects = render(*MINIMAL, "--set", f"{monitor}.enabled=true", "--set", f"nameOverride={name_override}",
                     "--set-json", f"{monitor}.relabelings={json.dumps(user)}")
    endpoints = {e["port"]: e for e in only(objects, kind)["spec"][key]}
    assert set(endpoints) == {"metrics", "http"}
    assert "jobLabel" not in only(objects, kind)["spec"]
    # What the operator would have set before the endpoint's relabelings run.
    operator_job = "kvw-" + (name_override or "kvwatch") if kind == "ServiceMonitor" else f"{NAMESPACE}/kvw"
    kvwatch = relabel({"job": operator_job}, endpoints["metrics"]["relabelings"])
    vllm = relabel({"job": operator_job}, endpoints["http"]["relabelings"])
    assert kvwatch == {"job": "kvwatch", "cluster": "eu-1"}, "the user's relabelings run after the chart's"
    assert vllm == {"job": "vllm"}
    assert re.fullmatch(absent_job_regex(), kvwatch["job"])
    assert not re.fullmatch(absent_job_regex(), vllm["job"])
    # The regex was the problem before: vLLM's endpoint inherited the kvwatch-named job.
    assert re.fullmatch(absent_job_regex(), "kvwatch") and re.fullmatch(absent_job_regex(), "kvw-kvwatch")


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_mode_2_monitors_label_kvwatchs_series_with_the_vllm_it_watches(monitor: str) -> None:
    """Alone, kvwatch's namespace/pod labels are its own pod: alerts name the watched vLLM by vllm_target."""
    kind, key = ("ServiceMonitor", "endpoints") if monitor == "serviceMonitor" else ("PodMonitor",
                                                                                      "podMetricsEndpoints")
    url = merged_values("standalone-values.yaml")["config"]["targetUrl"]
    objects = render("-f", str(CHART / "ci" / "standalone-values.yaml"), "--set", "serviceMonitor.enabled=false",
                     "--set", f"{monitor}.enabled=true")
    endpoints = only(objects, kind)["spec"][key]
    assert [e["port"] for e in endpoints] == ["metrics"]  # no vLLM in this pod
    assert relabel({"job": "x"}, endpoints[0]["relabelings"]) == {"job": "kvwatch", "vllm_target": url}
    rules = (ROOT / "alerts" / "kvwatch-rules.yaml").read_text()
    assert rules.count("$labels.vllm_target") >= 8, "the alert texts name the watched vLLM where the label is set"
    # A '$' in the URL would be a regex group reference in the replacement: it is escaped.
    odd = render("--set", "vllm.enabled=false", "--set", "config.targetUrl=http://vllm-0:8000/x$1/metrics?t=$2",
                 "--set", f"{monitor}.enabled=true")
    labels = relabel({}, only(odd, kind)["spec"][key][0]["relabelings"])
    assert labels["vllm_target"] == "http://vllm-0:8000/x$1/metrics?t=***"  # (a query's values masked: ?token=)
    # A user:password in the URL (kvwatch reads it, never shows it) went into every series, alert text and the
    # install notes.
    secret = "http://scraper:s3cr3t@p@ss@vllm-0:8000/metrics"
    args = ("--set", "vllm.enabled=false", "--set", f"config.targetUrl={secret}", "--set", f"{monitor}.enabled=true")
    labels = relabel({}, only(render(*args), kind)["spec"][key][0]["relabelings"])
    assert labels["vllm_target"] == "http://vllm-0:8000/metrics"
    notes = run_helm("install", "--dry-run=client", "kvw", str(CHART), *args)
    assert notes.returncode == 0 and "s3cr3t" not in notes.stdout.split("NOTES:")[1]
    assert "p@ss" not in notes.stdout.split("NOTES:")[1] and "ss@" not in labels["vllm_target"]


@pytest.mark.parametrize("case", ["sidecar-full-values.yaml", "podmonitor-values.yaml"])
def test_sidecar_monitors_add_no_vllm_target(case: str) -> None:
    """In a vLLM pod, pod is the vLLM pod already."""
    for obj in render(*values_args(case)):
        if obj["kind"] in ("ServiceMonitor", "PodMonitor"):
            for endpoint in obj["spec"].get("endpoints", obj["spec"].get("podMetricsEndpoints")):
                assert "vllm_target" not in relabel({}, endpoint.get("relabelings", []))


def test_objects_placed_in_a_shared_namespace_carry_the_release_namespace() -> None:
    # releases "llama" in staging and in prod both wrote monitoring/llama-kvwatch (the monitor, the
    # rule) and monitoring/llama-kvwatch-dashboard: the second install failed, a kubectl apply overwrote the first
    placed = ("--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.namespace=monitoring",
              "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.namespace=monitoring",
              "--set", "dashboards.enabled=true", "--set", "dashboards.namespace=monitoring")

    def names(namespace: str, *args: str) -> set[tuple[str, str, str]]:
        result = run_helm("template", "llama", str(CHART), "--namespace", namespace, *MINIMAL, *args)
        assert result.returncode == 0, result.stderr
        objects = [o for o in yaml.safe_load_all(result.stdout) if o]
        return {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects
                if o["kind"] in ("ServiceMonitor", "PrometheusRule", "ConfigMap")}

    staging, prod = names("staging", *placed), names("prod", *placed)
    assert not staging & prod and ("ServiceMonitor", "monitoring", "llama-kvwatch-staging") in staging
    assert ("ConfigMap", "monitoring", "llama-kvwatch-prod-dashboard") in prod
    assert all(len(name) <= 63 for _, _, name in names("n" * 63, *placed))
    # in the release's own namespace the names are as they were
    own = names("staging", "--set", "serviceMonitor.enabled=true", "--set", "dashboards.enabled=true")
    assert {("ServiceMonitor", "staging", "llama-kvwatch"), ("ConfigMap", "staging", "llama-kvwatch-dashboard")} <= own


def test_both_monitors_at_once_are_refused() -> None:
    stderr = render_fails(*MINIMAL, "--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true")
    assert "not both" in stderr


@pytest.mark.parametrize(("monitor", "interval", "timeout", "ok"), [
    ("serviceMonitor", "15s", "20s", False),
    ("podMonitor", "1m", "1m500ms", False),
    ("serviceMonitor", "1m", "1m", True),
    ("podMonitor", "10s", "10s", True),
    ("podMonitor", "", "1m", True),  # Prometheus' global interval: unknown to the chart
])
def test_scrape_timeout_longer_than_the_interval_is_refused(monitor: str, interval: str, timeout: str,
                                                             ok: bool) -> None:
    """prometheus-operator rejects such a monitor (the admission webhook, or it drops it): fail at install."""
    args = (*MINIMAL, "--set", f"{monitor}.enabled=true", "--set", f"{monitor}.interval={interval}",
            "--set", f"{monitor}.scrapeTimeout={timeout}")
    if ok:
        kind = "ServiceMonitor" if monitor == "serviceMonitor" else "PodMonitor"
        endpoints = only(render(*args), kind)["spec"]["endpoints" if monitor == "serviceMonitor" else
                                                         "podMetricsEndpoints"]
        assert endpoints[0]["scrapeTimeout"] == timeout
    else:
        stderr = render_fails(*args)
        assert f"{monitor}.scrapeTimeout ({timeout}) is longer than {monitor}.interval ({interval})" in stderr


@pytest.mark.parametrize(("monitor", "interval", "ok"), [
    ("serviceMonitor", "1m", True), ("serviceMonitor", "1m1s", False), ("podMonitor", "3m", False),
    ("podMonitor", "60s", True),
])
def test_a_scrape_interval_past_the_rules_hold_is_refused(monitor: str, interval: str, ok: bool) -> None:
    """The rule pack's keep_firing_for (guard_hold) rides out one failed poll only if scrapes come that often."""
    hold = yaml.safe_load((ROOT / "alerts" / "config.yaml").read_text())["guard_hold"]
    assert hold == "1m", "the chart's bound (kvwatch.monitorEndpoints) is the rule pack's guard_hold"
    args = (*MINIMAL, "--set", f"{monitor}.enabled=true", "--set", f"{monitor}.interval={interval}",
            "--set", f"{monitor}.scrapeTimeout=10s")
    if ok:
        render(*args)
    else:
        assert f"{monitor}.interval ({interval}) is longer than 1m" in render_fails(*args)


@pytest.mark.parametrize(("source", "copy", "tool"), [
    ("alerts/kvwatch-rules.yaml", "kvwatch-rules.yaml", "alerts/generate.py"),
    ("dashboards/kvwatch.json", "kvwatch.json", "scripts/sync_chart_files.py"),
])
def test_chart_copies_are_the_repository_files(source: str, copy: str, tool: str) -> None:
    """Helm reads only files inside the chart: its copies must be the repository's files, byte for byte."""
    assert (ROOT / source).is_file(), f"{source} is missing"
    assert (CHART / "files" / copy).read_bytes() == (ROOT / source).read_bytes(), (
        f"the chart's {copy} is stale: run .venv/bin/python {tool}")


def test_prometheus_rule_spec_is_the_rule_file() -> None:
    rule = only(render(*values_args("sidecar-full-values.yaml")), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "kvwatch-rules.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"KVCacheBottleneck", "KVCacheExhaustionForecast", "KvwatchTargetDown"} <= alerts


def test_dashboard_configmap_carries_the_dashboard_for_the_grafana_sidecar() -> None:
    configmap = only(render(*values_args("sidecar-full-values.yaml")), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
    assert json.loads(configmap["data"]["kvwatch.json"]) == json.loads((CHART / "files" / "kvwatch.json").read_text())


def test_tls_without_the_web_config_secret_fails_instead_of_https_probes_on_plain_http() -> None:
    assert "webConfig.tls needs webConfig.secretName" in render_fails(
        "--set", "config.model=Qwen/Qwen3-8B", "--set", "webConfig.tls=true")


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_https_scrapes_without_a_tls_config_fail_instead_of_a_target_down_for_good(monitor: str) -> None:
    # scheme https with no tlsConfig: Prometheus checks the certificate against the system roots
    # and the pod's IP, so every scrape failed and KvwatchAbsent fired
    args = ["--set", "config.model=Qwen/Qwen3-8B", "--set", "webConfig.secretName=kvwatch-web",
            "--set", "webConfig.tls=true", "--set", f"{monitor}.enabled=true"]
    assert f"webConfig.tls is on but {monitor}.tlsConfig is empty" in render_fails(*args)
    endpoints = only(render(*args, "--set-json", f'{monitor}.tlsConfig={{"insecureSkipVerify":true}}'),
                     monitor[0].upper() + monitor[1:])["spec"]
    (endpoint,) = [e for e in endpoints.get("endpoints") or endpoints["podMetricsEndpoints"] if e["port"] == "metrics"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == {"insecureSkipVerify": True}


def test_prometheus_rule_takes_vllms_container_name_and_the_runbook_site_from_values() -> None:
    """Injected into pods of one's own, vLLM's container is rarely named "vllm": VLLMContainerRestartLoop would never
    fire. Only those two strings change; the rest is the rule file."""
    config = yaml.safe_load((ROOT / "alerts" / "config.yaml").read_text())
    file_rules = (CHART / "files" / "kvwatch-rules.yaml").read_text()
    assert config["selectors"]["vllm_container"] == 'container=~"vllm"'  # what the template replaces
    assert f'{config["runbook_base"]}#' in file_rules
    rule = only(render(*MINIMAL, "--set", "deployment.enabled=false", "--set", "prometheusRule.enabled=true",
                       "--set", "prometheusRule.vllmContainer=engine|server",
                       "--set", "prometheusRule.runbookBase=https://wiki.example.org/kv/runbooks"), "PrometheusRule")
    expected = yaml.safe_load(file_rules.replace('container=~"vllm"', 'container=~"engine|server"').replace(
        f'{config["runbook_base"]}#', "https://wiki.example.org/kv/runbooks#"))
    assert rule["spec"] == expected
    exprs = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert 'container=~"engine|server"' in exprs["VLLMContainerRestartLoop"]
    assert 'container=~"vllm"' not in exprs["VLLMContainerRestartLoop"]
    assert 'container=~"kvwatch"' in exprs["KvwatchRestartLoop"]
    stderr = render_fails(*MINIMAL, "--set", "prometheusRule.enabled=true",
                          "--set", "prometheusRule.runbookBase=wiki/runbooks#x")
    assert "runbookBase" in stderr


def test_prometheus_rule_values_refuse_a_rule_file_without_the_text_they_replace(tmp_path) -> None:
    """A rule file regenerated with another selectors.vllm_container or runbook_base holds neither default: the
    replacement matched nothing, and the value was ignored without a word."""
    import shutil

    from helm_helpers import run_helm

    chart = tmp_path / "kvwatch"
    shutil.copytree(CHART, chart)
    rules = chart / "files" / "kvwatch-rules.yaml"
    rules.write_text(rules.read_text().replace('container=~"vllm"', 'container=~"engine"').replace(
        "https://github.com/kvwatch/kvwatch/blob/main/docs/runbooks.md#", "https://wiki.example.org/runbooks#"))
    base = ("template", "r", str(chart), *MINIMAL, "--set", "prometheusRule.enabled=true")
    assert run_helm(*base).returncode == 0  # the defaults ask for nothing to be replaced
    for value, said in (("vllmContainer=server", "prometheusRule.vllmContainer"),
                        ("runbookBase=https://docs.example.org/rb", "prometheusRule.runbookBase")):
        result = run_helm(*base, "--set", f"prometheusRule.{value}")
        assert result.returncode != 0 and said in result.stderr, result.stderr
