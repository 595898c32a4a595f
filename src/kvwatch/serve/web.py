"""kvwatch's own HTTP endpoint: /metrics and /healthz, optionally behind TLS and basic auth.

Built for a pod where anything may connect: a scrape renders the current State once per poll and every
other scrape of that State gets the same bytes (:class:`RenderCache`); a deep listen backlog takes bursts of
hundreds of connections; a client that hangs up or stalls costs one thread for at most ``CLIENT_TIMEOUT``
seconds in all and never a traceback in the log; at most ``MAX_CONNECTIONS`` are served at once, at most
``MAX_PER_CLIENT`` of them to one client address. When every slot is taken, a new connection takes the slot of one
that has not sent its request for ``STALLED_AFTER`` seconds (from the address holding the most), so a few addresses
holding idle connections cannot lock out Prometheus or the kubelet's probe; with none stalled, it waits for a slot.
On Linux a connection is accepted only once its client has sent something, or after about 3 s of silence
(TCP_DEFER_ACCEPT, ``DEFER_ACCEPT_SECONDS``), so a client slow to send its request is not taken for an idle one
unless it stays silent that long.

``--web-config-file`` reads the Prometheus exporter-toolkit web configuration (the file node_exporter's
``--web.config.file`` reads): ``tls_server_config`` (``cert_file``/``key_file`` or inline ``cert``/``key``,
``client_ca_file``, ``client_auth_type``, ``min_version``/``max_version``), ``basic_auth_users`` (bcrypt hashes) and
``http_server_config.headers`` (the toolkit's five headers; ``http2`` is accepted and HTTP/1.1 served). Like the
toolkit it is re-read when it changes (checked on each connection, with the files it names), so rotated certificates
and passwords need no restart; a bad edit keeps the last good configuration and is logged once. With TLS on, a
plain-HTTP request gets a 400 and no metrics. Basic auth guards /metrics; /healthz answers without it (kubelet
probes send no credentials, and it tells nothing but whether the process serves and its polls finish: 503 with why
once they stopped). So does ``client_auth_type`` RequireAndVerifyClientCert: the handshake verifies a certificate
when one is sent and /metrics answers 403 without one, but /healthz answers (the kubelet's HTTPS probe sends none:
the exporter-toolkit's handshake failure failed every probe and restarted the container). Not supported, and refused
at startup rather than ignored: ``client_auth_type`` RequestClientCert/RequireAnyClientCert (Python's ssl cannot
request a client certificate without verifying it), ``cipher_suites``, ``curve_preferences``,
``client_allowed_sans`` and ``rate_limit``."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import logging
import os
import re
import select
import socket
import ssl
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger("kvwatch")

FileStamp = tuple[int, int, int]  # mtime_ns, size, inode: a watched file changed when this did

CLIENT_TIMEOUT = 10.0
"""Seconds a client may take for the whole exchange (TLS handshake, request, response) before it is dropped."""
LISTEN_BACKLOG = 1024
"""Pending connections the kernel queues: a burst of hundreds of scrapes must not be refused."""
MAX_CONNECTIONS = 128
"""Connections served at once (a thread each); more wait in the backlog. 1,500 clients trickling a header byte
every 8 s held 1,504 threads and 76 MB, over the memory budget."""
MAX_HEAD_BYTES = 64 * 1024
"""A request's line and headers together (a scrape's are under 1 KiB; a bearer token a few KiB): more is refused
with 431, as Go's net/http refuses a head over its 1 MiB default (here 128 connections × 64 KiB is 8 MiB)."""
MAX_PER_CLIENT = 32
"""Connections one client address may hold at once: 128 half-sent requests from one client held every slot, and
the kubelet's /healthz probe and Prometheus' scrape failed until they timed out."""
SLOT_CHECK_SECONDS = 0.1
"""With every slot taken, how often the accept loop looks again for a stalled connection to end and for shutdown
while a new connection waits for a slot (up to CLIENT_TIMEOUT, when its client has given up too). Closed after
0.5 s instead, 3 of 500 concurrent scrapes failed on a 2-core machine while 128 handlers worked: the wait in the
listen backlog had become an error."""
STALLED_AFTER = 0.1
"""Seconds a connection may go without a complete request head before a newcomer may take its slot when all are
taken: five addresses × MAX_PER_CLIENT idle connections held every slot and /healthz from a sixth failed.
Scrapers and probes send their request at once; only a connection that has sent one keeps its slot. At 2 s, idle
connections reopened as fast as they were closed kept every slot younger than that: the accept loop waited
0.5 s for each newcomer, ~64 a second, and /healthz and /metrics queued behind 1,000 of them in the
listen backlog for 13 s (Prometheus' scrape timeout is 10 s). The victim is taken from the address holding the
most, so a lone scraper's connection is the last to go."""
DEFER_ACCEPT_SECONDS = 2
"""TCP_DEFER_ACCEPT (Linux): the kernel hands kvwatch a connection once its client has sent a byte, or once it has
been silent this long (rounded up to the SYN-ACK retransmission schedule: about 3 s). Without it a connection was
accepted before its client's request was sent, and a client that a busy CPU kept from sending it within
STALLED_AFTER was evicted as idle: 21 of 5,000 concurrent scrapes failed (10 bursts of 500, benchmarks/faults.py's)
on 2 cores with 2 busy loops, and 1 of 500 in a CI run with none; with it, 0 of 10,000 with 3 busy loops."""
_AUTH_CACHE_SIZE = 256
BCRYPT_PASSWORD_BYTES = 72  # what bcrypt hashes of a password

