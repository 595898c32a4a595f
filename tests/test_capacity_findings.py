"""Capacity findings (kvwatch.capacity.findings) on vLLM's own numbers, and their wiring into `kvwatch check`."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from kvwatch.capacity import DeploymentSpec, plan_capacity, presets
from kvwatch.capacity.findings import capacity_mismatch, kv_usage_stuck, live_finding, request_exceeds_pool
from kvwatch.capacity.memory import GIB
from kvwatch.cli import main
from kvwatch.engines.vllm import engine_max_model_len

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-metrics"
pytestmark = pytest.mark.usefixtures("no_kvwatch_env")


def _qwen2_a100(util: float | None) -> object:
    arch = presets.match_model("Qwen/Qwen2-7B-Instruct").arch
    return plan_capacity(DeploymentSpec(arch=arch, gpu_memory_bytes=79.3 * GIB, gpu_name="A100-80GB",
                                        gpu_memory_utilization=util, max_model_len=16384, vllm_version=(0, 10)))


def test_mismatch_names_both_numbers_when_the_utilization_was_not_given():
    # tests/fixtures/calibration/vllm_kv_capacity.csv line 41: vLLM 0.10.1 on an A100 at utilization 0.25
    # reported 93,872 tokens; a plan at vLLM's default utilization says several times more.
    plan = _qwen2_a100(None)
    finding = capacity_mismatch(plan.kv_cache_tokens, 93872, plan)
    assert finding is not None and finding.id == "capacity_mismatch"
    assert f"{plan.kv_cache_tokens:,}" in finding.message and "93,872" in finding.message
    assert "--gpu-memory-utilization" in finding.message
    # "+243 %" said neither the side nor the size; "4586% higher" is read as a ratio
    assert "the formula is 11.2 times the engine's" in finding.message
    # beside the 10 % it fires above, "10% higher" read as no mismatch at all
    near = capacity_mismatch(plan.kv_cache_tokens, plan.kv_cache_tokens / 1.1004, plan)
    assert near is not None and "(the formula is 10.04% higher" in near.message
    # vLLM 0.10 subtracts no CUDA-graph memory before sizing the cache: not a cause there.
    assert "CUDA-graph" not in finding.message
    # From 0.21 it does, but tens of GiB missing are not the graphs (0.5-1.8 GiB): not the first cause named.
    later = plan_capacity(replace(plan.spec, vllm_version=(0, 21)))
    causes = capacity_mismatch(later.kv_cache_tokens, 93872, later).message.split("Likely causes: ", 1)[1]
    assert causes.index("--gpu-memory-utilization") < causes.index("CUDA-graph")


def test_a_formula_below_the_engine_names_pipeline_parallelism():
    # a PP 2 page checked without --pipeline-parallel-size read 56 % low, and the causes named every flag but that one
    plan = _qwen2_a100(None)
    causes = capacity_mismatch(plan.kv_cache_tokens, plan.kv_cache_tokens * 2.3, plan).message.split(
        "Likely causes: ", 1)[1]
    assert "more tensor or pipeline parallelism" in causes and "--pipeline-parallel-size" in causes


def test_the_engines_own_utilization_is_a_cause_only_in_the_gaps_direction():
    # given 0.8 where the engine runs 0.92, a formula above the engine's pool listed "a lower
    # --gpu-memory-utilization than kvwatch assumed": the engine's label says the opposite
    plan = _qwen2_a100(0.8)
    above = capacity_mismatch(plan.kv_cache_tokens, 93872, plan, engine_utilization=0.92)
    assert above is not None and "--gpu-memory-utilization" not in above.message.split("Likely causes: ", 1)[1]
    below = capacity_mismatch(plan.kv_cache_tokens, 93872, plan, engine_utilization=0.25)
    assert "--gpu-memory-utilization 0.8 given to kvwatch where the engine runs 0.25" in below.message
    higher = capacity_mismatch(plan.kv_cache_tokens, plan.kv_cache_tokens * 1.5, plan, engine_utilization=0.92)
    assert "--gpu-memory-utilization 0.8 given to kvwatch where the engine runs 0.92" in higher.message
    assert "--gpu-memory-utilization" not in capacity_mismatch(
        plan.kv_cache_tokens, plan.kv_cache_tokens * 1.5, plan, engine_utilization=0.5).message.split(
        "Likely causes: ", 1)[1]


def test_no_mismatch_when_the_plan_describes_the_engine():
    # line 42: the same engine at utilization 0.5 reported 464,848 tokens
    plan = _qwen2_a100(0.5)
    assert abs(plan.kv_cache_tokens / 464848 - 1) < 0.10
    assert capacity_mismatch(plan.kv_cache_tokens, 464848, plan) is None


def test_cuda_graph_gap_is_recognised():
    # line 8: Llama-3.1-8B on an H100, vLLM 0.19: 476,000 tokens, "cuda_graph est" 0.84 GiB. vLLM >= 0.21
    # subtracts that estimate first: what it would report is 0.84 GiB of tokens fewer (128 KiB per token).
    reported = 476000 - int(0.84 * GIB / 131072)
    formula = 476000 * 1.0
    assert capacity_mismatch(formula, reported) is None  # 1.5 %: inside the 10 % tolerance
    plan = plan_capacity(DeploymentSpec(arch=presets.match_model("meta-llama/Llama-3.1-8B-Instruct").arch,
                                        gpu_memory_bytes=79.19 * GIB, max_model_len=8192))
    finding = capacity_mismatch(plan.kv_cache_tokens, plan.kv_cache_tokens * 0.85, plan)
    assert finding is not None and "CUDA-graph" in finding.message


def test_stuck_usage_and_a_request_bigger_than_the_pool():
    assert kv_usage_stuck(0.989, 0, 0) is not None  # the level vllm issue 27073 shows, with nothing running
    assert kv_usage_stuck(0.989, 26, 64) is None  # the same level while serving is just a full cache
    # Live traffic queues behind a leak: requests wait for blocks nobody holds (it was read as kv_bound, and
    # "limit concurrency to 236; now 0 running" was advised). Requests waiting for a KV transfer (vLLM's
    # "deferred", a PD decode server) hold blocks before they run: no finding.
    queued = kv_usage_stuck(0.97, 0, 12, queue_holds_no_kv=True)
    assert queued is not None and "12 requests waiting" in queued.message and "PD" in queued.message
    assert kv_usage_stuck(0.97, 0, 12, deferred=0.0, queue_holds_no_kv=True) is not None
    assert kv_usage_stuck(0.97, 0, 12, deferred=4.0, queue_holds_no_kv=True) is None
    # Where a queue may hold the KV (an SGLang PD prefill server runs nothing and holds its transfers, and some
    # releases label it "unified"), a queue is no leak: a restart there would kill the transfers.
    assert kv_usage_stuck(0.97, 0, 12) is None
    found = request_exceeds_pool(0.0, 0, 1, capacity_tokens=93872, max_model_len=131072)
    assert found is not None and "93,872" in found.message and "39734" in found.message
    assert request_exceeds_pool(0.3, 2, 1) is None


def test_request_exceeds_pool_counts_only_requests_waiting_for_room_and_claims_no_cause_its_figures_deny() -> None:
    # 30 requests deferred for a LoRA slot or a KV transfer were "a head request larger than the
    # pool", critical; and with a pool holding 13 max-length requests it still said the head needs more than the pool
    assert request_exceeds_pool(0.0, 0, 30, deferred=30.0) is None
    assert live_finding("request_exceeds_pool", 0.0, 0, 30, deferred=30.0) is None  # serve's and check's path
    some = request_exceeds_pool(0.0, 0, 30, deferred=28.0)
    assert some is not None and some.message.startswith("2 requests wait for room")
    fits = request_exceeds_pool(0.0, 0, 3, capacity_tokens=449872, max_model_len=32768)
    assert fits is not None and fits.severity == "critical"
    assert "needs more KV than the whole pool" not in fits.message and "cannot tell" in fits.message
    assert "449,872" in fits.message and "32,768" in fits.message and "45414" in fits.message
    unknown = request_exceeds_pool(0.0, 0, 3)  # without the figures the known deadlock is the likely cause
    assert unknown is not None and "needs more KV than the whole pool" in unknown.message


def _payload(running: str, waiting: str, usage: str) -> str:
    text = (FIXTURES / "neuron-v0-block1024.prom").read_text()
    name = 'model_name="tinyLlama/TinyLlama-1.1B-Chat-v1.0"'
    return (text.replace(f"vllm:num_requests_running{{{name}}} 0.0", f"vllm:num_requests_running{{{name}}} {running}")
                .replace(f"vllm:num_requests_waiting{{{name}}} 0.0", f"vllm:num_requests_waiting{{{name}}} {waiting}")
                .replace(f"vllm:gpu_cache_usage_perc{{{name}}} 0.0", f"vllm:gpu_cache_usage_perc{{{name}}} {usage}"))


@pytest.mark.parametrize(("running", "waiting", "usage", "expected", "absent"), [
    ("0.0", "0.0", "0.99", "kv_usage_stuck", None),
    ("0.0", "3.0", "0.0", "request_exceeds_pool", "scheduler_limited"),
    ("0.0", "12.0", "0.97", "kv_usage_stuck", "kv_bound"),
])
def test_check_reports_them(tmp_path, capsys, running, waiting, usage, expected, absent):
    path = tmp_path / "metrics.prom"
    path.write_text(_payload(running, waiting, usage))
    assert main(["check", "--file", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ids = [f["id"] for f in report["findings"]]
    assert ids[0] == expected
    assert absent not in ids
    assert not any(s["advice"] for s in report["series"])  # no capacity fix for a leak


def test_check_warns_when_the_given_settings_would_not_start(capsys):
    path = FIXTURES / "gen-0.33-dp2-capacity-labels.prom"
    code = main(["check", "--file", str(path), "--json", "--model", "meta-llama/Llama-3.1-8B-Instruct",
                 "--gpu", "H100", "--max-model-len", "1000000"])
    assert code == 0
    found: dict[str, str] = {}
    for f in json.loads(capsys.readouterr().out)["findings"]:
        found[f["id"]] = found.get(f["id"], "") + f["message"]
    assert "greater than the model's maximum length 131072" in found["vllm_will_not_start"]
    # the engine reports 163,840 tokens; the formula with the engine's own utilization is far above it, so a
    # utilization other than kvwatch assumed is no cause to suggest
    assert "163,840" in found["capacity_mismatch"]
    assert "with the engine's own --gpu-memory-utilization 0.92" in found["capacity_mismatch"]
    assert "--gpu-memory-utilization than kvwatch assumed" not in found["capacity_mismatch"]


def test_the_engines_max_model_len_is_read_from_cache_config_info():
    # vLLM >= 0.20: kv_cache_size_tokens = int(kv_cache_max_concurrency * max_model_len), concurrency =
    # num_gpu_blocks / ceil(max_model_len / block_size) (docs/capacity.md, section 5); every length comes back.
    for blocks in (1000, 20480, 28117, 123457):
        for length in (2048, 8192, 10000, 32768, 40960, 131072):
            if blocks * 16 < length:
                continue  # below one request the division does not pin one length
            concurrency = blocks / math.ceil(length / 16)
            config = {"kv_cache_size_tokens": str(int(concurrency * length)),
                      "kv_cache_max_concurrency": str(concurrency)}
            assert engine_max_model_len(config) == length
    assert engine_max_model_len({"kv_cache_size_tokens": "163840", "kv_cache_max_concurrency": "0.5"}) is None
    assert engine_max_model_len({"num_gpu_blocks": "1000", "block_size": "16"}) is None  # before vLLM 0.20


def test_a_max_model_len_other_than_the_engines_is_a_warning(capsys):
    path = FIXTURES / "gen-0.33-dp2-capacity-labels.prom"  # two engines, 163,840 tokens at 20.0x: 8,192
    assert main(["check", "--file", str(path), "--json", "--max-model-len", "32768"]) == 0
    found = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "max_model_len_mismatch"]
    assert len(found) == 1 and found[0]["severity"] == "warning"  # once per model, not per engine
    assert "--max-model-len 32768, but the engine runs 8,192" in found[0]["message"]
    assert "give kvwatch --max-model-len 8192," in found[0]["message"]  # (a flag to paste: "8,192" was not one)
    for agreeing in ([], ["--max-model-len", "8192"]):
        assert main(["check", "--file", str(path), "--json", *agreeing]) == 0
        assert "max_model_len_mismatch" not in {f["id"] for f in json.loads(capsys.readouterr().out)["findings"]}


def test_a_setting_other_than_the_engines_is_a_warning_and_the_advice_says_so(capsys):
    # kvwatch given --kv-cache-dtype auto for an engine on fp8: the what-ifs offered FP8 KV as a
    # 2x gain to an engine that has it, with no word that the flags describe another deployment.
    path = FIXTURES / "gen-0.20.2-gptoss-two-groups.prom"  # cache_dtype "auto", gpu_memory_utilization "0.9"
    assert main(["check", "--file", str(path), "--json", "--gpu", "H100", "--kv-cache-dtype", "fp8",
                 "--gpu-memory-utilization", "0.8"]) == 0
    report = json.loads(capsys.readouterr().out)
    found = [f for f in report["findings"] if f["id"] == "engine_setting_mismatch"]
    assert len(found) == 1 and found[0]["severity"] == "warning"
    assert "--kv-cache-dtype fp8 where the engine runs cache_dtype auto" in found[0]["message"]
    assert "--gpu-memory-utilization 0.8 where the engine runs gpu_memory_utilization 0.9" in found[0]["message"]
    for agreeing in ([], ["--kv-cache-dtype", "bfloat16", "--gpu-memory-utilization", "0.90"]):
        assert main(["check", "--file", str(path), "--json", "--gpu", "H100", *agreeing]) == 0
        assert "engine_setting_mismatch" not in {f["id"] for f in json.loads(capsys.readouterr().out)["findings"]}


@pytest.mark.parametrize(("flags", "stated"), [
    ([], None),  # a V0 payload does not tell the engine's --max-model-len: the model's default would be a guess
    (["--max-model-len", "40960"], "40,960"),
])
def test_request_exceeds_pool_states_only_a_known_max_model_len(tmp_path, capsys, flags, stated):
    path = tmp_path / "metrics.prom"
    path.write_text(_payload("0.0", "3.0", "0.0"))
    assert main(["check", "--file", str(path), "--json", "--model", "Qwen/Qwen3-8B", "--gpu", "A100-80GB",
                 *flags]) == 0
    found = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["id"] == "request_exceeds_pool"]
    assert len(found) == 1
    if stated is None:
        assert "--max-model-len is" not in found[0]["message"]
    else:
        assert f"The pool holds 4,096 tokens but --max-model-len is {stated}" in found[0]["message"]


def test_an_engine_asleep_has_no_live_finding():
    # vLLM's sleep mode releases the cache: a queue with nothing running at 0 % is expected then, and a level-2
    # sleep (discard_all) may leave usage unrefreshed; neither is a stuck request nor a leak.
    from kvwatch.capacity.findings import LIVE_FINDINGS, live_finding

    for args in ((0.0, 0.0, 4.0), (0.99, 0.0, 0.0)):
        assert any(live_finding(f, *args) is not None for f in LIVE_FINDINGS)
        assert all(live_finding(f, *args, asleep=True) is None for f in LIVE_FINDINGS)


def test_mismatch_without_a_plan_makes_no_claim_about_the_gaps_size():
    finding = capacity_mismatch(200_000, 100_000, None)
    assert finding is not None and "outside the 0.5-1.8 GiB" not in finding.message


def test_an_override_explains_the_mismatch_alone():
    found = capacity_mismatch(443_696, 64_000, None, override_blocks=4000)
    assert found is not None and found.severity == "info"
    assert "--num-gpu-blocks-override 4,000" in found.message and "Likely causes" not in found.message


def test_the_missing_memory_is_the_pools_share_in_every_layout():
    # gpt-oss (a full and a sliding group): tokens x bytes per token missed the sliding group's bytes; the pool's
    # share of the gap is what the engine lacks.
    plan = plan_capacity(DeploymentSpec(arch=presets.match_model("openai/gpt-oss-20b").arch, gpu_name="H100",
                                        gpu_memory_bytes=80 * GIB, max_model_len=32768, vllm_version=(0, 21)))
    finding = capacity_mismatch(plan.kv_cache_tokens, plan.kv_cache_tokens * 0.85, plan)
    assert finding is not None
    assert f"{plan.available_kv_bytes * 0.15 / GIB:.2f} GiB per GPU is missing" in finding.message


def test_check_says_on_stderr_why_its_advice_has_no_plan_even_without_deployment_flags(capsys):
    # The tensor-parallel advice without a plan says "why it could not is on stderr"; check printed the reason
    # only when a deployment flag was given, so stderr was empty.
    path = FIXTURES / "gen-0.33-dp2-capacity-labels.prom"
    assert main(["check", "--file", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "on stderr" in out
    assert "no capacity plan for llama: no preset for model 'llama'" in err, err


def test_a_given_setting_the_engine_agrees_with_is_no_mismatch_and_a_mismatch_caveats_every_engine(tmp_path, capsys):
    # Granite-4.0-H on a vLLM with PR 42967: the label says the raised 528, kvwatch was given the
    # 16 vLLM was, and its own plan raises 16 to 528: no mismatch. And a mismatch is the model's, so every
    # data-parallel engine's advice carries the caveat (engine 1's carried none).
    from kvwatch.capacity.findings import engine_setting_mismatch

    assert engine_setting_mismatch({"block_size": 16}, {"block_size": "528"}, raised_block_size=528) is None
    assert engine_setting_mismatch({"block_size": 16}, {"block_size": "528"}) is not None
    import re

    from kvwatch.exposition import parse
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity
    from kvwatch.settings import ServeSettings

    text = (FIXTURES / "gen-0.20.2-gptoss-two-groups.prom").read_text()
    labels = dict(parse(text).samples("vllm:cache_config_info")[0].labels)
    plan, _ = build_sidecar_capacity(ServeSettings(gpu="H100", gpu_memory_utilization=0.88), "openai/gpt-oss-20b",
                                     labels)
    assert plan is not None  # the blocks are the plan's (two engines): the flag is the only difference
    text = re.sub(r'num_gpu_blocks="\d+"', f'num_gpu_blocks="{2 * plan.plan.num_gpu_blocks}"', text)
    lines = []
    for line in text.splitlines():
        lines.append(line)
        if 'engine="0"' in line:
            lines.append(line.replace('engine="0"', 'engine="1"'))
    page = tmp_path / "dp.prom"
    page.write_text("\n".join(lines) + "\n")
    main(["check", "--file", str(page), "--json", "--gpu", "H100", "--gpu-memory-utilization", "0.88"])
    report = json.loads(capsys.readouterr().out)
    assert not [f for f in report["findings"] if f["id"] == "capacity_mismatch"]
    assert [f["engine"] for f in report["findings"] if f["id"] == "engine_setting_mismatch"] == ["0"]
    for series in report["series"]:
        gains = [a for a in series["advice"] if a["action"] in ("quantize_kv_cache", "add_tensor_parallelism")]
        assert gains and all("does not describe this engine" in a["projected_effect"] for a in gains), series["engine"]
