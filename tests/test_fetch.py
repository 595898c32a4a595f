"""Fetching and classifying failures: every way a target can fail maps to one scrape error reason."""

from __future__ import annotations

import base64
import gzip
import itertools
import os
import socket
import struct
import threading
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import respx

from kvwatch.fetch import ACCEPT, Fetcher
from kvwatch.payload import REASONS, ScrapeError, interpret

URL = "http://vllm.test:8000/metrics"
FIXTURE = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom").read_text()


def fetch_and_read(max_body_bytes: int = 1 << 20, **kwargs: object) -> object:
    with Fetcher(URL, timeout=2.0, max_body_bytes=max_body_bytes, **kwargs) as fetcher:  # type: ignore[arg-type]
        return interpret(fetcher.fetch(), None, timestamp=5.0)


def reason_of(**kwargs: object) -> str:
    with pytest.raises(ScrapeError) as info:
        fetch_and_read(**kwargs)
    assert info.value.reason in REASONS
    return info.value.reason


@respx.mock
def test_success_sends_classic_text_accept_and_reads_readings() -> None:
    route = respx.get(URL).mock(return_value=httpx.Response(200, text=FIXTURE))
    poll = fetch_and_read()
    assert [r.engine for r in poll.readings] == ["0", "1"]  # type: ignore[attr-defined]
    request = route.calls.last.request
    assert request.headers["Accept"] == ACCEPT and "text/plain; version=0.0.4" in ACCEPT
    assert "gzip" in request.headers["Accept-Encoding"]


@respx.mock
def test_gzip_body_is_decoded() -> None:
    respx.get(URL).mock(return_value=httpx.Response(
        200, content=gzip.compress(FIXTURE.encode()), headers={"Content-Encoding": "gzip"}))
    assert len(fetch_and_read().readings) == 2  # type: ignore[attr-defined]


@respx.mock
def test_bearer_token_is_read_from_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    route = respx.get(URL).mock(return_value=httpx.Response(200, text=FIXTURE))
    fetch_and_read(bearer_token_file=token)
    assert route.calls.last.request.headers["Authorization"] == "Bearer s3cret"


def _poll_with_token_file(tmp_path: Path, content: str) -> tuple[ScrapeError, respx.Route]:
    """One poll with a bearer token file holding ``content``: the error it fails with, and the target's route."""
    token = tmp_path / "token"
    token.write_text(content)
    route = respx.get(URL).mock(return_value=httpx.Response(200, text=FIXTURE))
    with pytest.raises(ScrapeError) as caught:
        fetch_and_read(bearer_token_file=token)
    return caught.value, route


@respx.mock
def test_a_token_file_emptied_after_start_fails_the_poll_without_sending_it(tmp_path: Path) -> None:
    error, route = _poll_with_token_file(tmp_path, "  \n")
    assert error.reason == "connect" and "is empty" in str(error) and not route.called


@respx.mock
def test_a_token_file_of_two_lines_is_refused_without_the_token_in_the_message(tmp_path: Path) -> None:
    # httpx refused the header and its message, logged on every down-transition, quoted the whole token.
    error, route = _poll_with_token_file(tmp_path, "supersecret-abc\nsecond-line-xyz\n")
    assert error.reason == "connect" and "one token on one line" in str(error)
    assert "supersecret" not in str(error) and "second-line" not in str(error)
    assert not route.called


def test_urls_are_redacted_up_to_their_last_at_sign() -> None:
    # A password with an unencoded '#', '/' or '?' ends the parsed authority early: the parsed URL had no password,
    # and the message printed it whole.
    from kvwatch.settings import redact_url

    assert redact_url("http://u:pa#ss@127.0.0.1:1/metrics") == "http://***@127.0.0.1:1/metrics"
    assert redact_url("http://user:1234/secret@host/metrics") == "http://***@host/metrics"
    assert redact_url("http://kv%40user:s3cr%3At@10.0.0.1:8000/metrics") == "http://***@10.0.0.1:8000/metrics"
    assert redact_url("http://10.0.0.1:8000/metrics") == "http://10.0.0.1:8000/metrics"
    # An @ in a later path segment or a query is no credential: the host stays (a first cut named the wrong one); a
    # query's values are masked all the same (a proxy's ?token= went to every log line and check's JSON)
    assert redact_url("http://vllm:8000/users/me@x/metrics") == "http://vllm:8000/users/me@x/metrics"
    assert redact_url("http://vllm:8000/metrics?token=a@b") == "http://vllm:8000/metrics?token=***"
    assert redact_url("http://vllm/m?token=T0K&name=x#f") == "http://vllm/m?token=***&name=***#f"
    # text that is no URL, as a refused value is quoted: its credentials too
    for text, shown in (("u:NoSchemePW@127.0.0.1:18002/metrics", "***@127.0.0.1:18002/metrics"),
                        ("//u:pw@h/m", "//***@h/m"), ("http:/u:pw@h/m", "http:/***@h/m")):
        assert redact_url(text) == shown
    # digits then '?' parse as host and port: the password was kept whole; and the fallback cut at the
    # last @ named the query's host
    assert redact_url("http://admin:1234?s3cret@vllm:8000/metrics") == "http://***@vllm:8000/metrics"
    assert redact_url("http://u:p#x@host/m?q=a@b") == "http://***@host/m?q=***"
    assert redact_url("http://u:p@ss@host/m") == "http://***@host/m"
    from kvwatch.settings import check_url

    with pytest.raises(ValueError) as caught:  # the port error quoted "pa", the password's first half
        check_url("http://user:pa#ss@127.0.0.1:1/metrics")
    assert "pa'" not in str(caught.value) and "percent-encode" in str(caught.value)
    # A password of digits then '/', '?' or '#' parses as host and port: every poll went to that "host", the rest of
    # the password in its path, while the logs named the host after the '@'. Refused, not the password quoted.
    for url in ("http://localhost:18804/ssSECRET@127.0.0.1:18801/metrics", "http://admin:1234?s3cret@vllm:8000/m",
                "http://u:12#x@vllm/metrics"):
        with pytest.raises(ValueError, match="percent-encode") as caught:
            check_url(url)
        assert "SECRET" not in str(caught.value) and "s3cret" not in str(caught.value)
    for url in ("http://vllm:8000/metrics?token=a@b", "http://vllm:8000/users/me@x/metrics", "http://u:p@ss@h/m"):
        assert check_url(url) == url


