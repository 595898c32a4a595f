"""What a ``/metrics`` body means: the scrape-error vocabulary and ``interpret(body) -> Poll`` (pure).

Every failed poll, whether the fetch or the reading of the body failed, is a :class:`ScrapeError` whose
``reason`` is one of :data:`REASONS` (exported as ``kvwatch_scrape_errors_total{reason}``). This module
does no I/O: :mod:`kvwatch.fetch` gets the body, this reads it.
"""

from __future__ import annotations

import logging

from kvwatch.engines import SourceOverrides, UnrecognisedPayload
from kvwatch.engines.detect import read_payload
from kvwatch.exposition import ParseError
from kvwatch.model import Poll
from kvwatch.plausible import check_poll

log = logging.getLogger(__name__)

# ``internal``: kvwatch's own code failed on this poll (a bug meeting this input): counted, and the target reported
# down, never a poll that silently leaves the last good state in place.
REASONS: tuple[str, ...] = ("connect", "timeout", "http_status", "too_large", "parse", "unrecognised", "internal")


class ScrapeError(Exception):
    """One failed poll; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason = reason


# A proxy compressed the body without saying so (Content-Encoding).
UNDECLARED_GZIP = ("the body is gzip-compressed but the response did not say so (no Content-Encoding: gzip "
                   "header): fix the proxy in front of the engine")


def interpret(text: str, overrides: SourceOverrides | None, *, timestamp: float,
              max_series: int | None = None, latency: bool = True) -> Poll:
    """Parse a body and read it with the adapter of the engine that wrote it (vLLM, SGLang, TensorRT-LLM,
    picked by :mod:`kvwatch.engines.detect`), at most ``max_series`` series, impossible values dropped to
    unknown (:mod:`kvwatch.plausible`); ScrapeError ``parse`` or ``unrecognised`` when that fails.
    ``latency=False`` leaves the latency histograms unread (see :data:`kvwatch.latency.EDGE_SECONDS`)."""
    if text.startswith("\x1f\x8b"):  # gzip's magic bytes decoded as text (latin-1; UTF-8 stops at them)
        raise ScrapeError("parse", UNDECLARED_GZIP)
    try:
        return check_poll(read_payload(text, overrides, timestamp=timestamp, max_series=max_series,
                                       latency=latency))
    except ParseError as exc:
        raise ScrapeError("parse", str(exc)) from None
    except UnrecognisedPayload as exc:
        raise ScrapeError("unrecognised", str(exc)) from None
    except Exception as exc:  # an adapter bug must cost one poll, not the sidecar
        log.exception("engine adapter failed on this payload")
        raise ScrapeError("unrecognised", f"adapter error: {type(exc).__name__}: {exc}") from None
