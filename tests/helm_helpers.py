"""Shared helpers of the Helm chart tests (test_helm_*.py): run the real `helm`, render and cache objects,
validate them against real schemas.

Every render uses the real `helm` binary; built-in kinds are validated with kubernetes-validate's schemas for a
recent Kubernetes, prometheus-operator kinds against the CRDs' own openAPIV3Schema (tests/fixtures/k8s-schemas).
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kvwatch.settings import ServeSettings, public_name
from repo_scripts import load_script

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
# values.yaml names no kvwatch image either (none is published): run_helm names this one in every render, before the
# test's own flags, so a test may replace it or unset it (`--set kvwatch.image.repository=`).
IMAGE = "registry.example.com/ml/kvwatch"

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


# scripts/sync_chart_files.py: the chart's spelling of a setting, and the schema it generates.
SYNC = load_script("scripts/sync_chart_files.py", "sync_chart_files")
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
    # (this chart, or a copy of it; not a parent chart, whose kvwatch values sit one level down)
    if args and args[0] in ("template", "lint", "install") and any(
            Path(a).name == CHART.name and (Path(a) / "Chart.yaml").is_file() for a in args):
        args = (args[0], "--set", f"kvwatch.image.repository={IMAGE}", *args[1:])
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
