"""vLLM's hybrid Mamba / linear-attention layout: state pages, the raised attention block size, blocks per request.

Expected values are vLLM's own: the block size vLLM picks for Granite-4.0-H without prefix caching is 528 tokens
(vllm-project/vllm-gaudi PR 1453: "528 is required for Granite 4.0-H (granitemoehybrid) without prefix caching
(16-token FA alignment)"); state shapes are those of vLLM's MambaStateShapeCalculator
(vllm/model_executor/layers/mamba/mamba_utils.py), written out here element by element from the config.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvwatch.capacity import kv, planner
from kvwatch.capacity.layers import MAMBA
from kvwatch.capacity.mamba import GATED_DELTA_NET, MambaConfigError, MambaDims, attention_block_size
from kvwatch.capacity.presets import resolve_model

V011 = (0, 11)


def _arch(name: str):
    return resolve_model(name)


def test_granite_4_h_small_block_size_is_the_528_vllm_picks():
    arch = _arch("ibm-granite/granite-4.0-h-small")
    layout = kv.kv_layout(arch, 1, 1, 2, 16, V011, model_dtype_bytes=2)
    # conv state (d_conv - 1) x (8192 + 2 x 1 x 128) + ssm state 128 heads x 64 x 128, bf16
    assert layout.mamba_page_bytes == (3 * (8192 + 2 * 128) + 128 * 64 * 128) * 2
    assert layout.block_size == 528
    assert layout.block_size_raised
    assert layout.page_bytes >= layout.mamba_page_bytes


def test_granite_groups_hold_one_block_per_request_in_each_mamba_group():
    arch = _arch("ibm-granite/granite-4.0-h-small")
    layout = kv.kv_layout(arch, 1, 1, 2, 16, V011, model_dtype_bytes=2)
    kinds = [g.kind for g in layout.groups]
    assert layout.group_size == 4 and kinds.count(MAMBA) == 9 and len(kinds) == 10  # 4 attention, 36 Mamba layers
    # a 1-token and a 528-token request both hold 1 attention block + 9 state blocks
    assert kv.blocks_needed(layout, 1, 0) == 10 == kv.blocks_needed(layout, 528, 0)
    assert kv.blocks_needed(layout, 529, 0) == 11


def test_qwen3_next_gated_delta_net_state_and_block_size():
    arch = _arch("Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert arch.mamba_dims is not None and arch.mamba_dims.kind == GATED_DELTA_NET
    assert arch.layer_types[:4] == (MAMBA, MAMBA, MAMBA, "full_attention") and arch.mamba_layers == 36
    layout = kv.kv_layout(arch, 4, 1, 2, 16, V011, model_dtype_bytes=2)
    conv = 3 * (128 * 16 * 2 + 128 * 32) // 4
    temporal = (32 // 4) * 128 * 128
    assert layout.mamba_page_bytes == (conv + temporal) * 2
    # attention per token and layer at TP 4: 2 KV heads replicated to 1 per rank x 256 x K,V x bf16 = 1024 B
    assert layout.bytes_per_token_per_layer == 1024
    assert layout.block_size == 16 * -(-layout.mamba_page_bytes // (16 * 1024))
    assert layout.group_size == 12 and [g.kind for g in layout.groups].count(MAMBA) == 3


def test_a_user_block_size_large_enough_is_kept():
    assert attention_block_size(100_000, 1024, 256, (0, 20)) == 256
    assert attention_block_size(300_000, 1024, 16, (0, 20)) == 304


def test_from_0_20_the_alignment_honours_the_users_block_size():
    # vllm/platforms/interface.py _align_hybrid_block_size (0.20): kernel_block_alignment_size = max(the backend's
    # smallest block, cache_config.block_size). Qwen3-Next at TP 1: a 1,097,728 B state, 2,048 B per token and
    # layer: --block-size 128 gives 128 x ceil(1,097,728 / (128 x 2,048)) = 640, not 16 x 34 = 544. Up to 0.18
    # (HybridAttentionMambaModelConfig in vllm/model_executor/models/config.py) the alignment was a fixed 16.
    arch = _arch("Qwen/Qwen3-Next-80B-A3B-Instruct")
    for version, block, expected in (((0, 20), 128, 640), ((0, 20), 16, 544), ((0, 18), 128, 544),
                                     ((0, 11), 128, 544), ((0, 30), 64, 576)):
        layout = kv.kv_layout(arch, 1, 1, 2, block, version, model_dtype_bytes=2)
        assert layout.mamba_page_bytes == 1_097_728
        assert layout.block_size == expected, (version, block)


def test_older_vllm_has_no_state_pages_in_the_pool():
    arch = _arch("ibm-granite/granite-4.0-h-small")
    layout = kv.kv_layout(arch, 1, 1, 2, 16, (0, 9), model_dtype_bytes=2)
    assert layout.mamba_page_bytes == 0 and layout.block_size == 16


def test_linear_attention_state_is_heads_by_head_dim_squared():
    dims = MambaDims("linear_attention", num_heads=64, head_dim=128)
    assert dims.page_bytes(8, 2) == 8 * 128 * 128 * 2


def test_plan_names_the_raised_block_size_and_counts_state_blocks():
    spec = planner.DeploymentSpec(arch=_arch("ibm-granite/granite-4.0-h-small"), gpu_memory_bytes=80 * 2**30,
                                  max_model_len=8192)
    plan = planner.plan_capacity(spec)
    assert any("528" in n and "Mamba" in n for n in plan.notes)
    # 9 Mamba groups on top of the attention blocks (ceil(8192 / 528) = 16). vLLM >= 0.26 turns prefix caching on
    # for hybrid models, in its "align" mode: 2 state blocks per request and group, plus a prefill checkpoint
    # block for Mamba2 mixers from 0.32 (vllm/model_executor/layers/mamba/mamba_mixer2.py); without prefix
    # caching, or before 0.26, one.
    assert plan.max_concurrency_at_max_model_len == pytest.approx(plan.num_gpu_blocks / (16 + 9 * 3))
    assert any("3 blocks" in n and "align" in n for n in plan.notes)
    # 0.26 and 0.27 support it but keep it opt-in for hybrids (arg_utils.py: "not model_config.is_hybrid"); the
    # default is on from 0.28.
    for changed, held in (({"enable_prefix_caching": False}, 1), ({"vllm_version": (0, 25)}, 1),
                          ({"vllm_version": (0, 31)}, 2), ({"mamba_cache_mode": "none"}, 1),
                          ({"vllm_version": (0, 26)}, 1), ({"vllm_version": (0, 27)}, 1),
                          ({"vllm_version": (0, 27), "enable_prefix_caching": True}, 2),
                          ({"vllm_version": (0, 28)}, 2)):
        other = planner.plan_capacity(replace(spec, **changed))
        assert other.layout.mamba_blocks_per_request == held, changed
        assert other.max_concurrency_at_max_model_len == pytest.approx(other.num_gpu_blocks / (16 + 9 * held))


def test_tp_that_does_not_divide_the_state_is_refused_as_vllm_does():
    dims = MambaDims(GATED_DELTA_NET, num_heads=6, head_dim=128, num_k_heads=2, head_k_dim=128)
    with pytest.raises(MambaConfigError, match="tensor-parallel-size"):
        dims.page_bytes(4, 2)


def test_minimax_lightning_attention_layers_get_a_linear_attention_state():
    # A MiniMax-style config (attn_type_list: 1 = softmax attention, 0 = lightning); the state is vLLM's
    # linear_attention_state_shape: (heads / TP, head_dim, head_dim) per layer.
    from kvwatch.capacity.architecture import arch_from_config

    config = {"model_type": "minimax_m1", "num_hidden_layers": 8, "num_attention_heads": 64, "head_dim": 128,
              "num_key_value_heads": 8, "hidden_size": 6144, "vocab_size": 1000, "attn_type_list": [0] * 7 + [1]}
    arch = arch_from_config(config)
    assert arch.mamba_dims is not None and arch.mamba_dims.kind == "linear_attention"
    layout = kv.kv_layout(arch, 8, 1, 2, 16, V011, model_dtype_bytes=2)
    assert layout.mamba_page_bytes == 8 * 128 * 128 * 2
    # attention: 1 KV head per rank x 128 x K,V x 2 B = 512 B per token: 262,144 / 512 = 512 tokens, no padding
    assert layout.block_size == 512 and layout.mamba_padding_percent == 0.0


def test_nemotron_h_keeps_its_ssm_state_in_float32_from_0_20():
    # vLLM's NemotronHForCausalLMConfig: mamba_ssm_cache_dtype from the config, else float32 (0.20 on; float16,
    # the model's 2 bytes, before). The temporal state (heads x head_dim x state) doubles, the conv state does not.
    from kvwatch.capacity.architecture import arch_from_config

    config = {"model_type": "nemotron_h", "hidden_size": 4096, "num_hidden_layers": 52, "num_attention_heads": 32,
              "num_key_value_heads": 8, "attention_head_dim": 128, "mamba_num_heads": 128, "mamba_head_dim": 64,
              "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2, "vocab_size": 131072,
              "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"}
    arch = arch_from_config(config)
    temporal = 128 * 64 * 128
    old = kv.kv_layout(arch, 1, 1, 2, 16, (0, 19), model_dtype_bytes=2).mamba_page_bytes
    new = kv.kv_layout(arch, 1, 1, 2, 16, (0, 20), model_dtype_bytes=2).mamba_page_bytes
    assert new - old == temporal * 2 and new == 4_255_744
    pinned = arch_from_config({**config, "mamba_ssm_cache_dtype": "bfloat16"})
    assert kv.kv_layout(pinned, 1, 1, 2, 16, (0, 20), model_dtype_bytes=2).mamba_page_bytes == old


def test_llama4_chunked_layers_get_their_own_groups_from_0_14():
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to "1" from 0.14 (vllm/envs.py): the 36 RoPE
    # layers then hold at most chunk + in-flight tokens (ChunkedLocalAttentionSpec), before every token.
    arch = _arch("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    before = kv.kv_layout(arch, 8, 1, 2, 16, (0, 13))
    after = kv.kv_layout(arch, 8, 1, 2, 16, (0, 14))
    assert [g.kind for g in before.groups] == ["full_attention"]
    assert [g.kind for g in after.groups] == ["full_attention"] + ["chunked_local_attention"] * 3
    chunk, in_flight = arch.attention_chunk_size, 8192
    assert kv.blocks_needed(after, 1_000_000, in_flight) == (
        -(-1_000_000 // 16) + 3 * -(-(chunk + in_flight) // 16))
    assert kv.blocks_needed(before, 1_000_000, in_flight) == -(-1_000_000 // 16)



def test_the_all_mode_keeps_a_state_per_block_like_full_attention():
    # vLLM 0.15-0.31's mamba_cache_mode "all" sizes a Mamba group at cdiv(max_model_len, block_size) state blocks per
    # request (MambaSpec.max_memory_usage_bytes); counting it as one block was the most optimistic reading.
    spec = planner.DeploymentSpec(arch=_arch("ibm-granite/granite-4.0-h-small"), gpu_memory_bytes=80 * 2**30,
                                  max_model_len=8192, vllm_version=(0, 31), mamba_cache_mode="all")
    plan = planner.plan_capacity(spec)
    assert plan.layout.mamba_blocks_per_request == 0
    assert plan.max_concurrency_at_max_model_len == pytest.approx(plan.num_gpu_blocks / (16 + 9 * 16))


def test_lfm2_short_convolution_state_pages_are_modelled():
    # LFM2-1.2B's config.json: 10 "conv" and 6 attention layers; vLLM keeps a short-convolution state of
    # (conv_L_cache - 1) x conv_dim in the model dtype (short_conv_state_shape, vllm/model_executor/layers/mamba/
    # mamba_utils.py; Lfm2ForCausalLM passes conv_dim, conv_L_cache). (2 x 2,048) x 2 B = 8 KiB, padded to the
    # 32 KiB attention page: 6 attention vs 10 conv layers give groups of 6, 1 attention + 2 conv. On 0.11 vLLM
    # reports blocks // 3 x 16 tokens: kvwatch said 1,747,616, three times vLLM's figure (the state was not read).
    from kvwatch.capacity import planner
    from kvwatch.capacity.architecture import arch_from_config
    from kvwatch.capacity.mamba import SHORT_CONV
    from kvwatch.capacity.memory import GIB

    lfm2 = {"architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "hidden_size": 2048, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "conv_L_cache": 3, "conv_bias": False,
            "block_dim": 2048, "block_ff_dim": 12288, "intermediate_size": 12288, "vocab_size": 65536,
            "max_position_embeddings": 128000, "torch_dtype": "bfloat16", "tie_word_embeddings": True,
            "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv",
                            "full_attention", "conv", "full_attention", "conv", "full_attention", "conv",
                            "full_attention", "conv"]}
    arch = arch_from_config(lfm2)
    assert arch.mamba_dims is not None and arch.mamba_dims.kind == SHORT_CONV
    assert arch.mamba_dims.page_bytes(1, 2) == 2 * 2048 * 2
    spec = planner.DeploymentSpec(arch=arch, gpu_memory_bytes=80 * GIB, max_model_len=32768, vllm_version=(0, 11),
                                  available_kv_bytes=20 * GIB, enable_prefix_caching=False)
    plan = planner.plan_capacity(spec)
    assert plan.num_gpu_blocks == 109_226 and plan.kv_cache_tokens == 109_226 // 3 * 16 == 582_528
    assert plan.max_concurrency_at_max_model_len == pytest.approx(109_226 / (2048 + 2))


def test_a_state_dtype_spelled_as_torch_names_it_is_read_and_an_unknown_one_refused() -> None:
    # the KV dtype table became strict, and a config's "torch.float32" (or any other spelling)
    # escaped the planner as a traceback
    import json
    from pathlib import Path

    from kvwatch.capacity import ArchitectureError, arch_from_config

    configs = Path(__file__).parent / "fixtures" / "model-configs"
    config = json.loads((configs / "nemotron3_nano_pattern.json").read_text())
    plain = arch_from_config({**config, "mamba_ssm_cache_dtype": "float32"})
    assert arch_from_config({**config, "mamba_ssm_cache_dtype": "torch.float32"}) == plain
    with pytest.raises(ArchitectureError, match="mamba_ssm_cache_dtype 'weird4'"):
        arch_from_config({**config, "mamba_ssm_cache_dtype": "weird4"})


def _qwen35_27b(**text: object) -> dict:
    """Qwen3.5-27B's config.json as published (text model; 64 layers, every fourth full attention)."""
    layer_types = ["linear_attention"] * 3 + ["full_attention"]
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": {
        "model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 24,
        "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408, "vocab_size": 248320,
        "max_position_embeddings": 262144, "full_attention_interval": 4, "layer_types": layer_types * 16,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 48, "linear_value_head_dim": 128, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False, "mamba_ssm_dtype": "float32", **text}}


