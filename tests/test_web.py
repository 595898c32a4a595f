"""kvwatch's own endpoint: the exporter-toolkit web config (real TLS handshakes, real bcrypt), reloads,
plain HTTP refused under TLS, render caching and quiet client disconnects."""

from __future__ import annotations

import contextlib
import datetime
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import Gauge
from prometheus_client.registry import CollectorRegistry

from kvwatch.serve.web import MetricsServer, RenderCache, WebConfigError, WebConfigWatcher, load_web_config

PASSWORD = "correct horse"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
           *, ca: bool, san: str | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject))
               .issuer_name(issuer[0] if issuer else _name(subject)).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _pem(obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA, a server certificate for localhost and a client certificate, as PEM files."""
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("kvwatch test CA", ca_key, None, ca=True)
    for name, san in (("server", "localhost"), ("client", None)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(name, key, (ca.subject, ca_key), ca=False, san=san)
        (d / f"{name}.crt").write_bytes(_pem(cert))
        (d / f"{name}.key").write_bytes(_pem(key))
    (d / "ca.crt").write_bytes(_pem(ca))
    return d


def write_config(path: Path, *, tls: bool = True, users: dict[str, str] | None = None, client_auth: str = "") -> Path:
    lines = []
    if tls:
        lines += ["tls_server_config:", "  cert_file: server.crt", "  key_file: server.key"]
        if client_auth:
            lines += [f"  client_auth_type: {client_auth}", "  client_ca_file: ca.crt"]
    if users:
        lines.append("basic_auth_users:")
        lines += [f"  {u}: {bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}" for u, p in users.items()]
    config = path / "web-config.yml"
    config.write_text("\n".join(lines) + "\n")
    return config


class Running:
    def __init__(self, config: Path | None) -> None:
        registry = CollectorRegistry()
        Gauge("kvwatch_up", "test", registry=registry).set(1)
        self.server = MetricsServer(("127.0.0.1", 0), RenderCache(registry, lambda: (1,)), WebConfigWatcher(config))
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator:
    running: list[Running] = []

    def start(config: Path | None) -> Running:
        running.append(Running(config))
        return running[-1]

    yield start
    for r in running:
        r.close()


@pytest.fixture
def accepted_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Silent connections accepted at once (no TCP_DEFER_ACCEPT), as on a platform without it or once a silent client
    has outlasted DEFER_ACCEPT_SECONDS: the idle connections the slot rules are for, without waiting for the kernel."""
    from kvwatch.serve import web

    monkeypatch.setattr(web, "DEFER_ACCEPT_SECONDS", 0)


def test_tls_and_basic_auth_with_a_real_handshake_and_real_bcrypt(pki: Path, serve) -> None:
    server = serve(write_config(pki, users={"prometheus": PASSWORD}))
    url = f"https://localhost:{server.port}/metrics"
    ok = httpx.get(url, verify=ssl.create_default_context(cafile=pki / "ca.crt"), auth=("prometheus", PASSWORD))
    assert ok.status_code == 200 and "kvwatch_up 1.0" in ok.text
    for auth in (("prometheus", "wrong"), ("nobody", PASSWORD), None):
        denied = httpx.get(url, verify=ssl.create_default_context(cafile=pki / "ca.crt"), auth=auth)
        assert denied.status_code == 401 and "kvwatch_up" not in denied.text
        assert denied.headers["WWW-Authenticate"].startswith("Basic")
    # The kubelet's probe sends no credentials: /healthz answers (over TLS), and says nothing else.
    health = httpx.get(f"https://localhost:{server.port}/healthz", verify=ssl.create_default_context(
        cafile=pki / "ca.crt"))
    assert health.status_code == 200 and health.text == "ok\n"
    with pytest.raises(httpx.ConnectError):  # a client that does not trust the CA gets no metrics
        httpx.get(url, auth=("prometheus", PASSWORD))


def test_plain_http_is_refused_when_tls_is_configured(pki: Path, serve) -> None:
    server = serve(write_config(pki))
    answer = httpx.get(f"http://127.0.0.1:{server.port}/metrics")
    assert answer.status_code == 400 and "HTTPS" in answer.text and "kvwatch_up" not in answer.text


def test_client_certificates_are_required_when_configured(pki: Path, tmp_path: Path, serve) -> None:
    server = serve(write_config(pki, client_auth="RequireAndVerifyClientCert"))
    url = f"https://localhost:{server.port}/metrics"
    context = ssl.create_default_context(cafile=pki / "ca.crt")
    without = httpx.get(url, verify=context)
    assert without.status_code == 403 and "kvwatch_up" not in without.text
    # the kubelet's HTTPS probe sends no certificate: a handshake that required one failed every
    # probe, and the chart's sidecar was restarted in a loop (and vLLM's pod left its Service)
    health = httpx.get(f"https://localhost:{server.port}/healthz", verify=context)
    assert health.status_code == 200 and health.text == "ok\n"
    stranger_key = ec.generate_private_key(ec.SECP256R1())  # a certificate the client CA did not sign
    (tmp_path / "stranger.crt").write_bytes(_pem(_issue("stranger", stranger_key, None, ca=False)))
    (tmp_path / "stranger.key").write_bytes(_pem(stranger_key))
    untrusted = ssl.create_default_context(cafile=pki / "ca.crt")
    untrusted.load_cert_chain(tmp_path / "stranger.crt", tmp_path / "stranger.key")
    with pytest.raises(httpx.HTTPError):
        httpx.get(url, verify=untrusted)
    base = f"https://localhost:{server.port}"
    for path in ("/metrics?x=1", "//metrics", "/metrics/", "/healthz/../metrics"):  # no other way in
        answer = httpx.get(base + path, verify=context)
        assert answer.status_code == 403 and "kvwatch_up" not in answer.text, path
    assert httpx.head(url, verify=context).status_code == 403
    assert httpx.get(f"{base}/healthz?probe=1", verify=context).status_code == 200
    context.load_cert_chain(pki / "client.crt", pki / "client.key")
    assert httpx.get(url, verify=context).status_code == 200


def test_the_config_is_reloaded_when_it_changes(pki: Path, tmp_path: Path, serve,
                                               caplog: pytest.LogCaptureFixture) -> None:
    for name in ("server.crt", "server.key", "ca.crt"):
        (tmp_path / name).write_bytes((pki / name).read_bytes())
    config = write_config(tmp_path, tls=False, users={"a": "one"})
    server = serve(config)
    url = f"http://127.0.0.1:{server.port}/metrics"
    assert httpx.get(url, auth=("a", "one")).status_code == 200
    time.sleep(0.01)
    write_config(tmp_path, tls=False, users={"a": "two"})  # the password rotated
    assert httpx.get(url, auth=("a", "one")).status_code == 401
    assert httpx.get(url, auth=("a", "two")).status_code == 200
    with caplog.at_level(logging.ERROR, logger="kvwatch"):
        config.write_text("basic_auth_users: [not, a, mapping\n")  # a broken edit keeps the last good config
        assert httpx.get(url, auth=("a", "two")).status_code == 200
        assert httpx.get(url, auth=("a", "two")).status_code == 200
        time.sleep(0.01)
        config.write_text("basic_auth_users: [1, 2]\n")  # valid YAML of the wrong shape: the same
        assert httpx.get(url, auth=("a", "two")).status_code == 200
        assert httpx.get(url, auth=("a", "two")).status_code == 200
    assert sum("not reloaded" in r.getMessage() for r in caplog.records) == 2
    time.sleep(0.01)
    with caplog.at_level(logging.ERROR, logger="kvwatch"):
        config.write_text("")  # emptied (a rewrite caught half-way): basic auth stays on, where it went off
        assert httpx.get(url).status_code == 401
    assert "would turn basic auth off" in caplog.text
    write_config(tmp_path, tls=True)  # TLS switched on: plain HTTP is refused from the next connection
    assert httpx.get(url).status_code == 400
    context = ssl.create_default_context(cafile=tmp_path / "ca.crt")
    https = f"https://localhost:{server.port}/metrics"
    assert httpx.get(https, verify=context).status_code == 200
    time.sleep(0.01)
    with caplog.at_level(logging.ERROR, logger="kvwatch"):
        config.write_text("")  # and never off again by a reload: it served /metrics in the clear
        assert httpx.get(https, verify=context).status_code == 200
    assert "it turns TLS off" in caplog.text


@pytest.mark.parametrize(("text", "complaint"), [
    # (ssl's "[Errno 2] No such file or directory" named no file)
    ("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n",
     "tls_server_config.cert_file .*missing.crt: no such file"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: nope.crt\n",
     "tls_server_config.client_ca_file .*nope.crt: no such file"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAnyClientCert\n",
     "RequireAnyClientCert"),
    ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
     "cipher_suites"),
    ("basic_auth_users:\n  alice: plaintext\n", "bcrypt"),
    ("basic_auth_user:\n  alice: x\n", "unknown key"),
    # a value of the wrong shape (tracebacks at start, and every request dropped after a reload)
    ("basic_auth_users: [1, 2]\n", "basic_auth_users must be a mapping"),
    ("basic_auth_users: hello\n", "basic_auth_users must be a mapping"),
    ("http_server_config: {headers: [a, b]}\n", "http_server_config.headers must be a mapping"),
    # as exporter-toolkit: its five headers only, its values where it checks them, and no other key
    ("http_server_config:\n  header: {X-Frame-Options: deny}\n", "unknown key.*http_server_config.header\\b"),
    ("http_server_config: {http2: maybe}\n", "http2 must be true or false"),
    ("http_server_config: {headers: {X-Note: hi}}\n", "'X-Note' can not be configured"),
    ("http_server_config: {headers: {X-Frame-Options: allow}}\n", "X-Frame-Options must be one of deny, sameorigin"),
    # a block scalar's value ends in a newline: written as it was, it ended the response's headers early
    ("http_server_config:\n  headers:\n    Content-Security-Policy: |\n      default-src 'none'\n",
     "Content-Security-Policy must be one line"),
    ("tls_server_config: {client_auth_type: [x]}\n", "client_auth_type must be a string"),
    ("tls_server_config: {cert_file: [x], key_file: y}\n", "cert_file must be a string"),
])
def test_unusable_configs_are_refused_naming_what_is_wrong(pki: Path, text: str, complaint: str) -> None:
    config = pki / "bad.yml"
    config.write_text(text)
    with pytest.raises(WebConfigError, match=complaint):
        load_web_config(config)


