"""PromQL of the rule pack and the dashboard, and the metric names it reads.

Shared by the metric lint, the dashboard test and the end-to-end test. The name extraction is a small
tokenizer, not a full PromQL parser: ``promtool`` checks the syntax (see :func:`promtool_parse_errors`),
this only needs to find which series names a valid expression selects.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = ROOT / "alerts" / "kvwatch-rules.yaml"
DASHBOARD_FILE = ROOT / "dashboards" / "kvwatch.json"

# Values Grafana substitutes before the query reaches Prometheus (multi-value variables become a regex).
GRAFANA_VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")

_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
             "bool", "inf", "nan", "atan2"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.DOTALL)
_QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class Query:
    where: str  # e.g. "rule KVCacheBottleneck" or "panel 'KV cache usage' A"
    expr: str  # PromQL as Prometheus receives it (Grafana variables substituted)


def substitute_grafana_variables(expr: str) -> str:
    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        return GRAFANA_VARIABLES.get(name, ".*")

    return _VARIABLE.sub(repl, expr)


def metric_names(expr: str) -> set[str]:
    """Series names an expression selects (``foo`` and ``foo{...}``; not functions, labels or keywords)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    # {__name__="foo"} selects by name inside the braces.
    names.update(re.findall(r'__name__\s*=\s*"([^"]+)"', expr))
    return names


def rule_queries(path: Path = RULES_FILE) -> list[Query]:
    found = []
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            found.append(Query(f"rule {name}", rule["expr"]))
    return found


_TEMPLATE_QUERY = re.compile(r"printf\s+`([^`]*)`")


def annotation_queries(path: Path = RULES_FILE) -> list[Query]:
    """PromQL that alert annotations run through the template function ``query`` (``printf `...` ... | query``),
    with each ``%s`` filled in."""
    found = []
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            for key, text in rule.get("annotations", {}).items():
                for query in _TEMPLATE_QUERY.findall(text):
                    found.append(Query(f"annotation {key} of {rule['alert']}", query.replace("%s", "x")))
    return found


def recorded_names(path: Path = RULES_FILE) -> set[str]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def _panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_queries(path: Path = DASHBOARD_FILE) -> list[Query]:
    dashboard = json.loads(path.read_text())
    found = []
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            where = f"panel {panel['title']!r} {target['refId']}"
            found.append(Query(where, substitute_grafana_variables(target["expr"])))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = _LABEL_VALUES.match(query) or _QUERY_RESULT.match(query)
        if match:  # label_values(selector, label) and query_result(expr): the selector or expr is PromQL
            found.append(Query(f"variable {variable['name']}", substitute_grafana_variables(match.group(1))))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            found.append(Query(f"annotation {annotation['name']!r}", substitute_grafana_variables(annotation["expr"])))
    return found


def promtool_parse_errors(queries: list[Query], promtool: str, workdir: Path) -> str:
    """Have ``promtool check rules`` parse every query (as recording rules); return its output on failure."""
    rules = {"groups": [{"name": "lint", "rules": [
        {"record": f"lint:query_{i}:parse", "expr": q.expr} for i, q in enumerate(queries)
    ]}]}
    path = workdir / "queries-as-rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    result = subprocess.run([promtool, "check", "rules", "--lint=none", str(path)],
                            capture_output=True, text=True, timeout=60)
    if result.returncode == 0:
        return ""
    index = {f"lint:query_{i}:parse": q.where for i, q in enumerate(queries)}
    out = result.stdout + result.stderr
    for record, where in index.items():
        out = out.replace(record, where)
    return out