def test_a_gated_delta_net_and_gated_attention_are_counted_as_vllm_builds_them() -> None:
    # vLLM's qwen3_next.py: Qwen3NextAttention's qkv_proj holds the queries twice (attn_output_gate, on by default),
    # QwenGatedDeltaNetAttention projects in to q, k (key heads), v, z (value heads), b and a (one per value head) and
    # out from v. kvwatch counted 3 × hidden × inner and no gate: 25.36 B parameters where vLLM loads 26.90 B, the KV
    # pool 2.9 GiB too large on one H100.
    from kvwatch.capacity.architecture import arch_from_config
    from kvwatch.capacity.memory import parameter_counts

    h = 5120
    full = h * 24 * 256 * 2 + h * 4 * 256 * 2 + 24 * 256 * h  # q and its gate, k and v, o
    gdn = h * (2 * 16 * 128 + 2 * 48 * 128 + 2 * 48) + 48 * 128 * h
    mlp = 3 * h * 17408
    embed, linear, experts = parameter_counts(arch_from_config(_qwen35_27b()))
    assert (embed, linear, experts) == (248320 * h * 2, 16 * full + 48 * gdn + 64 * mlp, 0)
    assert round((embed + linear) / 1e9, 2) == 26.89
    # A config that turns the gate off loses the gate's projection only.
    _, ungated, _ = parameter_counts(arch_from_config(_qwen35_27b(attn_output_gate=False)))
    assert linear - ungated == 16 * h * 24 * 256
