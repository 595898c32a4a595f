"""values.yaml and values.schema.json: the schema refuses typos and bad values (also inside Kubernetes objects),
is generated from kvwatch's settings, and every chart key is documented.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from helm_helpers import (
    CASES,
    CHART,
    CONFIG_KEYS,
    IMAGE,
    KUBERNETES_VERSION,
    MINIMAL,
    SYNC,
    containers,
    merged_values,
    only,
    render,
    render_fails,
    validate_object,
)
from kvwatch.settings import ServeSettings

# ---------------------------------------------------------------- values and schema

@pytest.mark.parametrize(("flag", "culprit"), [
    ("confg.model=x", "confg"),
    ("config.pollIntervalSecond=5", "pollIntervalSecond"),
    ("vllm.tensorParallelSize=2", "tensorParallelSize"),
    ("serviceMonitor.intervall=5s", "intervall"),
    ("config.logLevel=LOUD", "logLevel"),
    ("config.targetUrl=localhost:8000", "targetUrl"),
    ("config.gpuMemoryUtilization=1.5", "gpuMemoryUtilization"),
    # kvwatch refuses these at start: the chart rendered them, and the sidecar crash-looped
    ("config.dcgmUrl=bad", "dcgmUrl"),
    ("config.gpuUuids=abc", "gpuUuids"),
    ("config.usageMetric=x{y", "usageMetric"),
    ("config.quantization=bogus", "quantization"),
    ("config.gpuPod=vllm-0", "config.gpuPod and config.gpuNamespace need config.dcgmUrl"),
    ("config.gpuUuids=GPU-1", "config.gpuUuids needs a GPU source"),
    # a tag inside the repository rendered "r/kvwatch:0.1.0:0.1.0": the kubelet's InvalidImageName
    ("kvwatch.image.repository=registry.example.com/ml/kvwatch:0.1.0", "put those in kvwatch.image.tag"),
    ("vllm.image.repository=vllm/vllm-openai:v0.11.0", "vllm.image.repository \"vllm/vllm-openai:v0.11.0\" is no"),
    ("kvwatch.image.repository=Registry/KVWatch", "is no image name"),
    ("config.bearerTokenFile=/t,config.targetUrl=http://u:p@127.0.0.1:8000/metrics",
     "config.bearerTokenFile cannot be used with credentials in config.targetUrl"),
    # vLLM took the last --tensor-parallel-size: 2 GPUs' worth of engine on a 1-GPU pod
    ("vllm.extraArgs={--tensor-parallel-size=2}", "vllm.extraArgs has --tensor-parallel-size: set "
                                                  "config.tensorParallelSize instead"),
    ("vllm.extraArgs={--port,9000}", "vllm.extraArgs has --port: set vllm.port instead"),
    ("vllm.extraArgs={--max_model_len=4096}", "vllm.extraArgs has --max-model-len: set config.maxModelLen"),
])
def test_schema_rejects_typos_and_bad_values(flag: str, culprit: str) -> None:
    stderr = render_fails(*MINIMAL, "--set", flag)
    assert culprit in stderr


@pytest.mark.parametrize("repository", ["nvcr.io/nvidia/tritonserver", "localhost:5000/x", "my.registry:443/team/img",
                                        "[2001:db8::1]:5000/team/img", "ghcr.io/a__b/c-d.e"])
def test_image_names_of_every_registry_form_render(repository: str) -> None:
    (deployment,) = [o for o in render(*MINIMAL, "--set", f"kvwatch.image.repository={repository}")
                     if o["kind"] == "Deployment"]
    images = [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert any(image.startswith(f"{repository}:") for image in images)


@pytest.mark.parametrize(("flag", "where", "culprit"), [
    ("kvwatch.resources.limit.memory=1Gi", "/kvwatch/resources", "limit"),
    ("vllm.startupProbe.failureTreshold=360", "/vllm/startupProbe", "failureTreshold"),
    ("kvwatch.securityContext.readOnlyRootFileSystem=true", "/kvwatch/securityContext", "readOnlyRootFileSystem"),
    ("vllm.updateStrategy.rollingupdate.maxSurge=1", "/vllm/updateStrategy", "rollingupdate"),
    ("podSecurityContext.fsgroup=1000", "/podSecurityContext", "fsgroup"),
    ("kvwatch.livenessProbe.httpGet.prot=metrics", "/kvwatch/livenessProbe/httpGet", "prot"),
    ("vllm.resources.request.cpu=8", "/vllm/resources", "request"),
    ("vllm.securityContext.capabilities.add=SYS_ADMIN", "/vllm/securityContext/capabilities/add", "array"),
    ("imagePullSecrets[0].nmae=regcred", "/imagePullSecrets/0", "nmae"),  # (an open object)
])
def test_schema_rejects_typos_inside_kubernetes_objects(flag: str, where: str, culprit: str) -> None:
    """Probes, resources, security contexts and the strategy are rendered verbatim: without a closed schema a
    misspelt field renders silently (and the API server prunes it)."""
    stderr = render_fails(*MINIMAL, "--set", flag)
    assert f"at '{where}'" in stderr and culprit in stderr


@pytest.mark.parametrize("args", [
    ("--set", "vllm.startupProbe.failureThreshold=360", "--set", "vllm.startupProbe.initialDelaySeconds=30"),
    ("--set", "kvwatch.resources.limits.cpu=500m", "--set", "vllm.resources.limits.memory=80Gi"),
    ("--set", "podSecurityContext.fsGroup=1000", "--set", "kvwatch.securityContext.runAsUser=1234"),
    ("--set", "vllm.updateStrategy.type=Recreate", "--set", "vllm.updateStrategy.rollingUpdate=null"),
    ("--set-json", 'vllm.livenessProbe={"tcpSocket": {"port": "http"}, "periodSeconds": 30}'),
])
def test_schema_accepts_real_kubernetes_fields(args: tuple[str, ...]) -> None:
    for obj in render(*MINIMAL, *args):
        validate_object(obj)


def test_kubernetes_objects_in_values_use_the_generated_closed_definitions() -> None:
    """The definitions are Kubernetes' own (kubernetes-validate, the version the rendered objects are checked
    with), closed; scripts/sync_chart_files.py writes them."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert SYNC.KUBERNETES_VERSION == KUBERNETES_VERSION
    assert schema["definitions"] == SYNC.kubernetes_definitions(), (
        "values.schema.json's Kubernetes definitions are stale: run .venv/bin/python scripts/sync_chart_files.py")
    props = schema["properties"]
    refs = {
        ("kvwatch", "resources"): "core.v1.ResourceRequirements",
        ("kvwatch", "securityContext"): "core.v1.SecurityContext",
        ("kvwatch", "readinessProbe"): "core.v1.Probe",
        ("kvwatch", "livenessProbe"): "core.v1.Probe",
        ("vllm", "resources"): "core.v1.ResourceRequirements",
        ("vllm", "securityContext"): "core.v1.SecurityContext",
        ("vllm", "startupProbe"): "core.v1.Probe",
        ("vllm", "readinessProbe"): "core.v1.Probe",
        ("vllm", "livenessProbe"): "core.v1.Probe",
        ("vllm", "updateStrategy"): "apps.v1.DeploymentStrategy",
    }
    for (section, key), kind in refs.items():
        value, ref = props[section]["properties"][key], {"$ref": f"#/definitions/io.k8s.api.{kind}"}
        # (or the definition and more: kvwatch's probes are held to its /healthz too)
        assert value == ref or value.get("allOf", [None])[0] == ref, (section, key)
    assert props["podSecurityContext"] == {"$ref": "#/definitions/io.k8s.api.core.v1.PodSecurityContext"}
    probe = schema["definitions"]["io.k8s.api.core.v1.Probe"]
    assert probe["additionalProperties"] is False and "failureThreshold" in probe["properties"]


