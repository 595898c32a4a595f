"""The pod the chart renders: the sidecar's settings as env, vLLM's flags, probes, security, volumes, the two
modes (sidecar next to vLLM, kvwatch alone) and their ports.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from helm_helpers import (
    CASES,
    CHART,
    CONFIG_KEYS,
    IMAGE,
    MINIMAL,
    NAMESPACE,
    ROOT,
    VLLM_FLAGS,
    containers,
    merged_values,
    only,
    render,
    render_fails,
    run_helm,
    validate_object,
    values_args,
    vllm_flags,
)
from kvwatch.settings import KNOWN_ENV, ServeSettings, env_name, load_settings, public_name

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
    # (a 64 MiB body cap with the memory it needs: at the default 256Mi limit it is refused, the refusal cases below)
    env = containers(render(*MINIMAL, "--set", "config.maxBodyBytes=67108864", "--set", "config.blockSize=32",
                            "--set", "kvwatch.resources.limits.memory=512Mi"))["kvwatch"]["env"]
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
    assert "/config/gpuMemoryUtilization" in render_fails(*MINIMAL, "--set", "config.gpuMemoryUtilization=abc")
    # A decimal out of range is named with its range in words (it was "'1.5' does not match pattern '^(0*\.[0-9]*...").
    for bad in ("-0.9", "1.5", "0.0"):
        assert f"config.gpuMemoryUtilization ({bad}) must be above 0 and at most 1" in render_fails(
            *MINIMAL, "--set", f"config.gpuMemoryUtilization={bad}")
    # JSON numbers keep the schema's bounds.
    assert "/config/gpuMemoryUtilization" in render_fails(*MINIMAL, "--set-json", "config.gpuMemoryUtilization=1.5")
    assert "/config/gpuMemoryUtilization" in render_fails(*MINIMAL, "--set", "config.gpuMemoryUtilization=0")


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
    assert kvwatch["image"] == f"{IMAGE}:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"


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
    # Service links of a release named kvwatch are KVWATCH_PORT=tcp://... (kvwatch also ignores them).
    assert pod["enableServiceLinks"] is False
    emptydir = only(render(*values_args("podmonitor-values.yaml")), "Deployment")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in emptydir["volumes"]}["model-cache"]["emptyDir"] == {"sizeLimit": "100Gi"}


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
        "  kvwatch:\n    image:\n      repository: registry.example.com/ml/kvwatch\n"
        "  podMonitor:\n    enabled: true\n    selector:\n      app: my-vllm\n"
        "    tlsConfig:\n      ca: {secret: {name: kvwatch-web, key: ca.crt}}\n      serverName: kvwatch\n"
        "  webConfig:\n    secretName: kvwatch-web\n    tls: true\n")
    (parent / "templates" / "deployment.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: my-vllm\nspec:\n"
        "  selector:\n    matchLabels:\n      app: my-vllm\n  template:\n    metadata:\n      labels:\n"
        "        app: my-vllm\n    spec:\n      containers:\n        - name: vllm\n"
        "          image: vllm/vllm-openai:v0.33.0\n"
        '        {{- include "kvwatch.sidecarContainer" .Subcharts.kvwatch | trim | nindent 8 }}\n'
        "      volumes:\n        - name: dshm\n          emptyDir: {}\n"
        '        {{- with include "kvwatch.sidecarVolumes" .Subcharts.kvwatch | trim }}{{ . | nindent 8 }}{{ end }}\n')
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
    # The web config the container mounts is a volume of the pod (without it the API server rejects the pod),
    # and the PodMonitor scrapes kvwatch's port only: this chart does not know what the parent names vLLM's.
    volumes = {v["name"]: v for v in only(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["kvwatch-web-config"]["secret"]["secretName"] == "kvwatch-web"
    assert {m["name"] for m in pod["kvwatch"]["volumeMounts"]} <= set(volumes)
    assert pod["kvwatch"]["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert [e["port"] for e in only(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]] == ["metrics"]


def test_the_sidecar_embeds_with_a_plain_dict_of_values(tmp_path: Path) -> None:
    """The other form _helpers.tpl documents: (dict "Values" ...) as context, which has no .Files; the GPU check
    read its preset names from a file and failed there with a nil pointer."""
    parent = tmp_path / "my-vllm"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "kvwatch")
    (parent / "Chart.yaml").write_text("apiVersion: v2\nname: my-vllm\nversion: 1.0.0\n"
                                       "dependencies:\n  - name: kvwatch\n    version: 0.1.0\n")
    (parent / "templates" / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: my-vllm\nspec:\n  containers:\n"
        '    {{- include "kvwatch.sidecarContainer" (dict "Values" .Values.kvwatchSidecar) | trim | nindent 4 }}\n')
    values = "kvwatch:\n  deployment:\n    enabled: false\nkvwatchSidecar:\n  config:\n    model: m\n    gpu: {}\n" \
             "  kvwatch:\n    image:\n      repository: r/kvwatch\n      tag: '1'\n"
    (parent / "values.yaml").write_text(values.format("nvidia-h100"))
    result = run_helm("template", "rel", str(parent), "--namespace", NAMESPACE)
    assert result.returncode == 0, result.stderr
    pod = only([d for d in yaml.safe_load_all(result.stdout) if d], "Pod")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["KVWATCH_GPU"] == "nvidia-h100"
    (parent / "values.yaml").write_text(values.format("H101"))
    result = run_helm("template", "rel", str(parent), "--namespace", NAMESPACE)
    assert result.returncode != 0 and 'config.gpu "H101" is no GPU kvwatch knows' in result.stderr


def test_documented_sidecar_snippet_is_what_the_chart_renders() -> None:
    """docs/deploy.md's copy-paste container for existing Deployments stays true to the chart."""
    docs = (ROOT / "docs" / "deploy.md").read_text()
    match = re.search(r"<!-- sidecar-snippet:[^>]*-->\s*```yaml\n(.*?)```", docs, re.S)
    assert match, "docs/deploy.md lost its sidecar-snippet block"
    documented = yaml.safe_load(match.group(1))
    rendered = containers(render(*MINIMAL, "--set", "kvwatch.image.repository=REGISTRY/kvwatch",
                                 "--set", "config.gpu=H100", "--set", "config.maxNumSeqs=128"))["kvwatch"]
    assert documented == [rendered]


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


