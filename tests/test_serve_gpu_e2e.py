"""End to end: a real ``kvwatch serve`` polling a real loopback HTTP server that plays both vLLM (/metrics) and
the node's dcgm-exporter (/dcgm, the pod-mapping fixture with one GPU's memory growing on every read).

kvwatch must pick the pod's GPUs (not the other namespace's), export used/free, non-KV memory (used − the
engine's KV pool in bytes − the capacity model's weights), its growth and time to the limit, and the last
Xid; when the exporter fails, count it and keep polling vLLM (``kvwatch_up`` stays 1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvwatch.serve.sidecar_capacity import build_sidecar_capacity
from kvwatch.settings import ServeSettings
from test_serve_e2e import _reap, free_port, get, scrape, wait_for

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).parent / "fixtures"
VLLM = (FIXTURES / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom").read_bytes()
DCGM = (FIXTURES / "dcgm" / "gen-k8s-pod-mapping.prom").read_text()
MIB = 1024.0 ** 2
MODEL, GPU = "meta-llama/Llama-3.1-8B-Instruct", "H100"
STEP_MIB = 20  # GPU-aaaa's used memory grows by this much on every read of /dcgm
POLL, SPEED = 0.2, 100.0  # 20 poll-clock seconds per poll: the 2-minute trend span takes ~7 polls


class Node:
    """vLLM and dcgm-exporter on one loopback server; ``dcgm_status`` switches the exporter to an error."""

    def __init__(self) -> None:
        self.reads = 0
        self.dcgm_status = 200
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def dcgm_body(self) -> bytes:
        self.reads += 1
        used = 70000 + STEP_MIB * self.reads
        text = DCGM.replace('pod="vllm-0"} 80000', f'pod="vllm-0"}} {used}')
        text = text.replace('pod="vllm-0"} 1024', f'pod="vllm-0"}} {81024 - used}')
        return text.encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        node = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = 200, VLLM
                if self.path == "/dcgm":
                    status = node.dcgm_status
                    body = node.dcgm_body() if status == 200 else b"exporter error\n"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def node() -> Iterator[Node]:
    n = Node()
    try:
        yield n
    finally:
        n.stop()


def test_serve_joins_dcgm_exporter(node: Node) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    env.update(KVWATCH_GPU_POD="vllm-0", KVWATCH_GPU_NAMESPACE="llm")  # as the chart's downward API sets them
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "serve", "--target-url", f"http://127.0.0.1:{node.port}/metrics",
         "--dcgm-url", f"http://127.0.0.1:{node.port}/dcgm", "--model", MODEL, "--gpu", GPU,
         "--listen-address", "127.0.0.1", "--port", str(port), "--poll-interval-seconds", str(POLL),
         "--poll-timeout-seconds", "0.15", "--clock-speed", str(SPEED)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    a, b = {"uuid": "GPU-aaaa", "gpu_instance": ""}, {"uuid": "GPU-bbbb", "gpu_instance": ""}
    try:
        wait_for(lambda: get(scrape(port), "kvwatch_gpu_memory_limit_eta_seconds", **a) is not None,
                 "a memory trend", timeout=30)
        s = scrape(port)
        assert get(s, "kvwatch_up") == 1.0 and get(s, "kvwatch_gpu_source_up", source="dcgm") == 1.0
        uuids = {dict(labels)["uuid"] for name, labels in s if name == "kvwatch_gpu_memory_used_bytes"}
        assert uuids == {"GPU-aaaa", "GPU-bbbb"}  # GPU-cccc belongs to a pod of the same name elsewhere
        assert get(s, "kvwatch_gpu_memory_used_bytes", **b) == 78976 * MIB
        assert get(s, "kvwatch_gpu_memory_free_bytes", **b) == 2048 * MIB
        assert get(s, "kvwatch_gpu_last_xid", **b) == 79.0

        # Non-KV on the GPU that does not change: used − the engine's pool − the capacity model's weights. The
        # pool: each engine's 163840 tokens (kv_cache_size_tokens; vLLM's num_gpu_blocks label, 20480, sums the
        # two data-parallel engines) = 10240 blocks of 16 tokens × 128 KiB per token (Llama-3.1-8B, bf16): 20 GiB.
        capacity, _ = build_sidecar_capacity(ServeSettings(model=MODEL, gpu=GPU))
        assert capacity is not None and capacity.plan.weights_bytes is not None
        pool = 10240 * 16 * 131072
        assert get(s, "kvwatch_gpu_non_kv_memory_bytes", **b) == pytest.approx(
            78976 * MIB - pool - capacity.plan.weights_bytes)

        # GPU-aaaa grows STEP_MIB per poll of 20 poll-clock seconds: 1 MiB/s (timer jitter allowed for).
        growth = get(s, "kvwatch_gpu_non_kv_memory_growth_bytes_per_second", **a)
        assert growth == pytest.approx(STEP_MIB * MIB / (POLL * SPEED), rel=0.2)
        free = get(s, "kvwatch_gpu_memory_free_bytes", **a)
        assert get(s, "kvwatch_gpu_memory_limit_eta_seconds", **a) == pytest.approx(free / growth)
        assert get(s, "kvwatch_gpu_non_kv_memory_growth_bytes_per_second", **b) == pytest.approx(0.0, abs=1e-6)
        assert get(s, "kvwatch_gpu_memory_limit_eta_seconds", **b) is None  # flat: no horizon

        node.dcgm_status = 500  # the exporter fails; the engine's poll must not
        wait_for(lambda: (get(scrape(port), "kvwatch_gpu_source_errors_total", source="dcgm",
                              reason="http_status") or 0) > 0, "the exporter's error counted")
        s = scrape(port)
        assert get(s, "kvwatch_gpu_source_up", source="dcgm") == 0.0
        assert get(s, "kvwatch_up") == 1.0 and get(s, "kvwatch_kv_usage_ratio", model_name="llama", engine="0")
        assert get(s, "kvwatch_gpu_memory_used_bytes", **a) is None
    finally:
        _reap(proc)
