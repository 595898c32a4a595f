"""Ling / Ring 2.5 and 3.0 (model_type bailing_hybrid): one MLA layer closes each group of layer_group_size layers,
the others keep a linear-attention state (lightning attention in 2.5, KDA in 3.0).

Read in vLLM's source: bailing_hybrid is an MLA type (ModelArchConfigConvertorBase.is_deepseek_mla,
vllm/transformers_utils/model_arch_config_convertor.py, 0.20 and 0.30); BailingMoeV2_5ForCausalLM's layers are
linear where (index + 1) % layer_group_size != 0 (is_linear_layer, vllm/model_executor/models/bailing_moe_linear.py),
with MambaStateShapeCalculator.linear_attention_state_shape(num_attention_heads, head_dim); BailingMoeV3ForCausalLM's
are KDA unless (index + 1) % layer_group_size == 0 or the layer lies after the last whole group (_is_kda_layer,
bailing_moe_v3.py), with kda_state_shape(num_attention_heads, head_dim, short_conv_kernel_size) and a float32
recurrent state (kda_state_dtype). The configs are written from the public model cards (the dimensions of a 1T
2.5 model and a 3.0 "flash" model): no checkpoint of either was at hand.
"""

from __future__ import annotations

import pytest

from kvwatch.capacity import planner
from kvwatch.capacity.architecture import arch_from_config
from kvwatch.capacity.layers import FULL, MAMBA
from kvwatch.capacity.mamba import KDA, LINEAR_ATTENTION
from kvwatch.capacity.memory import GIB

pytestmark = pytest.mark.usefixtures("no_kvwatch_env")

LING_2_5 = {
    "architectures": ["BailingMoeV2_5ForCausalLM"], "model_type": "bailing_hybrid", "hidden_size": 8192,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "layer_group_size": 8, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "num_experts": 256, "num_experts_per_tok": 8,
    "num_shared_experts": 1, "moe_intermediate_size": 2048, "intermediate_size": 18432, "first_k_dense_replace": 4,
    "vocab_size": 157184, "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
LING_3_FLASH = {
    "architectures": ["BailingMoeV3ForCausalLM"], "model_type": "bailing_hybrid", "hidden_size": 2560,
    "num_hidden_layers": 42, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
    "layer_group_size": 4, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "short_conv_kernel_size": 4, "num_experts": 512,
    "num_experts_per_tok": 8, "num_shared_experts": 1, "moe_intermediate_size": 512, "intermediate_size": 6144,
    "first_k_dense_replace": 2, "vocab_size": 157184, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def _plan(config: dict, version: tuple[int, int], tp: int = 1, prefix: bool = True) -> planner.CapacityPlan:
    spec = planner.DeploymentSpec(arch=arch_from_config(config), gpu_memory_bytes=80 * GIB, tensor_parallel_size=tp,
                                  max_model_len=131072, vllm_version=version, available_kv_bytes=20 * GIB,
                                  enable_prefix_caching=prefix)
    return planner.plan_capacity(spec)


def test_ling_2_5_layers_are_lightning_attention_with_an_mla_layer_per_group():
    # Every layer was counted as GQA attention with 8 KV heads: 3.5 times too little KV, and no note.
    arch = arch_from_config(LING_2_5)
    assert arch.is_mla and arch.mamba_dims is not None and arch.mamba_dims.kind == LINEAR_ATTENTION
    assert [i for i, t in enumerate(arch.layer_types) if t == FULL] == list(range(7, 80, 8))
    # TP 8 on 0.20: MLA (512 + 64) x 2 B per token and layer; a state of 8 heads x 128 x 128 x 2 B = 262,144 B;
    # block 16 x ceil(262,144 / (16 x 1,152)) = 240; 1 MLA + 7 state groups of 10 layers: 20 GiB /
    # (10 x 240 x 1,152 B) = 7,767 blocks; a request holds ceil(131,072 / 240) + 7 = 554 of them.
    plan = _plan(LING_2_5, (0, 20), tp=8, prefix=False)
    assert plan.layout.block_size == 240 and plan.num_gpu_blocks == 7767
    assert plan.max_concurrency_at_max_model_len == pytest.approx(7767 / 554)
    assert plan.kv_cache_tokens == 1_837_610


def test_ling_3_layers_are_kda_and_the_last_partial_group_mla():
    # It read as 688,128 B per token, and kvwatch said vLLM would not start ("short by 64 GiB").
    arch = arch_from_config(LING_3_FLASH)
    assert arch.is_mla and arch.mamba_dims is not None and arch.mamba_dims.kind == KDA
    full = [i for i, t in enumerate(arch.layer_types) if t == FULL]
    assert full == [*range(3, 40, 4), 40, 41] and arch.layer_types.count(MAMBA) == 30
    # 0.30: KDA state 3 x 3 x 4,096 x 2 B + 32 x 128 x 128 x 4 B = 2,170,880 B; MLA hybrids align to 128:
    # 128 x ceil(2,170,880 / (128 x 1,152)) = 1,920; groups of 12 (1 MLA + 3 KDA): 20 GiB / (12 x 1,920 x 1,152)
    # = 809 blocks; with prefix caching ("align") a request holds ceil(131,072 / 1,920) = 69 + 2 per KDA group.
    plan = _plan(LING_3_FLASH, (0, 30))
    assert plan.layout.mamba_page_bytes == 2_170_880 and plan.layout.block_size == 1920
    assert plan.num_gpu_blocks == 809
    assert plan.max_concurrency_at_max_model_len == pytest.approx(809 / 75)