def test_a_header_value_yaml_reads_as_a_number_is_its_text(pki: Path) -> None:
    # X-XSS-Protection: 0 (OWASP's advice) is a YAML integer; exporter-toolkit reads it as "0", and kvwatch refused it
    config = pki / "xss.yml"
    config.write_text("http_server_config:\n  headers:\n    X-XSS-Protection: 0\n    X-Frame-Options: deny\n")
    assert load_web_config(config).headers == {"X-XSS-Protection": "0", "X-Frame-Options": "deny"}
    # as written, as Go's yaml reads it: 010 is no 8, yes no true
    config.write_text("http_server_config:\n  headers:\n    X-XSS-Protection: 010\n    Content-Security-Policy: yes\n")
    assert load_web_config(config).headers == {"X-XSS-Protection": "010", "Content-Security-Policy": "yes"}


def test_bad_web_config_stops_serve_with_exit_2(pki: Path, capsys: pytest.CaptureFixture[str],
                                                 no_kvwatch_env: None) -> None:
    from kvwatch.cli import main

    config = pki / "bad2.yml"
    config.write_text("basic_auth_users:\n  alice: plaintext\n")
    assert main(["serve", "--web-config-file", str(config)]) == 2
    assert "--web-config-file" in capsys.readouterr().err


def _counting_registry(**kwargs: bool) -> tuple[CollectorRegistry, list[int]]:
    """A registry of one kvwatch_up gauge, and the list that grows by one each time it is rendered."""
    registry, calls = CollectorRegistry(**kwargs), []

    class Counting:
        def collect(self):
            calls.append(1)
            yield from Gauge("kvwatch_up", "x", registry=None).collect()

    registry.register(Counting())  # type: ignore[arg-type]
    return registry, calls