def test_a_chart_version_bump_does_not_roll_the_pods() -> None:
    # Each vLLM restart reloads a model: the pod template carries no chart or app version (the image tag does).
    template = only(render(*MINIMAL, "--set", "podLabels.team=ml", "--set", "commonLabels.cost=gpu"),
                    "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert "helm.sh/chart" not in template and "app.kubernetes.io/version" not in template
    assert template["team"] == "ml" and template["cost"] == "gpu" and template["app.kubernetes.io/instance"]


def test_short_dtype_spellings_reach_vllm_in_its_own() -> None:
    # kvwatch reads bf16/fp16/fp32; vLLM's --dtype and --kv-cache-dtype refuse them, so the serving container
    # crash-looped while helm lint passed. The sidecar keeps the value it was given (one config: block).
    objects = render("--set", "config.model=m", "--set", "config.dtype=bf16", "--set", "config.kvCacheDtype=fp16")
    flags = vllm_flags(containers(objects)["vllm"]["args"])
    assert (flags["--dtype"], flags["--kv-cache-dtype"]) == ("bfloat16", "float16")


@pytest.mark.parametrize(("args", "message"), [
    (("--set", "config.nvml=true", "--set", "config.dcgmUrl=http://x:9400/metrics"), "config.nvml or config.dcgmUrl"),
    (("--set", "config.pollTimeoutSeconds=6"), "config.pollTimeoutSeconds (6) must be below"),
    (("--set", "config.staleAfterSeconds=1", "--set", "config.pollIntervalSeconds=5"), "must be at least"),
    (("--set", "config.listenAddress=127.0.0.1"), "must not be a loopback address"),
    (("--set", "config.clockSpeed=100"), "times config.clockSpeed (100) is more than 120 s"),
    (("--set", "config.maxBodyBytes=67108864"), "more than kvwatch.resources.limits.memory (256Mi)"),
    (("--set", "config.maxBodyBytes=50000000", "--set", "kvwatch.resources.limits.memory=268435456"),
     "more than kvwatch.resources.limits.memory (268435456)"),
    # a plain number in a values file (a float64, whose text is 5e+07) skipped the check
    (("--set-json", "kvwatch.resources.limits.memory=50000000"),
     "more than kvwatch.resources.limits.memory (50000000)"),
    # ... and so did a quantity in exponent form or with a leading point, which Kubernetes takes
    (("--set", "kvwatch.resources.limits.memory=1e8"), "more than kvwatch.resources.limits.memory (1e8)"),
    (("--set", "kvwatch.resources.limits.memory=.1Gi"), "more than kvwatch.resources.limits.memory (.1Gi)"),
    (("--set-string", "kvwatch.resources.limits.memory=+100Mi"), "more than kvwatch.resources.limits.memory (+100Mi)"),
    # a decimal given with --set is a string, which the schema's bounds do not see: rendered, then refused by kvwatch
    (("--set", "config.pollIntervalSeconds=0.001"), "config.pollIntervalSeconds (0.001) must be at least 0.01"),
    (("--set", "config.ttftSloSeconds=5000.5"), "config.ttftSloSeconds (5000.5) must be"),
    (("--set", "config.staleAfterSeconds=0.0"), "config.staleAfterSeconds (0.0) must be above 0"),
    # 10,000 series at ~0.9 MB each once warm are ~9 GB: a cap the default 256Mi cannot hold; nor 1,000 (~0.9 GB),
    # which the check passed at ~40 KB a series (docs/performance.md, "Memory per series")
    (("--set", "config.maxSeries=10000"), "config.maxSeries (10000) can take"),
    (("--set", "config.maxSeries=1000"), "config.maxSeries (1000) can take"),
    (("--set", "config.tlsVerify=false"), "config.tlsVerify applies to an https:// config.targetUrl only"),
    (("--set", "vllm.enabled=false", "--set", "config.targetUrl=https://v:8000/metrics", "--set",
      "config.caFile=/etc/ca.pem", "--set", "config.tlsVerify=false"), "config.caFile cannot be used with"),
    (("--set-string", "config.gpu=H101"), 'config.gpu "H101" is no GPU kvwatch knows'),
    (("--set", "vllm.enabled=false", "--set", "config.targetUrl=http://v:8000/metrics", "--set",
      "config.gpuPod=vllm-0", "--set", "config.dcgmUrl=http://$(NODE_IP):9400/metrics"), "kvwatch's own node"),
])
def test_settings_kvwatch_refuses_at_startup_are_refused_at_render(args: tuple[str, ...], message: str) -> None:
    # kvwatch exits 2 on each: its sidecar never got Ready, and the vLLM pod left its Service with it.
    assert message in render_fails(*MINIMAL, *args)
    # (in bounds, it renders)
    assert render(*MINIMAL, "--set", "config.pollIntervalSeconds=2.5", "--set", "config.pollTimeoutSeconds=2")


@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3", "h100", "GeForce RTX 4090", "Tesla T4", "a100-sxm4-80gb",
                                 "NVİDIA H100"])