@respx.mock
def test_http_500() -> None:
    respx.get(URL).mock(return_value=httpx.Response(500, text="oops"))
    assert reason_of() == "http_status"


@respx.mock
def test_connect_error() -> None:
    respx.get(URL).mock(side_effect=httpx.ConnectError("refused"))
    assert reason_of() == "connect"


@respx.mock
def test_timeout() -> None:
    respx.get(URL).mock(side_effect=httpx.ReadTimeout("slow"))
    assert reason_of() == "timeout"


@respx.mock
def test_oversize_declared_length_is_refused_before_reading() -> None:
    respx.get(URL).mock(return_value=httpx.Response(200, content=b"x" * 5000))
    assert reason_of(max_body_bytes=4096) == "too_large"


@respx.mock
def test_endless_body_stops_at_the_cap() -> None:
    produced = 0

    async def endless() -> AsyncIterator[bytes]:  # a "10 GB" body: only the cap's worth may ever be produced
        nonlocal produced
        while True:
            produced += 65536
            yield b"a 1\n" * 16384

    respx.get(URL).mock(return_value=httpx.Response(200, content=endless()))
    assert reason_of(max_body_bytes=1 << 20) == "too_large"
    assert produced <= (1 << 20) + 65536


@respx.mock
def test_gzip_bomb_is_capped_after_decoding() -> None:
    respx.get(URL).mock(return_value=httpx.Response(
        200, content=gzip.compress(b"a 1\n" * (1 << 20)), headers={"Content-Encoding": "gzip"}))
    assert reason_of(max_body_bytes=1 << 16) == "too_large"


@respx.mock
@pytest.mark.parametrize(("body", "reason"), [
    ("\x00\x01garbage{{{", "parse"),
    ("<!DOCTYPE html>\n<html><body><h1>502 Bad Gateway</h1></body></html>\n", "parse"),
    ("", "unrecognised"),
    ("# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.21\n", "unrecognised"),
])
def test_bodies_that_are_not_vllm(body: str, reason: str) -> None:
    respx.get(URL).mock(return_value=httpx.Response(200, text=body))
    assert reason_of() == reason


def test_missing_token_file_is_a_connect_error(tmp_path: Path) -> None:
    fetcher = Fetcher(URL, timeout=1.0, max_body_bytes=4096, bearer_token_file=tmp_path / "gone")
    with pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    assert info.value.reason == "connect" and "token" in str(info.value)


# ---------------------------------------------------------------- real loopback servers that misbehave