def test_a_state_is_rendered_once_however_many_scrape_it() -> None:
    registry, calls = _counting_registry()
    state = [object()]
    cache = RenderCache(registry, lambda: (state[0], True))
    bodies = {cache.body("")[0] for _ in range(50)}
    assert len(calls) == 1 and len(bodies) == 1
    state[0] = object()
    cache.body("")
    assert len(calls) == 2


def test_the_render_cache_keeps_a_few_content_types_and_an_odd_version_gets_the_text_format() -> None:
    # prometheus_client echoes Accept's version into the content type: a client inventing one per request kept a
    # body each (296 MB of RSS), and "version=abc" raised TypeError (no answer, a traceback logged per request).
    from kvwatch.serve.web import MAX_RENDERED_TYPES

    registry, renders = _counting_registry()
    cache = RenderCache(registry, lambda: (1,))
    cache.body("")  # the real scraper's type, asked for between the inventions: kept, never rendered again
    for i in range(100):
        cache.body(f"application/openmetrics-text; version=1.0.{i}")
        cache.body("")
    assert len(cache._bodies) == MAX_RENDERED_TYPES and len(renders) == 1 + 100
    body, content_type = cache.body("application/openmetrics-text; version=abc")
    assert content_type.startswith("text/plain; version=0.0.4") and b"kvwatch_up 0.0" in body


def test_openmetrics_asked_to_escape_values_keeps_kvwatchs_names() -> None:
    # prometheus_client wrote U__kvwatch__up under "# TYPE kvwatch_up" for escaping=values (Prometheus 3's
    # metric_name_escaping_scheme: values): such a job stored no kvwatch_* series, and every alert went silent.
    registry, _ = _counting_registry()
    cache = RenderCache(registry, lambda: (1,))
    for accept in ("application/openmetrics-text;version=1.0.0;escaping=values",
                   "application/openmetrics-text; version=1.0.0; escaping=values; q=0.6,text/plain;q=0.5"):
        body, content_type = cache.body(accept)
        assert content_type.startswith("application/openmetrics-text") and "escaping=underscores" in content_type
        assert b"\nkvwatch_up 0.0" in body and b"U__" not in body


