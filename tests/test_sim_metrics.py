"""Each vLLM profile the simulator speaks, against the catalogue and against real captured payloads."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.sim.engine import EngineConfig, Request, Simulator
from kvwatch.sim.metrics import PROFILES, render

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-metrics"
CATALOGUE = json.loads(resources.files("kvwatch").joinpath("data/vllm_catalogue.json").read_text())
# Real captures (copied from the shared vLLM reference) and the profile that must reproduce them.
CAPTURES = {
    "v0-engine-qwenvl.prom": "v0",
    "v1-0.8-early-model-name-only.prom": "0.8",
    "v0.10.0-glm45-deprecated-and-new.prom": "0.10",
}


def _snapshots(dp: int = 1, prefix_caching: bool = True):
    rng = random.Random(0)
    requests = [Request(i * 0.05, rng.randint(20, 3000), rng.randint(1, 400),
                        tuple(rng.randint(0, 5) for _ in range(6))) for i in range(600)]
    sim = Simulator(EngineConfig(num_gpu_blocks=700, data_parallel_size=dp, enable_prefix_caching=prefix_caching),
                    seed=0)
    sim.submit(requests)
    sim.run_until(40.0)
    return sim.snapshot()


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _wire_name(family) -> str:  # prometheus_client's parser strips _total from counters
    return family.name + "_total" if family.type == "counter" else family.name


def _catalogue_buckets(spec, max_model_len: int, max_num_seqs: int = 256,  # type: ignore[no-untyped-def]
                       max_num_batched_tokens: int = 8192) -> list[float]:
    if isinstance(spec, str) and spec.startswith("V0 CUDA-graph"):
        sizes = [1, 2, 4, *range(8, 8193, 8)]
        cap = min(x for x in sizes if x >= max_num_seqs) if max_num_seqs <= 8192 else 8192
        return [float(x) for x in sizes if x <= cap]
    if isinstance(spec, str) and spec.startswith("V1 CUDA-graph"):
        return [float(x) for x in [1, 2, 4, *range(8, 513, 8)] if x <= max_num_batched_tokens]
    if isinstance(spec, str):
        assert spec == "1-2-5 up to max_model_len", spec
        out, exponent = [], 0
        while True:
            for mantissa in (1, 2, 5):
                if mantissa * 10**exponent > max_model_len:
                    return out
                out.append(float(mantissa * 10**exponent))
            exponent += 1
    return [float(b) for b in spec]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("multiprocess", [False, True])
def test_profile_matches_the_catalogue(profile: str, multiprocess: bool) -> None:
    if multiprocess and profile == "0.8":  # V1 0.8.x had a single API server
        with pytest.raises(ValueError, match="multiprocess"):
            render(_snapshots(), profile, multiprocess=True)
        return
    dp = 1 if profile in ("0.8", "v0") else 2
    text = render(_snapshots(dp), profile, max_model_len=4096, multiprocess=multiprocess,
                  enable_prefix_caching=True)
    families = _families(text)
    catalogued = CATALOGUE["profiles"][profile]
    # Registered but never set: HELP/TYPE only in the default registry, absent in multiprocess mode.
    never = {name for name, spec in catalogued.items() if spec.get("samples") == "never"}
    expected = {name: spec for name, spec in catalogued.items() if not (multiprocess and name in never)}
    created = {n for n in families if n.endswith("_created")}
    if multiprocess or not CATALOGUE["created_samples"][profile]:
        assert not created
    real = {_wire_name(f): f for n, f in families.items() if n not in created and n.startswith("vllm:")}
    assert set(real) == set(expected)
    runtime = {_wire_name(f): f for n, f in families.items() if not n.startswith("vllm:") and n not in created}
    expected_runtime = {} if multiprocess else CATALOGUE["runtime_families"]["families"]
    assert set(runtime) == set(expected_runtime)
    for name, spec in expected_runtime.items():
        assert (runtime[name].type, runtime[name].documentation) == (spec["type"], spec["help"]), name
        assert all(set(s.labels) == set(spec["labels"]) for s in runtime[name].samples), name
    for name, spec in expected.items():
        family = real[name]
        assert family.type == spec["type"], name
        assert family.documentation == spec["help"], name
        assert bool(family.samples) == (name not in never), name
        if not family.samples:
            continue
        for sample in family.samples:
            labels = set(sample.labels) - {"le", "pid"}
            assert labels == set(spec["labels"]), name
            for label, values in spec.get("label_values", {}).items():
                assert sample.labels[label] in values, name
        if spec["type"] == "histogram":
            bounds = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")})
            assert bounds == [*_catalogue_buckets(spec["buckets"], 4096), float("inf")], name
        if "engine" in spec["labels"] and name != "vllm:cache_config_info":
            assert {s.labels["engine"] for s in family.samples} == {"0", "1"}, name


@pytest.mark.parametrize(("capture", "profile"), sorted(CAPTURES.items()))
def test_profile_reproduces_real_capture(capture: str, profile: str) -> None:
    """Every family in the real payload exists in the profile with the same TYPE, HELP and label names."""
    real = _families((FIXTURES / capture).read_text())
    ours = _families(render(_snapshots(), profile, model_name="m"))
    assert any(name.startswith("vllm:") for name in real)
    for fam in real.values():  # vllm:* and the process_* families of prometheus_client's default registry
        assert fam.name in ours, fam.name
        mine = ours[fam.name]
        if not fam.samples:  # a HELP line whose TYPE and samples were cut off in the stored copy
            assert mine.documentation == fam.documentation, fam.name
            continue
        assert (mine.type, mine.documentation) == (fam.type, fam.documentation), fam.name
        real_labels = {frozenset(set(s.labels) - {"le"}) for s in fam.samples}
        my_labels = {frozenset(set(s.labels) - {"le"}) for s in mine.samples}
        assert real_labels <= my_labels, fam.name


def test_values_follow_the_engine_and_config_info_is_per_engine() -> None:
    snaps = _snapshots(dp=2)
    text = render(snaps, "0.33", model_name="m", max_model_len=8192)
    families = _families(text)
    usage = {s.labels["engine"]: s.value for s in families["vllm:kv_cache_usage_perc"].samples}
    assert usage == {str(s.engine): pytest.approx(s.kv_usage) for s in snaps}
    waiting = {(s.labels["engine"], s.labels["reason"]): s.value
               for s in families["vllm:num_requests_waiting_by_reason"].samples}
    assert waiting[("0", "capacity")] == snaps[0].num_waiting and waiting[("0", "deferred")] == 0
    info = families["vllm:cache_config_info"].samples
    assert len(info) == 2
    for sample in info:
        # num_gpu_blocks is summed over DP engines; size and concurrency stay per engine (vLLM's core_client).
        assert sample.labels["num_gpu_blocks"] == "1400"
        assert sample.labels["num_gpu_blocks_override"] == "700"  # the given per-engine size, as the flag is
        assert sample.labels["enable_prefix_caching"] == "False"  # render's default, as the engine's
        assert sample.labels["kv_cache_max_concurrency"] == str(700 / (8192 / 16))
        assert sample.labels["kv_cache_size_tokens"] == str(int(700 / 512 * 8192))
    by_tier = {(s.labels["engine"], s.labels["source"]): s.value
               for s in families["vllm:prompt_tokens_cached_by_source"].samples if s.name.endswith("_total")}
    hits = {s.labels["engine"]: s.value for s in families["vllm:prefix_cache_hits"].samples
            if s.name.endswith("_total")}
    assert len(by_tier) == 2 * 5
    for engine in ("0", "1"):  # its HELP: sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits
        assert sum(v for (e, _), v in by_tier.items() if e == engine) == hits[engine] == by_tier[(engine, "device")]
    assert hits["0"] > 0
    success = sum(s.value for s in families["vllm:request_success"].samples)
    assert success == sum(s.requests_completed for s in snaps)
    prompt = families["vllm:request_prompt_tokens"]
    counts = [s.value for s in prompt.samples if s.name.endswith("_count")]
    assert sum(counts) == sum(s.request_prompt_tokens_count for s in snaps)


_REAL_MULTIPROCESS = """
import sys
import prometheus_client as pc
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
bounds = [float(b) for b in sys.argv[1].split(",")]
h = pc.Histogram("vllm:e2e_request_latency_seconds", "x", labelnames=["model_name", "engine"], buckets=bounds)
g = pc.Gauge("vllm:kv_cache_usage_perc", "x", labelnames=["model_name", "engine"])
m = pc.Gauge("vllm:num_requests_running", "x", labelnames=["model_name", "engine"], multiprocess_mode="mostrecent")
for engine in ("0", "1"):
    h.labels("m", engine).observe(1.0)
    g.labels("m", engine).set(0.5)
    m.labels("m", engine).set(3)
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
print(generate_latest(registry).decode())
"""


def _sample_lines(text: str, family: str) -> list[str]:
    """The family's sample lines without their values: names and labels, in order."""
    return [line.rsplit(" ", 1)[0] for line in text.splitlines()
            if line.startswith(family) and not line.startswith("#")]


