"""Fetch one ``/metrics`` body from the target (I/O only: :mod:`kvwatch.payload` reads the body).

Every failure becomes a :class:`~kvwatch.payload.ScrapeError` (``connect``, ``timeout``, ``http_status``,
``too_large``, or ``parse`` for an undecodable body). The body cap is enforced while streaming the decoded body, so
neither a huge response nor a gzip bomb is ever held in memory; a wall-clock deadline covers the whole
request, not just each socket read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
import threading
from pathlib import Path

import httpx

from kvwatch import __version__
from kvwatch.payload import ScrapeError

log = logging.getLogger(__name__)

ACCEPT = "text/plain; version=0.0.4; q=1.0, */*; q=0.1"
_CLOSE_SECONDS = 2.0  # bound on closing the client, and the grace past the deadline before fetch() gives up


class Fetcher:
    """A reusable HTTP client for one target (keep-alive between polls).

    httpx timeouts bound each socket operation, not the request: a target that drips its headers a byte
    at a time never trips them. So each request runs on the fetcher's own event loop (one daemon thread)
    under ``asyncio.wait_for``, which cancels it, connection and all, when ``timeout`` runs out.
    """

    def __init__(self, url: str, *, timeout: float, max_body_bytes: int, bearer_token_file: Path | None = None,
                 ca_file: Path | None = None, tls_verify: bool = True,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.bearer_token_file = bearer_token_file
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            verify=tls_context(ca_file, tls_verify),
            transport=transport,
            follow_redirects=True,
            headers={"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": f"kvwatch/{__version__}"},
        )
        self._closed = False
        self._lock = threading.Lock()  # a request is submitted before close() or not at all
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kvwatch-fetch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Cancel a request in flight, close the client and stop the loop; bounded, safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True

        async def shutdown() -> None:
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            # Let the cancellations finish before the loop stops: a task still unwinding would leave its
            # caller's future pending, and the poll thread (joined at exit) blocked for the whole timeout.
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._client.aclose()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(_CLOSE_SECONDS)
        except Exception as exc:  # closing must never hang or raise: the process is on its way out
            log.debug("closing the HTTP client: %s: %s", type(exc).__name__, exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CLOSE_SECONDS)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(self) -> str:
        """The decoded body text, or ScrapeError; returns or raises within ``timeout`` (plus a grace)."""
        headers = {}
        if self.bearer_token_file is not None:
            headers["Authorization"] = f"Bearer {self._token()}"
        with self._lock:
            if self._closed:
                raise ScrapeError("connect", f"{self.url}: the fetcher is closed (kvwatch is shutting down)")
            # Queued on the loop before close()'s shutdown, so that shutdown cancels and awaits it.
            future = asyncio.run_coroutine_threadsafe(self._fetch(headers), self._loop)
        try:
            # The loop's own deadline answers first; this one only covers a loop that cannot run.
            return future.result(self.timeout + _CLOSE_SECONDS)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ScrapeError("timeout", f"{self.url}: no answer within {self.timeout:g} s") from None
        except concurrent.futures.CancelledError:
            raise ScrapeError("connect", f"{self.url}: request cancelled (kvwatch is shutting down)") from None

    async def _fetch(self, headers: dict[str, str]) -> str:
        try:
            return await asyncio.wait_for(self._request(headers), self.timeout)
        except asyncio.TimeoutError:
            raise ScrapeError("timeout", f"{self.url}: no complete answer within {self.timeout:g} s "
                              "(connect, headers and body)") from None

    async def _request(self, headers: dict[str, str]) -> str:
        in_body = False
        try:
            async with self._client.stream("GET", self.url, headers=headers) as response:
                if response.status_code != 200:
                    raise ScrapeError("http_status", f"{self.url} answered HTTP {response.status_code}")
                declared = response.headers.get("Content-Length")
                if declared and declared.isdigit() and int(declared) > self.max_body_bytes and \
                        not response.headers.get("Content-Encoding"):
                    raise ScrapeError("too_large", f"body of {declared} bytes exceeds {self.max_body_bytes}")
                in_body = True
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise ScrapeError("too_large", f"body exceeds --max-body-bytes {self.max_body_bytes}")
                    chunks.append(chunk)
        except httpx.TimeoutException as exc:
            raise ScrapeError("timeout", f"{self.url}: timed out after {self.timeout:g} s ({type(exc).__name__})")\
                from None
        except httpx.DecodingError as exc:
            raise ScrapeError("parse", f"{self.url}: cannot decode body: {exc}") from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            if not in_body:
                raise ScrapeError("connect", f"{self.url}: {type(exc).__name__}: {exc}") from None
            # The target answered 200, then the body broke off (truncated, bad chunked encoding).
            raise ScrapeError("parse", f"{self.url}: incomplete body ({type(exc).__name__}: {exc})") from None
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


def tls_context(ca_file: Path | None, verify: bool) -> ssl.SSLContext | bool:
    """httpx's ``verify``: a context trusting ``ca_file`` (httpx 0.28 deprecates a path), else True/False."""
    if not verify:
        return False
    if ca_file is None:
        return True
    return ssl.create_default_context(cafile=str(ca_file))
