"""A poll sent on a kept-alive connection the target is closing as idle, measured against a real server.

vLLM's API server (uvicorn) closes a connection idle for 5 s (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) and kvwatch polls
every 5 s by default, so a poll can leave on a connection just as the target closes it. This runs uvicorn with a
1-s keep-alive on loopback and kvwatch's own :class:`~kvwatch.fetch.Fetcher` on a fixed-rate timer (as the
sidecar's poller) a few milliseconds slower than that, and counts the polls that failed.

    .venv/bin/pip install uvicorn          # the benchmark's one extra: vLLM's own HTTP server
    .venv/bin/python benchmarks/keepalive_race.py --polls 40

Results: docs/reliability.md (the row "a poll sent on a kept-alive connection just as the target closes it").
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from kvwatch.fetch import Fetcher
from kvwatch.payload import ScrapeError

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/vllm-metrics/gen-0.33-dp2-capacity-labels.prom"
SERVER = textwrap.dedent("""
    import sys, uvicorn
    body = open(sys.argv[2], "rb").read()
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain; version=0.0.4")]})
        await send({"type": "http.response.body", "body": body})
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), timeout_keep_alive=1, log_level="warning")
""")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def failed_polls(url: str, interval: float, polls: int) -> list[str]:
    errors: list[str] = []
    with Fetcher(url, timeout=0.8 * interval, max_body_bytes=1 << 24) as fetcher:
        start = time.monotonic()
        for k in range(polls):
            time.sleep(max(0.0, start + k * interval - time.monotonic()))
            try:
                fetcher.fetch()
            except ScrapeError as exc:
                errors.append(str(exc))
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=40, help="polls per interval (default 40)")
    parser.add_argument("--past-ms", type=float, nargs="+", default=[0.0, 1.0, 2.0, 3.0, 5.0],
                        help="how far past the 1-s keep-alive each interval is, in ms (default 0 1 2 3 5)")
    args = parser.parse_args()
    import importlib.util

    if importlib.util.find_spec("uvicorn") is None:  # (it failed 10 s later with ConnectionRefusedError)
        print("keepalive_race.py needs uvicorn (vLLM's own HTTP server), which kvwatch does not depend on: "
              f"{Path(sys.executable).parent}/pip install uvicorn", file=sys.stderr)
        return 2
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(FIXTURE)])
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        print("| interval | failed polls | first error |\n|---|---|---|")
        for past in args.past_ms:
            errors = failed_polls(url, 1.0 + past / 1000, args.polls)
            print(f"| 1 s + {past:g} ms | {len(errors)} of {args.polls} | {errors[0] if errors else ''} |")
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
