"""The chart's dcgm-exporter wiring: config.dcgmUrl with $(NODE_IP) from the downward API's status.hostIP,
the sidecar's own pod and namespace as the GPU match key, and mode 2 refused without one."""

from __future__ import annotations

import pytest

from helm_helpers import MINIMAL, containers, render, render_fails, validate_object
from kvwatch.settings import ServeSettings, load_settings

DCGM = ("--set", "config.dcgmUrl=http://$(NODE_IP):9400/metrics")


def field_ref(entry: dict) -> str | None:
    return entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")


def test_sidecar_reads_the_nodes_exporter_for_its_own_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(*MINIMAL, *DCGM)
    for obj in objects:
        validate_object(obj)
    env = containers(objects)["kvwatch"]["env"]
    names = [e["name"] for e in env]
    # Kubernetes expands $(NODE_IP) only from variables defined earlier in the same list.
    assert names.index("NODE_IP") < names.index("KVWATCH_DCGM_URL")
    refs = {e["name"]: field_ref(e) for e in env if "valueFrom" in e}
    assert refs == {"NODE_IP": "status.hostIP", "KVWATCH_GPU_POD": "metadata.name",
                    "KVWATCH_GPU_NAMESPACE": "metadata.namespace"}
    # What the kubelet hands kvwatch (fieldRefs resolved, $(NODE_IP) expanded) is a valid configuration.
    resolved = {"NODE_IP": "10.0.0.5", "KVWATCH_GPU_POD": "kvw-kvwatch-abc", "KVWATCH_GPU_NAMESPACE": "llm"}
    for e in env:
        if e["name"].startswith("KVWATCH_"):
            monkeypatch.setenv(e["name"], resolved.get(e["name"]) or e["value"].replace("$(NODE_IP)", "10.0.0.5"))
    settings = load_settings(ServeSettings)
    assert settings.dcgm_url == "http://10.0.0.5:9400/metrics"
    assert (settings.gpu_pod, settings.gpu_namespace) == ("kvw-kvwatch-abc", "llm")


def test_given_match_keys_are_not_overridden() -> None:
    env = containers(render(*MINIMAL, *DCGM, "--set", "config.gpuUuids=GPU-aaaa"))["kvwatch"]["env"]
    assert {e["name"] for e in env if "valueFrom" in e} == {"NODE_IP"}
    assert {"name": "KVWATCH_GPU_UUIDS", "value": "GPU-aaaa"} in env


def test_without_dcgm_the_env_is_unchanged() -> None:
    env = containers(render(*MINIMAL))["kvwatch"]["env"]
    assert not any("valueFrom" in e for e in env)


def test_mode_2_needs_the_watched_pod() -> None:
    standalone = ("--set", "vllm.enabled=false", "--set", "config.targetUrl=http://10.0.0.9:8000/metrics")
    assert "config.gpuPod" in render_fails(*standalone, "--set", "config.dcgmUrl=http://10.0.0.5:9400/metrics")
    env = containers(render(*standalone, "--set", "config.dcgmUrl=http://10.0.0.5:9400/metrics",
                            "--set", "config.gpuPod=vllm-0", "--set", "config.gpuNamespace=llm"))["kvwatch"]["env"]
    assert {"name": "KVWATCH_GPU_POD", "value": "vllm-0"} in env
    assert not any(field_ref(e) == "metadata.name" for e in env)
