"""The capacity model inside serve: formula capacity beside vLLM's, what-if ceilings at the live mix."""

from __future__ import annotations

import pytest

from kvwatch.capacity.analyzer import CapacityAnalyzer, live_kv_tokens_per_request
from kvwatch.capacity.planner import DeploymentSpec, plan_capacity
from kvwatch.model import Reading
from kvwatch.settings import ServeSettings

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def reading(**kw) -> Reading:
    base = dict(model_name=LLAMA, engine="0", kv_usage_ratio=0.5, requests_running=10.0,
                kv_capacity_tokens=400_000.0)
    base.update(kw)
    return Reading(**base)


def families(analyzer: CapacityAnalyzer, r: Reading) -> dict[str, list]:
    result = analyzer.analyze(r.key, None, r, 0.0)  # type: ignore[arg-type]
    assert result is not None
    return {f.name: f.samples for f in analyzer.families({r.key: result}, 0.0)}


def test_live_tokens_per_request_is_used_tokens_over_running() -> None:
    assert live_kv_tokens_per_request(reading()) == pytest.approx(20_000.0)
    assert live_kv_tokens_per_request(reading(requests_running=0.0)) is None
    assert live_kv_tokens_per_request(reading(kv_capacity_tokens=None)) is None


def test_formula_capacity_matches_the_planner_for_the_preset_named_by_vllm() -> None:
    settings = ServeSettings(gpu="H100")
    out = families(CapacityAnalyzer(settings), reading())
    expected = plan_capacity(DeploymentSpec.from_settings(settings.model_copy(update={"model": LLAMA})))
    [sample] = out["kvwatch_formula_kv_capacity_tokens"]
    assert sample.labels == {"model_name": LLAMA, "engine": "0"}
    assert sample.value == expected.kv_cache_tokens > 100_000


def test_whatif_ceilings_follow_the_live_mix_and_rank_fp8_above_today() -> None:
    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100"))
    small = {s.labels["scenario"]: s.value for s in families(analyzer, reading())["kvwatch_whatif_max_concurrency"]}
    large = {s.labels["scenario"]: s.value
             for s in families(analyzer, reading(kv_usage_ratio=1.0))["kvwatch_whatif_max_concurrency"]}
    assert {"fp8_kv_cache", "tensor_parallel_x2", "gpu_memory_utilization_0.95"} <= set(small)
    # Twice the tokens per request halves every ceiling.
    for name, value in small.items():
        assert large[name] == pytest.approx(value / 2)
    assert small["fp8_kv_cache"] > small["gpu_memory_utilization_0.95"] > small["gpu_memory_utilization_0.85"]


def test_unknown_model_or_gpu_exports_nothing_and_does_not_raise() -> None:
    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100"))
    r = reading(model_name="my-private-finetune")
    assert analyzer.analyze(r.key, None, r, 0.0) is None  # type: ignore[arg-type]
    no_gpu = CapacityAnalyzer(ServeSettings())
    assert no_gpu.analyze(reading().key, None, reading(), 0.0) is None  # type: ignore[arg-type]
