"""GPU memory in ``serve``: the watcher's bookkeeping (growth, time to the limit, non-KV, failures counted),
the exported families, the NVML reader, and the settings that turn it on.

No GPU exists on the machines this suite runs on, so the NVML path is driven by a small fake of the
``pynvml`` module injected in ``sys.modules`` (the one stand-in here; it has the calls and the
``c_nvmlMemory_t`` fields total/free/used of nvidia-ml-py). The real nvidia-ml-py is exercised too, for
what it does without a driver.
"""

from __future__ import annotations

import ctypes.util
import sys
import types
from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.exposition import parse
from kvwatch.gpu_memory import MIB, GpuMatch, GpuMemory, read_dcgm
from kvwatch.nvml import NvmlUnavailable, read_nvml
from kvwatch.serve.gpu import GpuReadError, GpuWatcher, NvmlSource, families

FIXTURES = Path(__file__).parent / "fixtures" / "dcgm"
GIB = 1024.0 ** 3


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("KVWATCH_"):
            monkeypatch.delenv(key)


class ScriptedSource:
    """A source returning prepared readings (the watcher's bookkeeping under test, not I/O)."""

    name = "dcgm"

    def __init__(self) -> None:
        self.next: list[GpuMemory] | GpuReadError = []

    def read(self) -> list[GpuMemory]:
        if isinstance(self.next, GpuReadError):
            raise self.next
        return self.next

    def close(self) -> None:
        pass


def gpu(used_gib: float, free_gib: float, uuid: str = "GPU-aaaa", xid: float | None = 0.0) -> GpuMemory:
    return GpuMemory(uuid, "", used_gib * GIB, free_gib * GIB, 0.0, xid)


def exported(state) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.name, tuple(s.labels.values())): s.value for f in families(state) for s in f.samples}


def test_growth_time_to_limit_and_non_kv_from_successive_reads() -> None:
    source = ScriptedSource()
    watcher = GpuWatcher(source)  # type: ignore[arg-type]
    # 60 GiB used of 80: weights 16 + KV pool 40 + 4 non-KV; non-KV then grows 0.5 GiB a minute.
    for minute in range(5):
        source.next = [gpu(60 + 0.5 * minute, 20 - 0.5 * minute)]
        state = watcher.update(watcher.read(), 60.0 * minute, 40 * GIB, 16 * GIB)
    (reading,) = state.gpus
    assert reading.non_kv_bytes == pytest.approx(6 * GIB)
    assert reading.growth_bytes_per_second == pytest.approx(0.5 * GIB / 60)
    assert reading.seconds_to_limit == pytest.approx(18 * GIB / (0.5 * GIB / 60))  # 36 minutes
    samples = exported(state)
    assert samples[("kvwatch_gpu_memory_used_bytes", ("GPU-aaaa", ""))] == 62 * GIB
    assert samples[("kvwatch_gpu_memory_limit_eta_seconds", ("GPU-aaaa", ""))] == pytest.approx(2160.0)
    assert samples[("kvwatch_gpu_source_up", ("dcgm",))] == 1.0


def test_unknown_terms_leave_non_kv_out_but_keep_the_growth() -> None:
    source = ScriptedSource()
    watcher = GpuWatcher(source)  # type: ignore[arg-type]
    for minute in range(3):
        source.next = [gpu(60 + minute, 20 - minute)]
        state = watcher.update(watcher.read(), 60.0 * minute, None, 16 * GIB)  # no KV pool in bytes
    samples = exported(state)
    assert ("kvwatch_gpu_non_kv_memory_bytes", ("GPU-aaaa", "")) not in samples
    assert samples[("kvwatch_gpu_non_kv_memory_growth_bytes_per_second", ("GPU-aaaa", ""))] == pytest.approx(
        GIB / 60)