class _RawServer:
    """A loopback TCP server whose ``answer(conn)`` writes whatever bytes a test needs."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self._answer = answer
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/metrics"
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                self._answer(conn)
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[socket.socket], None]], _RawServer]]:
    servers: list[_RawServer] = []

    def start(answer: Callable[[socket.socket], None]) -> _RawServer:
        servers.append(_RawServer(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_target_dripping_its_headers_times_out_at_the_poll_deadline(raw_server: Callable) -> None:
    def drip(conn: socket.socket) -> None:
        # Each byte arrives well inside httpx's per-read timeout, so only a whole-request deadline can stop it.
        for byte in b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Slow: " + b"a" * 40:
            conn.sendall(bytes([byte]))
            time.sleep(0.1)

    server = raw_server(drip)
    with Fetcher(server.url, timeout=0.5, max_body_bytes=4096) as fetcher, pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    assert info.value.reason == "timeout" and "0.5 s" in str(info.value)


HEAD_200 = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"


@pytest.mark.parametrize("answer", [
    # Content-Length promises more than arrives before the connection closes.
    HEAD_200 + b"Content-Length: 1000\r\n\r\n" + FIXTURE.encode()[:100],
    # A chunk size that is not hex.
    HEAD_200 + b"Transfer-Encoding: chunked\r\n\r\n10\r\nvllm:x 1\nvllm:y 2\r\nzz\r\nbroken\r\n",
], ids=["truncated", "bad-chunked"])
def test_body_that_breaks_off_after_200_is_a_parse_error(raw_server: Callable, answer: bytes) -> None:
    server = raw_server(lambda conn: conn.sendall(answer))
    with Fetcher(server.url, timeout=2.0, max_body_bytes=4096) as fetcher, pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    assert info.value.reason == "parse" and "incomplete body" in str(info.value)


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_a_last_line_without_its_newline_is_read_where_the_body_is_known_whole(raw_server: Callable,
                                                                                framing: str) -> None:
    # Prometheus reads a page whose last line has no newline ("\n".join(lines) in a custom
    # exporter or proxy); kvwatch refused it on every poll. Where only the connection's closing ends the body,
    # nothing shows it was not cut mid-line (0.95 read as 0.9): that one is still an incomplete body.
    body = FIXTURE.rstrip("\n").encode()
    if framing == "length":
        answer = HEAD_200 + b"Content-Length: %d\r\n\r\n" % len(body) + body
    elif framing == "chunked":
        answer = HEAD_200 + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        answer = HEAD_200 + b"Connection: close\r\n\r\n" + body
    server = raw_server(lambda conn: conn.sendall(answer))
    with Fetcher(server.url, timeout=2.0, max_body_bytes=1 << 20) as fetcher:
        if framing == "close":
            with pytest.raises(ScrapeError) as info:
                fetcher.fetch()
            assert info.value.reason == "parse" and "ends mid-line" in str(info.value)
            return
        whole = interpret(fetcher.fetch(), None, timestamp=1.0)
    assert whole.readings == interpret(FIXTURE, None, timestamp=1.0).readings


@pytest.mark.parametrize("to_https", [False, True], ids=["on-http", "to-https"])
def test_plain_http_target_is_followed_on_http_but_never_to_https(raw_server: Callable, to_https: bool) -> None:
    """A plain-http fetcher carries no CA bundle (it would cost the sidecar ~1.2 MB), so it must not follow a
    redirect to https, where it could not verify the certificate; a redirect on http is followed as before."""
    body = FIXTURE.encode()
    final = raw_server(lambda conn: conn.sendall(
        HEAD_200 + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body))
    location = "https://127.0.0.1:1/metrics" if to_https else final.url
    redirecting = raw_server(lambda conn: conn.sendall(
        b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        % location.encode()))
    with Fetcher(redirecting.url, timeout=2.0, max_body_bytes=1 << 20) as fetcher:
        if not to_https:
            assert len(interpret(fetcher.fetch(), None, timestamp=1.0).readings) == 2
            return
        with pytest.raises(ScrapeError) as info:
            fetcher.fetch()
    assert info.value.reason == "connect" and "redirects to https" in str(info.value)


def test_connection_closed_before_any_answer_is_still_connect(raw_server: Callable) -> None:
    server = raw_server(lambda conn: None)  # reads the request, closes without a word
    with Fetcher(server.url, timeout=2.0, max_body_bytes=4096) as fetcher, pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    assert info.value.reason == "connect"


def test_proxy_variables_are_ignored_as_prometheus_ignores_them(raw_server: Callable,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy a cluster injects into every pod, which answers nothing useful: the sidecar's loopback target is
    # read directly all the same, and so is the demo's own status page.
    def page(conn: socket.socket) -> None:
        body = FIXTURE.encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    proxy = raw_server(lambda conn: conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"))
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy.url.removesuffix("/metrics"))
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    target = raw_server(page)
    with Fetcher(target.url, timeout=2.0, max_body_bytes=1 << 20) as fetcher:
        assert len(interpret(fetcher.fetch(), None, timestamp=1.0).readings) == 2
    from kvwatch.demo import _fetch
    assert _fetch(target.url) == FIXTURE


def test_ca_file_goes_in_as_an_ssl_context_not_a_deprecated_path() -> None:
    import ssl
    import warnings

    import certifi

    from kvwatch.fetch import tls_context

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # httpx 0.28 deprecates verify=<str>
        Fetcher("https://vllm.test/metrics", timeout=1.0, max_body_bytes=4096, ca_file=Path(certifi.where())).close()
    context = tls_context(Path(certifi.where()), True)
    assert isinstance(context, ssl.SSLContext) and context.cert_store_stats()["x509_ca"] > 0
    assert tls_context(Path(certifi.where()), False) is False and tls_context(None, True) is True


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc (Linux)")
def test_polls_cancelled_at_the_deadline_leak_no_connections() -> None:
    """A target answering in 0-30 ms against a 15 ms deadline: many polls are cancelled mid-request. httpcore
    leaves such connections in its pool (open socket, slot taken) until every poll fails; the fetcher must
    not, so open files stay flat and a prompt answer is read again afterwards."""
    import random
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    delay = {"max": 0.03}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn

        def do_GET(self) -> None:
            time.sleep(random.uniform(0, delay["max"]))
            body = FIXTURE.encode()
            try:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # kvwatch hung up at its deadline

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        with Fetcher(url, timeout=0.015, max_body_bytes=1 << 20) as fetcher:
            before = _open_fds()
            reasons = []
            for _ in range(300):
                try:
                    fetcher.fetch()
                    reasons.append("ok")
                except ScrapeError as exc:
                    reasons.append(exc.reason)
            assert reasons.count("timeout") >= 30, "the scenario must cancel requests at the deadline"
            time.sleep(0.2)  # let the server side of cancelled requests finish
            assert _open_fds() <= before + 5
            delay["max"] = 0.0

            def answered() -> bool:
                try:
                    return "vllm:" in fetcher.fetch()
                except ScrapeError:
                    return False

            # The pool is usable: not exhausted by orphaned connections, which failed every fetch. (Each socket
            # operation still has the fetcher's 15 ms, which a loaded machine misses now and then: 8 in 300.)
            assert any(answered() for _ in range(10))
    finally:
        server.shutdown()
        server.server_close()


def _gzip_bomb(decoded_bytes: int) -> bytes:
    """gzip of ``decoded_bytes`` of a metrics-like line, built a MiB at a time (the test never holds it whole)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"a 1\n" * (1 << 18)
    parts = [packer.compress(block) for _ in range(decoded_bytes // len(block))]
    return b"".join([*parts, packer.flush()])


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "close-delimited"])
def test_gzip_bomb_never_inflates_past_the_cap_in_memory(raw_server: Callable, declared: bool) -> None:
    """256 MiB decoded from ~250 KiB on the wire, against a 1 MiB cap: the peak allocation while fetching stays
    within a few caps (httpx's own decoder inflates each network chunk whole: tens of MiB at once)."""
    bomb = _gzip_bomb(256 << 20)
    assert len(bomb) < 1 << 20
    length = f"Content-Length: {len(bomb)}\r\n".encode() if declared else b"Connection: close\r\n"
    server = raw_server(lambda conn: conn.sendall(HEAD_200 + b"Content-Encoding: gzip\r\n" + length + b"\r\n" + bomb))
    with Fetcher(server.url, timeout=5.0, max_body_bytes=1 << 20) as fetcher:
        tracemalloc.start()
        try:
            with pytest.raises(ScrapeError) as info:
                fetcher.fetch()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert info.value.reason == "too_large"
    assert peak < 4 << 20, f"peak {peak >> 20} MiB while fetching a gzip bomb with a 1 MiB cap"


