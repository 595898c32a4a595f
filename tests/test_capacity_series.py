"""One capacity per series (kvwatch.capacity.series + serve's resolver): the engine's figures first, then the
formula; every consumer (capacity exporter, forecaster and advice, check) reads the same object, and the
source is exported. Payloads: tests/fixtures/vllm-metrics (README there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.capacity.series import resolve
from kvwatch.cli import main
from kvwatch.payload import ScrapeError, interpret
from kvwatch.serve import capacity as capacity_module
from kvwatch.serve import forecast as forecast_module
from kvwatch.serve.sidecar_capacity import CapacityResolver
from kvwatch.settings import ServeSettings

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-metrics"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
pytestmark = pytest.mark.usefixtures("no_kvwatch_env")


def readings(name: str, model: str | None = None):
    text = (FIXTURES / name).read_text()
    out = interpret(text, None, timestamp=0.0).readings
    if model is not None:
        from dataclasses import replace

        out = tuple(replace(r, model_name=model) for r in out)
    return out


def test_engine_figures_come_first():
    r033 = readings("gen-0.33-dp2-capacity-labels.prom")[0]
    assert resolve(r033, None).source == "engine_kv_cache_size_tokens"
    assert resolve(r033, None).tokens == 163840
    r09 = readings("gen-0.9-both-usage-names.prom")[0]
    assert resolve(r09, None).source == "engine_num_gpu_blocks" and resolve(r09, None).tokens == 12000 * 16


def test_formula_when_the_engine_reports_none():
    # vLLM 0.8.5 emitted cache_config_info before the engine knew num_gpu_blocks ("None", vllm issue 15538)
    r = readings("gen-0.8.5-engine-label.prom", LLAMA)[0]
    assert r.kv_capacity_tokens is None
    assert resolve(r, None).source == "unknown"
    settings = ServeSettings(gpu="H100", max_model_len=8192)
    series = CapacityResolver(settings).series(r)
    assert series.source == "formula" and series.tokens == series.formula_tokens > 0
    assert series.apply(r).kv_capacity_tokens == series.tokens
    assert series.apply(r).kv_used_tokens == pytest.approx(r.kv_usage_ratio * series.tokens)


def test_the_exporter_and_the_forecasters_advice_read_one_object():
    settings = ServeSettings(gpu="H100", max_model_len=8192)
    resolver = CapacityResolver(settings)  # the sidecar's one, as kvwatch.serve.app.run hands it out
    exporter = capacity_module.make_analyzer(settings, resolver)
    forecaster = forecast_module.make_analyzer(settings, resolver)
    r = readings("gen-0.16-sleep-state-dp2.prom", LLAMA)[0]  # the engine runs at 0.9 with an fp8 KV cache
    exported = exporter._plan(r)
    _, advice_plan = forecaster._capacity(r)
    assert exported is not None and advice_plan is exported.plan  # the same object, not an equal copy
    # before, the advice planned at vLLM's 0.92 default with a bf16 cache, ignoring cache_config_info
    assert advice_plan.gpu_memory_utilization == 0.9 and advice_plan.spec.kv_cache_dtype == "fp8"


def test_source_and_pool_are_exported():
    settings = ServeSettings(gpu="H100", max_model_len=8192)
    exporter = capacity_module.make_analyzer(settings, CapacityResolver(settings))
    r = readings("gen-0.33-dp2-capacity-labels.prom", LLAMA)[0]
    result = exporter.analyze(r.key, None, r, 0.0)
    fams = {f.name: f.samples for f in exporter.families({r.key: result}, 0.0)}
    [source] = fams["kvwatch_capacity_source_info"]
    assert source.labels["source"] == "engine_kv_cache_size_tokens" and source.value == 1
    [pool] = fams["kvwatch_kv_cache_pool_bytes"]
    # 20,480 blocks (per engine) × 16 tokens × 128 KiB per token (Llama-3.1-8B, bf16): the reference's 20 GiB
    assert pool.labels["source"] == "engine_num_gpu_blocks" and pool.value == 20 * 2**30


def test_a_given_pool_is_the_engines():
    from dataclasses import replace

    r = readings("gen-0.33-dp2-capacity-labels.prom", LLAMA)[0]
    r = replace(r, cache_config={**r.cache_config, "kv_cache_memory_bytes": str(12 * 2**30)})
    series = resolve(r, None)
    assert series.pool_bytes == 12 * 2**30 and series.pool_source == "engine_kv_cache_memory_bytes"


def test_check_reports_the_source(capsys):
    assert main(["check", "--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom"), "--json"]) == 0
    series = json.loads(capsys.readouterr().out)["series"]
    assert {s["capacity_source"] for s in series} == {"engine_kv_cache_size_tokens"}


def test_serve_fills_a_missing_capacity_for_every_consumer():
    """vLLM 0.8.5 (num_gpu_blocks "None"): with the model and card known, kvwatch_kv_capacity_tokens, the
    forecaster and the source gauge all carry the formula's one figure."""
    import httpx
    import respx

    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar, load_analyzers

    url = "http://vllm.test/metrics"
    settings = ServeSettings(target_url=url, gpu="H100", max_model_len=8192)
    with respx.mock, Fetcher(url, timeout=1.0, max_body_bytes=1 << 20) as fetcher:
        respx.get(url).mock(return_value=httpx.Response(
            200, text=(FIXTURES / "gen-0.8.5-engine-label.prom").read_text()))
        resolver = CapacityResolver(settings)
        state = Sidecar(settings, fetcher, lambda: 1000.0, load_analyzers(settings, resolver), capacity=resolver).poll()
    [series] = state.series.values()
    formula = resolver.series(series.reading).formula_tokens
    assert series.reading.kv_capacity_tokens == formula > 0
    assert series.extra["capacity"].source == "formula"
    assert series.extra["forecast"].result.estimates.get("capacity_tokens", formula) == formula


