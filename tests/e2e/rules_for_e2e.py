"""Build the end-to-end copy of the rule pack: the single source with every ``for:`` (and ``keep_firing_for:``)
shortened.

Prometheus evaluates rules in real time, so a 5-minute ``for`` would make the end-to-end test last
minutes per alert. The copy divides each ``for`` and ``keep_firing_for`` by a factor (the simulator's clock
speed) and changes nothing else; :func:`differences_besides_for` proves that, and the tests call it on every copy.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

_FOR_LINE = re.compile(r"^(?P<indent>\s+)(?P<key>for|keep_firing_for):\s*(?P<duration>\S+)\s*$")
_DURATION_KEYS = ("for", "keep_firing_for")
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as ``5m``, ``1h30m`` or ``90s``."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


def shorten_for(rules_text: str, divisor: float) -> str:
    """Return ``rules_text`` with each ``for:`` and ``keep_firing_for:`` divided by ``divisor`` (at least 1 s), all
    else verbatim."""
    if divisor <= 0:
        raise ValueError("divisor must be positive")
    out = []
    for line in rules_text.splitlines(keepends=True):
        match = _FOR_LINE.match(line.rstrip("\n"))
        if match:
            seconds = max(1, math.ceil(parse_duration(match["duration"]) / divisor))
            line = f"{match['indent']}{match['key']}: {seconds}s\n"
        out.append(line)
    return "".join(out)


def _without_for(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _without_for(v) for k, v in doc.items() if k not in _DURATION_KEYS}
    if isinstance(doc, list):
        return [_without_for(v) for v in doc]
    return doc


def for_durations(rules_text: str) -> dict[str, list[float]]:
    """Alert name -> its ``for`` durations in seconds, in file order."""
    found: dict[str, list[float]] = {}
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                found.setdefault(rule["alert"], []).append(parse_duration(rule.get("for", "0s")))
    return found


def differences_besides_for(source_text: str, copy_text: str) -> list[str]:
    """Human-readable differences between two rule files once ``for:`` and ``keep_firing_for:`` are ignored
    (empty: identical)."""
    source, copy = _without_for(yaml.safe_load(source_text)), _without_for(yaml.safe_load(copy_text))
    if source == copy:
        return []
    problems = []
    src_groups, copy_groups = source.get("groups", []), copy.get("groups", [])
    if len(src_groups) != len(copy_groups):
        problems.append(f"{len(src_groups)} groups in the source, {len(copy_groups)} in the copy")
    for src_group, copy_group in zip(src_groups, copy_groups, strict=False):
        for src_rule, copy_rule in zip(src_group.get("rules", []), copy_group.get("rules", []), strict=False):
            if src_rule != copy_rule:
                problems.append(f"rule {src_rule.get('alert') or src_rule.get('record')} differs")
        settings = [{k: v for k, v in group.items() if k != "rules"} for group in (src_group, copy_group)]
        if settings[0] != settings[1]:
            problems.append(f"group {src_group.get('name')} settings differ")
        if len(src_group.get("rules", [])) != len(copy_group.get("rules", [])):
            problems.append(f"group {src_group.get('name')} has a different number of rules")
    return problems or ["the files differ outside their groups"]
