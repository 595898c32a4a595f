"""serve's live capacity findings: the same conditions as check's, exported once sustained in the poll clock."""

from __future__ import annotations

import pytest

from kvwatch.capacity import findings
from kvwatch.history import SeriesHistory
from kvwatch.model import Reading
from kvwatch.serve.capacity import CapacityAnalyzer
from kvwatch.settings import ServeSettings

MODEL = "my-private-finetune"  # no preset: the findings need no capacity model
POLL = 5.0


def reading(usage: float, running: float, waiting: float) -> Reading:
    return Reading(model_name=MODEL, engine="0", kv_usage_ratio=usage, requests_running=running,
                   requests_waiting=waiting, kv_capacity_tokens=100_000.0)


def exported(polls: list[Reading]) -> dict[str, float]:
    """Feed the polls POLL seconds apart and return kvwatch_capacity_finding after the last one."""
    analyzer = CapacityAnalyzer(ServeSettings())
    history = SeriesHistory()
    result = None
    for i, r in enumerate(polls):
        history.append(i * POLL, r)
        result = analyzer.analyze(r.key, history, r, i * POLL)
    assert result is not None
    [family] = [f for f in analyzer.families({polls[-1].key: result}, 0.0) if f.name == "kvwatch_capacity_finding"]
    return {s.labels["finding"]: s.value for s in family.samples}


def polls_for(seconds: float, r: Reading) -> list[Reading]:
    return [r] * (int(seconds / POLL) + 1)


def test_usage_stuck_with_nothing_running_fires_after_five_minutes_not_before():
    stuck = reading(0.97, 0, 0)
    assert exported(polls_for(findings.SUSTAINED_SECONDS - POLL, stuck))["kv_usage_stuck"] == 0.0
    assert exported(polls_for(findings.SUSTAINED_SECONDS, stuck)) == {"kv_usage_stuck": 1.0,
                                                                     "request_exceeds_pool": 0.0}


def test_a_running_request_breaks_the_run():
    stuck = reading(0.97, 0, 0)
    polls = polls_for(400, stuck)
    polls[-10] = reading(0.97, 1, 0)  # 45 s ago something ran: the blocks may have been in use
    assert exported(polls)["kv_usage_stuck"] == 0.0


def test_waiting_forever_on_an_empty_cache_is_request_exceeds_pool():
    out = exported(polls_for(findings.SUSTAINED_SECONDS, reading(0.01, 0, 3)))
    assert out == {"kv_usage_stuck": 0.0, "request_exceeds_pool": 1.0}
    # a busy engine with a queue is not it
    assert exported(polls_for(findings.SUSTAINED_SECONDS, reading(0.6, 8, 3)))["request_exceeds_pool"] == 0.0


def test_serve_and_check_share_one_definition():
    for usage, running, waiting in [(0.97, 0, 0), (0.97, 1, 0), (0.01, 0, 2), (0.2, 0, 2), (0.5, 3, 0)]:
        assert (findings.live_finding("kv_usage_stuck", usage, running, waiting) is not None) == (
            findings.kv_usage_stuck(usage, running, waiting) is not None)
        assert (findings.live_finding("request_exceeds_pool", usage, running, waiting) is not None) == (
            findings.request_exceeds_pool(usage, running, waiting) is not None)


def test_held_since_counts_only_the_unbroken_run_ending_now():
    held = findings.HeldSince()
    assert [held.update(t, h) for t, h in [(15.0, True), (20.0, False), (25.0, True), (30.0, True)]] == [
        0.0, 0.0, 0.0, 5.0]
    assert held.update(35.0, False) == 0.0
    assert held.update(40.0, True) == 0.0 and held.update(45.0, True) == 5.0
    assert held.update(50.0, True, restarted=True) == 0.0  # a new engine process starts a new run


def test_under_num_gpu_blocks_override_no_what_if_adds_kv():
    # vLLM takes --num-gpu-blocks-override as the pool whatever the memory (may_override_num_blocks): FP8 weights
    # or TP x2 free memory that never reaches the cache, so every scenario's ceiling is today's.
    # Before any observed-mix ceiling (1 % used, no request finished) too.
    settings = ServeSettings(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100")
    config = {"block_size": "16", "num_gpu_blocks": "4000", "gpu_memory_utilization": "0.9"}
    results = {}
    for override, usage in (("None", 0.9), ("4000", 0.9), ("4000", 0.01)):
        analyzer = CapacityAnalyzer(settings)
        r = Reading(model_name="meta-llama/Llama-3.1-8B-Instruct", engine="0", kv_usage_ratio=usage,
                    requests_running=20, requests_waiting=0, kv_capacity_tokens=64_000.0, num_gpu_blocks=4000.0,
                    block_size=16.0, cache_config={**config, "num_gpu_blocks_override": override})
        history = SeriesHistory()
        history.append(0.0, r)
        result = analyzer.analyze(r.key, history, r, 0.0)
        assert result is not None
        results[override, usage] = dict(result.whatif_max_concurrency)
    assert results["None", 0.9]["fp8_weights"] > results["None", 0.9]["gpu_memory_utilization_0.85"]
    assert len(set(results["4000", 0.9].values())) == 1
    assert results["4000", 0.9]["fp8_weights"] < results["None", 0.9]["fp8_weights"]
    assert results["4000", 0.01] and all(v == pytest.approx(20 / 0.01) for v in results["4000", 0.01].values())