def test_multiprocess_mode_is_what_prometheus_client_multiprocess_collector_serves(tmp_path: Path) -> None:
    """Sample order, label order and pid labels, compared with prometheus_client's own MultiProcessCollector."""
    bounds = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
              480.0, 960.0, 1920.0, 7680.0]
    real = subprocess.run([sys.executable, "-c", _REAL_MULTIPROCESS, ",".join(map(str, bounds))], check=True,
                          capture_output=True, text=True, env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
                          timeout=60).stdout
    pid = int(re.search(r'pid="(\d+)"', real).group(1))  # type: ignore[union-attr]
    ours = render(_snapshots(dp=2), "0.10", multiprocess=True, pid=pid, model_name="m")
    for family in ("vllm:e2e_request_latency_seconds", "vllm:kv_cache_usage_perc", "vllm:num_requests_running"):
        assert _sample_lines(ours, family) == _sample_lines(real, family), family
    # Per series: _sum, the buckets, _count (not every _sum first).
    lines = _sample_lines(ours, "vllm:e2e_request_latency_seconds")
    assert lines[0].startswith("vllm:e2e_request_latency_seconds_sum") and "_bucket" in lines[1]
    assert lines[len(bounds) + 3].startswith("vllm:e2e_request_latency_seconds_sum")
    assert "_created" not in ours and "process_start_time_seconds" not in ours


