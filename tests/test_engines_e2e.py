"""End to end for every engine: ``kvwatch simulate --engine X`` speaks SGLang's, trtllm-serve's or vLLM's
wire names, ``kvwatch serve`` detects the engine from the payload and exports the same ``kvwatch_*`` series,
and a real Prometheus scrapes those kvwatch instances and answers the rule pack's recording rules for the
SGLang and TensorRT-LLM ones (vLLM's run through the same rules is tests/test_alerts_e2e.py).

Every process is on loopback with free ports and stopped by its PID in ``finally``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness import (
    LOOPBACK,
    Process,
    free_port,
    http_get,
    prometheus_config,
    prometheus_query,
    require_binary,
    wait_until_ready,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "alerts" / "kvwatch-rules.yaml"
SPEED = 60.0
BLOCKS, BLOCK_SIZE = 1024, 16
# Enough load to fill this small cache within a few simulated minutes (a few real seconds).
LOAD = ["--num-gpu-blocks", str(BLOCKS), "--block-size", str(BLOCK_SIZE), "--rate", "8", "--prompt-tokens", "1500",
        "--output-tokens", "400", "--seed", "1"]
# The simulator speaks vLLM 0.33 (its admission_rejections family is 0.33 only): the range holds 0.26 on.
VERSION = {"vllm": ">=0.26", "sglang": "rank-labels", "tensorrt-llm": "trtllm-serve"}
# vLLM reports num_gpu_blocks x block_size; SGLang and TensorRT-LLM report the pool's usable tokens.
CAPACITY = {"vllm": 0.0, "sglang": (BLOCKS - 1) * BLOCK_SIZE, "tensorrt-llm": (BLOCKS - 1) * BLOCK_SIZE}


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = http_get(url).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def start_pair(engine: str, model: str, tmp_path: Path, processes: list[Process]) -> int:
    """A simulator speaking ``engine`` and a kvwatch polling it; returns kvwatch's port."""
    sim_port, kvwatch_port = free_port(), free_port()
    processes.append(Process(f"simulator-{engine}", [
        sys.executable, "-m", "kvwatch", "simulate", "--engine", engine, "--model-name", model,
        "--listen-address", LOOPBACK, "--port", str(sim_port), "--clock-speed", str(SPEED), *LOAD], tmp_path))
    wait_until_ready(f"http://{LOOPBACK}:{sim_port}/metrics", processes[-1], 30)
    processes.append(Process(f"kvwatch-{engine}", [
        sys.executable, "-m", "kvwatch", "serve", "--target-url", f"http://{LOOPBACK}:{sim_port}/metrics",
        "--listen-address", LOOPBACK, "--port", str(kvwatch_port), "--poll-interval-seconds", "0.2",
        "--clock-speed", str(SPEED), "--stale-after-seconds", "30"], tmp_path))
    wait_until_ready(f"http://{LOOPBACK}:{kvwatch_port}/metrics", processes[-1], 30)
    return kvwatch_port


def wait_for_full_cache(url: str, series: dict[str, str], processes: list[Process], timeout: float = 60.0) -> dict:
    key = tuple(sorted(series.items()))
    deadline = time.monotonic() + timeout
    samples: dict = {}
    while time.monotonic() < deadline:
        samples = scrape(url)
        if (samples.get(("kvwatch_kv_usage_ratio", key)) or 0) > 0.8:
            return samples
        assert all(p.alive() for p in processes), "\n".join(p.tail() for p in processes)
        time.sleep(0.5)
    raise AssertionError(f"the cache never filled: {samples}\n" + "\n".join(p.tail() for p in processes))


