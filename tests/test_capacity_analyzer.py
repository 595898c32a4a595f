"""The capacity model inside serve: formula capacity beside vLLM's, what-if ceilings at the live mix."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvwatch.capacity.planner import DeploymentSpec, plan_capacity
from kvwatch.model import Reading
from kvwatch.serve.capacity import CapacityAnalyzer
from kvwatch.settings import ServeSettings

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def reading(**kw) -> Reading:
    base = dict(model_name=LLAMA, engine="0", kv_usage_ratio=0.5, requests_running=10.0,
                kv_capacity_tokens=400_000.0)
    base.update(kw)
    return Reading(**base)


def families(analyzer: CapacityAnalyzer, r: Reading) -> dict[str, list]:
    result = analyzer.analyze(r.key, None, r, 0.0)  # type: ignore[arg-type]
    assert result is not None
    return {f.name: f.samples for f in analyzer.families({r.key: result}, 0.0)}


def test_live_tokens_per_request_is_used_tokens_over_running() -> None:
    assert reading().kv_tokens_per_running_request == pytest.approx(20_000.0)
    assert reading(requests_running=0.0).kv_tokens_per_running_request is None
    assert reading(kv_capacity_tokens=None).kv_tokens_per_running_request is None


def test_formula_capacity_matches_the_planner_for_the_preset_named_by_vllm() -> None:
    settings = ServeSettings(gpu="H100")
    out = families(CapacityAnalyzer(settings), reading())
    expected = plan_capacity(DeploymentSpec.from_settings(settings.model_copy(update={"model": LLAMA})))
    [sample] = out["kvwatch_formula_kv_capacity_tokens"]
    assert sample.labels == {"model_name": LLAMA, "engine": "0"}
    assert sample.value == expected.kv_cache_tokens > 100_000


def test_whatif_ceilings_follow_the_live_mix_and_rank_fp8_above_today() -> None:
    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100"))
    small = {s.labels["scenario"]: s.value for s in families(analyzer, reading())["kvwatch_whatif_max_concurrency"]}
    large = {s.labels["scenario"]: s.value
             for s in families(analyzer, reading(kv_usage_ratio=1.0))["kvwatch_whatif_max_concurrency"]}
    assert {"fp8_kv_cache", "tensor_parallel_x2", "gpu_memory_utilization_0.95"} <= set(small)
    # Twice the tokens per request halves every ceiling.
    for name, value in small.items():
        assert large[name] == pytest.approx(value / 2)
    assert small["fp8_kv_cache"] > small["gpu_memory_utilization_0.95"] > small["gpu_memory_utilization_0.85"]


def test_whatif_ceilings_scale_the_engines_pool_not_the_formulas() -> None:
    # The engine reports 262,144 tokens where the formula says ~450,000 (e.g. a lower utilization than kvwatch
    # assumed): a what-if must not show a smaller setting with a higher ceiling than today's.
    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100"))
    r = reading(kv_capacity_tokens=262_144.0)
    whatif = {s.labels["scenario"]: s.value for s in families(analyzer, r)["kvwatch_whatif_max_concurrency"]}
    today = r.requests_running / r.kv_usage_ratio  # kvwatch_max_concurrency{basis="observed_mix"}
    assert whatif["gpu_memory_utilization_0.85"] < today < whatif["gpu_memory_utilization_0.95"]
    assert whatif["fp8_kv_cache"] == pytest.approx(2 * today, rel=0.01)
    assert whatif["max_model_len_halved"] == pytest.approx(today)  # the V1 pool does not change with the length


def test_whatif_ceilings_start_from_the_exported_ceiling_when_finished_requests_set_it() -> None:
    # A finished request averages 40,000 tokens, a running one holds 10,000 (400,000 × 0.25 ÷ 10): the finished
    # mean sets kvwatch_max_concurrency{observed_mix} (the smaller estimate), and the what-ifs must start from that
    # ceiling, not from the live footprint's (max_model_len_halved read 7 % above the ceiling on a live demo).
    from kvwatch.derived import max_concurrency

    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100"))
    r = reading(kv_usage_ratio=0.25, request_prompt_tokens_sum=30_000.0, request_prompt_tokens_count=1.0,
                request_generation_tokens_sum=10_000.0, request_generation_tokens_count=1.0)
    headline = max_concurrency(r, 40_000.0, None)["observed_mix"]
    assert headline == pytest.approx(400_000 / 40_000)
    assert headline < r.requests_running / r.kv_usage_ratio
    whatif = {s.labels["scenario"]: s.value for s in families(analyzer, r)["kvwatch_whatif_max_concurrency"]}
    assert whatif["max_model_len_halved"] == pytest.approx(headline)


def test_whatif_ceilings_of_an_engine_whose_pool_kvwatch_cannot_size_are_the_advices() -> None:
    # An SGLang engine reports no capacity kvwatch reads (its pool is sized its own way): check's
    # advice said "the ceiling goes from 31.9 to 63.8" (FP8 KV: today's x the plan's token ratio) and serve exported
    # no kvwatch_whatif_max_concurrency at all
    from kvwatch.model import SGLANG

    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100"))
    sglang = reading(model_name="Qwen/Qwen2.5-7B-Instruct", engine_kind=SGLANG, kv_capacity_tokens=None,
                     kv_usage_ratio=0.94, requests_running=30.0)
    whatif = {s.labels["scenario"]: s.value for s in families(analyzer, sglang)["kvwatch_whatif_max_concurrency"]}
    today = 30.0 / 0.94
    assert whatif["fp8_kv_cache"] == pytest.approx(2 * today, rel=0.01)


def test_unknown_model_or_gpu_exports_no_formula_and_does_not_raise() -> None:
    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100"))
    r = reading(model_name="my-private-finetune")
    for a, rr in ((analyzer, r), (CapacityAnalyzer(ServeSettings()), reading())):
        got = families(a, rr)
        assert got["kvwatch_formula_kv_capacity_tokens"] == [] and got["kvwatch_whatif_max_concurrency"] == []
        # the capacity itself is still the reading's (no cache_config_info here), and says so
        assert [s.labels["source"] for s in got["kvwatch_capacity_source_info"]] == ["engine_metric"]
    bare = reading(kv_capacity_tokens=None)
    assert analyzer.analyze(bare.key, None, replace(bare, model_name="x"), 0.0) is None  # type: ignore[arg-type]


def cache_config(**labels: str) -> dict[str, str]:
    return {"block_size": "16", "cache_dtype": "auto", "enable_prefix_caching": "True", "num_gpu_blocks": "30000",
            **labels}


def formula(analyzer: CapacityAnalyzer, r: Reading) -> float:
    return families(analyzer, r)["kvwatch_formula_kv_capacity_tokens"][0].value


def test_formula_uses_the_engines_utilization_and_kv_dtype_when_not_given() -> None:
    settings = ServeSettings(gpu="H100", max_model_len=8192)
    engine = reading(cache_config=cache_config(gpu_memory_utilization="0.9", cache_dtype="fp8",
                                               user_specified_block_size="False"))
    got = formula(CapacityAnalyzer(settings), engine)
    arch_settings = settings.model_copy(update={"model": LLAMA})
    at_090_fp8 = plan_capacity(DeploymentSpec.from_settings(  # user_specified_block_size: the 0.20 rules
        arch_settings.model_copy(update={"gpu_memory_utilization": 0.9, "kv_cache_dtype": "fp8"}),
        vllm_version=(0, 20)))
    at_092_auto = plan_capacity(DeploymentSpec.from_settings(arch_settings, vllm_version=(0, 20)))
    assert got == at_090_fp8.kv_cache_tokens
    assert got != at_092_auto.kv_cache_tokens  # what it was: vLLM's 0.92 default and a bf16 KV cache


def test_flags_win_over_the_engines_labels() -> None:
    settings = ServeSettings(gpu="H100", max_model_len=8192, gpu_memory_utilization=0.8, block_size=32)
    engine = reading(cache_config=cache_config(gpu_memory_utilization="0.9", block_size="16"))
    expected = plan_capacity(DeploymentSpec.from_settings(settings.model_copy(update={"model": LLAMA})))
    assert formula(CapacityAnalyzer(settings), engine) == expected.kv_cache_tokens


def test_version_rules_follow_the_label_set() -> None:
    from kvwatch.engines.vllm import vllm_version_from_cache_config
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity

    old = cache_config(gpu_memory_utilization="0.9", swap_space="4", cpu_offload_gb="0",
                       kv_offloading_backend="None")
    assert vllm_version_from_cache_config(old) == (0, 12)
    assert vllm_version_from_cache_config(cache_config(user_specified_block_size="False")) == (0, 20)
    assert vllm_version_from_cache_config(cache_config(kv_cache_size_tokens="163840")) == (0, 25)
    assert vllm_version_from_cache_config(cache_config(kv_cache_size_tokens="163840", prefix_match_unit="None")) \
        == (0, 26)
    assert vllm_version_from_cache_config(cache_config(prefix_match_unit="None", cache_hit_alignment_tokens="None")) \
        == (0, 32)
    assert vllm_version_from_cache_config(cache_config(swap_space_bytes="0.0")) == (0, 7)
    assert vllm_version_from_cache_config(cache_config(swap_space_bytes="0.0", cpu_offload_gb="0")) == (0, 7)
    # From 0.8.5 CacheConfig.__post_init__ adds swap_space_bytes beside swap_space (vllm-project/vllm#28924, 0.11.0)
    assert vllm_version_from_cache_config(cache_config(
        swap_space="0.0", swap_space_bytes="0.0", cpu_offload_gb="0.0", kv_cache_memory_bytes="None",
        engine="0")) == (0, 10)
    # ... and so does the V0 engine to 0.10 (VLLM_USE_V1=0), whose labels carry no engine: it shares no blocks among
    # KV groups, whatever CacheConfig's fields say (gemma-2 read at half its capacity).
    assert vllm_version_from_cache_config(cache_config(
        swap_space="0.0", swap_space_bytes="0.0", cpu_offload_gb="0.0", kv_cache_memory_bytes="None")) == (0, 8)
    assert vllm_version_from_cache_config(cache_config()) is None
    # Gemma-2 at max_model_len 20,001: before 0.20 tokens are blocks // groups x block_size, from 0.20 they are
    # int(concurrency x max_model_len); the engine's label set picks the rule serve has no flag for.
    settings = ServeSettings(gpu="H100", max_model_len=20001)
    before, _ = build_sidecar_capacity(settings, "google/gemma-2-9b-it", old)
    new = cache_config(gpu_memory_utilization="0.9", user_specified_block_size="False")
    after, _ = build_sidecar_capacity(settings, "google/gemma-2-9b-it", new)
    assert before is not None and after is not None
    assert before.plan.spec.vllm_version == (0, 12) and after.plan.spec.vllm_version == (0, 20)
    assert before.plan.num_gpu_blocks == after.plan.num_gpu_blocks
    assert before.plan.kv_cache_tokens != after.plan.kv_cache_tokens
    # 0.18.0-0.20.x share that label set: the plan says so rather than pretending to know the release.
    assert any("which 0.18.0 to 0.20.x share" in n for n in after.plan.notes)
    assert not any("0.20.x share" in n for n in before.plan.notes)
    layout, blocks = before.plan.layout, before.plan.num_gpu_blocks
    assert before.plan.kv_cache_tokens == blocks // layout.num_groups * layout.block_size


def test_kv_cache_memory_bytes_label_replaces_the_budget() -> None:
    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100", max_model_len=8192))
    r = reading(cache_config=cache_config(kv_cache_memory_bytes=str(20 * 2**30)))
    assert formula(analyzer, r) == 20 * 2**30 // (16 * 131072) * 16  # 20 GiB of 128 KiB tokens


def test_under_kv_cache_memory_bytes_only_a_smaller_kv_per_token_adds_tokens() -> None:
    # vLLM takes --kv-cache-memory-bytes as the pool whatever the utilization or the memory the
    # weights leave (vllm/v1/worker/gpu_worker.py): the utilization what-ifs read 44.75 and 28.9 against 40 today
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity

    capacity, _ = build_sidecar_capacity(ServeSettings(gpu="H100", max_model_len=8192), LLAMA,
                                         cache_config(kv_cache_memory_bytes=str(20 * 2**30)))
    assert capacity is not None
    tokens = capacity.plan.kv_cache_tokens
    by_name = {s.name: s for s in capacity.scenarios}
    for unchanged in ("gpu_memory_utilization_0.85", "gpu_memory_utilization_0.95", "fp8_weights"):
        assert by_name[unchanged].kv_cache_tokens == tokens, unchanged
        assert "--kv-cache-memory-bytes" in by_name[unchanged].note
    assert by_name["fp8_kv_cache"].kv_cache_tokens == 2 * tokens
    assert by_name["tensor_parallel_x2"].kv_cache_tokens == 2 * tokens  # Llama's 8 KV heads split over 2
    ceilings = capacity.whatif_max_concurrency(4096, tokens / 4096)
    assert ceilings["gpu_memory_utilization_0.95"] == ceilings["fp8_weights"] == tokens / 4096


def test_serve_reasons_do_not_point_at_plan_only_flags() -> None:
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity

    none, why = build_sidecar_capacity(ServeSettings(), LLAMA, cache_config())
    assert none is None and "--gpu" in why
    assert "--available-kv-gib" not in why and "--weights-gib" not in why


def test_formula_help_names_the_cuda_graph_memory() -> None:
    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100"))
    r = reading()
    result = analyzer.analyze(r.key, None, r, 0.0)  # type: ignore[arg-type]
    formula = next(f for f in analyzer.families({r.key: result}, 0.0) if f.name == "kvwatch_formula_kv_capacity_tokens")
    assert "CUDA-graph" in formula.documentation and "0.21" in formula.documentation


def test_a_malformed_model_config_turns_the_model_off_once_not_every_poll(tmp_path, caplog) -> None:
    import json
    import logging

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
                                  "hidden_size": 4096, "vocab_size": 128256, "intermediate_size": 14336,
                                  "quantization_config": {"quant_method": "gptq", "bits": "4bit"}}))
    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100", model_config_path=config))
    with caplog.at_level(logging.INFO, logger="kvwatch"):
        for _ in range(3):
            result = analyzer.analyze(reading().key, None, reading(), 0.0)  # type: ignore[arg-type]
            assert result is not None and result.formula_kv_capacity_tokens is None
    off = [r for r in caplog.records if "capacity model off" in r.getMessage()]
    assert len(off) == 1 and "config.json" in off[0].getMessage()
    assert off[0].levelno == logging.WARNING  # a model config kvwatch was given and cannot read is a setting to fix
    assert not any(r.exc_info for r in caplog.records)


def test_hybrid_mamba_keeps_the_attention_block_size_and_says_so_once() -> None:
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity

    capacity, why = build_sidecar_capacity(ServeSettings(gpu="H100"), "ibm-granite/granite-4.0-h-small",
                                           {"block_size": "64", "gpu_memory_utilization": "0.9"})
    assert capacity is not None, why
    notes = " | ".join(capacity.plan.notes)
    assert "block_size 64" not in notes and "gpu_memory_utilization 0.9" in notes
    assert "rewrites cache_config_info's block_size, so 16 is used" in notes


def test_a_hybrid_engines_prefix_caching_and_mamba_mode_come_from_its_labels() -> None:
    # vLLM >= 0.26 runs hybrid models with prefix caching in mamba_cache_mode "align" (2-3 state blocks per
    # request and Mamba group); the engine's cache_config_info says which it runs.
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity

    settings = ServeSettings(gpu="H100", max_model_len=8192)
    held = {}
    for caching, mode in (("True", "align"), ("False", "none")):
        labels = cache_config(kv_cache_size_tokens="100000", prefix_match_unit="None",
                              enable_prefix_caching=caching, mamba_cache_mode=mode)
        capacity, _ = build_sidecar_capacity(settings, "ibm-granite/granite-4.0-h-small", labels)
        assert capacity is not None and capacity.plan.spec.vllm_version == (0, 26)
        held[mode] = capacity.plan.layout.mamba_blocks_per_request
    assert held == {"align": 2, "none": 1}  # Mamba2's prefill checkpoint block comes with 0.32
    current = cache_config(prefix_match_unit="None", cache_hit_alignment_tokens="None", enable_prefix_caching="True",
                           mamba_cache_mode="align")
    capacity, _ = build_sidecar_capacity(settings, "ibm-granite/granite-4.0-h-small", current)
    assert capacity is not None and capacity.plan.layout.mamba_blocks_per_request == 3



def test_the_plan_cache_tells_engines_apart_by_every_label_the_formula_reads() -> None:
    # The resolver caches one plan per model and engine configuration; the labels added for the version rules and
    # the Mamba state blocks must be part of that key, or a second engine borrowed the first one's plan.
    from kvwatch.serve.sidecar_capacity import CapacityResolver

    resolver = CapacityResolver(ServeSettings(gpu="H100", max_model_len=8192))
    held = []
    for mode in ("align", "none"):
        labels = cache_config(prefix_match_unit="None", cache_hit_alignment_tokens="None", mamba_cache_mode=mode)
        capacity, _ = resolver.sidecar(reading(model_name="ibm-granite/granite-4.0-h-small", cache_config=labels))
        assert capacity is not None
        held.append(capacity.plan.layout.mamba_blocks_per_request)
    assert held == [3, 1]


def test_the_formula_gauge_is_in_the_engine_figures_terms() -> None:
    # check compares the engine's blocks // groups x block_size with the formula in those terms;
    # serve exported the formula's 0.20 figure, int(concurrency x max_model_len): gpt-oss-20b read +59 % above the
    # engine (1,906,985 vs 1,196,048) where the formula's blocks were the engine's within one. One figure for both.
    from pathlib import Path

    from kvwatch.engines import vllm
    from kvwatch.exposition import parse

    text = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.20.2-gptoss-two-groups.prom").read_text()
    r = vllm.read(parse(text, vllm.wanted_for(None)), None, timestamp=0.0).readings[0]
    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100", max_model_len=32768))
    engine = 149_506 // 2 * 16
    assert formula(analyzer, r) == pytest.approx(engine, rel=0.001)


def test_whatif_ceilings_scale_the_engines_pool_before_any_ceiling() -> None:
    # At 1 % usage with no request finished there is no observed-mix ceiling: the what-ifs read
    # the formula's own ceilings (899.7 for max_model_len_halved beside today's 200 at this pool and mix).
    analyzer = CapacityAnalyzer(ServeSettings(gpu="H100"))
    r = reading(kv_capacity_tokens=100_000.0, kv_usage_ratio=0.01, requests_running=2.0)
    whatif = {s.labels["scenario"]: s.value for s in families(analyzer, r)["kvwatch_whatif_max_concurrency"]}
    today = r.requests_running / r.kv_usage_ratio  # the pool at the live footprint
    assert whatif["max_model_len_halved"] == pytest.approx(today)
    assert whatif["fp8_kv_cache"] == pytest.approx(2 * today, rel=0.01)


def test_vllms_refusals_are_logged_only_where_vllm_serves(caplog) -> None:
    # An 80B model on one H100: vLLM would not start. On an SGLang page serving it (with its own pool) the log read
    # "vLLM will not start" beside the engine serving it; check says that only of vLLM pages.
    import logging

    from kvwatch.model import SGLANG

    model = "Qwen/Qwen3-Next-80B-A3B-Instruct"
    for kind, logged in ((SGLANG, False), ("vllm", True)):
        caplog.clear()
        analyzer = CapacityAnalyzer(ServeSettings(gpu="H100"))
        r = replace(reading(), model_name=model, engine_kind=kind)
        with caplog.at_level(logging.INFO, logger="kvwatch"):
            analyzer.analyze(r.key, None, r, 0.0)  # type: ignore[arg-type]
        assert any("will not start" in rec.getMessage() for rec in caplog.records) == logged, kind


def test_a_vllm_0_34_engine_restarted_with_an_override_gets_the_classic_sums():
    # The sidecar's plan per engine configuration did not know num_gpu_blocks_override: an engine restarted with one
    # kept the cached plan of its extensible KV cache (no formula figure, no memory refusals).
    from pathlib import Path

    from kvwatch.payload import interpret
    from kvwatch.serve.sidecar_capacity import CapacityResolver

    page = (Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.34-extensible-kv.prom").read_text()
    resolver = CapacityResolver(ServeSettings(model="Qwen/Qwen2.5-32B-Instruct", gpu="H100", max_model_len=32768))
    for text, measured in ((page, True), (page.replace('num_gpu_blocks_override="None"',
                                                       'num_gpu_blocks_override="641"'), False)):
        capacity, _ = resolver.sidecar(interpret(text, None, timestamp=0.0).readings[0])
        assert capacity is not None and capacity.plan.pool_measured_by_engine is measured
        # the scenarios that change the memory left are 0.33's sums' to size: not exported for a measured pool
        whatif = capacity.whatif_max_concurrency(2500.0, 16.4)
        assert ("fp8_weights" in whatif) is not measured and ("tensor_parallel_x2" in whatif) is not measured
        assert "fp8_kv_cache" in whatif
