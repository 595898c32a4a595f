"""Block-granular concurrency ceilings on a real vLLM capture (tests/fixtures/vllm-metrics/neuron-v0-block1024.prom).

The capture's own numbers: 4 blocks of 1024 tokens, 9 finished requests of 210 prompt + 2371 generated tokens in
all (287 tokens each on average). A request holds whole blocks, so at most 4 fit; tokens ÷ mean would say 14.3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.derived import derive
from kvwatch.payload import interpret

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-metrics" / "neuron-v0-block1024.prom"
pytestmark = pytest.mark.usefixtures("no_kvwatch_env")


def test_neuron_capture_ceiling_is_the_block_count():
    reading = interpret(FIXTURE.read_text(), None, timestamp=0.0).readings[0]
    assert reading.num_gpu_blocks == 4 and reading.block_size == 1024
    state = derive(reading, None)
    assert state.mean_request_tokens == pytest.approx((210 + 2371) / 9)
    assert state.max_concurrency["observed_mix"] == 4  # not 4096 / 286.8 = 14.3


def test_check_json_reports_the_block_granular_ceiling(capsys):
    assert main(["check", "--file", str(FIXTURE), "--json"]) == 0
    series = json.loads(capsys.readouterr().out)["series"][0]
    assert series["max_concurrency"] == 4
    assert series["max_concurrency"] <= series["num_gpu_blocks"]


def test_block_figures_are_ignored_when_they_do_not_describe_the_pool():
    # vLLM rewrites block_size on hybrid models (vllm issue 51163): blocks × block_size far from the reported
    # kv_cache_size_tokens, so the ceiling falls back to tokens ÷ mean.
    text = FIXTURE.read_text().replace('block_size="1024"', 'block_size="4"').replace(
        'cache_dtype="auto"', 'cache_dtype="auto",kv_cache_size_tokens="40960"')
    reading = interpret(text, None, timestamp=0.0).readings[0]
    assert reading.kv_capacity_tokens == 40960
    ceiling = derive(reading, None).max_concurrency["observed_mix"]
    assert ceiling == pytest.approx(40960 / ((210 + 2371) / 9))
