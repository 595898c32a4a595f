"""The chart's opt-in autoscaling recipes: a KEDA ScaledObject (validated against KEDA's own CRD schema in
tests/fixtures/k8s-schemas, as every rendered object is by tests/helm_helpers.py) and an autoscaling/v2 HPA with
the prometheus-adapter rules behind it. The two queries are run by promtool on sample series: they ask for
the replicas KV demand needs, and for one more replica while an engine is forecast to run out of KV."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from helm_helpers import CHART, MINIMAL, NAMESPACE, only, render, render_fails, validate_object

KEDA = ("-f", str(CHART / "ci" / "autoscaling-keda-values.yaml"))
HPA = ("-f", str(CHART / "ci" / "autoscaling-hpa-values.yaml"))


def _queries_keda() -> dict[str, str]:
    so = only(render(*KEDA), "ScaledObject")
    return {t["name"]: t["metadata"]["query"] for t in so["spec"]["triggers"]}


def test_keda_scaled_object_targets_the_vllm_deployment_with_stabilization() -> None:
    objects = render(*KEDA)
    so, deployment = only(objects, "ScaledObject"), only(objects, "Deployment")
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                            "name": deployment["metadata"]["name"]}
    assert "replicas" not in deployment["spec"]  # the autoscaler owns them
    assert so["spec"]["minReplicaCount"] == 1 and so["spec"]["maxReplicaCount"] == 6
    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]
    assert [t["metadata"]["threshold"] for t in so["spec"]["triggers"]] == ["0.8", "1"]
    assert all(t["type"] == "prometheus" and t["metricType"] == "AverageValue" for t in so["spec"]["triggers"])


def test_hpa_and_adapter_rules_share_the_queries() -> None:
    # (the names carry the namespace: prometheus-adapter keys external metrics by name alone, and two releases of
    # one name in two namespaces read each other's load)
    objects = render(*HPA)
    hpa, rules = only(objects, "HorizontalPodAutoscaler"), only(objects, "ConfigMap")
    names = [m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    assert names == ["inference_kvw_kvwatch_kv_demand_replicas", "inference_kvw_kvwatch_kv_exhaustion_replicas"]
    assert hpa["spec"]["metrics"][0]["external"]["target"] == {"type": "AverageValue", "averageValue": "0.75"}
    external = yaml.safe_load(rules["data"]["external-rules.yaml"])["externalRules"]
    assert [r["name"]["as"] for r in external] == names
    assert all(set(r) == {"seriesQuery", "resources", "name", "metricsQuery"} for r in external)
    assert external[0]["metricsQuery"] == _queries_keda()["kv-demand"]
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600


def test_missing_prometheus_or_target_fails_naming_the_value() -> None:
    assert "autoscaling.prometheusAddress is required with kind keda" in render_fails(
        "--set", "config.model=m", "--set", "autoscaling.enabled=true")
    # prometheus-adapter, not the HPA, queries Prometheus: kind hpa needs no address.
    assert only(render("--set", "config.model=m", "--set", "autoscaling.enabled=true", "--set", "autoscaling.kind=hpa"),
                "HorizontalPodAutoscaler")
    assert "autoscaling.scaleTargetRef.name is required" in render_fails(
        "--set", "vllm.enabled=false", "--set", "config.targetUrl=http://10.0.0.1:8000/metrics",
        "--set", "autoscaling.enabled=true", "--set", "autoscaling.prometheusAddress=http://p:9090")


def test_more_min_than_max_replicas_fails_naming_both() -> None:
    # Rendered as minReplicas 5, maxReplicas 2, which the API server refuses at install time.
    assert "autoscaling.minReplicas (5) is above autoscaling.maxReplicas (2)" in render_fails(
        "--set", "config.model=m", "--set", "autoscaling.enabled=true", "--set", "autoscaling.kind=hpa",
        "--set", "autoscaling.minReplicas=5", "--set", "autoscaling.maxReplicas=2")


def test_kvwatch_alone_cannot_autoscale_and_says_why() -> None:
    # Mode 2 watches one vLLM pod by URL: new replicas would not be watched, and the series carry kvwatch's pod.
    assert "autoscaling needs kvwatch inside the vLLM pods" in render_fails(
        "--set", "vllm.enabled=false", "--set", "config.targetUrl=http://10.0.0.1:8000/metrics",
        "--set", "autoscaling.enabled=true", "--set", "autoscaling.prometheusAddress=http://p:9090",
        "--set", "autoscaling.scaleTargetRef.name=vllm")


def test_queries_compute_replicas_in_promtool(tmp_path: Path) -> None:
    """Two pods, each measured to hold 20 concurrent requests: 30 running + 10 waiting need 40 / 20 = 2
    replica-equivalents (KEDA: ceil(2 / 0.8) = 3 replicas). An ETA of 10 minutes (< 15) asks for 2 + 1."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found on PATH: run `make tools`")
    queries = _queries_keda()
    rules = {"groups": [{"name": "autoscaling", "rules": [
        {"record": "demand", "expr": queries["kv-demand"]},
        {"record": "forecast", "expr": queries["kv-exhaustion-forecast"]}]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    pods = [f'namespace="{NAMESPACE}", pod="kvw-kvwatch-7d9f8c6b5d-{i}x7k2"' for i in (0, 1)]
    e = ', model_name="m", engine="0"'
    series = []
    for pod, running, waiting, eta in zip(pods, (20, 10), (10, 0), ("1200x10", "600x10"), strict=True):
        series += [
            {"series": f"kvwatch_up{{{pod}}}", "values": "1x10"},
            {"series": f"kvwatch_requests_running{{{pod}{e}}}", "values": f"{running}x10"},
            {"series": f"kvwatch_requests_waiting{{{pod}{e}}}", "values": f"{waiting}x10"},
            {"series": f'kvwatch_max_concurrency{{{pod}{e}, basis="observed_mix"}}', "values": "20x10"},
            {"series": f"kvwatch_kv_exhaustion_eta_seconds{{{pod}{e}}}", "values": eta},
        ]
    # Another release's pods in the namespace do not count.
    series.append({"series": f'kvwatch_requests_running{{namespace="{NAMESPACE}", pod="other-0"{e}}}',
                   "values": "500x10"})
    # Two replicas still loading their model (kvwatch_up 0, no ceiling, no ETA yet) change neither answer: counted,
    # they shrank the per-replica ceiling and raised the target with every scale-up.
    series += [{"series": f'kvwatch_up{{namespace="{NAMESPACE}", pod="kvw-kvwatch-7d9f8c6b5d-{i}x7k2"}}',
                "values": "0x10"} for i in (2, 3)]
    # Nor does another Deployment named kvw-kvwatch-<more> ("<name>-.*" counted its 500 running requests).
    other = f'namespace="{NAMESPACE}", pod="kvw-kvwatch-70b-5c7b9f44d-q2x4z"'
    series.append({"series": f"kvwatch_requests_running{{{other}{e}}}", "values": "500x10"})
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": "demand", "eval_time": "5m", "exp_samples": [{"labels": "demand", "value": 2}]},
            {"expr": "forecast", "eval_time": "5m", "exp_samples": [{"labels": "forecast", "value": 3}]},
        ]}, {
        "interval": "1m", "input_series": [s for s in series if "eta" not in s["series"]] + [
            {"series": f"kvwatch_kv_exhaustion_eta_seconds{{{pods[0]}{e}}}", "values": "1800x10"}],
        "promql_expr_test": [
            {"expr": "forecast", "eval_time": "5m", "exp_samples": [{"labels": "forecast", "value": 0}]},
        ]}, {
        # No ETA at all (an engine without a finished-request counter exports none): 0, not an empty result,
        # which the HPA cannot fetch, and while it cannot, it never scales down.
        "interval": "1m", "input_series": [s for s in series if "eta" not in s["series"]],
        "promql_expr_test": [
            {"expr": "forecast", "eval_time": "5m", "exp_samples": [{"labels": "forecast", "value": 0}]},
        ]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("replicas", [1, 9, 10, 11, 19, 20, 99])
def test_the_forecast_asks_for_more_than_the_hpa_tolerance_at_any_replica_count(tmp_path: Path, replicas: int) -> None:
    # The HPA (and KEDA's) leaves the replicas alone while |metric / (target × replicas) − 1| ≤ 0.1 (Kubernetes'
    # default tolerance): "replicas + 1" was within it from 11 replicas on, so the forecast never added a pod there.
    # The metric is evaluated by promtool and put through that rule.
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found on PATH: run `make tools`")
    query = _queries_keda()["kv-exhaustion-forecast"]
    rules = {"groups": [{"name": "autoscaling", "rules": [{"record": "forecast", "expr": query}]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    series = []
    for i in range(replicas):
        pod = f'namespace="{NAMESPACE}", pod="kvw-kvwatch-7d9f8c6b5d-{i:05d}"'
        series += [{"series": f"kvwatch_up{{{pod}}}", "values": "1x10"},
                   {"series": f'kvwatch_kv_exhaustion_eta_seconds{{{pod}, model_name="m", engine="0"}}',
                    "values": "600x10"}]
    wanted = replicas + 1 + replicas // 10
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": "forecast", "eval_time": "5m",
                              "exp_samples": [{"labels": "forecast", "value": wanted}]}]}]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    target = 1.0  # the trigger's AverageValue
    assert abs(wanted / (target * replicas) - 1.0) > 0.1  # outside the tolerance: the HPA acts


def test_keda_schema_catches_a_misspelt_field() -> None:
    so = only(render(*KEDA), "ScaledObject")
    validate_object(so)
    so["spec"]["maxReplicaCont"] = 6
    with pytest.raises(AssertionError, match="maxReplicaCont"):
        validate_object(so)


def test_a_long_release_keeps_every_name_within_63_characters() -> None:
    # The prometheus-adapter ConfigMap's name was not truncated (86 characters for a 53-character release).
    from helm_helpers import run_helm

    result = run_helm("template", "a" * 53, str(CHART), "--namespace", NAMESPACE, "--set", "config.model=m",
                      "--set", "autoscaling.enabled=true", "--set", "autoscaling.kind=hpa")
    assert result.returncode == 0, result.stderr
    names = [o["metadata"]["name"] for o in yaml.safe_load_all(result.stdout) if o]
    assert "ConfigMap" in result.stdout and all(len(n) <= 63 for n in names), names


def test_the_pod_selector_matches_generated_pod_names_of_a_long_deployment() -> None:
    # A Deployment named with 58+ characters gets pods named <its first 58><5 random>, no "-" after the name
    # (Kubernetes' SimpleNameGenerator cuts the generated part to 58): "<name>-.*" matched none of them.
    from helm_helpers import run_helm

    release = "a" * 50  # fullname "<release>-kvwatch": 58 characters
    result = run_helm("template", release, str(CHART), "--namespace", NAMESPACE, "--set", "config.model=m",
                      "--set", "autoscaling.enabled=true", "--set", "autoscaling.prometheusAddress=http://p:9090")
    assert result.returncode == 0, result.stderr
    so = next(o for o in yaml.safe_load_all(result.stdout) if o and o["kind"] == "ScaledObject")
    query = so["spec"]["triggers"][0]["metadata"]["query"]
    pod = f"{release}-kvwatch"[:58] + "x7k2q"  # what the kubelet would name one
    pattern = re.search(r'pod=~"([^"]+)"', query).group(1)
    assert re.fullmatch(pattern, pod), (pattern, pod)


def _generated_pod_name(deployment: str, template_hash: str, random: str = "x7k2q") -> str:
    """What the kubelet names a Deployment's pod: (<ReplicaSet>-)[:58] + 5 random (SimpleNameGenerator)."""
    return f"{deployment}-{template_hash}-"[:58] + random


@pytest.mark.parametrize("length", [13, 40, 46, 47, 50, 57, 58, 70])
def test_the_pod_selector_matches_only_the_target_deployments_pods(length: int) -> None:
    """Anchored: another Deployment named <target>-70b in the namespace has pods "<target>-70b-<hash>-<5>", which
    "<target>-.*" matched (its load counted in this one's demand)."""
    from helm_helpers import run_helm

    target = ("vllm-" + "b" * 80)[:length]
    result = run_helm("template", "r", str(CHART), "--namespace", NAMESPACE, "--set", "config.model=m",
                      "--set", "autoscaling.enabled=true", "--set", "autoscaling.prometheusAddress=http://p:9090",
                      "--set", "deployment.enabled=false", "--set", f"autoscaling.scaleTargetRef.name={target}")
    assert result.returncode == 0, result.stderr
    so = next(o for o in yaml.safe_load_all(result.stdout) if o and o["kind"] == "ScaledObject")
    pattern = re.search(r'pod=~"([^"]+)"', so["spec"]["triggers"][0]["metadata"]["query"]).group(1)
    for template_hash in ("7d9f8c6b5d", "5c7b9f44d", "6d4cf56db6"):
        assert re.fullmatch(pattern, _generated_pod_name(target, template_hash)), (pattern, target)
    if length <= 46:  # (longer, the generated part is cut within the hash, and <target>-<short>'s pods can look alike)
        assert not re.fullmatch(pattern, _generated_pod_name(f"{target}-70b", "7d9f8c6b5d")), pattern
        assert not re.fullmatch(pattern, f"{target}-70b-0"), pattern  # a StatefulSet's pod


def test_long_names_keep_the_dashboard_and_adapter_configmaps_apart() -> None:
    """Both names were <fullname>-<suffix> cut to 63: with a fullname of 62 both came out as <fullname>; cutting the
    fullname first made two releases sharing their first 38 characters collide. Cut, the fullname keeps a hash."""
    from helm_helpers import run_helm

    def names(fullname: str) -> list[str]:
        result = run_helm("template", "r", str(CHART), "--namespace", NAMESPACE, "--set", "config.model=m",
                          "--set", f"fullnameOverride={fullname}", "--set", "dashboards.enabled=true",
                          "--set", "autoscaling.enabled=true", "--set", "autoscaling.kind=hpa")
        assert result.returncode == 0, result.stderr
        objects = [o for o in yaml.safe_load_all(result.stdout) if o]
        return sorted(o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap")

    long = names("a" * 63)
    assert len(set(long)) == 2 and all(len(n) <= 63 for n in long), long
    blue, green = (names(f"inference-prod-useast1-llama31-70b-fp8-{colour}") for colour in ("blue", "green"))
    assert not set(blue) & set(green), (blue, green)
    assert names("short") == ["short-dashboard", "short-prometheus-adapter-rules"]


@pytest.mark.parametrize(("kind", "pods", "others"), [
    ("StatefulSet", ["vllm-0", "vllm-12"], ["vllm-big-0", "vllm-7d9f8c6b5d-x7k2q"]),
    ("LeaderWorkerSet", ["vllm-0", "vllm-3-1"], ["vllm-big-0"]),
])
def test_the_pod_selector_follows_the_targets_kind(kind: str, pods: list[str], others: list[str]) -> None:
    """A StatefulSet's pods (vllm-0) matched "<name>-.*" and none of the Deployment pattern: empty queries."""
    from helm_helpers import run_helm

    result = run_helm("template", "r", str(CHART), "--namespace", NAMESPACE, "--set", "config.model=m",
                      "--set", "autoscaling.enabled=true", "--set", "autoscaling.prometheusAddress=http://p:9090",
                      "--set", "deployment.enabled=false", "--set", "autoscaling.scaleTargetRef.name=vllm",
                      "--set", f"autoscaling.scaleTargetRef.kind={kind}")
    assert result.returncode == 0, result.stderr
    so = next(o for o in yaml.safe_load_all(result.stdout) if o and o["kind"] == "ScaledObject")
    pattern = re.search(r'pod=~"([^"]+)"', so["spec"]["triggers"][0]["metadata"]["query"]).group(1)
    assert all(re.fullmatch(pattern, p) for p in pods) and not any(re.fullmatch(pattern, p) for p in others), pattern


def test_another_target_kind_needs_a_series_selector() -> None:
    args = (*MINIMAL, "--set", "autoscaling.enabled=true", "--set", "autoscaling.prometheusAddress=http://p:9090",
            "--set", "deployment.enabled=false", "--set", "autoscaling.scaleTargetRef.name=vllm",
            "--set", "autoscaling.scaleTargetRef.kind=Rollout")
    # without its apiVersion the autoscaler looks the kind up in the core group and never scales
    assert "autoscaling.scaleTargetRef.apiVersion is required for kind Rollout" in render_fails(*args)
    args += ("--set", "autoscaling.scaleTargetRef.apiVersion=argoproj.io/v1alpha1")
    assert "set autoscaling.seriesSelector" in render_fails(*args)
    render(*args, "--set", r'autoscaling.seriesSelector=namespace="llm"\, pod=~"vllm-.*"')


@pytest.mark.parametrize(("autoscaler", "kind", "api_version"), [
    ("hpa", None, "apps/v1"),
    ("hpa", "StatefulSet", "apps/v1"),
    ("keda", "LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1"),
])
def test_a_target_named_alone_gets_its_kind_and_api_version(autoscaler: str, kind: str | None,
                                                            api_version: str) -> None:
    # scaleTargetRef {name} alone: the HPA lacked kind (refused), and without apiVersion its
    # controller looks the kind up in the core group and never scales; KEDA's apps/v1 default is wrong for an LWS
    args = [*MINIMAL, "--set", "autoscaling.enabled=true", "--set", f"autoscaling.kind={autoscaler}",
            "--set", "autoscaling.prometheusAddress=http://p:9090", "--set", "deployment.enabled=false",
            "--set", "autoscaling.scaleTargetRef.name=vllm"]
    if kind:
        args += ["--set", f"autoscaling.scaleTargetRef.kind={kind}"]
    objects = render(*args)
    scaler = only(objects, "HorizontalPodAutoscaler" if autoscaler == "hpa" else "ScaledObject")
    assert scaler["spec"]["scaleTargetRef"] == {"apiVersion": api_version, "kind": kind or "Deployment",
                                                "name": "vllm"}
    validate_object(scaler)
    given = render(*args, "--set", "autoscaling.scaleTargetRef.apiVersion=apps/v2")  # what is given stays
    assert only(given, scaler["kind"])["spec"]["scaleTargetRef"]["apiVersion"] == "apps/v2"


def test_the_hpa_and_keda_targets_are_the_same_number() -> None:
    # The HPA's target was printed as whole millis: 0.8125 became 812m for the HPA and 0.8125 for
    # KEDA. The value goes to both as written (a valid Kubernetes quantity: the API server stores 812500u).
    import re

    from helm_helpers import SYNC

    quantity = SYNC.QUANTITY_PATTERN
    target = ("--set", "autoscaling.targetKvUtilization=0.8125")
    hpa = only(render(*HPA, *target), "HorizontalPodAutoscaler")["spec"]["metrics"][0]["external"]["target"]
    keda = only(render(*KEDA, *target), "ScaledObject")["spec"]["triggers"][0]["metadata"]["threshold"]
    assert hpa["averageValue"] == keda == "0.8125" and re.fullmatch(quantity, keda)
