"""KV geometry: bytes per token, vLLM's layer grouping, blocks, tokens and concurrency."""

from __future__ import annotations

import math

import pytest

from kvwatch.capacity import arch_from_config, resolve_model
from kvwatch.capacity.kv import (
    group_layers,
    kv_dtype_bytes,
    kv_layout,
    max_concurrency_at,
    max_concurrency_at_max_model_len,
    num_gpu_blocks,
    pp_stage_sizes,
    reported_kv_cache_tokens,
)
from kvwatch.capacity.layers import FULL, SLIDING

GIB = 1 << 30
V19, V20, V08 = (0, 19), (0, 20), (0, 8)


def llama8b():
    return resolve_model("meta-llama/Llama-3.1-8B-Instruct")


def test_llama_8b_worked_example_from_reference():
    # 2*32*8*128*2 = 128 KiB per token; one 16-token block across all layers = 2 MiB.
    layout = kv_layout(llama8b(), tp=1, pp=1, kv_bytes=2, block_size=16, version=V20)
    assert layout.kv_bytes_per_token == 131072
    assert layout.bytes_per_block_row == 2 << 20
    blocks = num_gpu_blocks(20 * GIB, layout)
    assert blocks == 10240
    assert reported_kv_cache_tokens(layout, blocks, 8192, 8192, V20) == 163840
    assert max_concurrency_at_max_model_len(layout, blocks, 8192, 8192) == pytest.approx(20.0)
    fp8 = kv_layout(llama8b(), 1, 1, kv_dtype_bytes("fp8", 2), 16, V20)
    assert num_gpu_blocks(20 * GIB, fp8) == 20480


@pytest.mark.parametrize(("tp", "expected"), [(1, 131072), (2, 65536), (8, 16384), (16, 16384)])
def test_kv_heads_split_by_tp_then_replicated(tp, expected):
    assert kv_layout(llama8b(), tp, 1, 2, 16, V20).kv_bytes_per_token == expected


def test_pipeline_parallel_divides_layers():
    assert kv_layout(llama8b(), 1, 2, 2, 16, V20).kv_bytes_per_token == 65536
    assert kv_layout(llama8b(), 1, 4, 2, 16, V20).kv_bytes_per_token == 32768


def test_mla_is_latent_per_layer_and_not_divided_by_tp():
    ds = resolve_model("deepseek-ai/DeepSeek-V3")
    for tp in (1, 8, 16):
        assert kv_layout(ds, tp, 1, 2, 16, V20).kv_bytes_per_token == 61 * (512 + 64) * 2


@pytest.mark.parametrize(("kv", "model", "expected"),
                         [("auto", 2, 2), ("auto", 4, 4), ("fp8", 2, 1), ("fp8_e5m2", 2, 1), ("bf16", 4, 2)])
def test_kv_dtype_bytes(kv, model, expected):
    assert kv_dtype_bytes(kv, model) == expected


def test_gemma2_groups_equal_buckets_and_v019_token_rule():
    g = resolve_model("google/gemma-2-2b-it")
    layout = kv_layout(g, 1, 1, 2, 16, V19)
    assert (layout.group_size, layout.num_groups) == (13, 2)
    assert layout.bytes_per_block_row == 16 * 13 * 4 * 256 * 2 * 2  # as in the v0.19 log
    blocks = num_gpu_blocks(66.47 * GIB, layout)
    # vLLM logged 83,770 blocks and 670,160 tokens from 66.47 GiB (rounded to 0.01 GiB in the log)
    assert abs(blocks - 83770) <= 5
    assert reported_kv_cache_tokens(layout, 83770, 8192, 8192, V19) == 670160
    # "Maximum concurrency for 8,192 tokens per request: 81.73x": full group 512 blocks + sliding 513
    assert max_concurrency_at_max_model_len(layout, 83770, 8192, 8192) == pytest.approx(81.73, abs=0.005)


def test_gemma3_five_to_one_pattern_makes_seven_groups():
    g3 = resolve_model("google/gemma-3-27b-it")
    assert g3.layer_types.count(FULL) == 10 and g3.layer_types.count(SLIDING) == 52
    layout = kv_layout(g3, 1, 1, 2, 16, V20)
    assert (layout.group_size, layout.num_groups) == (10, 7)


