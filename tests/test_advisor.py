"""The advisor ranks fixes cheapest first and sizes them with the capacity model when the model is known."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvwatch.advisor import ACTIONS, LIMIT_USAGE, Advice, advise
from kvwatch.capacity import DeploymentSpec, plan_capacity, resolve_model

GIB = 2**30


@pytest.fixture(scope="module")
def llama_plan():
    arch = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    return plan_capacity(DeploymentSpec(arch=arch, gpu_memory_bytes=80 * GIB, gpu_name="H100", max_model_len=32768))


CHAT = 5_000  # the longest request so far, prompt + output tokens (the length histograms' buckets)


@pytest.mark.parametrize("state", ["ok", "warming_up", "scheduler_limited", "stalled", "unknown"])
def test_no_advice_unless_filling_or_bottleneck(state, llama_plan):
    assert advise(state, recommended_max_concurrency=100, capacity_plan=llama_plan) == []


def test_no_capacity_fix_for_a_leak_but_for_an_idle_moment(llama_plan):
    # A full cache that no request holds (a leak: kvwatch.capacity.findings.leaking) gets no capacity fix:
    # limiting concurrency or adding GPUs cannot free it. A moment with nothing running below the leak level (or a
    # queue that may hold the KV) keeps the fixes: the sidecar's ranks must not flap with bursty traffic.
    from kvwatch.advisor import advise_from_result
    from kvwatch.forecast import ForecastResult
    from kvwatch.model import Reading

    result = ForecastResult(timestamp=0.0, state="bottleneck", eta_seconds=0.0, forecast_ratio={},
                            request_rate_per_second=1.0, headroom_requests_per_second=0.0,
                            recommended_max_concurrency=60, estimates={"capacity_tokens": 80_000.0})
    leak = Reading(model_name="m", kv_usage_ratio=0.97, requests_running=0, requests_waiting=12,
                   tokens_counted_every_step=True, waiting_holds_no_kv=True)
    assert advise_from_result(result, leak, capacity_plan=llama_plan) == []
    idle = Reading(model_name="m", kv_usage_ratio=0.93, requests_running=0, requests_waiting=3,
                   tokens_counted_every_step=True, waiting_holds_no_kv=True)
    assert advise_from_result(result, idle, capacity_plan=llama_plan)
    sglang = Reading(model_name="m", kv_usage_ratio=0.97, requests_running=0, requests_waiting=12)
    assert advise_from_result(result, sglang, capacity_plan=llama_plan)


def test_all_five_fixes_cheapest_first_with_the_model_known(llama_plan):
    advice = advise("bottleneck", recommended_max_concurrency=120, running=150, capacity_plan=llama_plan,
                    longest_request_tokens=CHAT, max_model_len=32768, kv_tokens_per_request=1300)
    assert [a.action for a in advice] == [a for a in ACTIONS if a != "add_replica"]  # (TP here: it helps)
    assert [a.rank for a in advice] == [1, 2, 3, 4, 5]
    limit, lower, quantize, kv_fp8, tp = advice
    # An FP8 KV cache: one byte per element instead of bf16's two, about twice the tokens.
    assert "x2.00" in kv_fp8.projected_effect and kv_fp8.vllm_args == ("--kv-cache-dtype", "fp8")
    assert "instead of the 2 the plan has" in kv_fp8.message
    assert "120" in limit.message and "150 running" in limit.message
    assert limit.vllm_args == ("--max-num-seqs", "120") and limit.concurrency == 120
    # No request longer than 5,000 tokens -> 8192 with margin: the worst-case ceiling rises 4x.
    assert "to 8192" in lower.message and "4.0x" in lower.projected_effect
    assert "longer than 5,000 tokens" in lower.message
    # (the pool is unchanged on V1 only: the V0 engine without chunked prefill grows it, which it said it did not)
    assert "With chunked prefill on (vLLM V1) the KV pool itself is unchanged" in lower.projected_effect
    assert "the pool grows a little" in lower.projected_effect
    assert "x1.1" in quantize.projected_effect  # FP8 weights free ~7.5 GB of an 80 GB card for KV
    assert "x2" in tp.projected_effect and tp.vllm_args == ("--tensor-parallel-size", "2")
    assert lower.vllm_args == ("--max-model-len", "8192") and quantize.vllm_args == ("--quantization", "fp8")


def test_an_unknown_pool_is_not_quoted_from_the_plan(llama_plan):
    # A page of two pods' cache_config_info sets leaves the engine's capacity unknown (check says so): the fixes
    # quoted the plan's pool as the engine's ("KV capacity 1,038,496 -> 1,152,304 tokens"). Ratios only, then.
    advice = advise("bottleneck", recommended_max_concurrency=120, running=150, capacity_plan=llama_plan,
                    max_model_len=32768, kv_tokens_per_request=1300)
    quantize, kv_fp8 = [a for a in advice if a.action in ("quantize_weights", "quantize_kv_cache")]
    for fix in (quantize, kv_fp8):
        assert "pool size is unknown" in fix.projected_effect and " tokens (x" not in fix.projected_effect
    known = advise("bottleneck", recommended_max_concurrency=120, running=150, capacity_plan=llama_plan,
                   max_model_len=32768, kv_tokens_per_request=1300, capacity_tokens=400_000.0)
    kv_fp8 = next(a for a in known if a.action == "quantize_kv_cache")
    assert "KV capacity 400,000 -> 800,0" in kv_fp8.projected_effect


def test_max_model_len_not_lowered_when_requests_use_it_or_the_longest_is_unknown():
    advice = advise("filling", recommended_max_concurrency=10, longest_request_tokens=CHAT, max_model_len=4096,
                    capacity_tokens=50_000)
    assert "lower_max_model_len" not in [a.action for a in advice]
    lowered = advise("filling", longest_request_tokens=1500, max_model_len=4096, capacity_tokens=50_000)
    assert [a.action for a in lowered] == ["lower_max_model_len", "add_replica"]
    assert "to 2048" in lowered[0].message
    # Means alone say nothing of the tail (4 x the mean, 5,464, proposed 8,192 where requests of 20k ran): without
    # the longest request from the buckets nothing is proposed.
    assert "lower_max_model_len" not in [a.action for a in advise(
        "filling", longest_request_tokens=None, max_model_len=32768, capacity_tokens=50_000)]


def test_the_longest_request_is_bounded_by_the_highest_occupied_buckets():
    from kvwatch.advisor import longest_request_bound
    from kvwatch.model import Histogram

    inf = float("inf")
    prompt = Histogram((1_000, 5_000, 10_000, 20_000, 50_000, inf), (10, 60, 90, 100, 100, 100), 100, 4e5)
    output = Histogram((100, 500, 1_000, inf), (50, 90, 100, 100), 100, 3e4)
    assert longest_request_bound({"prompt": prompt, "generation": output}) == 20_000 + 1_000
    spilled = Histogram(prompt.bounds, (10, 60, 90, 100, 100, 101), 101, 5e5)  # one request past every bound
    assert longest_request_bound({"prompt": spilled, "generation": output}) is None
    assert longest_request_bound({"prompt": prompt}) is None


def test_without_the_model_quantization_is_not_sized_and_tp_is_generic():
    advice = advise("filling", recommended_max_concurrency=40, capacity_tokens=80_000, kv_tokens_per_request=2000)
    assert [a.action for a in advice] == ["limit_concurrency", "add_replica"]
    assert "from 40.0 to 80.0 concurrent requests" in advice[1].projected_effect
    # Without a plan the size is unknown; the message names both things a plan needs (the model may be known
    # from model_name already, and then only --gpu was missing).
    assert "--gpu" in advice[1].message and "--model" in advice[1].message


def test_already_fp8_weights_are_not_advised_again():
    arch = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    plan = plan_capacity(DeploymentSpec(arch=arch, gpu_memory_bytes=80 * GIB, gpu_name="H100",
                                        max_model_len=32768, quantization="fp8"))
    actions = [a.action for a in advise("bottleneck", recommended_max_concurrency=50, capacity_plan=plan)]
    assert "quantize_weights" not in actions
    assert actions[0] == "limit_concurrency" and actions[-1] == "add_tensor_parallelism"


def test_advise_from_a_forecast_result_and_a_reading():
    from kvwatch.advisor import advise_from_result
    from kvwatch.forecast import ForecastResult
    from kvwatch.model import Histogram, Reading

    result = ForecastResult(
        timestamp=0.0, state="bottleneck", eta_seconds=0.0, forecast_ratio={600: 1.1, 1800: 1.2},
        request_rate_per_second=20.0, headroom_requests_per_second=-2.0, recommended_max_concurrency=60,
        estimates={"capacity_tokens": 80_000.0, "tokens_per_running_request": 1_300.0},
    )
    inf = float("inf")
    lengths = {"prompt": Histogram((2_000, 5_000, inf), (80, 100, 100), 100, 115_500),
               "generation": Histogram((500, 1_000, inf), (90, 100, 100), 100, 21_100)}
    reading = Reading(model_name="m", requests_running=70, request_prompt_tokens_sum=115_500,
                      request_prompt_tokens_count=100, request_generation_tokens_sum=21_100,
                      request_generation_tokens_count=100, lengths=lengths)
    advice = advise_from_result(result, reading, max_model_len=32768)
    assert [a.action for a in advice] == ["limit_concurrency", "lower_max_model_len", "add_replica"]
    assert advice[1].vllm_args == ("--max-model-len", "8192")  # at most 5,000 + 1,000 tokens, with 25 % margin
    # The forecaster said 60, but 95 % of the observed-mix ceiling (80,000 / 1,300 = 61.5) is 58.
    assert advice[0].concurrency == 58 and "70 running" in advice[0].message
    ok = ForecastResult(**{**result.__dict__, "state": "ok"})
    assert advise_from_result(ok, reading) == []


def _plan(model: str, tp: int = 1):
    arch = resolve_model(model)
    return plan_capacity(DeploymentSpec(arch=arch, gpu_memory_bytes=80 * GIB, gpu_name="H100",
                                        max_model_len=32768, tensor_parallel_size=tp))


def test_next_tensor_parallel_size_divides_the_heads_and_stays_in_the_node():
    from kvwatch.advisor import next_tensor_parallel_size
    from kvwatch.capacity.architecture import ModelArch

    def heads(attention: int, kv: int) -> ModelArch:
        return ModelArch("m", num_layers=32, num_attention_heads=attention, num_kv_heads=kv, head_dim=128,
                         hidden_size=4096, vocab_size=32000)

    assert next_tensor_parallel_size(heads(32, 8), 1, 8) == 2
    assert next_tensor_parallel_size(heads(32, 8), 2, 8) == 4
    assert next_tensor_parallel_size(heads(32, 8), 8, 8) is None  # a full node: a replica instead
    assert next_tensor_parallel_size(heads(32, 8), 8, 16) == 16  # heads replicated beyond 8
    assert next_tensor_parallel_size(heads(28, 4), 1, 8) == 2
    assert next_tensor_parallel_size(heads(28, 4), 4, 8) is None  # 7 divides 28 but not the 4 KV heads; 8 not 28
    assert next_tensor_parallel_size(heads(40, 8), 4, 8) == 8  # 5 divides 40 heads but not 8 KV heads
    assert next_tensor_parallel_size(heads(64, 8), 1, 1) is None


def test_tp_advice_names_the_next_valid_size_with_its_flag():
    advice = advise("bottleneck", capacity_plan=_plan("meta-llama/Llama-3.1-8B-Instruct", tp=2),
                    kv_tokens_per_request=1300)
    tp = advice[-1]
    assert tp.action == "add_tensor_parallelism"
    assert tp.vllm_args == ("--tensor-parallel-size", "4") and "from 2 to 4" in tp.message
    assert "replicated" not in tp.message and "x2" not in tp.message


def test_tp_advice_beyond_one_node_says_add_a_replica():
    plan = _plan("meta-llama/Llama-3.1-8B-Instruct", tp=4)
    tp = advise("bottleneck", capacity_plan=plan, kv_tokens_per_request=1300, gpus_per_node=4)[-1]
    assert tp.vllm_args is None and tp.message.startswith("Add a replica")
    assert "4-GPU node" in tp.message


def test_tp_advice_says_when_kv_heads_are_replicated():
    plan = _plan("meta-llama/Llama-3.1-8B-Instruct", tp=8)
    tp = advise("bottleneck", capacity_plan=plan, kv_tokens_per_request=1300, gpus_per_node=16)[-1]
    assert "8 KV heads are replicated" in tp.message
    # the KV per token stops shrinking, so 8 more GPUs as a replica serve more than TP 16 does: no flag to paste
    assert tp.message.startswith("Add a replica") and tp.vllm_args is None


def test_the_limit_never_exceeds_the_observed_mix_ceiling():
    # The forecaster's mix says 233, the ceiling the report shows (finished-request mean) says 222.
    advice = advise("bottleneck", recommended_max_concurrency=233, running=240, capacity_tokens=200_000,
                    kv_tokens_per_request=800, concurrency_ceiling=222.0)
    limit = advice[0]
    assert limit.concurrency is not None and limit.concurrency <= 222
    assert limit.concurrency == math.floor(LIMIT_USAGE * 222.0)
    assert "~222.0" in limit.message
    # A forecast below the cap is kept.
    low = advise("bottleneck", recommended_max_concurrency=100, concurrency_ceiling=222.0)[0]
    assert low.concurrency == 100


def test_the_max_model_len_fix_sizes_its_effect_with_the_models_groups():
    # gpt-oss-20b: half its layers slide over 128 tokens, so a quarter of the length does not give four times
    # the requests (the fix said "rises 4.0x" from capacity / length); the figures are vLLM's, from the layout.
    from kvwatch.capacity.kv import max_concurrency_at_max_model_len

    plan = plan_capacity(DeploymentSpec(arch=resolve_model("openai/gpt-oss-20b"), gpu_memory_bytes=80 * GIB,
                                        gpu_name="H100", max_model_len=32768))
    (lower,) = [a for a in advise("bottleneck", capacity_plan=plan, longest_request_tokens=5_000, max_model_len=32768)
                if a.action == "lower_max_model_len"]
    now = max_concurrency_at_max_model_len(plan.layout, plan.num_gpu_blocks, 32768, plan.in_flight_tokens)
    after = max_concurrency_at_max_model_len(plan.layout, plan.num_gpu_blocks, 8192, plan.in_flight_tokens)
    assert f"from {now:.1f} to {after:.1f} requests" in lower.projected_effect
    assert f"{after / now:.1f}x" in lower.projected_effect and after / now < 3.5


def test_a_fixed_pool_gets_no_memory_fix(llama_plan):
    # --num-gpu-blocks-override fixes vLLM's pool: quantized weights or more TP free memory it never uses.
    advice = advise("bottleneck", recommended_max_concurrency=100, running=120, capacity_plan=llama_plan,
                    capacity_tokens=64_000, kv_tokens_per_request=600, fixed_blocks=4000)
    assert [a.action for a in advice] == ["limit_concurrency", "add_replica"]
    assert "remove --num-gpu-blocks-override (4,000 blocks)" in advice[-1].message
    assert advice[-1].engine_args is None and "replica" in advice[-1].message


def test_the_adapter_reads_the_override_when_the_block_count_is_not_labelled():
    # vLLM 0.8.x labels cache_config_info before the engine core reports num_gpu_blocks (None); with an override
    # that is the count (the formula's 443,696 tokens was used instead of 64,000).
    from kvwatch.engines import vllm
    from kvwatch.exposition import parse

    text = ('vllm:gpu_cache_usage_perc{model_name="m"} 0.5\nvllm:num_requests_running{model_name="m"} 3\n'
            'vllm:num_requests_waiting{model_name="m"} 0\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="None",num_gpu_blocks_override="4000"} 1.0\n')
    (reading,) = vllm.read(parse(text), timestamp=0.0).readings
    assert reading.kv_capacity_tokens == 64_000.0


def test_the_runbooks_flag_table_is_the_advisors():
    # docs/runbooks.md tells SGLang and TensorRT-LLM users which of their flags each vLLM flag stands for.
    from pathlib import Path

    from kvwatch.advisor import ENGINE_FLAGS, SGLANG, TENSORRT_LLM, TRITON_TENSORRT_LLM, VLLM

    text = (Path(__file__).parents[1] / "docs" / "runbooks.md").read_text()
    rows = {line.split("|")[1].strip(): [c.strip().strip("`") for c in line.split("|")[2:6]]
            for line in text.splitlines() if line.startswith("| ") and line.count("|") == 6}
    names = {"concurrency": "concurrency", "max_model_len": "max-model-len", "quantization": "weight quantization",
             "tensor_parallel": "tensor parallelism", "token_budget": "token budget"}
    for key, row in names.items():
        expected = [ENGINE_FLAGS[kind][key] or "(the checkpoint's)"
                    for kind in (VLLM, SGLANG, TENSORRT_LLM, TRITON_TENSORRT_LLM)]
        assert rows[row] == expected, row


def test_advice_from_a_reading_names_that_engines_flags_unless_told_otherwise() -> None:
    # The sidecar called advise_from_result without an engine kind: an SGLang series was told "--max-num-seqs".
    from dataclasses import replace

    from kvwatch.advisor import advise_from_result
    from kvwatch.forecast import Forecaster, ForecastSample
    from kvwatch.model import SGLANG, Reading

    reading = Reading(model_name="m", engine_kind=SGLANG, kv_usage_ratio=0.94, requests_running=30,
                      requests_waiting=12, kv_capacity_tokens=100_000.0)
    result = Forecaster().observe(ForecastSample.from_reading(reading, 0.0))
    result = replace(result, state="bottleneck", estimates={**result.estimates, "tokens_per_running_request": 3133.0})
    fixes = advise_from_result(result, reading, concurrency_ceiling=31.9)
    limit = next(a for a in fixes if a.action == "limit_concurrency")
    assert limit.engine_args[0] == "--max-running-requests" and limit.engine_kind == SGLANG
    told = advise_from_result(result, reading, concurrency_ceiling=31.9, engine_kind="vllm")
    assert next(a for a in told if a.action == "limit_concurrency").engine_args[0] == "--max-num-seqs"


def test_a_fixs_ceiling_is_the_what_if_gauges_on_a_mamba_hybrid() -> None:
    # On Granite-4.0-H an FP8 KV cache halves the attention pages, not the Mamba state pages: the
    # tokens grow x1.53, the ceiling at the observed mix less. check's advice applied the tokens' ratio to the ceiling
    # (40.4 -> 61.7) while serve's kvwatch_whatif_max_concurrency said 51.9: one figure now, from the same ratio.
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity
    from kvwatch.settings import ServeSettings

    sidecar, why = build_sidecar_capacity(ServeSettings(gpu="H100", max_model_len=32768),
                                          "ibm-granite/granite-4.0-h-small")
    assert sidecar is not None, why
    capacity, ceiling = float(sidecar.plan.kv_cache_tokens), 40.0
    advice = advise("bottleneck", running=37, capacity_tokens=capacity, capacity_plan=sidecar.plan,
                    concurrency_ceiling=ceiling)
    fp8 = next(a for a in advice if a.action == "quantize_kv_cache")
    gauge = sidecar.whatif_max_concurrency(capacity / ceiling, ceiling)["fp8_kv_cache"]
    tokens_ratio = sidecar.plan.kv_cache_tokens and next(
        s for s in sidecar.scenarios if s.name == "fp8_kv_cache").kv_cache_tokens / sidecar.plan.kv_cache_tokens
    assert f"from {ceiling:.1f} to {gauge:.1f} concurrent" in fp8.projected_effect
    assert abs(gauge / ceiling - tokens_ratio) > 0.05  # (the case: the ceiling does not follow the tokens)


def _tp_advice(model: str, running: float, request_tokens: float, **flags: object) -> Advice:
    """The last advice (add_tensor_parallelism, or add_replica where more TP cannot help) for ``model`` served with
    ``flags``, KV-bound at a mix of requests of ``request_tokens`` each."""
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity
    from kvwatch.settings import ServeSettings

    sidecar, why = build_sidecar_capacity(ServeSettings(**flags), model)
    assert sidecar is not None, why
    capacity = float(sidecar.plan.kv_cache_tokens)
    advice = advise("bottleneck", running=running, capacity_tokens=capacity, capacity_plan=sidecar.plan,
                    concurrency_ceiling=capacity / request_tokens)
    return next(a for a in advice if a.action in ("add_tensor_parallelism", "add_replica"))


def test_more_tensor_parallelism_that_lowers_the_ceiling_is_not_advised() -> None:
    # Gemma-3-1B has one KV head: at TP 2 each GPU keeps a copy, the KV per token does not
    # shrink, and the ceiling at the observed mix falls (x0.99). The advice said "Raise --tensor-parallel-size from
    # 1 to 2 ... the ceiling goes from 1535.6 to 1514.0"; it says to add a replica, and why not more TP.
    tp = _tp_advice("google/gemma-3-1b-it", 1500, 1600, gpu="H100")
    assert tp.message.startswith("Add a replica") and "would not raise this ceiling" in tp.message
    assert tp.engine_args is None and "1 KV head is replicated" in tp.message


def test_more_tensor_parallelism_that_gains_less_than_a_replica_is_not_advised() -> None:
    # Qwen2.5-1.5B has 2 KV heads: from TP 2 to 4 each pair of GPUs keeps a copy, the KV per
    # token stops shrinking and the ceiling gained x1.05 for 2 more GPUs, where those GPUs as a replica serve x2. The
    # advice read "Raise --tensor-parallel-size from 2 to 4" with the flag to paste; it says to add a replica.
    tp = _tp_advice("Qwen/Qwen2.5-1.5B-Instruct", 80, 1500, gpu="L4", tensor_parallel_size=2)
    assert tp.message.startswith("Add a replica") and "(2 more GPUs per replica)" in tp.message, tp.message
    assert "for x2.00 the GPUs" in tp.message
    assert tp.engine_args is None and "2 KV heads are replicated" in tp.message
    # a model whose KV heads split further keeps the TP advice (Llama-3.1-8B: 8 KV heads, TP 1 -> 2 gains > x2)
    tp = _tp_advice("meta-llama/Llama-3.1-8B-Instruct", 20, 1500, gpu="L4")
    assert tp.engine_args == ("--tensor-parallel-size", "2"), tp.message


def test_the_tp_fix_counts_every_pipeline_stages_gpus_and_says_why_mla_gains_little() -> None:
    # TP 1 -> 2 at PP 2 adds a GPU to each stage: 2 per replica, where the text said 1; an MLA
    # model's small gain had no reason given (every GPU keeps the whole latent)
    staged = _tp_advice("meta-llama/Llama-3.1-8B-Instruct", 80, 1500, gpu="H100", pipeline_parallel_size=2)
    assert "from 1 to 2 (2 more GPUs per replica)" in staged.message
    mla = _tp_advice("deepseek-ai/DeepSeek-V2-Lite-Chat", 80, 1500, gpu="H100")
    assert mla.message.startswith("Add a replica") and "Every GPU keeps the whole MLA latent" in mla.message


def test_a_server_showing_more_tensor_parallel_ranks_than_planned_gets_a_replica_in_the_sidecar_too(llama_plan):
    # check turned the TP fix into a replica on a page of two tp_ranks planned at TP 1; the sidecar, calling the
    # advisor directly, still ranked "raise --tp-size from 1 to 2", the size the server runs.
    from kvwatch.advisor import ADD_REPLICA, ADD_TENSOR_PARALLELISM, advise_from_result
    from kvwatch.forecast import ForecastResult
    from kvwatch.model import SGLANG, Reading

    result = ForecastResult(timestamp=0.0, state="bottleneck", eta_seconds=0.0, forecast_ratio={},
                            request_rate_per_second=1.0, headroom_requests_per_second=0.0,
                            recommended_max_concurrency=60, estimates={"capacity_tokens": 80_000.0})
    for ranks, action in ((2, ADD_REPLICA), (1, ADD_TENSOR_PARALLELISM), (None, ADD_TENSOR_PARALLELISM)):
        reading = Reading(model_name="m", engine_kind=SGLANG, kv_usage_ratio=0.97, requests_running=40,
                          requests_waiting=5, tensor_parallel_ranks=ranks)
        fixes = advise_from_result(result, reading, capacity_plan=llama_plan)
        last = fixes[-1]
        assert last.action == action, ranks
        assert (last.engine_args is None) == (action == ADD_REPLICA)
        assert [a.rank for a in fixes] == list(range(1, len(fixes) + 1))


def test_no_tp_flag_is_sized_from_a_plan_that_leaves_no_kv_cache(capsys: pytest.CaptureFixture[str]) -> None:
    # A serving engine whose plan at the given TP has no KV cache (an 80B model on one H100: kvwatch was not told its
    # TP): the fix read "Raise --tp-size from 1 to 2", pasteable, where TP 2 leaves no KV cache either
    import json

    from kvwatch.cli import main

    page = Path(__file__).parent / "fixtures" / "sglang-metrics" / "gen-0.5-mamba-hybrid-full-pool-only.prom"
    assert main(["check", "--file", str(page), "--gpu", "H100", "--json"]) == 0
    fixes = json.loads(capsys.readouterr().out)["series"][0]["advice"]
    assert not [a for a in fixes if a["action"] == "add_tensor_parallelism"]
    (replica,) = [a for a in fixes if a["action"] == "add_replica"]
    # (kvwatch's own flag: it has no --tp-size)
    assert replica["engine_args"] is None
    assert "pass kvwatch --tensor-parallel-size with the --tp-size this server runs" in replica["message"]
