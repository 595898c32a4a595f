"""Engine adapters: turn a parsed exposition into :class:`kvwatch.model.Poll` readings.

Adapters: :mod:`kvwatch.engines.vllm`, :mod:`kvwatch.engines.sglang`, :mod:`kvwatch.engines.trtllm`, each
with the same ``read(exposition, overrides, *, timestamp) -> Poll`` shape; :mod:`kvwatch.engines.detect`
picks one from the payload.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol


class UnrecognisedPayload(ValueError):
    """The exposition parsed, but it is not from an engine kvwatch understands."""


_SELECTOR = re.compile(r'^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$', re.S)
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
# A label value's escapes, as in the exposition format and PromQL: a "\n" stayed two characters, so no value
# with a new-line could be picked, and the selector echoed in logs and kvwatch_source_info could not be pasted back.
_ESCAPE = re.compile(r"\\(.)", re.S)
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


def _escaped(value: str) -> str:
    """``value`` written back as a selector's label value (what :meth:`Selector.parse` reads as it)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass(frozen=True)
class Selector:
    """A source metric picked by the operator: ``name`` or ``name{label="value",...}``."""

    name: str
    labels: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def parse(cls, text: str) -> Selector:
        match = _SELECTOR.match(text)
        if not match:
            raise ValueError(f'not a metric name or name{{label="value"}}: {text!r}')
        labels: dict[str, str] = {}
        body = match.group(2) or ""
        pos = 0
        while pos < len(body.rstrip()):
            m = _MATCHER.match(body, pos)
            if not m:
                raise ValueError(f"bad label matcher in {text!r}")
            labels[m.group(1)] = _ESCAPE.sub(lambda e: _ESCAPES.get(e.group(1), e.group(0)), m.group(2))
            pos = m.end()
        return cls(match.group(1), MappingProxyType(labels))

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels.items())

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        inner = ",".join(f'{k}="{_escaped(v)}"' for k, v in self.labels.items())
        return f"{self.name}{{{inner}}}"


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
RENAMES_PATTERN = rf"^\s*{_NAME}\s*=\s*{_NAME}\s*(?:,\s*{_NAME}\s*=\s*{_NAME}\s*)*$"
"""``--rename-metrics``: ``PAGE_NAME=ENGINE_NAME[,...]`` (the chart's schema checks the same)."""


def parse_renames(text: str | None) -> MappingProxyType[str, str]:
    """``--rename-metrics``' pairs, the page's name -> the engine's: ``proxy_preemptions_total=
    vllm:num_preemptions_total``. A name on either side twice, or a pair naming one name twice, is refused."""
    if not text or not text.strip():
        return MappingProxyType({})
    if not re.fullmatch(RENAMES_PATTERN, text):
        raise ValueError("must be PAGE_NAME=ENGINE_NAME pairs separated by commas, each a metric name "
                         f"(proxy_preemptions_total=vllm:num_preemptions_total): {text!r}")
    renames: dict[str, str] = {}
    for pair in text.split(","):
        page, engine = (part.strip() for part in pair.split("="))
        if page == engine:
            raise ValueError(f"{page}={engine} renames a metric to itself")
        if page in renames or engine in renames.values():
            raise ValueError(f"{page}={engine}: {page if page in renames else engine} is named twice")
        renames[page] = engine
    if clash := set(renames) & set(renames.values()):
        raise ValueError(f"{min(clash)} is renamed and a rename's target: the pairs are read at once, not in turn")
    return MappingProxyType(renames)


class OverrideOptions(Protocol):
    """What :meth:`SourceOverrides.from_settings` reads: kvwatch.settings' ``TargetSettings`` options (the
    settings layer sits above the core, so the core names only the fields)."""

    usage_metric: str | None
    running_metric: str | None
    waiting_metric: str | None
    rename_metrics: str | None


@dataclass(frozen=True)
class SourceOverrides:
    """Operator-chosen source metrics; each wins over the auto-detected name when set. ``renames`` (the page's name
    -> the engine's) reads any family of the page under the engine's name, the selectors' gauges included (a
    proxy's ``proxy_preemptions_total`` as ``vllm:num_preemptions_total``)."""

    usage: Selector | None = None
    running: Selector | None = None
    waiting: Selector | None = None
    renames: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_strings(cls, usage: str | None = None, running: str | None = None,
                     waiting: str | None = None, renames: str | None = None) -> SourceOverrides:
        return cls(*(Selector.parse(v) if v else None for v in (usage, running, waiting)), parse_renames(renames))

    @classmethod
    def from_settings(cls, settings: OverrideOptions) -> SourceOverrides:
        """From kvwatch.settings' ``TargetSettings`` (``check`` and ``serve``)."""
        return cls.from_strings(settings.usage_metric, settings.running_metric, settings.waiting_metric,
                                settings.rename_metrics)

    def names(self) -> set[str]:
        return {s.name for s in (self.usage, self.running, self.waiting) if s is not None}

    def respelled(self, rename: Callable[[str], str]) -> SourceOverrides:
        """The selectors with their metric names passed through ``rename`` (labels kept)."""
        return replace(self, **{f: Selector(rename(s.name), s.labels) for f in ("usage", "running", "waiting")
                                if (s := getattr(self, f)) is not None})