# The handshake's check; RequireAndVerifyClientCert's "require" is the handler's (/healthz answers without one).
CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_OPTIONAL,
}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                "TLS13": ssl.TLSVersion.TLSv1_3}
_TLS_KEYS = {"cert", "key", "cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version",
             "max_version", "prefer_server_cipher_suites"}
_REFUSED_TLS_KEYS = {"cipher_suites", "curve_preferences", "client_allowed_sans"}


class WebConfigError(ValueError):
    """The web configuration file is unusable; the message names the key or file."""


@dataclass(frozen=True)
class WebConfig:
    """One loaded web configuration: a TLS context (None: plain HTTP) and bcrypt hashes by user."""

    tls: ssl.SSLContext | None = None
    client_cert_required: bool = False  # RequireAndVerifyClientCert: /metrics needs a verified certificate
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    watched: tuple[Path, ...] = ()  # the config and every file it names, for reloads

    @property
    def decoy_hash(self) -> bytes:
        """The hash an unknown user is checked against: at the highest cost among the users', as exporter-toolkit's,
        so that the users at that cost cannot be told by time (a fixed cost 10 beside cost-12 hashes answered an
        unknown name 4x faster); a user whose hash has a lower cost still answers faster."""
        cost = max((int(h[4:6]) for h in self.users.values()), default=10)
        return _UNKNOWN_USER_HASH[:4] + b"%02d" % cost + _UNKNOWN_USER_HASH[6:]

    def check_password(self, user: str, password: str, cache: dict[bytes, bool]) -> bool:
        """bcrypt is slow by design (~50-100 ms at cost 10): each good (user, password, hash) is checked once. Only
        good ones are kept: a flood of wrong passwords pushed Prometheus' out of the cache, and every real scrape
        paid for bcrypt again (median 6 ms to 69 ms, 1.07 s at worst)."""
        hashed = self.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed or b""))).digest()
        if hashed is not None and key in cache:
            return True
        import bcrypt

        try:
            # bcrypt reads 72 bytes of a password: bcrypt 4 cut a longer one there, bcrypt 5 raises, so one
            # config file authenticated by the day the image was built. Cut here, as bcrypt always hashed. An
            # unknown user is checked against a fixed hash, and refused, as long as a known one takes (answered
            # at once, user names could be told by timing; exporter-toolkit does the same).
            good = bcrypt.checkpw(password.encode()[:BCRYPT_PASSWORD_BYTES], hashed or self.decoy_hash)
            good = good and hashed is not None
        except ValueError:  # a malformed hash was refused at load; be safe anyway
            good = False
        if good:
            if len(cache) >= _AUTH_CACHE_SIZE:
                cache.pop(next(iter(cache)))
            cache[key] = True
        return good