def test_the_formula_plans_at_the_engines_max_model_len_unless_given_one():
    r = readings("gen-0.33-dp2-capacity-labels.prom", LLAMA)[0]  # the engine runs 8,192 (163,840 tokens at 20.0x)
    taken, _ = CapacityResolver(ServeSettings(gpu="H100")).sidecar(r)
    assert taken is not None and taken.plan.max_model_len == 8192
    assert any("max_model_len 8192" in note for note in taken.plan.notes)
    given, _ = CapacityResolver(ServeSettings(gpu="H100", max_model_len=32768)).sidecar(r)
    assert given is not None and given.plan.max_model_len == 32768  # a given setting is never replaced


def test_serve_warns_once_about_a_max_model_len_other_than_the_engines(caplog):
    engines = readings("gen-0.33-dp2-capacity-labels.prom", LLAMA)
    analyzer = capacity_module.make_analyzer(ServeSettings(gpu="H100", max_model_len=32768),
                                             CapacityResolver(ServeSettings(gpu="H100", max_model_len=32768)))
    with caplog.at_level("WARNING", logger="kvwatch.serve.capacity"):
        for _ in range(3):
            for r in engines:
                analyzer.analyze(r.key, None, r, 0.0)
    warned = [m for m in caplog.messages if "the engine runs 8,192" in m]
    assert len(warned) == 1


