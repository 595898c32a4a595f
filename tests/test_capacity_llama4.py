"""Llama-4 Scout / Maverick presets: chunked local attention layers, and the MoE interleave.

Expected values: Meta's published totals (model cards: Scout 109B, Maverick 400B total parameters, each including
a vision tower kvwatch does not count); the layer pattern and the KV treatment as vLLM applies them (llama4.py:
RoPE layers use chunked local attention, NoPE layers every no_rope_layer_interval-th are global; vLLM's config
logs "There is a latency regression when using chunked local attention with the hybrid KV cache manager.
Disabling it, by default." so every layer holds every token).
"""

from __future__ import annotations

import pytest

from kvwatch.capacity import kv, memory
from kvwatch.capacity.layers import CHUNKED, FULL
from kvwatch.capacity.presets import resolve_model

SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
MAVERICK = "meta-llama/Llama-4-Maverick-17B-128E-Instruct"


@pytest.mark.parametrize(("name", "published_billions"), [(SCOUT, 109), (MAVERICK, 400)])
def test_weights_match_the_published_totals(name, published_billions):
    arch = resolve_model(name)
    params = memory.estimate_weights_bytes(arch, 2, None, 1, 1) / 2 / 1e9
    assert params == pytest.approx(published_billions, rel=0.02)


def test_every_fourth_layer_is_global_the_rest_chunked():
    arch = resolve_model(SCOUT)
    assert arch.layer_types.count(CHUNKED) == 36 and arch.layer_types.count(FULL) == 12
    assert arch.layer_types[3] == FULL and arch.layer_types[0] == CHUNKED
    assert arch.attention_chunk_size == 8192
    assert any("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE" in n for n in arch.notes)


def test_chunked_layers_count_as_full_attention_as_vllm_does_by_default():
    arch = resolve_model(SCOUT)
    layout = kv.kv_layout(arch, 8, 1, 2, 16, (0, 11))
    assert layout.num_groups == 1 and layout.group_size == 48
    assert layout.kv_bytes_per_token == 48 * 2 * 1 * 128 * 2  # 8 KV heads over TP 8: one per rank


def test_context_lengths_from_the_configs():
    assert resolve_model(SCOUT).derived_max_model_len == 10_485_760  # llama3 rope: not scaled again
    assert resolve_model(MAVERICK).derived_max_model_len == 1_048_576
