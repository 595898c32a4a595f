"""A fast parser for the Prometheus text exposition format, as served by vLLM.

Handles what vLLM's ``prometheus_client`` emits, in both single- and multi-process mode: ``# HELP`` /
``# TYPE`` lines, escaped label values, ``NaN``/``+Inf``/``-Inf``, optional sample timestamps (dropped),
samples in any order (multiprocess mode puts ``_sum`` before ``_bucket``), duplicate series, and the
OpenMetrics text variant (``# EOF`` ends the text, ``# UNIT``, counters declared without ``_total``,
exemplars after `` # `` are ignored; OpenMetrics always ends in ``# EOF``, which is how it is told apart).
``*_created`` samples and families are dropped: kvwatch never needs them. Values follow Prometheus, not
Python: ``1_000`` is an error.

Why it is fast: it scans lines with ``str`` methods, resolves each distinct sample name to its family
once (a dict cache), and skips samples of unwanted families before looking at their labels.

:func:`parse` never raises anything but :class:`ParseError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


class ParseError(ValueError):
    """The text is not a Prometheus exposition (message names the line)."""


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


@dataclass(frozen=True)
class Exposition:
    """Families by name. Counters are keyed by their ``_total`` wire name (also for OpenMetrics input)."""

    families: Mapping[str, Family]
    # Every family name seen, including the ones skipped by ``wanted``.
    names: frozenset[str] = frozenset()

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def get(self, name: str) -> Family | None:
        return self.families.get(name)

    def samples(self, name: str) -> list[Sample]:
        family = self.families.get(name)
        return family.samples if family is not None else []

    def __iter__(self) -> Iterator[Family]:
        return iter(self.families.values())


_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_SUFFIXES = ("_bucket", "_sum", "_count", "_gsum", "_gcount", "_info")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_SKIP = object()  # name cache marker: family not wanted


def parse(text: str, wanted: Callable[[str], bool] | None = None) -> Exposition:
    """Parse exposition ``text``; ``wanted(family_name)`` (called once per family) drops families early."""
    try:
        return _parse(text, wanted)
    except ParseError:
        raise
    except Exception as exc:  # a bug or a hostile input must never escape as anything else
        raise ParseError(f"cannot parse exposition: {type(exc).__name__}: {exc}") from exc


def _parse(text: str, wanted: Callable[[str], bool] | None) -> Exposition:
    if not isinstance(text, str):
        raise ParseError("exposition must be text")
    if "\x00" in text:
        raise ParseError("exposition contains NUL bytes (binary data, not text)")
    lines = text.split("\n")
    families: dict[str, Family] = {}
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    openmetrics = False
    # Pass 1: metadata, so that a sample seen before its TYPE line still finds its family.
    for line in lines:
        if line[:1] == "#":
            if line[:5] == "# EOF" and not line[5:].strip():
                del lines[lines.index(line):]  # OpenMetrics ends here; nothing after it is part of the text
                openmetrics = True
                break
            _metadata(line, types, helps)
    if openmetrics:
        # Exemplars are OpenMetrics only, and OpenMetrics always ends in # EOF: Prometheus text (vLLM's) skips this.
        lines = [_without_exemplar(line) if " # " in line and line[:1] != "#" else line for line in lines]
    names: set[str] = set(types) | set(helps)
    names = {n for n in names if not n.endswith("_created")}
    resolved: dict[str, object] = {}  # sample name -> its family's samples.append, or _SKIP
    label_keys: dict[str, str] = {}  # raw fragment before a value ('name=' or ',name=') -> label name
    label_key = label_keys.__getitem__
    new_sample = tuple.__new__
    for lineno, line in enumerate(lines, 1):
        if not line or line[0] == "#":
            continue
        # Fast path: the name ends at '{' or the first space; a cached name needs no validation.
        brace = line.find("{")
        name = line[:brace] if brace != -1 else line.partition(" ")[0]
        target = resolved.get(name)
        if target is _SKIP:
            continue
        if target is None:
            line = line.strip()
            if not line or line[0] == "#":
                continue
            brace = line.find("{")
            name = line[:brace].rstrip() if brace != -1 else line.split(None, 1)[0]
            target = resolved.get(name)
            if target is None:
                family = _resolve(name, types, helps, families, wanted, names, lineno, line)
                target = family if family is _SKIP else family.samples.append  # type: ignore[attr-defined]
                resolved[name] = target
            if target is _SKIP:
                continue
        if brace == -1:
            parts = line.split()[1:]
            labels: dict[str, str] = {}
        else:
            close = line.rfind("}")
            if close < brace:
                raise ParseError(f"line {lineno}: unterminated label set: {_clip(line)}")
            parts = line[close + 1 :].split()
            label_text = line[brace + 1 : close]
            pieces = label_text.split('"')
            # Inline fast path (no escapes, known label names); anything else goes through _labels.
            try:
                if "\\" in label_text or not len(pieces) & 1 or pieces[-1] not in ("", ","):
                    raise KeyError
                labels = dict(zip(map(label_key, pieces[0:-1:2]), pieces[1::2], strict=True))
            except KeyError:
                labels = _labels(label_text, lineno, line, label_keys)
        if not parts or len(parts) > 2:
            raise ParseError(f"line {lineno}: expected a value (and optional timestamp): {_clip(line)}")
        try:
            value = float(parts[0])
            if "_" in parts[0]:  # Python reads 1_000; Prometheus does not
                raise ValueError
        except ValueError:
            raise ParseError(f"line {lineno}: bad value {parts[0][:40]!r}: {_clip(line)}") from None
        target(new_sample(Sample, (name, labels, value)))  # type: ignore[operator]
    return Exposition(families=families, names=frozenset(names))


def _without_exemplar(line: str) -> str:
    """A sample line without its OpenMetrics exemplar (`` # {trace_id="..."} 0.5``), which kvwatch ignores.

    The exemplar starts at the first `` # `` outside a quoted label value."""
    quoted = False
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch == "#" and line[i - 1 : i + 2] == " # ":
            return line[: i - 1]
        i += 1
    return line


def _metadata(line: str, types: dict[str, str], helps: dict[str, str]) -> None:
    parts = line.split(None, 3)
    if len(parts) < 3 or parts[0] != "#":
        return
    kind, name = parts[1], parts[2]
    if kind == "TYPE":
        mtype = parts[3].strip().lower() if len(parts) > 3 else "untyped"
        if mtype == "counter" and not name.endswith("_total"):
            name += "_total"  # OpenMetrics declares counters without the suffix their samples carry
        types[name] = mtype
    elif kind == "HELP":
        helps[name] = _unescape_help(parts[3]) if len(parts) > 3 else ""


def _resolve(name: str, types: dict[str, str], helps: dict[str, str], families: dict[str, Family],
             wanted: Callable[[str], bool] | None, names: set[str], lineno: int, line: str) -> object:
    """Which family a sample name belongs to (once per distinct name), or _SKIP."""
    if not _NAME.match(name):
        raise ParseError(f"line {lineno}: not a metric sample: {_clip(line)}")
    if name.endswith("_created"):
        return _SKIP
    family_name = name
    if name not in types:
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in types:
                family_name = name[: -len(suffix)]
                break
    names.add(family_name)
    if wanted is not None and not wanted(family_name):
        return _SKIP
    family = families.get(family_name)
    if family is None:
        help_text = helps.get(family_name)
        if help_text is None and family_name.endswith("_total"):
            help_text = helps.get(family_name[:-6])  # OpenMetrics HELP without the suffix
        family = Family(family_name, types.get(family_name, "untyped"), help_text or "")
        families[family_name] = family
    return family


def _labels(text: str, lineno: int, line: str, label_keys: dict[str, str]) -> dict[str, str]:
    if "\\" in text:
        return _labels_escaped(text, lineno, line)
    # No escapes: every '"' delimits a value, so split on it: [key=, value, ,key=, value, tail].
    parts = text.split('"')
    if not len(parts) & 1:
        raise ParseError(f"line {lineno}: unbalanced quotes in labels: {_clip(line)}")
    tail = parts[-1]
    if tail and tail != "," and tail.strip() not in ("", ","):
        raise ParseError(f"line {lineno}: bad label set: {_clip(line)}")
    fragments = parts[0:-1:2]
    try:  # fragments repeat on every line, so each is validated once and then looked up
        return dict(zip(map(label_keys.__getitem__, fragments), parts[1::2], strict=True))
    except KeyError:
        for fragment in fragments:
            if fragment not in label_keys:
                label_keys[fragment] = _label_key(fragment, lineno, line)
        return dict(zip(map(label_keys.__getitem__, fragments), parts[1::2], strict=True))


def _label_key(fragment: str, lineno: int, line: str) -> str:
    key = fragment.strip().lstrip(",").strip()
    if key[-1:] != "=":
        raise ParseError(f"line {lineno}: bad label set: {_clip(line)}")
    key = key[:-1].rstrip()
    if not _LABEL_NAME.match(key):
        raise ParseError(f"line {lineno}: bad label name {key[:40]!r}: {_clip(line)}")
    return key


def _labels_escaped(text: str, lineno: int, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t,":
            i += 1
        if i >= n:
            return labels
        eq = text.find("=", i)
        if eq == -1:
            raise ParseError(f"line {lineno}: bad label set: {_clip(line)}")
        key = text[i:eq].strip()
        if not _LABEL_NAME.match(key):
            raise ParseError(f"line {lineno}: bad label name {key[:40]!r}: {_clip(line)}")
        i = eq + 1
        while i < n and text[i] in " \t":
            i += 1
        if i >= n or text[i] != '"':
            raise ParseError(f"line {lineno}: label value must be quoted: {_clip(line)}")
        i += 1
        out: list[str] = []
        while True:
            if i >= n:
                raise ParseError(f"line {lineno}: unterminated label value: {_clip(line)}")
            ch = text[i]
            if ch == "\\" and i + 1 < n:
                out.append(_ESCAPES.get(text[i + 1], "\\" + text[i + 1]))
                i += 2
            elif ch == '"':
                i += 1
                break
            else:
                out.append(ch)
                i += 1
        labels[key] = "".join(out)
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] != ",":
            raise ParseError(f"line {lineno}: expected ',' between labels: {_clip(line)}")


def _unescape_help(text: str) -> str:
    if "\\" not in text:
        return text
    return text.replace("\\\\", "\x00").replace("\\n", "\n").replace("\x00", "\\")


def _clip(line: str) -> str:
    return repr(line[:80] + ("…" if len(line) > 80 else ""))
