"""The memory budget, estimates, plan_capacity and the what-if scenarios."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvwatch.capacity import (
    DeploymentSpec,
    QuantizationError,
    SpecError,
    default_gpu_memory_utilization,
    parse_bytes,
    plan_capacity,
    resolve_model,
    whatif_ceilings,
    whatif_scenarios,
)
from kvwatch.capacity.memory import estimate_non_torch_bytes, estimate_weights_bytes, resolve_quantization
from kvwatch.settings import DeploymentSettings

GIB = 1 << 30
TUTORIAL = DeploymentSpec(gpu_memory_bytes=80 * GIB, gpu_memory_utilization=0.90, weights_bytes=42 * GIB,
                          activation_bytes=4 * GIB, non_torch_bytes=0, kv_bytes_per_token=0.0008 * GIB)
SCENARIO_ORDER = ["gpu_memory_utilization_0.85", "gpu_memory_utilization_0.95", "max_model_len_halved",
                  "fp8_kv_cache", "fp8_weights", "tensor_parallel_x2"]


def llama_h100(**kw):
    base = DeploymentSpec(arch=resolve_model("meta-llama/Llama-3.1-8B-Instruct"), gpu_memory_bytes=79.19 * GIB,
                          gpu_name="H100-80GB", gpu_memory_utilization=0.95, max_model_len=8192,
                          vllm_version=(0, 19))
    return replace(base, **kw)


def test_tutorial_worked_example():
    plan = plan_capacity(TUTORIAL)
    assert plan.available_kv_bytes == pytest.approx(26 * GIB)
    ceiling = plan.max_concurrency_at(4096)
    # 26 / (0.0008 x 4096) = 7.93 (whole 16-token blocks: 2031 x 16 / 4096 = 7.93); the tutorial's 7.8 is 26 / 3.3
    assert ceiling == pytest.approx(26 / (0.0008 * 4096), rel=1e-3)
    assert 7.8 <= ceiling < 8.0
    assert plan.will_start and plan.max_concurrency_at_max_model_len is None


def test_logged_components_reproduce_vllm_llama_row():
    plan = plan_capacity(llama_h100(weights_bytes=14.99 * GIB, activation_bytes=1.89 * GIB,
                                    non_torch_bytes=0.25 * GIB))
    assert plan.available_kv_bytes / GIB == pytest.approx(58.11, abs=0.01)
    assert plan.kv_cache_tokens == pytest.approx(476016, rel=0.001)
    assert plan.max_concurrency_at_max_model_len == pytest.approx(58.11, abs=0.02)
    assert plan.estimated == ()


def test_estimates_are_flagged_and_close():
    plan = plan_capacity(llama_h100())
    assert set(plan.estimated) == {"weights", "activation", "non_torch"}
    assert any("estimated" in w for w in plan.warnings)
    assert plan.weights_bytes / GIB == pytest.approx(14.99, abs=0.1)
    assert plan.activation_bytes / GIB == pytest.approx(1.89, abs=0.2)


def test_negative_budget_says_will_not_start_with_shortfall():
    plan = plan_capacity(llama_h100(weights_bytes=80 * GIB, activation_bytes=GIB, non_torch_bytes=0))
    assert not plan.will_start and plan.num_gpu_blocks == 0 and plan.kv_cache_tokens == 0
    assert "short by" in plan.errors[0] and "will not start" in plan.errors[0]


def test_pipeline_stages_hold_a_whole_vocabulary_matrix_at_each_end():
    # vLLM builds the embeddings on the first stage and the LM head on the last (the embeddings again where they are
    # tied): Llama-3.1-8B at PP 4 logged 4.26 GiB on rank 0 (calibration row 16), kvwatch said 3.74 with everything
    # divided by the stages; Gemma-3-27B's tied 2.63 GiB matrix counted a quarter at each.
    from kvwatch.capacity import memory

    llama = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    at_pp4 = memory.estimate_weights_bytes(llama, 2, None, 1, 4) / GIB
    assert at_pp4 == pytest.approx(4.26, abs=0.05)
    assert memory.estimate_weights_bytes(llama, 2, None, 1, 1) / GIB == pytest.approx(14.96, abs=0.01)
    gemma = resolve_model("google/gemma-3-27b-it")
    matrix = gemma.vocab_size * gemma.hidden_size * 2
    layers = memory.estimate_weights_bytes(gemma, 2, None, 1, 1) - memory.embedding_bytes(gemma, 2, 1, 1)
    heaviest = memory.estimate_weights_bytes(gemma, 2, None, 1, 4)
    assert gemma.num_layers == 62  # stages of 15, 16, 16 and 15 layers; the ends each hold a whole matrix
    assert heaviest >= matrix + layers * 15 // 62 - 1
    assert memory.embedding_bytes(gemma, 2, 1, 4) >= matrix  # (what --cpu-offload-gb leaves on the stage)


def test_halving_max_model_len_without_chunked_prefill_grows_the_pool_and_says_so():
    # A step holds a whole max-model-len prompt with chunked prefill off, so the profiling peak halves too: the row's
    # pool grew while its note said "the V1 pool is unchanged"
    spec = llama_h100(max_model_len=32768, enable_chunked_prefill=False, vllm_version=(0, 6))
    halved = {s.name: s for s in whatif_scenarios(spec)}["max_model_len_halved"]
    assert halved.plan is not None and halved.plan.kv_cache_tokens > plan_capacity(spec).kv_cache_tokens
    assert "the pool grows" in halved.note and "unchanged" not in halved.note
    on = {s.name: s for s in whatif_scenarios(replace(spec, enable_chunked_prefill=True))}["max_model_len_halved"]
    assert "the pool is unchanged" in on.note
    # ... unless --max-num-batched-tokens fixes the profiled step: the pool stays, and the note said it grew
    pinned = replace(spec, max_num_batched_tokens=32768)
    halved = {s.name: s for s in whatif_scenarios(pinned)}["max_model_len_halved"]
    assert halved.plan is not None and halved.plan.num_gpu_blocks == plan_capacity(pinned).num_gpu_blocks
    assert "the pool is unchanged" in halved.note and "grows" not in halved.note


def test_halving_max_model_len_on_a_sliding_window_model_does_not_claim_half_per_request():
    # gpt-oss's sliding layers hold their 128-token window at any length: the ceiling beside the note rose 1.5x
    # (kvwatch plan --model openai/gpt-oss-20b --gpu H100 --max-model-len 32768), not the 2x "needs half" said.
    spec = llama_h100(arch=resolve_model("openai/gpt-oss-20b"), max_model_len=32768, vllm_version=(0, 20))
    rows = {s.name: s for s in whatif_scenarios(spec)}
    base = plan_capacity(spec)
    halved = rows["max_model_len_halved"]
    assert halved.plan is not None
    assert halved.max_concurrency is not None
    assert 1.0 < halved.max_concurrency / base.max_concurrency_at_max_model_len < 1.9  # (the column it stands beside)
    assert "needs half" not in halved.note and "not half" in halved.note
    dense = {s.name: s for s in whatif_scenarios(llama_h100())}["max_model_len_halved"]
    assert dense.note.endswith("each worst-case request needs half")
    # Within its window a sliding-window model's request does need half (gemma-2's 4096: the ceiling doubles)
    within = llama_h100(arch=resolve_model("google/gemma-2-9b-it"), max_model_len=4096)
    halved = {s.name: s for s in whatif_scenarios(within)}["max_model_len_halved"]
    assert halved.note.endswith("each worst-case request needs half")
    assert halved.max_concurrency == pytest.approx(2 * plan_capacity(within).max_concurrency_at_max_model_len, rel=0.01)
    # Llama-4 Scout's chunked layers hold their chunk at any length: 0.535 of the blocks, the ceiling x1.87, was
    # "needs half"
    scout = llama_h100(arch=resolve_model("meta-llama/Llama-4-Scout-17B-16E-Instruct"), max_model_len=1_048_576,
                       tensor_parallel_size=8)
    halved = {s.name: s for s in whatif_scenarios(scout)}["max_model_len_halved"]
    assert "not half" in halved.note
    # An odd number of blocks halves to one over half, on a model with no windowed layers to blame
    for max_len, block in ((400, 16), (720, 16), (1600, 64), (11520, 256)):
        short = {s.name: s for s in whatif_scenarios(llama_h100(max_model_len=max_len, block_size=block))}
        assert short["max_model_len_halved"].note.endswith("each worst-case request needs half"), (max_len, block)


def test_a_utilization_row_at_todays_setting_says_it_changes_nothing():
    # At --gpu-memory-utilization 0.95 its row read "--gpu-memory-utilization 0.95 (now 0.95)", a fix in a table
    # ranked cheapest first that changes nothing.
    base = plan_capacity(llama_h100(gpu_memory_utilization=0.95))
    rows = {s.name: s for s in whatif_scenarios(llama_h100(gpu_memory_utilization=0.95))}
    assert rows["gpu_memory_utilization_0.95"].kv_cache_tokens == base.kv_cache_tokens
    assert rows["gpu_memory_utilization_0.95"].note == "--gpu-memory-utilization 0.95 is the current setting: no change"
    assert rows["gpu_memory_utilization_0.85"].note == "--gpu-memory-utilization 0.85 (now 0.95)"


def test_no_memory_left_exactly_is_no_negative_shortfall():
    # --available-kv-gib 0 printed "short by -0.00 GiB per GPU"
    plan = plan_capacity(llama_h100(available_kv_bytes=0))
    assert not plan.will_start
    assert plan.errors[0] == "vLLM will not start: no memory left for the KV cache"


def test_budget_too_small_for_one_max_model_len_request():
    plan = plan_capacity(llama_h100(available_kv_bytes=2 * GIB, max_model_len=32768))
    assert not plan.will_start
    assert "lower --max-model-len to about 16384" in plan.errors[0]


def test_a_length_past_the_models_gets_one_fix_where_the_models_own_length_fits_the_memory():
    # Asked for 500,000 tokens of a 131,072-token model on an H100: "lower to at most 131072" and a memory error
    # saying "lower to about 449872", which vLLM refuses too. The model's length fits the
    # pool, so the length refusal is the whole fix; where it does not fit either, the memory's length is smaller.
    plan = plan_capacity(llama_h100(max_model_len=500_000))
    assert len(plan.errors) == 1 and "at most 131072" in plan.errors[0], plan.errors
    small = plan_capacity(llama_h100(max_model_len=500_000, available_kv_bytes=2 * GIB))
    assert len(small.errors) == 2 and "lower --max-model-len to about 16384" in small.errors[1], small.errors


def test_default_utilization_by_version():
    assert default_gpu_memory_utilization((0, 11)) == 0.9
    assert default_gpu_memory_utilization((0, 33)) == 0.92
    plan = plan_capacity(llama_h100(gpu_memory_utilization=None, vllm_version=(0, 33)))
    assert plan.gpu_memory_utilization == 0.92


def test_weights_by_quantization():
    arch = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    bf16 = estimate_weights_bytes(arch, 2, None, 1, 1)
    fp8 = estimate_weights_bytes(arch, 2, "fp8", 1, 1)
    int4 = estimate_weights_bytes(arch, 2, "awq", 1, 1)
    assert bf16 / GIB == pytest.approx(14.96, abs=0.05)
    assert fp8 / GIB == pytest.approx(8.49, abs=0.1)  # vLLM logged 8.49 GiB for the FP8 checkpoint
    assert int4 / GIB == pytest.approx(5.38, abs=0.15)  # and 5.38 GiB for w4a16
    assert estimate_weights_bytes(arch, 2, None, 2, 1) == bf16 // 2
    with pytest.raises(QuantizationError, match="known"):
        estimate_weights_bytes(arch, 2, "int3", 1, 1)


def test_gpt_oss_checkpoint_quantization_is_mxfp4_on_experts_only():
    oss = resolve_model("openai/gpt-oss-20b")
    assert oss.checkpoint_quantization == "mxfp4"
    # vLLM logged 13.47 GiB for gpt-oss-20b on an H100
    assert estimate_weights_bytes(oss, 2, None, 1, 1) / GIB == pytest.approx(13.47, rel=0.08)


@pytest.mark.parametrize(("model", "capability", "tp", "logged_gib"), [
    ("openai/gpt-oss-20b", (9, 0), 1, 13.47),    # H100 (calibration line 33)
    ("openai/gpt-oss-120b", (9, 0), 1, 64.38),   # H100 (line 34); 60.69 GiB without the padding
    ("openai/gpt-oss-120b", (8, 0), 4, 17.2217),  # A100, Marlin kernel, TP4 (line 44)
    ("openai/gpt-oss-120b", (8, 0), 1, 65.9651),  # the Marlin path's padding (line 53 logged a Marlin warning)
])
def test_mxfp4_expert_weights_are_priced_at_vllms_padded_sizes(model, capability, tp, logged_gib):
    arch = resolve_model(model)
    estimate = estimate_weights_bytes(arch, 2, None, tp, 1, compute_capability=capability) / GIB
    assert estimate == pytest.approx(logged_gib, rel=0.01)


def test_mxfp4_padding_by_kernel():
    from kvwatch.capacity.memory import mxfp4_moe_padding

    assert mxfp4_moe_padding(2880, 720, (8, 0)) == (3072, 768)  # Marlin: hidden to 256, intermediate to 128
    assert mxfp4_moe_padding(2880, 2880, (10, 0)) == (3072, 3072)  # SM100 FlashInfer: both to 256
    assert mxfp4_moe_padding(2880, 2880, (9, 0)) == (3072, 2880)  # SM90: intermediate to 64 (2880 already is)
    assert mxfp4_moe_padding(2880, 720, (12, 0)) == (3072, 768)  # SM120: no Triton kernels, Marlin


def test_non_torch_estimate():
    assert estimate_non_torch_bytes(1, 1) == pytest.approx(0.25 * GIB)
    assert estimate_non_torch_bytes(2, 1) == pytest.approx(2.1 * GIB)


def test_missing_inputs_name_the_flags():
    with pytest.raises(SpecError, match="--gpu"):
        plan_capacity(DeploymentSpec(arch=resolve_model("Qwen/Qwen3-8B")))
    with pytest.raises(SpecError, match="--model"):
        plan_capacity(DeploymentSpec(gpu_memory_bytes=80 * GIB))


@pytest.mark.parametrize("dtype", ["nvfp4", "fp8_per_token_head", "turboquant_k8v4", "a_future_one"])
def test_a_kv_cache_dtype_without_known_bytes_is_refused_not_planned_as_the_models(dtype: str):
    # any unknown name was sized as the model's dtype; fp8_per_token_head passed as plain fp8
    with pytest.raises(SpecError, match=f"KV cache dtype {dtype} is one kvwatch cannot size"):
        plan_capacity(llama_h100(kv_cache_dtype=dtype))


def test_a_max_model_len_within_one_block_is_not_halved_into_a_larger_one():
    # --max-model-len 8 with 16-token blocks proposed "--max-model-len 16" as the halving
    halved = {s.name: s for s in whatif_scenarios(llama_h100(max_model_len=8))}["max_model_len_halved"]
    assert halved.kv_cache_tokens is None and halved.plan is None and "within one block" in halved.note


def test_scenarios_in_cheapest_first_order_and_effects():
    spec = llama_h100(weights_bytes=14.99 * GIB, activation_bytes=1.89 * GIB, non_torch_bytes=0.25 * GIB)
    base = plan_capacity(spec)
    scenarios = {s.name: s for s in whatif_scenarios(spec, avg_seq_len=2000)}
    assert list(scenarios) == SCENARIO_ORDER
    assert scenarios["gpu_memory_utilization_0.85"].kv_cache_tokens < base.kv_cache_tokens
    assert scenarios["gpu_memory_utilization_0.95"].kv_cache_tokens == base.kv_cache_tokens
    # V1: halving max_model_len does not change the pool, only the worst-case request
    assert scenarios["max_model_len_halved"].kv_cache_tokens == base.kv_cache_tokens
    assert scenarios["max_model_len_halved"].plan.max_concurrency_at_max_model_len == pytest.approx(
        2 * base.max_concurrency_at_max_model_len, rel=1e-3)
    assert scenarios["fp8_kv_cache"].kv_cache_tokens == pytest.approx(2 * base.kv_cache_tokens, rel=1e-3)
    fp8w = scenarios["fp8_weights"]
    assert fp8w.plan.weights_bytes / GIB == pytest.approx(8.49, abs=0.1)
    assert fp8w.plan.kv_bytes_per_token == base.kv_bytes_per_token  # quantization does not shrink KV
    assert scenarios["tensor_parallel_x2"].kv_cache_tokens > 2 * base.kv_cache_tokens
    assert scenarios["fp8_kv_cache"].max_concurrency == pytest.approx(2 * base.max_concurrency_at(2000), rel=1e-3)


def test_scenarios_that_cannot_gain_say_so():
    spec = llama_h100(kv_cache_dtype="fp8", quantization="fp8")
    by_name = {s.name: s for s in whatif_scenarios(spec)}
    assert "already" in by_name["fp8_kv_cache"].note and "already" in by_name["fp8_weights"].note
    no_len = {s.name: s for s in whatif_scenarios(TUTORIAL, 4096)}
    assert no_len["max_model_len_halved"].kv_cache_tokens is None


def test_whatif_ceilings_at_live_average():
    scenarios = whatif_scenarios(TUTORIAL, 4096)
    at_4096 = whatif_ceilings(scenarios, 4096)
    at_2048 = whatif_ceilings(scenarios, 2048)
    assert set(at_4096) == set(SCENARIO_ORDER) - {"max_model_len_halved"}
    for name, value in at_4096.items():
        assert at_2048[name] == pytest.approx(2 * value, rel=1e-9)
    assert whatif_ceilings(scenarios, 0) == {}


def test_from_settings_resolves_presets_and_overrides(no_kvwatch_env):
    settings = DeploymentSettings(model="RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", gpu="H100",
                                  tensor_parallel_size=2, gpu_memory_utilization=0.95, max_model_len=8192)
    spec = DeploymentSpec.from_settings(settings, weights_bytes=33.88 * GIB, vllm_version="0.19.0")
    # the name implies the checkpoint's scheme; --quantization (None here) stays the user's
    assert spec.quantization is None and spec.vllm_version == (0, 19)
    assert spec.arch.checkpoint_quantization == "fp8"
    assert resolve_quantization(spec.quantization, spec.arch).scheme == "fp8"
    assert spec.gpu_memory_bytes == pytest.approx(79.19 * GIB)
    plan = plan_capacity(spec)
    assert plan.weights_bytes == pytest.approx(33.88 * GIB)
    assert plan.kv_cache_tokens == pytest.approx(244304, rel=0.01)


@pytest.mark.parametrize(("text", "expected"), [("131072", 131072), ("128KiB", 131072), ("0.8MiB", 838_860.8),
                                                 ("0.0008GiB", 858_993.4592), ("1.5 GB", 1.5e9),
                                                 ("0.0008GB", 800_000), ("128kB", 128_000)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == pytest.approx(expected)


def test_decimal_unit_note():
    from kvwatch.capacity.units import decimal_unit_note

    assert decimal_unit_note("0.0008GiB") is None and decimal_unit_note("131072") is None
    note = decimal_unit_note("0.0008GB")
    assert note is not None and "800,000 B" in note and "0.0008GiB would be 858,993 B" in note


@pytest.mark.parametrize("text", ["", "abc", "12 parsecs", "-3MiB", "0", "1e400", "1e300GiB", "1025TiB"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_sidecar_capacity_from_label_and_reasons(no_kvwatch_env):
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity

    settings = DeploymentSettings(gpu="H100", max_model_len=8192, gpu_memory_utilization=0.95)
    capacity, why = build_sidecar_capacity(settings, model_name="/models/Llama-3.1-8B-Instruct")
    assert capacity is not None and why == ""
    assert capacity.plan.kv_cache_tokens == pytest.approx(476016, rel=0.02)
    ceilings = capacity.whatif_max_concurrency(2000)
    assert list(ceilings) == SCENARIO_ORDER
    assert ceilings["fp8_kv_cache"] > ceilings["gpu_memory_utilization_0.95"]
    none, why = build_sidecar_capacity(settings, model_name="acme/unknown")
    assert none is None and "no preset" in why
    none, why = build_sidecar_capacity(DeploymentSettings(model="Qwen/Qwen3-8B"))
    assert none is None and "--gpu" in why
    assert build_sidecar_capacity(DeploymentSettings(), None)[0] is None


def test_tp_scenario_for_mla_keeps_kv_per_token():
    spec = DeploymentSpec(arch=resolve_model("deepseek-ai/DeepSeek-R1"), gpu_memory_bytes=139.81 * GIB,
                          tensor_parallel_size=8, max_model_len=32768)
    base = plan_capacity(spec)
    tp16 = {s.name: s for s in whatif_scenarios(spec)}["tensor_parallel_x2"]
    assert tp16.plan.kv_bytes_per_token == base.kv_bytes_per_token == 61 * 576 * 2
    assert "MLA" in tp16.note
    assert tp16.kv_cache_tokens > base.kv_cache_tokens  # freed weight memory still helps


def test_tp_scenario_scales_a_given_kv_bytes_per_token_as_the_model_splits_it():
    # DeepSeek-V2-Lite given its 31,104 B a token: MLA KV is not split by TP, and the given figure was halved (454
    # requests where the TP-2 plan says 227); Llama-70B at TP 8 has its 8 KV heads replicated past it.
    def tp2(model: str, tp: int, kv_bytes: int | None) -> tuple[float, str]:
        spec = DeploymentSpec(arch=resolve_model(model), gpu_memory_bytes=79.19 * GIB, tensor_parallel_size=tp,
                              max_model_len=8192, kv_bytes_per_token=kv_bytes)
        row = {s.name: s for s in whatif_scenarios(spec)}["tensor_parallel_x2"]
        return row.plan.kv_bytes_per_token, row.note

    lite = "deepseek-ai/DeepSeek-V2-Lite-Chat"
    assert tp2(lite, 1, 31104)[0] == tp2(lite, 1, None)[0] == 31104
    assert "MLA KV is not split" in tp2(lite, 1, 31104)[1]
    assert tp2("meta-llama/Llama-3.1-70B-Instruct", 8, 40960)[0] == 40960
    assert tp2("meta-llama/Llama-3.1-8B-Instruct", 1, 131072)[0] == 65536
    # the bytes are given, the model is known: a size vLLM refuses is refused all the same (phi-4's 10 KV heads at
    # TP 4 showed a ceiling where the same plan without the bytes said vLLM refuses it)
    phi = DeploymentSpec(arch=resolve_model("microsoft/phi-4"), gpu_memory_bytes=79.19 * GIB, tensor_parallel_size=2,
                         max_model_len=8192, kv_bytes_per_token=102400)
    row = {s.name: s for s in whatif_scenarios(phi)}["tensor_parallel_x2"]
    assert row.kv_cache_tokens is None and "invalid value 4 for --tensor-parallel-size" in row.note
    with pytest.raises(SpecError, match="invalid value 4"):
        plan_capacity(replace(phi, tensor_parallel_size=4))
    # without the model the split is an assumption, and the note says so
    bare = DeploymentSpec(arch=None, gpu_memory_bytes=79.19 * GIB, weights_bytes=29.3 * GIB, max_model_len=8192,
                          activation_bytes=2 * GIB, non_torch_bytes=0.25 * GIB, cuda_graph_bytes=0.8 * GIB,
                          kv_bytes_per_token=31104)
    rows = {s.name: s for s in whatif_scenarios(bare)}
    assert "if the model's KV heads split" in rows["tensor_parallel_x2"].note
    assert "assumes 16-bit weights" in rows["fp8_weights"].note


def test_fp8_weights_promise_nothing_when_the_measured_weights_look_quantized_already():
    # RedHat's FP8 Llama-3.3-70B at TP 2 planned as its bf16 base with vLLM's measured 33.88 GiB: +44 % promised
    spec = DeploymentSpec(arch=resolve_model("meta-llama/Llama-3.3-70B-Instruct"), gpu_memory_bytes=79.19 * GIB,
                          tensor_parallel_size=2, max_model_len=8192, weights_bytes=33.88 * GIB)
    base = plan_capacity(spec)
    row = {s.name: s for s in whatif_scenarios(spec)}["fp8_weights"]
    assert row.kv_cache_tokens == base.kv_cache_tokens and "look quantized already" in row.note
    as_bf16 = replace(spec, weights_bytes=65.7 * GIB)
    row = {s.name: s for s in whatif_scenarios(as_bf16)}["fp8_weights"]
    assert row.kv_cache_tokens > 2 * plan_capacity(as_bf16).kv_cache_tokens


def test_the_halved_max_model_len_shows_no_ceiling_for_requests_longer_than_it():
    # At --avg-seq-len 6000 and --max-model-len 8192 the halved scenario showed 65.8 requests of 6,000 tokens under
    # --max-model-len 4096, which the base plan itself refuses.
    spec = DeploymentSpec.from_settings(DeploymentSettings(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100",
                                                           max_model_len=8192))
    halved = {s.name: s for s in whatif_scenarios(spec, avg_seq_len=6000)}["max_model_len_halved"]
    assert halved.max_concurrency is None and "longer than --max-model-len 4,096" in halved.note
    fits = {s.name: s for s in whatif_scenarios(spec, avg_seq_len=2000)}["max_model_len_halved"]
    assert fits.max_concurrency is not None and fits.max_concurrency > 0


def test_an_mla_plan_says_vllm_raises_its_block_size_on_nvidia() -> None:
    # vllm/platforms/cuda.py forces 64 tokens for FlashMLA and 128 for CUTLASS MLA ("Forcing kv
    # cache block size to 64 for FlashMLA backend." in 0.8.3's and 0.10.1's logs); the plan said 16 without a word
    spec = DeploymentSpec(arch=resolve_model("deepseek-ai/DeepSeek-V3"), available_kv_bytes=40 * GIB,
                          tensor_parallel_size=8, max_model_len=10000)
    (note,) = [n for n in plan_capacity(spec).notes if n.startswith("MLA on NVIDIA GPUs")]
    assert "from 16 to 64 tokens" in note and "--block-size 64" in note
    for block_size in (64, 128):
        assert not [n for n in plan_capacity(replace(spec, block_size=block_size)).notes if n.startswith("MLA on")]
    assert not [n for n in plan_capacity(llama_h100()).notes if n.startswith("MLA on")]


def test_fp8_weights_what_if_reads_the_weights_as_priced_not_the_schemes_nominal_bytes() -> None:
    # experts_int8 on a dense model leaves its weights in bf16, yet the what-if said "already
    # experts_int8: no gain" where --quantization fp8 planned directly gives 11.8 % more tokens
    dense = llama_h100(quantization="experts_int8")
    fp8 = {s.name: s for s in whatif_scenarios(dense)}["fp8_weights"]
    direct = plan_capacity(llama_h100(quantization="fp8"))
    assert "no gain" not in fp8.note
    assert fp8.kv_cache_tokens == direct.kv_cache_tokens > plan_capacity(dense).kv_cache_tokens
    already = {s.name: s for s in whatif_scenarios(llama_h100(quantization="fp8"))}["fp8_weights"]
    assert "already fp8: no gain" in already.note
    awq = {s.name: s for s in whatif_scenarios(llama_h100(quantization="awq"))}["fp8_weights"]
    assert "no gain" in awq.note  # 4-bit weights: FP8 would take more


def test_a_measured_pool_with_a_known_model_re_budgets_fp8_and_tp_from_the_weights_estimate() -> None:
    # --model with --available-kv-gib left both rows blank, asking for "--weights-gib or --model"
    measured = llama_h100(available_kv_bytes=58.11 * GIB)
    rows = {s.name: s for s in whatif_scenarios(measured)}
    weights = estimate_weights_bytes(measured.arch, 2, None, 1, 1)
    told = replace(measured, weights_bytes=weights)
    for name in ("fp8_weights", "tensor_parallel_x2"):
        assert rows[name].kv_cache_tokens is not None, rows[name].note
        assert f"weights {weights / GIB:.2f} GiB per GPU, estimated from the model" in rows[name].note
        assert rows[name].kv_cache_tokens == {s.name: s for s in whatif_scenarios(told)}[name].kv_cache_tokens
    formula = {s.name: s for s in whatif_scenarios(llama_h100())}  # (the estimate is the plan's own there: no note)
    assert "estimated from the model" not in formula["fp8_weights"].note + formula["tensor_parallel_x2"].note
    no_model = {s.name: s for s in whatif_scenarios(replace(measured, arch=None, kv_bytes_per_token=131072))}
    assert no_model["fp8_weights"].kv_cache_tokens is None
    assert "--weights-gib, or --model" in no_model["fp8_weights"].note


def test_a_weights_estimate_that_cannot_stand_beside_the_measured_pool_re_budgets_nothing() -> None:
    # DeepSeek-V3 on one H100 beside a measured 40 GiB: TP x2 "freed" half of the 634 GiB estimate, 5.4M tokens
    # on an 80 GB card. The two together past the card: the estimate is wrong for this server, so no row.
    deepseek = replace(llama_h100(), arch=resolve_model("deepseek-ai/DeepSeek-V3"), available_kv_bytes=40 * GIB,
                       max_model_len=4096)
    rows = {s.name: s for s in whatif_scenarios(deepseek)}
    assert rows["tensor_parallel_x2"].kv_cache_tokens is None
    assert "do not fit the 79 GiB card: pass --weights-gib" in rows["tensor_parallel_x2"].note
    told = {s.name: s for s in whatif_scenarios(replace(deepseek, weights_bytes=30 * GIB))}
    assert told["tensor_parallel_x2"].kv_cache_tokens  # (measured weights are taken as they are)


def test_vllm_0_34_measures_its_own_pool_and_the_plan_says_its_sums_are_0_33s():
    # 0.34.0's extensible KV cache sizes the pool from memory measured after warm-up (utilization 1.0 unless given,
    # blocks of 64): the plan for 0.34 was 0.33's, byte for byte, without a word
    from kvwatch.capacity.findings import vllm_refusals

    spec = llama_h100(vllm_version=(0, 34))
    plan = plan_capacity(spec)
    assert plan.pool_measured_by_engine and any("extensible KV cache" in w for w in plan.warnings)
    assert not plan_capacity(llama_h100(vllm_version=(0, 33))).pool_measured_by_engine
    assert not plan_capacity(replace(spec, available_kv_bytes=50 * GIB)).pool_measured_by_engine  # measured: its own
    # its memory refusals are not vLLM's there (a serving engine read "will not start"); the others are
    short = plan_capacity(replace(spec, gpu_memory_bytes=16 * GIB))
    assert short.memory_errors and short.errors and vllm_refusals(short) == ()
    old = plan_capacity(replace(spec, gpu_memory_bytes=16 * GIB, vllm_version=(0, 33)))
    assert vllm_refusals(old) == old.errors != ()
