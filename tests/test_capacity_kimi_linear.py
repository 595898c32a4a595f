"""Kimi-Linear (model_type kimi_linear): KDA layers keep a linear-attention state, the others are MLA.

Expected values follow vLLM: the layer split is KimiLinearConfig.is_kda_layer ((index + 1) in kda_layers,
vllm/transformers_utils/configs/kimi_linear.py), the state is MambaStateShapeCalculator.kda_state_shape /
MambaStateDtypeCalculator.kda_state_dtype (vllm/model_executor/layers/mamba/mamba_utils.py), the block size
_align_hybrid_block_size (vllm/platforms/interface.py, 0.20+) or HybridAttentionMambaModelConfig
(vllm/model_executor/models/config.py, 0.14-0.18).
"""

from __future__ import annotations

import pytest

from kvwatch.capacity import kv, planner
from kvwatch.capacity.architecture import arch_from_config
from kvwatch.capacity.layers import FULL, MAMBA
from kvwatch.capacity.mamba import KDA
from kvwatch.capacity.memory import GIB

# moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json, the fields kvwatch reads.
KIMI_LINEAR = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "dtype": "bfloat16",
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 27, "num_attention_heads": 32,
    "num_key_value_heads": 32, "head_dim": 72, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "q_lora_rank": None, "first_k_dense_replace": 1, "moe_intermediate_size": 1024,
    "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "vocab_size": 163840,
    "model_max_length": 1048576, "tie_word_embeddings": False,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
    },
}
# conv states (K - 1) x H.D for q, k and v in bf16, the recurrent state H x D x D in float32
KDA_PAGE = 3 * 3 * 32 * 128 * 2 + 32 * 128 * 128 * 4


def test_kda_layers_are_state_layers_and_the_rest_mla():
    arch = arch_from_config(KIMI_LINEAR)
    assert arch.is_mla and arch.mamba_layers == 20
    assert [i + 1 for i, t in enumerate(arch.layer_types) if t == FULL] == [4, 8, 12, 16, 20, 24, 27]
    assert arch.layer_types.count(MAMBA) == 20
    assert arch.mamba_dims is not None and arch.mamba_dims.kind == KDA
    assert arch.mamba_dims.page_bytes(1, 2, kv.mamba_ssm_dtype_bytes(arch, (0, 20))) == KDA_PAGE == 2_170_880


def test_reviewer_plan_on_0_20():
    # kvwatch plan --model-config kimi/config.json --gpu H100 --max-model-len 131072 --vllm-version 0.20
    # --available-kv-gib 40: 7 MLA layers x 576 x 2 B; block 16 x ceil(2,170,880 / (16 x 1,152)) = 1,888; groups of
    # 7 (20 KDA layers >= 1.5 x 7): 1 MLA + 3 KDA; 40 GiB / (1,888 x 7 x 1,152 B) = 2,821 blocks; a 131,072-token
    # request holds ceil(131,072 / 1,888) = 70 + 3 blocks (no prefix caching for hybrids before 0.26).
    spec = planner.DeploymentSpec(arch=arch_from_config(KIMI_LINEAR), gpu_memory_bytes=80 * GIB,
                                  max_model_len=131072, vllm_version=(0, 20), available_kv_bytes=40 * GIB)
    plan = planner.plan_capacity(spec)
    assert plan.kv_bytes_per_token == 7 * 1152
    assert plan.layout.mamba_page_bytes == 2_170_880 and plan.layout.block_size == 1888
    assert [g.kind for g in plan.layout.groups] == [FULL, MAMBA, MAMBA, MAMBA]
    assert plan.num_gpu_blocks == 2821
    assert plan.max_concurrency_at_max_model_len == pytest.approx(2821 / 73)
    assert round(plan.max_concurrency_at_max_model_len, 2) == 38.64


@pytest.mark.parametrize(("version", "block"), [
    ((0, 16), 64 * 30),  # 0.14-0.18: MLA hybrids align to 64
    ((0, 20), 16 * 118),  # 0.20-0.26: the MLA backend's smallest block (FLASH_ATTN_MLA: 16)
    ((0, 26), 16 * 118),
    ((0, 28), 128 * 15),  # from 0.28: at least 128 for MLA hybrids
    ((0, 30), 128 * 15),
])
def test_mla_hybrid_block_alignment_per_release(version, block):
    layout = kv.kv_layout(arch_from_config(KIMI_LINEAR), 1, 1, 2, 16, version, model_dtype_bytes=2)
    assert layout.block_size == block


def test_kda_state_splits_over_tensor_parallel_ranks():
    arch = arch_from_config(KIMI_LINEAR)
    assert arch.mamba_dims is not None
    assert arch.mamba_dims.page_bytes(4, 2, 4) == KDA_PAGE // 4
