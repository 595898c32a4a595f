"""Model architecture from config.json and presets; GPU presets."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from kvwatch.capacity import (
    ArchitectureError,
    PresetError,
    arch_from_config,
    match_model,
    resolve_gpu,
    resolve_model,
)
from kvwatch.capacity.layers import FULL, MAMBA, SLIDING
from kvwatch.capacity.presets import gpu_names, preset_names
from kvwatch.cli import main

GIB = 1 << 30
BASE = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512, "vocab_size": 1000}


def test_missing_head_dim_and_kv_heads_default_to_mha():
    arch = arch_from_config(dict(BASE))
    assert arch.head_dim == 64 and arch.num_kv_heads == 8


def test_explicit_head_dim_wins_over_hidden_over_heads():
    arch = arch_from_config({**BASE, "head_dim": 128, "num_key_value_heads": 2})
    assert arch.head_dim == 128 and arch.num_kv_heads == 2


def test_multimodal_text_config_is_used():
    cfg = {"model_type": "gemma3", "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27},
           "text_config": {**BASE, "num_hidden_layers": 12, "sliding_window": 1024, "sliding_window_pattern": 6}}
    arch = arch_from_config(cfg)
    assert arch.num_layers == 12
    assert arch.layer_types == (SLIDING,) * 5 + (FULL,) + (SLIDING,) * 5 + (FULL,)
    assert arch.sliding_window == 1024


def test_layer_types_list_is_read():
    arch = arch_from_config({**BASE, "sliding_window": 128,
                             "layer_types": ["sliding_attention", "full_attention"] * 2})
    assert arch.layer_types == (SLIDING, FULL, SLIDING, FULL)


def test_mla_fields():
    arch = arch_from_config({**BASE, "model_type": "deepseek_v3", "kv_lora_rank": 512, "qk_rope_head_dim": 64})
    assert arch.is_mla and arch.kv_lora_rank == 512 and arch.qk_rope_head_dim == 64
    with pytest.raises(ArchitectureError, match="kv_lora_rank"):
        arch_from_config({**BASE, "model_type": "deepseek_v3"})


def test_hybrid_mamba_is_detected_and_says_what_is_not_modelled():
    arch = arch_from_config({**BASE, "model_type": "jamba", "attn_layer_period": 2, "attn_layer_offset": 1})
    assert arch.is_hybrid_mamba
    assert arch.layer_types == (MAMBA, FULL, MAMBA, FULL)
    assert len(arch.attention_layer_types) == 2
    assert any("NOT modelled" in n for n in arch.notes)
    granite = resolve_model("ibm-granite/granite-4.0-h-small")
    assert granite.is_hybrid_mamba and len(granite.attention_layer_types) == 4


def test_a_hybrid_layout_the_file_leaves_to_its_class_takes_the_class_default() -> None:
    # vLLM reads transformers' config class, which fills these: without them every layer was sized as attention,
    # 4-8x the KV per token, with a note claiming the state pages were modelled.
    qwen = _preset_config("Qwen/Qwen3-Next-80B-A3B-Instruct")
    stripped = {k: v for k, v in qwen.items() if k not in ("full_attention_interval", "layer_types")}
    assert arch_from_config(stripped).layer_types == arch_from_config(qwen).layer_types
    assert arch_from_config(stripped).layer_types.count(FULL) == qwen["num_hidden_layers"] // 4
    jamba = {k: v for k, v in JAMBA_V01.items() if k not in ("attn_layer_period", "attn_layer_offset")}
    assert arch_from_config(jamba).layer_types == arch_from_config(JAMBA_V01).layer_types
    assert [i for i, t in enumerate(arch_from_config(jamba).layer_types) if t == FULL] == [4, 12, 20, 28]


BAMBA_9B = {"model_type": "bamba", "num_hidden_layers": 32, "attn_layer_indices": [9, 18, 27],
            "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "intermediate_size": 14336,
            "vocab_size": 128256, "mamba_expand": 2, "tie_word_embeddings": False}
JAMBA_V01 = {"model_type": "jamba", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 65536, "num_experts": 16,
             "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8, "attn_layer_offset": 4,
             "mamba_expand": 2, "tie_word_embeddings": False}
ZAMBA2_2B7 = {"model_type": "zamba2", "num_hidden_layers": 54, "num_attention_heads": 32, "hidden_size": 2560,
              "vocab_size": 32000, "layers_block_type": ["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7
              + ["mamba"] * 4 + ["hybrid"] + ["mamba"] * 3 + ["hybrid"] + ["mamba"] * 2}


@pytest.mark.parametrize(("config", "attention_layers"), [
    (BAMBA_9B, 3),  # attn_layer_indices (was: all 32 counted, ~10x the KV per token)
    (ZAMBA2_2B7, 9),  # layers_block_type: "hybrid" layers carry the shared attention block
    ({**BASE, "model_type": "minimax_text_01", "num_hidden_layers": 16, "attn_type_list": ([0] * 7 + [1]) * 2},
     2),  # MiniMax: 1 = softmax attention, 0 = lightning attention
    ({**BASE, "model_type": "nemotron_h", "num_hidden_layers": 6, "hybrid_override_pattern": "M-M*-M"}, 1),
    ({**BASE, "model_type": "falcon_h1"}, 4),  # attention (and a Mamba mixer) in every layer
])
def test_hybrid_layouts_count_only_attention_layers_for_kv(config, attention_layers):
    arch = arch_from_config(config)
    assert arch.is_hybrid_mamba
    assert len(arch.attention_layer_types) == attention_layers
    assert not any("not recognised" in n for n in arch.notes)
    assert any(f"{attention_layers} layers has attention" in n or f"{attention_layers} attention layers" in n
               for n in arch.notes)


def test_bamba_kv_per_token_is_its_three_attention_layers():
    from kvwatch.capacity.kv import kv_layout

    layout = kv_layout(arch_from_config(BAMBA_9B), 1, 1, 2, 16, (0, 20))
    assert layout.kv_bytes_per_token == 3 * 2 * 8 * 128 * 2


def test_zamba2_attention_head_dim_is_twice_hidden_over_heads():
    assert arch_from_config(ZAMBA2_2B7).head_dim == 2 * 2560 // 32


def test_unrecognised_hybrid_layout_says_what_was_computed():
    arch = arch_from_config({**BASE, "model_type": "plamo2", "tie_word_embeddings": False})
    assert arch.is_hybrid_mamba and len(arch.attention_layer_types) == 4
    [note] = [n for n in arch.notes if not n.startswith("the model's maximum length")]
    assert "not recognised" in note and "all 4 layers are counted as attention" in note
    assert "only attention layers are counted" not in note


def test_jamba_weights_count_experts_only_on_expert_layers():
    from kvwatch.capacity.memory import estimate_weights_bytes, parameter_counts

    arch = arch_from_config(JAMBA_V01)
    assert arch.moe_layers == 16 and len(arch.attention_layer_types) == 4
    assert sum(parameter_counts(arch)) / 1e9 == pytest.approx(51.6, rel=0.03)  # Jamba-v0.1: 52B parameters
    assert estimate_weights_bytes(arch, 2, None, 1, 1) / GIB == pytest.approx(96.0, rel=0.03)  # was 169 GiB


def _preset_config(preset: str) -> dict:
    entry = resources.files("kvwatch") / "data" / "models" / (preset.replace("/", "__") + ".json")
    data = json.loads(entry.read_text())
    return {**data["config"], **({"num_parameters": data["num_parameters"]} if data.get("num_parameters") else {}),
            **({"checkpoint_quantization": data["checkpoint_quantization"]}
               if data.get("checkpoint_quantization") else {})}


def _without_tie(preset: str) -> dict:
    config = _preset_config(preset)
    config.pop("tie_word_embeddings")
    return config


@pytest.mark.parametrize(("preset", "tied"), [
    ("google/gemma-2-2b-it", True),  # Gemma2Config defaults to True (its config.json does not say)
    ("google/gemma-3-1b-it", True),  # Gemma3TextConfig: True
    ("meta-llama/Llama-3.1-8B-Instruct", False),  # LlamaConfig: False
    ("Qwen/Qwen3-8B", False),  # Qwen3Config: False
    ("openai/gpt-oss-20b", False),  # GptOssConfig: False
])
def test_absent_tie_word_embeddings_defaults_like_transformers(preset, tied):
    from kvwatch.capacity.memory import estimate_weights_bytes

    arch = arch_from_config(_without_tie(preset))
    assert arch.tie_word_embeddings is tied
    assert estimate_weights_bytes(arch, 2, None, 1, 1) == estimate_weights_bytes(resolve_model(preset), 2, None, 1, 1)
    # (named only where the config class's defaults are listed, as filling it: Gemma3TextConfig)
    assert not any("tie_word_embeddings" in n and not n.startswith("config.json leaves out") for n in arch.notes)


def test_gemma_2_2b_config_without_tie_matches_the_preset_weights():
    from kvwatch.capacity.memory import estimate_weights_bytes

    config = {k: v for k, v in _without_tie("google/gemma-2-2b-it").items() if k != "num_parameters"}  # a config.json
    weights = estimate_weights_bytes(arch_from_config(config), 2, None, 1, 1)
    assert weights / GIB == pytest.approx(4.87, abs=0.05)  # was 5.97 GiB: an untied 256k x 2304 LM head


def test_unknown_model_type_follows_pretrained_config_and_says_so():
    arch = arch_from_config({**BASE, "model_type": "acme_lm"})
    assert arch.tie_word_embeddings is True
    assert any("PreTrainedConfig default" in n for n in arch.notes)


def test_missing_required_field_is_named():
    with pytest.raises(ArchitectureError, match="num_hidden_layers"):
        arch_from_config({"hidden_size": 10})


@pytest.mark.parametrize("name", [
    "meta-llama/Llama-3.1-8B-Instruct",
    "META-LLAMA/llama-3.1-8b-instruct",
    "/models/Llama-3.1-8B-Instruct",
    "/mnt/models/meta-llama/Llama-3.1-8B-Instruct/",
    "Llama-3.1-8B-Instruct",
    "llama3.1-8b",
])
def test_model_name_forms_resolve_to_the_preset(name):
    assert resolve_model(name).name == "meta-llama/Llama-3.1-8B-Instruct"


def test_quantized_alias_carries_its_quantization():
    match = match_model("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic")
    assert match.arch.name == "meta-llama/Llama-3.3-70B-Instruct" and match.quantization == "fp8"


@pytest.mark.parametrize(("name", "preset", "scheme"), [
    ("Qwen/Qwen3-8B-FP8", "Qwen/Qwen3-8B", "fp8"),
    ("meta-llama/Llama-3.1-405B-Instruct-FP8", "meta-llama/Llama-3.1-405B-Instruct", "fp8"),
    ("zai-org/GLM-4.5-FP8", "zai-org/GLM-4.5", "fp8"),
    ("deepseek-ai/DeepSeek-V3.1", "deepseek-ai/DeepSeek-V3", "fp8"),  # the V3 architecture and FP8 checkpoint
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B", None),
    ("/models/Qwen3-8B-FP8", "Qwen/Qwen3-8B", "fp8"),  # vLLM's model_name label for a local copy
    ("Qwen/Qwen2.5-7B-Instruct-AWQ", "Qwen/Qwen2.5-7B-Instruct", "w4a16"),
    ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8", "Qwen/Qwen2.5-7B-Instruct", "w8a16"),
    ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "Qwen/Qwen2.5-7B-Instruct", "w4a16"),
    ("RedHatAI/Qwen3-8B-FP8-dynamic", "Qwen/Qwen3-8B", "fp8"),
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "meta-llama/Llama-3.1-8B-Instruct", "w8a8"),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen/Qwen3-235B-A22B", None),
])
def test_common_names_find_their_preset_and_imply_the_scheme(name, preset, scheme):
    from kvwatch.capacity.memory import resolve_quantization

    arch = match_model(name).arch
    assert arch.name == preset
    resolved = resolve_quantization(None, arch)
    assert (resolved.scheme if resolved else None) == scheme


def test_a_dated_release_with_a_longer_context_carries_it():
    assert resolve_model("Qwen/Qwen3-30B-A3B").max_position_embeddings == 40960
    assert resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507").max_position_embeddings == 262144
    assert resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8").max_position_embeddings == 262144


def test_a_loose_match_says_so_in_a_note():
    arch = match_model("Qwen/Qwen3-235B-A22B-Instruct-2507").arch
    assert any("without variant words" in n and "--model-config" in n for n in arch.notes)
    assert any("quantization suffix" in n for n in match_model("Qwen/Qwen3-8B-FP8").arch.notes)
    assert not match_model("meta-llama/Llama-3.1-8B-Instruct").arch.notes


@pytest.mark.parametrize("name", ["acme/Nope-1B-FP8", "acme/Nope-1B-Instruct-2507", "FP8"])
def test_stripping_does_not_invent_presets(name):
    with pytest.raises(PresetError):
        match_model(name)


def test_sidecar_matches_vllms_label_for_a_quantized_local_copy(no_kvwatch_env):
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity
    from kvwatch.settings import DeploymentSettings

    capacity, why = build_sidecar_capacity(DeploymentSettings(gpu="H100"), model_name="/models/Qwen3-8B-FP8")
    assert capacity is not None, why
    bf16, _ = build_sidecar_capacity(DeploymentSettings(gpu="H100"), model_name="/models/Qwen3-8B")
    assert bf16 is not None
    assert capacity.plan.weights_bytes < 0.7 * bf16.plan.weights_bytes  # priced as FP8


def test_unknown_model_suggests_model_config():
    with pytest.raises(PresetError, match="--model-config"):
        resolve_model("acme/NotAModel-7B")


def test_config_path_and_bad_json(tmp_path):
    good = tmp_path / "config.json"
    good.write_text(json.dumps({**BASE, "_name_or_path": "me/tiny"}))
    assert resolve_model(str(good)).name == "me/tiny"
    assert resolve_model(str(tmp_path)).num_layers == 4  # a model directory
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ArchitectureError, match="not valid JSON"):
        resolve_model(str(bad))


def test_every_preset_loads_and_records_its_source():
    names = preset_names()
    assert len(names) >= 40
    for entry in (resources.files("kvwatch") / "data" / "models").iterdir():
        if entry.name.endswith(".json") and entry.name != "aliases.json":
            data = json.loads(entry.read_text())
            assert data["source"].startswith("https://"), entry.name
            assert entry.name == data["id"].replace("/", "__") + ".json"
    for name in names:
        arch = resolve_model(name)
        assert arch.num_layers > 0 and arch.head_dim > 0 and arch.source


def test_families_required_by_the_issue_are_present():
    names = " ".join(preset_names()).lower()
    for family in ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-7b", "qwen3-8b", "qwen3-30b-a3b",
                   "mistral-7b", "mixtral-8x7b", "mistral-small", "gemma-2-9b", "gemma-3-27b", "phi-3", "phi-4",
                   "granite", "deepseek-v2", "deepseek-v3", "deepseek-r1", "distill", "glm-4", "gpt-oss",
                   "codellama"]:
        assert family in names, family


def test_calibration_architectures_match_presets():
    # tests/fixtures/calibration/model_architectures.csv rows (layers, heads, kv heads, hidden)
    expected = {
        "meta-llama/Llama-3.1-8B-Instruct": (32, 32, 8, 4096, 128),
        "Qwen/Qwen2.5-7B-Instruct": (28, 28, 4, 3584, 128),
        "Qwen/Qwen3-0.6B": (28, 16, 8, 1024, 128),
        "Qwen/Qwen3-32B": (64, 64, 8, 5120, 128),
        "google/gemma-2-27b-it": (46, 32, 16, 4608, 128),
        "google/gemma-2-9b-it": (42, 16, 8, 3584, 256),
        "openai/gpt-oss-20b": (24, 64, 8, 2880, 64),
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B": (48, 40, 8, 5120, 128),
    }
    for name, (layers, heads, kv, hidden, head_dim) in expected.items():
        a = resolve_model(name)
        assert (a.num_layers, a.num_attention_heads, a.num_kv_heads, a.hidden_size, a.head_dim) == \
            (layers, heads, kv, hidden, head_dim), name


def test_gpu_presets():
    assert resolve_gpu("H100").total_memory_bytes == pytest.approx(79.19 * (1 << 30), rel=1e-6)
    assert resolve_gpu("nvidia a100-sxm4-80gb").name == "A100-80GB"
    for name in ["A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100", "H200", "B200", "RTX 3090", "RTX 4090",
                 "T4", "V100-16GB", "Tesla V100-SXM2-32GB", "MI300X"]:
        assert resolve_gpu(name).source
    # The names nvidia-smi and DCGM's modelName give (and ROCm's for the MI300X)
    for name, preset in [("NVIDIA A100 80GB PCIe", "A100-80GB"), ("Tesla V100-SXM2-16GB", "V100-16GB"),
                         ("Tesla V100-PCIE-32GB", "V100-32GB"), ("AMD Instinct MI300X", "MI300X"),
                         ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA H100 80GB HBM3", "H100-80GB")]:
        assert resolve_gpu(name).name == preset, name
    # Made in two sizes: "A100" was the 40 GB card, and an 80 GB fleet was planned at half its memory.
    for name in ["A100", "nvidia a100", "V100", "Tesla V100"]:
        with pytest.raises(PresetError, match="made in two memory sizes"):
            resolve_gpu(name)
    assert len(gpu_names()) >= 13
    with pytest.raises(PresetError, match="--gpu-memory-gib"):
        resolve_gpu("Voodoo2")


@pytest.mark.parametrize("bad", [
    {"quantization_config": {"quant_method": "gptq", "bits": "4bit"}},
    {"num_hidden_layers": "thirty"},
    {"num_attention_heads": 0},
])
def test_a_malformed_config_value_is_an_architecture_error(bad: dict) -> None:
    config = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, **bad}
    with pytest.raises(ArchitectureError, match=r"config\.json"):
        arch_from_config(config)


def _kv_bytes_per_token(config: dict, tp: int = 1) -> int:
    from kvwatch.capacity.kv import kv_bytes_per_token_per_layer

    arch = arch_from_config(config)
    return kv_bytes_per_token_per_layer(arch, tp, 2) * len(arch.attention_layer_types)


# The KV-relevant fields of the real config.json files (Hugging Face: tiiuae/falcon-40b, tiiuae/falcon-7b,
# bigcode/starcoder, openbmb/MiniCPM3-4B).
FALCON_40B = {"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
              "num_kv_heads": 8, "multi_query": True, "new_decoder_architecture": True, "vocab_size": 65024}
FALCON_7B = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
             "multi_query": True, "new_decoder_architecture": False, "vocab_size": 65024}
STARCODER = {"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48, "n_layer": 40, "n_positions": 8192,
             "multi_query": True, "vocab_size": 49152}
MINICPM3 = {"model_type": "minicpm3", "hidden_size": 2560, "num_hidden_layers": 62, "num_attention_heads": 40,
            "num_key_value_heads": 40, "q_lora_rank": 768, "kv_lora_rank": 256, "qk_nope_head_dim": 64,
            "qk_rope_head_dim": 32, "v_head_dim": 64, "max_position_embeddings": 32768, "vocab_size": 73448}


def test_kv_heads_are_read_as_vllm_reads_them():
    # vLLM: Falcon's new decoder reads n_head_kv / num_kv_heads and ignores multi_query; the old one and
    # StarCoder are multi-query (one KV head); every alias of CONFIG_FIELD_ALIASES["total_num_kv_heads"] counts.
    assert arch_from_config(FALCON_40B).num_kv_heads == 8
    assert _kv_bytes_per_token(FALCON_40B) == 2 * 60 * 8 * 64 * 2 == 122_880
    assert _kv_bytes_per_token(FALCON_40B, tp=16) == 2 * 60 * 1 * 64 * 2  # 8 heads replicated over 16 ranks
    assert _kv_bytes_per_token(FALCON_7B) == 2 * 32 * 1 * 64 * 2 == 8_192
    assert arch_from_config(STARCODER).num_kv_heads == 1
    for alias in ("n_head_kv", "num_attention_groups"):
        assert arch_from_config({**BASE, alias: 2}).num_kv_heads == 2
    dbrx = {**BASE, "model_type": "dbrx", "attn_config": {"kv_n_heads": 2}}
    assert arch_from_config(dbrx).num_kv_heads == 2


def test_kv_lora_rank_alone_is_not_mla():
    # vLLM caches MLA's latent only for the DeepSeek family of model_types; MiniCPM3 decompresses it and caches
    # per-head K and V of qk_nope + qk_rope = 96 (vllm/model_executor/models/minicpm3.py).
    arch = arch_from_config(MINICPM3)
    assert not arch.is_mla
    assert _kv_bytes_per_token(MINICPM3) == 2 * 62 * 40 * 96 * 2 == 952_320
    assert arch_from_config({**MINICPM3, "model_type": "deepseek_v2"}).is_mla


def test_a_gemma3_config_that_leans_on_its_class_defaults():
    # google/gemma-3-4b-it's config.json names only the sizes of its text model; Gemma3TextConfig supplies the
    # heads (8, 4 KV of 256), the 131,072 length and the local:global pattern of 5:1. No Gemma-3 file names
    # the pattern, so without the defaults a 27B would be one KV group instead of 7.
    gemma3_4b = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                 "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                                 "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                                 "sliding_window": 1024},
                 "vision_config": {"hidden_size": 1152, "num_attention_heads": 16, "num_hidden_layers": 27}}
    arch = arch_from_config(gemma3_4b)
    assert (arch.num_attention_heads, arch.num_kv_heads, arch.head_dim) == (8, 4, 256)
    assert arch.derived_max_model_len == 131_072
    assert arch.layer_types.count(FULL) == 5 and arch.sliding_window == 1024  # layers 6, 12, ... of 34
    preset = match_model("google/gemma-3-27b-it").arch
    text = {"model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
            "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
            "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024}
    from_file = arch_from_config({"model_type": "gemma3", "text_config": text})
    assert from_file.layer_types == preset.layer_types
    assert from_file.derived_max_model_len == preset.derived_max_model_len == 131_072


def test_a_count_that_is_not_positive_names_its_field():
    with pytest.raises(ArchitectureError, match="num_hidden_layers = -4: it must be a whole number from 1 to 10,000"):
        arch_from_config({**BASE, "num_hidden_layers": -4})


def test_a_model_folder_reads_its_config_json(tmp_path):
    folder = tmp_path / "Falcon-40B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(FALCON_40B))
    assert resolve_model(str(folder)).num_kv_heads == 8
    assert match_model(str(folder)).arch.num_kv_heads == 8  # vLLM's --model /models/x, as serve gets it
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ArchitectureError, match="is not UTF-8 text"):
        resolve_model(str(tmp_path / "binary.json"))


def test_deepseek_v32_caches_its_indexer_keys_beside_the_latent():
    # vLLM's DeepseekV32IndexerCache: index_head_dim fp8 values + a float32 scale per 128, uint8 per token and
    # layer, on top of MLA's (kv_lora_rank + qk_rope_head_dim) x 2 B; the fp8_ds_mla layout adds the same.
    from kvwatch.capacity.kv import FP8_DS_MLA_BYTES, kv_bytes_per_token_per_layer

    v3 = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168,
          "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280}
    v32 = {**v3, "model_type": "deepseek_v32", "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}
    assert kv_bytes_per_token_per_layer(arch_from_config(v3), 8, 2) == 576 * 2
    assert kv_bytes_per_token_per_layer(arch_from_config(v32), 8, 2) == 576 * 2 + 132
    assert kv_bytes_per_token_per_layer(arch_from_config(v32), 8, 1, "fp8_ds_mla") == FP8_DS_MLA_BYTES + 132


def test_a_model_name_the_file_system_refuses_is_no_folder():
    # serve matches vLLM's model_name label; a 300-byte one made the folder probe raise ENAMETOOLONG on every poll.
    with pytest.raises(PresetError):
        match_model("/" + "m" * 300)


def test_kimi_linear_is_mla():
    config = {"model_type": "kimi_linear", "num_hidden_layers": 4, "num_attention_heads": 32, "hidden_size": 2304,
              "kv_lora_rank": 512, "qk_rope_head_dim": 64, "vocab_size": 1000}
    assert arch_from_config(config).is_mla  # in vLLM's is_deepseek_mla list


@pytest.mark.parametrize(("change", "complaint"), [
    ({"hidden_size": 16}, "head size of 0"),  # hidden / heads rounds to 0: a ZeroDivisionError in plan
    ({"head_dim": -1}, "head_dim = -1: it cannot be negative"),  # printed -4,096 bytes per token
    ({"num_hidden_layers": 1e9}, "num_hidden_layers = 1000000000.0"),  # never returned
    ({"num_attention_heads": 0}, "num_attention_heads = 0"),
])
def test_a_broken_config_is_refused_naming_the_field(tmp_path, capsys, change, complaint):
    config = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "vocab_size": 128256, "max_position_embeddings": 8192, **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["plan", "--model-config", str(path), "--gpu", "H100"]) == 2
    assert complaint in capsys.readouterr().err


def test_a_window_without_layer_types_slides_every_layer_unless_switched_off():
    # vLLM sets CacheConfig.sliding_window when config.json has a window and no layer_types, and every layer takes
    # it: Phi-3-mini-4k's 2047 (kvwatch held every layer as full attention: 42.71 requests instead of 42.55, and
    # 42.77 instead of 56.74 at --max-num-batched-tokens 512). Qwen2's window is off without use_sliding_window.
    phi3 = {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "num_key_value_heads": 32,
            "num_hidden_layers": 32, "vocab_size": 32064, "max_position_embeddings": 4096, "sliding_window": 2047}
    assert set(arch_from_config(phi3).layer_types) == {SLIDING}
    qwen2 = {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
             "num_hidden_layers": 28, "vocab_size": 152064, "max_position_embeddings": 32768,
             "sliding_window": 4096, "use_sliding_window": False}
    assert set(arch_from_config(qwen2).layer_types) == {FULL}
    assert set(arch_from_config({**phi3, "use_sliding_window": False}).layer_types) == {FULL}
    # The preset carries the same window, so --model plans what --model-config does.
    assert set(resolve_model("microsoft/Phi-3-mini-4k-instruct").layer_types) == {SLIDING}


def test_an_architecture_vllm_dropped_is_flagged_on_later_releases():
    # vLLM 0.30's _PREVIOUSLY_SUPPORTED_MODELS (vllm/model_executor/models/registry.py): MiniMax-Text-01 was served
    # until 0.23.0; after it vLLM has no model class for it and starts only if its Transformers backend serves the
    # model. kvwatch printed a full plan for 0.30 with no word of it.
    from kvwatch.capacity import planner
    from kvwatch.capacity.memory import GIB

    def warnings(architectures: list[str], version: tuple[int, int]) -> list[str]:
        config = {**BASE, "architectures": architectures, "model_type": "minimax_text_01", "num_hidden_layers": 16,
                  "attn_type_list": ([0] * 7 + [1]) * 2}
        spec = planner.DeploymentSpec(arch=arch_from_config(config), gpu_memory_bytes=80 * GIB, max_model_len=8192,
                                      vllm_version=version, available_kv_bytes=20 * GIB)
        plan = planner.plan_capacity(spec)
        assert not any("supported until" in e for e in plan.errors)
        return [w for w in plan.warnings if "supported until" in w]

    [warning] = warnings(["MiniMaxText01ForCausalLM"], (0, 30))
    assert "no model class for MiniMaxText01ForCausalLM" in warning and "--vllm-version 0.23" in warning
    assert warnings(["MiniMaxText01ForCausalLM"], (0, 23)) == []
    # vLLM tries each listed architecture: one it still serves is enough.
    assert warnings(["MiniMaxText01ForCausalLM", "LlamaForCausalLM"], (0, 30)) == []
    # The table says Motif until 0.10.2, but vLLM 0.11 still registers it.
    assert warnings(["MotifForCausalLM"], (0, 11)) == [] and warnings(["MotifForCausalLM"], (0, 14))


def test_a_hybrid_family_whose_layer_types_name_no_mamba_layer_is_plain_attention():
    # Granite-4.0-micro (granitemoehybrid, every layer "attention"): vLLM's ModelConfig.is_hybrid says it is not
    # hybrid. The figures were right, but the note said the layout was not recognised ("no layer_types") and that
    # counting every layer "overstates the KV per token".
    config = {**BASE, "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
              "layer_types": ["attention"] * 4}
    arch = arch_from_config(config)
    assert not arch.is_hybrid_mamba and len(arch.attention_layer_types) == 4
    assert not any("hybrid" in n or "not recognised" in n for n in arch.notes
                   if not n.startswith("the model's maximum length"))


def test_a_multimodal_model_says_its_encoder_profile_is_not_in_the_estimate():
    # vLLM's profile run also runs the vision encoder and keeps its outputs: Qwen2.5-VL-7B on an H100 logged
    # 905,648 KV tokens where kvwatch's estimate from its config.json gives 1,022,992 (13 % high), with no note.
    vl = {**BASE, "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
          "vision_config": {"depth": 32, "hidden_size": 1280}}
    [note] = [n for n in arch_from_config(vl).notes if n.startswith("multimodal model (vision_config)")]
    assert "--available-kv-gib" in note and "weights are not in the weights" in note
    assert not any("multimodal" in n for n in arch_from_config({**BASE, "model_type": "qwen2"}).notes)


def test_nemotron_nas_block_configs_set_the_kv_heads_the_attention_layers_and_the_mlp_widths():
    # Llama-3.3-Nemotron-Super-49B's shape (DeciLM, model_type nemotron-nas), written from vLLM 0.32's
    # nemotron_nas.py and NemotronNasModelArchConfigConvertor, not from a published config: a block whose attention
    # is a no-op has no attention layer (and no KV), the KV heads are heads // n_heads_in_group of the first block
    # with attention, and each MLP is int(2 * ffn_mult * hidden / 3) rounded up to 256. kvwatch read it as 80
    # layers of 64-head attention: 11.6x the KV bytes per token.
    from kvwatch.capacity import kv

    def block(no_op_attention: bool, ffn_mult: float | None) -> dict:
        return {"attention": {"n_heads_in_group": None if no_op_attention else 8, "no_op": no_op_attention},
                "ffn": {"ffn_mult": ffn_mult, "no_op": ffn_mult is None}}

    blocks = [block(i % 16 in (3, 7, 11, 14, 15), None if i % 20 == 19 else 5.25) for i in range(80)]
    arch = arch_from_config({"model_type": "nemotron-nas", "architectures": ["DeciLMForCausalLM"],
                             "hidden_size": 8192, "num_attention_heads": 64, "num_hidden_layers": 80,
                             "vocab_size": 128256, "block_configs": blocks})
    assert arch.num_kv_heads == 8 and len(arch.kv_cache_layer_types) == 55
    assert kv.kv_bytes_per_token_per_layer(arch, 2, 2) * len(arch.kv_cache_layer_types) == 112_640
    assert arch.intermediate_size == 28_672 * 76 // 80  # the mean: 4 blocks have no MLP


def test_rnj1_chunked_attention_layers_slide_and_its_other_layers_are_global():
    # Rnj-1 ships a gemma3_text config; vLLM's rnj1.py gives each chunked_attention layer a sliding window of
    # sliding_window tokens and every other layer none. kvwatch read chunked_attention as global: 10.00 requests of
    # 32k where vLLM's sums give 13.47 (vLLM 0.32's source).
    from kvwatch.capacity import planner
    from kvwatch.capacity.memory import GIB

    types = (["chunked_attention"] * 5 + ["full_attention"]) * 5 + ["chunked_attention"] * 2
    config = {"architectures": ["Rnj1ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 32,
              "vocab_size": 128256, "sliding_window": 4096, "layer_types": types}
    arch = arch_from_config(config)
    assert arch.layer_types.count(SLIDING) == 27 and arch.layer_types.count(FULL) == 5
    spec = planner.DeploymentSpec(arch=arch, gpu_memory_bytes=80 * GIB, max_model_len=32768,
                                  available_kv_bytes=40 * GIB)
    assert round(planner.plan_capacity(spec).max_concurrency_at_max_model_len, 2) == 13.47
    assert arch_from_config({**config, "architectures": ["Gemma3ForCausalLM"]}).layer_types.count(SLIDING) == 0


def test_hy_v4_is_mla_and_an_unmodelled_kv_layout_is_said_plainly():
    # HunYuan V4 is MLA with a sparse indexer (vLLM's is_deepseek_mla lists hy_v4): kvwatch cached per-head K and V
    # of 256 dims, 14x the bytes. DeepSeek-V4's compressed cache and IQuest's loops are not modelled: a warning.
    from kvwatch.capacity import planner
    from kvwatch.capacity.memory import GIB

    hy = {**BASE, "model_type": "hy_v4", "architectures": ["HYV4ForCausalLM"], "kv_lora_rank": 512,
          "qk_rope_head_dim": 64, "qk_nope_head_dim": 192, "num_key_value_heads": 8, "head_dim": 256}
    assert arch_from_config(hy).is_mla

    def warnings(architectures: list[str]) -> list[str]:
        spec = planner.DeploymentSpec(arch=arch_from_config({**BASE, "architectures": architectures}),
                                      gpu_memory_bytes=80 * GIB, max_model_len=8192, available_kv_bytes=20 * GIB)
        return [w for w in planner.plan_capacity(spec).warnings if "does not model" in w]

    [loops] = warnings(["IQuestLoopCoderForCausalLM"])
    assert "one attention layer per loop" in loops and "--available-kv-gib" in loops
    assert warnings(["DeepseekV4ForCausalLM"]) and warnings(["LlamaForCausalLM"]) == []
    # MiniMax-M3's index-key side cache: read as plain attention without a word before
    [index] = warnings(["MiniMaxM3ForCausalLM"])
    assert "index-key side cache" in index
    # Phi-4-mini-flash (SambaY, served until 0.10.2): its layout was read as 32 windowed layers, 3.6x vLLM's bytes
    [sambay] = warnings(["Phi4FlashForCausalLM"])
    assert "kv_sharing_target_layer_name" in sambay
