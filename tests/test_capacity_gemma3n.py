"""Gemma 3n: a list-valued intermediate_size (one per layer) and KV sharing (num_kv_shared_layers).

vLLM's Gemma3nAttention (vllm/model_executor/models/gemma3n.py) gives the last num_kv_shared_layers layers a
kv_sharing_target_layer_name, and the runner makes no KV cache spec for them (vllm/v1/worker/gpu_model_runner.py
get_kv_cache_spec): they read earlier layers' KV and hold none. Gemma 4 (gemma4.py) does the same.
"""

from __future__ import annotations

import json

import pytest

from kvwatch.capacity import kv, memory
from kvwatch.capacity.architecture import arch_from_config
from kvwatch.capacity.layers import FULL, SLIDING
from kvwatch.cli import main

pytestmark = pytest.mark.usefixtures("no_kvwatch_env")

# google/gemma-3n-E4B-it's config.json, the text fields kvwatch reads (35 layers: 4 sliding, 1 global, ...).
GEMMA3N = {
    "architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n", "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3n_text", "hidden_size": 2048, "intermediate_size": [16384] * 35,
        "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7, "sliding_window": 512,
        "num_kv_shared_layers": 15, "max_position_embeddings": 32768, "vocab_size": 262400,
        "torch_dtype": "bfloat16",
    },
}


def _with_text(**changes):
    return {**GEMMA3N, "text_config": {**GEMMA3N["text_config"], **changes}}


def test_a_per_layer_intermediate_size_list_is_read_as_its_mean():
    arch = arch_from_config(GEMMA3N)
    assert arch.intermediate_size == 16384
    # the MLP weights sum over the layers: the mean (a whole number) x the layer count
    varied = arch_from_config(_with_text(intermediate_size=[8192] * 10 + [16384] * 25))
    assert varied.intermediate_size == (8192 * 10 + 16384 * 25) // 35
    same = arch_from_config(_with_text(intermediate_size=16384))
    assert memory.parameter_counts(arch) == memory.parameter_counts(same)


def test_kv_shared_layers_hold_no_kv_but_keep_their_weights():
    arch = arch_from_config(GEMMA3N)
    assert arch.kv_shared_layers == 15
    assert len(arch.kv_cache_layer_types) == 20
    assert arch.kv_cache_layer_types.count(FULL) == 4 and arch.kv_cache_layer_types.count(SLIDING) == 16
    assert len(arch.attention_layer_types) == 35  # weights and attention compute: every layer
    layout = kv.kv_layout(arch, 1, 1, 2, 16, (0, 20))
    assert layout.kv_bytes_per_token == 20 * 2 * 2 * 256 * 2
    assert [g.kind for g in layout.groups] == [FULL] + [SLIDING] * 4
    assert any("num_kv_shared_layers" in n for n in arch.notes)


def test_kv_sharing_is_read_only_for_the_families_vllm_shares_in():
    other = {**GEMMA3N["text_config"], "model_type": "llama", "intermediate_size": 16384}
    assert arch_from_config(other).kv_shared_layers == 0
    gemma4 = {**GEMMA3N["text_config"], "model_type": "gemma4_text", "intermediate_size": 16384}
    assert arch_from_config(gemma4).kv_shared_layers == 15


def test_reviewer_plan_on_an_l4(tmp_path, capsys):
    # kvwatch plan --model-config gemma3n --gpu L4 --max-model-len 32768 --vllm-version 0.20 --available-kv-gib 10:
    # 20 cached layers, concurrency 30.43 (35 layers counted before: 17.39)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA3N))
    code = main(["plan", "--model-config", str(path), "--gpu", "L4", "--max-model-len", "32768", "--vllm-version",
                 "0.20", "--available-kv-gib", "10", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["kv_bytes_per_token"] == 20 * 2048
    assert round(out["max_concurrency_at_max_model_len"], 2) == 30.43
