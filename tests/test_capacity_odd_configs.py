"""Odd config.json values: refused with a message naming the field, or read the way vLLM reads them."""

from __future__ import annotations

import pytest

from kvwatch.capacity.architecture import ArchitectureError, arch_from_config

LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(("changes", "field"), [
    ({"num_key_value_heads": [8] * 32}, "num_key_value_heads"),
    ({"num_local_experts": 16, "interleave_moe_layer_step": [1, 2]}, "interleave_moe_layer_step"),
    ({"quantization_config": {"quant_method": "gptq", "bits": [4]}}, "quantization_config.bits"),
    ({"head_dim": "wide"}, "head_dim"),
    ({"sliding_window": [4096]}, "sliding_window"),
    ({"vocab_size": {"text": 1}}, "vocab_size"),
    ({"rope_scaling": {"type": "linear", "factor": [2]}}, "rope_scaling.factor"),
    ({"model_type": "qwen3_next", "full_attention_interval": [4], "linear_num_value_heads": 32,
      "linear_value_head_dim": 128}, "full_attention_interval"),
    ({"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"] * 16,
      "linear_num_value_heads": [32], "linear_value_head_dim": 128}, "linear_num_value_heads"),
    ({"model_type": "minimax_m1", "attn_type_list": ["softmax"] * 32}, "attn_type_list"),
])
def test_a_wrong_typed_number_names_its_field(changes, field):
    with pytest.raises(ArchitectureError) as exc:
        arch_from_config({**LLAMA, **changes})
    message = str(exc.value)
    assert field in message and "TypeError" not in message and "int()" not in message


def test_numbers_written_as_strings_still_read():
    arch = arch_from_config({**LLAMA, "num_key_value_heads": "8", "sliding_window": "4096"})
    assert arch.num_kv_heads == 8 and arch.sliding_window == 4096


@pytest.mark.parametrize("length", [2, 31, 33])
def test_layer_types_of_another_length_than_the_layers_is_refused(length):
    # transformers' layer_type_validation refuses it as well; kvwatch used to count 2 layers for 32
    types = (["sliding_attention", "full_attention"] * 20)[:length]
    with pytest.raises(ArchitectureError, match=f"{length} layer_types for num_hidden_layers 32"):
        arch_from_config({**LLAMA, "layer_types": types, "sliding_window": 4096})


def test_minimax_m2_all_attention_list_is_not_called_a_hybrid():
    # MiniMax-M2: attn_type_list of 62 ones, i.e. softmax attention in every layer and no linear layer
    config = {**LLAMA, "model_type": "minimax_m2", "num_hidden_layers": 62, "num_attention_heads": 48,
              "head_dim": 128, "hidden_size": 3072, "attn_type_list": [1] * 62}
    arch = arch_from_config(config)
    assert not arch.is_hybrid_mamba and arch.mamba_layers == 0 and arch.mamba_dims is None
    assert not any("hybrid" in n for n in arch.notes)
    assert len(arch.attention_layer_types) == 62


def test_a_null_in_the_text_config_does_not_hide_the_top_level_value():
    # "text_config": {"num_hidden_layers": null, ...} beside a top-level 40 said "config.json has no
    # num_hidden_layers".
    config = {"model_type": "x", "num_hidden_layers": 40,
              "text_config": {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                              "num_key_value_heads": 8, "num_hidden_layers": None, "vocab_size": 128256}}
    assert arch_from_config(config).num_layers == 40


def test_exaone4_letter_pattern_without_layer_types():
    # transformers' Exaone4Config: "LLLG" repeats from layer 0 (L sliding, G global), the last layer always global;
    # the same layers as the layer_types the released files ship
    cfg = {**LLAMA, "model_type": "exaone4", "num_hidden_layers": 10, "sliding_window": 4096,
           "sliding_window_pattern": "LLLG"}
    letters = arch_from_config(cfg)
    four = ["sliding_attention"] * 3 + ["full_attention"]
    listed = arch_from_config({**cfg, "layer_types": four * 2 + ["sliding_attention", "full_attention"]})
    assert letters.layer_types == listed.layer_types
    assert letters.layer_types[-1] == "full_attention" and letters.layer_types.count("sliding_attention") == 7


@pytest.mark.parametrize("model_type", ["mamba", "mamba2", "falcon_mamba"])
def test_a_pure_mamba_model_is_refused_as_attention_free(model_type):
    cfg = {"model_type": model_type, "hidden_size": 4096, "num_hidden_layers": 64, "state_size": 16,
           "vocab_size": 65024}
    with pytest.raises(ArchitectureError, match="attention-free"):
        arch_from_config(cfg)