def test_the_engines_blocks_are_divided_among_the_models_kv_groups():
    # vLLM 0.9-0.19 on an interleaved sliding-window model: full and sliding layers are two groups sharing the
    # pool, and vLLM reports blocks // 2 × block_size (its "GPU KV cache size" line; the payload's
    # sliding_window label is None on such models, so only the model's layout says so).
    dense = readings("gen-0.9-both-usage-names.prom", LLAMA)[0]
    gemma = readings("gen-0.9-both-usage-names.prom", "google/gemma-2-9b-it")[0]
    resolver = CapacityResolver(ServeSettings(gpu="H100"))
    assert resolver.sidecar(gemma)[0].plan.layout.num_groups == 2
    series = resolver.series(gemma)
    assert (series.source, series.tokens) == ("engine_num_gpu_blocks", 12000 // 2 * 16)
    assert series.apply(gemma).kv_capacity_tokens == 96000 and gemma.kv_capacity_tokens == 192000
    assert resolver.series(dense).tokens == 12000 * 16 == resolver.series(dense).apply(dense).kv_capacity_tokens
    assert resolve(gemma, None).tokens == 192000  # without the model's layout: the adapter's figure


def test_without_a_card_the_models_architecture_still_divides_the_blocks(capsys, tmp_path):
    # No --gpu: no capacity plan, but the model (from vLLM's model_name) fixes the grouping on its own; Gemma-3
    # 27B's 52 sliding and 10 full layers make 7 groups, so blocks × block_size over-stated the pool 7×.
    resolver = CapacityResolver(ServeSettings())
    gemma2 = readings("gen-0.9-both-usage-names.prom", "google/gemma-2-9b-it")[0]
    gemma3 = readings("gen-0.9-both-usage-names.prom", "google/gemma-3-27b-it")[0]
    assert resolver.sidecar(gemma2)[0] is None
    assert resolver.series(gemma2).tokens == 12000 // 2 * 16
    assert resolver.series(gemma3).tokens == 12000 // 7 * 16
    unknown = readings("gen-0.9-both-usage-names.prom", "acme/unheard-of")[0]
    assert resolver.series(unknown).tokens == 12000 * 16  # a model kvwatch does not know: the adapter's figure
    text = (FIXTURES / "gen-0.9-both-usage-names.prom").read_text()
    names = {r.model_name for r in interpret(text, None, timestamp=0.0).readings}
    for name in names:
        text = text.replace(f'model_name="{name}"', 'model_name="google/gemma-2-9b-it"')
    payload = tmp_path / "gemma.prom"
    payload.write_text(text)
    assert main(["check", "--file", str(payload), "--json"]) == 0
    series = json.loads(capsys.readouterr().out)["series"][0]
    assert (series["kv_capacity_tokens"], series["capacity_source"]) == (96000, "engine_num_gpu_blocks")


def test_the_max_model_len_ceiling_needs_a_known_length() -> None:
    # With the model, the card and --max-model-len, vLLM's concurrency at that length comes from the engine's
    # blocks for a one-group model too; with vLLM's default length assumed it stays unknown (the engine may have
    # been started with another).
    from kvwatch.capacity import DeploymentSpec, plan_capacity, resolve_model
    from kvwatch.check import build_report
    from kvwatch.engines import vllm
    from kvwatch.exposition import parse

    path = Path(__file__).parent / "fixtures" / "vllm-metrics" / "gen-0.9-both-usage-names.prom"
    poll = vllm.read(parse(path.read_text()), timestamp=0.0)
    arch = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    for length, expected_known in ((8192, True), (None, False)):
        plan = plan_capacity(DeploymentSpec(arch=arch, gpu_name="H100", gpu_memory_bytes=80 * 2**30,
                                            max_model_len=length, vllm_version=(0, 9)))
        series = build_report(poll, length, {poll.readings[0].model_name: plan})["series"][0]
        assert (series["max_concurrency_max_model_len"] is not None) == expected_known


def test_a_pool_reported_in_tokens_is_those_tokens_bytes() -> None:
    # SGLang reports max_total_num_tokens, no blocks: the formula's budget stood in for its pool (25 GB off in the
    # GPU memory outside the KV cache).
    from kvwatch.capacity import DeploymentSpec, plan_capacity, resolve_model
    from kvwatch.capacity.series import resolve
    from kvwatch.model import Reading

    plan = plan_capacity(DeploymentSpec(arch=resolve_model("meta-llama/Llama-3.1-8B-Instruct"), gpu_name="H100",
                                        gpu_memory_bytes=80 * 2**30))
    sglang = Reading(model_name="m", kv_usage_ratio=0.5, kv_capacity_tokens=262_128.0)
    capacity = resolve(sglang, plan)
    assert capacity.source == "engine_metric" and capacity.pool_source == "engine_tokens"
    assert capacity.pool_bytes == 262_128 * plan.kv_bytes_per_token


def test_the_observed_mix_on_a_windowed_model_counts_what_its_layout_holds() -> None:
    # gpt-oss-20b (12 full and 12 sliding layers, a 128-token window) on vLLM 0.20: the engine's token figure is
    # blocks // 2 × 16, which charges a request all its tokens in both groups; the sliding group holds its window.
    from dataclasses import replace

    from kvwatch.capacity import kv
    from kvwatch.derived import derive

    engine = readings("gen-0.20.2-gptoss-two-groups.prom")[0]
    finished = replace(engine, kv_usage_ratio=None, request_prompt_tokens_sum=1500.0 * 40,
                       request_prompt_tokens_count=40.0, request_generation_tokens_sum=500.0 * 40,
                       request_generation_tokens_count=40.0,  # a 2,000-token mean, no live footprint,
                       prefix_cache_queries_total=None, prefix_cache_hits_total=None)  # nor any prefix-cache hit
    series = CapacityResolver(ServeSettings(gpu="H100")).series(finished)
    applied = series.apply(finished)
    ceiling = derive(applied, None).max_concurrency["observed_mix"]
    layout = series.plan.layout
    assert ceiling == pytest.approx(kv.max_concurrency_at(layout, 149506, 2000, series.plan.in_flight_tokens))
    assert ceiling == pytest.approx(1112.68, abs=0.01) and series.tokens / 2000 == pytest.approx(598.02, abs=0.01)
    # a model whose layout kvwatch does not know: the engine's figure, as before
    unknown = replace(finished, model_name="acme/unheard-of")
    applied = CapacityResolver(ServeSettings(gpu="H100")).series(unknown).apply(unknown)
    assert applied.layout_pool is None
    assert derive(applied, None).max_concurrency["observed_mix"] == pytest.approx(2392096 / 2000)


def test_a_mamba_hybrids_observed_mix_and_what_ifs_are_plans_on_the_engines_blocks() -> None:
    # Granite-4.0-H: 10 KV groups, most of them Mamba, holding a state per request, not its
    # tokens. capacity ÷ mean charged every group every token; and the what-ifs were compared at capacity ÷ ceiling,
    # no request length on such a layout. Both are now the layout's, as plan counts them.
    from dataclasses import replace

    from kvwatch.derived import ceiling_request_size, derive

    model = "ibm-granite/granite-4.0-h-small"
    engine = readings("gen-0.20.2-gptoss-two-groups.prom", model)[0]
    finished = replace(engine, kv_usage_ratio=None, request_prompt_tokens_sum=6000.0 * 40,
                       request_prompt_tokens_count=40.0, request_generation_tokens_sum=2000.0 * 40,
                       request_generation_tokens_count=40.0,  # an 8,000-token mean, no live footprint,
                       prefix_cache_queries_total=None, prefix_cache_hits_total=None)  # nor any prefix-cache hit
    resolver = CapacityResolver(ServeSettings(gpu="H100", tensor_parallel_size=2))
    series = resolver.series(finished)
    applied = series.apply(finished)
    pool = applied.layout_pool
    assert pool is not None and series.plan.layout.mamba_page_bytes and pool.blocks == 149506
    ceiling = derive(applied, None).max_concurrency["observed_mix"]
    assert ceiling == pytest.approx(pool.requests_at(8000)) and ceiling > 1.5 * applied.kv_capacity_tokens / 8000
    # A request holds whole 528-token blocks of its attention groups: every length from 7,921 to 8,448 holds 16 of
    # them and fits as often, so the size the ceiling is read back at is the step's, not 8,000 itself.
    size = ceiling_request_size(applied, ceiling)
    assert 7920 < size <= 8448 and pool.requests_at(size) == pytest.approx(ceiling, rel=1e-3)
    capacity = resolver.sidecar(finished)[0]
    whatif = capacity.whatif_max_concurrency(size, ceiling)
    fp8 = next(s for s in capacity.scenarios if s.name == "fp8_kv_cache").plan
    assert whatif["fp8_kv_cache"] == pytest.approx(
        ceiling * fp8.max_concurrency_at(size) / capacity.plan.max_concurrency_at(size), rel=1e-3)
    # the pool in bytes is still the engine's blocks (the groups share blocks, not bytes)
    assert series.pool_source == "engine_num_gpu_blocks"


def test_what_ifs_are_unknown_where_the_formula_holds_no_request_but_the_engine_does() -> None:
    # Llama-4-Maverick at TP 8 on H100s: kvwatch's estimate says no KV fits, the engine holds
    # 25 requests. The what-ifs read the plan's own ceilings (0 for a change that adds memory, and 0 for the no-op
    # max_model_len_halved) beside today's 25: no ratio is known, so none is exported.
    capacity = CapacityResolver(ServeSettings(gpu="H100", tensor_parallel_size=8)).sidecar(
        readings("gen-0.20.2-gptoss-two-groups.prom", "meta-llama/Llama-4-Maverick-17B-128E-Instruct")[0])[0]
    assert capacity is not None and capacity.plan.max_concurrency_at(4000) <= 0
    assert capacity.whatif_max_concurrency(4000, 25.0) == {}


def test_the_pool_in_bytes_is_the_engines_blocks_on_a_reading_already_resolved() -> None:
    # serve resolves a series on the reading it has already given the engine's capacity: on
    # gpt-oss (two KV groups) that capacity is blocks x block_size / 2, block_pool's ratio refused the blocks, and
    # the pool read the formula's 37.5 GB where the engine's 9,271 blocks hold 3.6 (non-KV memory went negative).
    resolver = CapacityResolver(ServeSettings(gpu="H100"))
    reading = readings("gen-0.11.0-gptoss-issue28924.prom")[0]
    first = resolver.series(reading)
    again = resolver.series(first.apply(reading))
    assert first.pool_source == again.pool_source == "engine_num_gpu_blocks"
    assert again.pool_bytes == first.pool_bytes == 9271 * first.plan.layout.bytes_per_block_row


def test_every_capacity_source_is_in_the_metrics_reference_and_every_resolved_one_is_known() -> None:
    from kvwatch.capacity.series import SOURCES

    reference = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    row = next(line for line in reference.splitlines() if line.startswith("| `kvwatch_capacity_source_info"))
    for source in SOURCES:
        assert f"`{source}`" in row, source
    resolved = set()
    for page in sorted(FIXTURES.glob("*.prom")):
        try:
            readings = interpret(page.read_text(), None, timestamp=0.0).readings
        except ScrapeError:
            continue  # the pages kvwatch refuses (an aggregated proxy page)
        resolved.update(resolve(reading, None).source for reading in readings)
    assert resolved <= set(SOURCES)
    assert {"engine_kv_cache_size_tokens", "engine_num_gpu_blocks"} <= resolved
