"""dcgm-exporter join (pure part): the engine's GPUs by pod/namespace or UUID, bytes from MiB, Xid codes, and
non-KV memory; a node exporter without a match key says nothing rather than a node total."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.exposition import parse
from kvwatch.gpu_memory import MIB, GpuMatch, least_free_ratio, non_kv_bytes, read_dcgm, xid_errors

FIXTURES = Path(__file__).parent / "fixtures" / "dcgm"


def exposition(name: str):
    return parse((FIXTURES / name).read_text())


def test_pod_and_namespace_pick_the_engines_gpus_only() -> None:
    gpus = read_dcgm(exposition("gen-k8s-pod-mapping.prom"), GpuMatch(pod="vllm-0", namespace="llm"))
    assert [g.uuid for g in gpus] == ["GPU-aaaa", "GPU-bbbb"]  # the same pod name in namespace "other" is not ours
    assert gpus[0].used_bytes == 80000 * MIB and gpus[0].free_bytes == 1024 * MIB
    assert least_free_ratio(gpus) == pytest.approx(1024 / 81024)
    assert xid_errors(gpus) == {"GPU-bbbb": 79.0}


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
