"""The Helm chart, rendered by the real `helm` and checked against real schemas.

Every object of every render (default values and each `ci/*-values.yaml`) is validated: built-in kinds with
kubernetes-validate's schemas for a recent Kubernetes, prometheus-operator kinds against the CRDs' own
openAPIV3Schema (tests/fixtures/k8s-schemas). Then the behaviour the chart promises is asserted on the objects.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kvwatch.settings import KNOWN_ENV, ServeSettings, env_name, load_settings, public_name

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "kvwatch"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
CRD_DIR = Path(__file__).parent / "fixtures" / "k8s-schemas"
KUBERNETES_VERSION = "1.35"  # helm v4's client version; kubernetes-validate ships up to 1.37
NAMESPACE = "inference"
CASES = ["default", *(p.name for p in CI_VALUES)]
# values.yaml names no model (kvwatch alone must not inherit one): the smallest mode-1 install is this.
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MINIMAL = ("--set", f"config.model={MODEL}")

# config key -> vLLM flag, for the keys the chart passes to both containers.
VLLM_FLAGS = {
    "gpuMemoryUtilization": "--gpu-memory-utilization",
    "tensorParallelSize": "--tensor-parallel-size",
    "pipelineParallelSize": "--pipeline-parallel-size",
    "dtype": "--dtype",
    "kvCacheDtype": "--kv-cache-dtype",
    "blockSize": "--block-size",
    "maxModelLen": "--max-model-len",
    "maxNumBatchedTokens": "--max-num-batched-tokens",
    "maxNumSeqs": "--max-num-seqs",
}


def _load_sync_script() -> Any:
    """scripts/sync_chart_files.py: the chart's spelling of a setting, and the schema it generates."""
    spec = importlib.util.spec_from_file_location("sync_chart_files", ROOT / "scripts" / "sync_chart_files.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SYNC = _load_sync_script()
# camelCase `config:` key -> field name, from the settings themselves (model_config_path is modelConfig).
CONFIG_KEYS = {SYNC.camel(public_name(field)): field for field in ServeSettings.model_fields}


# ---------------------------------------------------------------- helm

@functools.cache
def helm_binary() -> str:
    """helm on PATH, else where .ci/install-tools.sh puts it ($HELM_BIN, default ~/.local/bin/helm)."""
    found = shutil.which("helm")
    if found is not None:
        return found
    installed = Path(os.environ.get("HELM_BIN") or Path.home() / ".local" / "bin" / "helm")
    if installed.is_file() and os.access(installed, os.X_OK):
        return str(installed)
    pytest.fail(f"helm is neither on PATH nor at {installed}: run `make tools` (.ci/install-tools.sh installs helm v4)")


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60, check=False)


def values_args(case: str) -> list[str]:
    return list(MINIMAL) if case == "default" else ["-f", str(CHART / "ci" / case)]


