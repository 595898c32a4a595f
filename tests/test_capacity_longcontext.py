"""plan --json's long_context block: requests at max_model_len, prefill time, probes, the max_model_len that fits 4.

The prefill estimate is checked against a published measurement, not against its own formula: MInference's
authors (microsoft/MInference issue 84, correcting their paper) report that prefilling LLaMA-3-8B on one A100
takes about 3 minutes for 300K tokens and about 30 minutes for 1M tokens with dense attention.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvwatch.capacity import DeploymentSpec, plan_capacity, presets
from kvwatch.capacity.longcontext import DEFAULT_MFU, long_context, prefill_flops
from kvwatch.cli import main

pytestmark = pytest.mark.usefixtures("no_kvwatch_env")


@pytest.mark.parametrize(("tokens", "published_seconds"), [(300_000, 3 * 60), (1_000_000, 30 * 60)])
def test_prefill_estimate_is_near_the_published_dense_prefill_times(tokens, published_seconds):
    arch = presets.match_model("meta-llama/Meta-Llama-3-8B-Instruct").arch
    a100 = presets.resolve_gpu("A100-80GB")
    flops, routing_known = prefill_flops(arch, tokens)
    seconds = flops / (a100.bf16_tflops * 1e12 * DEFAULT_MFU)
    assert routing_known
    assert seconds == pytest.approx(published_seconds, rel=0.35)


def run(argv, capsys):
    code = main(argv)
    return code, capsys.readouterr().out


def test_qwen_1m_on_one_h100_warns_and_names_the_length_that_fits_4(capsys):
    code, out = run(["plan", "--model", "Qwen/Qwen2.5-7B-Instruct-1M", "--gpu", "H100", "--json"], capsys)
    data = json.loads(out)
    lc = data["long_context"]
    assert code == 0 and data["max_model_len"] == 1010000
    assert lc["requests_at_max_model_len"] == data["max_concurrency_at_max_model_len"] < 2
    assert lc["chunked_prefill_steps"] == -(-1010000 // 8192)
    assert lc["prefill_seconds_estimate"] > 60  # minutes, not seconds
    assert lc["probe_initial_delay_seconds"] >= lc["prefill_seconds_estimate"]
    fits = lc["max_model_len_for_4_requests"]
    assert any(f"--max-model-len {fits} fits 4" in w for w in data["warnings"])
    # that length really fits 4 (vLLM's whole-block rule), one block more does not
    code, out = run(["plan", "--model", "Qwen/Qwen2.5-7B-Instruct-1M", "--gpu", "H100", "--json",
                     "--max-model-len", str(fits)], capsys)
    assert json.loads(out)["max_concurrency_at_max_model_len"] >= 4
    code, out = run(["plan", "--model", "Qwen/Qwen2.5-7B-Instruct-1M", "--gpu", "H100", "--json",
                     "--max-model-len", str(fits + 16)], capsys)
    assert json.loads(out)["max_concurrency_at_max_model_len"] < 4


def test_no_warning_when_enough_requests_fit():
    arch = presets.match_model("meta-llama/Llama-3.1-8B-Instruct").arch
    plan = plan_capacity(DeploymentSpec(arch=arch, gpu_memory_bytes=79.19 * 2**30, max_model_len=8192,
                                        gpu_bf16_tflops=989))
    lc = long_context(plan)
    assert lc is not None and lc.warnings == () and lc.requests_at_max_model_len > 50


def test_moe_without_routing_in_config_is_an_upper_bound():
    # the Mixtral preset carries num_experts_per_tok (2, as its config.json says); drop it to get a config without
    arch = dataclasses.replace(presets.match_model("mistralai/Mixtral-8x7B-Instruct-v0.1").arch, experts_per_token=None)
    upper, known = prefill_flops(arch, 1000)
    assert not known
    routed, known = prefill_flops(presets.match_model("mistralai/Mixtral-8x7B-Instruct-v0.1").arch, 1000)
    assert known and routed < upper


@pytest.mark.parametrize("model, experts_per_token", [
    ("deepseek-ai/DeepSeek-V2-Chat", 6), ("deepseek-ai/DeepSeek-V2-Lite-Chat", 6), ("deepseek-ai/DeepSeek-V3", 8),
    ("deepseek-ai/DeepSeek-V3-0324", 8), ("deepseek-ai/DeepSeek-R1", 8), ("deepseek-ai/DeepSeek-R1-0528", 8),
    ("moonshotai/Kimi-K2-Instruct", 8), ("zai-org/GLM-4.5", 8), ("zai-org/GLM-4.5-Air", 8), ("zai-org/GLM-4.6", 8),
    ("Qwen/Qwen3-235B-A22B", 8), ("Qwen/Qwen3-30B-A3B", 8), ("Qwen/Qwen3-Coder-30B-A3B-Instruct", 8),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", 2), ("mistralai/Mixtral-8x22B-Instruct-v0.1", 2),
    ("openai/gpt-oss-20b", 4), ("openai/gpt-oss-120b", 4), ("ibm-granite/granite-4.0-h-small", 10),
])
def test_moe_presets_carry_their_routing(model, experts_per_token):
    arch = presets.match_model(model).arch
    assert arch.experts_per_token == experts_per_token
    _, known = prefill_flops(arch, 1000)
    assert known


def test_granite_4_h_small_carries_its_length_field():
    # without max_position_embeddings vLLM assumes 2048 and a 32768-token plan refuses to start
    arch = presets.match_model("ibm-granite/granite-4.0-h-small").arch
    assert arch.derived_max_model_len == 131072


def test_the_length_that_fits_four_is_the_models_own_when_that_fits():
    # Granite-4.0-H-Small on an H100 fits 4.5 requests at its 131,072; rounding the answer down to whole
    # 528-token blocks named 130,944, advising a cut that changes nothing.
    arch = presets.match_model("ibm-granite/granite-4.0-h-small").arch
    plan = plan_capacity(DeploymentSpec(arch=arch, gpu_memory_bytes=presets.resolve_gpu("H100").total_memory_bytes,
                                        gpu_name="H100"))
    lc = long_context(plan)
    assert lc is not None and lc.requests_at_max_model_len >= 4
    assert lc.max_model_len_for_4 == arch.derived_max_model_len == 131_072