def test_a_failed_read_is_counted_and_drops_the_memory_gauges() -> None:
    source = ScriptedSource()
    watcher = GpuWatcher(source)  # type: ignore[arg-type]
    source.next = [gpu(60, 20)]
    watcher.update(watcher.read(), 0.0, None, None)
    source.next = GpuReadError("timeout", "no answer")
    state = watcher.update(watcher.read(), 5.0, None, None)
    samples = exported(state)
    assert samples[("kvwatch_gpu_source_up", ("dcgm",))] == 0.0
    assert samples[("kvwatch_gpu_source_errors_total", ("dcgm", "timeout"))] == 1.0
    assert not any(name.startswith("kvwatch_gpu_memory") for name, _ in samples)
    # each source exports the reasons it can fail for: dcgm-exporter never fails in NVML
    reasons = {labels[1] for name, labels in samples if name == "kvwatch_gpu_source_errors_total"}
    assert "nvml" not in reasons and {"connect", "timeout", "parse", "no_match"} <= reasons


def test_a_gpu_missing_from_one_read_keeps_its_trend() -> None:
    # A GPU absent from one read the source answered had its points dropped: its time to the
    # limit was gone for 2 minutes of new points, and the alert's `for` started again. Three of four missing keep
    # theirs too (a first fix kept as many as the read listed); GPUs gone for good are forgotten once their points
    # leave the window, and at most REMEMBERED_GPUS are kept.
    from kvwatch.serve.gpu import REMEMBERED_GPUS

    source = ScriptedSource()
    watcher = GpuWatcher(source)  # type: ignore[arg-type]
    uuids = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd"]
    for minute in range(6):
        source.next = [gpu(60 + 0.5 * minute, 20 - 0.5 * minute, uuid) for uuid in uuids]
        if minute == 4:
            source.next = source.next[3:]  # three GPUs missing from this read
        state = watcher.update(watcher.read(), 60.0 * minute, None, None)
        if minute == 4:
            assert [r.memory.uuid for r in state.gpus] == ["GPU-dddd"]
    assert [r.growth_bytes_per_second for r in state.gpus] == [pytest.approx(0.5 * GIB / 60)] * 4  # at once
    for minute in range(6, 30):  # new GPUs every read: the old ones forgotten after the window, at most the cap kept
        source.next = [gpu(40, 40, f"GPU-new{minute}-{i}") for i in range(10)]
        watcher.update(watcher.read(), 60.0 * minute, None, None)
        assert len(watcher._used) <= REMEMBERED_GPUS
    assert ("GPU-aaaa", "") not in watcher._used


def test_flat_memory_has_no_time_to_limit() -> None:
    source = ScriptedSource()
    watcher = GpuWatcher(source)  # type: ignore[arg-type]
    for minute in range(5):
        source.next = [gpu(60, 20)]
        state = watcher.update(watcher.read(), 60.0 * minute, 40 * GIB, 16 * GIB)
    assert state.gpus[0].growth_bytes_per_second == 0.0 and state.gpus[0].seconds_to_limit is None


def test_xid_is_exported_per_gpu() -> None:
    gpus = read_dcgm(parse((FIXTURES / "gen-k8s-pod-mapping.prom").read_text()), GpuMatch("vllm-0", "llm"))
    source = ScriptedSource()
    source.next = gpus
    watcher = GpuWatcher(source)  # type: ignore[arg-type]
    samples = exported(watcher.update(watcher.read(), 0.0, None, None))
    assert samples[("kvwatch_gpu_last_xid", ("GPU-bbbb", ""))] == 79.0
    assert samples[("kvwatch_gpu_last_xid", ("GPU-aaaa", ""))] == 0.0


# ------------------------------------------------------------------ NVML

class FakeMemory:
    def __init__(self, total: int, free: int, used: int) -> None:
        self.total, self.free, self.used = total, free, used


def fake_pynvml(devices: list[tuple[str, FakeMemory]], calls: list[str]) -> types.ModuleType:
    """The calls read_nvml makes, as nvidia-ml-py names them (UUIDs as str, as in current releases)."""
    module = types.ModuleType("pynvml")
    module.nvmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    module.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = lambda h: devices[h][0]  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = lambda h: devices[h][1]  # type: ignore[attr-defined]
    return module


