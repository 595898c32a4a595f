"""Memory of each series the sidecar keeps, once warm: ``kvwatch serve`` polls a page of N steady vLLM series (the
families kvwatch reads, which it reads as vLLM 0.11; 8 engines per model, usage a random walk, rising counters, six
histograms) until its forecasters hold their two hours of minute buckets, and the process's RSS is sampled every 10 s.
Run it for two series counts: the difference of their steady RSS over the difference of the counts is what one series
costs (docs/performance.md, "Memory per series").

At ``--clock-speed 20`` and ``--poll-interval-seconds 0.25`` each poll is 5 simulated seconds (the default interval)
and 6 wall minutes are 2 simulated hours; the steady state is the median of the samples past 2 simulated hours.

    .venv/bin/python benchmarks/series_memory.py --series 8 --minutes 7
    .venv/bin/python benchmarks/series_memory.py --series 64 --minutes 7
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from soak import free_port
from soak_rss import rss_mb

LATENCY = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:request_queue_time_seconds",
           "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens")
BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)


class Page:
    """N series of a vLLM page that move a little at every fetch."""

    def __init__(self, series: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.keys = [(f"model-{i // 8}", str(i % 8)) for i in range(series)]
        self.usage = {k: 0.2 + 0.5 * self.rng.random() for k in self.keys}
        self.count = dict.fromkeys(self.keys, 0.0)
        self.lock = threading.Lock()

    def render(self) -> bytes:
        with self.lock:
            for k in self.keys:
                self.usage[k] = min(0.99, max(0.01, self.usage[k] + self.rng.gauss(0, 0.02)))
                self.count[k] += self.rng.randint(1, 20)
            out = ["# TYPE process_start_time_seconds gauge", "process_start_time_seconds 1790000000.0"]

            def family(name: str, kind: str, lines) -> None:  # type: ignore[no-untyped-def]
                out.extend((f"# HELP {name} h", f"# TYPE {name} {kind}"))
                for model, engine in self.keys:
                    out.extend(lines(name, f'engine="{engine}",model_name="{model}"', self.usage[(model, engine)],
                                     self.count[(model, engine)]))

            family("vllm:num_requests_running", "gauge", lambda n, lb, u, c: [f"{n}{{{lb}}} {int(u * 50)}"])
            family("vllm:num_requests_waiting", "gauge",
                   lambda n, lb, u, c: [f"{n}{{{lb}}} {max(0, int((u - 0.8) * 50))}"])
            family("vllm:kv_cache_usage_perc", "gauge", lambda n, lb, u, c: [f"{n}{{{lb}}} {u:.4f}"])
            family("vllm:num_preemptions_total", "counter", lambda n, lb, u, c: [f"{n}{{{lb}}} {int(c // 100)}"])
            for name, per in (("vllm:prompt_tokens_total", 500), ("vllm:generation_tokens_total", 200)):
                family(name, "counter", lambda n, lb, u, c, per=per: [f"{n}{{{lb}}} {c * per}"])
            family("vllm:request_success_total", "counter", lambda n, lb, u, c: [
                f'{n}{{{lb},finished_reason="{r}"}} {int(c * share)}' for r, share in (("stop", 0.8), ("length", 0.2))])
            for name in LATENCY:
                family(name, "histogram", lambda n, lb, u, c: [
                    *(f'{n}_bucket{{{lb},le="{le}"}} {int(c * (1 - math.exp(-(i + 1) / 6)))}'
                      for i, le in enumerate(BOUNDS)),
                    f'{n}_bucket{{{lb},le="+Inf"}} {int(c)}', f"{n}_count{{{lb}}} {int(c)}",
                    f"{n}_sum{{{lb}}} {c * 0.7}"])
            config = 'block_size="16",cache_dtype="auto",gpu_memory_utilization="0.9",num_gpu_blocks="20000"'
            family("vllm:cache_config_info", "gauge", lambda n, lb, u, c: [f"{n}{{{lb},{config}}} 1"])
            return ("\n".join(out) + "\n").encode()


def serve_page(page: Page) -> int:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=7.0)
    parser.add_argument("--clock-speed", type=float, default=20.0)
    parser.add_argument("--poll-interval-seconds", type=float, default=0.25)
    args = parser.parse_args()
    target = serve_page(Page(args.series))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    kvwatch = str(Path(sys.executable).with_name("kvwatch"))
    child = subprocess.Popen([kvwatch, "serve", "--target-url", f"http://127.0.0.1:{target}/metrics",
                              "--port", str(free_port()), "--clock-speed", str(args.clock_speed),
                              "--poll-interval-seconds", str(args.poll_interval_seconds),
                              "--poll-timeout-seconds", str(0.96 * args.poll_interval_seconds)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples: list[tuple[float, float]] = []  # (simulated hours, RSS MB)
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.minutes * 60:
            time.sleep(10)
            simulated = (time.monotonic() - started) * args.clock_speed / 3600
            samples.append((simulated, rss_mb(child.pid) or math.nan))
            print(f"{time.monotonic() - started:6.0f} s  {simulated:5.2f} simulated h  RSS {samples[-1][1]:6.1f} MB",
                  flush=True)
    finally:
        child.terminate()
        child.wait(10)
    steady = [rss for hours, rss in samples if hours >= 2.0]
    if not steady:
        sys.exit(f"no sample past 2 simulated hours: raise --minutes above {120 / args.clock_speed:.0f}")
    print(f"series {args.series}: steady RSS (median past 2 simulated hours) {statistics.median(steady):.1f} MB")


if __name__ == "__main__":
    main()