def load_web_config(path: Path) -> WebConfig:
    """Read and check an exporter-toolkit web configuration; WebConfigError says what is wrong."""
    import yaml

    try:
        text = path.read_text()
        data = yaml.safe_load(text) or {}
        # Every scalar as written, for the headers: Go's yaml reads a header value as its text (010, yes), where
        # safe_load's 8 and True would be sent as 8 and true.
        raw = yaml.load(text, Loader=yaml.BaseLoader) or {}
    except (OSError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)  # YAML's message spans lines, with the text and a caret
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise WebConfigError(f"cannot read {path}: {' '.join(str(problem).split())}{where}") from None
    if not isinstance(data, dict):
        raise WebConfigError(f"{path}: not a YAML mapping")
    unknown = set(data) - {"tls_server_config", "basic_auth_users", "http_server_config", "rate_limit"}
    if unknown:
        raise WebConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    if data.get("rate_limit"):
        raise WebConfigError(f"{path}: rate_limit is not supported by kvwatch")
    base = path.parent
    watched = [path]
    tls = None
    tls_data = data.get("tls_server_config")
    if tls_data:
        tls, files = _tls_context(tls_data, base, path)
        watched += files
    users: dict[str, bytes] = {}
    for user, hashed in _mapping(data.get("basic_auth_users"), "basic_auth_users", path).items():
        text = str(hashed or "")
        if not re.fullmatch(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}", text):
            # (a cost outside bcrypt's 04-31 loaded, and its ValueError at every check answered at once: no decoy)
            raise WebConfigError(f"{path}: basic_auth_users.{user} is not a bcrypt hash ($2y$10$...)")
        users[str(user)] = text.encode()
    http = _mapping(data.get("http_server_config"), "http_server_config", path)
    raw_http = raw.get("http_server_config") if isinstance(raw, dict) else None
    raw_headers = raw_http.get("headers") if isinstance(raw_http, dict) else None
    headers = _headers(http, raw_headers if isinstance(raw_headers, dict) else {}, path)
    required = bool(tls_data) and tls_data.get("client_auth_type") == "RequireAndVerifyClientCert"
    return WebConfig(tls=tls, client_cert_required=required, users=users, headers=headers, watched=tuple(watched))


# The headers exporter-toolkit lets a web config add, with the values it allows where it checks them (its
# extraHTTPHeaders; None: any value). Any other header is refused there, and here.
EXTRA_HTTP_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}


def _headers(http: dict[Any, Any], written: dict[Any, Any], path: Path) -> dict[str, str]:
    """``http_server_config``'s headers, checked as exporter-toolkit checks them; a value with a line break (a YAML
    block scalar ends in one) is refused too: written as it is, it ended the response's headers early, and
    Prometheus could read no /metrics answer."""
    unknown = set(http) - {"headers", "http2"}
    if unknown:
        raise WebConfigError(f"{path}: unknown key(s) {', '.join(f'http_server_config.{k}' for k in sorted(unknown))}")
    if "http2" in http and not isinstance(http["http2"], bool):
        raise WebConfigError(f"{path}: http_server_config.http2 must be true or false")
    headers = {}
    for name, value in _mapping(http.get("headers"), "http_server_config.headers", path).items():
        if name not in EXTRA_HTTP_HEADERS:
            raise WebConfigError(f"{path}: HTTP header {name!r} can not be configured (one of "
                                 f"{', '.join(EXTRA_HTTP_HEADERS)})")
        allowed = EXTRA_HTTP_HEADERS[name]
        if isinstance(value, (bool, int, float)) and isinstance(written.get(name), str):
            value = written[name]  # X-XSS-Protection: 0 (OWASP's advice) is a YAML integer: its text is the value
        if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            raise WebConfigError(f"{path}: http_server_config.headers.{name} must be one line of text")
        if allowed is not None and value not in allowed:
            raise WebConfigError(f"{path}: http_server_config.headers.{name} must be one of {', '.join(allowed)}, "
                                 f"not {value!r}")
        headers[name] = value
    return headers


