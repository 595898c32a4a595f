"""What a ``/metrics`` body means: the scrape-error vocabulary and ``interpret(body) -> Poll`` (pure).

Every failed poll, whether the fetch or the reading of the body failed, is a :class:`ScrapeError` whose
``reason`` is one of :data:`REASONS` (exported as ``kvwatch_scrape_errors_total{reason}``). This module
does no I/O: :mod:`kvwatch.fetch` gets the body, this reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from kvwatch.engines import SourceOverrides, UnrecognisedPayload
from kvwatch.engines.detect import read_payload
from kvwatch.exposition import ParseError, TooLarge
from kvwatch.model import Poll, Reading
from kvwatch.plausible import check_poll

# ``internal``: kvwatch's own code failed on this poll (a bug meeting this input): counted, and the target reported
# down, never a poll that silently leaves the last good state in place.
REASONS: tuple[str, ...] = ("connect", "timeout", "http_status", "too_large", "parse", "unrecognised", "internal")


# A failure's message quotes what it found (a duplicate series' labels, the labels two copies differ in): a 1 MiB
# label made every warning a 1 MiB log line (5 MB of log in 30 s).
MAX_MESSAGE_CHARS = 1000


def cut(message: str) -> str:
    """``message`` at most :data:`MAX_MESSAGE_CHARS` long, saying so when it was cut."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return f"{message[:MAX_MESSAGE_CHARS]}... ({len(message):,} characters, cut)"


class ScrapeError(Exception):
    """One failed poll; ``reason`` is one of :data:`REASONS`; the message at most :data:`MAX_MESSAGE_CHARS`."""

    def __init__(self, reason: str, message: str, status: int | None = None, *, content: bool = False) -> None:
        assert reason in REASONS, reason
        super().__init__(cut(message))
        self.reason = reason
        self.status = status  # an http_status failure's HTTP status
        # a parse failure of the text itself (not of its transfer: a body cut short, compression)
        self.content = content


# The longest model_name or engine label read (Prometheus' label_value_length_limit refuses a scrape alike): a
# 5 MiB model name, repeated in every kvwatch_* series, made a 110 MB exposition and 522 MB of RSS.
MAX_LABEL_CHARS = 1024

# A proxy compressed the body without saying so (Content-Encoding).
UNDECLARED_GZIP = ("the body is gzip-compressed but the response did not say so (no Content-Encoding: gzip "
                   "header): fix the proxy in front of the engine")
# (a body compressed twice was reported with UNDECLARED_GZIP, sending on-call after a header
# that was there)
GZIP_TWICE = ("the body is still gzip-compressed after its Content-Encoding (gzip twice: a proxy compressed a "
              "compressed body, or a list of codings kvwatch does not read): fix the proxy in front of the engine")


def interpret(text: str, overrides: SourceOverrides | None, *, timestamp: float,
              max_series: int | None = None, latency: bool = True) -> Poll:
    """Parse a body and read it with the adapter of the engine that wrote it (vLLM, SGLang, TensorRT-LLM,
    picked by :mod:`kvwatch.engines.detect`), at most ``max_series`` series, impossible values dropped to
    unknown (:mod:`kvwatch.plausible`); ScrapeError ``parse`` or ``unrecognised`` when that fails.
    ``latency=False`` leaves the latency histograms and the length histograms' buckets unread (see
    :data:`kvwatch.latency.EDGE_SECONDS`; the buckets bound the longest request for the advice)."""
    if text.startswith("\x1f\x8b"):  # gzip's magic bytes decoded as text (latin-1; UTF-8 stops at them)
        raise ScrapeError("parse", UNDECLARED_GZIP)
    try:
        poll = check_poll(read_payload(text, overrides, timestamp=timestamp, max_series=max_series,
                                       latency=latency, lengths=latency))
    except TooLarge as exc:
        raise ScrapeError("too_large", str(exc)) from None
    except ParseError as exc:
        raise ScrapeError("parse", str(exc), content=True) from None
    except UnrecognisedPayload as exc:
        raise ScrapeError("unrecognised", str(exc)) from None
    except Exception as exc:  # an adapter bug must cost one poll, not the sidecar (the cause keeps the traceback)
        raise ScrapeError("internal", f"adapter error: {type(exc).__name__}: {exc}") from exc
    return _bounded(poll)


def _bounded(poll: Poll) -> Poll:
    """The poll with no label value past :data:`MAX_LABEL_CHARS` and no message past :data:`MAX_MESSAGE_CHARS`.
    A series' own name that long fails the poll (kvwatch repeats it in every series it exports). A longer
    cache_config_info or reason label is left out, unknown: a 7 MB cache_dtype new every poll was kept in each
    history entry (+6.7 MB a poll), and a disagreeing pid copy's 2 MB label filled a warning line."""
    readings, dropped = [], []
    for reading in poll.readings:
        for label, value in (("model_name", reading.model_name), ("engine", reading.engine)):
            if len(value) > MAX_LABEL_CHARS:
                raise ScrapeError("too_large", f"a {label} label of {len(value):,} characters (at most "
                                               f"{MAX_LABEL_CHARS:,}): kvwatch repeats it in every series it exports")
        bounded, why = _bounded_labels(reading)
        readings.append(bounded)
        dropped += [((reading.model_name, reading.engine), field_name, reason) for field_name, reason in why]
    undetermined = tuple((key, field_name, cut(why)) for key, field_name, why in (*poll.undetermined, *dropped))
    return replace(poll, readings=tuple(readings), undetermined=undetermined, unread=tuple(map(cut, poll.unread)))


def _bounded_labels(reading: Reading) -> tuple[Reading, list[tuple[str, str]]]:
    """``reading`` without cache_config_info label values or reason label values past :data:`MAX_LABEL_CHARS`,
    and for each left out, its field and why."""
    why: list[tuple[str, str]] = []
    config = {k: v for k, v in reading.cache_config.items() if max(len(k), len(v)) <= MAX_LABEL_CHARS}
    if len(config) < len(reading.cache_config):
        why.append(("cache_config", f"cache_config_info labels of over {MAX_LABEL_CHARS:,} characters left out"))
    by_reason: dict[str, Mapping[str, float]] = {}
    for field_name in ("waiting_by_reason", "finished_by_reason"):
        counts: Mapping[str, float] = getattr(reading, field_name)
        kept = {k: v for k, v in counts.items() if len(k) <= MAX_LABEL_CHARS}
        if len(kept) < len(counts):
            by_reason[field_name] = MappingProxyType(kept)
            why.append((field_name, f"reason labels of over {MAX_LABEL_CHARS:,} characters left out"))
    if not why:
        return reading, why
    return replace(reading, cache_config=MappingProxyType(config), **by_reason), why
