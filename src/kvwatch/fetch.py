"""Fetch one ``/metrics`` body from the target (I/O only: :mod:`kvwatch.payload` reads the body).

Every failure becomes a :class:`~kvwatch.payload.ScrapeError` (``connect``, ``timeout``, ``http_status``,
``too_large``, or ``parse`` for an undecodable body). The body cap is enforced while streaming the decoded body, so
neither a huge response nor a gzip bomb is ever held in memory; a wall-clock deadline covers the whole
request, not just each socket read.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import http.cookiejar
import logging
import re
import ssl
import sys
import threading
import zlib
from pathlib import Path
from typing import Any

import httpx

from kvwatch import __version__
from kvwatch.exposition import metadata_keyword
from kvwatch.payload import GZIP_TWICE, UNDECLARED_GZIP, ScrapeError
from kvwatch.settings import redact_url, split_credentials

log = logging.getLogger(__name__)

ACCEPT = "text/plain; version=0.0.4; q=1.0, */*; q=0.1"
_INFLATE_STEP = 256 * 1024  # decoded bytes per zlib call
_CLOSE_SECONDS = 2.0  # bound on closing the client, and the grace past the deadline before fetch() gives up
# Redirects: Prometheus' Go client stops after 10 (it sends at most 10 requests). A redirect's body is read only when
# it declares at most REDIRECT_BODY_BYTES (so that its connection is kept for the next poll); else it is closed unread.
MAX_REDIRECTS = 10
# The redirects Go's client follows, and so Prometheus (httpx calls every 3xx one; a 300, 304 or 305 is the target's
# answer, an http_status failure)
FOLLOWED_REDIRECTS = frozenset({301, 302, 303, 307, 308})
REDIRECT_BODY_BYTES = 64 * 1024
TEXT_OVERHEAD_BYTES = 1024  # a str object's own header, above its characters


class DaemonThreads(concurrent.futures.ThreadPoolExecutor):
    """Runs each call on a daemon thread of its own. A call that never returns (a resolver that does not answer,
    an NVML read of a GPU fallen off the bus) cannot hold up the process's exit: a ThreadPoolExecutor's workers,
    asyncio's default executor's among them, are joined at exit, and SIGTERM waited for them. (A ThreadPoolExecutor
    by type, which asyncio's default executor must be; it never starts a worker of its own.)"""

    def __init__(self, name: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self._name = name

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # (handed to whoever waits on the future)
                future.set_exception(exc)

        threading.Thread(target=run, name=self._name, daemon=True).start()
        return future


class Fetcher:
    """A reusable HTTP client for one target (keep-alive between polls).

    httpx timeouts bound each socket operation, not the request: a target that drips its headers a byte
    at a time never trips them. So each request runs on the fetcher's own event loop (one daemon thread)
    under ``asyncio.wait_for``, which cancels it, connection and all, when ``timeout`` runs out.
    """

    def __init__(self, url: str, *, timeout: float, max_body_bytes: int, bearer_token_file: Path | None = None,
                 ca_file: Path | None = None, tls_verify: bool = True,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        # Credentials in the URL go out as basic auth, never into a message: ``url`` is the redacted form.
        self._request_url, credentials = split_credentials(url)
        self._auth = httpx.BasicAuth(*credentials) if credentials is not None else None
        self.url = redact_url(url)
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.bearer_token_file = bearer_token_file
        # Built once: loading the CA bundle costs ~40 ms, and a new client is made after each cancelled poll.
        # A plain-http target gets none: the bundle holds ~1.2 MB of the sidecar's memory (docs/performance.md),
        # and such a target is never followed to https (_next_hop).
        self._tls = httpx.URL(self._request_url).scheme == "https"
        verify = tls_context(ca_file, tls_verify) if self._tls else False
        self._verify = httpx.create_ssl_context() if verify is True else verify
        self._transport = transport
        self._client = self._new_client()
        self._closed = False
        self._redirected_to: str | None = None  # the other host a redirect last led to (logged once per change)
        self.last_body_bytes = 0  # the last body read whole, in bytes (serve frees memory after a large one)
        self._lock = threading.Lock()  # a request is submitted before close() or not at all
        self._loop = asyncio.new_event_loop()
        self._loop.set_default_executor(DaemonThreads("kvwatch-resolve"))  # (getaddrinfo runs there)
        self._thread = threading.Thread(target=self._loop.run_forever, name="kvwatch-fetch", daemon=True)
        self._thread.start()

    def _new_client(self) -> httpx.AsyncClient:
        # No cookies kept, as Prometheus keeps none: a target setting new ones every answer grew the request's
        # headers until it answered 431 to every poll.
        no_cookies = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        # trust_env off: no HTTP(S)_PROXY/ALL_PROXY or .netrc, as Prometheus (proxy_from_environment defaults to
        # false). A cluster that injects a proxy into every pod sent the sidecar's 127.0.0.1 polls to it (httpx's
        # NO_PROXY matches neither CIDRs nor localhost for 127.0.0.1), and every poll failed as "connect".
        return httpx.AsyncClient(
            trust_env=False,
            timeout=httpx.Timeout(self.timeout),
            cookies=no_cookies,
            verify=self._verify,
            transport=self._transport,
            follow_redirects=False,  # followed here (_request), never reading a redirect's body
            headers={"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": f"kvwatch/{__version__}"},
        )

    def _next_hop(self, response: httpx.Response, hops: int) -> httpx.URL:
        """Where a redirect leads, as httpx would follow it; a plain-http target is never followed to https (its
        client has no CA bundle to verify with)."""
        if hops + 1 >= MAX_REDIRECTS:  # (Go's rule: the request that would be the 11th is not sent)
            raise ScrapeError("connect", f"{self.url}: stopped after {MAX_REDIRECTS} redirects")
        location = response.headers.get("Location")
        if not location:
            raise ScrapeError("http_status", f"{self.url} answered HTTP {response.status_code} without a Location "
                              "to follow")
        try:
            target = response.url.join(location)
        except (httpx.InvalidURL, ValueError) as exc:
            shown = redact_url(location)[:200]  # (redacted first: a cut before the @ left a long password whole)
            raise ScrapeError("connect", f"{self.url} redirects to {shown!r}, not a URL: {exc}") from None
        if target.port is not None and not 0 < target.port < 65536:  # (the socket raised OverflowError: internal)
            raise ScrapeError("connect", f"{self.url} redirects to {redact_url(location)[:200]!r}: no such port")
        if not self._tls and target.scheme == "https":
            raise ScrapeError("connect", f"{self.url} redirects to https: give the https URL as the target, so "
                              "that its certificate is verified")
        return target

    async def _replace_client(self) -> None:
        """Close the whole pool and start a new one (after a request was cancelled at the deadline).

        httpcore's pool does not reclaim a connection whose request was cancelled between being assigned the
        connection and using it (encode/httpcore#1093): each one keeps a socket and a pool slot until the
        pool is full and every poll fails. Closing the pool closes them all; a timed-out poll only costs
        the next one its keep-alive connection.
        """
        old, self._client = self._client, self._new_client()
        try:
            await old.aclose()
        except Exception as exc:  # a half-broken pool must not fail the poll that replaced it
            log.debug("closing the old HTTP client: %s: %s", type(exc).__name__, exc)

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
            await self._replace_client()
            raise ScrapeError("timeout", f"{self.url}: no complete answer within {self.timeout:g} s "
                              "(connect, headers and body)") from None

    async def _request(self, headers: dict[str, str]) -> str:
        in_body = False
        origin = httpx.URL(self._request_url)
        url, auth = origin, self._auth
        try:
            for hops in range(MAX_REDIRECTS + 1):
                # Redirects are followed here, a body read only when it declares REDIRECT_BODY_BYTES or less:
                # httpx's own following reads a redirect's whole body, uncapped (an endless 302: 2 GB).
                response = await self._send(url, headers, auth)
                try:
                    if response.status_code in FOLLOWED_REDIRECTS:
                        url = self._next_hop(response, hops)
                        declared = response.headers.get("Content-Length", "")
                        if declared.isdecimal() and int(declared) <= REDIRECT_BODY_BYTES and \
                                not response.headers.get("Content-Encoding"):
                            await response.aread()  # a small body read keeps the connection for the next poll
                        if not _same_origin(url, origin):
                            # credentials go to the target's origin only, as httpx's own following does
                            auth, headers = None, {k: v for k, v in headers.items() if k != "Authorization"}
                        continue
                    if response.status_code != 200:
                        # (after a redirect the place that answered is named: the target itself answered 302)
                        where = f"{self.url} redirects to {redact_url(str(response.url.copy_with(query=None)))}, " \
                            "which" if hops else self.url
                        raise ScrapeError("http_status", f"{where} answered HTTP {response.status_code}",
                                          response.status_code)
                    self._note_redirect(response, hops)
                    declared = response.headers.get("Content-Length")
                    if declared and declared.isdecimal() and int(declared) > self.max_body_bytes and \
                            not response.headers.get("Content-Encoding"):
                        raise ScrapeError("too_large", f"body of {declared} bytes exceeds {self.max_body_bytes}")
                    in_body = True
                    body = await self._read_capped(response)
                    self.last_body_bytes = len(body)
                finally:
                    await response.aclose()
                return self._text(body, response.charset_encoding,
                                  "gzip" in response.headers.get("Content-Encoding", "").lower())
            raise AssertionError("unreachable: _next_hop refuses the hop past MAX_REDIRECTS")
        except httpx.TimeoutException as exc:
            raise ScrapeError("timeout", f"{self.url}: timed out after {self.timeout:g} s ({type(exc).__name__})")\
                from None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            if not in_body:
                raise ScrapeError("connect", f"{self.url}: {type(exc).__name__}: {_why(exc)}") from None
            # The target answered 200, then the body broke off (truncated, bad chunked encoding).
            raise ScrapeError("parse", f"{self.url}: incomplete body ({type(exc).__name__}: {_why(exc)})") from None
        except (httpx.HTTPError, OSError, ValueError) as exc:  # transport, TLS and URL failures alike
            raise ScrapeError("connect", f"{self.url}: {type(exc).__name__}: {_why(exc)}") from None

    async def _send(self, url: httpx.URL, headers: dict[str, str], auth: httpx.Auth | None) -> httpx.Response:
        """The response's head (its body still to read), sent again once on a new connection when a kept-alive one
        fails before a whole head came back: the target closed it as idle while the request was on its way (GET
        /metrics changes nothing, so sending it again is safe). vLLM's server closes a connection idle for 5 s
        (VLLM_HTTP_TIMEOUT_KEEP_ALIVE) and kvwatch polls every 5 s by default; with the poll 0-3 ms late, 18 polls
        in 240 failed (benchmarks/keepalive_race.py --polls 60 --past-ms 0 1 2 3). Go's client, and so Prometheus,
        sends such a request again the same way; a request on a new connection is not sent again."""
        opened = False

        async def trace(event: str, info: dict[str, Any]) -> None:
            nonlocal opened
            # (httpcore's events: connection.connect_tcp, or connect_unix_socket, and socks.connect_tcp via SOCKS)
            opened = opened or event.endswith(("connect_tcp.started", "connect_unix_socket.started"))

        request = self._client.build_request("GET", url, headers=headers, extensions={"trace": trace})
        try:
            return await self._client.send(request, auth=auth, stream=True)
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            if opened:
                raise
            log.debug("%s: a kept-alive connection failed (%s: %s); sending again", self.url, type(exc).__name__, exc)
            return await self._client.send(request, auth=auth, stream=True)

    def _text(self, body: bytearray, charset: str | None, said_gzip: bool = False) -> str:
        """The body as text, its bytes freed as soon as it is decoded: a copy of them (``bytes(body)``) and the buffer
        held on through the parse made the sidecar's peak about 3.4 × the body."""
        size = len(body)
        try:
            text = decode_body(body, charset, self.url, said_gzip)
        finally:
            body.clear()
        return held_text(text, size, self.max_body_bytes, self.url)

    def _note_redirect(self, response: httpx.Response, hops: int) -> None:
        """A redirect to another host or port is followed, as Prometheus follows it, and said once per place: its
        page is then reported as this target's (followed without a word, it would read as the target's own)."""
        final, asked = response.url, httpx.URL(self._request_url)
        if not hops or _same_origin(final, asked):
            return
        place = redact_url(str(final.copy_with(query=None)))
        if place != self._redirected_to:
            self._redirected_to = place
            log.warning("%s redirects to another host, %s: kvwatch reads that page as this target's", self.url, place)

    async def _read_capped(self, response: httpx.Response) -> bytearray:
        """The decoded body, never more than ``max_body_bytes`` of it held, compressed or not (:class:`CappedBody`).

        httpx's own gzip decoder inflates each network chunk whole: one 64 KiB chunk of a gzip bomb is
        ~64 MiB decoded before any cap can look at it, so the raw bytes are inflated here."""
        reader = CappedBody(_decompressor(response.headers.get("Content-Encoding", "")), self.max_body_bytes,
                            self.url)
        try:
            async for raw in response.aiter_raw():
                reader.feed(raw)
            body = reader.finish()
            if body and body[-1:] != b"\n" and reader.inflate is None and _close_delimited(response.headers):
                # The parse reads a last line without its newline, as Prometheus does; a body only the closing of
                # the connection ends could be cut anywhere in it, and nothing here shows it was not.
                raise ScrapeError("parse", f"{self.url}: incomplete body (it ends mid-line, and neither "
                                           "Content-Length nor chunked encoding shows it whole)")
            return body
        except BaseException:
            # A failed read's traceback (kept by asyncio's futures until the cycle collector runs) would keep
            # the buffer alive: a gzip bomb every poll left 16 MiB more resident each time. Free it now.
            reader.body.clear()
            raise

    def _token(self) -> str:
        # Re-read each poll: projected service-account tokens rotate.
        assert self.bearer_token_file is not None
        try:
            token = self.bearer_token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ScrapeError("connect", f"cannot read bearer token file {self.bearer_token_file}: {exc}") from None
        if not token:  # "Bearer " with nothing after it: a file not written yet, or the wrong file
            raise ScrapeError("connect", f"bearer token file {self.bearer_token_file} is empty")
        if not all("!" <= c <= "~" for c in token):  # never quoted: a header with it would carry the secret
            raise ScrapeError("connect", f"bearer token file {self.bearer_token_file} holds more than one word or "
                                         "characters an HTTP header cannot carry (one token on one line)")
        return token


def _close_delimited(headers: httpx.Headers) -> bool:
    """A body whose end is the connection's closing: no Content-Length, not chunked (HTTP/1.0 style)."""
    return "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "").lower()


class CappedBody:
    """A body's raw bytes in, its decoded bytes out, never more than ``cap`` of them held (``check --file`` reads a
    saved gzip payload with it too). Each inflate step is allowed at most the room left under the cap (zlib's
    ``max_length``); after a finished gzip member the next one is read (a concatenation is one valid gzip body),
    and bytes that start none are refused, never dropped."""

    def __init__(self, inflate: Any, cap: int, url: str) -> None:
        self.inflate = inflate  # a zlib decompressor, None for an identity body
        self.cap = cap
        self.url = url
        self.body = bytearray()

    def feed(self, raw: bytes) -> None:
        if self.inflate is None:
            self.body += raw
        else:
            data = raw
            while data:
                if self.inflate.eof:
                    self.inflate = _next_member(data, self.url)
                try:
                    # Small steps: the bytearray grows in place, no second copy of the body is ever made.
                    self.body += self.inflate.decompress(data, min(_INFLATE_STEP, self.cap - len(self.body) + 1))
                except zlib.error as exc:
                    raise ScrapeError("parse", f"{self.url}: cannot decode body: {exc}") from None
                if len(self.body) > self.cap:
                    break
                data = self.inflate.unconsumed_tail or (self.inflate.unused_data if self.inflate.eof else b"")
        if len(self.body) > self.cap:
            raise ScrapeError("too_large", f"body exceeds --max-body-bytes {self.cap}")

    def finish(self) -> bytearray:
        if self.inflate is not None:
            if not self.inflate.eof:
                raise ScrapeError("parse", f"{self.url}: incomplete body (compressed stream cut short)")
            self.body += self.inflate.flush()
            if len(self.body) > self.cap:
                raise ScrapeError("too_large", f"body exceeds --max-body-bytes {self.cap}")
        return self.body


def _decompressor(content_encoding: str) -> Any:
    """A zlib decompressor for a gzip body (kvwatch asks for gzip only); None for any other ``Content-Encoding``,
    whose bytes are read as they are, as Prometheus reads them: servers that label a plain page ``UTF-8``, ``none``
    or ``deflate`` were refused, and a body really compressed otherwise fails its parse."""
    if content_encoding.strip().lower() in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    return None


def _next_member(following: bytes, url: str) -> Any:
    """A decompressor for the gzip member that ``following`` (the bytes after a finished stream) starts; ScrapeError
    ``parse`` when they cannot start one (trailing garbage, or anything after a deflate stream)."""
    if following[:1] != b"\x1f":  # the first byte of gzip's magic (the decompressor checks the rest)
        raise ScrapeError("parse", f"{url}: data after the end of the compressed body")
    return zlib.decompressobj(16 + zlib.MAX_WBITS)


def tls_context(ca_file: Path | None, verify: bool) -> ssl.SSLContext | bool:
    """httpx's ``verify``: a context trusting ``ca_file`` (httpx 0.28 deprecates a path), else True/False."""
    if not verify:
        return False
    if ca_file is None:
        return True
    return ssl.create_default_context(cafile=str(ca_file))


def held_text(text: str, body_bytes: int, max_body_bytes: int, source: str) -> str:
    """``text`` (decoded from ``body_bytes``), held to twice ``max_body_bytes`` of memory: Python keeps a text at 1,
    2 or 4 bytes a character by its widest one, so one emoji in a page just under the cap made it 64 MiB, and its
    parse peaked at 292 MB, over the chart's memory limit."""
    size = sys.getsizeof(text)
    if size > 2 * max_body_bytes + TEXT_OVERHEAD_BYTES:
        raise ScrapeError("too_large", f"{source}: the body's {body_bytes:,} bytes decode to {size:,} bytes of text "
                          "(characters beyond Latin-1 widen every character of a page), over twice "
                          f"--max-body-bytes {max_body_bytes}")
    return text


# Charsets a body is read in when declared; any other is read as UTF-8, the text format's, as Prometheus reads every
# body whatever it declares. Python decodes some codecs in time quadratic in the size (punycode: 8 s for 320 KB,
# on the fetcher's loop, which held every later poll).
# (UTF-16 and UTF-8 with a BOM too: check --file reads a page saved on Windows in them, told by the BOM.)
DECLARED_CHARSETS = frozenset({"utf-8", "utf8", "utf-8-sig", "utf-16", "us-ascii", "ascii", "iso-8859-1", "latin-1",
                               "latin1"})
LATIN_1 = frozenset({"iso-8859-1", "latin-1", "latin1"})
UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def _with_bad_comments_replaced(body: bytes | bytearray) -> str | None:
    """A UTF-8 body whose every undecodable byte is in a plain comment line (not HELP or TYPE), those bytes replaced
    by U+FFFD; else None. Prometheus' scrape reads such a page (its lexer skips a comment unread; a HELP text or a
    label value that is not UTF-8 fails the scrape), and kvwatch reads no comment."""
    if not _only_in_plain_comments(body.decode("utf-8", errors="surrogateescape")):
        return None
    return body.decode("utf-8", errors="replace")  # (the scanned text freed first: one text at a time)


def _only_in_plain_comments(text: str) -> bool:
    """Whether every undecodable byte of ``text`` (surrogate-escaped) is in a plain comment line. Only the lines
    holding one are looked at, in place (split into lines, with a second text alive, the page took 6 times its
    size)."""
    checked_to = -1
    for bad in _UNDECODABLE.finditer(text):
        if bad.start() < checked_to:
            continue  # on a line already found to be a plain comment
        start = text.rfind("\n", 0, bad.start()) + 1
        end = text.find("\n", bad.start())
        checked_to = len(text) if end < 0 else end
        at = _BLANKS.match(text, start).end()
        if text[at : at + 1] != "#" or metadata_keyword(text, at) is not None:
            return False
    return True


_UNDECODABLE = re.compile("[\udc80-\udcff]")  # the bytes surrogateescape could not decode
_BLANKS = re.compile("[ \t]*")


def decode_body(body: bytes | bytearray, charset: str | None, source: str, said_gzip: bool = False) -> str:
    """A body as text in its declared charset when that is one of :data:`DECLARED_CHARSETS`, else as UTF-8. A byte
    the charset cannot read is a ``parse`` error, as Prometheus' parser makes it, never a replacement character in
    a label. ``said_gzip``: the response's Content-Encoding named gzip (a gzip body then is one compressed twice)."""
    charset = (charset or "").strip().lower()
    if charset not in DECLARED_CHARSETS or (charset == "utf-16" and not body.startswith(UTF16_BOMS)):
        charset = "utf-8"  # (UTF-16 without its BOM is a UTF-8 page mislabelled: it read as a line of mojibake)
    elif charset in LATIN_1:
        # UTF-8 first: a server that labels all text Latin-1 (HTTP/1.1's old default) serving vLLM's UTF-8 garbled a
        # model name beyond ASCII while kvwatch_up read 1. A body that is no UTF-8 is read as declared.
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            pass
    try:
        return body.decode(charset)
    except UnicodeDecodeError as exc:
        encoding, reason, start = exc.encoding, exc.reason, exc.start
    # Raised past the except block: raised in it, the error kept the UnicodeDecodeError as its __context__ (``from
    # None`` only hides it), and that holds a copy of the whole body in a cycle a full collection frees: a 16 MiB page
    # with one bad byte took the sidecar past 360 MB in a minute of failed polls.
    if body.startswith(b"\x1f\x8b"):
        raise ScrapeError("parse", GZIP_TWICE if said_gzip else UNDECLARED_GZIP)
    text = _with_bad_comments_replaced(body) if encoding == "utf-8" else None
    if text is not None:
        return text
    line = body.count(b"\n", 0, start) + 1
    where = f"{source}: " if source else ""
    raise ScrapeError("parse", f"{where}line {line}: invalid {encoding} ({reason} at byte {start:,})", content=True)


def _same_origin(a: httpx.URL, b: httpx.URL) -> bool:
    """One server: the same scheme, host and port (httpx's port is None for the scheme's default)."""
    return (a.scheme, a.host, a.port) == (b.scheme, b.host, b.port)


def _why(exc: BaseException) -> str:
    """An exception's text, else its cause's: httpx's ReadError for a connection reset says nothing itself."""
    seen: BaseException | None = exc
    while seen is not None:
        if text := str(seen):
            if "location header" in text.lower():  # httpx quotes a piece of it ("Invalid port: 'Pa'"): a password's
                return "a redirect's Location header is no valid URL"
            return re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://\S+", lambda m: redact_url(m.group()), text)
        seen = seen.__cause__ or seen.__context__
    return "the connection was closed or reset"