def _mapping(value: Any, key: str, path: Path) -> dict[Any, Any]:
    """``value`` of ``key`` as a mapping ({} when absent): a list or a word there failed with a traceback."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{path}: {key} must be a mapping")
    return value


def _tls_context(config: Any, base: Path, path: Path) -> tuple[ssl.SSLContext, list[Path]]:
    if not isinstance(config, dict):
        raise WebConfigError(f"{path}: tls_server_config must be a mapping")
    for key, value in config.items():
        if key in _TLS_KEYS - {"prefer_server_cipher_suites"} and value is not None and not isinstance(value, str):
            raise WebConfigError(f"{path}: tls_server_config.{key} must be a string")
    refused = set(config) & _REFUSED_TLS_KEYS
    if refused:
        raise WebConfigError(f"{path}: tls_server_config.{sorted(refused)[0]} is not supported by kvwatch")
    unknown = set(config) - _TLS_KEYS
    if unknown:
        raise WebConfigError(f"{path}: unknown key tls_server_config.{sorted(unknown)[0]}")
    auth = config.get("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH_TYPES:
        raise WebConfigError(f"{path}: tls_server_config.client_auth_type {auth!r} is not supported by kvwatch "
                             f"(one of {', '.join(CLIENT_AUTH_TYPES)})")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _version(config.get("min_version") or "TLS12", "min_version", path)
    if config.get("max_version"):
        context.maximum_version = _version(config["max_version"], "max_version", path)
    files: list[Path] = []
    cert_file, key_file = config.get("cert_file"), config.get("key_file")
    if (config.get("cert") and cert_file) or (config.get("key") and key_file):
        raise WebConfigError(f"{path}: give tls_server_config cert or cert_file (key or key_file), not both")
    for key_name in ("cert_file", "key_file", "client_ca_file"):  # (ssl's own error names no file)
        named = config.get(key_name)
        if named and not (base / named).is_file():
            raise WebConfigError(f"{path}: tls_server_config.{key_name} {base / named}: no such file")
    try:
        if cert_file and key_file:
            cert, key = base / cert_file, base / key_file
            files += [cert, key]
            context.load_cert_chain(cert, key)
        elif config.get("cert") and config.get("key"):
            _load_inline(context, str(config["cert"]), str(config["key"]))
        else:
            raise WebConfigError(f"{path}: tls_server_config needs cert_file and key_file (or cert and key)")
        ca = config.get("client_ca_file")
        if ca:
            files.append(base / ca)
            context.load_verify_locations(cafile=base / ca)
        elif auth != "NoClientCert":
            raise WebConfigError(f"{path}: client_auth_type {auth} needs tls_server_config.client_ca_file")
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"{path}: tls_server_config: {exc}") from None
    context.verify_mode = CLIENT_AUTH_TYPES[auth]
    return context, files


def _version(name: str, key: str, path: Path) -> ssl.TLSVersion:
    if name not in TLS_VERSIONS:
        raise WebConfigError(f"{path}: tls_server_config.{key} {name!r} is not one of {', '.join(TLS_VERSIONS)}")
    return TLS_VERSIONS[name]


def _load_inline(context: ssl.SSLContext, cert: str, key: str) -> None:
    # ssl loads a chain from files only: an anonymous in-memory file on Linux (the chart's root filesystem is
    # read-only, with no writable /tmp, and the key never reaches a disk), else a private temporary file, removed
    # at once.
    pair = (cert.rstrip() + "\n" + key.rstrip() + "\n").encode()
    if hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir():
        fd = os.memfd_create("kvwatch-tls", os.MFD_CLOEXEC)
        with open(fd, "wb", closefd=True) as memory:
            memory.write(pair)
            memory.flush()
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        pem = Path(tmp) / "pair.pem"
        pem.touch(mode=0o600)
        pem.write_text(cert.rstrip() + "\n" + key.rstrip() + "\n")
        context.load_cert_chain(pem)


# A bcrypt hash (of no password anyone uses) checked for an unknown user, as long as a real one takes: its cost
# is raised to the users' (WebConfig.decoy_hash; a hash with another cost fails the check all the same).
_UNKNOWN_USER_HASH = b"$2b$10$1jOvvxhJQZXJThSVy97Bs.A4dhYfx4agj0lDySPPh4voDs8GOqdB."


def reload_refusal(running: WebConfig, new: WebConfig) -> str | None:
    """Why ``new`` may not replace the ``running`` configuration on a reload, or None. A reload never drops to
    plain HTTP (exporter-toolkit's TLS listener cannot either), and a file with nothing in it (a rewrite caught
    half-way: `cat > web.yml`) does not turn basic auth off: an empty file served /metrics in the clear."""
    if running.tls is not None and new.tls is None:
        return "it turns TLS off, which a reload may not (a file being rewritten?): restart kvwatch to serve plain HTTP"
    if running.users and not (new.tls or new.users or new.headers):
        return "it is empty and would turn basic auth off (a file being rewritten?): restart kvwatch to drop it"
    return None


class WebConfigWatcher:
    """The current web configuration, re-read when the file or any file it names changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.config = load_web_config(path) if path is not None else WebConfig()
        self._stamp = self._stamps()
        self._failed_stamp: tuple[FileStamp | None, ...] | None = None
        self.auth_cache: dict[bytes, bool] = {}

    def _stamps(self) -> tuple[FileStamp | None, ...]:
        out: list[FileStamp | None] = []
        for p in (self.config.watched or ((self.path,) if self.path else ())):
            try:
                st = os.stat(p)
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)

    def current(self) -> WebConfig:
        if self.path is None:
            return self.config
        with self._lock:
            stamp = self._stamps()
            if stamp != self._stamp and stamp != self._failed_stamp:
                try:
                    config = load_web_config(self.path)
                except WebConfigError as exc:
                    log.error("web config not reloaded, the last good one stays in force: %s", exc)
                    self._failed_stamp = stamp
                except Exception:  # kvwatch's bug, not the file's: still no request may fail on it
                    log.exception("web config not reloaded, the last good one stays in force")
                    self._failed_stamp = stamp
                else:
                    refusal = reload_refusal(self.config, config)
                    if refusal is not None:
                        log.error("web config not reloaded, the last good one stays in force: %s", refusal)
                        self._failed_stamp = stamp
                        return self.config
                    self.config = config
                    self.auth_cache = {}
                    self._stamp = self._stamps()
                    log.info("web config reloaded from %s (TLS %s, %d basic-auth users)", self.path,
                             "on" if config.tls else "off", len(config.users))
            return self.config


