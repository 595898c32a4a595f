"""Parser benchmark: kvwatch's parse + vLLM read against prometheus_client's text parser, on vLLM 0.33 payloads.

Payloads (all vLLM 0.33, 8 data-parallel engines but ``sim1``):
- ``fixture``: tests/fixtures/vllm-metrics/gen-0.33-dp2-capacity-labels.prom with engine 0's series copied to
  engines 0..7: only the families kvwatch reads (every line wanted: the worst case for kvwatch);
- ``sim``: a whole 0.33 ``/metrics`` page from the simulator's catalogue of vLLM's definitions
  (``kvwatch.sim.metrics.render``), runtime collectors included;
- ``bench``: benchmarks/vllm_payload.py, every histogram family with vLLM's buckets (~430 kB);
- ``sim1``: ``sim`` with one engine (what a sidecar beside a single-GPU vLLM reads; not in the issue's target,
  which names 8 engines).

"parse+read" is a typical poll (the latency histograms are skipped); "edge poll" also reads their buckets,
which ``kvwatch serve`` does once per ``kvwatch.latency.EDGE_SECONDS`` of poll clock.

Timings are interleaved (prometheus_client, kvwatch, prometheus_client, ...) and the minimum of each is kept,
so a load change on a shared machine hits both sides. Also measured: a full parse (no filter), and the poll's
CPU per engine (parse + interpret + history + derive, no fetch), the sidecar's work per poll.

    .venv/bin/python benchmarks/bench_parser.py                 # the table in docs/performance.md
    .venv/bin/python -m pytest benchmarks/bench_parser.py --benchmark-only
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
from vllm_payload import generate

from kvwatch.derived import derive
from kvwatch.engines.detect import read_payload
from kvwatch.exposition import parse
from kvwatch.history import History
from kvwatch.latency import EDGE_SECONDS
from kvwatch.model import Reading
from kvwatch.payload import interpret
from kvwatch.serve.latency import LatencyAnalyzer
from kvwatch.sim.engine import EngineConfig, Request, Simulator
from kvwatch.sim.metrics import render

ENGINES = 8
ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "vllm-metrics" / "gen-0.33-dp2-capacity-labels.prom"


def fixture_payload(engines: int = ENGINES) -> str:
    """The 0.33 fixture with engine 0's series repeated for engines 0..engines-1 (engine 1's dropped)."""
    out: list[str] = []
    for line in FIXTURE.read_text().splitlines():
        if 'engine="0"' in line:
            out += [line.replace('engine="0"', f'engine="{e}"') for e in range(engines)]
        elif 'engine="1"' not in line:
            out.append(line)
    return "\n".join(out) + "\n"


def sim_payload(engines: int = ENGINES) -> str:
    """A whole vLLM 0.33 page for ``engines`` engines, each in the state of a simulator after some load."""
    sim = Simulator(EngineConfig(num_gpu_blocks=4096, max_model_len=16384, data_parallel_size=engines), seed=0)
    sim.submit(Request(arrival_time=i * 0.05, prompt_tokens=800 + 10 * i, output_tokens=200) for i in range(400))
    sim.run_until(30.0)
    return render(sim.snapshot(), "0.33")


PAYLOADS: dict[str, Callable[[], str]] = {"fixture": fixture_payload, "sim": sim_payload, "bench": generate,
                                          "sim1": functools.partial(sim_payload, 1)}


def kvwatch_poll(text: str) -> Any:
    """Parse + read of a typical poll: the filter of every adapter without the latency histograms (read once
    per kvwatch.latency.EDGE_SECONDS), engine detection, the vLLM adapter."""
    return read_payload(text, timestamp=0.0, latency=False)


class FloorPoll:
    """The least any CPython reader could do on a payload whose shape it saw in the previous poll: split the
    lines, cut each value off with one ``rpartition``, check that every line's text before its value is the
    previous poll's, convert the sample values, and build each engine's :class:`Reading` from field values
    already known. All of it runs in C-level maps, list compares and dataclass ``__init__``; it validates no
    value, reads no label and interprets nothing, so no real parser + adapter can be cheaper. It tells whether
    a ratio against prometheus_client is reachable at all (docs/performance.md, "The floor")."""

    def __init__(self, text: str) -> None:
        self._cut = operator.methodcaller("rpartition", " ")
        self._key, self._value = operator.itemgetter(0), operator.itemgetter(2)
        lines = text.split("\n")
        self._keys = list(map(self._key, map(self._cut, lines)))
        self._samples = operator.itemgetter(*[i for i, line in enumerate(lines) if line and line[0] != "#"])
        readings = read_payload(text, timestamp=0.0, latency=False).readings
        self._fields = [{f.name: getattr(r, f.name) for f in dataclasses.fields(Reading)} for r in readings]

    def __call__(self, text: str) -> tuple[list[float], list[Reading]]:
        parts = list(map(self._cut, text.split("\n")))
        if list(map(self._key, parts)) != self._keys:
            raise ValueError("the payload's shape changed")
        values = list(map(float, self._samples(list(map(self._value, parts)))))
        return values, [Reading(**fields) for fields in self._fields]


def kvwatch_edge_poll(text: str) -> Any:
    """Parse + read of a poll that also reads the latency and length histograms' buckets (one a minute, as
    ``payload.interpret(latency=True)`` does)."""
    return read_payload(text, timestamp=0.0, lengths=True)


def kvwatch_full(text: str) -> Any:
    return parse(text)


def prometheus_client_parse(text: str) -> Any:
    return list(text_string_to_metric_families(text))


def poll_cpu(text: str, polls: int = 240, interval: float = 5.0, edges: str = "cadence") -> float:
    """CPU seconds per poll of the sidecar's fetch-free work: interpret, history, derive and the latency
    analyzer for every series. ``edges``: ``cadence`` (latency buckets once per EDGE_SECONDS, as ``kvwatch
    serve`` polls at ``interval``), ``never`` (only typical polls), ``always`` (every poll reads them)."""
    history = History(forget_after=3600.0)
    analyzer = LatencyAnalyzer()
    last_edge: float | None = None
    started = time.process_time()
    for i in range(polls):
        now = interval * i
        due = last_edge is None or now - last_edge >= EDGE_SECONDS
        latency = due if edges == "cadence" else edges == "always"
        poll = interpret(text, None, timestamp=now, latency=latency)
        if latency:
            last_edge = now
        history.record(poll)
        for reading in poll.readings:
            series = history[reading.key]
            analyzer.analyze(reading.key, series, reading, now)
            derive(reading, series, None)
    return (time.process_time() - started) / polls


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int = 15, budget: float = 0.05) -> dict[str, float]:
    """Minimum seconds per call of each fn, timed in alternation (each round runs every fn ~budget seconds)."""
    numbers = {}
    for name, fn in fns.items():
        started = time.perf_counter()
        fn()
        numbers[name] = max(1, int(budget / max(time.perf_counter() - started, 1e-6)))
    best: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            started = time.perf_counter()
            for _ in range(numbers[name]):
                fn()
            best[name].append((time.perf_counter() - started) / numbers[name])
    return {name: min(times) for name, times in best.items()} | {
        f"{name} (median)": statistics.median(times) for name, times in best.items()}


# ---------------------------------------------------------------- pytest-benchmark

_TEXTS = {name: make() for name, make in PAYLOADS.items()}


def test_kvwatch_parse_and_read_fixture(benchmark: Any) -> None:
    assert len(benchmark(kvwatch_poll, _TEXTS["fixture"]).readings) == ENGINES


def test_kvwatch_parse_and_read_sim(benchmark: Any) -> None:
    assert len(benchmark(kvwatch_poll, _TEXTS["sim"]).readings) == ENGINES


def test_kvwatch_parse_and_read_bench(benchmark: Any) -> None:
    assert len(benchmark(kvwatch_poll, _TEXTS["bench"]).readings) == ENGINES


def test_kvwatch_edge_poll_sim(benchmark: Any) -> None:
    assert len(benchmark(kvwatch_edge_poll, _TEXTS["sim"]).readings) == ENGINES


def test_kvwatch_full_parse_bench(benchmark: Any) -> None:
    benchmark(kvwatch_full, _TEXTS["bench"])


# One sample line with 160k labels (1.8 MB) on the general path: linear since labels are read in place (copying
# the rest of the line per label took 3.3 s for 1.5 MB, minutes for the 16 MiB body cap; docs/performance.md).
_LABELS_LINE = "x{" + ",".join(f'l{i}="v"' for i in range(160_000)) + "}\t1\n"


def test_kvwatch_parse_one_line_of_many_labels(benchmark: Any) -> None:
    # Refused at its 257th label since the per-sample cap (exposition.MAX_LABELS_PER_SAMPLE): what it costs now is
    # reading that far.
    from kvwatch.exposition import TooLarge

    def refused() -> str:
        try:
            parse(_LABELS_LINE)
        except TooLarge as exc:
            return str(exc)
        return ""

    assert "more than 256 labels" in benchmark(refused)


# 16 MiB of unwanted lines whose label values hold '#' and no comment line: the search for the next comment walks
# every '#', and it ran again for every 1 MiB part (13.6 s; once per body, as now: 1.7 s; docs/performance.md).
_HASHES = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n" + (
    'junk{a="' + "#" * 200 + '"} 1\n') * (16 * 2**20 // 213)


def test_kvwatch_filtered_parse_of_hashes_in_label_values(benchmark: Any) -> None:
    from kvwatch.engines import vllm

    assert benchmark(parse, _HASHES, vllm.wanted_for(None)).samples("vllm:num_requests_running")


def test_prometheus_client_parse_bench(benchmark: Any) -> None:
    benchmark(prometheus_client_parse, _TEXTS["bench"])


def main() -> None:
    import platform

    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"Python {platform.python_version()}, {platform.machine()}, load average {load}")
    for name, text in _TEXTS.items():
        floor = FloorPoll(text)
        t = interleaved({
            "prometheus_client": lambda text=text: prometheus_client_parse(text),
            "floor (any reader)": lambda text=text, floor=floor: floor(text),
            "kvwatch parse+read": lambda text=text: kvwatch_poll(text),
            "kvwatch edge poll": lambda text=text: kvwatch_edge_poll(text),
            "kvwatch full parse": lambda text=text: kvwatch_full(text),
        })
        base, base_median = t["prometheus_client"], t["prometheus_client (median)"]
        print(f"\n{name}: {len(text):,} bytes, {text.count(chr(10)):,} lines")
        for what in ("prometheus_client", "floor (any reader)", "kvwatch parse+read", "kvwatch edge poll",
                     "kvwatch full parse"):
            median = t[what + " (median)"]
            print(f"  {what:20s} min {t[what] * 1e3:8.3f} ms  median {median * 1e3:8.3f} ms"
                  f"  speed-up {base / t[what]:6.1f}x (of minima), {base_median / median:6.1f}x (of medians)")
        typical, edge, minute = (min(poll_cpu(text, edges=e) for _ in range(3)) for e in ("never", "always",
                                                                                         "cadence"))
        engines = 1 if name == "sim1" else ENGINES
        print(f"  poll CPU per engine (interpret + history + derive + latency analyzer, {engines} engines): "
              f"typical {typical * 1e3 / engines:.3f} ms, latency edge {edge * 1e3 / engines:.3f} ms, "
              f"mean over polls every 5 s with an edge a minute {minute * 1e3 / engines:.3f} ms")

if __name__ == "__main__":
    main()