def test_exaone4_letter_pattern_without_a_window_is_all_global():
    cfg = {**LLAMA, "model_type": "exaone4", "sliding_window": None, "sliding_window_pattern": "LLLG"}
    assert set(arch_from_config(cfg).layer_types) == {"full_attention"}


@pytest.mark.parametrize(("changes", "named"), [
    ({"model_type": "bailing_moe_linear", "layer_group_size": 5}, "layer_group_size"),  # Ring-mini-linear-2.0
    ({"model_type": "recurrent_gemma", "block_types": ["recurrent", "recurrent", "attention"],
      "attention_window_size": 2048}, "block_types, attention_window_size"),
    ({"model_type": "hunyuan_v1_moe", "use_cla": True, "cla_share_factor": 2}, "use_cla"),
])
def test_a_layer_layout_kvwatch_does_not_read_is_named_not_planned_silently(changes, named):
    # each was planned as full attention in every layer, without a word (Ring-mini-linear: 5x the
    # KV per token of its 4 softmax layers in 20)
    notes = arch_from_config({**LLAMA, **changes}).notes
    assert any(f"config.json has {named}: a layer layout kvwatch did not read" in n for n in notes), notes


def test_layout_fields_kvwatch_reads_or_that_change_nothing_give_no_such_note():
    for changes in ({"model_type": "jamba", "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16,
                     "mamba_d_conv": 4, "mamba_expand": 2},
                    {"model_type": "hunyuan_v1_moe", "use_cla": False, "cla_share_factor": 2}, {}):
        notes = arch_from_config({**LLAMA, **changes}).notes
        assert not any("a layer layout kvwatch did not read" in n for n in notes), (changes, notes)


def test_the_vocabulary_is_chatglms_padded_one_or_an_assumption_said_aloud():
    # GLM-4-9B-chat's config.json names it padded_vocab_size (151,552): read as 32,000, the weights lost 1 B
    # parameters and the sampler 1.6 GiB, and the plan gave 6.6 % more KV tokens, saying nothing.
    base = {k: v for k, v in LLAMA.items() if k != "vocab_size"}
    glm = arch_from_config({**base, "model_type": "chatglm", "padded_vocab_size": 151_552})
    assert glm.vocab_size == 151_552 and not any("vocab_size" in n for n in glm.notes)
    bare = arch_from_config({**base, "model_type": "some_new_type"})
    assert bare.vocab_size == 32_000 and any(n.startswith("config.json has no vocab_size: 32,000 assumed")
                                             for n in bare.notes)
    # a class kvwatch knows fills it, as transformers does for vLLM (LlamaConfig's 32,000), and says so
    llama = arch_from_config(base)
    assert llama.vocab_size == 32_000 and any(n.startswith("config.json leaves out vocab_size") for n in llama.notes)


@pytest.mark.parametrize("kv_heads", [6, 64])
def test_kv_heads_that_do_not_group_the_heads_are_refused_naming_them(kv_heads):
    # vLLM asserts num_heads % num_kv_heads == 0; 6 KV heads for 32 heads were planned at 110,592 B a token.
    with pytest.raises(ArchitectureError, match=f"{kv_heads} KV heads for 32 attention heads"):
        arch_from_config({**LLAMA, "num_key_value_heads": kv_heads})


def test_a_partial_llava_text_config_is_filled_from_llamas_class_defaults():
    # llava-hf/llava-1.5-7b-hf names only its text model's vocabulary and length; vLLM builds a LlamaConfig from it
    # (32 layers, 32 heads, KV heads = heads, head_dim 128). kvwatch refused it: "no num_hidden_layers".
    llava = {"model_type": "llava", "text_config": {"max_position_embeddings": 4096, "model_type": "llama",
                                                    "vocab_size": 32064},
             "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "num_hidden_layers": 24}}
    arch = arch_from_config(llava)
    assert (arch.num_layers, arch.num_attention_heads, arch.num_kv_heads, arch.head_dim, arch.vocab_size) == (
        32, 32, 32, 128, 32064)
    assert arch.derived_max_model_len == 4096
    assert any(n.startswith("config.json leaves out hidden_size, intermediate_size, num_hidden_layers, "
                            "num_attention_heads: llama's config class fills") for n in arch.notes)