def test_nvml_reads_the_visible_gpus_through_a_fake_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    mib = int(MIB)
    devices = [("GPU-bbbb", FakeMemory(15360 * mib, 9791 * mib, 5120 * mib)),
               ("GPU-aaaa", FakeMemory(81559 * mib, 1024 * mib, 80000 * mib))]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices, calls))
    gpus = read_nvml()
    assert [g.uuid for g in gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert gpus[1].used_bytes == 5120 * MIB and gpus[1].reserved_bytes == 449 * MIB  # total - used - free
    assert gpus[1].total_bytes == 15360 * MIB and gpus[1].xid_last is None
    assert [g.uuid for g in read_nvml(frozenset({"GPU-bbbb"}))] == ["GPU-bbbb"]
    assert calls == ["init", "shutdown", "init", "shutdown"]
    watcher = GpuWatcher(NvmlSource(frozenset({"GPU-cccc"})))
    state = watcher.update(watcher.read(), 0.0, None, None)
    assert not state.up and state.errors_total["no_match"] == 1


def test_nvml_without_the_package_is_a_reason_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(NvmlUnavailable, match=r"kvwatch\[nvml\]"):
        read_nvml()
    watcher = GpuWatcher(NvmlSource())
    state = watcher.update(watcher.read(), 0.0, None, None)
    assert not state.up and state.errors_total["nvml"] == 1 and "nvidia-ml-py" in (state.last_error or "")
    assert sorted(state.errors_total) == ["no_match", "nvml", "timeout"]  # no HTTP fetch, no connect/parse


def test_the_real_nvidia_ml_py_without_a_driver() -> None:
    if ctypes.util.find_library("nvidia-ml") is None:  # this machine: no driver library
        with pytest.raises(NvmlUnavailable, match="nvmlInit failed"):
            read_nvml()
    else:  # a GPU machine: the real devices
        assert all(g.total_bytes for g in read_nvml())


# ------------------------------------------------------------------ settings

@pytest.mark.parametrize(("argv", "named", "says"), [
    (["--dcgm-url", "http://10.0.0.1:9400/metrics"], "--dcgm-url", "--gpu-pod"),
    (["--dcgm-url", "http://$(NODE_IP):9400/metrics", "--gpu-pod", "p"], "--dcgm-url", "unexpanded"),
    (["--gpu-uuids", "0,1"], "--gpu-uuids", "GPU-"),
    (["--nvml", "--dcgm-url", "http://h:9400/metrics", "--gpu-pod", "p"], "--nvml", "--dcgm-url"),
])
def test_bad_gpu_settings_exit_2_naming_the_flag(argv: list[str], named: str, says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and says in err and len(err.splitlines()) == 1


def test_a_gpu_read_that_never_returns_stops_neither_the_polls_nor_the_exit(caplog: pytest.LogCaptureFixture) -> None:
    # NVML can hang on a GPU fallen off the bus. The poll waited for the read without a deadline: polling stopped,
    # kvwatch_up stayed 1 from the last good poll, and SIGTERM waited for the pool's worker (joined at exit).
    import threading

    import httpx
    import respx

    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar
    from kvwatch.settings import ServeSettings

    release = threading.Event()
    calls: list[str] = []

    def hanging(uuids: frozenset[str]) -> list[GpuMemory]:
        calls.append("read")
        if len(calls) >= 2:
            release.wait()  # the second read hangs until the test ends
        return [gpu(10.0, 70.0)]

    url = "http://vllm.test/metrics"
    page = ('# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
            '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 4\n'
            '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0",model_name="m"} 0\n')
    settings = ServeSettings(target_url=url, poll_interval_seconds=5, poll_timeout_seconds=0.5, nvml=True)
    t = [1000.0]
    try:
        with respx.mock, Fetcher(url, timeout=1.0, max_body_bytes=1 << 20) as fetcher:
            respx.get(url).mock(return_value=httpx.Response(200, text=page))
            sidecar = Sidecar(settings, fetcher, lambda: t[0], gpu=GpuWatcher(NvmlSource(reader=hanging)))
            first = sidecar.poll()
            assert first.health.up and first.gpu is not None and first.gpu.up
            states = []
            for _ in range(3):
                t[0] += 5.0
                states.append(sidecar.poll())
            assert all(s.health.up for s in states)  # the engine's polls go on
            assert [s.gpu.up for s in states] == [False, False, False]
            assert states[-1].gpu.errors_total["timeout"] == 3
            # the poll's duration holds the wait for the GPU read (it left that out: 0.0x s)
            assert all(s.health.scrape_duration_seconds >= 0.5 for s in states)
            assert calls == ["read", "read"]  # one read at a time: the hung one is not queued behind
            assert any("GPU memory source failing" in r.getMessage() for r in caplog.records)
            threads = [th for th in threading.enumerate() if th.name.startswith("kvwatch-gpu")]
            assert threads and all(th.daemon for th in threads)  # nothing for the exit to wait for
    finally:
        release.set()


def test_the_engine_loading_is_no_growth_of_non_kv_memory() -> None:
    # vLLM serves /metrics only once its weights, KV pool and CUDA graphs are allocated: while its polls fail, the
    # GPU fills with them. That load was fitted as growth, and VLLMGPUMemoryPressure fired on every start.
    import http.server
    import threading

    from kvwatch.fetch import Fetcher
    from kvwatch.serve.app import Sidecar
    from kvwatch.settings import ServeSettings

    page = ('# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
            '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 4\n'
            '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
            '# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %s\n')
    engine = {"serving": False, "started": 1.0}

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (page % engine["started"]).encode()
            self.send_response(200 if engine["serving"] else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    used = [2.0]
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    settings = ServeSettings(target_url=url, poll_interval_seconds=30, nvml=True)
    t = [1000.0]
    try:
        with Fetcher(url, timeout=2.0, max_body_bytes=1 << 20) as fetcher:
            sidecar = Sidecar(settings, fetcher, lambda: t[0],
                              gpu=GpuWatcher(NvmlSource(reader=lambda uuids: [gpu(used[0], 80.0 - used[0])])))

            def poll_for(minutes: int, step_gib: float) -> object:
                for _ in range(2 * minutes):
                    used[0] += step_gib / 2
                    state = sidecar.poll()
                    t[0] += 30.0
                return state

            loading = poll_for(6, 10.0)  # weights, then the KV pool: 60 GiB in 6 minutes, no answer from vLLM
            assert not loading.health.up and loading.gpu.up
            assert loading.gpu.gpus[0].seconds_to_limit is None
            engine["serving"] = True
            served = poll_for(6, 0.0)
            assert served.health.up and served.gpu.gpus[0].growth_bytes_per_second == 0.0
            assert served.gpu.gpus[0].seconds_to_limit is None
            # Restarted between two polls, with 8 GiB more (other CUDA graphs): a step, no growth.
            engine["started"] = 1000.0  # (a restart starts later than a second: history.START_TIME_JITTER)
            used[0] += 8.0
            after = poll_for(5, 0.0)
            assert after.gpu.gpus[0].growth_bytes_per_second == 0.0
            # A leak of 0.5 GiB a minute with one poll in ten failing: a failed poll keeps the trend (clearing it
            # hid the leak for good), and the alert's horizon stays known.
            reported = []
            for poll in range(40):
                engine["serving"] = poll % 10 != 9
                used[0] += 0.25
                state = sidecar.poll()
                t[0] += 30.0
                reported.append(state.gpu.gpus[0].seconds_to_limit is not None)
            assert all(reported[4:]) and state.gpu.gpus[0].growth_bytes_per_second == pytest.approx(0.5 * GIB / 60)
    finally:
        server.shutdown()
        server.server_close()