# Content types whose bodies the render cache keeps. Scrapers ask for one or two (text, OpenMetrics and their
# escapings); prometheus_client echoes the Accept header's version into the type, and a client sending a new one
# per request kept a body each (296 MB of RSS after 17,000 requests).
MAX_RENDERED_TYPES = 8
_VALUES_ESCAPING = re.compile(r"escaping\s*=\s*values\b", re.IGNORECASE)


class RenderCache:
    """The /metrics body per (state version, content type): rendered once, served to every scrape of it.

    ``version()`` returns what the output depends on (the State object, and whether it is still fresh), compared
    by identity: the cache holds those objects, so a later State can never share the cached one's identity (an
    ``id()`` could: CPython reuses a freed object's address, and an older poll's body was served). Concurrent
    scrapes of a new version wait for one rendering instead of each doing it."""

    def __init__(self, registry: CollectorRegistry, version: Callable[[], tuple[object, ...]]) -> None:
        self._registry = registry
        self._version = version
        self._lock = threading.Lock()
        self._bodies: dict[str, tuple[tuple[object, ...], bytes]] = {}

    def body(self, accept: str) -> tuple[bytes, str]:
        # Every kvwatch name is a legacy one, the same under each escaping, but prometheus_client 0.26's OpenMetrics
        # writer escapes "values" whatever the name (U__kvwatch__up beside "# TYPE kvwatch_up"): a Prometheus 3 job
        # asking for it stored no kvwatch_* series at all. "underscores" leaves legacy names as they are.
        accept = _VALUES_ESCAPING.sub("escaping=underscores", accept)
        try:
            encoder, content_type = choose_encoder(accept)
        except (TypeError, ValueError):  # a version it cannot compare ("version=abc"): the text format, as for none
            encoder, content_type = choose_encoder("")
        with self._lock:
            version = self._version()
            cached = self._bodies.pop(content_type, None)  # (put back last: the dict's order is by last use)
            if cached is not None and len(cached[0]) == len(version) and all(
                    a is b for a, b in zip(cached[0], version, strict=True)):
                self._bodies[content_type] = cached
                return cached[1], content_type
            body = encoder(self._registry)
            if len(self._bodies) >= MAX_RENDERED_TYPES:
                del self._bodies[next(iter(self._bodies))]  # the type asked for least recently
            self._bodies[content_type] = (version, body)
            return body, content_type


