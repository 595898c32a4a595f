"""Fetch one ``/metrics`` body from the target, and turn a body into a :class:`~kvwatch.model.Poll`.

Every failure becomes a :class:`ScrapeError` whose ``reason`` is one of :data:`REASONS` (exported as
``kvwatch_scrape_errors_total{reason}``). The body cap is enforced while streaming the decoded body, so
neither a huge response nor a gzip bomb is ever held in memory; a wall-clock deadline covers the whole
request, not just each socket read.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import httpx

from kvwatch import __version__
from kvwatch.engines import SourceOverrides, UnrecognisedPayload, vllm
from kvwatch.exposition import ParseError, parse
from kvwatch.model import Poll

log = logging.getLogger(__name__)

REASONS: tuple[str, ...] = ("connect", "timeout", "http_status", "too_large", "parse", "unrecognised")
ACCEPT = "text/plain; version=0.0.4; q=1.0, */*; q=0.1"


class ScrapeError(Exception):
    """One failed poll; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason = reason


class Fetcher:
    """A reusable HTTP client for one target (keep-alive between polls)."""

    def __init__(self, url: str, *, timeout: float, max_body_bytes: int, bearer_token_file: Path | None = None,
                 ca_file: Path | None = None, tls_verify: bool = True,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.bearer_token_file = bearer_token_file
        verify: bool | str = str(ca_file) if ca_file is not None and tls_verify else tls_verify
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout),
            verify=verify,
            transport=transport,
            follow_redirects=True,
            headers={"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": f"kvwatch/{__version__}"},
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(self) -> str:
        """The decoded body text, or ScrapeError."""
        headers = {}
        if self.bearer_token_file is not None:
            headers["Authorization"] = f"Bearer {self._token()}"
        deadline = time.monotonic() + self.timeout
        try:
            with self._client.stream("GET", self.url, headers=headers) as response:
                if response.status_code != 200:
                    raise ScrapeError("http_status", f"{self.url} answered HTTP {response.status_code}")
                declared = response.headers.get("Content-Length")
                if declared and declared.isdigit() and int(declared) > self.max_body_bytes and \
                        not response.headers.get("Content-Encoding"):
                    raise ScrapeError("too_large", f"body of {declared} bytes exceeds {self.max_body_bytes}")
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise ScrapeError("too_large", f"body exceeds --max-body-bytes {self.max_body_bytes}")
                    if time.monotonic() > deadline:
                        raise ScrapeError("timeout", f"body not read within {self.timeout:g} s")
                    chunks.append(chunk)
        except httpx.TimeoutException as exc:
            raise ScrapeError("timeout", f"{self.url}: timed out after {self.timeout:g} s ({type(exc).__name__})")\
                from None
        except httpx.DecodingError as exc:
            raise ScrapeError("parse", f"{self.url}: cannot decode body: {exc}") from None
        except (httpx.HTTPError, OSError, ValueError) as exc:  # transport, TLS and URL failures alike
            raise ScrapeError("connect", f"{self.url}: {type(exc).__name__}: {exc}") from None
        charset = response.charset_encoding or "utf-8"
        try:
            return b"".join(chunks).decode(charset, errors="replace")
        except LookupError:
            return b"".join(chunks).decode("utf-8", errors="replace")

    def _token(self) -> str:
        # Re-read each poll: projected service-account tokens rotate.
        assert self.bearer_token_file is not None
        try:
            return self.bearer_token_file.read_text().strip()
        except OSError as exc:
            raise ScrapeError("connect", f"cannot read bearer token file {self.bearer_token_file}: {exc}") from None


def interpret(text: str, overrides: SourceOverrides | None, *, timestamp: float) -> Poll:
    """Parse a body and read it as vLLM; ScrapeError ``parse`` or ``unrecognised`` when that fails."""
    try:
        exposition = parse(text, vllm.wanted_for(overrides))
    except ParseError as exc:
        raise ScrapeError("parse", str(exc)) from None
    try:
        return vllm.read(exposition, overrides, timestamp=timestamp)
    except UnrecognisedPayload as exc:
        raise ScrapeError("unrecognised", str(exc)) from None
    except Exception as exc:  # an adapter bug must cost one poll, not the sidecar
        log.exception("vLLM adapter failed on this payload")
        raise ScrapeError("unrecognised", f"adapter error: {type(exc).__name__}: {exc}") from None
