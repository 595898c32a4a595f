"""The advisor ranks fixes cheapest first and sizes them with the capacity model when the model is known."""

from __future__ import annotations

import pytest

from kvwatch.advisor import ACTIONS, RequestLengths, advise
from kvwatch.capacity import DeploymentSpec, plan_capacity, resolve_model

GIB = 2**30


@pytest.fixture(scope="module")
def llama_plan():
    arch = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    return plan_capacity(DeploymentSpec(arch=arch, gpu_memory_bytes=80 * GIB, gpu_name="H100", max_model_len=32768))


CHAT = RequestLengths(mean_prompt_tokens=1155, mean_output_tokens=211)


@pytest.mark.parametrize("state", ["ok", "warming_up", "scheduler_limited", "stalled", "unknown"])
def test_no_advice_unless_filling_or_bottleneck(state, llama_plan):
    assert advise(state, recommended_max_concurrency=100, capacity_plan=llama_plan) == []


def test_all_four_fixes_cheapest_first_with_the_model_known(llama_plan):
    advice = advise("bottleneck", recommended_max_concurrency=120, running=150, capacity_plan=llama_plan,
                    request_lengths=CHAT, max_model_len=32768, kv_tokens_per_request=1300)
    assert [a.action for a in advice] == list(ACTIONS)
    assert [a.rank for a in advice] == [1, 2, 3, 4]
    limit, lower, quantize, tp = advice
    assert "120" in limit.message and "150 running" in limit.message
    # Longest observed ~4 x 1366 tokens -> 8192 with margin: the worst-case ceiling rises 4x.
    assert "to 8192" in lower.message and "4.0x" in lower.projected_effect
    assert "x1.1" in quantize.projected_effect  # FP8 weights free ~7.5 GB of an 80 GB card for KV
    assert "x2" in tp.projected_effect and "second card" in tp.projected_effect


def test_max_model_len_not_lowered_when_requests_use_it():
    advice = advise("filling", recommended_max_concurrency=10, request_lengths=CHAT, max_model_len=4096,
                    capacity_tokens=50_000)
    assert "lower_max_model_len" not in [a.action for a in advice]
    # Measured longest request (from histogram buckets) wins over the 4x-mean guess.
    measured = RequestLengths(1155, 211, max_total_tokens=1500)
    lowered = advise("filling", request_lengths=measured, max_model_len=4096, capacity_tokens=50_000)
    assert [a.action for a in lowered] == ["lower_max_model_len", "add_tensor_parallelism"]
    assert "to 2048" in lowered[0].message


def test_without_the_model_quantization_is_not_sized_and_tp_is_generic():
    advice = advise("filling", recommended_max_concurrency=40, capacity_tokens=80_000, kv_tokens_per_request=2000)
    assert [a.action for a in advice] == ["limit_concurrency", "add_tensor_parallelism"]
    assert "from 40 to 80 concurrent requests" in advice[1].projected_effect


def test_already_fp8_weights_are_not_advised_again():
    arch = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    plan = plan_capacity(DeploymentSpec(arch=arch, gpu_memory_bytes=80 * GIB, gpu_name="H100",
                                        max_model_len=32768, quantization="fp8"))
    actions = [a.action for a in advise("bottleneck", recommended_max_concurrency=50, capacity_plan=plan)]
    assert "quantize_weights" not in actions
    assert actions[0] == "limit_concurrency" and actions[-1] == "add_tensor_parallelism"


def test_advise_from_a_forecast_result_and_a_reading():
    from kvwatch.advisor import advise_from_result
    from kvwatch.forecast import ForecastResult
    from kvwatch.model import Reading

    result = ForecastResult(
        timestamp=0.0, state="bottleneck", eta_seconds=0.0, forecast_ratio={600: 1.1, 1800: 1.2},
        request_rate_per_second=20.0, headroom_requests_per_second=-2.0, recommended_max_concurrency=60,
        estimates={"capacity_tokens": 80_000.0, "tokens_per_running_request": 1_300.0},
    )
    reading = Reading(model_name="m", requests_running=70, request_prompt_tokens_sum=115_500,
                      request_prompt_tokens_count=100, request_generation_tokens_sum=21_100,
                      request_generation_tokens_count=100)
    advice = advise_from_result(result, reading, max_model_len=32768)
    assert [a.action for a in advice] == ["limit_concurrency", "lower_max_model_len", "add_tensor_parallelism"]
    assert "60" in advice[0].message and "70 running" in advice[0].message
    ok = ForecastResult(**{**result.__dict__, "state": "ok"})
    assert advise_from_result(ok, reading) == []