@respx.mock
def test_a_gzip_body_of_two_members_is_read_whole_and_trailing_garbage_refused() -> None:
    # A concatenation of gzip members is one valid gzip body; it was cut to its first member (kvwatch_up 1, the
    # second half's families missing). Bytes after the stream that start no member were dropped silently.
    half = len(FIXTURE) // 2
    cut = FIXTURE.index("\n", half) + 1
    two = gzip.compress(FIXTURE[:cut].encode()) + gzip.compress(FIXTURE[cut:].encode())
    route = respx.get(URL).mock(return_value=httpx.Response(200, content=two, headers={"Content-Encoding": "gzip"}))
    with Fetcher(URL, timeout=2.0, max_body_bytes=1 << 20) as fetcher:
        assert fetcher.fetch() == FIXTURE
    for tail in (b"garbage", b"\n"):
        route.mock(return_value=httpx.Response(200, content=gzip.compress(FIXTURE.encode()) + tail,
                                               headers={"Content-Encoding": "gzip"}))
        assert reason_of() == "parse"


@respx.mock
def test_gzip_body_cut_short_is_a_parse_error() -> None:
    respx.get(URL).mock(return_value=httpx.Response(
        200, content=gzip.compress(FIXTURE.encode())[:-40], headers={"Content-Encoding": "gzip"}))
    assert reason_of() == "parse"


def test_a_content_encoding_other_than_gzip_is_read_as_the_bytes_it_is(raw_server: Callable) -> None:
    # Prometheus 2.42 decodes gzip only and reads any other encoding's bytes as they are: a plain
    # page labelled UTF-8, none, br or deflate is up there; kvwatch refused it ("unsupported Content-Encoding").
    def serving(label: bytes, body: bytes) -> str:
        return raw_server(lambda conn: conn.sendall(HEAD_200 + b"Content-Encoding: %s\r\nContent-Length: %d\r\n"
                                                    b"Connection: close\r\n\r\n" % (label, len(body)) + body)).url

    for label in (b"UTF-8", b"none", b"br", b"deflate"):
        with Fetcher(serving(label, FIXTURE.encode()), timeout=2.0, max_body_bytes=1 << 20) as fetcher:
            assert interpret(fetcher.fetch(), None, timestamp=5.0).readings, label
    with Fetcher(serving(b"br", b"\x1b\xff\x00\x01"), timeout=2.0, max_body_bytes=1 << 20) as fetcher:
        with pytest.raises(ScrapeError) as caught:
            fetcher.fetch()  # a body really compressed so is no page
        assert caught.value.reason == "parse"