def test_schema_config_keys_are_the_settings_fields() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    config = schema["properties"]["config"]
    assert config["additionalProperties"] is False
    assert set(config["properties"]) == set(CONFIG_KEYS)
    assert set(yaml.safe_load((CHART / "values.yaml").read_text())["config"]) == set(CONFIG_KEYS)
    assert CONFIG_KEYS["modelConfig"] == "model_config_path"


def test_schema_config_is_what_the_sync_script_generates_from_the_settings() -> None:
    """Types, bounds and enums; descriptions may lag (the script refreshes them too)."""

    def without_descriptions(props: dict[str, Any]) -> dict[str, Any]:
        return {k: {kk: vv for kk, vv in v.items() if kk != "description"} for k, v in props.items()}

    committed = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]["properties"]
    assert without_descriptions(committed) == without_descriptions(SYNC.config_schema()), (
        "values.schema.json is behind kvwatch's settings: run .venv/bin/python scripts/sync_chart_files.py")


def test_sync_script_check_finds_nothing_stale() -> None:
    """Descriptions too: the chart's schema says what kvwatch's --help says."""
    assert SYNC.main(["--check"]) == 0, "run .venv/bin/python scripts/sync_chart_files.py"


def test_schema_config_types_match_the_settings() -> None:
    json_types = {"integer": int, "number": float, "string": str, "boolean": bool}
    settings_schema = ServeSettings.json_schema()
    config = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]["properties"]
    for key, field in CONFIG_KEYS.items():
        branches = settings_schema[field].get("anyOf", [settings_schema[field]])
        wanted = {b["type"] for b in branches if b.get("type") != "null"}
        declared = set(config[key]["type"]) - {"null"}
        if wanted == {"number"}:  # `helm --set` passes decimals as strings: accepted as decimal text
            assert declared == {"number", "string"} and config[key]["pattern"], key
            declared = wanted
        assert declared == wanted, key
        for value in config[key].get("enum", []):
            if value is not None:  # every value the chart allows, kvwatch accepts
                ServeSettings(**{field: value})
        assert json_types[next(iter(declared))]


