"""The chart renders: `helm lint --strict` passes and every object is valid Kubernetes / prometheus-operator;
what is on by default, the app version and the install notes.
"""

from __future__ import annotations

import pytest
import yaml

import kvwatch
from helm_helpers import (
    CASES,
    CHART,
    MINIMAL,
    MODEL,
    NAMESPACE,
    only,
    render,
    run_helm,
    validate_object,
    values_args,
)

# ---------------------------------------------------------------- lint and validity

@pytest.mark.parametrize("case", CASES)
def test_helm_lint_strict_passes(case: str) -> None:
    result = run_helm("lint", "--strict", str(CHART), *values_args(case))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("case", CASES)
def test_every_rendered_object_is_valid_for_kubernetes_and_the_operator(case: str) -> None:
    objects = render(*values_args(case))
    assert objects
    for obj in objects:
        validate_object(obj)
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "kvw"


def test_the_validators_catch_a_misspelt_field() -> None:
    objects = render("-f", str(CHART / "ci" / "sidecar-full-values.yaml"))
    monitor = only(objects, "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["scrapeTimout"] = "5s"
    with pytest.raises(AssertionError, match="scrapeTimout"):
        validate_object(monitor)
    deployment = only(objects, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(pytest.fail.Exception, match="livenessprobe"):
        validate_object(deployment)


def test_integrations_are_off_by_default() -> None:
    kinds = sorted(o["kind"] for o in render(*MINIMAL))
    assert kinds == ["Deployment", "Service"]


def test_chart_app_version_is_the_package_version() -> None:
    """appVersion is the default kvwatch image tag: it must name the release the chart was written for."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == kvwatch.__version__


def install_notes(*args: str) -> str:
    """NOTES.txt as `helm install` prints it (helm template does not render NOTES; a client dry run needs no
    cluster)."""
    result = run_helm("install", "kvw", str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


@pytest.mark.parametrize(("case", "says"), [
    ("default", "sidecar next to vLLM"),
    ("standalone-values.yaml", "ONE vLLM pod"),
])
def test_install_notes_render_for_each_mode(case: str, says: str) -> None:
    notes = install_notes(*values_args(case))
    assert says in notes
    assert "port-forward svc/kvw-kvwatch 9747:9747" in notes


@pytest.mark.parametrize(("args", "curl"), [
    ((), "curl -s http://127.0.0.1:9747/metrics"),
    (("-f", str(CHART / "ci" / "web-config-values.yaml")), "curl -sk -u <user> https://127.0.0.1:9747/metrics"),
    (("--set", "webConfig.secretName=web"), "curl -s -u <user> http://127.0.0.1:9747/metrics"),
])
def test_install_notes_curl_the_way_kvwatch_serves(args: tuple[str, ...], curl: str) -> None:
    # plain http against a TLS listener with basic auth
    assert curl in install_notes("--set", "config.model=m", *args)


def test_install_notes_say_what_the_sidecar_polls_and_who_owns_the_replicas() -> None:
    notes = install_notes("--set", f"config.model={MODEL}", "--set", "config.targetUrl=http://127.0.0.1:8001/metrics",
                          "--set", "autoscaling.enabled=true", "--set", "autoscaling.kind=hpa")
    assert "in the autoscaler's pods" in notes and "polling http://127.0.0.1:8001/metrics" in notes
    assert "in 1 pod(s)" in install_notes(*MINIMAL)
    # the sidecar's notes printed the URL as given, password and token: mode 2's hid them
    notes = install_notes("--set", f"config.model={MODEL}", "--set-string",
                          "config.targetUrl=http://svc:NotesPW@127.0.0.1:8001/metrics?token=NQTOKEN")
    assert "polling http://127.0.0.1:8001/metrics?token=***." in notes
    assert "NotesPW" not in notes and "NQTOKEN" not in notes


@pytest.mark.parametrize(("args", "says"), [
    ((), "startupProbe allows 1800 s"),
    (("--set", "vllm.startupProbe.failureThreshold=360"), "--timeout=3600s"),
    (("--set", "vllm.startupProbe.periodSeconds=null"), "startupProbe allows 1800 s"),  # Kubernetes' 10 s
    (("--set", "vllm.startupProbe=null"), "vLLM has no startupProbe"),
    (("--set", "vllm.startupProbe.failureThreshold=360", "--set", "prometheusRule.enabled=true"),
     'Warning: the startupProbe allows 3600 s, but KvwatchTargetDown{since="start"} fires after 35m'),
    # The probe as rendered: a 1,800-second prefill raises it to 600 + 1,800 s (the deployment's sizing).
    (("--set", "vllm.prefillSecondsEstimate=1800", "--set", "prometheusRule.enabled=true"),
     'Warning: the startupProbe allows 2400 s, but KvwatchTargetDown{since="start"} fires after 35m'),
])
def test_install_notes_follow_the_startup_probe(args: tuple[str, ...], says: str) -> None:
    """The notes read the probe's fields: a removed probe (or field) must not crash the install."""
    assert says in install_notes(*MINIMAL, *args)


def test_install_notes_warn_only_when_the_startup_budget_outlasts_the_target_down_rule() -> None:
    assert "Warning: the startupProbe" not in install_notes(*MINIMAL, "--set", "prometheusRule.enabled=true")
    assert "Warning: the startupProbe" not in install_notes(*MINIMAL, "--set", "vllm.startupProbe.failureThreshold=360")


class _UniqueKeys(yaml.SafeLoader):
    """A loader that refuses a key written twice in one map, as Flux's, kustomize's and Argo CD's do (Helm and
    PyYAML keep the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        duplicated = {k for k in keys if keys.count(k) > 1}
        if duplicated:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {sorted(duplicated)}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


OVERLAPPING_LABELS = ("--set-json", 'commonLabels={"app.kubernetes.io/version":"1.2","team":"ml"}',
                      "--set-json", 'podLabels={"team":"ml-infra"}',
                      "--set-json", 'serviceMonitor.additionalLabels={"team":"obs","release":"prom"}',
                      "--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
                      "--set-json", 'prometheusRule.additionalLabels={"app.kubernetes.io/part-of":"mon"}',
                      "--set", "dashboards.enabled=true")


@pytest.mark.parametrize("args", [*([*values_args(c)] for c in CASES), [*MINIMAL, *OVERLAPPING_LABELS]],
                         ids=[*CASES, "overlapping labels"])
def test_no_rendered_map_writes_a_key_twice(args: list[str]) -> None:
    # commonLabels {"app.kubernetes.io/version": ...}, or podLabels over commonLabels, or a monitor's
    # additionalLabels over the chart's, wrote the key twice: helm lint passed, and Flux refused the release.
    result = run_helm("template", "kvw", str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.load_all(result.stdout, Loader=_UniqueKeys) if doc]
    if "serviceMonitor.enabled=true" in args:
        pod = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
        assert pod["team"] == "ml-infra" and pod["app.kubernetes.io/name"] == "kvwatch"
        assert only(objects, "ServiceMonitor")["metadata"]["labels"]["team"] == "obs"
        assert only(objects, "Service")["metadata"]["labels"]["app.kubernetes.io/version"] == "1.2"


def test_a_model_cache_claim_without_enabled_fails_instead_of_mounting_nothing() -> None:
    # docs/deploy.md named existingClaim alone; the chart rendered no volume, no HF_HOME, no error.
    from helm_helpers import render, render_fails

    message = render_fails(*MINIMAL, "--set", "vllm.modelCache.existingClaim=weights")
    assert "vllm.modelCache.existingClaim names weights" in message and "enabled=true" in message
    objects = render(*MINIMAL, "--set", "vllm.modelCache.existingClaim=weights",
                     "--set", "vllm.modelCache.enabled=true")
    volumes = only(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "weights"}} in volumes


def test_a_gpu_count_in_vllms_resources_is_refused_not_written_twice() -> None:
    from helm_helpers import render_fails

    message = render_fails(*MINIMAL, "--set-json", 'vllm.resources={"limits":{"nvidia.com/gpu":"1"}}')
    assert "vllm.resources.limits may not set nvidia.com/gpu" in message


@pytest.mark.parametrize(("release", "args"), [("my.release", ()), ("kvw", ("--set", "nameOverride=KVWatch")),
                                               ("kvw", ("--set", "fullnameOverride=my.app"))])
def test_a_service_name_kubernetes_would_refuse_fails_at_render(release: str, args: tuple[str, ...]) -> None:
    # "my.release-kvwatch" rendered, linted and was refused by the API server (a Service's name is a DNS-1035 label).
    from helm_helpers import run_helm

    result = run_helm("template", release, str(CHART), "--namespace", NAMESPACE, "--set", "config.model=m", *args)
    assert result.returncode != 0 and "which Kubernetes refuses" in result.stderr, result.stderr
