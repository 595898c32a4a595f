"""The simulator's SGLang and trtllm-serve wire names: the adapters read back what the engine model holds."""

from __future__ import annotations

import pytest

from kvwatch.engines.detect import read_payload
from kvwatch.sim.engine import EngineConfig, Request, Simulator
from kvwatch.sim.engines_wire import kv_pool_tokens, render_any, render_sglang, render_trtllm


def _snapshots(dp: int = 1):
    sim = Simulator(EngineConfig(num_gpu_blocks=300, data_parallel_size=dp, enable_prefix_caching=True), seed=3)
    sim.submit([Request(arrival_time=i * 0.05, prompt_tokens=900, output_tokens=300) for i in range(200)])
    sim.run_until(30.0)
    return sim.snapshot()


@pytest.mark.parametrize("dp", [1, 2])
def test_sglang_wire_reads_back_per_dp_rank(dp: int) -> None:
    snaps = _snapshots(dp)
    poll = read_payload(render_sglang(snaps, model_name="m"), timestamp=0.0)
    assert (poll.detection.engine_kind, poll.detection.version_range) == ("sglang", "rank-labels")
    assert [r.engine for r in poll.readings] == [str(s.engine) for s in snaps]
    for r, s in zip(poll.readings, snaps, strict=True):
        assert r.kv_usage_ratio == pytest.approx(s.kv_usage)
        assert (r.requests_running, r.requests_waiting) == (s.num_running, s.num_waiting)
        assert r.kv_capacity_tokens == kv_pool_tokens(s)
        assert r.preemptions_total == s.preemptions_total
        # Tokenizer counters are the endpoint's, summed over the ranks (one tokenizer manager).
        assert r.prompt_tokens_total == sum(x.prompt_tokens_total for x in snaps)
    assert snaps[0].preemptions_total > 0 and snaps[0].num_waiting > 0  # the load really saturates


def test_trtllm_wire_reads_back() -> None:
    (s,) = _snapshots()
    poll = read_payload(render_trtllm([s], model_name="m"), timestamp=0.0)
    assert (poll.detection.engine_kind, poll.detection.version_range) == ("tensorrt-llm", "trtllm-serve")
    (r,) = poll.readings
    assert r.kv_usage_ratio == pytest.approx(s.kv_usage)
    assert (r.requests_running, r.requests_waiting) == (s.num_running, s.num_waiting)
    assert (r.num_gpu_blocks, r.block_size) == (s.num_gpu_blocks - 1, s.block_size)
    assert r.prefix_cache_hits_total == s.prefix_cache_hits_blocks
    assert r.preemptions_total is None
    with pytest.raises(ValueError, match="one engine"):
        render_trtllm(_snapshots(2), model_name="m")


def test_sglang_histograms_carry_every_one_of_sglangs_default_bounds() -> None:
    # Only the bounds vLLM's histograms shared were recorded: queue and e2e stopped at 60 s, TTFT at 80 s, and kvwatch
    # read p50, p90 and p99 all as 60 s on a saturated demo (SGLang's own go to 3000, 2400 and 400 s)
    from kvwatch.exposition import parse
    from kvwatch.sim.buckets import SGLANG_E2E, SGLANG_ITL, SGLANG_QUEUE, SGLANG_TTFT

    page = parse(render_sglang(_snapshots(), model_name="m"))
    for family, bounds in (("sglang:queue_time_seconds", SGLANG_QUEUE), ("sglang:e2e_request_latency_seconds",
                                                                           SGLANG_E2E),
                           ("sglang:time_to_first_token_seconds", SGLANG_TTFT),
                           ("sglang:inter_token_latency_seconds", SGLANG_ITL)):
        les = [float(s.labels["le"]) for s in page.samples(family) if s.name.endswith("_bucket")]
        assert les == [*map(float, bounds), float("inf")], family


def test_trtllm_histograms_carry_its_defaults_which_are_vllms() -> None:
    # Recording SGLang's bounds too put them on the trtllm-serve page (139 bucket lines for 87, a le="0.0" bucket)
    from kvwatch.exposition import parse
    from kvwatch.sim.buckets import ITL_SECONDS, REQUEST_LATENCY_SECONDS, TTFT_SECONDS

    page = parse(render_trtllm(_snapshots(), model_name="m"))
    for family, bounds in (("trtllm_e2e_request_latency_seconds", REQUEST_LATENCY_SECONDS),
                           ("trtllm_time_to_first_token_seconds", TTFT_SECONDS),
                           ("trtllm_time_per_output_token_seconds", ITL_SECONDS),
                           ("trtllm_request_queue_time_seconds", REQUEST_LATENCY_SECONDS)):
        les = [float(s.labels["le"]) for s in page.samples(family) if s.name.endswith("_bucket")]
        assert les == [*map(float, bounds), float("inf")], family


def test_render_any_keeps_vllm_the_default() -> None:
    snaps = _snapshots()
    assert read_payload(render_any(snaps, model_name="m"), timestamp=0.0).detection.engine_kind == "vllm"
    assert read_payload(render_any(snaps, engine="sglang", model_name="m"), timestamp=0.0).detection.engine_kind \
        == "sglang"


@pytest.mark.parametrize(("args", "flag"), [
    (["--engine", "tensorrt-llm", "--data-parallel-size", "2"], "--data-parallel-size"),
    (["--engine", "sglang", "--multiprocess"], "--multiprocess"),
])
def test_engine_flag_combinations_exit_2_naming_the_flag(args: list[str], flag: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from kvwatch.cli import main

    assert main(["simulate", "--no-serve", "--duration-seconds", "10", *args]) == 2
    assert flag in capsys.readouterr().err
