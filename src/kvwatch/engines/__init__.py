"""Engine adapters: turn a parsed exposition into :class:`kvwatch.model.Poll` readings.

Adapters: :mod:`kvwatch.engines.vllm`, :mod:`kvwatch.engines.sglang`, :mod:`kvwatch.engines.trtllm`, each
with the same ``read(exposition, overrides, *, timestamp) -> Poll`` shape; :mod:`kvwatch.engines.detect`
picks one from the payload.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol


class UnrecognisedPayload(ValueError):
    """The exposition parsed, but it is not from an engine kvwatch understands."""


_SELECTOR = re.compile(r'^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$', re.S)
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


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
            labels[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\\\", "\\")
            pos = m.end()
        return cls(match.group(1), MappingProxyType(labels))

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels.items())

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        inner = ",".join(f'{k}="{v}"' for k, v in self.labels.items())
        return f"{self.name}{{{inner}}}"


class OverrideOptions(Protocol):
    """What :meth:`SourceOverrides.from_settings` reads: kvwatch.settings' ``TargetSettings`` options (the
    settings layer sits above the core, so the core names only the fields)."""

    usage_metric: str | None
    running_metric: str | None
    waiting_metric: str | None


@dataclass(frozen=True)
class SourceOverrides:
    """Operator-chosen source metrics; each wins over the auto-detected name when set."""

    usage: Selector | None = None
    running: Selector | None = None
    waiting: Selector | None = None

    @classmethod
    def from_strings(cls, usage: str | None = None, running: str | None = None,
                     waiting: str | None = None) -> SourceOverrides:
        return cls(*(Selector.parse(v) if v else None for v in (usage, running, waiting)))

    @classmethod
    def from_settings(cls, settings: OverrideOptions) -> SourceOverrides:
        """From kvwatch.settings' ``TargetSettings`` (``check`` and ``serve``)."""
        return cls.from_strings(settings.usage_metric, settings.running_metric, settings.waiting_metric)

    def names(self) -> set[str]:
        return {s.name for s in (self.usage, self.running, self.waiting) if s is not None}
