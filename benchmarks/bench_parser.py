"""Parser benchmark: kvwatch.exposition.parse vs prometheus_client's text parser on a vLLM 0.33 payload.

The payload (benchmarks/vllm_payload.py): 8 data-parallel engines, every histogram family, ~430 kB.
Run either way:
    .venv/bin/python -m pytest benchmarks/bench_parser.py --benchmark-only
    .venv/bin/python benchmarks/bench_parser.py            # plain timeit table, no plugin needed
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
from vllm_payload import generate

from kvwatch.engines import vllm
from kvwatch.exposition import parse

PAYLOAD = generate(engines=8)
WANTED = vllm.wanted_for()


def kvwatch_wanted() -> Any:
    return parse(PAYLOAD, WANTED)


def kvwatch_all() -> Any:
    return parse(PAYLOAD)


def prometheus_client_all() -> Any:
    return list(text_string_to_metric_families(PAYLOAD))


def kvwatch_poll() -> Any:
    """What kvwatch does per poll: parse the wanted families and build the readings."""
    return vllm.read(parse(PAYLOAD, WANTED), timestamp=0.0)


def test_kvwatch_parse_wanted(benchmark: Any) -> None:
    assert len(benchmark(kvwatch_wanted).samples("vllm:kv_cache_usage_perc")) == 8


def test_kvwatch_parse_all(benchmark: Any) -> None:
    benchmark(kvwatch_all)


def test_kvwatch_parse_and_read(benchmark: Any) -> None:
    assert len(benchmark(kvwatch_poll).readings) == 8


def test_prometheus_client_parse(benchmark: Any) -> None:
    benchmark(prometheus_client_all)


def main() -> None:
    print(f"payload: {len(PAYLOAD):,} bytes, {PAYLOAD.count(chr(10)):,} lines, 8 engines")
    results = {}
    for name, fn, number in (("prometheus_client text_string_to_metric_families", prometheus_client_all, 3),
                             ("kvwatch parse, all families", kvwatch_all, 20),
                             ("kvwatch parse, wanted families", kvwatch_wanted, 50),
                             ("kvwatch parse + vllm.read (one poll)", kvwatch_poll, 50)):
        best = min(timeit.repeat(fn, number=number, repeat=5)) / number
        results[name] = best
        print(f"{name:52s} {best * 1000:8.2f} ms")
    base = results["prometheus_client text_string_to_metric_families"]
    for name, value in results.items():
        print(f"speed-up of {name}: {base / value:.1f}x")


if __name__ == "__main__":
    main()