def test_config_gpu_is_matched_as_kvwatch_matches_it(gpu: str) -> None:
    # The chart's helper normalizes the name as kvwatch.capacity.presets does: what kvwatch accepts renders.
    from kvwatch.capacity import presets

    presets.resolve_gpu(gpu)
    objects = render(*MINIMAL, "--set-string", f"config.gpu={gpu}")
    env = {e["name"]: e.get("value") for e in containers(objects)["kvwatch"]["env"]}
    assert env["KVWATCH_GPU"] == gpu


def test_an_empty_config_string_is_unset_as_everywhere_else_in_the_chart(monkeypatch: pytest.MonkeyPatch) -> None:
    # `--set config.caFile=` rendered KVWATCH_CA_FILE="", which kvwatch refused at start ("file . does not exist"),
    # as it still refuses KVWATCH_LISTEN_ADDRESS="": a crash-looping sidecar takes vLLM out of its Service. With
    # dcgmUrl, gpuPod "" also rendered twice.
    args = [*MINIMAL, "--set", "config.caFile=", "--set", "config.listenAddress=", "--set", "config.gpuPod=",
            "--set", "config.dcgmUrl=http://$(NODE_IP):9400/metrics"]
    env = containers(render(*args))["kvwatch"]["env"]
    names = [e["name"] for e in env]
    assert "KVWATCH_CA_FILE" not in names and names.count("KVWATCH_GPU_POD") == 1
    assert {e["name"]: e.get("value") for e in env}["KVWATCH_LISTEN_ADDRESS"] == "0.0.0.0"
    for entry in env:
        if "value" in entry:
            monkeypatch.setenv(entry["name"], entry["value"].replace("$(NODE_IP)", "10.0.0.1"))
        else:  # the pod's name, from the downward API
            monkeypatch.setenv(entry["name"], "vllm-0")
    assert load_settings(ServeSettings).gpu_pod == "vllm-0"


