"""Attention layer types with KV heads / head sizes of their own: Gemma 4 and MiMo-V2-Flash.

Read in vLLM's source:

- Gemma 4 (Gemma4DecoderLayer in vllm/model_executor/models/gemma4.py, 0.20): full-attention layers use
  ``global_head_dim`` and, with ``attention_k_eq_v``, ``num_global_key_value_heads``; K's weights are loaded into V's
  slot, and the cache stores both (a plain Attention layer, head_size_v = head_size).
- MiMo-V2-Flash (vllm/model_executor/models/mimo_v2_flash.py): ``hybrid_layer_pattern[i] == 1`` is a sliding layer
  with ``swa_num_key_value_heads`` / ``swa_head_dim`` / ``swa_v_head_dim`` and window ``sliding_window_size``; from 0.20
  the page is heads × (head_size + head_size_v) (FullAttentionSpec / SlidingWindowSpec.real_page_size_bytes in
  vllm/v1/kv_cache_interface.py); 0.14-0.18 pad V to the K head size.
- unify_kv_cache_spec_page_size (vllm/v1/core/kv_cache_utils.py): a layer whose page divides the largest gets its
  block size multiplied by the ratio; num_blocks = available // page // group_size; a request holds
  cdiv(max_memory_usage_bytes, page) blocks per group (get_max_concurrency_for_kv_cache_config).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvwatch.capacity import kv, presets
from kvwatch.capacity.architecture import arch_from_config, tensor_parallel_refusal
from kvwatch.capacity.layers import FULL, SLIDING, AttentionDims
from kvwatch.capacity.memory import GIB
from kvwatch.capacity.planner import DeploymentSpec, plan_capacity
from kvwatch.cli import main

pytestmark = pytest.mark.usefixtures("no_kvwatch_env")

# A public Gemma 4 31B config.json (google/gemma-4-31B-it): 60 layers, every 6th full attention.
GEMMA4_31B = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {
        "attention_bias": False, "attention_k_eq_v": True, "dtype": "bfloat16", "enable_moe_block": False,
        "final_logit_softcapping": 30.0, "global_head_dim": 512, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 5376, "hidden_size_per_layer_input": 0,
        "intermediate_size": 21504,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
        "max_position_embeddings": 262144, "model_type": "gemma4_text", "num_attention_heads": 32,
        "num_global_key_value_heads": 4, "num_hidden_layers": 60, "num_key_value_heads": 16,
        "num_kv_shared_layers": 0, "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 1024, "tie_word_embeddings": True, "use_cache": True, "use_double_wide_mlp": False,
        "vocab_size": 262144,
    },
    "vision_config": {"model_type": "gemma4_vision", "hidden_size": 1152},
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}

# MiMo-V2-Flash's config.json as written from its public parameters: 9 full + 39 sliding layers.
MIMO_V2_FLASH = {
    "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash", "num_hidden_layers": 48,
    "hidden_size": 4096, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192, "v_head_dim": 128,
    "swa_num_attention_heads": 64, "swa_num_key_value_heads": 8, "swa_head_dim": 192, "swa_v_head_dim": 128,
    "sliding_window_size": 128,
    "hybrid_layer_pattern": [0] + ([1] * 4 + [0]) + ([1] * 5 + [0]) * 7,
    "moe_layer_freq": [0] + [1] * 47, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048, "intermediate_size": 16384, "vocab_size": 152576,
    "max_position_embeddings": 262144, "rope_theta": 5000000, "swa_rope_theta": 10000,
    "partial_rotary_factor": 0.334, "attention_bias": False, "add_swa_attention_sink_bias": True,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
V20 = (0, 20)
IN_FLIGHT = 8192  # max_num_batched_tokens on an H100 up to 0.25


def _layout(config, tp=1, version=V20, pp=1):
    return kv.kv_layout(arch_from_config(config), tp, pp, 2, 16, version)


def _plan_json(tmp_path, capsys, config, *args):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code = main(["plan", "--model-config", str(path), *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_gemma4_reads_the_full_layers_own_heads_and_head_size():
    arch = arch_from_config(GEMMA4_31B)
    assert arch.layer_types.count(FULL) == 10 and arch.layer_types.count(SLIDING) == 50
    assert arch.kv_dims(FULL) == AttentionDims(4, 512, 512)
    assert arch.kv_dims(SLIDING) == AttentionDims(16, 256, 256)
    # without attention_k_eq_v the full layers keep num_key_value_heads (gemma4.py), with the global head size
    no_k_eq_v = arch_from_config({**GEMMA4_31B, "text_config": {**GEMMA4_31B["text_config"],
                                                                "attention_k_eq_v": False}})
    assert no_k_eq_v.kv_dims(FULL) == AttentionDims(16, 512, 512)


def test_gemma4_31b_pages_and_block_sizes_at_0_20():
    layout = _layout(GEMMA4_31B)
    full, *sliding = layout.groups
    assert full.kind == FULL and [g.kind for g in sliding] == [SLIDING] * 5 and layout.group_size == 10
    assert full.bytes_per_token_per_layer == 2 * 4 * 512 * 2 == 8192  # K and V both cached (k_eq_v)
    assert sliding[0].bytes_per_token_per_layer == 2 * 16 * 256 * 2 == 16384
    # unify_kv_cache_spec_page_size: the full group's block size doubles so its page matches the sliding one
    assert layout.group_block_size(full) == 32 and layout.group_block_size(sliding[0]) == 16
    assert layout.block_size == 16 and layout.page_bytes == 16 * 16384
    assert layout.kv_bytes_per_token == 10 * 8192 + 50 * 16384 == 901_120
    blocks = kv.num_gpu_blocks(20 * GIB, layout)
    assert blocks == 8192
    assert kv.blocks_needed(replace_groups(layout, [full]), 131072, IN_FLIGHT) == 4096
    assert kv.blocks_needed(replace_groups(layout, sliding[:1]), 131072, IN_FLIGHT) == 577
    assert kv.blocks_needed(layout, 131072, IN_FLIGHT) == 4096 + 5 * 577 == 6981
    assert kv.max_concurrency_at_max_model_len(layout, blocks, 131072, IN_FLIGHT) == pytest.approx(8192 / 6981)


def replace_groups(layout, groups):
    return replace(layout, groups=tuple(groups))


def test_gemma4_31b_reviewer_plan_starts(tmp_path, capsys):
    code, out = _plan_json(tmp_path, capsys, GEMMA4_31B, "--gpu", "H100", "--max-model-len", "131072",
                           "--vllm-version", "0.20", "--available-kv-gib", "20")
    assert code == 0 and out["will_start"]  # before: "vLLM will not start", 0.74
    assert out["kv_bytes_per_token"] == 901_120
    assert out["num_gpu_blocks"] == 8192 and out["kv_cache_groups"] == 6 and out["block_size"] == 16
    assert round(out["max_concurrency_at_max_model_len"], 2) == 1.17
    assert out["kv_cache_tokens"] == 153_809  # int(8192 / 6981 × 131072), kvwatch's 0.20 rule
    assert any("block size 32" in n and "unify_kv_cache_spec_page_size" in n for n in out["notes"])


def test_gemma4_without_k_eq_v_doubles_the_sliding_block_instead():
    cfg = {**GEMMA4_31B, "text_config": {**GEMMA4_31B["text_config"], "attention_k_eq_v": False}}
    layout = _layout(cfg)
    full, sliding = layout.groups[0], layout.groups[1]
    assert full.bytes_per_token_per_layer == 2 * 16 * 512 * 2 and layout.group_block_size(full) == 16
    assert layout.group_block_size(sliding) == 32
    # a sliding group with 32-token blocks: cdiv(1023 + 8192, 32) + 1
    assert kv.blocks_needed(replace_groups(layout, [sliding]), 131072, IN_FLIGHT) == 289


def test_gemma4_pages_coincide_at_tp8():
    layout = _layout(GEMMA4_31B, tp=8)  # full: 1 replicated head × 1024 × 2 B; sliding: 2 heads × 512 × 2 B
    assert not layout.has_unified_pages and layout.bytes_per_token_per_layer == 2048
    assert layout.kv_bytes_per_token == 60 * 2048


def test_mimo_reads_the_swa_pattern_and_dims():
    arch = arch_from_config(MIMO_V2_FLASH)
    assert arch.layer_types.count(FULL) == 9 and arch.layer_types.count(SLIDING) == 39
    assert arch.sliding_window == 128
    assert arch.kv_dims(FULL) == AttentionDims(4, 192, 128)
    assert arch.kv_dims(SLIDING) == AttentionDims(8, 192, 128)
    # a config naming sliding_window too still takes sliding_window_size for the SWA layers
    assert arch_from_config({**MIMO_V2_FLASH, "sliding_window": 4096}).sliding_window == 128


def test_mimo_tp4_pages_and_blocks_at_0_20():
    layout = _layout(MIMO_V2_FLASH, tp=4)
    full, *sliding = layout.groups
    assert layout.group_size == 9 and len(sliding) == 5
    assert full.bytes_per_token_per_layer == 1 * (192 + 128) * 2 == 640
    assert sliding[0].bytes_per_token_per_layer == 2 * (192 + 128) * 2 == 1280
    assert layout.group_block_size(full) == 32
    assert layout.kv_bytes_per_token == 9 * 640 + 39 * 1280
    blocks = kv.num_gpu_blocks(20 * GIB, layout)
    assert blocks == 116_508  # 20 GiB // (16 × 1280) // 9
    per_request = kv.blocks_needed(layout, 131072, IN_FLIGHT)
    assert per_request == 4096 + 5 * (-(-(127 + IN_FLIGHT) // 16) + 1) == 6701
    assert round(blocks / per_request, 2) == 17.39


def test_mimo_reviewer_plan(tmp_path, capsys):
    code, out = _plan_json(tmp_path, capsys, MIMO_V2_FLASH, "--tensor-parallel-size", "4", "--max-model-len",
                           "131072", "--vllm-version", "0.20", "--available-kv-gib", "20")
    assert code == 0 and out["will_start"]
    assert out["num_gpu_blocks"] == 116_508
    assert round(out["max_concurrency_at_max_model_len"], 2) == 17.39  # before: 4.44, all 48 layers full


def test_mimo_before_0_20_pads_v_to_the_k_head_size():
    layout = _layout(MIMO_V2_FLASH, tp=4, version=(0, 18))
    full, sliding = layout.groups[0], layout.groups[1]
    assert full.bytes_per_token_per_layer == 2 * 192 * 2 and sliding.bytes_per_token_per_layer == 2 * 2 * 192 * 2
    assert layout.group_block_size(full) == 32
    assert kv.num_gpu_blocks(20 * GIB, layout) == 97_090


def test_before_0_14_unequal_pages_do_not_start():
    arch = arch_from_config(MIMO_V2_FLASH)
    plan = plan_capacity(DeploymentSpec(arch=arch, tensor_parallel_size=4, vllm_version=(0, 11), max_model_len=131072,
                                        available_kv_bytes=20 * GIB, gpu_name="H100"))
    assert not plan.will_start
    assert any("NotImplementedError" in e for e in plan.errors)
    assert not any(g.block_size for g in plan.layout.groups)  # nothing unified


def _uneven_mimo():
    # 6 sliding KV heads: 6 × 320 × 2 = 3840 B, which 4 × 320 × 2 = 2560 B does not divide
    return arch_from_config({**MIMO_V2_FLASH, "swa_num_key_value_heads": 6})


@pytest.mark.parametrize(("version", "starts", "warned"), [((0, 20), False, False), ((0, 26), True, True),
                                                           ((0, 30), True, False)])
def test_a_page_that_does_not_divide_is_refused_then_padded(version, starts, warned):
    plan = plan_capacity(DeploymentSpec(arch=_uneven_mimo(), vllm_version=version, max_model_len=32768,
                                        available_kv_bytes=20 * GIB, gpu_name="H100"))
    assert plan.will_start is starts
    assert any("does not divide" in w for w in plan.warnings) is warned
    layout = plan.layout
    assert all(layout.group_block_size(g) == 16 for g in layout.groups)  # padded, not scaled
    assert layout.page_bytes == 16 * 3840
    if starts:
        assert plan.num_gpu_blocks == int(20 * GIB // (16 * 3840 * 9))


def test_tensor_parallel_must_suit_every_layer_types_kv_heads():
    arch = arch_from_config({**GEMMA4_31B, "text_config": {**GEMMA4_31B["text_config"],
                                                           "num_global_key_value_heads": 6}})
    assert arch.kv_head_counts == (6, 16)
    assert "6 KV heads (on some of its layers)" in tensor_parallel_refusal(arch, 4)
    assert tensor_parallel_refusal(arch_from_config(GEMMA4_31B), 8) is None


# Figures of other models, computed with the code before per-type dims (20 GiB of KV, an H100's batch limits); the
# ceilings at 3,000 tokens count whole blocks where a group holds all of a request's tokens (188 of 16, 3,008 tokens,
# Llama-4-Scout's chunked groups too: 3,495,248 ÷ (4 × 3,008); 6 of 528 on Granite, 12 of 272 on Qwen3-Next:
# 1,747,600 ÷ (3,264 + 3 × 272)), and the sliding-window models' (a
# sliding group holds window − 1 tokens and a block, and the in-flight budget is taken once, as whole prompts beyond
# that: gemma-3's 8,192 tokens are 2 prompts and 2,192 tokens, 3 × 1,961 beyond 1,023 + 16, (262,144 − 6 × 5,883) ÷
# (3,008 + 6 × 1,039); gpt-oss's 16,384 are 5 prompts and 1,384 tokens beyond 127 + 16, (582,528 − (5 × 2,857 +
# 1,384)) ÷ (3,008 + 143)).
UNCHANGED = [
    ("google/gemma-3-27b-it", 1, 1, (0, 20), 131072, 507904, 16, 16384, 184270, 1.405869, 24.54512),
    ("openai/gpt-oss-120b", 1, 1, (0, 33), 131072, 73728, 16, 36408, 517297, 3.946667, 179.898128),
    ("meta-llama/Llama-3.1-8B-Instruct", 2, 2, (0, 19), 32768, 32768, 16, 40960, 655360, 20.0, 217.87234),
    ("ibm-granite/granite-4.0-h-small", 1, 1, (0, 32), 131072, 16384, 528, 2482, 1178698, 8.992754, 75.212121),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 8, 1, (0, 14), 1000000, 24576, 16, 218453, 873808, 3.331498,
     290.496011),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", 4, 1, (0, 20), 262144, 12288, 272, 6425, 1741753, 6.644261, 428.333333),
]


@pytest.mark.parametrize(("name", "tp", "pp", "version", "length", "per_token", "block", "blocks", "tokens",
                          "at_max", "at_3000"), UNCHANGED)
def test_other_models_figures_are_unchanged(name, tp, pp, version, length, per_token, block, blocks, tokens,
                                            at_max, at_3000):
    arch = presets.match_model(name).arch
    assert not arch.attention_dims
    plan = plan_capacity(DeploymentSpec(arch=arch, tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                        vllm_version=version, max_model_len=length, available_kv_bytes=20 * GIB,
                                        gpu_name="H100"))
    assert (plan.kv_bytes_per_token, plan.layout.block_size, plan.num_gpu_blocks, plan.kv_cache_tokens) == \
        (per_token, block, blocks, tokens)
    assert round(plan.max_concurrency_at_max_model_len, 6) == at_max
    assert round(plan.max_concurrency_at(3000), 6) == at_3000
    assert not plan.layout.has_unified_pages and not plan.errors


@pytest.mark.parametrize(("config", "flags"), [(GEMMA4_31B, ["--tensor-parallel-size", "1"]),
                                               (MIMO_V2_FLASH, ["--tensor-parallel-size", "4"])])
def test_the_plans_formula_line_adds_up_per_layer_type(tmp_path, capsys, config, flags):
    # The step-2 line printed "2 × 60 layers × 16 KV heads × 256 head_dim × 2 B = 901,120 B", whose product is
    # 983,040: with per-type dims each type is a term of its own.
    import json
    import re

    from kvwatch.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["plan", "--model-config", str(path), "--gpu", "H100", "--max-model-len", "131072",
                 "--vllm-version", "0.20", "--available-kv-gib", "20", *flags]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "(K + V head sizes)" in ln)
    terms = re.findall(r"(\d+) \w+ layers × (\d+) KV heads × (\d+) \(K \+ V head sizes\) × (\d+) B", line)
    total = int(re.search(r"= ([\d,]+) B", line).group(1).replace(",", ""))
    assert len(terms) == 2 and sum(int(a) * int(b) * int(c) * int(d) for a, b, c, d in terms) == total


def test_tp_beyond_some_layers_heads_still_shrinks_the_others():
    # MiMo's full layers have 4 KV heads, its sliding ones 8: at TP 8 only the full layers' are replicated, and the
    # KV per token still shrinks (the note, the what-if and the advice said it stops).
    from kvwatch.advisor import advise
    from kvwatch.capacity.whatif import whatif_scenarios

    arch = arch_from_config(MIMO_V2_FLASH)
    assert arch.kv_head_counts == (4, 8)
    spec = DeploymentSpec(arch=arch, gpu_name="B200", gpu_memory_bytes=180 * GIB, tensor_parallel_size=8,
                                  max_model_len=131072, vllm_version=(0, 20))
    plan = plan_capacity(spec)
    assert any("exceeds the 4 KV heads of some layers" in n and "up to TP=8" in n for n in plan.notes)
    at4 = plan_capacity(replace(spec, tensor_parallel_size=4))
    (tp2,) = [s for s in whatif_scenarios(at4.spec) if s.name == "tensor_parallel_x2"]
    assert "replicated beyond" not in tp2.note and "layers with more than 4" in tp2.note
    (tp_fix,) = [a for a in advise("bottleneck", capacity_plan=at4, kv_tokens_per_request=2000)
                 if a.action == "add_tensor_parallelism"]
    assert "stops shrinking" not in tp_fix.message and "Some layers' 4 KV heads" in tp_fix.message


@pytest.mark.parametrize(("base", "change", "named"), [
    (MIMO_V2_FLASH, {"swa_num_key_value_heads": 0}, "swa_num_key_value_heads"),
    (MIMO_V2_FLASH, {"swa_head_dim": -64}, "swa_head_dim"),
    (MIMO_V2_FLASH, {"hybrid_layer_pattern": {"0": 1}}, "hybrid_layer_pattern"),
    (GEMMA4_31B, {"global_head_dim": 0}, "global_head_dim"),
    (GEMMA4_31B, {"attention_k_eq_v": "false"}, "attention_k_eq_v"),
    (GEMMA4_31B, {"num_key_value_heads": -8}, "num_key_value_heads"),
])
def test_a_broken_per_type_field_is_refused_naming_it(base, change, named):
    # They fell back silently (0 heads read as the model's, "false" read as true) or said "divide the -8 KV heads".
    from kvwatch.capacity.architecture import ArchitectureError

    config = ({**base, "text_config": {**base["text_config"], **change}} if "text_config" in base
              else {**base, **change})
    with pytest.raises(ArchitectureError, match=named):
        arch_from_config(config)


def test_weights_count_each_layer_types_own_projections():
    # Gemma 4's full layers: 32 query heads at the global head size 512 (q and o), 4 KV heads (k and v);
    # the sliding ones 32 x 256 and 16 KV heads. Counted at the model-wide 256 / 16 everywhere, 31B read 30.15B.
    from kvwatch.capacity.memory import _attention_params, parameter_counts

    gemma = arch_from_config(GEMMA4_31B)
    assert _attention_params(gemma, FULL) == 5376 * (32 + 4) * (512 + 512)
    assert _attention_params(gemma, SLIDING) == 5376 * (32 + 16) * (256 + 256)
    # MiMo-V2-Flash: 309B published (its model card); the first layer is a dense MLP (moe_layer_freq[0] = 0), and
    # the sliding layers have 8 KV heads with V heads of 128. Before: 315.6B (experts on all 48 layers).
    mimo = arch_from_config(MIMO_V2_FLASH)
    assert (mimo.moe_layers, mimo.num_layers) == (47, 48)
    assert sum(parameter_counts(mimo)) / 1e9 == pytest.approx(309, rel=0.005)
    # A model with the same dims everywhere keeps the usual count: q, o of H x hd; k, v of KV x hd.
    llama = presets.resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    assert _attention_params(llama, FULL) == 4096 * 2 * 4096 + 2 * 4096 * 8 * 128


def test_moe_layer_freq_as_a_step_after_the_dense_layers():
    # deepseek_v2.py (DeepSeek-MoE and V2): MoE where layer_idx >= first_k_dense_replace and
    # layer_idx % moe_layer_freq == 0.
    config = {"architectures": ["DeepseekForCausalLM"], "model_type": "deepseek", "num_hidden_layers": 10,
              "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 4096,
              "vocab_size": 1000, "n_routed_experts": 8, "moe_intermediate_size": 512, "first_k_dense_replace": 1,
              "moe_layer_freq": 2}
    assert arch_from_config(config).moe_layers == 4  # layers 2, 4, 6 and 8 (0 is before first_k_dense_replace)
    short = {**MIMO_V2_FLASH, "moe_layer_freq": [1] * 10}
    with pytest.raises(Exception, match="moe_layer_freq has 10 entries for 48 layers"):
        arch_from_config(short)


def test_prefill_attention_flops_use_each_layer_types_head_sizes():
    from kvwatch.capacity.longcontext import attention_flops

    gemma = arch_from_config(GEMMA4_31B)
    n = 4096.0  # beyond the 1,024 window: sliding layers see the window only
    full = 32 * (512 + 512) * n * n
    sliding = 2 * 32 * (256 + 256) * (1024 * n - 1024 * 1024 / 2)
    assert attention_flops(gemma, n) == pytest.approx(10 * full + 50 * sliding)


def test_a_pipeline_stage_without_a_full_layer_still_gets_the_whole_models_pages():
    # vLLM unifies the page sizes of the whole model's specs; kvwatch read the first stage's layer types only, so at
    # PP 12 (no full layer in the first 5) the full group kept block size 16 and the plan 7.40 requests where the
    # whole model's pages give 11.73. The bytes per token are the widest stage's layers, group by
    # group (at PP 8 one full and six sliding: 8,192 + 6 x 16,384).
    arch = arch_from_config(GEMMA4_31B)
    pp12 = kv.kv_layout(arch, 1, 12, 2, 16, (0, 20))
    full = next(g for g in pp12.groups if g.kind == "full_attention")
    assert pp12.group_block_size(full) == 32
    blocks = kv.num_gpu_blocks(20 * 2**30, pp12)
    assert round(kv.max_concurrency_at_max_model_len(pp12, blocks, 131072, 8192), 2) == 11.73
    assert kv.kv_layout(arch, 1, 8, 2, 16, (0, 20)).kv_bytes_per_token == 8192 + 6 * 16384