def test_a_new_state_is_rendered_even_where_an_old_one_lived() -> None:
    # The cache compared id(state): once the cached State was freed, CPython handed its address to a later
    # State and the older poll's body was served (up to 3 % of scrapes when Prometheus scraped less often than
    # kvwatch polled). Equal-looking states that are different objects must each be rendered.
    registry, calls = _counting_registry(auto_describe=False)
    current: list[object] = [object()]
    cache = RenderCache(registry, lambda: (current[0], True))
    for _ in range(200):
        cache.body("")
        current[0] = object()  # the previous State is only referenced by the cache now
    assert len(calls) == 200


def test_clients_that_hang_up_leave_no_traceback(serve, caplog: pytest.LogCaptureFixture) -> None:
    server = serve(None)
    with caplog.at_level(logging.DEBUG, logger="kvwatch"):
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            s.close()
        time.sleep(0.3)
        assert httpx.get(f"http://127.0.0.1:{server.port}/metrics").status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_head_answers_like_get_without_a_body(serve) -> None:
    # Load balancers and uptime checks probe with HEAD; BaseHTTPRequestHandler answers it 501 unless told.
    server = serve(None)
    for path, length in (("/healthz", "3"), ("/metrics", None)):
        head = httpx.head(f"http://127.0.0.1:{server.port}{path}")
        get = httpx.get(f"http://127.0.0.1:{server.port}{path}")
        assert head.status_code == get.status_code == 200 and head.content == b""
        assert head.headers["Content-Length"] == (length or str(len(get.content)))


def _trickle_until_cut(clients: list, seconds: float = 10.0) -> bool:
    """Send each client a byte every 0.2 s (each within the per-read timeout); True once the server cut them all."""
    cut = [False] * len(clients)
    for _ in range(int(seconds / 0.2)):
        for i, client in enumerate(clients):
            if cut[i]:
                continue
            try:
                client.sendall(b"G")
                cut[i] = client.recv(1) == b""
            except TimeoutError:
                continue
            except OSError:  # (ssl.SSLError too)
                cut[i] = True
        if all(cut):
            return True
    return False


@pytest.mark.parametrize("tls", [False, True])
def test_a_client_trickling_its_request_is_cut_at_the_deadline(pki: Path, serve, monkeypatch: pytest.MonkeyPatch,
                                                               tls: bool) -> None:
    # The socket timeout bounded each recv only: a header byte every few seconds held a thread for ever (1,500 such
    # clients: 1,504 threads, 76 MB). The whole exchange now has CLIENT_TIMEOUT, over TLS too (the deadline first
    # shut the socket object TLS had detached, and did nothing).
    from kvwatch.serve import web

    monkeypatch.setattr(web, "CLIENT_TIMEOUT", 0.5)
    server = serve(write_config(pki) if tls else None)
    context = ssl.create_default_context(cafile=pki / "ca.crt")
    clients = []
    for _ in range(2):
        raw = socket.create_connection(("127.0.0.1", server.port))
        clients.append(context.wrap_socket(raw, server_hostname="localhost") if tls else raw)
    for client in clients:
        client.settimeout(0.2)
    assert _trickle_until_cut(clients), "the server still waits for the trickling clients"
    scheme = "https" if tls else "http"
    assert httpx.get(f"{scheme}://localhost:{server.port}/metrics", verify=context).status_code == 200


def test_a_connection_past_the_cap_waits_for_a_working_one_to_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    # At most MAX_CONNECTIONS are served at once (a thread each). One more used to be closed after 0.5 s: 3 of 500
    # concurrent scrapes failed on a 2-core machine while every handler worked. It now waits in the accept loop as
    # long as its client would, and shutdown() still does not wait for it.
    from kvwatch.serve import web

    monkeypatch.setattr(web, "MAX_CONNECTIONS", 1)
    monkeypatch.setattr(web, "CLIENT_TIMEOUT", 30.0)
    server, blocking = _serving_blocked_scrapes()
    port = server.server_address[1]
    stopped = False
    try:
        working = socket.create_connection(("127.0.0.1", port), timeout=10.0)
        working.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        newcomer = socket.create_connection(("127.0.0.1", port), timeout=10.0)
        newcomer.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        time.sleep(1.5)  # past the old 0.5 s
        blocking.release.set()
        assert working.recv(12) == b"HTTP/1.0 200"
        assert newcomer.recv(12) == b"HTTP/1.0 200"
        working.close()
        newcomer.close()
        # A newcomer waiting for a slot holds up no shutdown.
        blocking.release.clear()
        working = socket.create_connection(("127.0.0.1", port), timeout=10.0)
        working.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        waiting = socket.create_connection(("127.0.0.1", port), timeout=10.0)
        waiting.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        time.sleep(0.5)
        started = time.monotonic()
        server.shutdown()
        stopped = True
        assert time.monotonic() - started < 10.0  # not the waiting client's CLIENT_TIMEOUT
        blocking.release.set()
        working.close()
        waiting.close()
    finally:
        blocking.release.set()
        if not stopped:
            server.shutdown()
        server.server_close()