def test_data_parallel_engines_get_their_gpus_and_a_pod_fits_one_node() -> None:
    # --data-parallel-size in extraArgs passed, with the GPU request still TP x PP: vLLM could not start its engines;
    # TP 8 with gpusPerNode 4 rendered a pod no node can hold.
    objects = render(*MINIMAL, "--set", "vllm.dataParallelSize=2", "--set", "config.tensorParallelSize=2")
    vllm = containers(objects)["vllm"]
    assert vllm_flags(vllm["args"])["--data-parallel-size"] == "2"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert "vllm.dataParallelSize" in render_fails(*MINIMAL, "--set-json", 'vllm.extraArgs=["-dp","2"]')
    assert "more than config.gpusPerNode 4" in render_fails(*MINIMAL, "--set", "config.tensorParallelSize=8",
                                                            "--set", "config.gpusPerNode=4")


def test_the_documented_openshift_security_context_keeps_the_rest_of_restricted() -> None:
    assert "--set kvwatch.securityContext.runAsUser=null" in (ROOT / "docs" / "deploy.md").read_text()
    objects = render(*MINIMAL, "--set", "kvwatch.securityContext.runAsUser=null",
                     "--set", "kvwatch.securityContext.runAsGroup=null")
    context = containers(objects)["kvwatch"]["securityContext"]
    assert "runAsUser" not in context and "runAsGroup" not in context
    assert context["runAsNonRoot"] and not context["allowPrivilegeEscalation"]
    assert context["seccompProfile"]["type"] == "RuntimeDefault"
    for obj in objects:
        validate_object(obj)


def test_large_numbers_in_extra_args_reach_vllm_as_integers() -> None:
    # Helm reads YAML numbers as floats: 10000000 rendered "1e+07", which vLLM's int flags refuse
    values = '["--long-prefill-token-threshold", 10000000, "--kv-cache-memory-bytes", 21474836480, "--x", 0.5]'
    args = containers(render(*MINIMAL, "--set-json", f"vllm.extraArgs={values}"))["vllm"]["args"]
    assert args[-6:] == ["--long-prefill-token-threshold", "10000000", "--kv-cache-memory-bytes", "21474836480",
                         "--x", "0.5"]


def test_a_recreate_strategy_and_a_probe_of_another_kind_render_what_the_api_server_accepts() -> None:
    # Helm merges user maps into the defaults: Recreate kept the default rollingUpdate ("may not
    # be specified when strategy type is 'Recreate'") and a tcpSocket probe kept the default httpGet ("may not
    # specify more than 1 handler type"); the schemas pass both, the API server refuses them
    objects = render(*MINIMAL, "--set", "vllm.updateStrategy.type=Recreate",
                     "--set-json", 'vllm.livenessProbe={"tcpSocket":{"port":"http"}}',
                     "--set-json", 'vllm.readinessProbe={"grpc":{"port":8001}}',
                     "--set-json", 'vllm.startupProbe={"exec":{"command":["true"]}}',
                     "--set-json", 'kvwatch.livenessProbe={"tcpSocket":{"port":"metrics"}}')
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    handlers = {"httpGet", "tcpSocket", "exec", "grpc"}
    pod = containers(objects)
    probes = {name: pod["vllm"][f"{name}Probe"] for name in ("liveness", "readiness", "startup")}
    probes["kvwatch liveness"] = pod["kvwatch"]["livenessProbe"]
    assert {name: sorted(handlers & set(p)) for name, p in probes.items()} == {
        "liveness": ["tcpSocket"], "readiness": ["grpc"], "startup": ["exec"], "kvwatch liveness": ["tcpSocket"]}
    assert probes["liveness"]["failureThreshold"] == 5  # the rest of the default stays
    default = only(render(*MINIMAL), "Deployment")["spec"]["strategy"]
    assert default == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_runtime_class_and_topology_spread_reach_the_pod() -> None:
    # the closed schema refused runtimeClassName, which k3s-style GPU nodes need (no NVIDIA
    # runtime by default: vLLM sees no GPU), and topologySpreadConstraints
    spread = '[{"maxSkew":1,"topologyKey":"topology.kubernetes.io/zone","whenUnsatisfiable":"ScheduleAnyway"}]'
    objects = render(*MINIMAL, "--set", "runtimeClassName=nvidia", "--set-json", f"topologySpreadConstraints={spread}")
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia" and pod["topologySpreadConstraints"][0]["maxSkew"] == 1
    for obj in objects:
        validate_object(obj)
    assert "schema" in render_fails(*MINIMAL, "--set-json", 'topologySpreadConstraints=[{"maxSkw":1}]')
    assert "runtimeClassName" not in only(render(*MINIMAL), "Deployment")["spec"]["template"]["spec"]