@dataclass
class _Connection:
    """One served connection, as the slot rules see it."""

    host: str
    socket: Any  # the TLS socket once wrapped: held here, it stays open until the server forgets the connection
    opened: float  # time.monotonic()
    head_read: bool = False  # a whole request head arrived: a working client, never evicted
    evicted: bool = False


class MetricsServer(ThreadingHTTPServer):
    """A threading HTTP server whose TLS handshake runs on the connection's thread, not the accept loop."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], cache: RenderCache, web: WebConfigWatcher,
                 stalled: Callable[[], str | None] = lambda: None) -> None:
        self.cache = cache
        self.web = web
        self.stalled = stalled  # why /healthz fails (None: healthy)
        if ":" in address[0]:  # an IPv6 address (--listen-address ::)
            self.address_family = socket.AF_INET6
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._stopping = threading.Event()
        self._per_client: Counter[str] = Counter()
        self._connections: dict[Any, _Connection] = {}  # by the accepted socket object
        self._per_client_lock = threading.Lock()  # guards both
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if DEFER_ACCEPT_SECONDS and hasattr(socket, "TCP_DEFER_ACCEPT"):  # (Linux only: elsewhere, accepted at once)
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT_SECONDS)
        super().server_bind()

    def process_request(self, request: Any, client_address: Any) -> None:
        # One client may hold at most MAX_PER_CLIENT connections: more are closed at once, without a thread.
        host = _host(client_address)
        with self._per_client_lock:
            # (its own stalled connections give way: 32 of them, dripping a byte a second, locked the node's
            # kubelet out of /healthz from the same address while slots were free)
            crowded = self._per_client[host] >= MAX_PER_CLIENT and self._end_stalled(host) is None
            if not crowded:
                self._per_client[host] += 1
        if crowded:
            self.shutdown_request(request)
            return
        if not self._slots.acquire(blocking=False) and not self._wait_for_slot():
            self._release_client(host)
            self.shutdown_request(request)
            return
        with self._per_client_lock:
            self._connections[request] = _Connection(host, request, time.monotonic())
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self._release_client(host)
            raise

    def _wait_for_slot(self) -> bool:
        """Every slot is taken: the accept loop waits here (what arrives meanwhile waits in the listen backlog)
        until a connection ends or a stalled one can be ended, for as long as the client would wait; False at
        shutdown, which this never holds up by more than SLOT_CHECK_SECONDS, or past CLIENT_TIMEOUT."""
        deadline = time.monotonic() + CLIENT_TIMEOUT
        while not self._stopping.is_set() and time.monotonic() < deadline:
            self._evict_stalled()
            if self._slots.acquire(timeout=SLOT_CHECK_SECONDS):
                return True
        return False

    def shutdown(self) -> None:
        self._stopping.set()  # before serve_forever is asked: it may be waiting in _wait_for_slot
        super().shutdown()

    def _evict_stalled(self) -> None:
        """Every slot is taken: end the oldest connection that has sent no request for STALLED_AFTER seconds, from
        the address holding the most (its thread then frees the slot)."""
        with self._per_client_lock:
            victim = self._end_stalled(None)
        if victim is not None:
            log.debug("all %d connection slots taken: closed a stalled connection from %s", MAX_CONNECTIONS,
                      victim.host)

    def _end_stalled(self, host: str | None) -> _Connection | None:
        """End the oldest connection (of ``host``, or of the address holding the most) that has sent no request for
        STALLED_AFTER seconds, and return it; None if there is none. Called with the per-client lock held."""
        now = time.monotonic()
        stalled = [c for c in self._connections.values()
                   if (host is None or c.host == host) and not c.head_read and not c.evicted
                   and now - c.opened >= STALLED_AFTER and _silent(c)]
        if not stalled:
            return None
        victim = max(stalled, key=lambda c: (self._per_client[c.host], -c.opened))
        victim.evicted = True
        _shut(victim)
        return victim

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
            self._release_client(_host(client_address))

    def shutdown_request(self, request: Any) -> None:
        with self._per_client_lock:
            self._connections.pop(request, None)  # (and with it the last reference to a TLS socket, which closes it)
        super().shutdown_request(request)

    def _release_client(self, host: str) -> None:
        with self._per_client_lock:
            self._per_client[host] -= 1
            if self._per_client[host] <= 0:
                del self._per_client[host]

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The socket timeout bounds each recv, not the request: a byte every few seconds kept a thread for ever.
        # This bounds the whole exchange: past it the socket is shut, which ends any read or write on it.
        deadline = threading.Timer(CLIENT_TIMEOUT, self._end, (request,))
        deadline.daemon = True
        deadline.start()
        with self._per_client_lock:
            connection = self._connections.get(request)
        try:
            self._serve(request, client_address, connection)
        finally:
            deadline.cancel()

    def _end(self, request: Any) -> None:
        """End a connection past its deadline, if the server still holds it (a forgotten one's descriptor may be
        another connection's by now)."""
        with self._per_client_lock:
            connection = self._connections.get(request)
            if connection is not None:
                _shut(connection)

    def _serve(self, request: Any, client_address: Any, connection: _Connection | None) -> None:
        request.settimeout(CLIENT_TIMEOUT)
        config = self.web.current()
        if config.tls is not None:
            try:
                head = request.recv(8, socket.MSG_PEEK)
            except OSError:
                return
            if head[:1] != b"\x16":  # not a TLS ClientHello: most likely plain HTTP sent to the TLS port
                if head:
                    request.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                                    b"\r\nClient sent an HTTP request to an HTTPS server.\n")
                return
            try:
                with self._per_client_lock:  # (wrapping detaches the accepted socket: an eviction cuts the new one)
                    request = config.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
                    if connection is not None:
                        connection.socket = request
                request.do_handshake()
            except (OSError, ssl.SSLError) as exc:
                log.debug("TLS handshake with %s failed: %s", client_address, exc)
                return
        self.RequestHandlerClass(request, client_address, self, config, connection)  # type: ignore[call-arg]

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, ssl.SSLError, socket.timeout)):
            log.debug("client %s went away: %s", client_address, exc)  # a scraper hung up: nothing to fix
            return
        log.exception("error serving %s", client_address)


