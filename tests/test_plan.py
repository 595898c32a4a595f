"""`kvwatch plan` end to end through the real CLI dispatcher."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kvwatch.cli import main

TUTORIAL = ["plan", "--gpu-memory-gib", "80", "--gpu-memory-utilization", "0.90", "--weights-gib", "42",
            "--activation-gib", "4", "--non-torch-gib", "0", "--kv-bytes-per-token", "0.0008GiB",
            "--avg-seq-len", "4096"]
GIB = 1 << 30


pytestmark = pytest.mark.usefixtures("no_kvwatch_env")


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tutorial_text_walks_through_the_sums(capsys):
    code, out, _ = run(TUTORIAL, capsys)
    assert code == 0
    assert "80.00 GiB × 0.90" in out and "72.00 GiB" in out
    assert "= KV budget" in out and "26.00 GiB" in out
    assert "≈ 7.93 requests" in out
    assert "What-if, cheapest first" in out
    assert out.index("gpu_memory_utilization_0.85") < out.index("fp8_kv_cache") < out.index("tensor_parallel_x2")


def test_tutorial_json(capsys):
    code, out, _ = run([*TUTORIAL, "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["available_kv_bytes"] == pytest.approx(26 * GIB)
    assert data["kv_bytes_per_token"] == pytest.approx(0.0008 * GIB)
    assert 7.8 <= data["max_concurrency"] < 8.0
    for key in ["num_gpu_blocks", "kv_cache_tokens", "max_concurrency_at_max_model_len", "weights_bytes",
                "activation_bytes", "non_torch_bytes"]:
        assert key in data
    assert [s["name"] for s in data["scenarios"]][:2] == ["gpu_memory_utilization_0.85",
                                                          "gpu_memory_utilization_0.95"]
    assert all({"name", "kv_cache_tokens", "max_concurrency"} <= set(s) for s in data["scenarios"])


def test_preset_model_and_gpu_json_matches_vllm_log(capsys):
    code, out, _ = run(["plan", "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "H100", "--gpu-memory-utilization",
                        "0.95", "--max-model-len", "8192", "--weights-gib", "14.25", "--activation-gib", "2.21",
                        "--non-torch-gib", "0.24", "--vllm-version", "0.19.0", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["kv_cache_tokens"] == pytest.approx(1096000, rel=0.001)  # vLLM 0.19 logged 1,096,000
    assert data["max_concurrency"] == pytest.approx(133.79, abs=0.05)
    assert data["estimated"] == []


def test_pipeline_parallel_logged_figures_match_vllm_like_the_calibration(capsys):
    # Row 15 of the calibration data: vLLM 0.19 logged rank 0's figures and reported 1,075,312 tokens.
    code, out, _ = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory-gib", "79.19",
                        "--gpu-memory-utilization", "0.95", "--max-model-len", "8192", "--vllm-version", "0.19.0",
                        "--pipeline-parallel-size", "2", "--weights-gib", "7.51", "--activation-gib", "1.1",
                        "--non-torch-gib", "0.07", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["kv_cache_tokens"] == pytest.approx(1075312, rel=0.01)  # was 1,090,352 (+1.40%) without the term
    assert "pp_last_stage_sampler" in data["estimated"]
    assert data["pp_last_stage_extra_bytes"] == pytest.approx(1024 * 128256 * 7)
    assert any("rank 0" in n for n in data["notes"])


@pytest.mark.parametrize(("version", "expected"), [
    # >= 0.20: int(max_concurrency x max_model_len); 20,001 is not a block multiple, so this is not blocks x 16
    ("0.20", "int(2,332 blocks ÷ 1,251 blocks per 20,001-token request × 20,001) = 37,284 "
             "(2,332 × 16 = 37,312 token slots)"),
    ("0.19", "tokens = 2,332 × 16 = 37,312"),
])
def test_walk_through_prints_the_token_rule_vllm_uses(version, expected, capsys):
    code, out, _ = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--max-model-len",
                        "20001", "--gpu-memory-utilization", "0.92", "--vllm-version", version], capsys)
    assert code == 0
    assert expected in out
    assert "2,332 × 16 = 37,284" not in out  # the old line: wrong arithmetic


def test_decimal_unit_is_read_as_decimal_and_says_so(capsys):
    # The tutorial writes "0.0008 GB": taken literally that is 800,000 B, not the 858,993 B of 0.0008 GiB.
    argv = [arg if arg != "0.0008GiB" else "0.0008GB" for arg in TUTORIAL]
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 0
    assert json.loads(out)["kv_bytes_per_token"] == 800_000
    assert err.count("\n") == 1 and "decimal unit" in err and "858,993 B" in err
    code, _, err = run(TUTORIAL, capsys)
    assert code == 0 and err == ""  # binary units: no note


def test_help_does_not_call_different_byte_counts_equal(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "0.8MiB = 838,861 B" in out and "0.0008GiB = 858,993 B" in out


def test_settings_come_from_environment_too(capsys, monkeypatch):
    monkeypatch.setenv("KVWATCH_MODEL", "google/gemma-2-9b-it")
    monkeypatch.setenv("KVWATCH_GPU", "H100")
    code, out, _ = run(["plan", "--max-model-len", "8192", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["model"] == "google/gemma-2-9b-it" and data["kv_cache_groups"] == 2


def test_a_refused_value_from_a_variable_names_the_variable(capsys, monkeypatch):
    # The planner's own checks name flags; a value the user set as a variable must be traced back to it.
    monkeypatch.setenv("KVWATCH_TENSOR_PARALLEL_SIZE", "3")
    code, _, err = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100"], capsys)
    assert code == 2 and "invalid value 3 for --tensor-parallel-size (from KVWATCH_TENSOR_PARALLEL_SIZE)" in err
    code, _, err = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
                        "--tensor-parallel-size", "3"], capsys)
    assert code == 2 and "KVWATCH_" not in err  # typed on the command line: the flag alone
    monkeypatch.delenv("KVWATCH_TENSOR_PARALLEL_SIZE")
    monkeypatch.setenv("KVWATCH_MODEL", "meta-llama/Llama-3.1-8B-Instruct")
    config = Path(__file__).parent / "fixtures" / "model-configs" / "glm52_dsa_index_share.json"
    code, _, err = run(["plan", "--model-config", str(config), "--gpu", "H100"], capsys)
    assert code == 2 and "--model (from KVWATCH_MODEL) and --model-config are both set" in err
    # an empty KVWATCH_MODEL_CONFIG gave no value ("none"): a message suggesting the flag is not about it
    monkeypatch.delenv("KVWATCH_MODEL")
    monkeypatch.setenv("KVWATCH_MODEL_CONFIG", "")
    code, _, err = run(["plan", "--gpu", "H100"], capsys)
    assert code == 2 and "--model-config" in err and "KVWATCH_MODEL_CONFIG" not in err


def test_model_config_path(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                               "hidden_size": 4096, "vocab_size": 128256, "intermediate_size": 14336,
                               "max_position_embeddings": 8192}))
    code, out, _ = run(["plan", "--model-config", str(cfg), "--gpu", "A100-80GB", "--json"], capsys)
    assert code == 0
    assert json.loads(out)["kv_bytes_per_token"] == 131072


_LLAMA_CONFIG = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
                 "vocab_size": 128256, "intermediate_size": 14336, "max_position_embeddings": 8192}
_DEEPSEEK_V2_LITE = {"model_type": "deepseek_v2", "num_hidden_layers": 27, "num_attention_heads": 16,
                     "hidden_size": 2048, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "vocab_size": 102400}


@pytest.mark.parametrize(("base", "change", "said"), [
    # a ZeroDivisionError traceback
    (_LLAMA_CONFIG, {"max_position_embeddings": -1}, "a length of -1 (max_position_embeddings=-1)"),
    # planned "-27.46 requests" at a length of -4,096, exit 0
    (_LLAMA_CONFIG, {"max_position_embeddings": 2048, "rope_scaling": {"type": "linear", "factor": -2}},
     "a length of -4096"),
    (_LLAMA_CONFIG, {"max_position_embeddings": 0}, "a length of 0"),
    # a traceback, and negative KV bytes per token
    (_DEEPSEEK_V2_LITE, {"kv_lora_rank": 0, "qk_rope_head_dim": 0}, "kv_lora_rank = 0"),
    (_DEEPSEEK_V2_LITE, {"kv_lora_rank": -512}, "kv_lora_rank = -512"),
    # every layer read as sliding (a block more per request)
    (_LLAMA_CONFIG, {"sliding_window": -1}, "sliding_window = -1: it cannot be negative"),
    (_LLAMA_CONFIG, {"vocab_size": -5}, "vocab_size = -5: it cannot be negative"),
])
def test_a_broken_length_window_or_latent_in_config_json_is_refused_by_name(tmp_path, capsys, base, change, said):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({k: v for k, v in {**base, **change}.items() if v is not None}))
    code, _, err = run(["plan", "--model-config", str(cfg), "--gpu", "H100", "--max-model-len", "1024"], capsys)
    assert code == 2 and said in err, err
    assert "Traceback" not in err


def test_will_not_start_exits_1_with_shortfall(capsys):
    code, out, _ = run(["plan", "--model", "Qwen/Qwen3-32B", "--gpu", "L4"], capsys)
    assert code == 1
    assert "will not start" in out and "short by" in out
    # the what-if table's (now) row says so too, as a scenario's row that will not start does
    (now,) = [line for line in out.splitlines() if line.strip().startswith("(now)")]
    assert now.endswith("vLLM will not start (the error below)")


@pytest.mark.parametrize(("argv", "flag"), [
    (["--kv-bytes-per-token", "lots"], "--kv-bytes-per-token"),
    # 0.4 rounded to 0 B a token: "0 tokens of KV cache", will_start true, exit 0
    (["--gpu-memory-gib", "80", "--weights-gib", "1", "--kv-bytes-per-token", "0.4"], "--kv-bytes-per-token"),
    (["--weights-gib", "x"], "--weights-gib"),
    (["--model", "acme/Nope-1B", "--gpu", "H100"], "--model"),
    (["--model", "Qwen/Qwen3-8B", "--gpu", "Voodoo2"], "--gpu"),
    (["--model", "Qwen/Qwen3-8B", "--gpu", "H100", "--quantization", "int3"], "--quantization"),
    (["--model", "Qwen/Qwen3-8B"], "--gpu"),
    (["--gpu", "H100", "--tensor-parallel-size", "0"], "--tensor-parallel-size"),
    (["--model", "Qwen/Qwen3-8B", "--gpu", "H100", "--vllm-version", "abc"], "--vllm-version"),
    (["--model", "Qwen/Qwen3-8B", "--gpu", "H100", "--cpu-offload-gb", "-1"], "--cpu-offload-gb"),
    # what vLLM itself refuses at startup
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--tensor-parallel-size", "3"],
     "--tensor-parallel-size"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--pipeline-parallel-size", "33"],
     "--pipeline-parallel-size"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--block-size", "24"], "--block-size"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--kv-cache-dtype", "fp8_ds_mla"],
     "--kv-cache-dtype"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--kv-cache-dtype", "int2"],
     "--kv-cache-dtype"),
    # no request holds more than max_model_len: given, or the model's own (131,072 here)
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--max-model-len", "8192",
      "--avg-seq-len", "20000"], "--avg-seq-len"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--avg-seq-len", "200000"], "--avg-seq-len"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--max-model-len", "8192",
      "--avg-seq-len", "20000", "--target-concurrency", "10"], "--avg-seq-len"),
    # NaN and inf passed `< 0`: a traceback from the block count, or a plan with the weights at 0
    *[(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", f"--{flag}", value], f"--{flag}")
      for flag in ("weights-gib", "activation-gib", "non-torch-gib", "cuda-graph-gib", "available-kv-gib",
                   "cpu-offload-gb") for value in ("nan", "inf", "1e308")],
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--avg-seq-len", "nan"], "--avg-seq-len"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--vllm-version=-1"], "--vllm-version"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--vllm-version", ""], "--vllm-version"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--gpus-per-node", "0"], "--gpus-per-node"),
    # contradictions that were taken without a word: the measured CUDA graphs dropped, the plot not drawn (exit 0)
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--enforce-eager", "--cuda-graph-gib", "2"],
     "--cuda-graph-gib"),
    (["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--target-concurrency", "5", "--avg-seq-len",
      "100", "--plot", "/tmp/kvwatch-never-drawn.png"], "--plot"),
])
def test_bad_input_exits_2_naming_the_flag(argv, flag, capsys):
    code, out, err = run(["plan", *argv], capsys)
    assert code == 2
    assert flag in err and out == "" and err.count("\n") == 1


def test_model_and_model_config_together_is_an_error_not_a_silent_choice(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256}))
    code, out, err = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--model-config", str(cfg),
                          "--gpu", "H100"], capsys)
    assert code == 2 and out == ""
    assert "--model" in err and "--model-config" in err and err.count("\n") == 1


def test_the_reason_is_in_the_message(capsys):
    _, _, err = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
                     "--tensor-parallel-size", "3"], capsys)
    assert "divide the model's 32 attention heads" in err
    # Phi-3-medium: 40 attention heads divide by 4, its 10 KV heads do not, and vLLM asserts on them at startup
    # (vllm/model_executor/models/llama.py: total_num_kv_heads % tp_size == 0, or tp_size % it == 0).
    _, _, err = run(["plan", "--model", "microsoft/Phi-3-medium-128k-instruct", "--gpu", "H100",
                     "--tensor-parallel-size", "4"], capsys)
    assert "divide the model's 10 KV heads" in err
    _, _, err = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--block-size", "24"],
                    capsys)
    assert "1, 8, 16, 32, 64, 128, 256" in err


@pytest.mark.parametrize(("model", "dtype", "bytes_per_token"), [
    ("meta-llama/Llama-3.1-8B-Instruct", "fp8_inc", 2 * 32 * 8 * 128),  # Gaudi's fp8: one byte
    ("meta-llama/Llama-3.1-8B-Instruct", "fp8_e5m2", 2 * 32 * 8 * 128),
    ("deepseek-ai/DeepSeek-R1", "fp8_ds_mla", 61 * 656),  # FlashMLA's layout, not 61 x 576 x 1
])
def test_vllm_kv_cache_dtypes_are_accepted_and_priced(model, dtype, bytes_per_token, capsys):
    code, out, err = run(["plan", "--model", model, "--gpu", "H200", "--tensor-parallel-size", "8",
                          "--kv-cache-dtype", dtype, "--json"], capsys)
    assert code in (0, 1), err
    assert json.loads(out)["kv_bytes_per_token"] == bytes_per_token // (8 if "llama" in model.lower() else 1)


def test_plot_writes_png(tmp_path, capsys):
    png = tmp_path / "ceiling.png"
    code, _, _ = run(["plan", "--model", "openai/gpt-oss-20b", "--gpu", "H100", "--max-model-len", "32768",
                      "--avg-seq-len", "3000", "--plot", str(png)], capsys)
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what Python does when the package is absent
    code, out, err = run([*TUTORIAL, "--plot", str(tmp_path / "x.png")], capsys)
    assert code == 2 and out == ""  # refused before the plan is printed, as backtest does
    assert "kvwatch[plot]" in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(("name", "said"), [("x.jpg", "must end in .png"), ("no/such/dir/x.png", "does not exist"),
                                            (".", "is a directory")])
def test_a_plot_path_that_cannot_be_written_is_refused_up_front(tmp_path, capsys, name: str, said: str):
    code, out, err = run([*TUTORIAL, "--plot", str(tmp_path / name)], capsys)
    assert code == 2 and out == "" and said in err


def test_lists(capsys):
    code, out, _ = run(["plan", "--list-models"], capsys)
    assert code == 0 and "meta-llama/Llama-3.1-8B-Instruct" in out.splitlines()
    code, out, _ = run(["plan", "--list-gpus"], capsys)
    assert code == 0 and "H100-80GB" in out.splitlines()
    # with --json, a JSON list (it printed the text lines, which json.loads refuses)
    code, out, _ = run(["plan", "--list-gpus", "--json"], capsys)
    assert code == 0 and "H100-80GB" in json.loads(out)


def test_help_lists_plan_flags(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    for flag in ["--model", "--model-config", "--gpu", "--gpu-memory-gib", "--avg-seq-len", "--weights-gib",
                 "--activation-gib", "--non-torch-gib", "--available-kv-gib", "--kv-bytes-per-token", "--json",
                 "--plot"]:
        assert flag in out


def test_current_rules_subtract_the_cuda_graph_memory(capsys):
    base = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--json"]
    now = json.loads(run(base, capsys)[1])
    # the v0.19 sweep printed "cuda_graph est" 0.84 GiB for this model at TP 1 (calibration line 8)
    assert now["cuda_graph_bytes"] / GIB == pytest.approx(0.84, abs=0.05)
    assert "cuda_graphs" in now["estimated"]
    for extra in (["--vllm-version", "0.19"], ["--enforce-eager"], ["--available-kv-gib", "40"]):
        other = json.loads(run([*base, *extra], capsys)[1])
        assert other["cuda_graph_bytes"] == 0, extra  # before 0.21, no graphs, or a measured pool: nothing
    measured = json.loads(run([*base, "--cuda-graph-gib", "1.5"], capsys)[1])
    assert measured["cuda_graph_bytes"] == 1.5 * GIB and "cuda_graphs" not in measured["estimated"]
    assert measured["available_kv_bytes"] < now["available_kv_bytes"]


def test_header_and_json_state_the_rules_applied(capsys):
    base = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--max-model-len", "8192"]
    for extra, rules in (([], "0.32-0.33"), (["--vllm-version", "0.34"], ">=0.34"),
                         (["--vllm-version", "0.27"], "0.26-0.27"), (["--vllm-version", "0.29"], "0.28-0.29"),
                         (["--vllm-version", "0.20"], "0.20"),
                         (["--vllm-version", "0.12"], "0.12-0.13"), (["--vllm-version", "0.8"], "<0.9")):
        _, out, _ = run([*base, *extra], capsys)
        assert out.splitlines()[0].endswith(f"vLLM {rules} rules (figures per GPU)"), out.splitlines()[0]
        _, out, _ = run([*base, *extra, "--json"], capsys)
        assert json.loads(out)["vllm_rules"] == rules
    _, out, _ = run(base, capsys)
    assert "vLLM 0.20 rules" not in out  # the default is every current vLLM, not 0.20 alone


def test_the_rules_range_never_spans_a_version_the_capacity_model_reads() -> None:
    # plan named vLLM 0.29 "0.26-0.31 rules" though the model's rules change at 0.28 and 0.30: its list of changes
    # was kept by hand beside some 25 *_SINCE/*_BEFORE versions. Every one in kvwatch.capacity must be in it.
    import importlib
    import pkgutil

    import kvwatch.capacity
    from kvwatch.capacity.rules import RULE_CHANGES

    versions = {}
    for info in pkgutil.iter_modules(kvwatch.capacity.__path__):
        module = importlib.import_module(f"kvwatch.capacity.{info.name}")
        for name, value in vars(module).items():
            if name.rstrip("_").upper() == name and ("_SINCE" in name or "_BEFORE" in name):
                for version in value.values() if isinstance(value, dict) else [value]:
                    if isinstance(version, tuple):  # (a size such as MLA_HYBRID_ALIGNMENT_BEFORE_0_20 is none)
                        versions[f"{info.name}.{name}"] = version
    assert len(versions) >= 25
    assert {name: v for name, v in versions.items() if v not in RULE_CHANGES} == {}


def test_a_rules_range_ending_at_a_major_release_names_no_minus_one_release() -> None:
    from kvwatch.capacity.rules import rules_range

    changes = ((0, 28), (0, 30), (1, 0), (1, 2))
    assert rules_range((0, 31), changes) == ">=0.30,<1.0"  # was "0.30-1.-1"
    assert rules_range((1, 1), changes) == "1.0-1.1"
    assert rules_range((0, 28), changes) == "0.28-0.29"


def test_json_counts_and_bytes_are_integers_and_every_plan_says_will_start(capsys):
    _, out, _ = run([*TUTORIAL, "--json"], capsys)
    data = json.loads(out)
    for key in ("usable_bytes", "weights_bytes", "activation_bytes", "non_torch_bytes", "available_kv_bytes",
                "kv_bytes_per_token", "total_memory_bytes", "num_gpu_blocks", "kv_cache_tokens", "block_size"):
        assert data[key] is None or type(data[key]) is int, key
    assert data["kv_bytes_per_token"] == 858993  # 0.0008 GiB, not 858993.4592
    assert isinstance(data["will_start"], bool)
    for s in data["scenarios"]:
        assert "will_start" in s and (s["will_start"] is None) == (s["kv_cache_tokens"] is None), s
        assert s["kv_cache_tokens"] is None or type(s["kv_cache_tokens"]) is int


@pytest.mark.parametrize(("name_or_path", "folder", "shown"), [
    ("/home/jovyan/qwen3-8b", "snapshot", "qwen3-8b"),  # a local path written by save_pretrained
    ("Qwen/Qwen3-8B", "whatever", "Qwen/Qwen3-8B"),  # a hub id
    (None, "my-model", "my-model"),
    (None, "models--Qwen--Qwen3-8B/snapshots/0123abcd", "Qwen/Qwen3-8B"),  # the Hugging Face cache
    (None, "configs/qwen3-30b-fp8.json", "qwen3-30b-fp8"),  # a saved file of its own name ("configs" before)
])
def test_model_config_shows_the_models_name_not_its_folder(tmp_path, capsys, name_or_path, folder, shown):
    cfg = tmp_path / folder / "config.json" if not folder.endswith(".json") else tmp_path / folder
    cfg.parent.mkdir(parents=True)
    config = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
              "vocab_size": 128256, "intermediate_size": 14336, "max_position_embeddings": 8192}
    if name_or_path:
        config["_name_or_path"] = name_or_path
    cfg.write_text(json.dumps(config))
    _, out, _ = run(["plan", "--model-config", str(cfg), "--gpu", "A100-80GB", "--json"], capsys)
    assert json.loads(out)["model"] == shown
    _, out, _ = run(["plan", "--model-config", str(cfg), "--gpu", "A100-80GB"], capsys)
    assert out.startswith(f"kvwatch plan: {shown}, ") and str(tmp_path) not in out.splitlines()[0]


def test_plot_marks_what_will_not_start(tmp_path, capsys):
    from kvwatch.capacity import DeploymentSpec, plan_capacity, resolve_model, whatif_scenarios
    from kvwatch.plan import write_plot

    # 64k tokens of Llama-3.1-8B do not fit an L4's pool; FP8 or TP x2 would start.
    spec = DeploymentSpec(arch=resolve_model("meta-llama/Llama-3.1-8B-Instruct"), gpu_memory_bytes=24 * GIB,
                          gpu_name="L4", max_model_len=65536)
    plan = plan_capacity(spec)
    assert not plan.will_start
    scenarios = whatif_scenarios(spec)
    labels = write_plot(tmp_path / "p.png", plan, scenarios, None)
    assert labels[0] == "now (won't start)"
    started = {s.name for s in scenarios if s.plan is not None and s.plan.will_start}
    assert {"fp8_kv_cache", "tensor_parallel_x2"} <= started and "gpu_memory_utilization_0.95 (won't start)" in labels
    assert labels[-1] == f"--max-num-seqs {plan.max_num_seqs:,} (vLLM runs no more)"  # the scheduler's cap, drawn too
    assert all(("(won't start)" in label) != (label in started) for label in labels[1:-1])
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, _ = run(["plan", "--model", "Qwen/Qwen3-32B", "--gpu", "L4", "--plot", str(tmp_path / "cli.png")],
                     capsys)
    assert code == 1 and (tmp_path / "cli.png").is_file()


def test_max_num_seqs_caps_what_runs_and_the_text_says_which_limit_binds(capsys):
    base = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--avg-seq-len", "200"]
    code, out, _ = run([*base, "--max-num-seqs", "256", "--json"], capsys)
    plan = json.loads(out)
    assert code == 0 and plan["max_num_seqs"] == 256 and plan["max_concurrency"] > 2000
    assert plan["running_limit"] == 256  # the KV cache would hold ~2,300 requests of 200 tokens
    fp8 = next(s for s in plan["scenarios"] if s["name"] == "fp8_kv_cache")
    assert fp8["max_concurrency"] > 2 * 2000 and fp8["running_limit"] == 256  # more KV, no more concurrency
    code, out, _ = run([*base, "--max-num-seqs", "256"], capsys)
    assert "runs at most 256 requests at once (max_num_seqs): the scheduler, not the KV cache" in out
    # vLLM's own default on an 80 GB H100 is 1,024 (kvwatch.capacity.memory.default_batch_limits); at the
    # model's full length the KV cache binds.
    code, out, _ = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--json"], capsys)
    plan = json.loads(out)
    assert plan["max_num_seqs"] == 1024 and plan["running_limit"] == plan["max_concurrency"] < 10


def test_a_refused_deployment_gets_its_error_not_a_long_context_warning_and_short_prefills_show_tenths(capsys):
    code, out, _ = run(["plan", "--model", "Qwen/Qwen3-32B", "--gpu", "H100", "--max-model-len", "40961"], capsys)
    assert code == 1 and "error: vLLM will not start" in out and "fit at once: one long request" not in out
    code, out, _ = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
                        "--max-model-len", "2048"], capsys)
    assert code == 0 and "one max-length prefill                ~0.1 s at 40%" in out


@pytest.mark.parametrize("argv", [["--bogus"], ["--avg-seq-len", "-1"], ["--model", "acme/Nope-1B"]])
def test_bad_usage_with_json_is_json_on_stdout_too(argv, capsys):
    try:
        code = main(["plan", "--gpu", "H100", "--json", *argv])
    except SystemExit as exc:  # the argument parser's own errors exit from inside it
        code = exc.code
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    error = json.loads(out)["error"]
    assert code == 2 and error["reason"] == "usage" and error["message"] in err


def test_a_0_20_plan_of_a_hybrid_gives_both_patch_releases_token_figures(capsys):
    # vLLM 0.20.2 changed "GPU KV cache size" to max concurrency × max_model_len in a patch release; 0.20.0 and
    # 0.20.1 still log blocks // groups × block_size, and --vllm-version 0.20 cannot say which.
    code, out, _ = run(["plan", "--model", "openai/gpt-oss-20b", "--gpu", "H100", "--vllm-version", "0.20"], capsys)
    assert code == 0 and "0.20.0 and 0.20.1 log blocks // 2 groups × 16 = " in out
    _, newer, _ = run(["plan", "--model", "openai/gpt-oss-20b", "--gpu", "H100", "--vllm-version", "0.26"], capsys)
    assert "0.20.0 and 0.20.1" not in newer


def test_cpu_offload_moves_estimated_weights_off_the_gpu(capsys):
    # vLLM's --cpu-offload-gb (per GPU) keeps that much of the weights in CPU memory (vllm/config/offload.py), and
    # the KV cache gets the room: Llama-3.1-8B on an L4 fits twice the tokens with 4 GiB offloaded. A 14B model that
    # "will not start" on an L4 starts with 12 GiB offloaded. A measured --weights-gib already excludes it.
    def plan(*extra: str) -> dict:
        code, out, _ = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--max-model-len",
                            "8192", "--json", *extra], capsys)
        assert code == 0
        return json.loads(out)

    base, offloaded = plan(), plan("--cpu-offload-gb", "4")
    assert offloaded["weights_bytes"] == pytest.approx(base["weights_bytes"] - 4 * 2**30)
    assert offloaded["kv_cache_tokens"] > 2 * base["kv_cache_tokens"]
    measured = plan("--weights-gib", "15", "--cpu-offload-gb", "4")
    assert measured["weights_bytes"] == 15 * 2**30
    code, _, _ = run(["plan", "--model", "Qwen/Qwen2.5-14B-Instruct", "--gpu", "L4", "--max-model-len", "8192"], capsys)
    assert code == 1
    code, _, _ = run(["plan", "--model", "Qwen/Qwen2.5-14B-Instruct", "--gpu", "L4", "--max-model-len", "8192",
                      "--cpu-offload-gb", "12"], capsys)
    assert code == 0
    # Only the decoder layers go (vLLM offloads what make_layers builds): the embeddings and the LM head, 2 × 128,256
    # × 4,096 × 2 B, stay on the GPU however much is offloaded (all 15 GiB read as offloaded before).
    embeddings = 2 * 128256 * 4096 * 2
    for gib in ("14", "20"):
        assert plan("--cpu-offload-gb", gib)["weights_bytes"] == pytest.approx(embeddings, rel=1e-9)



def test_a_length_under_one_token_is_refused_and_a_sliding_only_model_shows_its_sum(capsys):
    # --avg-seq-len 1e-9 printed "at 0 tokens per request ... ≈ 30674285714285.71 requests"; and a
    # model whose every layer slides (one KV group, no hybrid) printed the plain budget ÷ (L × bytes) sum beside the
    # window's result (57.67 GiB ÷ (32,768 × 128 KiB) "≈ 110.93", a sum of 14.42)
    for length in ("1e-9", "0.5"):
        code, out, err = run(["plan", "--model", "google/gemma-3-27b-it", "--gpu", "H100", "--avg-seq-len", length],
                             capsys)
        assert code == 2 and "must be at least 1 token" in err and "--avg-seq-len" in err
    code, out, _ = run(["plan", "--model", "microsoft/Phi-3-mini-4k-instruct", "--gpu", "H100",
                        "--avg-seq-len", "4096"], capsys)
    (line,) = [x for x in out.splitlines() if "tokens per request:" in x]
    assert code == 0 and "prefill steps hold beyond the windows" in line and "in its one group" in line


def test_a_measured_available_figure_with_pipeline_parallelism_loses_the_last_stages_sampler(capsys):
    # calibration row 15: vLLM 0.19 logged 66.54 GiB available on rank 0 and reported 1,075,312
    # tokens (the tightest stage's pool); --available-kv-gib 66.54 planned 1,090,176 (+1.38 %)
    code, out, _ = run(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory-gib", "79.19",
                        "--gpu-memory-utilization", "0.95", "--pipeline-parallel-size", "2", "--max-model-len", "8192",
                        "--vllm-version", "0.19", "--available-kv-gib", "66.54", "--json"], capsys)
    tokens = json.loads(out)["kv_cache_tokens"]
    assert code == 0 and abs(tokens / 1_075_312 - 1) < 0.002, tokens


def test_a_pool_vllm_was_given_loses_nothing_with_pipeline_parallelism():
    # vLLM's --kv-cache-memory-bytes is every worker's pool as given (no profile): the last stage's
    # sampler was taken off it as off a logged rank-0 figure (20 GiB planned as 19.14)
    from kvwatch.capacity.planner import DeploymentSpec, plan_capacity
    from kvwatch.capacity.presets import match_model
    from kvwatch.capacity.units import GIB

    spec = DeploymentSpec(arch=match_model("meta-llama/Llama-3.1-8B-Instruct").arch, gpu_memory_bytes=80 * GIB,
                          pipeline_parallel_size=2, max_model_len=8192, available_kv_bytes=20 * GIB,
                          kv_pool_fixed=True)
    plan = plan_capacity(spec)
    assert plan.available_kv_bytes == 20 * GIB and plan.pp_last_stage_extra_bytes == 0


def test_a_profile_run_past_the_activation_fit_is_flagged(capsys):
    # V0 without chunked prefill profiled all 29,000 tokens: vLLM logged 2.99 GiB of activation (calibration row 46)
    # against kvwatch's 0.93, and refused to start where the plan said it would; the plan now says its estimate is
    # outside what it was fitted on. Within the fit (chunked prefill, 8,192 tokens), no such warning.
    base = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory-gib", "23.58",
            "--gpu-memory-utilization", "0.9", "--max-model-len", "29000", "--json"]
    old = json.loads(run([*base, "--vllm-version", "0.6", "--no-enable-chunked-prefill"], capsys)[1])
    assert any("fitted on profile runs of at most 8,192 tokens" in w and "--activation-gib" in w
               for w in old["warnings"])
    current = json.loads(run(base, capsys)[1])
    assert not any("fitted on profile runs" in w for w in current["warnings"])
    measured = json.loads(run([*base, "--vllm-version", "0.6", "--no-enable-chunked-prefill", "--activation-gib",
                               "2.99"], capsys)[1])
    assert not any("fitted on profile runs" in w for w in measured["warnings"])