def test_no_container_lists_a_variable_twice() -> None:
    # vllm.env naming HF_HOME beside vllm.modelCache rendered HF_HOME twice, which server-side apply (Helm 4's default
    # install) refuses ("duplicate entries for key"); the user's value wins.
    objects = render("--set", "config.model=m", "--set", "vllm.modelCache.enabled=true",
                     "--set", "vllm.hfTokenSecret.name=hf",
                     "--set-json", 'vllm.env=[{"name":"HF_HOME","value":"/cache/hf"},{"name":"HF_TOKEN","value":"t"}]')
    for container in only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]:
        names = [e["name"] for e in container.get("env", [])]
        assert len(names) == len(set(names)), (container["name"], names)
        if container["name"] == "vllm":
            env = {e["name"]: e for e in container["env"]}
            assert env["HF_HOME"]["value"] == "/cache/hf" and env["HF_TOKEN"]["value"] == "t"
    assert "kvwatch.extraEnv sets NODE_IP" in render_fails(
        "--set", "config.model=m", "--set", "config.dcgmUrl=http://$(NODE_IP):9400/metrics",
        "--set-json", 'kvwatch.extraEnv=[{"name":"NODE_IP","value":"10.0.0.1"}]')


def test_a_pod_disruption_budget_keeps_vllm_replicas_up_through_a_drain() -> None:
    # A node drain evicted every vLLM replica at once: the model was offline
    # for as long as a reload takes. Opt-in, mode 1 only, one of its two bounds.
    assert not [o for o in render(*MINIMAL) if o["kind"] == "PodDisruptionBudget"]
    pdb = only(render(*MINIMAL, "--set", "podDisruptionBudget.enabled=true"), "PodDisruptionBudget")
    validate_object(pdb)
    pods = only(render(*MINIMAL), "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pods.items()
    half = only(render(*MINIMAL, "--set", "podDisruptionBudget.enabled=true", "--set-string",
                       "podDisruptionBudget.minAvailable=50%",
                       "--set", "podDisruptionBudget.unhealthyPodEvictionPolicy=AlwaysAllow"), "PodDisruptionBudget")
    validate_object(half)  # minAvailable wins over the default maxUnavailable (the API server refuses both)
    assert half["spec"]["minAvailable"] == "50%" and "maxUnavailable" not in half["spec"]
    assert half["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    none = only(render(*MINIMAL, "--set", "podDisruptionBudget.enabled=true", "--set",
                       "podDisruptionBudget.maxUnavailable=0"), "PodDisruptionBudget")
    assert none["spec"]["maxUnavailable"] == 0  # a value, not unset (helm's default makes it 1)
    assert "podDisruptionBudget" in render_fails(*MINIMAL, "--set", "podDisruptionBudget.enabled=true",
                                                 "--set-string", "podDisruptionBudget.maxUnavailable=half")
    alone = render("--set", "vllm.enabled=false", "--set", "config.targetUrl=http://vllm:8000/metrics",
                   "--set", "podDisruptionBudget.enabled=true")
    assert not [o for o in alone if o["kind"] == "PodDisruptionBudget"]  # kvwatch alone: no vLLM pods to keep


