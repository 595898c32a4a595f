#!/usr/bin/env python3
"""Keep the Helm chart in step with its single sources.

1. Regenerates the rule pack and the chart's copy of it (`alerts/generate.py`, from `alerts/config.yaml` and
   `alerts/rules.in.yaml`) and copies `dashboards/kvwatch.json` into `deploy/helm/kvwatch/files/` (Helm can
   only read files inside the chart).
2. Regenerates the `config` block of `deploy/helm/kvwatch/values.schema.json` from kvwatch's settings
   (`kvwatch.settings.ServeSettings`: one camelCase key per setting, its type, bounds and description).
   A new setting still needs its commented line under `config:` in values.yaml (a test checks that).
3. Writes `deploy/helm/kvwatch/templates/_gpus.tpl`: the GPU preset names kvwatch knows, in the form it compares
   them (`kvwatch.capacity.presets.gpu_keys`), so the chart refuses a `config.gpu` kvwatch would refuse at start.
   Named templates, not a file under files/: a parent chart that embeds the sidecar with a plain dict as context
   has no `.Files`. Writes `templates/_bounds.tpl` the same way: the bounds of the settings a `helm --set` passes
   as decimal strings, which the schema's minimum and maximum do not check; and `templates/_renames.tpl`: the
   engine names a `config.renameMetrics` pair may name (`kvwatch.engines.detect.rename_targets`), so the chart
   refuses a pair kvwatch would refuse at start (a crash-looping sidecar keeps the vLLM pod out of its Service).
4. Regenerates the schema's `definitions` (the Kubernetes objects values pass through verbatim: Probe,
   ResourceRequirements, SecurityContext, PodSecurityContext, DeploymentStrategy, EnvVar, VolumeMount, Volume,
   Toleration, Affinity) from the strict Kubernetes
   JSON schemas shipped in the kubernetes-validate package (a dev dependency), closed against unknown fields,
   so `kvwatch.resources.limit.memory` fails the install instead of rendering a container without limits.

Usage (from the repository's venv):  .venv/bin/python scripts/sync_chart_files.py [--check]
--check changes nothing and exits 1 if anything is out of date; tests/test_helm_schema.py runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "kvwatch"
SCHEMA = CHART / "values.schema.json"
COPIES = {
    ROOT / "dashboards" / "kvwatch.json": CHART / "files" / "kvwatch.json",
}
# Values the settings validators accept, written out for the chart's schema (the settings lower-case them;
# log levels are upper-cased). A test checks that kvwatch accepts every one.
ENUMS: dict[str, list[str]] = {
    "dtype": ["auto", "bfloat16", "float16", "float32", "bf16", "fp16", "fp32", "half", "float"],
    "log_level": ["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"],
}
# Where the chart is stricter than kvwatch: its Service and probes need a fixed port (kvwatch's 0 picks one).
CHART_BOUNDS: dict[str, dict[str, Any]] = {"port": {
    "minimum": 1, "description": "Port kvwatch serves /metrics and /healthz on (a fixed one: the chart's Service and "
                                 "probes name it; null is 9747)."}}
# An http(s) URL whose port, if any, is 1-65535 (kvwatch checks the rest at start; $(VAR) hosts are Kubernetes' to
# expand): a port of 80000 or 0 rendered, and the sidecar exited at start.
PORT = "0*(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
# (a $(VAR) port is Kubernetes' to expand, as a $(VAR) host is: docs/deploy.md)
URL_PATTERN = f"^https?://([^/\\s]*@)?(\\[[^\\]/\\s]*\\]|[^/\\s:@\\[]+)(:({PORT}|\\$\\([A-Za-z_][A-Za-z0-9_]*\\)))?([/?#]|$)"
# An address to listen on without a port (config.port is the port): an IPv6 address (two colons or more), an IPv4
# address, a host name, or "" (unset, as everywhere in the chart). "0.0.0.0:9747" rendered, and the sidecar exited.
# (kvwatch.settings.check_listen_address without its length lookahead, which Go's RE2 lacks; an IPv6 zone: %eth0)
LISTEN_ADDRESS = "^(([0-9A-Fa-f.]*:){2,}[0-9A-Fa-f.]*(%[A-Za-z0-9._-]+)?|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|)$"
# A decimal, as `helm --set` passes it; its bounds are the chart helper's to check (templates/_bounds.tpl), which
# names the key and its range in words (a pattern of the range itself answered "1.5 does not match pattern ...").
DECIMAL = "^[-+]?[0-9]*\\.?[0-9]+([eE][-+]?[0-9]+)?$"
# Kubernetes version of the definitions: the one tests/helm_helpers.py validates rendered objects with.
KUBERNETES_VERSION = "1.35"
KUBERNETES_TYPES = (
    "io.k8s.api.apps.v1.DeploymentStrategy",
    "io.k8s.api.core.v1.Affinity",
    "io.k8s.api.core.v1.EnvVar",
    "io.k8s.api.core.v1.PodSecurityContext",
    "io.k8s.api.core.v1.Probe",
    "io.k8s.api.core.v1.ResourceRequirements",
    "io.k8s.api.core.v1.SecurityContext",
    "io.k8s.api.core.v1.Toleration",
    "io.k8s.api.core.v1.TopologySpreadConstraint",
    "io.k8s.api.core.v1.Volume",
    "io.k8s.api.core.v1.VolumeMount",
)
# Kept from the upstream schemas: what validates. Descriptions (long, and ignored next to a draft-07 $ref),
# formats (int32 is no JSON-schema format) and x-kubernetes-* annotations are dropped.
_KEPT = {"type", "properties", "additionalProperties", "items", "oneOf", "anyOf", "allOf", "enum", "required",
         "minimum", "maximum", "pattern", "$ref"}


def camel(name: str) -> str:
    """`poll_interval_seconds` -> `pollIntervalSeconds` (the chart's spelling of a setting)."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def config_schema() -> dict[str, Any]:
    """JSON schema properties of the chart's `config:` block, one per ServeSettings field (null = unset)."""
    sys.path.insert(0, str(ROOT / "src"))
    from kvwatch.capacity.kv import VLLM_BLOCK_SIZES
    from kvwatch.capacity.quantization import name_pattern
    from kvwatch.engines import RENAMES_PATTERN
    from kvwatch.settings import GPU_UUIDS_PATTERN, KV_CACHE_DTYPES, SELECTOR_PATTERN, ServeSettings, public_name

    patterns = {"target_url": URL_PATTERN, "dcgm_url": URL_PATTERN, "gpu_uuids": GPU_UUIDS_PATTERN,
                "listen_address": LISTEN_ADDRESS,
                "quantization": name_pattern(),
                **dict.fromkeys(("usage_metric", "running_metric", "waiting_metric"), SELECTOR_PATTERN),
                "rename_metrics": RENAMES_PATTERN}

    fields = ServeSettings.json_schema()
    properties: dict[str, Any] = {}
    for field, info in ServeSettings.model_fields.items():
        spec = fields[field]
        branch = next((b for b in spec.get("anyOf", [spec]) if b.get("type") != "null"), spec)
        prop: dict[str, Any] = {"type": [branch["type"], "null"], "description": info.description}
        for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if bound in branch:
                prop[bound] = branch[bound]
        prop.update(CHART_BOUNDS.get(field, {}))
        if field in ENUMS:
            prop["enum"] = [*ENUMS[field], None]
        elif field == "kv_cache_dtype":
            prop["enum"] = [*sorted(KV_CACHE_DTYPES), None]
        elif field == "block_size":  # (kvwatch and vLLM refuse any other at start)
            prop["enum"] = [*VLLM_BLOCK_SIZES, None]
        if field in patterns:
            prop["pattern"] = patterns[field]
        elif branch["type"] == "number":
            # `helm --set config.x=0.9` passes the string "0.9" (Helm types only integers, booleans and null on
            # the command line): accept a decimal string too. The number branch keeps the bounds in the schema,
            # the chart's helper checks a string against them (templates/_bounds.tpl).
            prop["type"] = ["number", "string", "null"]
            prop["pattern"] = DECIMAL
        properties[camel(public_name(field))] = prop
    return properties


def bounds_template(properties: dict[str, Any]) -> bytes:
    """templates/_bounds.tpl: the bounds of the `config` numbers that may come as decimal strings (`helm --set`
    passes 0.001 as "0.001", which the schema's minimum does not see), for the chart's helper to check, so a value
    kvwatch would refuse at start fails the install instead of crash-looping the sidecar."""
    words = {"minimum": "at least", "exclusiveMinimum": "above", "maximum": "at most", "exclusiveMaximum": "below"}
    bounds: dict[str, dict[str, Any]] = {}
    for key, prop in sorted(properties.items()):
        found = {bound: prop[bound] for bound in words if bound in prop}
        if "string" in prop["type"] and found:
            bounds[key] = {**found, "says": " and ".join(f"{words[b]} {v:g}" for b, v in found.items())}
    return (
        "{{/* Generated by scripts/sync_chart_files.py from kvwatch's settings (kvwatch.settings.ServeSettings): do "
        "not edit. */}}\n"
        f'{{{{- define "kvwatch.numberBounds" -}}}}{json.dumps(bounds)}{{{{- end }}}}\n'
    ).encode()


def gpu_templates() -> bytes:
    """templates/_gpus.tpl: the keys `config.gpu` is matched against (normalized as the chart's helper does) and
    the preset names for the error message, as named templates."""
    sys.path.insert(0, str(ROOT / "src"))
    from kvwatch.capacity import presets

    return (
        "{{/* Generated by scripts/sync_chart_files.py from kvwatch's GPU presets (src/kvwatch/data/gpus.json): do "
        "not edit. */}}\n"
        f'{{{{- define "kvwatch.gpuKeys" -}}}}{json.dumps(presets.gpu_keys())}{{{{- end }}}}\n'
        f'{{{{- define "kvwatch.gpuNames" -}}}}{", ".join(presets.gpu_names())}{{{{- end }}}}\n'
    ).encode()


def rename_template() -> bytes:
    """templates/_renames.tpl: the engine names kvwatch reads by default, as ``--rename-metrics`` may name them, the
    sample parts both names of a pair must agree on, and the suffixes a sample of an override's family may carry."""
    sys.path.insert(0, str(ROOT / "src"))
    from kvwatch.engines.detect import _PARTS, rename_targets, wanted_for
    from kvwatch.engines.vllm import SAMPLE_SUFFIXES

    targets = sorted(rename_targets(wanted_for(latency=True, lengths=True)))
    return (
        "{{/* Generated by scripts/sync_chart_files.py from the metrics kvwatch reads "
        "(kvwatch.engines.detect.rename_targets): do not edit. */}}\n"
        f'{{{{- define "kvwatch.renameTargets" -}}}}{json.dumps(targets)}{{{{- end }}}}\n'
        f'{{{{- define "kvwatch.sampleParts" -}}}}{json.dumps(list(_PARTS))}{{{{- end }}}}\n'
        f'{{{{- define "kvwatch.sampleSuffixes" -}}}}{json.dumps(list(SAMPLE_SUFFIXES))}{{{{- end }}}}\n'
    ).encode()


# The prometheus-operator's RelabelConfig, from the ServiceMonitor CRD the tests validate rendered monitors with:
# the monitors' relabelings pass through verbatim, and the API server prunes a snake_case field silently.
OPERATOR_CRD = ROOT / "tests" / "fixtures" / "k8s-schemas" / "monitoring.coreos.com_servicemonitors.yaml"
RELABEL_CONFIG = "com.coreos.monitoring.v1.RelabelConfig"


# A Quantity is a string or a number; the upstream schema stops there, so "16GB" passed and the API server refused it
# ("quantities must match the regular expression", apimachinery's ParseQuantity: B is no suffix). That regular
# expression, and anyOf (a null matched both of upstream's oneOf branches: "'oneOf' failed, subschemas 0, 1 matched").
QUANTITY_NAME = "io.k8s.apimachinery.pkg.api.resource.Quantity"
QUANTITY_PATTERN = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
QUANTITY: dict[str, Any] = {"anyOf": [{"type": "string", "pattern": QUANTITY_PATTERN}, {"type": "number"},
                                      {"type": "null"}]}


def kubernetes_definitions(version: str = KUBERNETES_VERSION) -> dict[str, Any]:
    """The closed JSON schemas of KUBERNETES_TYPES and every type they reference, and the operator's RelabelConfig,
    as draft-07 `definitions`."""
    from importlib.resources import files

    import yaml

    schemas = files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}.0-local-strict"
    source = schemas / "_definitions.json"
    upstream = json.loads(source.read_text())["$defs"]
    crd = yaml.safe_load(OPERATOR_CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    upstream[RELABEL_CONFIG] = crd["properties"]["spec"]["properties"]["endpoints"]["items"]["properties"][
        "relabelings"]["items"]
    found: dict[str, Any] = {}

    def convert(node: Any) -> Any:
        if isinstance(node, list):
            return [convert(v) for v in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref":
                name = value.rsplit("/", 1)[1]
                add(name)
                out[key] = f"#/definitions/{name}"
            elif key in ("properties", "additionalProperties") and isinstance(value, dict):
                out[key] = ({k: convert(v) for k, v in value.items()} if key == "properties" else convert(value))
            elif key in _KEPT:
                out[key] = convert(value)
        if "properties" in out:
            out["additionalProperties"] = False  # the point: a misspelt field fails
        return out

    def add(name: str) -> None:
        if name not in found:
            found[name] = {}  # placeholder: breaks reference cycles
            found[name] = QUANTITY if name == QUANTITY_NAME else convert(upstream[name])

    for name in (*KUBERNETES_TYPES, RELABEL_CONFIG):
        add(name)
    return dict(sorted(found.items()))


def rule_generator() -> Any:
    """alerts/generate.py: it writes the rule pack and the chart's copy; its file writer serves here too."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate_rules", ROOT / "alerts" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is stale")
    args = parser.parse_args(argv)
    generator = rule_generator()
    stale = generator.main(["--check"] if args.check else []) != 0

    for source, target in COPIES.items():
        if not source.is_file():
            print(f"missing source: {source.relative_to(ROOT)}", file=sys.stderr)
            stale = True
        elif not generator.write_or_check(target, source.read_bytes(), check=args.check,
                                          why=f"differs from {source.relative_to(ROOT)}"):
            stale = True

    if not generator.write_or_check(CHART / "templates" / "_gpus.tpl", gpu_templates(), check=args.check,
                                    why="differs from kvwatch's GPU presets (src/kvwatch/data/gpus.json)"):
        stale = True

    if not generator.write_or_check(CHART / "templates" / "_renames.tpl", rename_template(), check=args.check,
                                    why="differs from the metrics kvwatch reads (kvwatch.engines.detect)"):
        stale = True

    wanted = config_schema()
    if not generator.write_or_check(CHART / "templates" / "_bounds.tpl", bounds_template(wanted), check=args.check,
                                    why="differs from kvwatch's settings (kvwatch.settings.ServeSettings)"):
        stale = True

    schema = json.loads(SCHEMA.read_text())
    if schema["properties"]["config"]["properties"] == wanted:
        print(f"up to date: {SCHEMA.relative_to(ROOT)} (config)")
    elif args.check:
        print(f"out of date: {SCHEMA.relative_to(ROOT)}: config differs from the settings", file=sys.stderr)
        stale = True
    else:
        schema["properties"]["config"]["properties"] = wanted
        SCHEMA.write_text(json.dumps(schema, indent=2) + "\n")
        print(f"regenerated: {SCHEMA.relative_to(ROOT)} (config)")

    definitions = kubernetes_definitions()
    if schema.get("definitions") == definitions:
        print(f"up to date: {SCHEMA.relative_to(ROOT)} (Kubernetes definitions)")
    elif args.check:
        print(f"out of date: {SCHEMA.relative_to(ROOT)}: definitions differ from Kubernetes {KUBERNETES_VERSION}'s",
              file=sys.stderr)
        stale = True
    else:
        schema["definitions"] = definitions
        SCHEMA.write_text(json.dumps(schema, indent=2) + "\n")
        print(f"regenerated: {SCHEMA.relative_to(ROOT)} (Kubernetes {KUBERNETES_VERSION} definitions)")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