def test_credentials_in_the_url_go_as_basic_auth_and_never_into_messages(raw_server: Callable) -> None:
    seen: list[bytes] = []

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")

    server = raw_server(answer)
    original = server._handle

    def record(conn: socket.socket) -> None:  # keep the request head the server read
        with conn:
            seen.append(conn.recv(65536))
            answer(conn)

    server._handle = record  # type: ignore[method-assign]
    del original
    url = server.url.replace("http://", "http://kv%40user:s3cr%3At@")
    with Fetcher(url, timeout=2.0, max_body_bytes=4096) as fetcher, pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    assert info.value.reason == "http_status"
    assert "s3cr" not in str(info.value) and "s3cr" not in fetcher.url and "***@127.0.0.1" in fetcher.url
    head = seen[0].decode("latin-1")
    expected = base64.b64encode(b"kv@user:s3cr:t").decode()
    assert f"Authorization: Basic {expected}" in head and "s3cr" not in head.split("\r\n")[0]


@respx.mock
@pytest.mark.parametrize("charset", [None, "latin-1"])
def test_a_gzip_body_without_its_header_is_named_as_such(charset: str | None) -> None:
    content_type = "text/plain" + (f"; charset={charset}" if charset else "")
    respx.get(URL).mock(return_value=httpx.Response(200, content=gzip.compress(FIXTURE.encode()),
                                                    headers={"Content-Type": content_type}))
    with pytest.raises(ScrapeError) as caught:
        fetch_and_read()
    assert caught.value.reason == "parse" and "gzip-compressed" in str(caught.value)
    assert "Content-Encoding" in str(caught.value)


@respx.mock
def test_a_byte_that_is_not_utf8_is_a_parse_error_not_a_replacement_character() -> None:
    # Prometheus refuses invalid UTF-8; kvwatch decoded it as U+FFFD and read model_name "m\ufffd".
    body = FIXTURE.encode().replace(b'model_name="', b'model_name="\xff', 1)
    respx.get(URL).mock(return_value=httpx.Response(200, content=body))
    with pytest.raises(ScrapeError) as caught:
        fetch_and_read()
    assert caught.value.reason == "parse" and "invalid utf-8" in str(caught.value)
    line = body[:body.index(b"\xff")].count(b"\n") + 1
    assert f"line {line}:" in str(caught.value)


@respx.mock
def test_a_byte_that_is_not_utf8_in_a_comment_is_read_as_prometheus_reads_it() -> None:
    # Prometheus 2.42's scrape skips a plain comment unread (up 1) and fails on a HELP text or a
    # label value that is not UTF-8; kvwatch refused the first page too.
    comment = b"# built on h\xf4te-7\n" + FIXTURE.encode()
    respx.get(URL).mock(return_value=httpx.Response(200, content=comment))
    assert fetch_and_read().readings
    # '#HELP x' (no blank after '#') is a comment to Prometheus' scrape too (promlex.l)
    respx.get(URL).mock(return_value=httpx.Response(200, content=b"#HELP x h\xf4te\n" + comment))
    assert fetch_and_read().readings
    for bad in (b"# HELP x h\xf4te\n", b"#\tTYPE x \xf4\n", b"x{a=\"\xf4\"} 1\n"):
        respx.get(URL).mock(return_value=httpx.Response(200, content=bad + comment))
        with pytest.raises(ScrapeError) as caught:
            fetch_and_read()
        assert caught.value.reason == "parse" and "line 1: invalid utf-8" in str(caught.value)


