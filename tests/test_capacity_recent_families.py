"""Configs of recent models that kvwatch read wrong (tests/fixtures/model-configs/README.md says
where each file comes from): each is read as vLLM's model file reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.capacity.architecture import arch_from_config
from kvwatch.capacity.kv import kv_layout
from kvwatch.capacity.layers import CHUNKED, FULL, MAMBA, MLP_ONLY, SLIDING
from kvwatch.capacity.mamba import MambaConfigError
from kvwatch.capacity.memory import parameter_counts

CONFIGS = Path(__file__).parent / "fixtures" / "model-configs"


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def kv_bytes(cfg: dict, tp: int = 1) -> int:
    return kv_layout(arch_from_config(cfg), tp=tp, pp=1, kv_bytes=2, block_size=16, version=(0, 33)).kv_bytes_per_token


def test_nemotron3_layers_block_type_counts_moe_and_mlp_blocks_as_neither_kv_nor_state():
    # Nemotron 3 Nano names its 52 blocks in layers_block_type (transformers builds hybrid_override_pattern from it:
    # mamba M, moe E, attention *, mlp -); "moe" read as attention gave 29 KV layers, 29,696 B/token, not 6,144
    listed, pattern = arch_from_config(config("nemotron3_nano_layers_block_type")), arch_from_config(
        config("nemotron3_nano_pattern"))
    for a in (listed, pattern):
        assert a.layer_types.count(FULL) == 6 and a.layer_types.count(MAMBA) == 23
        assert a.layer_types.count(MLP_ONLY) == 23 and a.moe_layers == 23 and a.dense_mlp_layers == 0
    assert kv_bytes(config("nemotron3_nano_layers_block_type")) == 6 * 2 * 128 * 2 * 2 == kv_bytes(
        config("nemotron3_nano_pattern"))
    assert parameter_counts(listed) == parameter_counts(pattern)


def test_nemotron_h_mlps_and_experts_have_no_gate():
    # nemotron_h.py: relu² MLPs of up and down projections, experts loaded from up_proj/down_proj only, and a shared
    # expert of moe_shared_expert_intermediate_size. Three matrices each made it 46B; published: 31.6B
    a = arch_from_config(config("nemotron3_nano_pattern"))
    assert not a.gated_mlp and a.shared_expert_intermediate_size == 3712
    assert sum(parameter_counts(a)) / 1e9 == pytest.approx(31.6, rel=0.02)


def test_mamba2_groups_that_tp_does_not_divide_are_refused():
    # mamba_mixer2.py: assert n_groups % tp == 0 or n_groups == 1 (one group is replicated, eight are not)
    a = arch_from_config(config("nemotron3_nano_pattern"))
    assert a.mamba_dims is not None and a.mamba_dims.n_groups == 8
    with pytest.raises(MambaConfigError, match=r"n_groups 8"):
        a.mamba_dims.state_shapes(16)
    assert a.mamba_dims.state_shapes(8)


def test_mimo_v2_attention_chunk_size_is_not_chunked_attention():
    # MiMo-V2-Flash's config carries attention_chunk_size 128, which vLLM deletes (_strip_mimo_v2_attention_chunk_size
    # in its arch config convertor): its hybrid_layer_pattern and swa_* dims decide, as without the field
    cfg = config("mimo_v2_flash")
    assert cfg["attention_chunk_size"] == 128
    a = arch_from_config(cfg)
    assert CHUNKED not in a.layer_types and a.layer_types.count(SLIDING) == sum(cfg["hybrid_layer_pattern"])
    without = {k: v for k, v in cfg.items() if k != "attention_chunk_size"}
    assert kv_bytes(cfg, tp=4) == kv_bytes(without, tp=4) == 55_680


def test_longcat_flash_lite_is_mla_with_two_caches_per_layer():
    # longcat_flash_ngram is in vLLM's is_deepseek_mla; read as 32-head MHA it had 86,016 B/token at TP 4
    a = arch_from_config(config("longcat_flash_lite"))
    assert a.is_mla and len(a.kv_cache_layer_types) == 2 * 14
    assert kv_bytes(config("longcat_flash_lite"), tp=4) == 28 * (512 + 64) * 2 == 32_256
    # its n-gram embedding tables (ratio 78 × vocab × hidden, 31.4B) are weights too: 35B without them; published 68.5B
    assert a.extra_embedding_params == 78 * 131072 * 3072
    assert sum(parameter_counts(a)) / 1e9 == pytest.approx(68.5, rel=0.03)


def test_longcat_next_reads_as_the_n_gram_model_it_is_built_on():
    # longcat_next is in vLLM's is_deepseek_mla; its language model is LongCat-Flash-Lite's (the config: that
    # fixture as model_type longcat_next with its two vocabularies). Read as MHA it had 344,064 B/token, 10.7x.
    cfg = {**config("longcat_flash_lite"), "model_type": "longcat_next", "architectures": ["LongcatNextForCausalLM"],
           "vocab_size": 282624, "text_vocab_size": 131072}
    a = arch_from_config(cfg)
    assert a.is_mla and len(a.kv_cache_layer_types) == 2 * 14
    assert kv_bytes(cfg, tp=4) == 32_256
    assert a.extra_embedding_params == 78 * 131072 * 3072  # the text model's vocabulary sizes its n-gram tables
    assert not any("kv_lora_rank" in note for note in a.notes)


def test_an_unknown_type_with_kv_lora_rank_says_vllm_may_cache_a_latent():
    # a model_type kvwatch does not know is read as MiniCPM3 (per-head K and V): said, not silent
    cfg = {**config("longcat_flash_lite"), "model_type": "newcat", "architectures": ["NewcatForCausalLM"]}
    a = arch_from_config(cfg)
    assert not a.is_mla
    (note,) = [n for n in a.notes if "kv_lora_rank" in n]
    assert "model_type newcat is not one vLLM caches as a latent" in note and "192" in note
    # a head_dim given is the size used, and the one quoted
    (note,) = [n for n in arch_from_config({**cfg, "head_dim": 128}).notes if "kv_lora_rank" in n]
    assert "K and V of 128" in note


def test_plamo2_attention_layers_follow_mamba_step():
    # plamo2.py is_mamba: Mamba unless i % mamba_step == mamba_step // 2 (vLLM up to 0.26)
    a = arch_from_config(config("plamo2_1b"))
    assert a.layer_types == tuple(FULL if i % 2 == 1 else MAMBA for i in range(16))
    assert kv_bytes(config("plamo2_1b")) == 8 * 1 * 128 * 2 * 2


def test_afmoe_layer_types_derive_from_global_attn_every_n_layers():
    # transformers' AfmoeConfig: without layer_types every 4th layer is global; all 56 read as sliding before
    cfg = config("trinity_nano_no_layer_types")
    a = arch_from_config(cfg)
    assert a.layer_types == tuple(FULL if (i + 1) % 4 == 0 else SLIDING for i in range(56))
    listed = {**cfg, "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(56)]}
    assert arch_from_config(listed).layer_types == a.layer_types
    # AFMoE's rule only: another family with the field (ModernBERT's decoder) derives its layers otherwise
    other = arch_from_config({**cfg, "model_type": "modernbert-decoder"})
    assert other.layer_types != a.layer_types


def test_only_the_layers_that_build_an_indexer_cache_its_keys():
    # IndexCache (vLLM >= 0.21, deepseek_v2.py): with index_topk_freq 4 from index_skip_topk_offset 3, 21 of
    # GLM-5.2's 78 layers build an Indexer and a DeepseekV32IndexerCache (132 B per token); the others share their
    # top-k. Every layer was charged the 132 B: 100,152 B per token in bf16 where vLLM's pool holds 92,628.
    arch = arch_from_config(config("glm52_dsa_index_share"))
    assert arch.indexer_layers() == 21 == config("glm52_dsa_index_share")["indexer_types"].count("full")
    bf16 = kv_layout(arch, 8, 1, 2, 64, (0, 33))
    total = bf16.bytes_per_token_per_layer * 78
    exact = 78 * (512 + 64) * 2 + 21 * 132
    assert exact <= total < exact + 78  # spread over the layers, rounded up per layer
    assert kv_layout(arch, 8, 1, 2, 64, (0, 20)).bytes_per_token_per_layer == (512 + 64) * 2 + 132  # before 0.21
    pattern = arch_from_config({**config("glm52_dsa_index_share"), "index_topk_pattern": "FS" * 39})
    assert pattern.indexer_layers() == 39


def test_glm5_dsa_runs_an_fp8_cache_for_auto_on_blackwell_from_0_32():
    from kvwatch.capacity.kv import sparse_mla_kv_cache_dtype

    arch = arch_from_config(config("glm52_dsa_index_share"))
    assert sparse_mla_kv_cache_dtype(arch, "auto", (0, 32), (10, 0), 8)[0] == "fp8_e4m3"
    assert sparse_mla_kv_cache_dtype(arch, "auto", (0, 31), (10, 0), 8)[0] == "auto"
    assert sparse_mla_kv_cache_dtype(arch, "auto", (0, 33), (9, 0), 8)[0] == "auto"  # Hopper: as asked
