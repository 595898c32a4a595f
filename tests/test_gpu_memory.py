"""dcgm-exporter join (pure part): the engine's GPUs by pod/namespace or UUID, bytes from MiB, Xid codes, and
non-KV memory; a node exporter without a match key says nothing rather than a node total."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.exposition import parse
from kvwatch.gpu_memory import MIB, GpuMatch, non_kv_bytes, read_dcgm

FIXTURES = Path(__file__).parent / "fixtures" / "dcgm"


def exposition(name: str):
    return parse((FIXTURES / name).read_text())


def test_pod_and_namespace_pick_the_engines_gpus_only() -> None:
    gpus = read_dcgm(exposition("gen-k8s-pod-mapping.prom"), GpuMatch(pod="vllm-0", namespace="llm"))
    assert [g.uuid for g in gpus] == ["GPU-aaaa", "GPU-bbbb"]  # the same pod name in namespace "other" is not ours
    assert gpus[0].used_bytes == 80000 * MIB and gpus[0].free_bytes == 1024 * MIB
    assert min(g.free_ratio for g in gpus) == pytest.approx(1024 / 81024)
    assert {g.uuid: g.xid_last for g in gpus if g.xid_last} == {"GPU-bbbb": 79.0}


def test_uuid_matches_a_real_capture_without_pod_labels() -> None:
    text = exposition("t4-node-excerpt.prom")
    assert read_dcgm(text, GpuMatch(pod="vllm-0")) == []  # no pod mapping on this node
    (gpu,) = read_dcgm(text, GpuMatch(uuids=frozenset({"GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"})))
    assert (gpu.used_bytes, gpu.free_bytes, gpu.reserved_bytes) == (5120 * MIB, 9791 * MIB, 447 * MIB)
    assert gpu.total_bytes == (5120 + 9791 + 447) * MIB  # 15358 MiB: a 16 GB T4
    assert gpu.xid_last is None


def test_no_match_key_reports_nothing() -> None:
    assert read_dcgm(exposition("gen-k8s-pod-mapping.prom"), GpuMatch()) == []


def test_non_kv_memory() -> None:
    gib = 1024.0 ** 3
    assert non_kv_bytes(78 * gib, 50 * gib, 16 * gib) == 12 * gib
    assert non_kv_bytes(78 * gib, None, 16 * gib) is None


def test_growth_is_the_least_squares_slope_and_needs_a_span() -> None:
    from kvwatch.gpu_memory import growth_rate

    steps = [(0.0, 10.0), (60.0, 10.0), (120.0, 70.0), (180.0, 70.0)]  # the caching allocator's steps
    assert growth_rate(steps) == pytest.approx(0.4)  # the line through the steps, not one step's jump
    assert growth_rate(steps[:2]) is None  # two points are not a trend
    assert growth_rate([(0.0, 1.0), (30.0, 2.0), (60.0, 3.0)]) is None  # shorter than 2 minutes
    assert growth_rate([(0.0, 5.0), (100.0, 3.0), (200.0, 1.0)]) == pytest.approx(-0.02)


def test_seconds_to_limit_only_while_memory_grows() -> None:
    from kvwatch.gpu_memory import seconds_to_limit

    assert seconds_to_limit(1000 * MIB, 1 * MIB) == pytest.approx(1000.0)
    assert seconds_to_limit(1000 * MIB, 0.0) is None
    assert seconds_to_limit(1000 * MIB, -5.0) is None
    assert seconds_to_limit(None, 1.0) is None


def test_shared_terms_need_every_engine_to_agree() -> None:
    from kvwatch.gpu_memory import shared_terms

    assert shared_terms([(50.0, 16.0), (50.0, 16.0)]) == (50.0, 16.0)  # identical data-parallel engines
    assert shared_terms([(50.0, 16.0), (40.0, 16.0)]) == (None, 16.0)  # which GPU holds which pool: unknown
    assert shared_terms([(50.0, None)]) == (50.0, None)
    assert shared_terms([]) == (None, None)