def test_version_specific_units_and_created_samples() -> None:
    snaps = _snapshots()
    old = _families(render(snaps, "0.8"))
    assert old["vllm:gpu_prefix_cache_queries"].samples[0].value == snaps[0].prefix_cache_queries_blocks
    assert old["vllm:cache_config_info"].samples[0].labels["num_gpu_blocks"] == "None"  # emitted before init
    new = _families(render(snaps, "0.10"))
    assert new["vllm:prefix_cache_queries"].samples[0].value == snaps[0].prefix_cache_queries_tokens
    assert "vllm:prefix_cache_queries_created" in new
    assert snaps[0].prefix_cache_hits_tokens > 0


def test_process_start_time_moves_on_restart() -> None:
    sim = Simulator(EngineConfig(num_gpu_blocks=100))
    sim.run_until(50.0)

    def start() -> float:
        fams = _families(render(sim.snapshot(), "0.33", start_time=1_000_000.0))
        # every counter's _created is the process's start too (it kept the first one's through a restart)
        created = {s.value for f in fams.values() for s in f.samples if s.name.endswith("_created")}
        assert created == {fams["process_start_time_seconds"].samples[0].value}, created
        return fams["process_start_time_seconds"].samples[0].value

    assert start() == 1_000_000.0
    sim.restart()
    sim.run_until(80.0)
    assert start() == 1_000_050.0


@pytest.mark.parametrize(("profile", "max_num_seqs", "max_num_batched_tokens", "largest"), [
    ("v0", 256, 8192, 256),  # V0 captured up to the first size >= max_num_seqs
    ("v0", 100, 8192, 104),
    ("v0", 1000, 8192, 1000),
    ("v0", 20000, 8192, 8192),
    ("0.8", 1024, 8192, 512),  # V1 0.8.x: 512 at most, and none above max_num_batched_tokens
    ("0.8", 256, 100, 96),
    ("0.10", 256, 100, 16384),  # fixed buckets from 0.9/0.10 on
])
def test_iteration_buckets_follow_the_cuda_graph_capture_sizes(profile: str, max_num_seqs: int,
                                                              max_num_batched_tokens: int, largest: int) -> None:
    families = _families(render(_snapshots(), profile, max_num_seqs=max_num_seqs,
                                max_num_batched_tokens=max_num_batched_tokens))
    bounds = sorted({float(s.labels["le"]) for s in families["vllm:iteration_tokens_total"].samples
                     if s.name.endswith("_bucket")})
    assert bounds[-2] == largest and bounds[-1] == float("inf")
    spec = CATALOGUE["profiles"][profile]["vllm:iteration_tokens_total"]["buckets"]
    assert bounds == [*_catalogue_buckets(spec, 8192, max_num_seqs, max_num_batched_tokens), float("inf")]
    # Every step was counted whatever the buckets (the engine records against the union of all of them).
    counts = [s.value for s in families["vllm:iteration_tokens_total"].samples if s.name.endswith("_count")]
    assert counts == [_snapshots()[0].histograms["iteration_tokens"].count]


def test_bad_render_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown vLLM profile"):
        render(_snapshots(), "0.9")
    with pytest.raises(ValueError, match="no engine label"):
        render(_snapshots(dp=2), "v0")