def _schema_paths(schema: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths = set()
    for key, sub in schema.get("properties", {}).items():
        paths.add((*prefix, key))
        paths |= _schema_paths(sub, (*prefix, key))
    return paths


def test_every_chart_key_in_values_yaml_has_a_comment() -> None:
    """Keys the chart defines (in the schema's properties) need a comment; Kubernetes objects inside
    (resources, probes, security contexts) are documented by Kubernetes."""
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    chart_keys = _schema_paths(json.loads((CHART / "values.schema.json").read_text()))
    missing = []

    def walk(node: yaml.Node, prefix: tuple[str, ...]) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key_node, value_node in node.value:
            path = (*prefix, key_node.value)
            if path in chart_keys:
                line = key_node.start_mark.line
                commented = " # " in lines[line] or (line > 0 and lines[line - 1].lstrip().startswith("#"))
                if not commented:
                    missing.append(".".join(path))
                walk(value_node, path)

    walk(yaml.compose(text), ())
    assert not missing, f"values.yaml keys without a comment: {missing}"
    assert len(chart_keys) > 80


def test_ci_values_cover_both_modes_and_every_integration() -> None:
    combined = [merged_values(c) for c in CASES]
    assert {v["vllm"]["enabled"] for v in combined} == {True, False}
    for toggle in ("serviceMonitor", "podMonitor", "prometheusRule", "dashboards"):
        assert any(v[toggle]["enabled"] for v in combined), toggle
    assert re.fullmatch(r"v\d+\.\d+\.\d+", merged_values("default")["vllm"]["image"]["tag"])


@pytest.mark.parametrize(("flag", "value"), [
    ("tolerations", '[{"key":"a","operatr":"Exists"}]'),
    ("kvwatch.extraEnv", '[{"name":"A","valu":"b"}]'),
    ("kvwatch.extraEnv", '[{"name":"KVWATCH_FOO","value":"b"}]'),
    ("kvwatch.extraEnv", '[{"name":"kvwatch_poll_interval_seconds","value":"5"}]'),  # kvwatch reads any case
    ("config.blockSize", "24"),  # kvwatch and vLLM refuse it at start
    # Prometheus' snake_case in the operator's camelCase objects: the API server pruned the field silently
    ("serviceMonitor.relabelings", '[{"source_labels":["a"],"target_label":"b"}]'),
    ("podMonitor.metricRelabelings", '[{"action":"drop","source_labels":["__name__"]}]'),
    ("vllm.env", '[{"name":"A","valeu":"b"}]'),
    ("kvwatch.extraVolumeMounts", '[{"name":"x","mountpath":"/x"}]'),
    ("extraVolumes", '[{"name":"x","emptydir":{}}]'),
    ("affinity", '{"nodeAfinity":{}}'),
])
def test_passed_through_kubernetes_objects_are_checked_too(flag: str, value: str) -> None:
    # A typo in a list handed to Kubernetes verbatim rendered, and a KVWATCH_* extra variable stopped kvwatch.
    assert "schema" in render_fails("--set", "config.model=m", "--set-json", f"{flag}={value}")


def test_labels_may_not_redefine_the_selector_labels() -> None:
    # podLabels {"app.kubernetes.io/name": "other"} rendered the key twice; read last-wins, the Service and the
    # monitors no longer selected the pods, and helm lint passed.
    for values in ('podLabels={"app.kubernetes.io/name":"other"}', 'commonLabels={"app.kubernetes.io/instance":"x"}'):
        assert "may not set app.kubernetes.io/" in render_fails("--set", "config.model=m", "--set-json", values)


def test_part_of_is_a_default_a_platform_may_replace() -> None:
    # refused as a selector label, which it is not (the selectors are name and instance)
    objects = render("--set", "config.model=m", "--set-json", 'commonLabels={"app.kubernetes.io/part-of":"llm"}')
    deployment = only(objects, "Deployment")
    for labels in (deployment["metadata"]["labels"], deployment["spec"]["template"]["metadata"]["labels"]):
        assert labels["app.kubernetes.io/part-of"] == "llm"
    assert "app.kubernetes.io/part-of" not in deployment["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_a_monitor_without_the_charts_workload_needs_a_selector(monitor: str) -> None:
    # deployment.enabled=false (the sidecar embedded in one's own Deployment): the default selector named this
    # chart's Service or pods, which are not rendered, and the monitor silently scraped nothing.
    assert f"{monitor}.selector is required" in render_fails(
        "--set", "deployment.enabled=false", "--set", f"{monitor}.enabled=true")
    assert render("--set", "deployment.enabled=false", "--set", f"{monitor}.enabled=true",
                  "--set-json", f'{monitor}.selector={{"app":"vllm"}}')


@pytest.mark.parametrize(("field", "good", "bad"), [
    ("gpu_uuids", ["GPU-1", " GPU-1 , MIG-2,", ",GPU-a,,GPU-b"], ["abc", "GPU-1,x", ",", "GPU-1 2"]),
    ("usage_metric", ["vllm:kv_cache_usage_perc", ' vllm:x{a="b", c="d\\"e"} ', "x{}"],
     ["x{y", "9x", 'x{a=b}', "x y"]),
    # a port past 65535 or 0, and an address with a port: the chart rendered them, and kvwatch exited at start
    ("target_url", ["http://h:9400/metrics", "http://[fd00::1]:9400/metrics", "https://u:p@ss@h/m", "http://h:65535"],
     ["http://h:94000/metrics", "http://h:0/metrics", "http://h:65536/", "http://h:9400:1/"]),
    ("listen_address", ["0.0.0.0", "::", "fe80::1", "fe80::1%eth0", "kvwatch.local"], ["0.0.0.0:9747", "localhost:80"]),
    # gguf & co.: methods vLLM takes and kvwatch cannot price (the capacity model is then off), not typos
    ("quantization", ["fp8", "FP8", "compressed-tensors", "compressed_tensors", "w4a16", "none", " awq ", "gguf",
                      "Quark"], ["bogus", "fp8x", "int"]),
])
def test_the_charts_patterns_are_the_settings_own(field: str, good: list[str], bad: list[str]) -> None:
    # One pattern, two readers: kvwatch's validator and the chart's schema, so what one takes the other takes. Helm
    # itself (Go's RE2) renders each good value and refuses each bad one; Python's re reads the same pattern.
    import re

    from kvwatch.settings import SettingsError

    key = next(k for k, f in CONFIG_KEYS.items() if f == field)
    config = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]["properties"]
    pattern = re.compile(config[key]["pattern"])
    # (GPU UUIDs select among a GPU source's GPUs: without one both refuse them whatever they are)
    source: dict[str, Any] = {"nvml": True} if field == "gpu_uuids" else {}
    with_source = ["--set", "config.nvml=true"] if source else []
    for value in good:
        assert pattern.match(value), value
        ServeSettings(**{field: value}, **source)
        render(*MINIMAL, *with_source, "--set-json", f"config.{key}={json.dumps(value)}")
    for value in bad:
        assert not pattern.match(value), value
        with pytest.raises((ValueError, SettingsError)):
            ServeSettings(**{field: value}, **source)
        assert key in render_fails(*MINIMAL, *with_source, "--set-json", f"config.{key}={json.dumps(value)}")


def test_a_url_port_kubernetes_expands_renders() -> None:
    # docs/deploy.md: a $(VAR) in targetUrl is Kubernetes' to expand, port included (the port pattern refused it)
    env = containers(render("--set", "config.model=m", "--set", "vllm.enabled=false", "--set",
                            "config.targetUrl=http://vllm:$(VLLM_PORT)/metrics"))["kvwatch"]["env"]
    assert {e["name"]: e.get("value") for e in env}["KVWATCH_TARGET_URL"] == "http://vllm:$(VLLM_PORT)/metrics"


def test_every_number_takes_the_decimal_string_helm_set_passes() -> None:
    # docs/deploy.md promises it; `--set autoscaling.targetKvUtilization=0.7` and `vllm.prefillSecondsEstimate=90.5`
    # failed with "got string, want number". And `--set-string serviceMonitor.interval=0` rendered `interval: 0`,
    # a number, which the operator's CRD refuses.
    schema = json.loads((CHART / "values.schema.json").read_text())

    def numbers(node: object, path: str) -> list[str]:
        if isinstance(node, dict):
            kinds = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
            own = [path] if "number" in kinds and "string" not in kinds else []
            return own + [p for k, v in node.items() for p in numbers(v, f"{path}/{k}")]
        return [p for i, v in enumerate(node) for p in numbers(v, f"{path}/{i}")] if isinstance(node, list) else []

    assert [p for p in numbers(schema["properties"], "") if "definitions" not in p] == []
    objects = render(*MINIMAL, "--set", "autoscaling.enabled=true", "--set", "autoscaling.prometheusAddress=http://p:9090",
                     "--set", "autoscaling.targetKvUtilization=0.7", "--set", "vllm.prefillSecondsEstimate=90.5",
                     "--set", "serviceMonitor.enabled=true", "--set-string", "serviceMonitor.interval=0")
    for obj in objects:
        validate_object(obj)
    assert only(objects, "ServiceMonitor")["spec"]["endpoints"][0]["interval"] == "0"


@pytest.mark.parametrize("flag", ["vllm.shmSizeLimit=16GB", "vllm.resources.limits.memory=64GB",
                                  "vllm.modelCache.sizeLimit=100 Gi", "kvwatch.resources.requests.cpu=half"])
def test_a_size_the_api_server_would_refuse_is_refused_at_render(flag: str) -> None:
    # "16GB" rendered, linted and validated, and the API server refused it: quantities must match apimachinery's
    # regular expression (B is no suffix).
    assert "does not match" in render_fails("--set", "config.model=m", "--set", flag)


def test_sizes_kubernetes_accepts_render() -> None:
    objects = render("--set", "config.model=m", "--set", "vllm.shmSizeLimit=16G", "--set",
                     "vllm.resources.limits.memory=64Gi", "--set", "vllm.modelCache.enabled=true", "--set",
                     "vllm.modelCache.sizeLimit=200Gi", "--set", "kvwatch.resources.requests.cpu=250m",
                     "--set-json", "vllm.resources.limits.cpu=8", "--set-json", "vllm.resources.requests.cpu=null")
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert vllm["resources"]["limits"]["memory"] == "64Gi" and vllm["resources"]["limits"]["cpu"] == 8
    assert {"name": "model-cache", "emptyDir": {"sizeLimit": "200Gi"}} in pod["volumes"]


@pytest.mark.parametrize("key", ["vllm.port", "vllm.resources", "vllm.hfTokenSecret", "vllm.modelCache", "autoscaling"])
def test_a_key_the_templates_need_set_to_null_fails_naming_it(key: str) -> None:
    # `--set vllm.port=null` rendered `port: <nil>` through lint; the maps failed with a nil-pointer template error.
    # Helm deletes a key set to null: the schema requires these.
    error = render_fails("--set", "config.model=m", "--set", f"{key}=null")
    assert f"missing property '{key.rsplit('.', 1)[-1]}'" in error


def test_an_all_digit_image_tag_renders_as_written(tmp_path) -> None:
    # a build number as the tag was refused (a number, not a string); from a values file Helm reads
    # it as a float, which toString printed as 2.0250601e+07
    values = tmp_path / "tags.yaml"
    values.write_text("kvwatch:\n  image:\n    tag: 20250601\nvllm:\n  image:\n    tag: 20250602\n")
    images = {name: c["image"] for name, c in containers(render(*MINIMAL, "-f", str(values))).items()}
    assert images["kvwatch"].endswith(":20250601") and images["vllm"].endswith(":20250602")
    assert containers(render(*MINIMAL, "--set", "kvwatch.image.tag=2"))["kvwatch"]["image"].endswith(":2")


def test_the_kvwatch_image_must_be_named() -> None:
    # No registry publishes a kvwatch image: a default of "kvwatch" rendered docker.io/library/kvwatch, which does
    # not pull, and a pod whose sidecar cannot start keeps vLLM out of its Service too.
    error = render_fails(*MINIMAL, "--set", "kvwatch.image.repository=")
    assert "kvwatch.image.repository is required" in error and "Dockerfile" in error


DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_a_digest_pins_each_image() -> None:
    # The digest in the tag rendered "repo:sha256:...", an image name the kubelet refuses (InvalidImageName).
    images = {name: c["image"] for name, c in containers(render(
        *MINIMAL, "--set", f"kvwatch.image.digest={DIGEST}", "--set", f"vllm.image.digest={DIGEST}")).items()}
    assert images == {"kvwatch": f"{IMAGE}@{DIGEST}", "vllm": f"vllm/vllm-openai@{DIGEST}"}


@pytest.mark.parametrize("flag", [
    f"kvwatch.image.tag={DIGEST}", f"vllm.image.tag={DIGEST}", "kvwatch.image.tag=0.1.0@" + DIGEST,
    "kvwatch.image.digest=0123abcd", "vllm.image.digest=sha256:XYZ", "kvwatch.image.tag=:0.1.0",
])
def test_image_references_the_kubelet_would_refuse_are_refused(flag: str) -> None:
    assert "schema" in render_fails(*MINIMAL, "--set-string", flag)


@pytest.mark.parametrize("probe", ["livenessProbe", "readinessProbe"])
def test_a_kvwatch_probe_on_another_path_is_refused(probe: str) -> None:
    # vLLM's /health is a 404 on kvwatch's port: the liveness probe restarted the sidecar forever, and while it
    # waited in back-off the pod (vLLM's too) was not Ready.
    assert "schema" in render_fails(*MINIMAL, "--set", f"kvwatch.{probe}.httpGet.path=/health")
    assert render(*MINIMAL, "--set", f"kvwatch.{probe}.httpGet.path=/healthz")


@pytest.mark.parametrize("tag", ["", "latest"])
def test_the_vllm_image_tag_is_pinned(tag: str) -> None:
    # An empty tag rendered "vllm/vllm-openai:" (an invalid image reference the kubelet refuses at
    # pull time); "latest" changes vLLM, and with it the metric names, under a running release.
    said = render_fails("--set", "config.model=m", "--set-string", f"vllm.image.tag={tag}")
    assert ("schema" if not tag else "vllm.image.tag latest is refused: pin a vLLM version") in said


@pytest.mark.parametrize(("key", "value"), [
    ("podLabels.team", "ml infra"),  # a blank
    ("commonLabels.team", "x" * 64),  # past 63 characters
    ("serviceMonitor.additionalLabels.release", "-prom"),  # not starting with a letter or digit
    ("nodeSelector.pool", "gpu/h100"),
])
def test_a_label_value_kubernetes_refuses_fails_at_install_naming_it(key: str, value: str) -> None:
    # The chart rendered them and the API server refused the object at
    # install, one object at a time.
    from helm_helpers import MINIMAL, render_fails

    message = render_fails(*MINIMAL, "--set-string", f"{key}={value}")
    assert "/" + key.replace(".", "/") in message and ("does not match pattern" in message or "maxLength" in message)


def test_label_keys_kubernetes_takes_are_taken() -> None:
    from helm_helpers import MINIMAL, render

    objects = render(*MINIMAL, "--set-string", "commonLabels.app\\.kubernetes\\.io/part-of=llm-serving",
                     "--set-string", "podLabels.team=ml_infra.v2", "--set-string", "podLabels.empty=")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["metadata"]["labels"]["app.kubernetes.io/part-of"] == "llm-serving"
    assert {"team": "ml_infra.v2", "empty": ""}.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