def test_one_client_cannot_hold_every_connection(serve, monkeypatch: pytest.MonkeyPatch, accepted_at_once) -> None:
    # 128 half-sent requests from one client held every slot, and /healthz (the kubelet's
    # liveness probe) and /metrics failed for everyone until they timed out. A client gets MAX_PER_CLIENT at once;
    # another address is still served.
    from kvwatch.serve import web

    monkeypatch.setattr(web, "MAX_PER_CLIENT", 2)
    monkeypatch.setattr(web, "STALLED_AFTER", 60.0)  # (not yet stalled: see below)
    server = serve(None)
    holding = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    assert _eventually(lambda: _refused(f"http://127.0.0.1:{server.port}/healthz"))
    other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    assert other.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5.0).status_code == 200
    # Its own connections that have sent nothing for STALLED_AFTER give way to its next one: 32 of them, dripping a
    # byte a second, locked the node's kubelet (the same address) out of /healthz while slots were free.
    monkeypatch.setattr(web, "STALLED_AFTER", 0.2)
    time.sleep(0.3)
    assert httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5.0).status_code == 200
    for s in holding:
        s.settimeout(5.0)
    assert any(_closed_by_server(s) for s in holding)
    for s in holding:
        s.close()
    assert _eventually(lambda: not _refused(f"http://127.0.0.1:{server.port}/healthz"))


