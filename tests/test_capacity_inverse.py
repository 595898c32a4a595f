"""The inverse planner (`kvwatch plan --target-concurrency N --avg-seq-len T`), checked against vLLM's own figures.

tests/fixtures/calibration/vllm_kv_capacity.csv line 8: Llama-3.1-8B-Instruct on one H100 at utilization 0.95,
vLLM 0.19, max_model_len 8192: "Maximum concurrency for 8,192 tokens per request: 58.11x". So 58 such requests
fit one GPU unchanged, and 59 need a change or a second GPU.
"""

from __future__ import annotations

import json

import pytest

from kvwatch.cli import main

pytestmark = pytest.mark.usefixtures("no_kvwatch_env")
ROW8 = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--gpu-memory-utilization", "0.95",
        "--max-model-len", "8192", "--vllm-version", "0.19", "--avg-seq-len", "8192", "--json"]


def inverse(argv, capsys):
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_58_requests_fit_the_logged_deployment_unchanged(capsys):
    code, data = inverse([*ROW8, "--target-concurrency", "58"], capsys)
    best = data["options"][0]
    assert code == 0 and data["why_not"] is None
    assert best["replicas"] == 1 and best["total_gpus"] == 1 and best["changes"] == []
    assert best["max_concurrency"] == pytest.approx(58.11, rel=0.001)  # estimated weights: 29,757 blocks vs 29,750


def test_59_requests_need_a_change(capsys):
    code, data = inverse([*ROW8, "--target-concurrency", "59"], capsys)
    best = data["options"][0]
    assert code == 0 and best["total_gpus"] == 1
    assert best["changes"] == ["kv_cache_dtype"] and "--kv-cache-dtype=fp8" in best["vllm_args"]
    assert best["requests_per_replica"] >= 59


def test_options_are_full_plans_cheapest_first_and_reach_the_target(capsys):
    code, data = inverse(["plan", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100",
                          "--target-concurrency", "64", "--avg-seq-len", "8192", "--json"], capsys)
    assert code == 0
    main(["plan", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100", "--json"])
    plan_keys = set(json.loads(capsys.readouterr().out))
    gpus = [o["total_gpus"] for o in data["options"]]
    assert gpus == sorted(gpus)
    for option in data["options"]:
        assert plan_keys <= set(option)
        assert option["will_start"] and option["tensor_parallel_size"] <= 8
        assert option["replicas"] * int(option["requests_per_replica"]) >= 64


def test_vllm_args_reproduce_the_option(capsys):
    code, data = inverse(["plan", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100",
                          "--target-concurrency", "64", "--avg-seq-len", "8192", "--json"], capsys)
    option = data["options"][0]
    flags = [part for arg in option["vllm_args"] for part in arg.split("=", 1)]
    code, plan = inverse(["plan", *flags, "--gpu", "H100", "--avg-seq-len", "8192", "--json"], capsys)
    assert code == 0
    assert plan["max_concurrency"] == pytest.approx(option["max_concurrency"])


def test_nothing_reaches_the_target_says_why(capsys):
    code = main(["plan", "--model", "meta-llama/Llama-3.1-405B-Instruct", "--gpu", "L4", "--target-concurrency", "1",
                 "--avg-seq-len", "1000", "--gpus-per-node", "4"])
    out = capsys.readouterr().out
    assert code == 1
    assert "nothing reaches 1" in out and "will not start" in out


def test_target_needs_the_average_length():
    assert main(["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
                 "--target-concurrency", "10"]) == 2


def test_no_option_has_a_tensor_parallel_size_vllm_refuses(capsys):
    # Phi-3-medium's 10 KV heads: TP 4 divides its 40 attention heads but not its KV heads, and vLLM refuses it.
    code, data = inverse(["plan", "--model", "microsoft/Phi-3-medium-128k-instruct", "--gpu", "L4",
                          "--target-concurrency", "64", "--avg-seq-len", "8192", "--json"], capsys)
    assert code == 0 and data["options"]
    assert {o["tensor_parallel_size"] for o in data["options"]} <= {1, 2}


def test_the_given_tensor_parallel_size_is_no_floor_and_one_vllm_refuses_is_refused(monkeypatch, capsys):
    # The given size was a floor: the sidecar's KVWATCH_TENSOR_PARALLEL_SIZE=2 hid every one-GPU deployment, and a
    # size vLLM refuses (3: Llama's 32 heads) listed 4 GPUs at TP 4 first, exit 0, where plain plan exits 2.
    base = [*ROW8, "--target-concurrency", "8"]
    monkeypatch.setenv("KVWATCH_TENSOR_PARALLEL_SIZE", "2")
    code, data = inverse(base, capsys)
    assert code == 0 and data["options"][0]["total_gpus"] == 1 and data["options"][0]["tensor_parallel_size"] == 1
    monkeypatch.delenv("KVWATCH_TENSOR_PARALLEL_SIZE")
    assert main([*base, "--tensor-parallel-size", "3"]) == 2
    assert "invalid value 3 for --tensor-parallel-size" in capsys.readouterr().err


def test_a_length_it_picks_fits_four_requests_as_the_plans_own_warning_asks(capsys):
    # Llama-4-Scout's 10M tokens do not start on 4 H100s; the longest length that does (2.8M) left room for one
    # request, and that option's own plan then warned. The inverse planner picks the length at which 4 fit.
    code, data = inverse(["plan", "--model", "meta-llama/Llama-4-Scout-17B-16E-Instruct", "--gpu", "H100",
                          "--target-concurrency", "16", "--avg-seq-len", "32768", "--json"], capsys)
    assert code == 0 and data["options"]
    for option in data["options"]:
        if "max_model_len" in option["changes"]:
            assert option["long_context"]["requests_at_max_model_len"] >= 4, option["vllm_args"]


def test_gpus_per_node_is_one_setting_for_plan_as_for_check_and_serve(monkeypatch, capsys):
    # plan had a --gpus-per-node of its own and ignored KVWATCH_GPUS_PER_NODE (and a bad one)
    argv = ["plan", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100", "--target-concurrency", "64",
            "--avg-seq-len", "8192", "--json"]
    monkeypatch.setenv("KVWATCH_GPUS_PER_NODE", "2")
    main(argv)
    assert {o["tensor_parallel_size"] for o in json.loads(capsys.readouterr().out)["options"]} <= {1, 2}
    monkeypatch.setenv("KVWATCH_GPUS_PER_NODE", "abc")
    assert main(argv) == 2 and "KVWATCH_GPUS_PER_NODE" in capsys.readouterr().err


def test_why_nothing_starts_names_each_tp_once_with_the_settings_it_was_tried_at(capsys):
    # each TP read twice with different shortfalls and nothing to say which --gpu-memory-utilization each was
    code, data = inverse(["plan", "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "H100-80GB",
                          "--target-concurrency", "64", "--avg-seq-len", "8192", "--json"], capsys)
    assert code == 1 and data["options"] == [] and data["why_not"].startswith("no setting starts: ")
    reasons = data["why_not"].removeprefix("no setting starts: ").split("; ")
    assert [r.split(",")[0].split(":")[0] for r in reasons] == ["TP=1", "TP=2", "TP=4", "TP=8"]
    assert all("--gpu-memory-utilization 0.95" in r for r in reasons)  # the most generous tried: the closest miss
