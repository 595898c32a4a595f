"""MoE and multi-attention families whose config.json names things its own way (ERNIE-4.5, LongCat-Flash,
Hunyuan-A13B, Step-3.5-Flash, Qwen3-Omni): read as vLLM's model files read them (tests/fixtures/model-configs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.capacity.architecture import arch_from_config
from kvwatch.capacity.kv import kv_layout
from kvwatch.capacity.memory import parameter_counts

CONFIGS = Path(__file__).parent / "fixtures" / "model-configs"


def arch(name: str):
    return arch_from_config(json.loads((CONFIGS / f"{name}.json").read_text()))


def params_b(name: str) -> float:
    return sum(parameter_counts(arch(name))) / 1e9


def test_ernie_experts_shared_experts_and_moe_layers_are_counted():
    # ernie45_moe.py: FusedMoE(num_experts=moe_num_experts) on layers start..end with (i + 1) % interval == 0,
    # shared experts moe_intermediate_size x moe_num_shared_experts wide. Published: 21B total, 3B active.
    a = arch("ernie21")
    assert (a.num_experts, a.num_shared_experts, a.experts_per_token, a.moe_layers) == (64, 2, 6, 27)
    assert params_b("ernie21") == pytest.approx(21.8, abs=0.3)  # was 3.35: the experts were not seen


def test_ernie_moe_layer_interval_and_range():
    cfg = json.loads((CONFIGS / "ernie21.json").read_text())
    every_other = arch_from_config({**cfg, "moe_layer_start_index": 3, "moe_layer_end_index": 20,
                                    "moe_layer_interval": 2})
    assert every_other.moe_layers == sum(1 for i in range(28) if 3 <= i <= 20 and (i + 1) % 2 == 0)


def test_longcat_flash_has_two_mla_caches_per_decoder_layer():
    # vLLM's longcat_flash.py FlashDecoderLayer: nn.ModuleList of two DeepseekV2MLAAttention, each its own cache
    a = arch("longcat_flash")
    assert a.is_mla and len(a.kv_cache_layer_types) == 56
    layout = kv_layout(a, tp=8, pp=1, kv_bytes=2, block_size=16, version=(0, 20))
    assert layout.kv_bytes_per_token == 56 * (512 + 64) * 2  # MLA: not split by TP; was 28 layers' worth
    assert params_b("longcat_flash") == pytest.approx(560, rel=0.05)  # expert_ffn_hidden_size; published 560B


def test_hunyuan_per_layer_expert_lists_are_read():
    a = arch("hunyuan_a13b")
    assert (a.num_experts, a.num_shared_experts, a.experts_per_token, a.moe_intermediate_size) == (64, 1, 8, 3072)
    assert params_b("hunyuan_a13b") == pytest.approx(80, rel=0.03)  # published: 80B total


def test_step35_mtp_layer_types_beyond_the_decoder_are_ignored():
    # step3p5.py builds num_hidden_layers layers and reads the first layer_types; the 3 after them are MTP layers
    a = arch("step35")
    assert len(a.layer_types) == 45 and a.num_experts == 288 and a.moe_layers == 42
    assert params_b("step35") == pytest.approx(196, rel=0.03)  # published: 196B


def test_a_longer_layer_types_list_is_still_refused_for_other_models():
    cfg = json.loads((CONFIGS / "step35.json").read_text())
    with pytest.raises(Exception, match="48 layer_types for num_hidden_layers 45"):
        arch_from_config({**cfg, "model_type": "gemma3_text"})


def test_qwen3_omni_reads_the_thinkers_text_config():
    # vLLM's get_hf_text_config descends into thinker_config.text_config; the talker is not the served LLM
    a = arch("qwen3_omni")
    assert (a.num_layers, a.num_kv_heads, a.head_dim, a.num_experts) == (48, 4, 128, 128)


def test_ernie_vl_lists_read_the_text_experts_and_defaults_follow_transformers():
    cfg = json.loads((CONFIGS / "ernie21.json").read_text())
    vl = arch_from_config({**cfg, "moe_num_experts": [64, 64], "moe_intermediate_size": [1536, 512],
                           "moe_layer_start_index": [1, 1], "moe_layer_end_index": [27, 27]})
    assert (vl.num_experts, vl.moe_intermediate_size, vl.moe_layers) == (64, 1536, 27)
    no_start = {k: v for k, v in cfg.items() if k != "moe_layer_start_index"}
    assert arch_from_config(no_start).moe_layers == 27  # transformers' default start: layer 1
    assert arch_from_config({**cfg, "use_moe": False}).moe_layers == 0


def test_step35_moe_layers_enum_as_a_sequence_counts_only_real_layers():
    cfg = json.loads((CONFIGS / "step35.json").read_text())
    assert arch_from_config({**cfg, "moe_layers_enum": list(range(3, 45))}).moe_layers == 42
    assert arch_from_config({**cfg, "moe_layers_enum": " 3, 4,-1, 100"}).moe_layers == 2


def test_qwen3_omni_is_noted_as_multimodal():
    assert any("multimodal" in note for note in arch("qwen3_omni").notes)


def test_dbrx_nested_sizes_are_read():
    # DbrxConfig: n_layers, n_heads, d_model, attn_config.kv_n_heads, ffn_config's experts (vLLM's dbrx.py)
    a = arch("dbrx")
    assert (a.num_layers, a.num_attention_heads, a.num_kv_heads, a.head_dim) == (40, 48, 8, 128)
    assert (a.num_experts, a.experts_per_token, a.moe_intermediate_size) == (16, 4, 10752)
    assert params_b("dbrx") == pytest.approx(132, rel=0.02)  # published: 132B
