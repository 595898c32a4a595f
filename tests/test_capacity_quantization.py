"""Weight quantization read from a checkpoint's quantization_config, and --quantization method names."""

from __future__ import annotations

import json

import pytest

from kvwatch.capacity import resolve_model
from kvwatch.capacity.memory import estimate_weights_bytes, resolve_quantization
from kvwatch.capacity.quantization import QuantizationError, scheme_from_config
from kvwatch.cli import main

GIB = 1 << 30
LLAMA_8B = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False,
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
FP8_DYNAMIC = {  # the shape of a RedHatAI ...-FP8-dynamic checkpoint's quantization_config
    "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}}
W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                       "weights": {"num_bits": 4, "type": "int", "group_size": 128,
                                                   "strategy": "group", "symmetric": True}}}}
W8A8_INT = {"quant_method": "compressed-tensors", "format": "int-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
                                          "input_activations": {"num_bits": 8, "type": "int", "dynamic": True}}}}
NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"],
                                       "weights": {"num_bits": 4, "type": "float", "group_size": 16,
                                                   "strategy": "tensor_group"}}}}


pytestmark = pytest.mark.usefixtures("no_kvwatch_env")


def config_file(tmp_path, quantization_config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_8B, "quantization_config": quantization_config}))
    return path


def plan_json(argv, capsys):
    code = main(["plan", *argv, "--json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out else None), out.err


@pytest.mark.parametrize(("qc", "scheme"), [
    (FP8_DYNAMIC, "fp8"), (W4A16, "w4a16"), (W8A8_INT, "w8a8"), (NVFP4, "nvfp4"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "w8a16"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "w4a16"),
    ({"quant_method": "awq", "bits": 4, "version": "gemm"}, "w4a16"),
    ({"quant_method": "awq", "w_bit": 4}, "w4a16"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}, "nvfp4"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "fp8"),
])
def test_scheme_read_from_the_config(qc, scheme):
    assert scheme_from_config(qc)[0] == scheme


def test_compressed_tensors_config_plans_instead_of_blaming_a_flag_never_passed(tmp_path, capsys):
    path = config_file(tmp_path, FP8_DYNAMIC)
    code, data, err = plan_json(["--model-config", str(path), "--gpu", "H100"], capsys)
    assert code == 0, err
    assert data["weights_bytes"] / GIB == pytest.approx(8.49, abs=0.1)  # vLLM logged 8.49 GiB for Llama-8B FP8
    # vLLM's own method name defers to the scheme in the checkpoint
    code, same, err = plan_json(["--model-config", str(path), "--gpu", "H100", "--quantization",
                                 "compressed-tensors"], capsys)
    assert code == 0, err
    assert same["weights_bytes"] == data["weights_bytes"]


def test_w4a16_and_nvfp4_checkpoints_are_priced_by_their_bits(tmp_path):
    arch = resolve_model(str(config_file(tmp_path, W4A16)))
    assert estimate_weights_bytes(arch, 2, None, 1, 1) / GIB == pytest.approx(5.38, abs=0.15)  # vLLM: 5.38 GiB
    nv = resolve_model(str(config_file(tmp_path, NVFP4)))
    fp8 = resolve_model(str(config_file(tmp_path, FP8_DYNAMIC)))
    # nvfp4: 4 bits + an fp8 scale per 16 weights, a little above w4a16 and well below fp8
    w4, w_nv, w8 = (estimate_weights_bytes(a, 2, None, 1, 1) for a in (arch, nv, fp8))
    assert w4 < w_nv < 0.75 * w8


def test_gptq_8bit_is_not_priced_as_4bit(tmp_path):
    arch8 = resolve_model(str(config_file(tmp_path, {"quant_method": "gptq", "bits": 8, "group_size": 128})))
    w8 = estimate_weights_bytes(arch8, 2, None, 1, 1)
    assert w8 / GIB == pytest.approx(8.49, abs=0.1)  # 1 byte per linear weight, like FP8
    # --quantization gptq (vLLM's loader name) keeps the checkpoint's 8 bits
    assert estimate_weights_bytes(arch8, 2, "gptq", 1, 1) == w8
    assert estimate_weights_bytes(arch8, 2, "gptq_marlin", 1, 1) == w8


def test_modelopt_fp8_and_nvfp4_differ(tmp_path):
    fp8 = resolve_model(str(config_file(tmp_path, {"quant_method": "modelopt", "quant_algo": "FP8"})))
    fp4 = resolve_model(str(config_file(tmp_path, {"quant_method": "modelopt", "quant_algo": "NVFP4"})))
    assert resolve_quantization(None, fp8).scheme == "fp8"
    assert resolve_quantization(None, fp4).scheme == "nvfp4"
    assert estimate_weights_bytes(fp4, 2, None, 1, 1) < 0.7 * estimate_weights_bytes(fp8, 2, None, 1, 1)


@pytest.mark.parametrize(("qc", "field"), [
    ({"quant_method": "hqq", "nbits": 4}, "quantization_config.quant_method"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized"}, "quantization_config.config_groups"),
    ({"quant_method": "modelopt", "quant_algo": "W1A1"}, "quantization_config.quant_algo"),
])
def test_unpriceable_checkpoint_blames_the_config_field_not_quantization(tmp_path, capsys, qc, field):
    code, _, err = plan_json(["--model-config", str(config_file(tmp_path, qc)), "--gpu", "H100"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and "--model-config" in err and field in err
    assert "invalid value for --quantization" not in err


def test_method_name_without_a_checkpoint_scheme_says_what_is_missing(capsys):
    code, _, err = plan_json(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--quantization",
                              "compressed-tensors"], capsys)
    assert code == 2
    assert "invalid value for --quantization" in err and "config_groups" in err


def test_a_preset_alias_implies_the_scheme_and_the_method_name_defers_to_it(capsys):
    base = ["--model", "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16", "--gpu", "H100"]
    code, implied, _ = plan_json(base, capsys)
    assert code == 0
    code, ct, _ = plan_json([*base, "--quantization", "compressed-tensors"], capsys)
    assert code == 0 and ct["weights_bytes"] == implied["weights_bytes"]
    assert implied["weights_bytes"] / GIB == pytest.approx(5.38, abs=0.15)


def test_user_scheme_wins_and_unknown_user_value_names_quantization():
    arch = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    assert resolve_quantization("fp8", arch).scheme == "fp8"
    with pytest.raises(QuantizationError) as exc:
        resolve_quantization("int3", arch)
    assert exc.value.flag == "--quantization"


@pytest.mark.parametrize(("qc", "since"), [
    # llm-compressor's FP8 KV cache (RedHatAI ...-FP8-KV checkpoints): the attention layer takes it from 0.15
    ({**FP8_DYNAMIC, "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                         "symmetric": True}}, "0.15"),
    # ModelOpt (nvidia/...-FP8): resolve_kv_cache_dtype_string maps kv_cache_quant_algo at argument time from 0.14
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}, "0.14"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}, "0.14"),
])
def test_a_checkpoints_fp8_kv_cache_is_what_auto_runs(tmp_path, capsys, qc, since):
    # Read off vLLM's wheels: with --kv-cache-dtype auto vLLM stores the KV cache the checkpoint declares; kvwatch
    # planned it in bf16, half the tokens (Llama-3.1-8B on an H100 at 8k: 503,120 instead of 1,006,256), and its
    # fp8_kv_cache what-if promised a doubling the deployment already had.
    path = config_file(tmp_path, qc)
    base = ["--model-config", str(path), "--gpu", "H100", "--max-model-len", "8192"]
    code, data, err = plan_json([*base, "--vllm-version", since], capsys)
    assert code == 0, err
    assert data["kv_bytes_per_token"] == 65536 and any("KV cache fp8" in n for n in data["notes"])
    before = ".".join(map(str, (0, int(since.split(".")[1]) - 1)))
    code, old, err = plan_json([*base, "--vllm-version", before], capsys)
    assert old["kv_bytes_per_token"] == 131072
    # A dtype given wins over the checkpoint's (0.30+; 0.15-0.2x forced llm-compressor's FP8 even then: not modelled)
    code, explicit, err = plan_json([*base, "--vllm-version", "0.33", "--kv-cache-dtype", "bfloat16"], capsys)
    assert explicit["kv_bytes_per_token"] == 131072


def test_a_scheme_the_gpu_cannot_run_will_not_start(tmp_path, capsys):
    # vLLM checks QuantizationConfig.get_min_capability() at start: FP8 needs 7.5, MXFP4 8.0; a V100 is 7.0. kvwatch
    # planned gpt-oss on a V100 and offered FP8 weights there as a fix.
    path = config_file(tmp_path, {"quant_method": "fp8"})
    code, data, _ = plan_json(["--model-config", str(path), "--gpu", "V100-32GB", "--max-model-len", "4096"],
                                capsys)
    assert code == 1 and any("compute capability 7.5 or more (V100-32GB has 7.0)" in e for e in data["errors"])
    code, fine, _ = plan_json(["--model-config", str(path), "--gpu", "A100-80GB", "--max-model-len", "4096"],
                                capsys)
    assert code == 0 and not fine["errors"]
    bf16 = config_file(tmp_path, {})
    _, v100, _ = plan_json(["--model-config", str(bf16), "--gpu", "V100-32GB", "--max-model-len", "4096"],
                                capsys)
    fp8_weights = {s["name"]: s for s in v100["scenarios"]}["fp8_weights"]
    assert "will not start" in fp8_weights["note"]
    # An explicit --dtype bfloat16 needs 8.0 (vLLM's check_if_supports_dtype; auto picks float16 there): planned
    # as if it started
    assert v100["errors"] == []
    code, explicit, _ = plan_json(["--model-config", str(bf16), "--gpu", "V100-32GB", "--max-model-len", "4096",
                                   "--dtype", "bfloat16"], capsys)
    assert code == 1 and any("--dtype bfloat16 needs a GPU of compute capability 8.0 or more (V100-32GB has 7.0); "
                             "pass --dtype half" in e for e in explicit["errors"])
    code, _, _ = plan_json(["--model-config", str(bf16), "--gpu", "A100-80GB", "--max-model-len", "4096",
                            "--dtype", "bfloat16"], capsys)
    assert code == 0


def test_modelopts_hf_quant_config_beside_the_config_and_the_older_compression_config_are_read(tmp_path, capsys):
    # vLLM reads ModelOpt <= 0.29's hf_quant_config.json (no quant_method: a "producer") from the model folder, and
    # compressed-tensors' older "compression_config" key; kvwatch priced both as bf16 (14.96 GiB, 449,872 tokens).
    folder = tmp_path / "Llama-3.1-8B-Instruct-FP8"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    (folder / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.19.0"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}}))
    base = ["--gpu", "H100", "--max-model-len", "8192"]
    code, legacy, err = plan_json(["--model-config", str(folder), *base], capsys)
    assert code == 0, err
    assert legacy["weights_bytes"] / GIB == pytest.approx(8.46, abs=0.1) and legacy["kv_bytes_per_token"] == 65536
    older = tmp_path / "config.json"
    older.write_text(json.dumps({**LLAMA_8B, "compression_config": {
        **FP8_DYNAMIC, "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}))
    code, compressed, err = plan_json(["--model-config", str(older), *base], capsys)
    assert code == 0, err
    assert compressed["weights_bytes"] == pytest.approx(legacy["weights_bytes"], rel=0.01)
    assert compressed["kv_bytes_per_token"] == 65536


def test_the_capability_vllm_needs_follows_the_method_and_the_release(tmp_path, capsys):
    # Read off the wheels: ModelOpt FP8 needs 8.9 up to 0.26 and 8.0 from 0.28; vLLM's fp8 method 8.0 in 0.11 and
    # 7.5 from 0.14; llm-compressor's FP8 starts on 7.0 (a V100). A measured plan of a scheme kvwatch cannot price
    # is no refusal (the check read the priced scheme, and refused the plan).
    modelopt = config_file(tmp_path, {"quant_method": "modelopt", "quant_algo": "FP8"})
    base = ["--model-config", str(modelopt), "--max-model-len", "4096"]
    _, old, _ = plan_json([*base, "--gpu", "A100-80GB", "--vllm-version", "0.20"], capsys)
    _, new, _ = plan_json([*base, "--gpu", "A100-80GB", "--vllm-version", "0.33"], capsys)
    assert any("compute capability 8.9" in e for e in old["errors"]) and not new["errors"]
    compressed = config_file(tmp_path, FP8_DYNAMIC)
    _, v100, _ = plan_json(["--model-config", str(compressed), "--gpu", "V100-32GB", "--max-model-len", "4096"],
                           capsys)
    assert not v100["errors"]
    hqq = config_file(tmp_path, {"quant_method": "hqq", "nbits": 4})
    code, _, err = plan_json(["--model-config", str(hqq), "--available-kv-gib", "20", "--max-model-len",
                                     "4096"], capsys)
    assert code == 0, err


def test_a_quantization_config_in_the_text_config_prices_the_weights(tmp_path):
    # Multimodal checkpoints may carry it under text_config (Kimi-K3's compressed-tensors config); vLLM looks there
    # when the top level has none (model_arch_config_convertor.py, get_quantization_config): priced as bf16 before.
    top = resolve_model(str(config_file(tmp_path, FP8_DYNAMIC)))
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
                                  "text_config": {**LLAMA_8B, "quantization_config": FP8_DYNAMIC}}))
    arch = resolve_model(str(nested))
    assert estimate_weights_bytes(arch, 2, None, 1, 1) == pytest.approx(estimate_weights_bytes(top, 2, None, 1, 1),
                                                                        rel=0.05)
    assert estimate_weights_bytes(arch, 2, None, 1, 1) < 0.6 * estimate_weights_bytes(
        resolve_model(str(config_file(tmp_path, {}))), 2, None, 1, 1)


BLOCK_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
# Qwen3-30B-A3B-FP8's shape (config.json): 128 experts of width 768
QWEN3_MOE_FP8 = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                 "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "max_position_embeddings": 40960, "vocab_size": 151936, "torch_dtype": "bfloat16",
                 "quantization_config": BLOCK_FP8}


def test_block_fp8_weights_split_into_partial_blocks_do_not_load(tmp_path, capsys):
    # vLLM's fp8.py: "The output_size of gate's and up's weight = 192 is not divisible by weight quantization
    # block_n = 128". A dense MLP split so is refused; experts load with --enable-expert-parallel, which the plan
    # names (the inverse planner ranked TP=4 of Qwen3-30B-A3B-FP8 first, a deployment that crashed at load).
    dense = tmp_path / "dense.json"  # Qwen3-4B-FP8's MLP: 9728 wide, 76 blocks, 9.5 a GPU at TP=8
    dense.write_text(json.dumps({**LLAMA_8B, "intermediate_size": 9728, "quantization_config": BLOCK_FP8}))
    code, _, err = plan_json(["--model-config", str(dense), "--gpu", "H100", "--tensor-parallel-size", "8"], capsys)
    assert code == 2 and "1216 of the MLP's intermediate width 9728" in err and "weight_block_size" in err
    assert plan_json(["--model-config", str(dense), "--gpu", "H100", "--tensor-parallel-size", "4"], capsys)[0] == 0
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps(QWEN3_MOE_FP8))
    code, plan, _ = plan_json(["--model-config", str(moe), "--gpu", "H100", "--tensor-parallel-size", "4"], capsys)
    assert code == 0 and plan["will_start"]
    assert any(w.startswith("--enable-expert-parallel needed: at TP=4 each GPU would hold 192")
               for w in plan["warnings"])
    code, plan, _ = plan_json(["--model-config", str(moe), "--gpu", "H100", "--tensor-parallel-size", "2"], capsys)
    assert not any("expert-parallel" in w for w in plan["warnings"])  # 384: three whole blocks a GPU
    (x2,) = [s for s in plan["scenarios"] if s["name"] == "tensor_parallel_x2"]
    assert "with --enable-expert-parallel" in x2["note"]
    code, plan, _ = plan_json(["--model-config", str(moe), "--gpu", "L40S", "--target-concurrency", "200",
                               "--avg-seq-len", "8192", "--max-model-len", "32768"], capsys)
    assert plan["options"]
    for option in plan["options"]:
        tp = next(int(a.split("=")[1]) for a in option["vllm_args"] if a.startswith("--tensor-parallel-size="))
        assert ("--enable-expert-parallel" in option["vllm_args"]) == (tp >= 4), option["vllm_args"]
    # A shared expert is split whatever the experts' parallelism (vLLM issue 42384: DeepSeek-V4-Pro's shared_experts
    # at TP 16 with --enable-expert-parallel): one 512 wide is 64 a GPU at TP=8, refused, not "needs the flag".
    moe.write_text(json.dumps({**QWEN3_MOE_FP8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512}))
    code, _, err = plan_json(["--model-config", str(moe), "--gpu", "H100", "--tensor-parallel-size", "8"], capsys)
    assert code == 2 and "64 of the shared experts' intermediate width 512" in err


def test_gptq_and_awq_weights_split_into_partial_groups_do_not_load(tmp_path, capsys):
    # vLLM's awq.py/gptq.py create_weights: "The input size is not aligned with the quantized weight shape. This can be
    # caused by too large tensor parallel size". Qwen2.5-14B-AWQ's MLP (13824 wide, groups of 128) at TP 8: 1728 a GPU
    # read "will start" with 353 requests.
    qwen14 = {**LLAMA_8B, "model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 13824,
              "num_attention_heads": 40, "num_key_value_heads": 8, "num_hidden_layers": 48, "vocab_size": 152064}
    for qc in ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"},
               {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}):
        path = tmp_path / f"{qc['quant_method']}.json"
        path.write_text(json.dumps({**qwen14, "quantization_config": qc}))
        code, _, err = plan_json(["--model-config", str(path), "--gpu", "H100", "--tensor-parallel-size", "8"], capsys)
        assert code == 2 and "1728 of the MLP's intermediate width 13824" in err and "group_size" in err
        assert plan_json(["--model-config", str(path), "--gpu", "H100", "--tensor-parallel-size", "4"], capsys)[0] == 0
    per_channel = tmp_path / "per_channel.json"  # group_size -1: one scale per output channel, any split loads
    per_channel.write_text(json.dumps({**qwen14, "quantization_config": {"quant_method": "gptq", "bits": 4,
                                                                          "group_size": -1}}))
    code, _, err = plan_json(["--model-config", str(per_channel), "--gpu", "H100", "--tensor-parallel-size", "8"],
                             capsys)
    assert code == 0, err


def test_an_mlp_without_a_gate_is_two_matrices():
    # StarCoder2-15B (c_fc, c_proj) priced with a gate read 21.7 B parameters, and "vLLM will not start" on an L40S
    from kvwatch.capacity.memory import parameter_counts

    starcoder2 = {"model_type": "starcoder2", "architectures": ["Starcoder2ForCausalLM"], "hidden_size": 6144,
                  "intermediate_size": 24576, "num_hidden_layers": 40, "num_attention_heads": 48,
                  "num_key_value_heads": 4, "vocab_size": 49152, "max_position_embeddings": 16384,
                  "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    from kvwatch.capacity.architecture import arch_from_config

    total = sum(parameter_counts(arch_from_config(starcoder2)))
    assert total / 1e9 == pytest.approx(16.0, abs=0.4)  # published: 15.96 B (bigcode/starcoder2-15b)
    # Arcee's AFM (relu²) and Apertus (xIELU): up and down, no gate; priced as gated, Apertus-8B read 10.9 B and
    # "vLLM will not start" on an L4
    apertus = {"architectures": ["ApertusForCausalLM"], "model_type": "apertus", "hidden_size": 4096,
               "intermediate_size": 21504, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "vocab_size": 131072, "tie_word_embeddings": False,
               "max_position_embeddings": 65536, "torch_dtype": "bfloat16"}
    assert sum(parameter_counts(arch_from_config(apertus))) / 1e9 == pytest.approx(8.05, abs=0.2)  # published
    afm = {"architectures": ["ArceeForCausalLM"], "model_type": "arcee", "hidden_size": 2560,
           "intermediate_size": 18432, "num_hidden_layers": 36, "num_attention_heads": 20, "num_key_value_heads": 4,
           "head_dim": 128, "vocab_size": 128004, "tie_word_embeddings": False, "max_position_embeddings": 65536,
           "torch_dtype": "bfloat16"}
    assert sum(parameter_counts(arch_from_config(afm))) / 1e9 == pytest.approx(4.6, abs=0.2)  # AFM-4.5B


def test_minicpm3s_low_rank_attention_is_priced_by_its_projections():
    # MLA's projections with K and V cached per head (vLLM's minicpm3.py): priced as 96-wide q/k/v/o of 40 + 40 heads,
    # MiniCPM3-4B read 5.67 B parameters (3 GiB less KV a GPU); its KV per token was and is per-head K and V of 96
    from kvwatch.capacity.architecture import arch_from_config
    from kvwatch.capacity.memory import parameter_counts

    minicpm3 = {"architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3", "hidden_size": 2560,
                "intermediate_size": 6400, "num_hidden_layers": 62, "num_attention_heads": 40,
                "num_key_value_heads": 40, "q_lora_rank": 768, "kv_lora_rank": 256, "qk_nope_head_dim": 64,
                "qk_rope_head_dim": 32, "vocab_size": 73448, "max_position_embeddings": 32768,
                "torch_dtype": "bfloat16"}
    arch = arch_from_config(minicpm3)
    # q_a 2560x768, q_b 768x40x96, kv_a 2560x(256+32), kv_b 256x40x(64+64), o 40x64x2560
    assert arch.attention_params_per_layer == 2560 * 768 + 768 * 40 * 96 + 2560 * 288 + 256 * 40 * 128 + 2560 * 2560
    assert sum(parameter_counts(arch)) / 1e9 < 4.5 and arch.head_dim == 96


def test_cross_attention_layers_are_named_in_a_note():
    # Llama-3.2-Vision's 8 cross-attention layers were read silently as self-attention layers
    from kvwatch.capacity.architecture import arch_from_config

    text = {"model_type": "mllama_text_model", "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "max_position_embeddings": 131072, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]}
    arch = arch_from_config({"architectures": ["MllamaForConditionalGeneration"], "model_type": "mllama",
                             "text_config": text, "torch_dtype": "bfloat16"})
    assert any(n.startswith("8 of the 40 layers are cross-attention layers") for n in arch.notes)
    plain = {k: v for k, v in text.items() if k != "cross_attention_layers"}
    assert not any("cross-attention" in n for n in arch_from_config({"model_type": "llama", **plain}).notes)


def test_a_quantization_method_the_checkpoint_was_not_made_with_is_refused(tmp_path, capsys):
    # vLLM's ModelConfig._verify_quantization refuses a --quantization of another method than the checkpoint's
    # quant_method; kvwatch priced an AWQ checkpoint as FP8 weights, and gpt-oss (mxfp4) as 20.56 GiB of FP8.
    awq = config_file(tmp_path, {"quant_method": "awq", "bits": 4, "group_size": 128})
    for other in ("fp8", "gptq", "compressed-tensors"):
        code, data, _ = plan_json(["--model-config", str(awq), "--gpu", "L40S", "--quantization", other], capsys)
        assert code == 2 and data["error"]["reason"] == "usage", other
        assert f"--quantization {other}: the checkpoint is quantized with awq" in data["error"]["message"]
    for same in ("awq", "awq_marlin", "w4a16"):  # its own loaders, and kvwatch's scheme names, are taken
        code, _, _ = plan_json(["--model-config", str(awq), "--gpu", "L40S", "--quantization", same], capsys)
        assert code == 0, same
    code, data, _ = plan_json(["--model", "openai/gpt-oss-20b", "--gpu", "H100", "--quantization", "fp8"], capsys)
    assert code == 2 and "quantized with mxfp4" in data["error"]["message"]