def _host(client_address: Any) -> str:
    """The address a connection came from, the key of MAX_PER_CLIENT."""
    return str(client_address[0]) if client_address else ""


def _target_path(target: str) -> str:
    """The path a request line's target names, query left off. A server must accept the absolute form
    (``http://host:port/metrics``, RFC 9112 section 3.2.2), which proxies and some probes send."""
    if target[:1] != "/" and "://" in target:
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    return target.split("?", 1)[0]


def _silent(connection: _Connection) -> bool:
    """Nothing waits to be read on the connection: its client has sent nothing its thread has not read. A client
    whose request waits for a thread the CPU has not run yet (a loaded node, a throttled container: 100 ms is one CFS
    period, as long as STALLED_AFTER) is no idle one, and must not lose its slot to a newcomer."""
    sock = connection.socket
    try:
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return False  # decrypted bytes its thread has not read
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):  # closed meanwhile: its thread is freeing the slot
        return False


def _shut(connection: _Connection) -> None:
    """End a connection (its thread's blocked read or write returns), under the server's lock while it holds the
    connection: the socket it holds for it, the TLS one once wrapped (wrap_socket detaches the accepted socket, whose
    shutdown would then do nothing), through socket's own shutdown (a TLS socket's would unwrap it under its thread)."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(connection.socket, socket.SHUT_RDWR)


class _HeadBudget:
    """The request's reader while its headers are read, refusing (431, as an over-long header line is) once they
    pass their share of MAX_HEAD_BYTES. The standard library caps a line (64 KiB) and the count (100), not the block:
    32 held connections of 99 lines of 64 KB took the sidecar from 38 to 241 MB, most of it kept after they left."""

    def __init__(self, inner: Any, budget: int) -> None:
        self.inner, self.budget = inner, budget

    def readline(self, limit: int = -1) -> bytes:
        line = self.inner.readline(limit if 0 <= limit <= self.budget else self.budget + 1)
        self.budget -= len(line)
        if self.budget < 0:
            raise http.client.LineTooLong(f"request head over {MAX_HEAD_BYTES} bytes")
        return line


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    timeout = CLIENT_TIMEOUT

    def version_string(self) -> str:
        return "kvwatch"  # (BaseHTTP/0.6 Python/3.x told every unauthenticated client the Python version)

    def __init__(self, request: Any, client_address: Any, server: MetricsServer, config: WebConfig,
                 connection: _Connection | None) -> None:
        self.config = config
        self.tracked = connection  # (not "connection": StreamRequestHandler's name for the socket)
        super().__init__(request, client_address, server)

    def parse_request(self) -> bool:
        if len(self.raw_requestline.split()) == 2:
            # An HTTP/0.9 request line: BaseHTTPRequestHandler would wait for headers such a client never sends, and
            # hold the connection for CLIENT_TIMEOUT. Refused at once, as Go's net/http refuses a malformed line.
            self.close_connection, self.command = True, None
            self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
            self.request_version = "HTTP/1.0"  # (so the refusal carries a status line)
            self.send_error(400, "HTTP/0.9 is not served")
            return False
        rfile = self.rfile
        self.rfile = _HeadBudget(rfile, MAX_HEAD_BYTES - len(self.raw_requestline))  # type: ignore[assignment]
        try:
            parsed = super().parse_request()  # (reads the request line and every header)
        finally:
            self.rfile = rfile
        if parsed and self.tracked is not None:
            self.tracked.head_read = True
        return parsed

    def do_HEAD(self) -> None:
        """As GET, without the body (load balancers and uptime checks probe with HEAD)."""
        self._head = True
        self.do_GET()

    def do_GET(self) -> None:
        path = _target_path(self.path)
        if path == "/healthz":
            why = self.server.stalled()
            self._reply(503 if why else 200, "text/plain; charset=utf-8", why.encode() if why else b"ok\n")
        elif self.config.client_cert_required and not self.request.getpeercert():
            # (the handshake verified any certificate sent: an empty one here is none sent)
            self._reply(403, "text/plain; charset=utf-8", b"client certificate required\n")
        elif not self._authorised():
            self._reply(401, "text/plain; charset=utf-8", b"Unauthorized\n",
                        {"WWW-Authenticate": 'Basic realm="kvwatch"'})
        elif path == "/metrics":
            body, content_type = self.server.cache.body(self.headers.get("Accept", ""))
            self._reply(200, content_type, body)
        else:
            self._reply(404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n")

    def _authorised(self) -> bool:
        if not self.config.users:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return bool(sep) and self.config.check_password(user, password, self.server.web.auth_cache)

    def _reply(self, status: int, content_type: str, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**self.config.headers, **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if not getattr(self, "_head", False):
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)