def test_a_redirect_to_another_host_is_followed_and_said_once(raw_server: Callable,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    # Followed, as Prometheus follows it, but that host's page is then reported as this target's: it was silent.
    # Another port on the same host is another server too; another path
    # on the same one is not.
    body = FIXTURE.encode()
    page = HEAD_200 + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
    final = raw_server(lambda conn: conn.sendall(page))
    elsewhere = final.url.replace("127.0.0.1", "localhost")

    def redirect(where: str) -> bytes:
        return (b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                % where.encode())
    for location, said in (("/moved", False), (final.url, True), (elsewhere, True)):
        caplog.clear()
        answers = itertools.cycle([redirect(location), page])  # (/moved is this server: its next answer)
        redirecting = raw_server(lambda conn, answers=answers: conn.sendall(next(answers)))
        with caplog.at_level("WARNING", logger="kvwatch.fetch"), \
                Fetcher(redirecting.url, timeout=2.0, max_body_bytes=1 << 20) as fetcher:
            for _ in range(2):
                assert len(interpret(fetcher.fetch(), None, timestamp=1.0).readings) == 2
        warnings = [r.getMessage() for r in caplog.records if "redirects to another host" in r.getMessage()]
        assert len(warnings) == (1 if said else 0), warnings


def test_a_failure_after_a_redirect_names_the_place_that_answered(raw_server: Callable) -> None:
    # "http://target/metrics answered HTTP 500" when the target had answered 302 and the other server 500
    failing = raw_server(lambda conn: conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n"
                                                   b"Connection: close\r\n\r\n"))
    redirecting = raw_server(lambda conn: conn.sendall(
        b"HTTP/1.1 302 Found\r\nLocation: %s?token=x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        % failing.url.encode()))
    with Fetcher(redirecting.url, timeout=2.0, max_body_bytes=1 << 20) as fetcher, \
            pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    assert info.value.reason == "http_status"
    assert str(info.value).endswith(f"{redirecting.url} redirects to {failing.url}, which answered HTTP 500")


def test_a_connection_reset_is_named(raw_server: Callable) -> None:
    # httpx's ReadError for a reset carries no text: the log read "ReadError: " and nothing more
    def reset(conn: socket.socket) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends an RST

    with Fetcher(raw_server(reset).url, timeout=2.0, max_body_bytes=1 << 20) as fetcher, \
            pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    assert info.value.reason == "connect"
    message = str(info.value).split(": ", 2)[-1]
    assert message.strip() and not message.rstrip().endswith(":"), str(info.value)


def test_a_redirects_body_is_never_read(raw_server: Callable) -> None:
    # httpx's own following read a redirect's whole body before kvwatch's capped reader saw a byte: a 302 with an
    # endless body took the sidecar to 2 GB (and a gzip bomb behind one to 1.7 GB), counted as a timeout.
    body = FIXTURE.encode()
    final = raw_server(lambda conn: conn.sendall(
        HEAD_200 + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body))
    sent = []

    def endless(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nConnection: close\r\n\r\n" % final.url.encode())
        chunk = b"x" * (1 << 20)
        for _ in range(64):  # 64 MiB, far past --max-body-bytes, unless the client hangs up
            conn.sendall(chunk)
            sent.append(len(chunk))

    redirecting = raw_server(endless)
    with Fetcher(redirecting.url, timeout=5.0, max_body_bytes=1 << 20) as fetcher:
        assert len(interpret(fetcher.fetch(), None, timestamp=1.0).readings) == 2
    time.sleep(0.2)
    assert sum(sent) < 16 << 20  # the client hung up; what the kernel buffered is all that went


def test_a_kept_alive_connection_closed_as_the_request_arrives_is_sent_again_on_a_new_one(
        raw_server: Callable) -> None:
    """vLLM's server closes a connection idle for 5 s and kvwatch polls every 5 s: a poll can go out on a connection
    the target is closing. It is sent again on a new connection, as Go's client does; a new one is not retried."""
    body = FIXTURE.encode()
    connections: list[int] = []

    def keep_alive_once(conn: socket.socket) -> None:
        connections.append(len(connections))
        if len(connections) == 1:  # the first connection answers, then closes when the next request arrives
            conn.sendall(HEAD_200 + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            conn.recv(65536)
            return
        conn.sendall(HEAD_200 + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)

    server = raw_server(keep_alive_once)
    with Fetcher(server.url, timeout=5.0, max_body_bytes=1 << 20) as fetcher:
        assert len(interpret(fetcher.fetch(), None, timestamp=1.0).readings) == 2
        assert len(interpret(fetcher.fetch(), None, timestamp=2.0).readings) == 2
    assert len(connections) == 2
    closing: list[int] = []
    hangs_up = raw_server(lambda conn: closing.append(1))  # a new connection closed unanswered
    with Fetcher(hangs_up.url, timeout=5.0, max_body_bytes=1 << 20) as fetcher, pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    assert info.value.reason == "connect" and "disconnected" in str(info.value) and len(closing) == 1


def test_redirects_are_followed_ten_times_and_credentials_stay_with_the_target(raw_server: Callable,
                                                                                tmp_path: Path) -> None:
    looping: list[_RawServer] = []
    loop = raw_server(lambda conn: conn.sendall(
        b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % looping[0].url.encode()))
    looping.append(loop)
    with Fetcher(loop.url, timeout=5.0, max_body_bytes=1 << 20) as fetcher, pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    assert info.value.reason == "connect" and "stopped after 10 redirects" in str(info.value)
    seen: list[bytes] = []
    body = FIXTURE.encode()

    def final_answer(conn: socket.socket) -> None:
        conn.sendall(HEAD_200 + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)

    class Recording(_RawServer):
        def _handle(self, conn: socket.socket) -> None:
            with conn:
                seen.append(conn.recv(65536))
                final_answer(conn)

    elsewhere = Recording(final_answer)
    try:
        other_host = elsewhere.url.replace("127.0.0.1", "localhost")
        redirecting = raw_server(lambda conn: conn.sendall(
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % other_host.encode()))
        token = tmp_path / "token"
        token.write_text("s3cr3t")
        url = redirecting.url.replace("http://", "http://user:pw@")
        with Fetcher(url, timeout=5.0, max_body_bytes=1 << 20, bearer_token_file=token) as fetcher:
            assert len(interpret(fetcher.fetch(), None, timestamp=1.0).readings) == 2
        assert seen and b"authorization" not in seen[0].lower()
    finally:
        elsewhere.close()


def test_a_page_widened_by_one_character_is_held_to_twice_the_cap(raw_server: Callable) -> None:
    # Python stores a text at 4 bytes a character once one character needs it: a page just under the cap with one
    # emoji decoded to 4x its bytes and parsed at 292 MB, past the chart's 256 MiB, every poll, with kvwatch_up 1.
    plain = FIXTURE.encode()
    cap = len(plain) + (40 << 10)
    for head, accepted in ((b"# \xf0\x9f\x98\x80 ", False), (b"# \xc3\xa9 ", True), (b"# ", True)):
        filler = head + b"a" * (cap - len(plain) - len(head) - 2) + b"\n"
        body = filler + plain
        server = raw_server(lambda conn, data=body: conn.sendall(
            HEAD_200 + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(data) + data))
        with Fetcher(server.url, timeout=5.0, max_body_bytes=cap) as fetcher:
            if accepted:  # a Latin-1 character keeps 1 byte a character: the page reads
                assert len(interpret(fetcher.fetch(), None, timestamp=1.0).readings) == 2
                continue
            with pytest.raises(ScrapeError) as info:
                fetcher.fetch()
        assert info.value.reason == "too_large" and "over twice --max-body-bytes" in str(info.value)


def test_a_permanent_redirect_keeps_its_connection_and_its_credentials(tmp_path: Path) -> None:
    # Closing every redirect unread cost a new connection (and TLS handshake) each poll for a target that always
    # redirects (/metrics to /metrics/); an empty redirect body is read, and the connection kept. On the same
    # origin the credentials go along.
    body = FIXTURE.encode()
    accepted: list[int] = []
    authorized: list[bool] = []
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]

    def handle(conn: socket.socket) -> None:
        with conn:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                authorized.append(b"authorization: basic" in head.lower())
                if head.split(b" ")[1] == b"/metrics":
                    conn.sendall(b"HTTP/1.1 301 Moved Permanently\r\nLocation: /metrics/\r\nContent-Length: 0\r\n\r\n")
                else:
                    conn.sendall(HEAD_200 + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            accepted.append(1)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        with Fetcher(f"http://user:pw@127.0.0.1:{port}/metrics", timeout=5.0, max_body_bytes=1 << 20) as fetcher:
            for _ in range(5):
                assert len(interpret(fetcher.fetch(), None, timestamp=1.0).readings) == 2
    finally:
        sock.close()
    assert len(accepted) == 1 and len(authorized) == 10 and all(authorized)


def test_bytes_past_the_declared_length_do_not_fail_the_next_poll(raw_server: Callable) -> None:
    """A target sending more than its Content-Length leaves bytes on the kept-alive connection, which the next
    request read as its answer ("illegal status line", every second poll a `connect` error): sent again, it is
    answered on a new connection."""
    body = FIXTURE.encode()

    def overlong(conn: socket.socket) -> None:
        while True:
            conn.sendall(HEAD_200 + b"Content-Length: %d\r\n\r\n" % len(body) + body + b"extra junk\n")
            if not conn.recv(65536):
                return

    server = raw_server(overlong)
    with Fetcher(server.url, timeout=5.0, max_body_bytes=1 << 20) as fetcher:
        for poll in range(4):
            assert len(interpret(fetcher.fetch(), None, timestamp=float(poll)).readings) == 2


def test_a_charset_python_decodes_in_quadratic_time_is_read_as_utf8() -> None:
    # charset=punycode: 2 MB of "-baba..." took minutes to decode on the fetcher's event loop, and
    # every later poll timed out until the decode ended; Prometheus reads every body as UTF-8
    from kvwatch.fetch import decode_body

    body = b"-" + b"ba" * 1_000_000
    assert decode_body(body, "punycode", "") == body.decode()
    assert decode_body("é".encode("latin-1"), "ISO-8859-1", "") == "é"  # a declared Latin-1 page is still read so


@pytest.mark.parametrize("charset", ["utf-16", "ISO-8859-1", "latin1"])
def test_a_utf8_page_under_another_declared_charset_is_read_as_utf8(charset: str) -> None:
    # Prometheus reads every body as UTF-8. Declared UTF-16, a UTF-8 page failed as a line of mojibake ("invalid
    # metric name"); declared Latin-1, a model name beyond ASCII was garbled with kvwatch_up at 1.
    from kvwatch.fetch import decode_body

    page = 'vllm:num_requests_running{model_name="模型-é"} 1\n'
    assert decode_body(page.encode(), charset, "") == page
    assert decode_body(page.encode("utf-16"), "utf-16", "") == page  # (with its BOM, UTF-16 is read as declared)


def test_cookies_a_target_sets_are_never_sent_back() -> None:
    # a target setting 20 new cookies an answer: the request's headers grew past 16 KiB within
    # 20 s, and a server refusing such headers (uvicorn: 431) failed every poll from then on
    sent: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("Cookie"))
        return httpx.Response(200, text=FIXTURE, headers=[("Set-Cookie", f"c{len(sent)}_{i}=v; Path=/")
                                                          for i in range(20)])

    with respx.mock:
        respx.get(URL).mock(side_effect=answer)
        with Fetcher(URL, timeout=2.0, max_body_bytes=1 << 20) as fetcher:
            for _ in range(3):
                fetcher.fetch()
    assert sent == [None, None, None]


@pytest.mark.parametrize(("status", "location"), [
    (b"304 Not Modified", None), (b"300 Multiple Choices", None), (b"302 Found", None),
    (b"302 Found", b"http://127.0.0.1:99999/metrics"),
    # Go's client (and so Prometheus) follows 301, 302, 303, 307 and 308 only: another 3xx with a Location is the
    # target's answer
    (b"300 Multiple Choices", b"/metrics"), (b"304 Not Modified", b"/metrics"), (b"305 Use Proxy", b"/metrics"),
])
def test_a_redirect_that_leads_nowhere_is_a_target_failure_not_internal(raw_server: Callable, status: bytes,
                                                                        location: bytes | None) -> None:
    # KeyError 'Location' and OverflowError from the socket: counted "internal", with a traceback
    where = b"Location: %s\r\n" % location if location else b""
    server = raw_server(lambda conn: conn.sendall(
        b"HTTP/1.1 %s\r\n%sContent-Length: 0\r\nConnection: close\r\n\r\n" % (status, where)))
    with Fetcher(server.url, timeout=2.0, max_body_bytes=1 << 20) as fetcher, pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    followed = status.startswith(b"302")
    assert info.value.reason == ("connect" if location and followed else "http_status")
    said = "answered HTTP" if not followed else "no such port" if location else "without a Location"
    assert said in str(info.value)


def test_a_body_compressed_twice_is_named_as_such(raw_server: Callable) -> None:
    # it was reported as "the response did not say so (no Content-Encoding: gzip header)"
    once = gzip.compress(FIXTURE.encode())
    for label, body in ((b"gzip", gzip.compress(once)), (b"gzip, gzip", once)):
        url = raw_server(lambda conn, label=label, body=body: conn.sendall(
            HEAD_200 + b"Content-Encoding: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (label, len(body))
            + body)).url
        with Fetcher(url, timeout=2.0, max_body_bytes=1 << 20) as fetcher, pytest.raises(ScrapeError) as caught:
            fetcher.fetch()
        assert caught.value.reason == "parse" and "gzip twice" in str(caught.value), label
        assert "did not say so" not in str(caught.value)


def test_an_undecodable_body_is_refused_without_holding_a_copy_of_it() -> None:
    # Raised inside the except block, the error kept the UnicodeDecodeError as its __context__, and that a copy of the
    # whole body: a 16 MiB page with one bad byte took the sidecar past 360 MB in a minute of failed polls.
    from kvwatch.fetch import decode_body

    for body in (b"vllm:x 1\n" * 1000 + b"\xff\n", b"\x1f\x8b" + b"\xff" * 100):
        with pytest.raises(ScrapeError) as raised:
            decode_body(body, None, "t")
        error: BaseException | None = raised.value
        while error is not None:
            assert not isinstance(error, UnicodeDecodeError)
            error = error.__context__ or error.__cause__
    # (so a JSON body that is no JSON: the JSONDecodeError's .doc is the whole body)
    from kvwatch.engines.detect import read_payload
    from kvwatch.exposition import ParseError

    with pytest.raises(ParseError) as refused:
        read_payload('[{"iter": ' + "x" * 1000, timestamp=0.0)
    assert refused.value.__context__ is None


@pytest.mark.parametrize("password", ["RedirPW", "JWTPART" * 40, "Pa?ssXY"])
def test_a_redirect_that_leads_nowhere_is_named_without_its_credentials(raw_server: Callable, password: str) -> None:
    # (a long one was cut before its @ and shown whole; one with a '?' came back in httpx's "Invalid port: 'Pa'")
    location = f"http://ru:{password}@localhost:{99999 if '?' not in password else 80}/m".encode()
    server = raw_server(lambda conn: conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: " + location +
                                                  b"\r\nContent-Length: 0\r\n\r\n"))
    with Fetcher(server.url, timeout=2.0, max_body_bytes=4096) as fetcher, pytest.raises(ScrapeError) as info:
        fetcher.fetch()
    assert info.value.reason == "connect" and password[:2] + "'" not in str(info.value)
    assert password[:6] not in str(info.value)
