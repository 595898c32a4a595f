"""Which engine wrote a payload, and its reading: vLLM, SGLang or TensorRT-LLM, picked from the payload itself.

First match wins: any ``vllm:*`` family → vLLM; SGLang's scheduler gauges → SGLang; ``trtllm_*``,
``trtllm:*`` or Triton's ``nv_trt_llm_*`` families → TensorRT-LLM; a JSON body → TensorRT-LLM iteration
statistics. A payload with none of them but an operator's ``--usage-metric`` (a proxy's renamed metric)
is read by the vLLM adapter, which knows overrides best. Raises ParseError (not an exposition) or
UnrecognisedPayload (no engine kvwatch knows).
"""

from __future__ import annotations

import json
from dataclasses import replace

from kvwatch.engines import SourceOverrides, UnrecognisedPayload, sglang, trtllm, vllm
from kvwatch.exposition import Exposition, ParseError, parse
from kvwatch.model import Poll

ENGINE_KINDS = ("vllm", "sglang", "tensorrt-llm")


LATENCY_FAMILIES: frozenset[str] = frozenset(
    {f for families in (*vllm.LATENCY.values(), *sglang.LATENCY.values()) for f in families}
    | {p + f for p in trtllm.PREFIXES for f in trtllm.LATENCY.values()})
"""Every adapter's latency histogram families (what a poll with ``latency=False`` leaves unread)."""


def wanted_for(overrides: SourceOverrides | None = None, *, latency: bool = True) -> frozenset[str]:
    """The parser's filter: every adapter's families and the overrides'. A set of names, not a predicate, so
    that the parser can skip whole blocks of the families no adapter reads (:mod:`kvwatch.exposition`).
    Without ``latency`` the latency histograms are left out (an override naming one keeps it)."""
    names = vllm.wanted_for(overrides) | sglang.FAMILIES | trtllm.FAMILIES
    if latency:
        return names
    return names - (LATENCY_FAMILIES - vllm.wanted_for(overrides, adapter=False))


def engine_of(exposition: Exposition) -> str | None:
    """``vllm``, ``sglang``, ``tensorrt-llm`` or None."""
    if any(name.startswith("vllm:") for name in exposition.names):
        return "vllm"
    if sglang.claims(exposition):
        return "sglang"
    if trtllm.claims(exposition):
        return "tensorrt-llm"
    return None


def read_payload(text: str, overrides: SourceOverrides | None = None, *, timestamp: float,
                 max_series: int | None = None, latency: bool = True) -> Poll:
    """One :class:`Poll` from a ``/metrics`` body of any supported engine, with at most ``max_series``
    readings (the rest counted in ``Poll.series_dropped``; vLLM's adapter skips them before building any).
    With ``latency=False`` the latency histograms are not read (the readings' ``latency`` is empty; a JSON
    body always carries its own)."""
    if trtllm.looks_like_json(text):
        try:
            return _capped(trtllm.read_iteration_stats(text, timestamp=timestamp), max_series)
        except json.JSONDecodeError as exc:
            raise ParseError(f"body starts like JSON but is not: {exc}") from None
    exposition = parse(text, wanted_for(overrides, latency=latency))
    kind = engine_of(exposition)
    if kind == "sglang":
        return _capped(sglang.read(exposition, overrides, timestamp=timestamp), max_series)
    if kind == "tensorrt-llm":
        return _capped(trtllm.read(exposition, overrides, timestamp=timestamp), max_series)
    if kind is None and not (overrides and overrides.names()):
        raise UnrecognisedPayload("no vllm:*, sglang:*, trtllm_*/trtllm:* or nv_trt_llm_* metrics in the payload "
                                  "(is the target an inference engine's /metrics endpoint?)")
    return vllm.read(exposition, overrides, timestamp=timestamp, max_series=max_series)


def _capped(poll: Poll, max_series: int | None) -> Poll:
    if max_series is None or len(poll.readings) <= max_series:
        return poll
    return replace(poll, readings=poll.readings[:max_series],
                   series_dropped=poll.series_dropped + len(poll.readings) - max_series)
