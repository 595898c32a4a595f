"""DeepSeek-V3.2's KV cache dtype as vLLM really serves it: fp8_ds_mla by release and GPU.

Read off the wheels: 0.11's DeepseekV32ForCausalLM.verify_and_update_config turns "auto" and fp8* into fp8_ds_mla,
0.14-0.16's only fp8* (vllm/model_executor/models/config.py); from 0.18 the MLA layer does it when its backend is
FLASHMLA_SPARSE (vllm/model_executor/layers/attention/mla_attention.py), Hopper's only sparse MLA backend for fp8
(vllm/platforms/cuda.py), while Blackwell picks FLASHINFER_MLA_SPARSE (0.18: at <= 16 heads per rank; 0.20: for a
quantized cache), which keeps plain fp8.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvwatch.capacity import kv, planner
from kvwatch.capacity.architecture import arch_from_config
from kvwatch.capacity.memory import GIB

DSV32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1,
    "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "index_head_dim": 128, "index_n_heads": 64,
    "index_topk": 2048,
}
HOPPER, BLACKWELL, SM120 = (9, 0), (10, 0), (12, 0)
INDEXER = 132  # 128 fp8 keys + one float32 scale per 128
DS_MLA, FP8, BF16 = (kv.FP8_DS_MLA_BYTES + INDEXER) * 61, (576 + INDEXER) * 61, (576 * 2 + INDEXER) * 61


def _plan(kv_cache_dtype, version, capability, tp=1):
    spec = planner.DeploymentSpec(arch=arch_from_config(DSV32), gpu_memory_bytes=80 * GIB,
                                  gpu_compute_capability=capability, tensor_parallel_size=tp,
                                  kv_cache_dtype=kv_cache_dtype, vllm_version=version, max_model_len=8192,
                                  available_kv_bytes=40 * GIB)
    return planner.plan_capacity(spec)


@pytest.mark.parametrize(("kv_cache_dtype", "version", "capability", "tp", "bytes_per_token"), [
    ("auto", (0, 11), HOPPER, 1, DS_MLA),  # 0.11-0.13: auto too
    ("fp8", (0, 11), HOPPER, 1, DS_MLA),
    ("bfloat16", (0, 11), HOPPER, 1, BF16),  # vLLM's way to keep bf16 there
    ("auto", (0, 14), HOPPER, 1, BF16),  # 0.14-0.16: fp8* only
    ("fp8", (0, 16), HOPPER, 1, DS_MLA),
    ("fp8_e4m3", (0, 16), BLACKWELL, 1, DS_MLA),  # (the config rule knows no GPU)
    ("auto", (0, 20), HOPPER, 1, BF16),
    ("fp8", (0, 18), HOPPER, 1, DS_MLA),  # FLASHMLA_SPARSE
    ("fp8", (0, 20), HOPPER, 8, DS_MLA),
    ("fp8", (0, 18), BLACKWELL, 4, DS_MLA),  # 32 heads per rank: FLASHMLA_SPARSE first
    ("fp8", (0, 18), BLACKWELL, 8, FP8),  # 16 heads per rank: FLASHINFER_MLA_SPARSE
    ("fp8", (0, 20), BLACKWELL, 1, FP8),  # a quantized cache: FLASHINFER_MLA_SPARSE
    ("auto", (0, 30), SM120, 1, DS_MLA),  # FLASHINFER_MLA_SPARSE_SM120 takes auto too
])
def test_kv_dtype_vllm_serves_per_release_and_gpu(kv_cache_dtype, version, capability, tp, bytes_per_token):
    plan = _plan(kv_cache_dtype, version, capability, tp)
    assert plan.kv_bytes_per_token == bytes_per_token
    changed = plan.spec.kv_cache_dtype == "fp8_ds_mla" and kv_cache_dtype != "fp8_ds_mla"
    assert changed == (bytes_per_token == DS_MLA)
    kept_plain_fp8 = bytes_per_token == FP8  # (Blackwell: a note says why not fp8_ds_mla)
    assert any("fp8_ds_mla" in n for n in plan.notes) == (changed or kept_plain_fp8)


def test_dense_mla_models_are_left_alone():
    dense = arch_from_config({k: v for k, v in DSV32.items() if not k.startswith("index")}
                             | {"model_type": "deepseek_v3"})
    assert kv.sparse_mla_kv_cache_dtype(dense, "fp8", (0, 20), HOPPER, 1) == ("fp8", None)
    assert kv.sparse_mla_kv_cache_dtype(dense, "auto", (0, 11), HOPPER, 1) == ("auto", None)


def test_the_fp8_what_if_starts_from_the_dtype_vllm_serves():
    # On 0.11 "auto" already runs fp8_ds_mla: the what-if promised "about 2x tokens" for --kv-cache-dtype fp8.
    from kvwatch.capacity.whatif import whatif_scenarios

    spec = _plan("auto", (0, 11), HOPPER).spec
    assert spec.kv_cache_dtype == "fp8_ds_mla"
    (fp8,) = [s for s in whatif_scenarios(replace(spec, kv_cache_dtype="auto")) if s.name == "fp8_kv_cache"]
    assert "already FP8 (fp8_ds_mla): no gain" in fp8.note
    assert "the tokens" not in fp8.note


def test_the_fp8_what_if_states_the_gain_it_planned():
    # fp8_ds_mla keeps its rope dims in 16 bits, its scales and the indexer's keys: "about 2x tokens" overstated the
    # gain; the note gives the planned ratio.
    from kvwatch.capacity.whatif import whatif_scenarios

    base = _plan("auto", (0, 14), HOPPER)
    assert base.spec.kv_cache_dtype == "auto"
    (fp8,) = [s for s in whatif_scenarios(base.spec) if s.name == "fp8_kv_cache"]
    ratio = fp8.kv_cache_tokens / base.kv_cache_tokens
    assert 1.5 < ratio < 1.8
    assert f"x{ratio:.2f} the tokens" in fp8.note and "2x" not in fp8.note