def test_group_size_uses_largest_bucket_when_close():
    size, groups = group_layers((FULL,) * 12 + (SLIDING,) * 14, 128, V20)
    assert size == 14 and len(groups) == 2


def test_before_hybrid_grouping_every_layer_counts_as_full():
    g = resolve_model("google/gemma-2-2b-it")
    layout = kv_layout(g, 1, 1, 2, 16, V08)
    assert layout.num_groups == 1 and layout.group_size == 26


def test_v020_tokens_come_from_concurrency_and_depend_on_max_model_len():
    g = resolve_model("google/gemma-2-2b-it")
    layout = kv_layout(g, 1, 1, 2, 16, V20)
    short = reported_kv_cache_tokens(layout, 10000, 8192, 2048, V20)
    long = reported_kv_cache_tokens(layout, 10000, 65536, 2048, V20)
    assert short != long
    # uniform models: the same figure in both rules when max_model_len is a block multiple
    lay = kv_layout(llama8b(), 1, 1, 2, 16, V20)
    assert reported_kv_cache_tokens(lay, 1234, 8192, 8192, V20) == reported_kv_cache_tokens(lay, 1234, 8192, 8192, V19)


def test_gpt_oss_120b_v0_10_concurrency_matches_log():
    # A100 TP4, max_model_len 16384, max_num_batched_tokens 2048: vLLM logged 284.25x and 2,640,144 tokens.
    oss = resolve_model("openai/gpt-oss-120b")
    layout = kv_layout(oss, 4, 1, 2, 16, (0, 10))
    blocks = 2640144 // 16 * 2
    assert max_concurrency_at_max_model_len(layout, blocks, 16384, 2048) == pytest.approx(284.25, abs=0.01)


def test_continuous_ceiling_matches_tutorial_formula_on_uniform_models():
    layout = kv_layout(llama8b(), 1, 1, 2, 16, V20)
    blocks = num_gpu_blocks(20 * GIB, layout)
    assert max_concurrency_at(layout, blocks, 4096, 8192) == pytest.approx(20 * GIB / (4096 * 131072))
    with pytest.raises(ValueError):
        max_concurrency_at(layout, blocks, 0, 8192)


def test_sliding_layers_hold_their_window_and_the_in_flight_tokens_once():
    g = arch_from_config({"model_type": "gemma2", "num_hidden_layers": 4, "num_attention_heads": 4,
                          "num_key_value_heads": 1, "hidden_size": 256, "head_dim": 64, "sliding_window": 1024})
    layout = kv_layout(g, 1, 1, 2, 16, V20)
    short = max_concurrency_at(layout, 100000, 1000, 512)
    long = max_concurrency_at(layout, 100000, 100000, 512)
    # at 100k tokens the sliding group holds its window and a block, so the ceiling is ~half the all-full one; the
    # tokens prefill steps add beyond the window (at most 512 in all) are taken from the pool once, not per request
    assert long == pytest.approx((100000 * 16 - 512) / (100000 + 1023 + 16))
    # within the window: as full attention, whole blocks of its 1,000 tokens (63 of 16) in each group
    assert short == pytest.approx(100000 * 16 / (1008 + 1008))
    # vLLM's own worst case at max_model_len still charges every request the step's tokens (its log's figure)
    from kvwatch.capacity.kv import max_concurrency_at_max_model_len
    assert max_concurrency_at_max_model_len(layout, 100000, 100000, 512) == \
        pytest.approx(100000 / (6250 + math.ceil((1024 - 1 + 512) / 16) + 1))


