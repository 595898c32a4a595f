"""The fault matrix: a real ``kvwatch serve`` process against a loopback target that misbehaves on purpose.

Each fault runs against a fresh kvwatch: a good vLLM payload first (kvwatch up, gauges exported), then the
fault, then the good payload again (recovery), then the fault once more and SIGTERM in the middle of it.
Measured from outside, the way an operator would: kvwatch's own /metrics, /proc/<pid>/status (VmHWM is
the peak RSS) and /proc/<pid>/fd.

    .venv/bin/python benchmarks/faults.py                 # all 16 rows (~3 min)
    .venv/bin/python benchmarks/faults.py gzip_bomb nan   # some rows
    .venv/bin/python benchmarks/faults.py --json out.json
    .venv/bin/python benchmarks/faults.py --max-series 1000 label_explosion   # a larger series cap

Columns: survived (process alive and /healthz 200 throughout, and the fault's own check held), up=0 (what
``kvwatch_up`` read during the fault: value faults keep it at 1 by design), stale withdrawn (no per-series
gauge frozen from before the fault once stale-after passed; for value faults: no impossible value exported;
label explosion: at most --max-series series), recovered (up 1 with gauges within 5 s of healing), peak RSS
(VmHWM over the whole run), RSS after heal, max open files, SIGTERM exit (seconds, mid-fault).
``tests/test_faults.py`` runs a fast subset of these rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kvwatch.settings import ServeSettings

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = (ROOT / "tests" / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom").read_bytes()
INTERVAL, TIMEOUT, STALE = 0.5, 0.4, 1.5
MAX_SERIES = ServeSettings.model_fields["max_series"].default  # the shipped default, which bounds the explosion
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"


def _gzip_bomb(decoded: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"vllm:num_requests_waiting 0\n" * (1 << 15)
    parts = [packer.compress(block) for _ in range(decoded // len(block))]
    return b"".join([*parts, packer.flush()])


def label_explosion(models: int) -> bytes:
    lines = ["# TYPE vllm:kv_cache_usage_perc gauge"]
    lines += [f'vllm:kv_cache_usage_perc{{engine="0",model_name="m{i:05d}"}} 0.5' for i in range(models)]
    lines += ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="0",model_name="m{i:05d}"}} 3' for i in range(models)]
    return ("\n".join(lines) + "\n").encode()


def _impossible() -> bytes:
    text = PAYLOAD.decode()
    text = text.replace('vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.96',
                        'vllm:kv_cache_usage_perc{engine="0",model_name="llama"} NaN')
    text = text.replace('vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.5',
                        'vllm:kv_cache_usage_perc{engine="1",model_name="llama"} -1')
    text = text.replace('vllm:num_requests_waiting{engine="0",model_name="llama"} 4.0',
                        'vllm:num_requests_waiting{engine="0",model_name="llama"} +Inf')
    text = text.replace('vllm:num_requests_running{engine="1",model_name="llama"} 18.0',
                        'vllm:num_requests_running{engine="1",model_name="llama"} 1e308')
    return re.sub(r'(vllm:num_preemptions_total\{engine="0",model_name="llama"\}) \S+', r"\1 -5", text).encode()


def _duplicates() -> bytes:
    # Every series twice, the second copy (at the end of the body) with another value: a contradiction. (Copies
    # with the same value are one sample: a page served twice over is read.)
    samples = [line for line in PAYLOAD.decode().splitlines() if line and not line.startswith("#")]
    changed = [f"{head} {float(value) + 1:g}" for head, _, value in (s.rpartition(" ") for s in samples)]
    return (PAYLOAD.decode() + "\n".join(changed) + "\n").encode()


def _escapes() -> bytes:
    """The good page and one line of a family kvwatch does not read whose label is 7 MiB of escaped backslashes
    (14 MiB of text, under the default cap): resolving every escape would take one list entry each."""
    return PAYLOAD + b'unread_family{label="' + b"\\\\" * (7 << 20) + b'"} 1\n'


def _counter_reset() -> bytes:
    out = []
    for line in PAYLOAD.decode().splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if not line.startswith("#") and (name.endswith(("_total", "_count", "_sum"))):
            head, _, value = line.rpartition(" ")
            line = f"{head} {float(value) * 0.01:g}"
        out.append(line)
    return ("\n".join(out) + "\n").encode()


def _clock_jump() -> bytes:
    # Sample timestamps (milliseconds) and vLLM's start time far in the future: kvwatch stamps polls itself.
    out = []
    for line in PAYLOAD.decode().splitlines():
        if line and not line.startswith("#"):
            line += " 4102444800000"
        out.append(line.replace("process_start_time_seconds 1.79e+09", "process_start_time_seconds 4.1e+09"))
    return ("\n".join(out) + "\n").encode()


class Target:
    """A loopback 'vLLM' speaking raw HTTP/1.1, whose behaviour ``mode`` switches."""

    def __init__(self) -> None:
        self.mode = "good"
        self._sock: socket.socket | None = None
        self.port = 0
        self._bomb = _gzip_bomb(1 << 30)
        self._labels = label_explosion(50_000)
        self._bodies = {"nan": _impossible(), "duplicates": _duplicates(), "counter_reset": _counter_reset(),
                        "clock_jump": _clock_jump(), "escapes": _escapes()}
        self.listen()

    def listen(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._sock = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def down(self) -> None:
        if self._sock is not None:
            # close() alone does not wake the thread blocked in accept() on Linux: the port went on listening (and
            # answered the next poll "good") until a connection came, and listen() on it again failed meanwhile.
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while conn.recv(65536).find(b"\r\n\r\n") < 0:
                    pass
                self._answer(conn, self.mode)
            except OSError:
                pass

    def _answer(self, conn: socket.socket, mode: str) -> None:
        def whole(body: bytes, extra: bytes = b"") -> None:
            conn.sendall(HEAD + extra + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)

        if mode == "good":
            whole(PAYLOAD)
        elif mode == "slow":
            time.sleep(3 * TIMEOUT)
            whole(PAYLOAD)
        elif mode == "slowloris":
            for byte in HEAD + b"X-Slow: " + b"a" * 100:
                conn.sendall(bytes([byte]))
                time.sleep(0.05)
        elif mode in ("huge_length", "huge_no_length"):
            length = b"Content-Length: 2000000000\r\n" if mode == "huge_length" else b"Connection: close\r\n"
            conn.sendall(HEAD + length + b"\r\n")
            chunk = b'vllm:num_requests_waiting{model_name="x"} 1\n' * 1500
            for _ in range(2_000_000_000 // len(chunk)):
                conn.sendall(chunk)
        elif mode == "gzip_bomb":
            whole(self._bomb, b"Content-Encoding: gzip\r\n")
        elif mode == "truncated":
            conn.sendall(HEAD + b"Content-Length: 100000\r\n\r\n" + PAYLOAD[:1000])
        elif mode == "binary":
            whole(os.urandom(200_000))
        elif mode == "html":
            whole(b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>\n", b"")
        elif mode == "label_explosion":
            whole(self._labels)
        else:
            whole(self._bodies[mode])


@dataclass
class Row:
    fault: str
    survived: bool
    up_during: str
    stale_withdrawn: str
    recovered: bool
    peak_rss_mb: float
    rss_after_heal_mb: float
    max_open_files: int
    sigterm_exit_s: float | None
    note: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                out[key] = int(value.split()[0])  # kB
    return out


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def per_series(samples: dict) -> dict:
    return {k: v for k, v in samples.items() if k[0].startswith(("kvwatch_kv_", "kvwatch_requests_"))}


def healthz(port: int) -> bool:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


class Kvwatch:
    def __init__(self, target_port: int, *extra: str, max_series: int = MAX_SERIES) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvwatch", "serve", "--target-url", f"http://127.0.0.1:{target_port}/metrics",
             "--port", str(self.port), "--poll-interval-seconds", str(INTERVAL), "--poll-timeout-seconds",
             str(TIMEOUT), "--stale-after-seconds", str(STALE), "--max-series", str(max_series), *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.max_fds = 0

    def sample(self) -> None:
        self.max_fds = max(self.max_fds, open_files(self.proc.pid))

    def wait_for(self, condition: Callable[[dict], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.sample()
                if condition(scrape(self.port)):
                    return True
            except Exception:  # not listening yet, or a scrape that failed: try again
                pass
            time.sleep(0.1)
        return False

    def sigterm(self) -> float:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return math.inf
        return time.monotonic() - started

    def log(self) -> str:
        return self.proc.stdout.read() if self.proc.stdout else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def up(samples: dict) -> float | None:
    return samples.get(("kvwatch_up", frozenset()))


def healthy(samples: dict) -> bool:
    return up(samples) == 1.0 and bool(per_series(samples))


COUNTS = ("kvwatch_kv_usage_ratio", "kvwatch_kv_capacity_tokens", "kvwatch_kv_used_tokens",
          "kvwatch_requests_running", "kvwatch_requests_waiting")


def _no_impossible(samples: dict) -> bool:
    """Usage, capacity, used tokens and queues finite and not negative, usage at most 1 (an ETA is +Inf when
    nothing fills and headroom may be negative: those are meant)."""
    series = [(name, v) for (name, _), v in per_series(samples).items() if name in COUNTS]
    return all(math.isfinite(v) and v >= 0 for _, v in series) and all(
        v <= 1.0 for name, v in series if name == "kvwatch_kv_usage_ratio")


VALUE_FAULTS = {"nan", "counter_reset", "clock_jump", "label_explosion", "escapes"}
FAULTS = ("down", "slow", "slowloris", "huge_length", "huge_no_length", "gzip_bomb", "truncated", "binary", "html",
          "nan", "duplicates", "label_explosion", "counter_reset", "clock_jump", "escapes", "concurrent_scrapes",
          "bad_config")


def run_fault(fault: str, target: Target, max_series: int = MAX_SERIES) -> Row:
    if fault == "bad_config":
        return _bad_config()
    target.mode = "good"
    if target._sock is None:
        target.listen()
    kv = Kvwatch(target.port, max_series=max_series)
    try:
        alive = kv.wait_for(healthy, 20)
        note = ""
        if fault == "concurrent_scrapes":
            return _concurrent(kv, alive)
        rss_before = proc_status(kv.proc.pid)["VmRSS"]
        _apply(target, fault)
        if fault in VALUE_FAULTS:
            time.sleep(4 * INTERVAL)
            if fault == "label_explosion":  # its first poll parses 50,000 label sets: wait until it is in
                kv.wait_for(lambda s: s.get(("kvwatch_series_dropped_total", frozenset()), 0) > 0, 30)
            ups, checks = [], []
            for _ in range(10):
                samples = scrape(kv.port)
                kv.sample()
                ups.append(up(samples))
                if fault == "label_explosion":
                    series = {dict(k[1]).get("model_name") for k in per_series(samples)}
                    checks.append(len(series) <= max_series and samples.get(
                        ("kvwatch_series_dropped_total", frozenset()), 0) > 0)
                else:
                    checks.append(_no_impossible(samples))
                time.sleep(INTERVAL)
            up_during = "/".join(sorted({f"{u:g}" for u in ups if u is not None}))
            withdrawn = "yes" if all(checks) else "NO"
            fault_ok = all(checks)
        else:
            went_down = kv.wait_for(lambda s: up(s) == 0.0, 10)
            time.sleep(STALE + 2 * INTERVAL)
            samples = scrape(kv.port)
            kv.sample()
            up_during = "0" if went_down and up(samples) == 0.0 else f"{up(samples)}"
            withdrawn = "yes" if not per_series(samples) else "NO"
            fault_ok = went_down and not per_series(samples)
        alive = alive and kv.proc.poll() is None and healthz(kv.port)
        _heal(target)
        recovered = kv.wait_for(healthy, 5 + STALE)
        time.sleep(1.0)
        rss_after = proc_status(kv.proc.pid)["VmRSS"]
        _apply(target, fault)
        time.sleep(1.2 * INTERVAL)  # a poll is under way (or parsing) when SIGTERM arrives
        kv.sample()
        peak = proc_status(kv.proc.pid)["VmHWM"]
        exit_s = kv.sigterm()
        _heal(target)
        log = kv.log()
        if "Traceback" in log:
            note = "traceback in log"
        note = note or f"RSS before fault {rss_before / 1024:.0f} MB"
        return Row(fault, alive and fault_ok and kv.proc.returncode == 0 and "Traceback" not in log, up_during,
                   withdrawn, recovered, round(peak / 1024, 1), round(rss_after / 1024, 1), kv.max_fds,
                   round(exit_s, 2), note)
    finally:
        kv.close()
        target.mode = "good"


def _apply(target: Target, fault: str) -> None:
    if fault == "down":
        target.down()
    else:
        target.mode = fault


def _heal(target: Target) -> None:
    target.mode = "good"
    if target._sock is None:
        target.listen()


BURST_CLIENTS = 20
"""Client addresses a burst comes from (127.0.0.1-127.0.0.20): kvwatch serves one address at most 32 connections
at once (kvwatch.serve.web.MAX_PER_CLIENT), so 500 at once stand for the scrapers of many clients."""


async def _burst(port: int, n: int) -> tuple[int, list[float]]:
    async def one(i: int) -> tuple[bool, float]:
        started = time.monotonic()
        try:
            source = (f"127.0.0.{1 + i % BURST_CLIENTS}", 0)
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, local_addr=source), 10)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: kvwatch\r\nConnection: close\r\n\r\n")
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return data.startswith(b"HTTP/1.0 200") and b"kvwatch_up 1.0" in data, time.monotonic() - started
        except (OSError, asyncio.TimeoutError):
            return False, time.monotonic() - started

    results = await asyncio.gather(*(one(i) for i in range(n)))
    return sum(not ok for ok, _ in results), sorted(t for _, t in results)


def concurrent_scrapes(port: int, n: int = 500) -> tuple[int, float]:
    """(errors, p99 seconds) of ``n`` simultaneous GET /metrics from BURST_CLIENTS addresses."""
    errors, latencies = asyncio.run(_burst(port, n))
    return errors, latencies[max(0, math.ceil(0.99 * n) - 1)]


def _concurrent(kv: Kvwatch, alive: bool) -> Row:
    worst_errors, worst_p99 = 0, 0.0
    for _ in range(3):
        errors, p99 = concurrent_scrapes(kv.port)
        worst_errors, worst_p99 = max(worst_errors, errors), max(worst_p99, p99)
        kv.sample()
    ok = alive and worst_errors == 0 and healthz(kv.port)
    rss = proc_status(kv.proc.pid)
    exit_s = kv.sigterm()
    log = kv.log()
    return Row("concurrent_scrapes", ok and "Traceback" not in log, "1", "n/a", True, round(rss["VmHWM"] / 1024, 1),
               round(rss["VmRSS"] / 1024, 1), kv.max_fds, round(exit_s, 2),
               f"3 x 500 GETs: {worst_errors} errors, worst p99 {worst_p99:.2f} s")


def _bad_config() -> Row:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "kvwatch", "serve", "--poll-interval-seconds", "-1"],
                            env=env, capture_output=True, text=True, timeout=30)
    elapsed = time.monotonic() - started
    env["KVWATCH_POLL_INTERVAL_SECONDS"] = "often"
    second = subprocess.run([sys.executable, "-m", "kvwatch", "serve"], env=env, capture_output=True, text=True,
                            timeout=30)
    ok = all(r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
             for r in (result, second))
    named = "--poll-interval-seconds" in result.stderr and "KVWATCH_POLL_INTERVAL_SECONDS" in second.stderr
    return Row("bad_config", ok and named, "n/a", "n/a", True, 0.0, 0.0, 0, round(elapsed, 2),
               "exit 2, one line naming the flag / variable")


def render_table(rows: list[Row]) -> str:
    head = ("| fault | survived | up during | stale withdrawn | recovered | peak RSS MB | RSS after heal MB | "
            "max open files | SIGTERM exit s | note |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r.fault} | {'yes' if r.survived else 'NO'} | {r.up_during} | {r.stale_withdrawn} | "
                     f"{'yes' if r.recovered else 'NO'} | {r.peak_rss_mb:g} | {r.rss_after_heal_mb:g} | "
                     f"{r.max_open_files} | {r.sigterm_exit_s} | {r.note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("faults", nargs="*", metavar="FAULT", help=f"faults to run (default: all): {', '.join(FAULTS)}")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--max-series", type=int, default=MAX_SERIES,
                        help=f"kvwatch's --max-series (default: the shipped {MAX_SERIES})")
    args = parser.parse_args(argv)
    unknown = set(args.faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown fault(s): {', '.join(sorted(unknown))}")
    # kvwatch's bytecode compiled first, as in the image (soak_rss.compile_kvwatch): without .pyc files every row
    # read 5-6 MB higher, the compiler's peak (a reviewer's first run)
    from soak_rss import compile_kvwatch

    compile_kvwatch()
    target = Target()
    rows = []
    for fault in args.faults or FAULTS:
        row = run_fault(fault, target, args.max_series)
        print(render_table([row]).splitlines()[-1], flush=True)
        rows.append(row)
    print()
    print(render_table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0 if all(r.survived for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