@functools.cache
def _render(args: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    result = run_helm("template", "kvw", str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, f"helm template {' '.join(args)} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(*args: str) -> list[dict[str, Any]]:
    """The rendered objects (a deep copy: tests may not corrupt the cache)."""
    return copy.deepcopy(list(_render(tuple(args))))


def render_fails(*args: str) -> str:
    result = run_helm("template", "kvw", str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode != 0, f"helm template {' '.join(args)} should have failed"
    return result.stderr


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {[o['kind'] for o in objects]}"
    return found[0]


def containers(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def merged_values(case: str) -> dict[str, Any]:
    """values.yaml overlaid with a ci file (maps merge, other values replace), as Helm does."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if case == "default":
        values["config"]["model"] = MODEL
    else:
        values = merge(values, yaml.safe_load((CHART / "ci" / case).read_text()))
    return values


# ---------------------------------------------------------------- schemas

def _strict(schema: Any) -> Any:
    """Close every object schema that lists its properties, so a misspelt field fails (the API server would
    silently prune it), except where the CRD keeps unknown fields on purpose."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    validators = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"])
            validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    return validators


def validate_object(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in crd_validators():
        errors = sorted(crd_validators()[key].iter_errors(obj), key=lambda e: list(e.absolute_path))
        assert not errors, f"{key} {obj['metadata']['name']}: " + "; ".join(
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
    else:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{key} {obj['metadata']['name']}: {'/'.join(map(str, exc.path))}: {exc.message}")


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


# ---------------------------------------------------------------- the sidecar and its settings

def expected_env(values: dict[str, Any]) -> dict[str, str]:
    env = {}
    for key, value in values["config"].items():
        if value is not None:
            text = json.dumps(value) if isinstance(value, bool) else str(value)
            env[env_name(public_name(CONFIG_KEYS[key]))] = text
    env.setdefault("KVWATCH_LISTEN_ADDRESS", "0.0.0.0")
    if values["vllm"]["enabled"]:
        env.setdefault("KVWATCH_TARGET_URL", f"http://127.0.0.1:{values['vllm']['port']}/metrics")
    web = values.get("webConfig") or {}
    if web.get("secretName"):
        env["KVWATCH_WEB_CONFIG_FILE"] = f"/etc/kvwatch/web/{web.get('key') or 'web-config.yml'}"
    return env


@pytest.mark.parametrize("case", CASES)
def test_sidecar_env_is_the_config_block_in_kvwatch_variables(case: str) -> None:
    values = merged_values(case)
    kvwatch = containers(render(*values_args(case)))["kvwatch"]
    rendered = {e["name"]: e["value"] for e in kvwatch["env"]}
    assert rendered == expected_env(values)
    assert kvwatch["args"] == ["serve"]


@pytest.mark.parametrize("case", CASES)
def test_kvwatch_accepts_the_rendered_env(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The env is not just well-named: kvwatch's own settings loader parses every value (no 1.6e+07)."""
    values = merged_values(case)
    env = containers(render(*values_args(case)))["kvwatch"]["env"]
    for entry in env:
        # The web config is a file from the Secret, inside the pod only; tests/test_web.py loads real ones.
        if entry["name"] != "KVWATCH_WEB_CONFIG_FILE":
            monkeypatch.setenv(entry["name"], entry["value"])
    settings = load_settings(ServeSettings)
    for key, value in values["config"].items():
        if value is not None:
            loaded = getattr(settings, CONFIG_KEYS[key])
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert loaded == value, key
            else:
                assert str(loaded).lower() == str(value).lower(), key
    assert settings.listen_address == "0.0.0.0"


def test_large_integers_and_set_values_stay_integers() -> None:
    env = containers(render(*MINIMAL, "--set", "config.maxBodyBytes=67108864", "--set", "config.blockSize=32"))[
        "kvwatch"]["env"]
    rendered = {e["name"]: e["value"] for e in env}
    assert rendered["KVWATCH_MAX_BODY_BYTES"] == "67108864"
    assert rendered["KVWATCH_BLOCK_SIZE"] == "32"
    from_file = {e["name"]: e["value"] for e in containers(render(*values_args("sidecar-full-values.yaml")))[
        "kvwatch"]["env"]}
    assert from_file["KVWATCH_MAX_BODY_BYTES"] == "33554432"


def test_decimals_given_with_plain_set_pass_the_schema_and_reach_both_containers() -> None:
    # helm --set keeps 0.9 as the string "0.9": the schema takes a decimal string where a number goes.
    assert "--set config.gpuMemoryUtilization=0.9" in (ROOT / "docs" / "deploy.md").read_text()
    objects = render(*MINIMAL, "--set", "config.gpuMemoryUtilization=0.9", "--set", "config.pollIntervalSeconds=2.5")
    env = {e["name"]: e["value"] for e in containers(objects)["kvwatch"]["env"]}
    assert (env["KVWATCH_GPU_MEMORY_UTILIZATION"], env["KVWATCH_POLL_INTERVAL_SECONDS"]) == ("0.9", "2.5")
    assert vllm_flags(containers(objects)["vllm"]["args"])["--gpu-memory-utilization"] == "0.9"
    for bad in ("abc", "-0.9"):
        assert "/config/gpuMemoryUtilization" in render_fails(*MINIMAL, "--set", f"config.gpuMemoryUtilization={bad}")
    # JSON numbers keep the schema's bounds.
    assert "/config/gpuMemoryUtilization" in render_fails(*MINIMAL, "--set-json", "config.gpuMemoryUtilization=1.5")
    assert "/config/gpuMemoryUtilization" in render_fails(*MINIMAL, "--set", "config.gpuMemoryUtilization=0")


def vllm_flags(args: list[str]) -> dict[str, str | None]:
    flags: dict[str, str | None] = {}
    i = 1  # args[0] is the model
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            flags[args[i]] = args[i + 1]
            i += 2
        else:
            flags[args[i]] = None
            i += 1
    return flags


@pytest.mark.parametrize("case", [c for c in CASES if merged_values(c)["vllm"]["enabled"]])
def test_vllm_and_the_sidecar_describe_the_same_deployment(case: str) -> None:
    values = merged_values(case)
    pod = containers(render(*values_args(case)))
    vllm, kvwatch = pod["vllm"], pod["kvwatch"]
    env = {e["name"]: e["value"] for e in kvwatch["env"]}
    assert vllm["args"][0] == values["config"]["model"] == env["KVWATCH_MODEL"]
    flags = vllm_flags(vllm["args"])
    assert flags["--port"] == str(values["vllm"]["port"])
    for key, flag in VLLM_FLAGS.items():
        variable = env_name(public_name(CONFIG_KEYS[key]))
        assert flags.get(flag) == env.get(variable), f"{flag} vs {variable}"
    chunked = values["vllm"]["enableChunkedPrefill"]
    assert ("--enable-chunked-prefill" in flags) is (chunked is True)
    assert ("--no-enable-chunked-prefill" in flags) is (chunked is False)
    for arg in values["vllm"]["extraArgs"]:
        assert arg in vllm["args"]
    gpus = str((values["config"]["tensorParallelSize"] or 1) * (values["config"]["pipelineParallelSize"] or 1))
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert vllm["resources"]["requests"]["nvidia.com/gpu"] == gpus


def test_gpus_follow_tensor_parallel_size() -> None:
    vllm = containers(render(*MINIMAL, "--set", "config.tensorParallelSize=4"))["vllm"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert vllm_flags(vllm["args"])["--tensor-parallel-size"] == "4"


# ---------------------------------------------------------------- probes, security, volumes

def test_vllm_probes_survive_model_loading_and_long_prefill() -> None:
    vllm = containers(render(*MINIMAL))["vllm"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = vllm["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60, "model loading takes minutes"
    liveness = vllm["livenessProbe"]
    assert liveness["timeoutSeconds"] >= 10, "the kubelet's 1 s default kills pods busy with a long prefill"
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 120
    assert vllm["readinessProbe"]["timeoutSeconds"] >= 5
    assert {p["name"]: p["containerPort"] for p in vllm["ports"]} == {"http": 8000}


def test_vllm_pods_are_replaced_without_surging() -> None:
    """No extra GPUs needed during an upgrade: maxSurge 0, one pod at a time."""
    strategy = only(render(*values_args("sidecar-full-values.yaml")), "Deployment")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert "strategy" not in only(render(*values_args("standalone-values.yaml")), "Deployment")["spec"]


def test_probes_are_configurable() -> None:
    vllm = containers(render(*MINIMAL, "--set", "vllm.startupProbe.failureThreshold=360"))["vllm"]
    assert vllm["startupProbe"]["failureThreshold"] == 360


@pytest.mark.parametrize("case", CASES)
def test_kvwatch_container_is_restricted_and_probed_on_its_metrics_port(case: str) -> None:
    values = merged_values(case)
    kvwatch = containers(render(*values_args(case)))["kvwatch"]
    port = values["config"]["port"] or 9747
    assert kvwatch["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    probe = {"path": "/healthz", "port": "metrics"}
    if (values.get("webConfig") or {}).get("tls"):
        probe["scheme"] = "HTTPS"  # kvwatch serves TLS only
    assert kvwatch["livenessProbe"]["httpGet"] == probe
    if values["vllm"]["enabled"]:
        assert "readinessProbe" not in kvwatch, "a not-ready sidecar would take vLLM out of its Service"
    else:
        assert kvwatch["readinessProbe"]["httpGet"] == probe
    sc = kvwatch["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert kvwatch["resources"]["limits"]["memory"]
    assert kvwatch["image"] == f"kvwatch:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"


def test_shared_memory_and_model_cache_volumes() -> None:
    objects = render(*values_args("sidecar-full-values.yaml"))
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "model-cache"}
    vllm = containers(objects)["vllm"]
    mounts = {m["name"]: m["mountPath"] for m in vllm["volumeMounts"]}
    assert mounts == {"dshm": "/dev/shm", "model-cache": "/models"}
    env = {e["name"]: e for e in vllm["env"]}
    assert env["HF_HOME"]["value"] == "/models"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert pod["automountServiceAccountToken"] is False
    emptydir = only(render(*values_args("podmonitor-values.yaml")), "Deployment")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in emptydir["volumes"]}["model-cache"]["emptyDir"] == {"sizeLimit": "100Gi"}


# ---------------------------------------------------------------- modes

def test_standalone_mode_runs_kvwatch_alone_against_one_pod() -> None:
    objects = render(*values_args("standalone-values.yaml"))
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    pod = containers(objects)
    assert set(pod) == {"kvwatch"}
    env = {e["name"]: e["value"] for e in pod["kvwatch"]["env"]}
    assert env["KVWATCH_TARGET_URL"] == merged_values("standalone-values.yaml")["config"]["targetUrl"]
    assert [p["name"] for p in only(objects, "Service")["spec"]["ports"]] == ["metrics"]
    assert "volumes" not in deployment["spec"]["template"]["spec"]


def test_standalone_mode_without_a_target_is_refused() -> None:
    stderr = render_fails("--set", "vllm.enabled=false")
    assert "targetUrl" in stderr


def test_sidecar_mode_without_a_model_is_refused() -> None:
    assert yaml.safe_load((CHART / "values.yaml").read_text())["config"]["model"] is None
    assert "config.model is required" in render_fails()
    assert "config.model is required" in render_fails("--set", "config.maxNumSeqs=64")


def test_standalone_mode_inherits_no_model_from_the_chart_defaults() -> None:
    """kvwatch alone watches someone else's vLLM: a default model would feed its capacity model a wrong one."""
    objects = render("--set", "vllm.enabled=false", "--set", "config.targetUrl=http://vllm-0.vllm:8000/metrics")
    env = {e["name"]: e["value"] for e in containers(objects)["kvwatch"]["env"]}
    assert "KVWATCH_MODEL" not in env
    assert env["KVWATCH_TARGET_URL"] == "http://vllm-0.vllm:8000/metrics"
    named = render("--set", "vllm.enabled=false", "--set", "config.targetUrl=http://vllm-0.vllm:8000/metrics",
                   "--set", "config.model=Qwen/Qwen3-8B")
    assert {e["name"]: e["value"] for e in containers(named)["kvwatch"]["env"]}["KVWATCH_MODEL"] == "Qwen/Qwen3-8B"


def test_named_sidecar_template_embeds_in_another_chart(tmp_path: Path) -> None:
    """The documented way to add kvwatch to an existing vLLM chart (docs/deploy.md)."""
    parent = tmp_path / "my-vllm"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "kvwatch")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: my-vllm\nversion: 1.0.0\n"
        "dependencies:\n  - name: kvwatch\n    version: 0.1.0\n")
    (parent / "values.yaml").write_text(
        "kvwatch:\n  deployment:\n    enabled: false\n  config:\n    model: Qwen/Qwen3-8B\n    maxNumSeqs: 64\n"
        "  podMonitor:\n    enabled: true\n    selector:\n      app: my-vllm\n")
    (parent / "templates" / "deployment.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: my-vllm\nspec:\n"
        "  selector:\n    matchLabels:\n      app: my-vllm\n  template:\n    metadata:\n      labels:\n"
        "        app: my-vllm\n    spec:\n      containers:\n        - name: vllm\n"
        "          image: vllm/vllm-openai:v0.33.0\n"
        '        {{- include "kvwatch.sidecarContainer" .Subcharts.kvwatch | trim | nindent 8 }}\n')
    result = run_helm("template", "rel", str(parent), "--namespace", NAMESPACE)
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert sorted(o["kind"] for o in objects) == ["Deployment", "PodMonitor"]
    for obj in objects:
        validate_object(obj)
    pod = {c["name"]: c for c in only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]}
    env = {e["name"]: e["value"] for e in pod["kvwatch"]["env"]}
    assert env["KVWATCH_MODEL"] == "Qwen/Qwen3-8B" and env["KVWATCH_MAX_NUM_SEQS"] == "64"
    assert env["KVWATCH_TARGET_URL"] == "http://127.0.0.1:8000/metrics"
    assert only(objects, "PodMonitor")["spec"]["selector"]["matchLabels"] == {"app": "my-vllm"}


def test_documented_sidecar_snippet_is_what_the_chart_renders() -> None:
    """docs/deploy.md's copy-paste container for existing Deployments stays true to the chart."""
    docs = (ROOT / "docs" / "deploy.md").read_text()
    match = re.search(r"<!-- sidecar-snippet:[^>]*-->\s*```yaml\n(.*?)```", docs, re.S)
    assert match, "docs/deploy.md lost its sidecar-snippet block"
    documented = yaml.safe_load(match.group(1))
    rendered = containers(render(*MINIMAL, "--set", "kvwatch.image.repository=REGISTRY/kvwatch",
                                 "--set", "config.gpu=H100", "--set", "config.maxNumSeqs=128"))["kvwatch"]
    assert documented == [rendered]


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
    odd = render("--set", "vllm.enabled=false", "--set", "config.targetUrl=http://vllm-0:8000/metrics?x=$1",
                 "--set", f"{monitor}.enabled=true")
    labels = relabel({}, only(odd, kind)["spec"][key][0]["relabelings"])
    assert labels["vllm_target"] == "http://vllm-0:8000/metrics?x=$1"


@pytest.mark.parametrize("case", ["sidecar-full-values.yaml", "podmonitor-values.yaml"])
def test_sidecar_monitors_add_no_vllm_target(case: str) -> None:
    """In a vLLM pod, pod is the vLLM pod already."""
    for obj in render(*values_args(case)):
        if obj["kind"] in ("ServiceMonitor", "PodMonitor"):
            for endpoint in obj["spec"].get("endpoints", obj["spec"].get("podMetricsEndpoints")):
                assert "vllm_target" not in relabel({}, endpoint.get("relabelings", []))


def test_both_monitors_at_once_are_refused() -> None:
    stderr = render_fails(*MINIMAL, "--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true")
    assert "not both" in stderr


@pytest.mark.parametrize(("monitor", "interval", "timeout", "ok"), [
    ("serviceMonitor", "15s", "20s", False),
    ("podMonitor", "1m", "1m500ms", False),
    ("serviceMonitor", "1m30s", "1m", True),
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


@pytest.mark.parametrize("args", [
    ("--set", "config.port=8000"),
    ("--set", "vllm.port=9747"),
    ("--set", "config.port=9000", "--set", "vllm.port=9000"),
])
def test_kvwatch_and_vllm_on_one_port_are_refused(args: tuple[str, ...]) -> None:
    stderr = render_fails(*MINIMAL, *args)
    assert "config.port, default 9747) and vllm.port are both" in stderr


def test_kvwatch_alone_may_use_the_port_vllm_would_have() -> None:
    """Mode 2 runs no vLLM in the pod: vllm.port is not in use there."""
    objects = render("--set", "vllm.enabled=false", "--set", "config.targetUrl=http://vllm-0.vllm:8000/metrics",
                     "--set", "config.port=8000")
    assert containers(objects)["kvwatch"]["ports"][0]["containerPort"] == 8000


def test_chart_copy_of_the_rules_is_the_alerts_file() -> None:
    source = ROOT / "alerts" / "kvwatch-rules.yaml"
    assert source.is_file(), "alerts/kvwatch-rules.yaml is missing"
    assert (CHART / "files" / "kvwatch-rules.yaml").read_bytes() == source.read_bytes(), (
        "the chart's rule file is stale: run .venv/bin/python scripts/sync_chart_files.py")


def test_prometheus_rule_spec_is_the_rule_file() -> None:
    rule = only(render(*values_args("sidecar-full-values.yaml")), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "kvwatch-rules.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"KVCacheBottleneck", "KVCacheExhaustionForecast", "KvwatchTargetDown"} <= alerts


def test_chart_copy_of_the_dashboard_is_the_dashboards_file() -> None:
    source = ROOT / "dashboards" / "kvwatch.json"
    assert source.is_file(), "dashboards/kvwatch.json is missing"
    assert (CHART / "files" / "kvwatch.json").read_bytes() == source.read_bytes(), (
        "the chart's dashboard is stale: run .venv/bin/python scripts/sync_chart_files.py")


def test_dashboard_configmap_carries_the_dashboard_for_the_grafana_sidecar() -> None:
    configmap = only(render(*values_args("sidecar-full-values.yaml")), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
    assert json.loads(configmap["data"]["kvwatch.json"]) == json.loads((CHART / "files" / "kvwatch.json").read_text())


def test_integrations_are_off_by_default() -> None:
    kinds = sorted(o["kind"] for o in render(*MINIMAL))
    assert kinds == ["Deployment", "Service"]


def test_chart_app_version_is_the_package_version() -> None:
    """appVersion is the default kvwatch image tag: it must name the release the chart was written for."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and chart["appVersion"] == version.group(1)


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


@pytest.mark.parametrize(("args", "says"), [
    ((), "startupProbe allows 1800 s"),
    (("--set", "vllm.startupProbe.failureThreshold=360"), "--timeout=3600s"),
    (("--set", "vllm.startupProbe.periodSeconds=null"), "startupProbe allows 1800 s"),  # Kubernetes' 10 s
    (("--set", "vllm.startupProbe=null"), "vLLM has no startupProbe"),
    (("--set", "vllm.startupProbe.failureThreshold=360", "--set", "prometheusRule.enabled=true"),
     'Warning: the startupProbe allows 3600 s, but KvwatchTargetDown{since="start"} fires after 35m'),
])
def test_install_notes_follow_the_startup_probe(args: tuple[str, ...], says: str) -> None:
    """The notes read the probe's fields: a removed probe (or field) must not crash the install."""
    assert says in install_notes(*MINIMAL, *args)


def test_install_notes_warn_only_when_the_startup_budget_outlasts_the_target_down_rule() -> None:
    assert "Warning: the startupProbe" not in install_notes(*MINIMAL, "--set", "prometheusRule.enabled=true")
    assert "Warning: the startupProbe" not in install_notes(*MINIMAL, "--set", "vllm.startupProbe.failureThreshold=360")


# ---------------------------------------------------------------- values and schema

@pytest.mark.parametrize(("flag", "culprit"), [
    ("confg.model=x", "confg"),
    ("config.pollIntervalSecond=5", "pollIntervalSecond"),
    ("vllm.tensorParallelSize=2", "tensorParallelSize"),
    ("serviceMonitor.intervall=5s", "intervall"),
    ("config.logLevel=LOUD", "logLevel"),
    ("config.targetUrl=localhost:8000", "targetUrl"),
    ("config.gpuMemoryUtilization=1.5", "gpuMemoryUtilization"),
])
def test_schema_rejects_typos_and_bad_values(flag: str, culprit: str) -> None:
    stderr = render_fails(*MINIMAL, "--set", flag)
    assert culprit in stderr


@pytest.mark.parametrize(("flag", "where", "culprit"), [
    ("kvwatch.resources.limit.memory=1Gi", "/kvwatch/resources", "limit"),
    ("vllm.startupProbe.failureTreshold=360", "/vllm/startupProbe", "failureTreshold"),
    ("kvwatch.securityContext.readOnlyRootFileSystem=true", "/kvwatch/securityContext", "readOnlyRootFileSystem"),
    ("vllm.updateStrategy.rollingupdate.maxSurge=1", "/vllm/updateStrategy", "rollingupdate"),
    ("podSecurityContext.fsgroup=1000", "/podSecurityContext", "fsgroup"),
    ("kvwatch.livenessProbe.httpGet.prot=metrics", "/kvwatch/livenessProbe/httpGet", "prot"),
    ("vllm.resources.request.cpu=8", "/vllm/resources", "request"),
    ("vllm.securityContext.capabilities.add=SYS_ADMIN", "/vllm/securityContext/capabilities/add", "array"),
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
        assert props[section]["properties"][key] == {"$ref": f"#/definitions/io.k8s.api.{kind}"}, (section, key)
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
    settings_schema = ServeSettings.model_json_schema()["properties"]
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


@pytest.mark.parametrize("prefill", [551, 2400])
def test_vllm_probes_are_sized_from_the_prefill_estimate(prefill: int) -> None:
    # 551 s: `kvwatch plan --model Qwen/Qwen2.5-7B-Instruct-1M --gpu H100 --json`'s long_context estimate.
    sized = containers(render(*MINIMAL, "--set", f"vllm.prefillSecondsEstimate={prefill}"))["vllm"]
    default = containers(render(*MINIMAL))["vllm"]
    startup, liveness = sized["startupProbe"], sized["livenessProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600 + prefill
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= prefill
    for probe in ("startupProbe", "livenessProbe"):  # raised, never lowered
        assert sized[probe]["failureThreshold"] >= default[probe]["failureThreshold"]
    assert sized["readinessProbe"] == default["readinessProbe"]


def test_prefill_estimate_must_be_a_non_negative_number() -> None:
    assert "prefillSecondsEstimate" in render_fails(*MINIMAL, "--set", "vllm.prefillSecondsEstimate=-1")


# ---------------------------------------------------------------- web config (TLS + basic auth on kvwatch)

@pytest.mark.parametrize(("values", "kind", "endpoints"), [
    ("web-config-values.yaml", "ServiceMonitor", "endpoints"),
    ("web-config-podmonitor-values.yaml", "PodMonitor", "podMetricsEndpoints"),
])
def test_web_config_is_mounted_and_monitors_and_probes_use_it(values: str, kind: str, endpoints: str) -> None:
    settings = yaml.safe_load((CHART / "ci" / values).read_text())
    objects = render("-f", str(CHART / "ci" / values))
    for obj in objects:
        validate_object(obj)
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    kvwatch = containers(objects)["kvwatch"]
    env = {e["name"]: e.get("value") for e in kvwatch["env"]}
    key = settings["webConfig"].get("key", "web-config.yml")
    assert env["KVWATCH_WEB_CONFIG_FILE"] == f"/etc/kvwatch/web/{key}"
    mount = next(m for m in kvwatch["volumeMounts"] if m["name"] == "kvwatch-web-config")
    assert mount["mountPath"] == "/etc/kvwatch/web" and mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "kvwatch-web-config")
    assert volume["secret"]["secretName"] == "kvwatch-web"
    for probe in ("livenessProbe", "readinessProbe"):
        if probe in kvwatch:
            assert kvwatch[probe]["httpGet"]["scheme"] == "HTTPS"
    monitor = only(objects, kind)
    endpoint = next(e for e in monitor["spec"][endpoints] if e["port"] == "metrics")
    monitor_values = settings["serviceMonitor" if kind == "ServiceMonitor" else "podMonitor"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == monitor_values["tlsConfig"] and endpoint["basicAuth"] == monitor_values["basicAuth"]
    # The same settings name a file kvwatch would read: the env the chart sets is a setting kvwatch knows.
    assert "KVWATCH_WEB_CONFIG_FILE" in KNOWN_ENV


def test_plain_http_monitors_get_no_tls_and_a_tls_config_without_web_config_fails() -> None:
    monitor = only(render(*MINIMAL, "--set", "serviceMonitor.enabled=true"), "ServiceMonitor")
    assert all("scheme" not in e and "tlsConfig" not in e for e in monitor["spec"]["endpoints"])
    assert "webConfig" in render_fails(*MINIMAL, "--set", "serviceMonitor.enabled=true",
                                       "--set", "serviceMonitor.tlsConfig.serverName=kvwatch")
