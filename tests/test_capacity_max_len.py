"""max-model-len validation as vLLM's ``_get_and_verify_max_len`` does it, on real config.json values.

Config excerpts are the published Hugging Face config.json fields of each model (source named per case);
the expected lengths are what vLLM accepts for them (the model cards' context lengths).
"""

from __future__ import annotations

import json

import pytest

from kvwatch.capacity.architecture import arch_from_config
from kvwatch.capacity.max_len import derived_max_model_len
from kvwatch.cli import main

pytestmark = pytest.mark.usefixtures("no_kvwatch_env")


@pytest.mark.parametrize(("config", "expected", "how"), [
    # meta-llama/Llama-3.1-8B-Instruct config.json: llama3 RoPE, max_position_embeddings already extended
    ({"model_type": "llama", "max_position_embeddings": 131072,
      "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}}, 131072, "max_position"),
    # Qwen/Qwen2.5-7B-Instruct with the YaRN block its model card says to add for 128K ("type": "yarn"): vLLM
    # >= 0.30 reads max_position_embeddings as the scaled length already (0.29: original x factor, below)
    ({"model_type": "qwen2", "max_position_embeddings": 32768,
      "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}, 32768,
     "max_position"),
    # a rope factor of null: vLLM falls back to 1.0 (kvwatch refused the config)
    ({"model_type": "llama", "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": None}},
     4096, "max_position"),
    # microsoft/Phi-3-mini-128k-instruct: longrope, max_position_embeddings 131072 (original 4096)
    ({"model_type": "phi3", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
      "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}}, 131072, "max_position"),
    # google/gemma-3-27b-it text_config: linear factor 8 is already in max_position_embeddings (vLLM skips gemma3)
    ({"model_type": "gemma3_text", "max_position_embeddings": 131072,
      "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}, 131072, "max_position"),
    # a dynamic-NTK config: max_position_embeddings × factor
    ({"model_type": "llama", "max_position_embeddings": 4096,
      "rope_scaling": {"type": "dynamic", "factor": 2.0}}, 8192, "dynamic"),
    # mosaicml/mpt-7b: max_seq_len; THUDM/chatglm2-6b: seq_length 32768
    ({"model_type": "mpt", "max_seq_len": 2048}, 2048, "max_seq_len"),
    ({"model_type": "chatglm", "seq_length": 32768}, 32768, "seq_length"),
    # the smallest of several fields wins; no field at all: the config class's default, which vLLM reads off the
    # transformers config (Qwen2Config 32,768, MistralConfig 131,072, GemmaConfig 8,192; a partial Paligemma or
    # Llava text_config was planned at 2,048 and refused at 8,192), unknown for a class kvwatch does not know
    ({"max_position_embeddings": 8192, "n_positions": 4096}, 4096, "n_positions"),
    ({"model_type": "qwen2"}, 32768, "the default of qwen2's config class"),
    ({"model_type": "mistral"}, 131072, "config.json leaves it out"),
    ({"model_type": "gemma"}, 8192, "max_position_embeddings=8192"),
    ({"model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 2.0}}, 4096, "factor 2"),
    ({"model_type": "x"}, None, "does not know the default of transformers' config class for model_type 'x'"),
])
def test_derived_max_model_len_follows_vllm(config, expected, how):
    length, text = derived_max_model_len(config, config.get("model_type", ""))
    assert length == expected
    assert how in text


def test_the_max_len_rules_follow_the_vllm_version(capsys):
    # Read off vLLM's wheels (_get_and_verify_max_len): YaRN scaled original x factor up to 0.29 and no more from
    # 0.30; LongRoPE's default length is original_max_position_embeddings from 0.12 (Phi-3-mini-128k on an H100:
    # about 42 requests of 4,096 tokens, where kvwatch said 1.33 of 131,072, and "will not start" on an L4).
    yarn = {"model_type": "qwen2", "max_position_embeddings": 32768,
            "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}
    assert derived_max_model_len(yarn, "qwen2", version=(0, 29))[0] == 131072
    assert derived_max_model_len(yarn, "qwen2", version=(0, 30))[0] == 32768
    phi3 = {"model_type": "phi3", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]},
            "hidden_size": 3072, "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
            "vocab_size": 32064}
    arch = arch_from_config(phi3)
    assert (arch.default_len((0, 11)), arch.default_len((0, 12)), arch.derived_len((0, 12))[0]) == (
        131072, 4096, 131072)
    qwen = arch_from_config({**yarn, "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
                             "num_hidden_layers": 28, "vocab_size": 152064})
    assert (qwen.default_len((0, 29)), qwen.default_len((0, 33))) == (131072, 32768)


def test_qwen25_1m_preset_takes_its_million_tokens():
    # Qwen/Qwen2.5-7B-Instruct-1M config.json: max_position_embeddings 1010000, no rope_scaling
    arch = arch_from_config({"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                             "hidden_size": 3584, "max_position_embeddings": 1010000, "model_type": "qwen2"})
    assert arch.derived_max_model_len == 1010000


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


LLAMA_1M = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--tensor-parallel-size", "8",
            "--max-model-len", "1000000", "--json"]


def test_plan_refuses_a_max_model_len_past_the_model(capsys):
    code, out, _ = run(LLAMA_1M, capsys)
    data = json.loads(out)
    assert code == 1
    assert data["will_start"] is False
    assert data["model_max_len"] == 131072
    assert any("131072" in e and "--max-model-len 1000000" in e for e in data["errors"])


def test_allow_long_max_model_len_turns_the_refusal_into_a_warning(capsys):
    code, out, _ = run([*LLAMA_1M, "--allow-long-max-model-len"], capsys)
    data = json.loads(out)
    assert code == 0 and data["will_start"] is True
    assert any("VLLM_ALLOW_LONG_MAX_MODEL_LEN" in w and "131072" in w for w in data["warnings"])


def test_default_max_model_len_is_the_derived_one(capsys):
    code, out, _ = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--json"], capsys)
    assert code == 0 and json.loads(out)["max_model_len"] == 131072


def test_chunked_prefill_off_with_a_small_step_is_refused(capsys):
    base = ["plan", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "H100", "--max-model-len", "32768",
            "--max-num-batched-tokens", "8192", "--json"]
    code, out, _ = run([*base, "--no-enable-chunked-prefill"], capsys)
    data = json.loads(out)
    assert code == 1 and not data["will_start"]
    assert any("max_num_batched_tokens (8192) is smaller than max_model_len (32768)" in e for e in data["errors"])
    code, out, _ = run(base, capsys)  # chunked prefill on (vLLM V1's default): fine
    assert code == 0 and json.loads(out)["errors"] == []


@pytest.mark.parametrize(("model", "gpu"), [
    ("microsoft/Phi-3-mini-128k-instruct", "L4"), ("microsoft/Phi-3.5-mini-instruct", "L4"),
    ("microsoft/Phi-4-mini-instruct", "L4"), ("microsoft/Phi-3-medium-128k-instruct", "H100")])
def test_the_longrope_presets_start_at_their_original_length_like_their_configs(model, gpu, capsys):
    # The presets carry their config.json's LongRoPE fields, so --model plans what --model-config would: an L4 was
    # told "will not start" at 131,072 tokens where vLLM >= 0.12 runs at 4,096 (and says why).
    code, out, _ = run(["plan", "--model", model, "--gpu", gpu, "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["max_model_len"] == 4096 and data["model_max_len"] == 131072
    assert any("LongRoPE" in n and "--max-model-len 131072" in n for n in data["notes"])
    code, out, _ = run(["plan", "--model", model, "--gpu", "H100", "--vllm-version", "0.11", "--json"], capsys)
    data = json.loads(out)
    assert data["max_model_len"] == 131072 and not any("LongRoPE" in n for n in data["notes"])


def test_a_step_smaller_than_max_num_seqs_is_refused_like_vllm(capsys):
    # vLLM's SchedulerConfig refuses max_num_batched_tokens < max_num_seqs ("must be greater than or equal to")
    base = ["plan", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "H100", "--max-model-len", "8192", "--json"]
    code, out, _ = run([*base, "--max-num-batched-tokens", "128", "--max-num-seqs", "256"], capsys)
    data = json.loads(out)
    assert code == 1 and not data["will_start"]
    assert any("max_num_batched_tokens (128) must be greater than or equal to max_num_seqs (256)" in e
               for e in data["errors"])
    code, out, _ = run([*base, "--max-num-batched-tokens", "256", "--max-num-seqs", "256"], capsys)
    assert code == 0 and json.loads(out)["errors"] == []


def test_a_small_step_without_max_num_seqs_lowers_vllms_default_rather_than_refusing(capsys):
    # vLLM's EngineArgs._set_default_args: max_num_seqs defaults to min(the card's default, max_num_batched_tokens).
    # A step of 512 was refused against the H100's 1,024 ("vLLM will not start"), and the inverse planner found none.
    base = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--max-model-len", "8192"]
    code, out, _ = run([*base, "--max-num-batched-tokens", "512", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["will_start"] and data["errors"] == [] and data["max_num_seqs"] == 512
    code, out, _ = run([*base, "--max-num-batched-tokens", "512", "--target-concurrency", "20",
                        "--avg-seq-len", "4096", "--json"], capsys)
    assert code == 0 and json.loads(out)["options"]
    # The card's default above a larger step stays; one given is still checked.
    code, out, _ = run([*base, "--max-num-batched-tokens", "4096", "--json"], capsys)
    assert json.loads(out)["max_num_seqs"] == 1024
    code, out, _ = run([*base, "--max-num-batched-tokens", "512", "--max-num-seqs", "1024", "--json"], capsys)
    assert code == 1 and not json.loads(out)["will_start"]