def test_a_request_head_over_its_budget_is_refused(serve) -> None:
    # The standard library caps a header line (64 KiB) and their count (100), not the block: 32 connections holding
    # 99 lines of 64 KB took the sidecar from 38 to 241 MB. A head over MAX_HEAD_BYTES is refused, as Go refuses one
    # over its 1 MiB.
    from kvwatch.serve import web

    server = serve(None)
    url = f"http://127.0.0.1:{server.port}/healthz"
    line = "x" * 4000
    assert httpx.get(url, headers={f"X-{i}": line for i in range(12)}, timeout=5.0).status_code == 200
    big = {f"X-{i}": line for i in range(web.MAX_HEAD_BYTES // 4000 + 1)}
    assert httpx.get(url, headers=big, timeout=5.0).status_code == 431


def _exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes and read the answer until the server closes; a socket timeout (the server waiting) raises."""
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_an_absolute_form_request_target_is_served_like_its_path(serve) -> None:
    # RFC 9112 section 3.2.2: a server must accept "GET http://host:port/metrics", as proxies send it; it was a 404.
    server = serve(None)
    for target, status, text in ((f"http://127.0.0.1:{server.port}/metrics?x=1", b"200", b"kvwatch_up 1.0"),
                                 ("HTTP://kvwatch/healthz", b"200", b"ok\n"), ("http://kvwatch", b"404", b"not found")):
        answer = _exchange(server.port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        assert answer.split(b" ")[1] == status and text in answer, target


def test_an_http_0_9_request_is_refused_at_once(serve) -> None:
    # Its request line has no version and no headers follow: waiting for them held the connection for CLIENT_TIMEOUT.
    server = serve(None)
    for line in (b"GET /metrics\r\n", b"GET /metrics\n"):
        answer = _exchange(server.port, line)  # (a wait would raise socket.timeout after 5 s)
        assert answer.startswith(b"HTTP/1.0 400 ") and b"kvwatch_up" not in answer
    assert httpx.get(f"http://127.0.0.1:{server.port}/metrics").status_code == 200


@pytest.mark.parametrize("tls", [False, True])
def test_stalled_connections_give_way_to_a_new_client(pki: Path, serve, monkeypatch: pytest.MonkeyPatch,
                                                      tls: bool, accepted_at_once) -> None:
    # five addresses × MAX_PER_CLIENT idle connections held all 128 slots, and /healthz from a
    # sixth failed 23 times in 30. With every slot taken, a newcomer takes the slot of a connection that has sent no
    # request for STALLED_AFTER seconds: before a TLS handshake and in the middle of one too.
    from kvwatch.serve import web

    monkeypatch.setattr(web, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(web, "MAX_PER_CLIENT", 2)
    monkeypatch.setattr(web, "STALLED_AFTER", 60.0)
    server = serve(write_config(pki) if tls else None)
    stalled = []
    for i in range(4):
        s = socket.create_connection(("127.0.0.1", server.port), source_address=(f"127.0.0.{2 + i // 2}", 0))
        if tls and i % 2:
            s.sendall(b"\x16\x03")  # the first bytes of a ClientHello, and no more
        stalled.append(s)
    scheme, verify = ("https", ssl.create_default_context(cafile=pki / "ca.crt")) if tls else ("http", True)
    newcomer = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.9", verify=verify))
    url = f"{scheme}://localhost:{server.port}/healthz"

    def refused() -> bool:
        try:
            return newcomer.get(url, timeout=5.0).status_code != 200
        except httpx.HTTPError:
            return True

    assert _eventually(refused)  # every slot is taken, and none stalled long enough to give way
    monkeypatch.setattr(web, "STALLED_AFTER", 0.2)
    time.sleep(0.3)
    assert newcomer.get(url, timeout=5.0).status_code == 200
    for s in stalled:
        s.settimeout(5.0)
    closed = [s for s in stalled if _closed_by_server(s)]
    assert closed, "no stalled connection was closed to make room"


class _BlockingCollector:
    """A collector whose scrape waits for an event: a /metrics request that holds its slot while it works."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def collect(self) -> Iterator:
        self.release.wait(10.0)
        yield from ()


def _serving_blocked_scrapes() -> tuple[MetricsServer, _BlockingCollector]:
    """A running server whose /metrics scrapes wait for the collector's release (each holds its slot meanwhile)."""
    registry = CollectorRegistry()
    blocking = _BlockingCollector()
    registry.register(blocking)  # type: ignore[arg-type]
    server = MetricsServer(("127.0.0.1", 0), RenderCache(registry, lambda: (object(),)), WebConfigWatcher(None))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, blocking


@contextlib.contextmanager
def _two_slots_blocked_scrapes(monkeypatch: pytest.MonkeyPatch, stalled_after: float) -> Iterator:
    """(port, collector) of a running server with 2 slots whose /metrics scrapes wait for the collector's release;
    released and shut down on leaving."""
    from kvwatch.serve import web

    monkeypatch.setattr(web, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(web, "STALLED_AFTER", stalled_after)
    server, blocking = _serving_blocked_scrapes()
    try:
        yield server.server_address[1], blocking
    finally:
        blocking.release.set()
        server.shutdown()
        server.server_close()


def test_a_connection_that_sent_its_request_keeps_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a connection that has sent no request head may be evicted: scrapes being answered keep their slots.
    with _two_slots_blocked_scrapes(monkeypatch, stalled_after=0.0) as (port, blocking):
        working = []
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", port), timeout=10.0)
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            working.append(s)
        assert _eventually(lambda: _refused(f"http://127.0.0.1:{port}/healthz"))
        blocking.release.set()
        for s in working:
            assert s.recv(12) == b"HTTP/1.0 200"
            s.close()


def test_a_client_slow_to_send_its_request_is_not_taken_for_an_idle_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # A client that a busy CPU kept from sending its request for STALLED_AFTER after connecting had already been
    # accepted, and a newcomer finding every slot taken evicted it as idle: 1 of 500 concurrent scrapes failed in a
    # CI run. The kernel now hands kvwatch a connection once its client has sent something (TCP_DEFER_ACCEPT).
    with _two_slots_blocked_scrapes(monkeypatch, stalled_after=0.1) as (port, blocking):
        slow = socket.create_connection(("127.0.0.1", port), timeout=10.0)  # connected; its request comes later
        time.sleep(0.3)
        working = socket.create_connection(("127.0.0.1", port), timeout=10.0)
        working.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # holds a slot until released
        newcomer = socket.create_connection(("127.0.0.1", port), timeout=10.0)
        newcomer.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert newcomer.recv(12) == b"HTTP/1.0 200"
        slow.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert slow.recv(12) == b"HTTP/1.0 200"
        blocking.release.set()
        assert working.recv(12) == b"HTTP/1.0 200"
        for s in (slow, working, newcomer):
            s.close()


def _closed_by_server(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except OSError:
        return True


def _refused(url: str) -> bool:
    """True when the server closes the request unanswered (no slot); False when it answers 200."""
    try:
        return httpx.get(url, timeout=5.0).status_code != 200
    except httpx.HTTPError:
        return True


def _eventually(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_an_inline_certificate_serves_tls_with_no_writable_temporary_directory(
        pki: Path, tmp_path: Path, serve, monkeypatch: pytest.MonkeyPatch) -> None:
    # exporter-toolkit's inline `cert`/`key`: written to a temporary file, which the chart's read-only root
    # filesystem (no writable /tmp) refused, and kvwatch exited 2 with vLLM's pod not ready.
    import tempfile
    import textwrap

    config = tmp_path / "web-config.yml"
    indent = "    "
    config.write_text("tls_server_config:\n  cert: |\n" + textwrap.indent((pki / "server.crt").read_text(), indent)
                      + "  key: |\n" + textwrap.indent((pki / "server.key").read_text(), indent))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))
    server = serve(config)
    ok = httpx.get(f"https://localhost:{server.port}/healthz",
                   verify=ssl.create_default_context(cafile=pki / "ca.crt"))
    assert ok.status_code == 200


def test_healthz_fails_with_its_reason_once_polling_stopped() -> None:
    # /healthz said 200 while the process served, whatever its polls did: a stalled poll thread was never restarted
    # by the liveness probe. The server asks why it would fail; None is healthy.
    registry = CollectorRegistry()
    why: list[str | None] = [None]
    server = MetricsServer(("127.0.0.1", 0), RenderCache(registry, lambda: (1,)), WebConfigWatcher(None),
                           lambda: why[0])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    try:
        assert (httpx.get(url).status_code, httpx.get(url).text) == (200, "ok\n")
        why[0] = "no poll has finished for --stale-after-seconds 15 s: polling stopped\n"
        answer = httpx.get(url)
        assert answer.status_code == 503 and "polling stopped" in answer.text
        assert httpx.get(url.replace("/healthz", "/metrics")).status_code == 200  # the metrics still answer
    finally:
        server.shutdown()
        server.server_close()


def test_polls_stalled_counts_from_the_last_finished_poll_good_or_bad() -> None:
    import respx

    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar, polls_stalled
    from kvwatch.settings import ServeSettings

    url = "http://vllm.test/metrics"
    # (a polling window of 5 + 2 x 2.5 + 5 s + 1 s for the 1 MiB body cap = 16 s)
    settings = ServeSettings(target_url=url, poll_interval_seconds=5, poll_timeout_seconds=2.5, stale_after_seconds=5,
                             max_body_bytes=1 << 20)
    t = [1000.0]
    with respx.mock, Fetcher(url, timeout=1.0, max_body_bytes=1 << 20) as fetcher:
        respx.get(url).mock(return_value=httpx.Response(503))  # a target that is down: polls still finish
        sidecar = Sidecar(settings, fetcher, lambda: t[0])
        stalled = polls_stalled(sidecar, lambda: t[0], settings)
        t[0] += 16.0
        assert stalled() is None  # (from the start before the first poll)
        t[0] += 1.0
        assert "polling stopped" in (stalled() or "")
        assert not sidecar.poll().health.up
        assert stalled() is None
        t[0] += 17.0
        assert "no poll has ended for 16 s" in (stalled() or "")


def test_a_poll_running_to_its_timeout_is_no_stall() -> None:
    # The rule first counted from when the last poll began: with --stale-after-seconds near the
    # interval and a target that never answers (each poll runs to its timeout), /healthz was 503 for most of every
    # interval, and the liveness probe could restart kvwatch for vLLM's outage. It counts from when a poll ended.
    from kvwatch.serve.state import State

    began, ended = 1000.0, 1000.8
    state = State(timestamp=began, finished=ended)
    assert state.polling(ended + 1.0, 1.0) and not state.polling(ended + 1.01, 1.0)


def test_the_polling_window_outlasts_the_longest_poll_at_the_tightest_settings() -> None:
    # A poll is its fetch and its GPU read, each up to --poll-timeout-seconds, and a poll longer
    # than the interval skips a tick: at --stale-after-seconds = the interval, polls of a target that never answers
    # beside a hung NVML read ended 2 intervals apart, past stale-after + one timeout, and /healthz flapped 503.
    from kvwatch.serve.app import polling_window
    from kvwatch.settings import ServeSettings

    tight = ServeSettings(poll_interval_seconds=0.5, poll_timeout_seconds=0.4, stale_after_seconds=0.5)
    # Two poll ends are at most a skipped tick's interval plus the next poll's fetch and GPU read apart (plus its
    # parse): the window was stale-after + one timeout (0.9 s) and polls ended 1.0 s apart.
    assert polling_window(tight) >= 2 * 0.5 + 2 * 0.4
    assert polling_window(ServeSettings(clock_speed=10.0)) == 10 * polling_window(ServeSettings())
    # The parse of a body at the cap too: a valid 64 MiB NIM page took 41.5 s to read, and /healthz answered 503
    # (for 15 s of every poll) where the window left 28 s at any cap.
    big = ServeSettings(max_body_bytes=64 << 20)
    assert polling_window(big) - polling_window(ServeSettings()) == 48 and polling_window(big) > 41.5 + 5


def test_a_password_longer_than_bcrypt_reads_is_checked_on_its_first_72_bytes(tmp_path: Path, serve) -> None:
    # bcrypt reads 72 bytes: bcrypt 4 cut an 80-byte password there and let it in, bcrypt 5 raises
    # and the same config file answered 401, by the day the image was built. kvwatch cuts it as bcrypt always hashed.
    long = "p" * 72 + "-and-more"
    server = serve(write_config(tmp_path, tls=False, users={"prometheus": long[:72]}))
    url = f"http://127.0.0.1:{server.port}/metrics"
    assert httpx.get(url, auth=("prometheus", long)).status_code == 200
    assert httpx.get(url, auth=("prometheus", "q" + long[1:])).status_code == 401


def test_a_flood_of_wrong_passwords_keeps_the_good_one_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cache kept every (user, password) checked, oldest out first: 256 wrong passwords pushed Prometheus' out,
    # and each real scrape paid for bcrypt again (median 6 ms to 69 ms, 1.07 s at worst).
    from kvwatch.serve.web import WebConfig

    config = WebConfig(users={"prom": bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4))})
    cache: dict[bytes, bool] = {}
    assert config.check_password("prom", "secret", cache)
    for i in range(300):
        assert not config.check_password("prom", f"guess-{i}", cache)
    checked = []
    monkeypatch.setattr(bcrypt, "checkpw", lambda *args: checked.append(args) or False)
    assert config.check_password("prom", "secret", cache) and not checked  # (from the cache: no bcrypt)
    # an unknown user pays for a bcrypt check too: answered at once, user names could be told by timing (21 vs 91 ms)
    assert not config.check_password("nobody", "secret", cache) and len(checked) == 1


def test_idle_connections_reopened_as_fast_as_they_close_give_way_within_a_fraction_of_a_second(
        serve, monkeypatch, accepted_at_once) -> None:
    # Churned from 20 addresses, 1,000 silent sockets kept every slot younger than the 2 s a slot had to be idle to
    # give way: /healthz and /metrics took 13 s (the kubelet's probe times out at 5). Idle for 0.3 s gives way now.
    from kvwatch.serve import web

    monkeypatch.setattr(web, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(web, "MAX_PER_CLIENT", 2)
    server = serve(None)
    idle = [socket.create_connection(("127.0.0.1", server.port), source_address=(f"127.0.0.{2 + i // 2}", 0))
            for i in range(4)]
    time.sleep(0.3)
    newcomer = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.9"))
    assert newcomer.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5.0).status_code == 200
    for s in idle:
        s.close()


def test_a_connection_whose_request_waits_unread_is_not_taken_for_an_idle_one() -> None:
    # A loaded node or a throttled container may not run a connection's thread within STALLED_AFTER: a client that
    # has sent its request is no idle one, and its slot must not go to a newcomer.
    from kvwatch.serve import web

    quiet_server, quiet_client = socket.socketpair()
    spoken_server, spoken_client = socket.socketpair()
    try:
        spoken_client.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        quiet = web._Connection("127.0.0.2", quiet_server, time.monotonic())
        spoken = web._Connection("127.0.0.3", spoken_server, time.monotonic())
        assert web._silent(quiet)
        assert _eventually(lambda: not web._silent(spoken))
        spoken_server.recv(1024)  # its thread read the request (and, say, waits for the rest): silent again
        assert web._silent(spoken)
        quiet_server.close()
        assert not web._silent(quiet)  # closed meanwhile: its thread frees the slot, no victim needed
    finally:
        for s in (quiet_server, quiet_client, spoken_server, spoken_client):
            s.close()


def test_an_unknown_user_costs_what_a_known_one_does_and_the_answer_names_no_python(tmp_path: Path, serve) -> None:
    # The decoy hash an unknown user is checked against was cost 10 beside cost-12 users: 4x faster, so a user name
    # could be told by time. And every answer's Server header named the Python version, unauthenticated.
    config = tmp_path / "web.yml"
    strong = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=12)).decode()
    weak = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    config.write_text(f"basic_auth_users:\n  alice: {strong}\n  bob: {weak}\n")
    decoy = load_web_config(config).decoy_hash
    assert decoy.startswith(b"$2b$12$") and not bcrypt.checkpw(b"pw", decoy)
    # a cost bcrypt refuses loaded, and made the decoy raise: an unknown user answered at once
    config.write_text(f"basic_auth_users:\n  alice: {strong}\n  eve: {strong[:4]}99{strong[6:]}\n")
    with pytest.raises(WebConfigError, match="eve is not a bcrypt hash"):
        load_web_config(config)
    server = serve(write_config(tmp_path, tls=False, users={"prometheus": PASSWORD}))
    denied = httpx.get(f"http://127.0.0.1:{server.port}/metrics", auth=("nobody", "x"))
    assert denied.status_code == 401 and denied.headers["Server"] == "kvwatch" and "Python" not in str(denied.headers)
    with socket.create_connection(("127.0.0.1", server.port)) as raw:  # (httpx strips a trailing blank)
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert b"\r\nServer: kvwatch\r\n" in raw.recv(4096)