def test_sliding_window_holds_in_flight_tokens_from_0_26():
    from kvwatch.capacity.kv import blocks_needed, in_flight_tokens
    from kvwatch.capacity.planner import DeploymentSpec, plan_capacity

    # Up to 0.25: window - 1 + max_num_batched_tokens; from 0.26.0 (the first vllm/v1/kv_cache_interface.py that
    # reads VllmConfig.max_in_flight_tokens): window - 1 + max_concurrent_batches x batched, with 2 batches in
    # flight under async scheduling (PP 1) and PP batches under pipeline parallelism.
    v25, v26 = (0, 25), (0, 26)
    assert in_flight_tokens(8192, 1, V20) == in_flight_tokens(8192, 1, v25) == 8192
    assert in_flight_tokens(8192, 1, v26) == 16384
    assert in_flight_tokens(8192, 4, v26) == 32768
    gemma = resolve_model("google/gemma-2-9b-it")
    # cdiv(min(4095 + X, 20001), 16) + 1
    for version, sliding_blocks in ((V19, 768 + 1), (v25, 768 + 1), (v26, 1251 + 1)):
        spec = DeploymentSpec(arch=gemma, gpu_memory_bytes=79.19 * GIB, gpu_name="H100-80GB", max_model_len=20001,
                              gpu_memory_utilization=0.95, vllm_version=version)
        plan = plan_capacity(spec)
        assert blocks_needed(plan.layout, 20001, plan.in_flight_tokens) == 1251 + sliding_blocks


def test_only_documented_presets_depend_on_the_grouping_threshold_version():
    # vLLM copies differ on when the larger attention-type bucket sets the group size: under 1.25x the smaller
    # one (2025-06 code) or under 1.5x (later; kvwatch's rule). Only bucket ratios in [1.25, 1.5) tell them apart;
    # docs/capacity.md lists the cases among the presets.
    from kvwatch.capacity.kv import layers_on_rank
    from kvwatch.capacity.presets import preset_names

    affected = set()
    for pp in (1, 2, 4, 8):
        for name in preset_names():
            types = resolve_model(name).attention_layer_types
            if pp > len(types):
                continue
            stage = types[:layers_on_rank(len(types), pp)]
            full, sliding = stage.count("full_attention"), stage.count("sliding_attention")
            if full and sliding and 1.25 <= max(full, sliding) / min(full, sliding) < 1.5:
                affected.add((name, pp))
    assert affected == {("google/gemma-2-2b-it", 4), ("openai/gpt-oss-120b", 4)}


@pytest.mark.parametrize(("pp", "slots", "requests"), [(1, 10, 1.91), (2, 5, 3.82), (3, 4, 3.51), (4, 3, 3.81)])
def test_pipeline_stages_hold_their_share_of_the_whole_models_groups(pp, slots, requests):
    # vLLM groups the whole model's layers (Gemma-3-27B: 10 full, 52 sliding -> 7 groups of 10, the sliding ones
    # dealt round-robin) and each stage holds its share of every group; its block row is its largest share
    # (get_kv_cache_configs in vllm/v1/core/kv_cache_utils.py, 0.11-0.32). kvwatch grouped the first stage's layers
    # on their own: at PP 3 and 4, 4.69 and 5.00 requests of 32k where vLLM's sums give 3.51 and
    # 3.81; PP 1 and 2 matched and still do.
    from kvwatch.capacity import planner
    from kvwatch.capacity.memory import GIB

    spec = planner.DeploymentSpec(arch=resolve_model("google/gemma-3-27b-it"), gpu_memory_bytes=80 * GIB,
                                  pipeline_parallel_size=pp, max_model_len=32768, available_kv_bytes=20 * GIB)
    plan = planner.plan_capacity(spec)
    assert plan.layout.group_size == slots and len(plan.layout.groups) == 7
    assert round(plan.max_concurrency_at_max_model_len, 2) == requests
    assert pp_stage_sizes(62, 4) == [15, 16, 16, 15] and pp_stage_sizes(62, 3) == [21, 21, 20]


def test_the_in_flight_budget_beyond_the_windows_counts_every_prompt_it_holds():
    # Several prompts are prefilled in one step, each holding its own tokens beyond the window:
    # a budget of 16,384 tokens is four 4,000-token prompts, 4 × 2,961 beyond what a running request holds (1,023 of
    # its 1,024 window and a block), and 384 of a fifth, not one prompt's 2,961.
    from kvwatch.capacity.kv import in_flight_reserve

    g = arch_from_config({"model_type": "gemma2", "num_hidden_layers": 4, "num_attention_heads": 4,
                          "num_key_value_heads": 1, "hidden_size": 256, "head_dim": 64, "sliding_window": 1024})
    layout = kv_layout(g, 1, 1, 2, 16, V20)  # one full group, one sliding group
    assert in_flight_reserve(layout, 4000, 16384) == 4 * 2961 + 384
    assert in_flight_reserve(layout, 100000, 512) == 512  # a long prompt's chunk: the budget itself
    assert in_flight_reserve(layout, 1000, 16384) == 0  # within the window: nothing beyond it