def test_v0_default_frontend_is_multiprocess_mode_as_in_the_real_capture() -> None:
    """V0's OpenAI server runs prometheus_client in multiprocess mode: the capture's family order and labels."""
    real = [f for f in text_string_to_metric_families((FIXTURES / "v0-engine-qwenvl.prom").read_text())]
    ours = [f for f in text_string_to_metric_families(render(_snapshots(), "v0", model_name="qwenvl",
                                                             multiprocess=True))]
    names = [f.name for f in ours]
    assert names[:len(real)] == [f.name for f in real]  # mostrecent file (cache_config_info), then the sum gauges
    for mine, theirs in zip(ours, real, strict=False):
        for a, b in zip(mine.samples, theirs.samples, strict=False):
            assert list(a.labels) == list(b.labels), mine.name  # same label names in the same (sorted) order
    assert not any(n.startswith(("python_", "process_")) for n in names)
    assert not any("pid" in s.labels for f in ours for s in f.samples)  # every V0 gauge has a multiprocess_mode


def test_v0_families_get_series_only_once_written() -> None:
    sim = Simulator(EngineConfig(num_gpu_blocks=100))
    sim.run_until(5.0)  # nothing arrived: no step, no observation
    fresh = _families(render(sim.snapshot(), "v0", model_name="m", start_time=1_000_000.0))
    for name in ("vllm:iteration_tokens_total", "vllm:e2e_request_latency_seconds", "vllm:request_success",
                 "vllm:tokens", "vllm:model_forward_time_milliseconds", "vllm:spec_decode_efficiency"):
        assert fresh[name].samples == [], name  # HELP and TYPE only
    lora = fresh["vllm:lora_requests_info"].samples
    assert [(s.labels, s.value) for s in lora] == [
        ({"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}, 1_000_005.0)]
    assert fresh["vllm:gpu_prefix_cache_hit_rate"].samples[0].value == -1.0  # V0's "prefix caching disabled"
    assert fresh["vllm:num_preemptions"].samples[0].value == 0  # incremented by 0 on every log call
    mp = _families(render(sim.snapshot(), "v0", multiprocess=True))
    assert "vllm:iteration_tokens_total" not in mp and "vllm:tokens" not in mp and "vllm:lora_requests_info" in mp

    busy = _families(render(_snapshots(), "v0", enable_prefix_caching=True))
    reasons = {s.labels["finished_reason"] for s in busy["vllm:request_success"].samples if s.name.endswith("_total")}
    assert reasons == {"stop"}  # only the reasons seen (V1 pre-creates every reason)
    assert busy["vllm:tokens"].samples == []  # V0 registers it and never increments it
    assert busy["vllm:time_in_queue_requests"].samples[-1].value == \
        busy["vllm:request_queue_time_seconds"].samples[-1].value
    assert 0 < busy["vllm:gpu_prefix_cache_hit_rate"].samples[0].value < 1


def test_v0_cache_config_info_echoes_the_override_like_the_real_capture() -> None:
    real = _families((FIXTURES / "v0-engine-qwenvl.prom").read_text())["vllm:cache_config_info"].samples[0].labels
    assert real["num_gpu_blocks_override"] == real["num_gpu_blocks"] == "2048"
    sim = Simulator(EngineConfig(num_gpu_blocks=2048))
    sim.run_until(1.0)
    ours = _families(render(sim.snapshot(), "v0", enable_prefix_caching=True))["vllm:cache_config_info"]
    labels = ours.samples[0].labels
    assert labels["num_gpu_blocks_override"] == labels["num_gpu_blocks"] == "2048"
    assert labels["enable_prefix_caching"] == "True"


def test_help_texts_come_from_the_catalogue(monkeypatch: pytest.MonkeyPatch) -> None:
    """sim/metrics.py writes no HELP text of its own: a changed catalogue entry changes the rendered HELP, and a
    family the catalogue lacks (or types differently) is refused rather than rendered with a made-up text."""
    import copy

    from kvwatch.sim import metrics

    catalogue = copy.deepcopy(CATALOGUE)
    catalogue["profiles"]["0.33"]["vllm:num_preemptions_total"]["help"] = "Edited in the catalogue."
    monkeypatch.setattr(metrics, "_catalogue", lambda: catalogue)
    assert "# HELP vllm:num_preemptions_total Edited in the catalogue." in render(_snapshots(), "0.33")
    del catalogue["profiles"]["0.33"]["vllm:num_preemptions_total"]
    with pytest.raises(KeyError, match=r"vllm:num_preemptions_total is not in vllm_catalogue\.json"):
        render(_snapshots(), "0.33")
    catalogue["profiles"]["0.33"]["vllm:num_preemptions_total"] = {"type": "gauge", "labels": [], "help": "x"}
    with pytest.raises(ValueError, match=r"is a gauge in vllm_catalogue\.json"):
        render(_snapshots(), "0.33")