@pytest.mark.parametrize("engine", ["sglang", "tensorrt-llm", "vllm"])
def test_serve_reads_each_engine_from_the_simulator(engine: str, tmp_path: Path) -> None:
    model = f"e2e-{engine}"
    processes: list[Process] = []
    try:
        port = start_pair(engine, model, tmp_path, processes)
        series = {"model_name": model, "engine": "0"}
        samples = wait_for_full_cache(f"http://{LOOPBACK}:{port}/metrics", series, processes)
        key = tuple(sorted(series.items()))
        assert samples[("kvwatch_up", ())] == 1.0
        info = [labels for (name, labels) in samples if name == "kvwatch_source_info"]
        assert len(info) == 1 and dict(info[0])["engine_kind"] == engine
        assert dict(info[0])["version_range"] == VERSION[engine]
        assert all(dict(info[0])[f"{q}_metric"] for q in ("usage", "running", "waiting", "capacity"))
        capacity = samples[("kvwatch_kv_capacity_tokens", key)]
        assert capacity == (CAPACITY[engine] or BLOCKS * BLOCK_SIZE)
        assert samples[("kvwatch_kv_used_tokens", key)] == pytest.approx(
            samples[("kvwatch_kv_usage_ratio", key)] * capacity)
        assert samples[("kvwatch_requests_running", key)] > 0
        assert ("kvwatch_requests_waiting", key) in samples
        if engine != "tensorrt-llm":  # the rate needs a minute of history: give it a few polls
            deadline = time.monotonic() + 20
            while ("kvwatch_preemptions_per_second", key) not in samples and time.monotonic() < deadline:
                time.sleep(0.5)
                samples = scrape(f"http://{LOOPBACK}:{port}/metrics")
            assert ("kvwatch_preemptions_per_second", key) in samples
        else:  # TensorRT-LLM counts no preemptions: the rate is unknown, not 0
            assert ("kvwatch_preemptions_per_second", key) not in samples
    finally:
        for process in reversed(processes):
            process.stop()
    assert all(not p.alive() for p in processes)


def test_prometheus_recording_rules_answer_for_sglang_and_tensorrt_llm(tmp_path: Path) -> None:
    prometheus_bin = require_binary("prometheus")
    processes: list[Process] = []
    try:
        ports = {engine: start_pair(engine, f"e2e-{engine}", tmp_path, processes)
                 for engine in ("sglang", "tensorrt-llm")}
        prometheus_port = free_port()
        prometheus_url = f"http://{LOOPBACK}:{prometheus_port}"
        config = prometheus_config(RULES, ports["sglang"], free_port(), {"namespace": "e2e"})
        # One job, both kvwatch instances as targets.
        config = config.replace(f"- {LOOPBACK}:{ports['sglang']}",
                                f"- {LOOPBACK}:{ports['sglang']}\n    - {LOOPBACK}:{ports['tensorrt-llm']}")
        (tmp_path / "prometheus.yml").write_text(config)
        processes.append(Process("prometheus", [
            prometheus_bin, f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}", f"--web.listen-address={LOOPBACK}:{prometheus_port}",
        ], tmp_path))
        wait_until_ready(f"{prometheus_url}/-/ready", processes[-1], 60)
        deadline = time.monotonic() + 60
        usage: dict[str, float] = {}
        while time.monotonic() < deadline and len(usage) < 2:
            usage = {s["metric"]["model_name"]: float(s["value"][1]) for s in prometheus_query(
                prometheus_url, 'namespace_model_name:kvwatch_kv_usage:ratio{namespace="e2e"}')}
            time.sleep(1.0)
        assert set(usage) == {"e2e-sglang", "e2e-tensorrt-llm"}, "\n".join(p.tail() for p in processes)
        assert all(0.0 <= u <= 1.0 for u in usage.values())
        capacity = {s["metric"]["model_name"]: float(s["value"][1]) for s in prometheus_query(
            prometheus_url, 'namespace_model_name:kvwatch_kv_capacity_tokens:sum{namespace="e2e"}')}
        assert capacity == {"e2e-sglang": (BLOCKS - 1) * BLOCK_SIZE, "e2e-tensorrt-llm": (BLOCKS - 1) * BLOCK_SIZE}
        kinds = {s["metric"]["engine_kind"] for s in prometheus_query(prometheus_url, "kvwatch_source_info")}
        assert kinds == {"sglang", "tensorrt-llm"}
    finally:
        for process in reversed(processes):
            process.stop()
    assert all(not p.alive() for p in processes)