def test_a_window_never_lowers_the_ceiling_and_the_mean_never_falls_below_vllms_worst_case():
    # A request shorter than the window was charged a block more per sliding group than under full
    # attention (Mistral-7B-v0.1 at 100 tokens: 4,099 where v0.3 without a window read 4,754); and with fewer requests
    # fitting than the in-flight budget holds prompts, the budget taken whole put the ceiling at max_model_len under
    # vLLM's own (gemma-2-9b on an L4: 0.101 where vLLM says 0.326).
    sliding = {"model_type": "gemma2", "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 1,
               "hidden_size": 256, "head_dim": 64, "sliding_window": 1024}
    from dataclasses import replace

    layout = kv_layout(arch_from_config(sliding), 1, 1, 2, 16, V20)
    full = replace(layout, groups=tuple(replace(g, kind=FULL) for g in layout.groups))  # the same pool, no window
    for length in (10, 100, 1000, 1023, 1024, 1040, 1041, 5000):
        assert max_concurrency_at(layout, 1000, length, 8192) >= max_concurrency_at(full, 1000, length, 8192), length
    from kvwatch.capacity.kv import max_concurrency_at_max_model_len

    # (odd budgets too: window − 1 + budget a whole number of blocks, where a token more per group fell below it)
    for blocks, max_len, in_flight in ((30, 8192, 8192), (300, 8192, 16384), (3000, 32768, 2048), (20, 4096, 512),
                                       (10, 4096, 2049), (300, 8192, 8193), (3000, 32768, 1)):
        assert max_concurrency_at(layout, blocks, max_len, in_flight) >= \
            max_concurrency_at_max_model_len(layout, blocks, max_len, in_flight) * (1 - 1e-9), (blocks, max_len)


def test_a_request_shorter_than_a_block_holds_a_whole_one_in_each_group():
    # the continuous count read 16x as many 1-token requests as the blocks hold (vLLM gives each a
    # block in every group)
    g = arch_from_config({"model_type": "gemma2", "num_hidden_layers": 4, "num_attention_heads": 4,
                          "num_key_value_heads": 1, "hidden_size": 256, "head_dim": 64, "sliding_window": 1024})
    layout = kv_layout(g, 1, 1, 2, 16, V20)  # two groups
    assert max_concurrency_at(layout, 1000, 1, 512) == pytest.approx(1000 / 2)
    assert max_concurrency_at(layout, 1000, 16, 512) == pytest.approx(1000 / 2)


def test_a_plans_ceiling_counts_whole_blocks_as_the_sidecar_does():
    # A request holds whole blocks. plan counted 300 tokens as 300 (1,499 requests of 300 in 1,757 blocks of 256)
    # where the engine's blocks hold 878 of them, the figure check and the sidecar read from the same pool.
    from kvwatch.derived import derive
    from kvwatch.model import Reading

    layout = kv_layout(llama8b(), tp=1, pp=1, kv_bytes=2, block_size=256, version=V20)
    assert max_concurrency_at(layout, 1757, 300, 0) == pytest.approx(1757 / 2)
    engine = Reading("m", kv_usage_ratio=0.5, kv_capacity_tokens=1757 * 256.0, num_gpu_blocks=1757.0,
                     block_size=256.0, request_prompt_tokens_sum=2000.0, request_prompt_tokens_count=10.0,
                     request_generation_tokens_sum=1000.0, request_generation_tokens_count=10.0)
    assert derive(engine, None).max_concurrency["observed_mix"] == pytest.approx(1757 / 2)
    # At 16-token blocks a 3,000-token request holds 188 of them, 3,008 tokens; 4,096 tokens are 256 blocks exactly.
    layout = kv_layout(llama8b(), tp=1, pp=1, kv_bytes=2, block_size=16, version=V20)
    assert max_concurrency_at(layout, 40960, 3000, 0) == pytest.approx(40960 * 16 / 3008)
    assert max_concurrency_at(layout, 40960, 4096, 0) == pytest.approx(40960 * 16 / 4096)