def test_vllm_drains_in_flight_requests_within_the_grace_period() -> None:
    # vLLM's --shutdown-timeout defaults to 0, which aborts in-flight requests on SIGTERM: every
    # rolling update cut generations off. The chart passes one, sleeps before SIGTERM so the pod leaves the Service
    # first, and refuses a grace period that would kill vLLM mid-drain.
    vllm = containers(render(*MINIMAL))["vllm"]
    args = vllm["args"]
    assert args[args.index("--shutdown-timeout") + 1] == "30"
    assert vllm["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "10"]}}}
    assert "must exceed vllm.preStopSleepSeconds + vllm.shutdownTimeoutSeconds (40)" in render_fails(
        *MINIMAL, "--set", "terminationGracePeriodSeconds=40")
    assert "set vllm.shutdownTimeoutSeconds instead" in render_fails(
        *MINIMAL, "--set-json", 'vllm.extraArgs=["--shutdown-timeout","120"]')
    plain = containers(render(*MINIMAL, "--set", "vllm.shutdownTimeoutSeconds=null",
                              "--set", "vllm.preStopSleepSeconds=0"))["vllm"]
    assert "--shutdown-timeout" not in plain["args"] and "lifecycle" not in plain


def test_a_chunked_prefill_flag_in_extra_args_beside_its_value_is_refused() -> None:
    both = ("--set", "vllm.enableChunkedPrefill=true", "--set-json", 'vllm.extraArgs=["--no-enable-chunked-prefill"]')
    assert "set vllm.enableChunkedPrefill instead" in render_fails(*MINIMAL, *both)
    alone = containers(render(*MINIMAL, "--set-json", 'vllm.extraArgs=["--no-enable-chunked-prefill"]'))["vllm"]
    assert "--no-enable-chunked-prefill" in alone["args"]


def test_a_target_url_may_name_a_variable_of_extra_env() -> None:
    # Kubernetes expands $(VAR) only to variables defined earlier in the container's list: extraEnv came after the
    # KVWATCH_* ones, so $(VLLM_HOST) reached kvwatch unexpanded and it refused to start.
    objects = render("--set", "vllm.enabled=false", "--set", "config.targetUrl=http://$(VLLM_HOST):8000/metrics",
                     "--set-json", 'kvwatch.extraEnv=[{"name":"VLLM_HOST","value":"vllm-0.vllm.inference.svc"}]')
    names = [e["name"] for e in containers(objects)["kvwatch"]["env"]]
    assert names.index("VLLM_HOST") < names.index("KVWATCH_TARGET_URL")


def test_dashboard_labels_are_held_to_kubernetes_rules(tmp_path: Path) -> None:
    on = ("--set", "dashboards.enabled=true")
    assert "values don't meet the specifications" in render_fails(*MINIMAL, *on, "--set", "dashboards.label=a b")
    assert "values don't meet the specifications" in render_fails(*MINIMAL, *on, "--set", "dashboards.labelValue=x!")
    assert "values don't meet the specifications" in render_fails(*MINIMAL, *on, "--set", "dashboards.labelValue=-1")
    configmap = only(render(*MINIMAL, *on, "--set", "dashboards.labelValue=1"), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    # a number from a values file is a float64 to helm: it rendered "1.2345678e+07", which no
    # Kubernetes label value may hold
    values = tmp_path / "values.yaml"
    values.write_text("dashboards:\n  enabled: true\n  labelValue: 12345678\n")
    configmap = only(render(*MINIMAL, "-f", str(values)), "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "12345678"


@pytest.mark.parametrize(("renames", "waiting_metric"), [
    ("a_total=vllm:num_preemptions_total,b=vllm:cache_config_info", None),  # docs/deploy.md's example, right
    ("a=vllm:num_preemptions_total", None),  # a family for a sample: the docs' old example
    ("p_total=vllm:num_preemption_total", None),  # a typo: kvwatch reads no such metric
    ("x=x", None),
    ("a_total=vllm:num_preemptions_total,a_total=vllm:prompt_tokens_total", None),
    ("proxy_hist_bucket=vllm:e2e_request_latency_seconds_bucket", None),
    ("sglang_q=sglang:num_queue_reqs", None),
    ("q=proxy_queue", "proxy_queue_count"),  # an override's family is read too
    ("q=proxy_queue_x", "proxy_queue_count"),
])
def test_the_chart_refuses_a_rename_exactly_when_kvwatch_would(renames: str, waiting_metric: str | None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # The chart rendered any NAME=NAME pair: a pair kvwatch refuses exited 2 at every start, and the crash-looping
    # sidecar kept the vLLM pod out of its Service.
    from kvwatch.settings import SettingsError

    args = [*MINIMAL, "--set-string", f"config.renameMetrics={renames.replace(',', chr(92) + ',')}"]
    if waiting_metric:
        args += ["--set", f"config.waitingMetric={waiting_metric}"]
    result = run_helm("template", "kvw", str(CHART), *args)
    monkeypatch.setenv("KVWATCH_RENAME_METRICS", renames)
    if waiting_metric:
        monkeypatch.setenv("KVWATCH_WAITING_METRIC", waiting_metric)
    try:
        load_settings(ServeSettings)
        accepted = True
    except SettingsError:
        accepted = False
    assert (result.returncode == 0) == accepted, result.stderr
    if not accepted:
        assert "config.renameMetrics" in result.stderr
