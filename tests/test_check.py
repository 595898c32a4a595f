"""kvwatch check: JSON shape, findings, human report, live URL on loopback, failures."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvwatch.check import build_report, findings
from kvwatch.cli import main
from kvwatch.derived import derive
from kvwatch.model import SGLANG, VLLM, Detection, Poll, Reading
from kvwatch.payload import interpret

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-metrics"


pytestmark = pytest.mark.usefixtures("no_kvwatch_env")


def check_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["check", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def ids(report: dict) -> list[tuple[str, str]]:
    return [(f["id"], f["engine"]) for f in report["findings"]]


def test_json_shape_for_dp_payload(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_json(["--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")], capsys)
    assert (report["engine_kind"], report["version_range"], report["usage_metric"]) == (
        "vllm", ">=0.21", "vllm:kv_cache_usage_perc")
    e0 = report["series"][0]
    assert {k: e0[k] for k in ("model_name", "engine", "kv_usage_ratio", "requests_running", "requests_waiting",
                               "kv_capacity_tokens", "max_concurrency")} == {
        "model_name": "llama", "engine": "0", "kv_usage_ratio": 0.96, "requests_running": 16.0,
        "requests_waiting": 4.0, "kv_capacity_tokens": 163840.0, "max_concurrency": pytest.approx(16 / 0.96)}
    assert e0["kv_used_tokens"] == 157286  # counts and tokens are JSON integers
    for key in ("requests_running", "requests_waiting", "requests_swapped", "kv_capacity_tokens", "kv_used_tokens",
                "num_gpu_blocks", "block_size", "preemptions_total"):
        assert e0[key] is None or type(e0[key]) is int, key
    assert e0["waiting_by_reason"] == {"capacity": 3, "deferred": 1}
    assert all(type(v) is int for v in e0["waiting_by_reason"].values())
    assert ids(report) == [("kv_bound", "0"), ("preemptions", "0"), ("prefix_cache_ineffective", "0")]
    assert all(set(f) >= {"id", "severity", "message"} for f in report["findings"])


def test_a_page_served_four_times_over_reads_as_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # NVIDIA Dynamo's frontend served vLLM's families four times (metadata and samples, ai-dynamo/dynamo PR 5761):
    # exact copies, which Prometheus stores as one series; kvwatch refused the page as duplicate series
    page = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    dynamo = "# TYPE dynamo_frontend_requests_total counter\ndynamo_frontend_requests_total 12\n"
    (tmp_path / "four.prom").write_text(dynamo + page * 4)
    once = check_json(["--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")], capsys)
    four = check_json(["--file", str(tmp_path / "four.prom")], capsys)
    assert four == once and len(once["series"]) == 2


def test_scheduler_limited_and_capacity_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_json(["--file", str(FIXTURES / "gen-0.8.5-engine-label.prom")], capsys)
    # num_gpu_blocks "None": whether the next prompt fits in the free half cannot be told, nor so whether the
    # scheduler or the KV cache holds the queue (it said "scheduler_limited: more KV would not help")
    assert ids(report) == [("queue_cause_unknown", "0"), ("preemptions", "0"), ("capacity_unknown", "0")]
    unknown = next(f["message"] for f in report["findings"] if f["id"] == "queue_cause_unknown")
    assert "cannot tell why" in unknown and "estimates it with --gpu and the model" in unknown
    report = check_json(["--file", str(FIXTURES / "gen-0.8.5-engine-label.prom"), "--gpu", "H100"], capsys)
    assert ids(report)[0] == ("scheduler_limited", "0")  # the capacity from the plan: the next prompt fits
    # Beside preemptions since the start, "more KV would not help" is not said flatly: one poll cannot see the cache
    # swing full between polls.
    limited = next(f["message"] for f in report["findings"] if f["id"] == "scheduler_limited")
    assert "more KV would not help, unless the" in limited and "kvwatch_preemptions_per_second" in limited


def test_a_long_context_queue_without_a_capacity_is_no_scheduler_limit() -> None:
    # One request running at 0.40 and five waiting, mean prompt 25,000 tokens, capacity unknown: it said
    # "scheduler_limited: raise --max-num-seqs, more KV would not help"; in a 32,320-token pool the 19,392 free
    # tokens do not hold the next prompt (kv_bound, critical).
    def reading(capacity: float | None) -> Reading:
        return Reading("m", kv_usage_ratio=0.4, requests_running=1.0, requests_waiting=5.0,
                       kv_capacity_tokens=capacity, request_prompt_tokens_sum=2_500_000.0,
                       request_prompt_tokens_count=100.0)

    (unknown,) = [f for f in findings([derive(reading(None), None)]) if f.severity != "info"]
    assert unknown.id == "queue_cause_unknown" and unknown.severity == "warning"
    assert "mean prompt since the engine started: 25,000 tokens" in unknown.message
    assert "more KV would not help" not in unknown.message and "--gpu and the model" in unknown.message
    assert "where they were given, the notes on stderr say why" in unknown.message  # (not "pass --gpu" if it was)
    # kvwatch's capacity model does not size SGLang's pool: no --gpu to ask for there
    (sglang,) = [f for f in findings([derive(replace(reading(None), engine_kind=SGLANG), None)])
                 if f.severity != "info"]
    assert sglang.id == "queue_cause_unknown" and "--gpu" not in sglang.message
    (bound,) = [f for f in findings([derive(reading(32_320.0), None)]) if f.severity != "info"]
    assert bound.id == "kv_bound" and "19,392 tokens free" in bound.message


def test_healthy_payload_has_no_findings(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_json(["--file", str(FIXTURES / "v0-engine-qwenvl.prom")], capsys)
    assert report["findings"] == [] and report["series"][0]["engine"] == "0"


def test_override_flag_changes_usage_source(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_json(["--file", str(FIXTURES / "gen-0.9-both-usage-names.prom"),
                         "--usage-metric", "vllm:gpu_cache_usage_perc"], capsys)
    assert report["usage_metric"] == "vllm:gpu_cache_usage_perc"


def test_max_model_len_gives_the_second_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_json(["--file", str(FIXTURES / "gen-0.9-both-usage-names.prom"), "--max-model-len", "8192"],
                        capsys)
    assert report["series"][0]["max_concurrency_max_model_len"] == 12000 / 512


def test_observed_mix_ceiling_agrees_with_the_advice_on_a_kv_bound_series(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_json(["--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")], capsys)
    e0 = report["series"][0]
    limit = e0["advice"][0]["concurrency"]
    # 96 % full with 4 waiting: the cache holds about the 16 running, not 65 (capacity / mean finished size).
    assert limit <= e0["max_concurrency"] < 17.0
    assert 0 <= e0["concurrency_headroom"] < 1.0


def test_observed_mix_is_the_smaller_estimate() -> None:
    young = Reading("m", kv_usage_ratio=0.05, requests_running=10.0, kv_capacity_tokens=100000.0,
                    request_prompt_tokens_sum=1500.0, request_prompt_tokens_count=1.0,
                    request_generation_tokens_sum=500.0, request_generation_tokens_count=1.0)
    # Live footprint says 200 (requests still young); the finished mean, 2000 tokens, says 50.
    assert derive(young, None).max_concurrency["observed_mix"] == 50.0
    idle = Reading("m", kv_usage_ratio=0.0, requests_running=0.0, kv_capacity_tokens=100000.0)
    assert "observed_mix" not in derive(idle, None).max_concurrency


def _finished_mean_2000(usage: float, running: float, prefix_hits: float | None = None) -> Reading:
    return Reading("m", kv_usage_ratio=usage, requests_running=running, kv_capacity_tokens=100000.0,
                   requests_waiting=5.0, request_prompt_tokens_sum=1500.0, request_prompt_tokens_count=1.0,
                   request_generation_tokens_sum=500.0, request_generation_tokens_count=1.0,
                   prefix_cache_queries_total=None if prefix_hits is None else 1000.0,
                   prefix_cache_hits_total=prefix_hits)


def test_the_finished_mean_counts_only_the_prompt_the_prefix_cache_did_not_serve() -> None:
    # 120 requests hold 96 % of a pool the whole finished mean (2,000 tokens) says holds 50: a shared system prompt
    # is held once for all. At a hit ratio of 0.9 a request holds 1,500 x 0.1 + 500 = 650 of its own: 153.8, and the
    # live footprint's 125 is the smaller; the limit follows it instead of cutting 120 to 47.
    shared = derive(_finished_mean_2000(0.96, 120.0, prefix_hits=900.0), None)
    assert shared.max_concurrency["observed_mix"] == pytest.approx(125.0)
    from kvwatch.advisor import concurrency_limit
    assert concurrency_limit(None, shared.max_concurrency["observed_mix"]) == 118
    assert shared.mean_request_tokens == 2000.0  # (the reported mean request is still prompt + output)
    # without prefix hits the whole mean stands, and young requests that will outgrow the cache read negative
    young = derive(_finished_mean_2000(0.3, 60.0, prefix_hits=0.0), None)
    assert young.max_concurrency["observed_mix"] == 50.0 and young.concurrency_headroom == -10.0
    assert derive(_finished_mean_2000(0.3, 60.0), None).max_concurrency["observed_mix"] == 50.0


def test_kv_bound_needs_a_queue() -> None:
    full_no_queue = derive(Reading("m", kv_usage_ratio=0.99, requests_waiting=0.0, kv_capacity_tokens=1.0), None)
    # (a full cache, held or leaked: kv_full, as serve reads it, saying the running count is missing)
    assert [f.id for f in findings([full_no_queue])] == ["kv_full"]


def test_human_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--file", str(FIXTURES / "gen-0.16-sleep-state-dp2.prom")]) == 0
    out = capsys.readouterr().out
    assert "Detected: vllm 0.11-0.25" in out and "m engine 1:" in out and "kv_bound" in out
    assert "160,000 tokens" in out


class _Handler(BaseHTTPRequestHandler):
    body = b""
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def live_target() -> Iterator[str]:
    _Handler.body, _Handler.status = (FIXTURES / "gen-0.11-kv-only.prom").read_bytes(), 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_live_url(live_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = check_json([live_target], capsys)
    assert report["version_range"] == "0.11" and report["series"][0]["kv_usage_ratio"] == 0.1


def test_unreachable_url_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), _Handler) as probe:
        port = probe.server_address[1]  # closed right after: nothing listens there
    assert main(["check", f"http://127.0.0.1:{port}/metrics", "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["error"]["reason"] == "connect"


@pytest.mark.parametrize("target", [["http://127.0.0.1:1/metrics"], ["--target-url", "http://127.0.0.1:1/metrics"]])
def test_a_file_and_a_url_are_refused_however_the_url_is_given(target: list[str],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # --target-url beside --file was ignored: a script believed a live engine was checked when a saved file was
    page = str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")
    assert main(["check", "--file", page, *target]) == 2
    assert "or --file, not both" in capsys.readouterr().err


def test_garbage_file_exits_1_and_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "page.html"
    garbage.write_text("<html>nope</html>")
    assert main(["check", "--file", str(garbage)]) == 3
    assert "parse" in capsys.readouterr().err
    assert main(["check", "--file", str(tmp_path / "missing.prom")]) == 2
    assert "--file" in capsys.readouterr().err


def test_build_report_is_pure() -> None:
    from kvwatch.engines import vllm
    from kvwatch.exposition import parse

    poll = vllm.read(parse((FIXTURES / "gen-multiprocess-pid.prom").read_text()), timestamp=1.0)
    assert build_report(poll)["series"][0]["requests_waiting"] is None  # pid snapshots that disagree: unknown


def test_long_timeout_is_fine_for_a_one_shot_check(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_json(["--file", str(FIXTURES / "gen-0.11-kv-only.prom"), "--poll-timeout-seconds", "30"], capsys)
    assert report["version_range"] == "0.11"


def _advice(report: dict) -> dict[str, list[str]]:
    return {s["engine"]: [a["action"] for a in s["advice"]] for s in report["series"]}


def test_kv_bound_series_gets_the_advisors_fixes_cheapest_first(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_json(["--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")], capsys)
    # Engine 0 is KV-bound; engine 1 (50 %, no queue) gets no advice. Without the model, no quantization.
    assert _advice(report) == {"0": ["limit_concurrency", "add_replica"], "1": []}
    fixes = report["series"][0]["advice"]
    assert [a["rank"] for a in fixes] == [1, 2]
    assert all(set(a) == {"action", "rank", "message", "projected_effect", "engine_args", "vllm_args",
                          "concurrency"}
               and a["message"] and a["projected_effect"] for a in fixes)
    # The limit keeps usage under 95 % at this poll's mix: one more request would cross it.
    e0 = report["series"][0]
    per_request = e0["kv_used_tokens"] / e0["requests_running"]
    limit = fixes[0]["concurrency"]
    assert fixes[0]["vllm_args"] == fixes[0]["engine_args"] == ["--max-num-seqs", str(limit)]
    assert f"to {limit} per data-parallel rank" in fixes[0]["message"]
    # one flag limits both engines: engine 1's own mix fits ~36, and the message says what the
    # limit costs it instead of leaving it to be found in production
    assert f"holds engine 1 to {limit} too, though its own mix fits ~36.0" in fixes[0]["message"]
    # Without the model the TP size cannot be named: no flag to paste, a replica instead.
    assert fixes[1]["vllm_args"] is None and fixes[1]["concurrency"] is None
    assert "Add a replica" in fixes[1]["message"] and "--tensor-parallel-size x2" not in fixes[1]["message"]
    assert limit * per_request <= 0.95 * e0["kv_capacity_tokens"] < (limit + 1) * per_request


def test_one_flag_for_every_rank_names_a_tighter_rank_and_its_limit(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # Engine 1 runs 12 requests at 89 %: its own mix fits ~13.5. The advice for KV-bound engine 0
    # said --max-num-seqs 15, which vLLM applies to each engine (15 on engine 1 is ~111 % of its cache), and named no
    # tighter rank. It names it and its limit; the limit stays engine 0's own (one poll's mix of a
    # quiet rank running one long request cut a busy rank's limit from 15 to 3 when it was applied).
    page = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    page = page.replace('vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.5',
                        'vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.89')
    page = page.replace('vllm:num_requests_running{engine="1",model_name="llama"} 18.0',
                        'vllm:num_requests_running{engine="1",model_name="llama"} 12.0')
    (tmp_path / "tight.prom").write_text(page)
    report = check_json(["--file", str(tmp_path / "tight.prom")], capsys)
    e0, e1 = report["series"]
    limit = e0["advice"][0]
    tight = e1["max_concurrency"]
    assert tight < e0["max_concurrency"]
    own = int(0.95 * e0["max_concurrency"])
    assert limit["action"] == "limit_concurrency" and limit["concurrency"] == own > int(0.95 * tight)
    assert f"engine 1's own mix fits only ~{tight:.1f} (its limit would be {int(0.95 * tight)}); pass " \
        f"{int(0.95 * tight)} instead" in limit["message"]


def test_deployment_flags_size_the_quantization_and_tp_advice(capsys: pytest.CaptureFixture[str]) -> None:
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity
    from kvwatch.settings import ServeSettings

    flags = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--max-model-len", "32768"]
    report = check_json(["--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom"), *flags], capsys)
    # Half the prompts sit in the +Inf bucket: the longest request is unknown, so no shorter length is proposed.
    assert _advice(report)["0"] == ["limit_concurrency", "quantize_weights", "quantize_kv_cache",
                                    "add_tensor_parallelism"]
    capacity, _ = build_sidecar_capacity(ServeSettings(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100",
                                                       max_model_len=32768))
    assert capacity is not None
    fixes = {a["action"]: a for a in report["series"][0]["advice"]}
    # The gains are the plan's ratios applied to the pool vLLM reports (163,840 tokens), not the plan's own figure.
    assert capacity.plan.kv_cache_tokens != 163840
    assert "KV capacity 163,840 -> " in fixes["quantize_weights"]["projected_effect"]
    assert "KV capacity 163,840 -> " in fixes["add_tensor_parallelism"]["projected_effect"]
    assert fixes["quantize_weights"]["vllm_args"] == ["--quantization", "fp8"]
    assert fixes["quantize_kv_cache"]["vllm_args"] == ["--kv-cache-dtype", "fp8"]
    assert "KV capacity 163,840 -> 327,6" in fixes["quantize_kv_cache"]["projected_effect"]
    assert fixes["add_tensor_parallelism"]["vllm_args"] == ["--tensor-parallel-size", "2"]
    # Weights already FP8: the FP8 KV cache is still a fix of its own (it was a side note of the weights' fix, and
    # vanished with it).
    fp8 = check_json(["--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom"), *flags, "--quantization",
                      "fp8"], capsys)
    assert _advice(fp8)["0"] == ["limit_concurrency", "quantize_kv_cache", "add_tensor_parallelism"]


@pytest.mark.parametrize("dtype", ["nvfp4", "fp8_per_token_head", "int4_per_token_head"])
def test_a_kv_cache_dtype_kvwatch_cannot_size_gets_no_plan_and_no_fp8_advice(
        dtype: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM 0.33's smaller KV dtypes were planned as bf16 (the label was dropped as unknown): an
    # nvfp4 cache was told an FP8 one doubles it (it halves it) and capacity_mismatch blamed an FP8 cache
    page = tmp_path / "metrics.prom"
    page.write_text((FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
                    .replace('cache_dtype="auto"', f'cache_dtype="{dtype}"'))
    flags = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100"]
    assert main(["check", "--file", str(page), *flags, "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert "quantize_kv_cache" not in _advice(report)["0"] and "quantize_weights" not in _advice(report)["0"]
    assert "capacity_mismatch" not in {f["id"] for f in report["findings"]}
    assert f"KV cache dtype {dtype}" in err
    # A flag naming the dtype wins, as for every label the engine reports; the flag takes vLLM's names alike.
    given = check_json(["--file", str(page), *flags, "--kv-cache-dtype", "fp8"], capsys)
    assert "quantize_kv_cache" not in _advice(given)["0"] and "quantize_weights" in _advice(given)["0"]
    assert main(["check", "--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom"), *flags, "--kv-cache-dtype",
                 dtype, "--json"]) == 0
    out, err = capsys.readouterr()
    assert "quantize_kv_cache" not in _advice(json.loads(out))["0"] and f"KV cache dtype {dtype}" in err


def _bounded_lengths(text: str) -> str:
    """The fixture with every prompt in its 1,000-token bucket and every output in a 500-token one."""
    text = text.replace('vllm:request_prompt_tokens_bucket{engine="0",le="1000.0",model_name="llama"} 50.0',
                        'vllm:request_prompt_tokens_bucket{engine="0",le="1000.0",model_name="llama"} 100.0')
    return text.replace('vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="llama"} 100.0',
                        'vllm:request_generation_tokens_bucket{engine="0",le="500.0",model_name="llama"} 100.0\n'
                        'vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="llama"} 100.0')


def test_the_max_model_len_fix_starts_from_the_engines_length_and_the_buckets(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The engine runs 8,192 (kv_cache_size_tokens / kv_cache_max_concurrency); kvwatch was told 32,768. The fix
    # used to say "from 32768 to 16384": pasted, it doubled the engine's length. Every prompt <= 1,000 tokens and
    # every output <= 500 (the buckets): at most 1,500 tokens, so 2,048 with margin.
    payload = tmp_path / "buckets.prom"
    payload.write_text(_bounded_lengths((FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()))
    report = check_json(["--file", str(payload), "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100",
                         "--max-model-len", "32768"], capsys)
    fixes = {a["action"]: a for a in report["series"][0]["advice"]}
    assert "from 8192 to 2048" in fixes["lower_max_model_len"]["message"]
    assert "longer than 1,500 tokens" in fixes["lower_max_model_len"]["message"]
    assert fixes["lower_max_model_len"]["vllm_args"] == ["--max-model-len", "2048"]
    assert any(f["id"] == "max_model_len_mismatch" for f in report["findings"])


def test_unusable_deployment_flags_are_explained_and_advice_still_comes(capsys: pytest.CaptureFixture[str]) -> None:
    # Valid flags that describe a deployment the capacity model cannot plan (TP 3 does not divide 32 heads).
    assert main(["check", "--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom"), "--model",
                 "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--tensor-parallel-size", "3", "--json"]) == 0
    captured = capsys.readouterr()
    assert "no capacity plan for llama" in captured.err and "--tensor-parallel-size" in captured.err
    assert _advice(json.loads(captured.out))["0"] == ["limit_concurrency", "add_replica"]


@pytest.mark.parametrize(("flags", "named"), [(["--model", "no/such-model"], "--model"), (["--gpu", "H101"], "--gpu")])
def test_a_misspelt_model_or_gpu_is_bad_usage(flags: list[str], named: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom"), *flags]) == 2
    assert named in capsys.readouterr().err


def test_no_advice_without_a_kv_bottleneck(capsys: pytest.CaptureFixture[str]) -> None:
    for fixture in ("v0-engine-qwenvl.prom", "gen-0.8.5-engine-label.prom"):  # healthy; scheduler-limited
        report = check_json(["--file", str(FIXTURES / fixture)], capsys)
        assert all(s["advice"] == [] for s in report["series"]), fixture


def test_human_report_lists_the_fixes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")]) == 0
    out = capsys.readouterr().out
    fixes = out.split("Fixes for llama engine 0, cheapest first:\n")[1].splitlines()
    assert fixes[0].startswith("  1. Limit concurrency to ") and fixes[1].startswith("     vLLM flags: --max-num-seqs ")
    assert fixes[2].startswith("     Effect: ")
    assert fixes[3].startswith("  2. Add a replica behind the gateway")
    assert "Fixes for llama engine 1" not in out


def _fetch_timeouts(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the timeout each check fetch is given (the fetch itself then fails as connect)."""
    from kvwatch import check
    from kvwatch.payload import ScrapeError

    seen: list[float] = []

    class Recorder:
        def __init__(self, url: str, *, timeout: float, **kwargs: object) -> None:
            seen.append(timeout)

        def __enter__(self) -> Recorder:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def fetch(self) -> str:
            raise ScrapeError("connect", "not fetched in this test")

    monkeypatch.setattr(check, "Fetcher", Recorder)
    return seen


def test_check_has_a_short_default_timeout_and_honours_the_flag(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    seen = _fetch_timeouts(monkeypatch)
    assert main(["check", "http://127.0.0.1:9/metrics"]) == 3
    assert main(["check", "http://127.0.0.1:9/metrics", "--poll-timeout-seconds", "30"]) == 3
    assert seen == [5.0, 30.0]


def test_check_ignores_serve_only_settings(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    for variable, value in (("KVWATCH_PORT", "abc"), ("KVWATCH_POLL_INTERVAL_SECONDS", "1"),
                            ("KVWATCH_LOG_LEVEL", "chatty"), ("KVWATCH_CLOCK_SPEED", "-1")):
        monkeypatch.setenv(variable, value)
    report = check_json(["--file", str(FIXTURES / "gen-0.11-kv-only.prom")], capsys)
    assert report["version_range"] == "0.11"


def test_check_still_validates_what_it_uses(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVWATCH_MAX_BODY_BYTES", "ten")
    assert main(["check", "--file", str(FIXTURES / "gen-0.11-kv-only.prom")]) == 2
    assert "KVWATCH_MAX_BODY_BYTES" in capsys.readouterr().err


NAN_PAYLOAD = """\
vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN
vllm:num_requests_running{engine="0",model_name="m"} +Inf
vllm:num_requests_waiting{engine="0",model_name="m"} 2
vllm:cache_config_info{engine="0",block_size="16",num_gpu_blocks="100"} 1
"""


def _strict_json(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_inf_are_null_in_json_and_nan_usage_is_unknown(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    payload = tmp_path / "nan.prom"
    payload.write_text(NAN_PAYLOAD)
    assert main(["check", "--file", str(payload), "--json"]) == 0
    report = _strict_json(capsys.readouterr().out)
    s = report["series"][0]
    assert (s["kv_usage_ratio"], s["requests_running"], s["kv_used_tokens"]) == (None, None, None)
    # (and, model "m" being no preset, the capacity from blocks carries its caveat: capacity_groups_unknown)
    assert [f["id"] for f in report["findings"]] == ["usage_unknown", "implausible_values", "capacity_groups_unknown"]
    assert "NaN" in report["findings"][0]["message"]
    assert "requests_running = +Inf" in report["findings"][1]["message"]
    assert main(["check", "--file", str(payload)]) == 0
    out = capsys.readouterr().out
    assert "KV usage        unknown\n" in out and "unknown running, 2 waiting" in out
    assert "nan%" not in out and "nan of" not in out


@pytest.mark.parametrize(("fixture", "fail_on", "code"), [
    ("gen-0.33-dp2-capacity-labels.prom", "critical", 1),  # kv_bound
    ("gen-0.33-dp2-capacity-labels.prom", "info", 1),
    ("gen-0.8.5-engine-label.prom", "critical", 0),  # warnings and info only
    ("gen-0.8.5-engine-label.prom", "warning", 1),
    ("gen-0.9-both-usage-names.prom", "info", 0),  # healthy
])
def test_fail_on_exits_1_at_or_above_the_severity(fixture: str, fail_on: str, code: int,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for extra in ([], ["--json"]):
        assert main(["check", "--file", str(FIXTURES / fixture), "--fail-on", fail_on, *extra]) == code
        out = capsys.readouterr().out
        if extra:
            json.loads(out)  # the report is still printed
    assert main(["check", "--file", str(FIXTURES / fixture)]) == 0  # without --fail-on: 0 whatever is found


def test_fail_on_keeps_usage_errors_at_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check", "--file", str(FIXTURES / "gen-0.9-both-usage-names.prom"), "--fail-on", "loud"])
    assert exc.value.code == 2 and "--fail-on" in capsys.readouterr().err
    assert main(["check", "--file", "no/such/file.prom", "--fail-on", "info"]) == 2


def test_missing_file_with_json_prints_a_json_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--file", "no/such/file.prom", "--json"]) == 2
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert error["reason"] == "usage" and "--file no/such/file.prom" in error["message"]
    assert "--file" in captured.err


@pytest.mark.parametrize(("flags", "named"), [
    (["--fail-on", "loud"], "--fail-on"),  # argparse's own choices check
    (["--no-such-flag"], "--no-such-flag"),  # an unknown flag, found by the top-level parser
])
def test_argument_errors_with_json_print_a_json_error_too(flags: list[str], named: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check", "--file", str(FIXTURES / "gen-0.9-both-usage-names.prom"), "--json", *flags])
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert exc.value.code == 2 and error["reason"] == "usage" and named in error["message"]
    assert named in captured.err


def test_a_stray_argument_is_echoed_with_its_url_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    # `kvwatch serve URL` (a URL given as check takes it) or a misspelt flag printed the password to the log
    with pytest.raises(SystemExit):
        main(["serve", "http://alice:S3cretPW@vllm:8000/metrics"])
    err = capsys.readouterr().err
    assert "S3cretPW" not in err and "http://***@vllm:8000/metrics" in err
    with pytest.raises(SystemExit):
        main(["check", "--json", "--targeturl=http://alice:S3cretPW@vllm:8000/metrics"])
    captured = capsys.readouterr()
    assert "S3cretPW" not in captured.out + captured.err and "--targeturl=http://***@vllm" in captured.out


def test_argument_errors_without_json_print_nothing_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["check", "--file", str(FIXTURES / "gen-0.9-both-usage-names.prom"), "--fail-on", "loud"])
    assert capsys.readouterr().out == ""


def test_a_url_without_metrics_gets_a_hint(live_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Something answers at the root with a page that is no payload: the hint names the /metrics path.
    _Handler.body = b"<html>an API server's index page</html>\n"
    root = live_target.removesuffix("/metrics")
    assert main(["check", root, "--json"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    hint = f"vLLM and SGLang serve their metrics at /metrics: try {root}/metrics"
    assert error["reason"] == "parse" and error["hint"] == hint
    assert main(["check", root + "/"]) == 3
    assert f"hint: {hint}" in capsys.readouterr().err
    assert main(["check", root + "/health"]) == 3  # another endpoint is replaced, not extended
    assert f"hint: {hint}" in capsys.readouterr().err
    assert main(["check", root + "/metric"]) == 3  # so is a misspelt /metrics (it said "try .../metric/metrics")
    assert f"hint: {hint}" in capsys.readouterr().err
    assert main(["check", live_target, "--json"]) == 3
    assert "hint" not in json.loads(capsys.readouterr().out)["error"]
    # credentials in the URL are redacted in the hint, as in the source (it printed the password)
    with_password = root.replace("http://", "http://alice:S3cretPW@")
    assert main(["check", with_password, "--json"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert "S3cretPW" not in json.dumps(error) and error["hint"].endswith("try http://***@" + root[7:] + "/metrics")


def test_the_metrics_path_hint_only_for_an_answer_that_is_no_metrics_page(
        live_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    # A body cut short, or an engine's 500, came from the right path: the hint sent users to /chunked/metrics for a
    # body cut short. A whole body that is no exposition still gets it, whatever line it breaks on.
    elsewhere = live_target.removesuffix("/metrics") + "/stats"
    _Handler.body = (FIXTURES / "gen-0.11-kv-only.prom").read_bytes().rstrip(b"\n")  # ends mid-line, no length
    assert main(["check", elsewhere, "--json"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["reason"] == "parse" and "incomplete body" in error["message"] and "hint" not in error
    _Handler.body = b"\n<html>an index page after a blank line</html>\n"
    assert main(["check", elsewhere, "--json"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    root = live_target.removesuffix("/metrics")
    assert error["message"].startswith("line 2:") and error["hint"].endswith(
        f"try {root}/metrics (or {elsewhere}/metrics where the engine is served under /stats)")
    _Handler.body = b"# HELP x caf\xe9\nx 1\n"  # Latin-1 bytes: no UTF-8 page
    assert main(["check", elsewhere, "--json"]) == 3
    assert "hint" in json.loads(capsys.readouterr().out)["error"]
    _Handler.status = 500
    assert main(["check", elsewhere, "--json"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["reason"] == "http_status" and "hint" not in error
    _Handler.status = 404
    assert main(["check", elsewhere, "--json"]) == 3
    hint = json.loads(capsys.readouterr().out)["error"]["hint"]
    assert hint.endswith(f"or {elsewhere}/metrics where the engine is served under /stats)")


def test_one_waiting_request_at_low_usage_is_not_scheduler_limited() -> None:
    def state(waiting: float, running: float, by_reason: dict[str, float] | None = None):
        return derive(Reading("m", kv_usage_ratio=0.19, requests_running=running, requests_waiting=waiting,
                              waiting_by_reason=by_reason or {}, kv_capacity_tokens=1000.0), None)

    assert [f.id for f in findings([state(1, 5)])] == []  # one request between scheduler steps
    assert [f.id for f in findings([state(3, 100)])] == []  # 3 % of the batch: not a standing queue
    assert [f.id for f in findings([state(3, 12)])] == ["scheduler_limited"]
    # Deferred requests (LoRA slot, KV transfer) are not the scheduler's limit.
    assert [f.id for f in findings([state(4, 12, {"capacity": 0.0, "deferred": 4.0})])] == []


def test_a_queue_the_next_prompt_does_not_fit_is_kv_bound_below_90_percent() -> None:
    # Long contexts (v9, as serve's forecaster): 85 % of 400,000 tokens used leaves 60,000 free, fewer than the mean
    # prompt of 110,000, so the queue waits for KV; raising --max-num-seqs would start nothing. Prompts of 2,000
    # fit: the same queue is the scheduler's.
    def state(prompt: float):
        return derive(Reading("m", kv_usage_ratio=0.85, requests_running=3, requests_waiting=8,
                              kv_capacity_tokens=400_000.0, request_prompt_tokens_sum=prompt * 50,
                              request_prompt_tokens_count=50), None)

    long, short = findings([state(110_000)]), findings([state(2_000)])
    assert [f.id for f in long] == ["kv_bound"] and [f.id for f in short] == ["scheduler_limited"]
    assert "60,000 tokens free are fewer than the 110,000 a mean prompt needs" in long[0].message
    # A prompt the prefix cache holds 90 % of needs 11,000: room enough, the scheduler holds the queue back.
    cached = derive(Reading("m", kv_usage_ratio=0.85, requests_running=3, requests_waiting=8,
                            kv_capacity_tokens=400_000.0, request_prompt_tokens_sum=110_000 * 50,
                            request_prompt_tokens_count=50, prefix_cache_queries_total=1e6,
                            prefix_cache_hits_total=9e5), None)
    assert [f.id for f in findings([cached])] == ["scheduler_limited"]


def test_human_text_has_plurals_no_dicts_and_no_unknown_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")]) == 0
    out = capsys.readouterr().out
    assert "{" not in out.replace('{state="scheduler_limited"}', "") and "'capacity'" not in out
    assert "4 waiting (3 for capacity, 1 for deferred)" in out
    assert main(["check", "--file", str(FIXTURES / "gen-0.8.5-engine-label.prom")]) == 0
    out = capsys.readouterr().out
    assert "unknown tokens" not in out and "KV capacity     unknown" in out
    one = derive(Reading("m", kv_usage_ratio=0.97, requests_running=5.0, requests_waiting=1.0,
                         preemptions_total=1.0, kv_capacity_tokens=1000.0), None)
    messages = " ".join(f.message for f in findings([one]))
    assert "with 1 request waiting" in messages and "1 preemption since" in messages
    assert "1 requests" not in messages and "1 preemptions" not in messages


@pytest.mark.parametrize("usage", ["+Inf", "-Inf", "1e308", "-1", "1.5"])
def test_impossible_usage_is_never_printed_as_a_percentage(usage: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    payload = tmp_path / "bad.prom"
    payload.write_text(NAN_PAYLOAD.replace("} NaN", f"}} {usage}").replace("} +Inf", "} -3"))
    assert main(["check", "--file", str(payload)]) == 0
    out = capsys.readouterr().out
    assert "KV usage        unknown\n" in out and "inf%" not in out and "e+308%" not in out
    assert "[warning] usage_unknown" in out and "requests_running = -3" in out


def test_without_max_model_len_the_advice_reads_the_engines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The engine runs --max-model-len 131072 (163,840 tokens at 1.25x); its requests are <= 1,500 tokens (buckets).
    text = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    path = tmp_path / "long.prom"
    path.write_text(_bounded_lengths(text).replace('kv_cache_max_concurrency="20.0"',
                                                   'kv_cache_max_concurrency="1.25"'))
    report = check_json(["--file", str(path)], capsys)
    messages = [a["message"] for s in report["series"] for a in s["advice"]]
    assert any(m.startswith("Lower --max-model-len from 131072 to ") for m in messages), messages
    # at the engine's 8,192 those requests leave nothing to lower
    unchanged = check_json(["--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")], capsys)
    assert not any("max-model-len" in a["message"] for s in unchanged["series"] for a in s["advice"])


ENGINE_FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(("fixture", "engine", "limit_flag", "tp_flag"), [
    ("sglang-metrics/gen-rank-labels-dp2.prom", "SGLang", "--max-running-requests", "--tp-size"),
    ("tensorrt-llm-metrics/gen-trtllm-serve.prom", "TensorRT-LLM", "--max_batch_size", "--tp_size"),
])
def test_advice_gives_each_engines_own_flags(fixture: str, engine: str, limit_flag: str, tp_flag: str,
                                             tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (ENGINE_FIXTURES / fixture).read_text()
    if engine == "TensorRT-LLM":  # the trtllm-serve capture is calm: make it KV-bound
        text = text.replace('engine_type="trtllm"} 0.75', 'engine_type="trtllm"} 0.97').replace(
            'trtllm_num_requests_waiting{model_name="nvidia/Llama-3.1-8B-Instruct-FP8",engine_type="trtllm"} 0.0',
            'trtllm_num_requests_waiting{model_name="nvidia/Llama-3.1-8B-Instruct-FP8",engine_type="trtllm"} 9.0')
    (tmp_path / "p.prom").write_text(text)
    fixture = str(tmp_path / "p.prom")
    report = check_json(["--file", fixture], capsys)
    fixes = next(s["advice"] for s in report["series"] if s["advice"])
    limit = fixes[0]
    assert limit["engine_args"] == [limit_flag, str(limit["concurrency"])] and limit["vllm_args"] is None
    assert f"pass {limit_flag} {limit['concurrency']} to {engine}" in limit["message"]
    assert "--max-num-seqs" not in json.dumps(report) and "vLLM" not in json.dumps(fixes)
    assert tp_flag in fixes[-1]["message"]
    assert main(["check", "--file", fixture]) == 0
    assert f"{engine} flags: {limit_flag} " in capsys.readouterr().out


def test_sglang_quantization_and_tp_advice_use_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    # (its two tp_ranks: with --tensor-parallel-size 1 the TP fix would paste the size it runs, and is left out)
    report = check_json(["--file", str(ENGINE_FIXTURES / "sglang-metrics/gen-rank-labels-dp2.prom"),
                         "--gpu", "H100", "--tensor-parallel-size", "2"], capsys)
    fixes = {a["action"]: a for s in report["series"] for a in s["advice"]}
    assert fixes["quantize_weights"]["engine_args"] == ["--quantization", "fp8"]
    assert fixes["quantize_kv_cache"]["engine_args"] == ["--kv-cache-dtype", "fp8_e4m3"]
    assert "--kv-cache-dtype fp8_e4m3" in fixes["quantize_kv_cache"]["message"]
    assert fixes["add_tensor_parallelism"]["engine_args"] == ["--tp-size", "4"]


def test_scheduler_limited_names_the_engines_own_budget_flags() -> None:
    waiting = derive(Reading("m", kv_usage_ratio=0.3, requests_running=10.0, requests_waiting=8.0,
                             kv_capacity_tokens=100000.0), None)
    messages = {kind: next(f.message for f in findings([waiting], engine_kind=kind) if f.id == "scheduler_limited")
                for kind in ("vllm", "sglang", "tensorrt-llm")}
    assert "--max-num-seqs or --max-num-batched-tokens" in messages["vllm"]
    assert "--max-running-requests or --max-prefill-tokens" in messages["sglang"]
    assert "--schedule-conservativeness" in messages["sglang"]
    assert "--max_batch_size or --max_num_tokens" in messages["tensorrt-llm"]
    # With the running cap given (TensorRT-LLM has no data-parallel ranks to share it: a division by zero crashed
    # check here).
    fixes = {kind: next(f.message for f in findings([waiting], engine_kind=kind, max_num_seqs=64)
                        if f.id == "scheduler_limited") for kind in ("vllm", "sglang", "tensorrt-llm")}
    assert "10 requests run, well under --max_batch_size 64, so that cap is not it: raise --max_num_tokens" \
        in fixes["tensorrt-llm"]
    assert "well under --max-num-seqs 64" in fixes["vllm"]


def test_a_gzip_payload_file_is_inflated_within_the_body_limit(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    plain = (FIXTURES / "gen-0.9-both-usage-names.prom").read_bytes()
    packed = tmp_path / "metrics.prom.gz"
    packed.write_bytes(gzip.compress(plain))
    assert check_json(["--file", str(packed)], capsys) == check_json(
        ["--file", str(FIXTURES / "gen-0.9-both-usage-names.prom")], capsys)
    # Two members are one gzip body (the fetcher reads both); before, --file read the first half of the page.
    half = plain.index(b"\n# HELP", len(plain) // 2) + 1
    packed.write_bytes(gzip.compress(plain[:half]) + gzip.compress(plain[half:]))
    assert check_json(["--file", str(packed)], capsys) == check_json(
        ["--file", str(FIXTURES / "gen-0.9-both-usage-names.prom")], capsys)
    cases = {"truncated": (gzip.compress(plain)[:100], "parse", "compressed stream cut short"),
             "bomb": (gzip.compress(b"a" * 4_000_000), "too_large", "--max-body-bytes"),
             "broken": (b"\x1f\x8b" + b"not a gzip stream", "parse", "cannot decode body"),
             "trailing": (gzip.compress(plain) + b"garbage", "parse", "data after the end")}
    for name, (data, reason, said) in cases.items():
        path = tmp_path / f"{name}.gz"
        path.write_bytes(data)
        assert main(["check", "--file", str(path), "--json", "--max-body-bytes", "1048576"]) == 3, name
        error = json.loads(capsys.readouterr().out)["error"]
        assert error["reason"] == reason and said in error["message"], name


def test_a_payload_saved_on_windows_reads_as_saved_on_linux(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # `curl ... > m.prom` in Windows PowerShell 5.1 writes UTF-16 with a BOM and CRLF; other tools a UTF-8 BOM or
    # CRLF alone. --file said "invalid utf-8 at byte 0" or refused the CRs
    page = FIXTURES / "gen-0.9-both-usage-names.prom"
    expected = check_json(["--file", str(page)], capsys)
    text = page.read_text()
    saved = {"utf16": "\ufeff" + text.replace("\n", "\r\n"), "bom": "\ufeff" + text, "crlf": text.replace("\n", "\r\n")}
    for name, content in saved.items():
        path = tmp_path / f"{name}.prom"
        path.write_bytes(content.encode("utf-16-le" if name == "utf16" else "utf-8"))
        assert check_json(["--file", str(path)], capsys) == expected, name


def test_the_metrics_path_hint_only_when_something_answered(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 9 on loopback refuses: the path is not what is wrong, so no /metrics hint.
    assert main(["check", "http://127.0.0.1:9/", "--json", "--poll-timeout-seconds", "2"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["reason"] == "connect" and "hint" not in error


def test_a_first_run_with_nothing_listening_at_the_default_is_told_what_to_pass(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A bare `kvwatch check` with no vLLM on :8000 printed a ConnectError and nothing else; a URL given is not
    # second-guessed.
    monkeypatch.delenv("KVWATCH_TARGET_URL", raising=False)
    import socket

    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", 8000)) != 0, "something listens on 127.0.0.1:8000, the default target"
    assert main(["check", "--json", "--poll-timeout-seconds", "2"]) == 3
    assert "Pass its /metrics URL" in json.loads(capsys.readouterr().out)["error"]["hint"]
    assert main(["check", "http://127.0.0.1:9/metrics", "--json", "--poll-timeout-seconds", "2"]) == 3
    assert "hint" not in json.loads(capsys.readouterr().out)["error"]


def test_a_bad_url_argument_is_named_as_the_url(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["check", "notaurl"]) == 2
    assert "invalid value 'notaurl' for URL" in capsys.readouterr().err
    # a bad KVWATCH_TARGET_URL beside the argument: the user typed no --target-url
    monkeypatch.setenv("KVWATCH_TARGET_URL", "bad")
    assert main(["check", "http://127.0.0.1:9/metrics"]) == 2
    assert "for KVWATCH_TARGET_URL" in (err := capsys.readouterr().err) and "though URL is given" in err, err
    monkeypatch.delenv("KVWATCH_TARGET_URL")
    # two different URLs, as the argument and as --target-url: the argument won without a word
    assert main(["check", "http://a.invalid/metrics", "--target-url", "http://b.invalid/metrics"]) == 2
    assert "give the URL once" in capsys.readouterr().err


def test_a_capacity_from_blocks_for_a_model_kvwatch_does_not_know_carries_its_caveat(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM 0.9-0.19 (blocks, no kv_cache_size_tokens label): a hybrid model's groups would divide the figure.
    payload = tmp_path / "unknown-model.prom"
    text = (FIXTURES / "gen-0.9-both-usage-names.prom").read_text()
    name = interpret_names(text)
    payload.write_text(text.replace(f'model_name="{name}"', 'model_name="acme/private-finetune"'))
    report = check_json(["--file", str(payload)], capsys)
    assert [f["id"] for f in report["findings"]] == ["capacity_groups_unknown"]
    assert "--model" in report["findings"][0]["message"]
    # A model kvwatch knows needs no caveat (its layout divides the blocks), nor a V0 payload (one group).
    assert check_json(["--file", str(FIXTURES / "gen-0.9-both-usage-names.prom")], capsys)["findings"] == []
    assert check_json(["--file", str(FIXTURES / "v0-engine-qwenvl.prom")], capsys)["findings"] == []


def interpret_names(text: str) -> str:
    from kvwatch.payload import interpret

    (name,) = {r.model_name for r in interpret(text, None, timestamp=0.0).readings}
    return name


def test_a_sleeping_engine_gets_no_kv_diagnosis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's sleep mode releases the KV cache: requests wait, nothing runs, usage 0. That is not a request too
    # large for the pool (request_exceeds_pool) nor a scheduler limit.
    text = (FIXTURES / "gen-0.16-sleep-state-dp2.prom").read_text()
    for old, new in (('running{engine="0",model_name="m"} 10.0', 'running{engine="0",model_name="m"} 0.0'),
                     ('waiting{engine="0",model_name="m"} 0.0', 'waiting{engine="0",model_name="m"} 12.0'),
                     ('perc{engine="0",model_name="m"} 0.2', 'perc{engine="0",model_name="m"} 0.0')):
        assert old in text
        text = text.replace(old, new)
    awake = text
    asleep = text.replace('vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0',
                          'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0\n'
                          'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} 1.0')
    for name, body in (("awake.prom", awake), ("asleep.prom", asleep)):
        (tmp_path / name).write_text(body)
    engine0 = [i for i, e in ids(check_json(["--file", str(tmp_path / "awake.prom")], capsys)) if e == "0"]
    assert "request_exceeds_pool" in engine0  # awake, the same queue is the stuck-request symptom
    report = check_json(["--file", str(tmp_path / "asleep.prom")], capsys)
    engine0 = [i for i, e in ids(report) if e == "0"]
    assert "engine_asleep" in engine0
    assert not {"request_exceeds_pool", "scheduler_limited", "kv_bound"} & set(engine0)
    assert report["series"][0]["sleep_state"] == "weights_offloaded"
    # Engine 1 is kv_bound beside it: a rank asleep has no room to offer, so that is no unbalanced_ranks (it sent
    # on-call to DP load balancing for a rank put to sleep). Awake and as empty, it is one.
    assert "kv_bound" in [i for i, e in ids(report) if e == "1"]
    assert "unbalanced_ranks" not in [i for i, _ in ids(report)]
    assert "unbalanced_ranks" in [i for i, _ in ids(check_json(["--file", str(tmp_path / "awake.prom")], capsys))]
    # Nor does its frozen mix set the server's gateway total: one quiet request on the sleeping rank read "(8 for the
    # server's 2, by engine 0's 4)" where the awake rank's limit is 29 (serve exports no limit for it either).
    quiet = asleep.replace('running{engine="0",model_name="m"} 0.0', 'running{engine="0",model_name="m"} 1.0')
    quiet = quiet.replace('perc{engine="0",model_name="m"} 0.0', 'perc{engine="0",model_name="m"} 0.2')
    (tmp_path / "quiet.prom").write_text(quiet)
    (advice,) = [a for s in check_json(["--file", str(tmp_path / "quiet.prom")], capsys)["series"] if s["engine"] == "1"
                 for a in s["advice"] if a["action"] == "limit_concurrency"]
    n = advice["concurrency"]
    assert f"{n} per data-parallel rank ({2 * n} for the server's 2)" in advice["message"]
    # awake 0 alone: vLLM's sleep level 0 (paused, the KV kept) or release_kv_cache_memory write it; "its KV cache is
    # released" was said beside a usage of 60 % (vllm/v1/metrics/loggers.py, record_sleep_state)
    paused = text.replace('vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0',
                          'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0')
    (tmp_path / "paused.prom").write_text(paused)
    report = check_json(["--file", str(tmp_path / "paused.prom")], capsys)
    (message,) = [f["message"] for f in report["findings"] if f["id"] == "engine_asleep" and f["engine"] == "0"]
    assert "paused (vLLM's sleep level 0: its KV cache is kept) or has released its KV cache" in message
    assert report["series"][0]["sleep_state"] == "asleep"
    assert main(["check", "--file", str(tmp_path / "paused.prom")]) == 0
    assert "tokens once awake (the engine is asleep)\n" in capsys.readouterr().out  # not "asleep: asleep"
    # the summary's capacity and ceilings are the pool it gets back, not room now
    assert main(["check", "--file", str(tmp_path / "asleep.prom")]) == 0
    engine0_text = capsys.readouterr().out.split("engine 1:")[0]
    assert re.search(r"KV capacity +[\d,]+ tokens once awake \(the engine is asleep: weights_offloaded\)",
                     engine0_text)
    assert re.search(r"max concurrency .* at max-model-len once awake", engine0_text)


def test_a_queue_of_deferred_requests_is_not_kv_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    engine0 = 'engine="0",model_name="llama",reason='
    for old, new in ((f'{engine0}"capacity"}} 3.0', f'{engine0}"capacity"}} 0.0'),
                     (f'{engine0}"deferred"}} 1.0', f'{engine0}"deferred"}} 4.0')):
        assert old in text
        text = text.replace(old, new)
    assert ("kv_bound", "0") in ids(check_json(["--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")], capsys))
    (tmp_path / "deferred.prom").write_text(text)
    report = check_json(["--file", str(tmp_path / "deferred.prom")], capsys)
    assert ("kv_bound", "0") not in ids(report)  # 4 wait for a LoRA slot or a KV transfer, not for KV room
    # (the cache is 96 % full all the same: kv_full, whose fixes are the full cache's, not the queue's)
    assert ("kv_full", "0") in ids(report) and report["series"][0]["kv_usage_ratio"] >= 0.95


def test_deeply_nested_json_is_a_parse_error_without_a_traceback(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["check", "--file", str(tmp_path / "deep.json"), "--json"]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"]["reason"] == "parse"
    assert "Traceback" not in captured.err


def test_a_payload_opening_with_a_quoted_metric_name_is_text_not_json(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    body = ('{"vllm:num_requests_running",model_name="m"} 3\n{"vllm:num_requests_waiting",model_name="m"} 0\n'
            '{"vllm:kv_cache_usage_perc",model_name="m"} 0.5\n')
    (tmp_path / "quoted.prom").write_text(body)
    report = check_json(["--file", str(tmp_path / "quoted.prom")], capsys)
    assert report["series"][0]["requests_running"] == 3


def test_a_queue_at_90_to_95_percent_is_kv_bound_as_serve_says(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # serve counts a poll at usage >= 0.90 with a queue as saturated (bottleneck); check needed 0.95 and gave no
    # finding at all between 0.90 and 0.95, so `check --fail-on critical` passed a cache at 93 % with 200 waiting.
    text = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    old = 'vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.96'
    assert old in text
    (tmp_path / "p.prom").write_text(text.replace(old, old[:-4] + "0.93"))
    report = check_json(["--file", str(tmp_path / "p.prom")], capsys)
    assert ("kv_bound", "0") in ids(report)
    assert report["series"][0]["advice"]


def test_sglang_data_parallel_advice_names_the_servers_total_and_dp_attentions_value(
        capsys: pytest.CaptureFixture[str]) -> None:
    # SGLang divides --max-running-requests over its ranks only with --enable-dp-attention (tp_worker.py), which
    # the payload does not say: the per-rank value goes to engine_args, the message gives the other and the total.
    path = Path(__file__).parent / "fixtures" / "sglang-metrics" / "gen-rank-labels-dp2.prom"
    report = check_json(["--file", str(path)], capsys)
    assert [s["engine"] for s in report["series"]] == ["0", "1"]  # two dp_rank series of one model
    (limit,) = [a for a in report["series"][1]["advice"] if a["action"] == "limit_concurrency"]
    n = limit["concurrency"]
    assert limit["engine_args"] == ["--max-running-requests", str(n)]
    # The server's total is the tightest rank's limit times the ranks, as docs/runbooks.md builds it from the
    # sidecar's kvwatch_recommended_max_concurrency (this rank's 55 × 2 = 110 overfilled engine 0, whose limit is 50).
    from kvwatch.advisor import concurrency_limit

    smallest = concurrency_limit(None, report["series"][0]["max_concurrency"])  # engine 0's (it gets no advice)
    assert smallest is not None and smallest < n
    total = f"{n} per data-parallel rank ({2 * smallest} for the server's 2, by engine 0's {smallest})"
    assert total in limit["message"]
    assert f"with --enable-dp-attention SGLang divides the flag over its 2 ranks: pass {2 * smallest} then" in \
        limit["message"]


def test_triton_backend_advice_names_its_build_settings_and_no_launch_flags(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Triton's TensorRT-LLM backend is configured in the engine build and config.pbtxt: trtllm-serve's
    # --max_batch_size pasted onto Triton's command line does nothing.
    report = check_json(["--file", str(ENGINE_FIXTURES / "tensorrt-llm-metrics/gen-triton-waiting-fraction.prom")],
                        capsys)
    fixes = next(s["advice"] for s in report["series"] if s["advice"])
    assert all(a["engine_args"] is None for a in fixes)
    assert "max_batch_size" in fixes[0]["message"] and "config.pbtxt" in fixes[0]["message"]
    assert "--max_batch_size" not in json.dumps(report)
    # the place in a clause of its own, not nested in the engine's name in every sentence that names it
    text = " ".join(a["message"] for a in fixes)
    assert "backend (in the engine build" not in text and ") (" not in text, text


def test_more_prefix_cache_hits_than_queries_is_implausible() -> None:
    # A hit is a query answered from the cache: a page with more hits than queries reported a ratio of 1.5.
    from kvwatch.plausible import check_reading

    reading = Reading("m", kv_usage_ratio=0.5, prefix_cache_queries_total=100_000.0, prefix_cache_hits_total=150_000.0)
    checked, dropped = check_reading(reading)
    assert checked.prefix_cache_hit_ratio is None
    assert dropped == (("prefix_cache_hits_total", 150_000.0),)
    fine = Reading("m", kv_usage_ratio=0.5, prefix_cache_queries_total=100_000.0, prefix_cache_hits_total=100_000.0)
    assert check_reading(fine) == (fine, ())


@pytest.mark.parametrize("count", [1e-320, 0.5, 100.25])
def test_a_request_length_histograms_count_that_is_no_whole_number_is_implausible(count: float) -> None:
    # A count of requests is whole: 1e-320 made the mean request infinitely long and the ceiling an internal error
    # (check answered reason "internal"); 0.5 read a mean request of 400,500 tokens and a ceiling of 0.41.
    from kvwatch.plausible import check_reading

    reading = Reading("m", kv_usage_ratio=0.5, request_prompt_tokens_sum=400.0, request_prompt_tokens_count=count,
                      request_generation_tokens_sum=300.0, request_generation_tokens_count=count)
    checked, dropped = check_reading(reading)
    assert checked.request_prompt_tokens_count is None and checked.request_generation_tokens_count is None
    assert dropped == (("request_prompt_tokens_count", count), ("request_generation_tokens_count", count))
    page = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    line = 'vllm:request_prompt_tokens_count{engine="0",model_name="llama"} 100.0'
    assert line in page
    report = build_report(interpret(page.replace(line, line.replace("100.0", repr(count))), None, timestamp=0.0))
    (series, *_) = report["series"]
    assert series["mean_request_tokens"] is None and series["max_concurrency"] > 1
    assert "implausible_values" in [f["id"] for f in report["findings"]]


def test_an_unknown_running_count_is_no_standing_queue() -> None:
    # The queue is judged against the running requests (10 % of them); unknown running read as 0 raised
    # "the scheduler limits, not KV" on any page whose running family was renamed or NaN.
    def ids_for(running: float | None) -> list[str]:
        reading = Reading("m", kv_usage_ratio=0.01, requests_running=running, requests_waiting=3.0,
                          kv_capacity_tokens=100_000.0)
        return [f.id for f in findings([derive(reading, None)])]

    assert "scheduler_limited" not in ids_for(None)
    assert "scheduler_limited" in ids_for(10.0)


def test_a_model_name_with_a_newline_stays_on_its_lines_in_the_text_report(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # Label values may hold escaped newlines; printed raw they split the series heading and the finding line, and a
    # hostile name could fake a finding.
    name = 'm\\n  [critical] kv_bound (x/0): fake'
    payload = tmp_path / "newline.prom"
    payload.write_text("# TYPE vllm:kv_cache_usage_perc gauge\n"
                       f'vllm:kv_cache_usage_perc{{engine="0",model_name="{name}"}} 0.1\n'
                       "# TYPE vllm:num_requests_running gauge\n"
                       f'vllm:num_requests_running{{engine="0",model_name="{name}"}} 8\n'
                       "# TYPE vllm:num_requests_waiting gauge\n"
                       f'vllm:num_requests_waiting{{engine="0",model_name="{name}"}} 5\n')
    assert main(["check", "--file", str(payload)]) == 0
    out = capsys.readouterr().out
    assert not any(line.lstrip().startswith("[critical]") for line in out.splitlines())
    assert "m\\n  [critical] kv_bound (x/0): fake engine 0:" in out


def test_a_model_name_with_control_characters_stays_on_its_line_on_stderr(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # The report escaped it, but the notes on stderr ("no capacity plan for ...") printed the newline and the
    # terminal escape raw.
    name = "m\\nFAKE\x1b[2J"
    payload = tmp_path / "control.prom"
    payload.write_text("".join(f'{family}{{engine="0",model_name="{name}"}} {value}\n' for family, value in (
        ("vllm:kv_cache_usage_perc", 0.5), ("vllm:num_requests_running", 3), ("vllm:num_requests_waiting", 0))))
    assert main(["check", "--file", str(payload), "--gpu", "H100"]) == 0
    err = capsys.readouterr().err
    assert "no capacity plan for m\\nFAKE\\x1b[2J" in err and "\x1b" not in err
    assert not any(line.startswith("FAKE") for line in err.splitlines())


def test_a_two_group_model_on_a_0_18_to_0_20_page_is_read_in_its_own_terms(capsys: pytest.CaptureFixture[str]) -> None:
    # gpt-oss-20b on vLLM 0.20.2 (12 full + 12 sliding layers, 2 KV groups). Its label set is 0.18-0.20.x's; the
    # engine's figure comes from its blocks (149,506 // 2 groups x 16). The formula's was compared in 0.20's
    # int(concurrency x max_model_len) terms: a false 59 % capacity_mismatch. The max-model-len ceiling was
    # blocks / ceil(32768 / 16) = 73.0, where vLLM's groups and window give 58.2 (the plan's sums, same blocks).
    from kvwatch.capacity import DeploymentSpec, plan_capacity, resolve_model
    from kvwatch.capacity.kv import max_concurrency_at_max_model_len

    report = check_json(["--file", str(FIXTURES / "gen-0.20.2-gptoss-two-groups.prom"), "--gpu", "H100",
                         "--max-model-len", "32768"], capsys)
    assert "capacity_mismatch" not in [f["id"] for f in report["findings"]]
    series = report["series"][0]
    assert series["kv_capacity_tokens"] == 149_506 // 2 * 16
    plan = plan_capacity(DeploymentSpec(arch=resolve_model("openai/gpt-oss-20b"), gpu_name="H100",
                                        gpu_memory_bytes=80 * 2**30, max_model_len=32768, vllm_version=(0, 20)))
    expected = max_concurrency_at_max_model_len(plan.layout, 149_506, 32768, plan.in_flight_tokens)
    assert series["max_concurrency_max_model_len"] == pytest.approx(expected)
    assert 55 < expected < 60


def test_a_real_0_11_cache_config_is_read_as_0_11_with_its_kv_groups(capsys: pytest.CaptureFixture[str]) -> None:
    # Every CacheConfig from 0.8.5 to 0.19 carries swap_space_bytes beside swap_space (its
    # __post_init__ sets it; vllm-project/vllm#28924's real 0.11.0 line). kvwatch read that label as V0's: the
    # version range came out "unknown", capacity used pre-0.9 rules, and gpt-oss-20b's two KV groups were ignored
    # (9,271 blocks x 16 = 148,336 tokens, twice the truth).
    report = check_json(["--file", str(FIXTURES / "gen-0.11.0-gptoss-issue28924.prom"), "--gpu", "H100", "--json"],
                        capsys)
    series = report["series"][0]
    assert series["kv_capacity_tokens"] == 9271 // 2 * 16
    assert report["version_range"] == "0.11"


def test_sglang_and_tensorrt_llm_get_no_vllm_capacity_sums(capsys: pytest.CaptureFixture[str]) -> None:
    # Their pools are sized their own way (--mem-fraction-static, free_gpu_memory_fraction): a healthy
    # trtllm-serve given --gpu got a capacity_mismatch blaming --gpu-memory-utilization, and exit 1 on warnings.
    trtllm = Path(__file__).parent / "fixtures" / "tensorrt-llm-metrics" / "gen-trtllm-serve.prom"
    assert main(["check", "--file", str(trtllm), "--gpu", "H100", "--fail-on", "warning", "--json"]) == 0
    assert "capacity_mismatch" not in capsys.readouterr().out


def test_an_unknown_model_on_a_0_18_to_0_20_page_still_gets_the_groups_note(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Those releases share blocks among KV groups like 0.9-0.17 (no kv_cache_size_tokens label yet); the note
    # was gated below 0.20, and this label set reads as 0.20.
    payload = tmp_path / "unknown.prom"
    payload.write_text((FIXTURES / "gen-0.20.2-gptoss-two-groups.prom").read_text().replace(
        'model_name="openai/gpt-oss-20b"', 'model_name="my-finetune"'))
    report = check_json(["--file", str(payload)], capsys)
    assert "capacity_groups_unknown" in [f["id"] for f in report["findings"]]


def test_scheduler_limited_names_the_limit_the_given_max_num_seqs_points_at(
        capsys: pytest.CaptureFixture[str]) -> None:
    # 12 running with 3 waiting at 50 % KV: under --max-num-seqs 256 the running cap is not what holds them back
    # (it said "raise --max-num-seqs" anyway); at --max-num-seqs 12 it is.
    path = str(FIXTURES / "gen-0.8.5-engine-label.prom")

    def message(*flags: str) -> str:
        report = check_json(["--file", path, "--gpu", "H100", *flags], capsys)  # (the page has no capacity)
        return next(f["message"] for f in report["findings"] if f["id"] == "scheduler_limited")

    assert "well under --max-num-seqs 256" in message("--max-num-seqs", "256")
    assert "raise --max-num-batched-tokens" in message("--max-num-seqs", "256")
    assert "at --max-num-seqs 12: raise --max-num-seqs" in message("--max-num-seqs", "12")
    assert "Raise --max-num-seqs or --max-num-batched-tokens" in message()
    # a margin of one request at a small cap: 7 running of --max-num-seqs 8 is at it (0.9 x 8 = 7.2 called 7 "well
    # under")
    seven = derive(Reading("m", kv_usage_ratio=0.5, requests_running=7.0, requests_waiting=3.0,
                           kv_capacity_tokens=1000.0), None)
    (limited,) = findings([seven], max_num_seqs=8)
    assert "7 requests run, at --max-num-seqs 8: raise --max-num-seqs" in limited.message
    # and on an SGLang rank of two sharing a cap of 8 (4 each with --enable-dp-attention), 3 running may be at it
    from kvwatch.advisor import ENGINE_FLAGS
    from kvwatch.check import _scheduler_fix

    assert "on this rank: under --max-running-requests 8, but at the 4 each" in _scheduler_fix(
        3.0, 8, ENGINE_FLAGS[SGLANG], SGLANG, ranks=2)
    # 256 running under a --max-num-seqs 128 kvwatch was given: not "at" it; the flag is not the engine's
    over = _scheduler_fix(256.0, 128, ENGINE_FLAGS[VLLM], VLLM)
    assert "more than the --max-num-seqs 128 kvwatch was given" in over and "at --max-num-seqs" not in over


@pytest.mark.parametrize(("usage", "found"), [(0.30, "queue_not_admitted"), (0.04, "request_exceeds_pool"),
                                               (0.97, "kv_usage_stuck")])
def test_a_queue_with_nothing_running_is_no_scheduler_limit(usage: float, found: str) -> None:
    # 40 waiting beside 0 running at 30 % were told "raise --max-num-seqs": no cap holds back a
    # queue while nothing runs (a stall, blocks no running request holds, or a head request larger than what is free)
    reading = Reading("m", kv_usage_ratio=usage, requests_running=0.0, requests_waiting=40.0,
                      kv_capacity_tokens=100_000.0, waiting_holds_no_kv=True)  # (vLLM's: a waiting request holds none)
    report = build_report(Poll(0.0, Detection(VLLM, "0.20+", "vllm:kv_cache_usage_perc"), (reading,)))
    ids_found = [f["id"] for f in report["findings"]]
    assert found in ids_found and "scheduler_limited" not in ids_found
    if found == "queue_not_admitted":
        (message,) = [f["message"] for f in report["findings"] if f["id"] == found]
        assert "40 requests wait and none runs while KV is 30.0% used" in message
        assert "needs more than the 70,000 tokens free" in message
    else:  # request_exceeds_pool says more of a near-empty cache, kv_usage_stuck of a full one
        assert "queue_not_admitted" not in ids_found
    running = derive(Reading("m", kv_usage_ratio=0.30, requests_running=12.0, requests_waiting=40.0,
                             kv_capacity_tokens=100_000.0), None)
    assert [f.id for f in findings([running])] == ["scheduler_limited"]


@pytest.mark.parametrize(("flag", "value"), [("--usage-metric", "nonexist"),
                                             ("--waiting-metric", "vllm:num_requests_waitin")])
def test_a_source_metric_that_matches_nothing_is_refused_naming_the_flag(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    # A typo silently dropped the engine's own metric: "KV usage from nonexist", then "pass --usage-metric".
    path = str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")
    assert main(["check", "--file", path, flag, value]) == 3
    err = capsys.readouterr().err
    assert f"{flag} {value} matches no sample in the payload" in err
    assert main(["check", "--file", path, flag, value.replace("waitin", "waiting").replace("nonexist",
                 "vllm:kv_cache_usage_perc")]) == 0


def test_a_source_metric_declared_but_not_set_yet_is_unknown_not_a_refusal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # prometheus_client shows a labelled gauge only once it is set (a proxy before its first request): refusing the
    # page took the whole engine down (the sidecar's kvwatch_up 0) for one value not there yet.
    page = tmp_path / "lazy.prom"
    page.write_text('# HELP gateway_queue_depth Requests queued at the gateway.\n# TYPE gateway_queue_depth gauge\n'
                    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
                    'vllm:num_requests_running{engine="0",model_name="m"} 3\n')
    report = check_json(["--file", str(page), "--waiting-metric", 'gateway_queue_depth{model="m"}'], capsys)
    series = report["series"][0]
    assert series["kv_usage_ratio"] == 0.5 and series["requests_waiting"] is None
    report = check_json(["--file", str(page), "--usage-metric", 'gateway_queue_depth{model="m"}'], capsys)
    (unknown,) = [f for f in report["findings"] if f["id"] == "usage_unknown"]
    assert "matches no sample in this payload yet" in unknown["message"]


def test_rename_metrics_reads_a_proxys_names_for_any_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Only usage, running and waiting could be named: a proxy's renamed preemption counter and cache_config_info
    # left kvwatch_up 1, preemptions unknown and the preemption alerts silent, without a word.
    text = (FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()
    own = check_json(["--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")], capsys)["series"]
    page = tmp_path / "proxy.prom"
    page.write_text(text.replace("vllm:num_preemptions", "proxy_preemptions").replace("vllm:cache_config_info",
                                                                                        "proxy_cache_config_info")
                    .replace("vllm:kv_cache_usage_perc", "proxy_kv_usage"))
    plain = check_json(["--file", str(page)], capsys)
    assert plain["series"][0]["preemptions_total"] is None and plain["series"][0]["kv_capacity_tokens"] is None
    renames = ("proxy_preemptions=vllm:num_preemptions, proxy_cache_config_info=vllm:cache_config_info,"
               "proxy_kv_usage=vllm:kv_cache_usage_perc")
    report = check_json(["--file", str(page), "--rename-metrics", renames], capsys)
    assert report["series"] == own
    assert report["usage_metric"] == "proxy_kv_usage" and "proxy_cache_config_info" in report["capacity_metric"]
    # what the page decides: the target's (exit 3)
    for bad, why in (("proxy_preemption_total=vllm:num_preemptions_total", "the payload has no proxy_preemption_total"),
                     ("proxy_kv_usage=vllm:num_requests_running", "the payload has vllm:num_requests_running too")):
        assert main(["check", "--file", str(page), "--rename-metrics", bad]) == 3
        assert why in capsys.readouterr().err
    # an engine-side typo, or a family on one side and a sample on the other, read nothing silently; whatever the
    # page, so a bad value (exit 2, also for serve at startup), not an unreadable target (3: a script blamed vLLM)
    for bad, why in (("proxy_preemptions_total=vllm:num_preemption_total", "kvwatch reads no vllm:num_preemption"),
                     ("proxy_preemptions_total=vllm:num_preemptions", "one name ends in a sample's suffix"),
                     ("proxy_preemptions=vllm:num_preemptions_total", "one name ends in a sample's suffix")):
        assert main(["check", "--file", str(page), "--rename-metrics", bad]) == 2
        assert why in capsys.readouterr().err
    # what an --usage-metric override names is read too: renaming the page's gauge to it is no typo
    usage = page.read_text().replace("proxy_kv_usage", "proxy_kv")
    page.write_text(usage)
    assert main(["check", "--file", str(page), "--usage-metric", "my_kv", "--rename-metrics", "proxy_kv=my_kv"]) == 0
    capsys.readouterr()
    for bad in ("a=b,a=c", "a=a", "a", "a=b=c", "a=b,b=c"):
        assert main(["check", "--file", str(page), "--rename-metrics", bad]) == 2
        assert "--rename-metrics" in capsys.readouterr().err


def test_a_source_metric_cannot_apply_to_json_iteration_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    stats = Path(__file__).parent / "fixtures" / "tensorrt-llm-metrics" / "trtllm-serve-iteration-stats.json"
    assert main(["check", "--file", str(stats), "--usage-metric", "foo"]) == 3
    assert "JSON iteration statistics" in capsys.readouterr().err


def test_a_page_without_engine_metrics_names_disable_log_stats(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM with --disable-log-stats serves /metrics with only the HTTP and process families.
    page = tmp_path / "no-stats.prom"
    page.write_text('process_start_time_seconds 1.7e+09\nhttp_requests_total{handler="/v1/completions",'
                    'method="POST",status="2xx"} 12.0\n')
    assert main(["check", "--file", str(page)]) == 3
    assert "--disable-log-stats" in capsys.readouterr().err


def test_a_given_max_model_len_within_the_rounding_of_the_engines_stands(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The engine's length is derived from kv_cache_size_tokens / kv_cache_max_concurrency, whose label may be rounded
    # (a proxy's "5.00" for 4.99707): 163,744 / 5.00 reads 32,749, and the fix said "Lower --max-model-len from
    # 32749" where the operator gave the engine's 32,768, which the labels reproduce within that rounding.
    text = _bounded_lengths((FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text()).replace(
        'kv_cache_max_concurrency="20.0"', 'kv_cache_max_concurrency="5.00"').replace(
        'kv_cache_size_tokens="163840"', 'kv_cache_size_tokens="163744"')
    payload = tmp_path / "rounded.prom"
    payload.write_text(text)
    report = check_json(["--file", str(payload), "--max-model-len", "32768"], capsys)
    messages = [a["message"] for a in report["series"][0]["advice"]]
    assert any(m.startswith("Lower --max-model-len from 32768 to ") for m in messages), messages
    # Exact labels (163,840 at "20.0": 8,192) do not reproduce a given 8,230, 0.5 % off: the engine's length wins.
    exact = _bounded_lengths((FIXTURES / "gen-0.33-dp2-capacity-labels.prom").read_text())
    payload.write_text(exact)
    report = check_json(["--file", str(payload), "--max-model-len", "8230"], capsys)
    messages = [a["message"] for a in report["series"][0]["advice"]]
    assert any(m.startswith("Lower --max-model-len from 8192 to ") for m in messages), messages


def test_scheduler_limited_on_sglang_ranks_names_the_dp_attention_share(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Two data-parallel ranks: with --enable-dp-attention SGLang divides --max-running-requests 256 over them, so
    # rank 0's 120 running may be at its 128 (it said "well under 256, so that cap is not it").
    def row(family: str, rank: str, value: float) -> str:
        return (f'sglang:{family}{{dp_rank="{rank}",engine_type="unified",model_name="q",pp_rank="0",tp_rank="0"}} '
                f"{value}\n")

    text = "".join(row("num_running_reqs", r, v) + row("token_usage", r, u) + row("num_queue_reqs", r, w)
                   + row("max_total_num_tokens", r, 500_000)
                   for r, v, u, w in (("0", 120, 0.3, 30), ("1", 57, 0.5, 0)))
    page = tmp_path / "sglang-dp2.prom"
    page.write_text(text)
    report = check_json(["--file", str(page), "--max-num-seqs", "256"], capsys)
    (found,) = [x for x in report["findings"] if x["id"] == "scheduler_limited"]
    assert "at the 128 each of its 2 ranks gets with --enable-dp-attention" in found["message"]
    # 200 running on one rank proves the per-rank share is not in force: the cap is simply not it.
    page.write_text(text.replace("} 120\n", "} 200\n"))
    report = check_json(["--file", str(page), "--max-num-seqs", "256"], capsys)
    (found,) = [x for x in report["findings"] if x["id"] == "scheduler_limited"]
    assert "well under --max-running-requests 256" in found["message"]


def test_a_full_sglang_rank_with_nothing_running_names_both_readings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 0 running, 97 % used, 30 waiting: a PD prefill server's transfers (some releases label it "unified") or a
    # leak; the payload cannot tell, so kv_bound says both instead of asserting the capacity fixes.
    page = tmp_path / "sglang.prom"
    page.write_text('sglang:num_running_reqs{model_name="q",engine_type="unified"} 0\n'
                    'sglang:token_usage{model_name="q",engine_type="unified"} 0.97\n'
                    'sglang:num_queue_reqs{model_name="q",engine_type="unified"} 30\n')
    report = check_json(["--file", str(page)], capsys)
    (bound,) = [f for f in report["findings"] if f["id"] == "kv_bound"]
    assert "PD-disaggregated server" in bound["message"] and "KV leak" in bound["message"]


def test_a_running_or_waiting_override_without_samples_yet_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "proxy.prom"
    page.write_text("# TYPE proxy_running gauge\n"
                    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
                    'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
                    'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n')
    report = check_json(["--file", str(page), "--running-metric", 'proxy_running{pool="a"}'], capsys)
    (unknown,) = [f for f in report["findings"] if f["id"] == "value_unknown"]
    assert "--running-metric" in unknown["message"] and report["series"][0]["requests_running"] is None


@pytest.mark.parametrize("fixture", ["sglang-metrics/gen-0.5.2-total-retracted-tp2.prom"])
def test_vllms_formula_is_no_capacity_for_another_engine(fixture: str, capsys: pytest.CaptureFixture[str]) -> None:
    # With --gpu, an SGLang page without max_total_num_tokens showed "KV capacity 1,038,496 tokens": vLLM's sums
    # (gpu_memory_utilization 0.92), for a server sized by --mem-fraction-static. Unknown, and the gains are ratios.
    report = check_json(["--file", str(FIXTURES.parent / fixture), "--gpu", "H100", "--tensor-parallel-size", "2"],
                        capsys)
    series = report["series"][0]
    assert series["capacity_source"] == "unknown" and series["kv_capacity_tokens"] is None
    assert ("capacity_unknown", "0") in ids(report)
    effects = {a["action"]: a["projected_effect"] for a in series["advice"]}
    assert "KV capacity about x1.05" in effects["quantize_weights"]  # (at TP 2: half the weights to free)
    assert "tokens" not in effects["add_tensor_parallelism"].split(";")[0]


def test_kv_held_by_no_running_request_is_no_headroom_and_no_limit_frees_it(capsys: pytest.CaptureFixture[str]) -> None:
    # An SGLang PD decode server 97 % full of incoming transfers, nothing running: the headroom was capacity ÷ the
    # mean request - 0 = 153.8 requests, where 6,000 free tokens hold 4.6; and a vLLM page with the same shape was
    # told "Limit concurrency to 61 (now 0 running)", which frees nothing.
    report = check_json(["--file", str(FIXTURES.parent / "sglang-metrics" / "gen-0.5.23-pd-decode-transfers.prom")],
                        capsys)
    series = report["series"][0]
    assert series["requests_running"] == 0 and series["kv_usage_ratio"] == 0.97
    free_requests = (1 - 0.97) * series["max_concurrency"]
    assert series["concurrency_headroom"] == pytest.approx(free_requests)
    from kvwatch.advisor import advise

    fixes = advise("bottleneck", recommended_max_concurrency=None, running=0, capacity_tokens=163840.0,
                   kv_tokens_per_request=2500.0, concurrency_ceiling=65.2)
    assert "limit_concurrency" not in [a.action for a in fixes]
    assert "limit_concurrency" in [a.action for a in advise(
        "bottleneck", running=60, capacity_tokens=163840.0, kv_tokens_per_request=2500.0, concurrency_ceiling=65.2)]


def test_a_plain_file_or_stdin_is_held_to_the_body_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # --help says a larger body is an error; only gzip files were capped, a plain file or stdin was read whole.
    import io

    plain = (FIXTURES / "gen-0.9-both-usage-names.prom").read_bytes()
    path = tmp_path / "metrics.prom"
    path.write_bytes(plain)
    limit = str(len(plain) - 1)
    assert main(["check", "--file", str(path), "--json", "--max-body-bytes", limit]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["reason"] == "too_large" and "--max-body-bytes" in error["message"]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(plain)))
    assert main(["check", "--file", "-", "--json", "--max-body-bytes", limit]) == 3
    assert json.loads(capsys.readouterr().out)["error"]["reason"] == "too_large"
    assert main(["check", "--file", str(path), "--json", "--max-body-bytes", str(len(plain))]) == 0


def test_vllm_data_parallel_engines_get_the_servers_gateway_limit(capsys: pytest.CaptureFixture[str]) -> None:
    # One API server fronting two engine cores (vllm/v1/metrics/loggers.py labels each engine=<idx>): each schedules
    # its own requests, so --max-num-seqs is per engine, and a gateway limit of one engine's share halved the server.
    report = check_json(["--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")], capsys)
    limit = next(a for a in report["series"][0]["advice"] if a["action"] == "limit_concurrency")
    per_engine = limit["concurrency"]
    assert f"{per_engine} per data-parallel rank ({2 * per_engine} for the server's 2)" in limit["message"]
    assert "--max-num-seqs applies to each engine" in limit["message"] and "dp-attention" not in limit["message"]
    assert limit["engine_args"] == ["--max-num-seqs", str(per_engine)]


def test_blocks_shared_among_kv_groups_give_no_max_model_len_ceiling_without_the_layout(
        capsys: pytest.CaptureFixture[str]) -> None:
    # gpt-oss on vLLM 0.20: two KV groups share the blocks and the capacity is blocks // 2 × block size. The blocks
    # alone said 292 requests of 8,192 tokens (2.4M tokens, twice the pool); with --gpu, the layout's 145.9.
    path = str(FIXTURES / "gen-0.20.2-gptoss-two-groups.prom")
    alone = check_json(["--file", path, "--max-model-len", "8192"], capsys)["series"][0]
    with_layout = check_json(["--file", path, "--max-model-len", "8192", "--gpu", "H100"], capsys)["series"][0]
    assert alone["kv_capacity_tokens"] == with_layout["kv_capacity_tokens"]
    assert alone["max_concurrency_max_model_len"] is None
    assert with_layout["max_concurrency_max_model_len"] * 8192 <= with_layout["kv_capacity_tokens"]


def test_gains_sized_by_a_plan_the_engine_contradicts_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    # capacity_mismatch said the plan (1,022,976 tokens) does not describe this engine (320,000), and the same report
    # promised x1.11 from FP8 weights and x2.19 from TP 2, both that plan's ratios, without a word.
    report = check_json(["--file", str(FIXTURES / "gen-0.11.0-multiproc-pid-agree.prom"), "--gpu", "H100"], capsys)
    assert ("capacity_mismatch", "0") in ids(report)
    effects = {a["action"]: a["projected_effect"] for a in report["series"][0]["advice"]}
    assert "does not describe this engine" in effects["quantize_weights"]
    assert "does not describe this engine" in effects["quantize_kv_cache"]
    assert "does not describe this engine" in effects["add_tensor_parallelism"]
    assert "does not describe" not in effects["limit_concurrency"]  # (measured on the engine, not planned)


def test_a_pd_decode_server_full_of_incoming_transfers_is_kv_full_as_serve_reads_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    # 97 % full, nothing running, 120 requests in KV transfer: serve read it as saturated (bottleneck, its fixes
    # ranked, KVCacheBottleneck paging) while check said nothing of the KV
    path = str(FIXTURES.parent / "sglang-metrics" / "gen-0.5.23-pd-decode-transfers.prom")
    report = check_json(["--file", path, "--gpu", "H100"], capsys)
    (full,) = [f for f in report["findings"] if f["id"] == "kv_full"]
    assert "nothing running and 120 requests in KV transfer" in full["message"]
    actions = [a["action"] for a in report["series"][0]["advice"]]
    assert actions[:2] == ["quantize_weights", "quantize_kv_cache"] and "limit_concurrency" not in actions


def test_a_full_rank_beside_an_idle_one_says_the_load_is_not_spread(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # engine 1 at 97 % with 5 waiting beside engine 0 at 20 %: check advised a limit for the server's 2 and a replica
    # while half the pod's KV sat idle
    path = str(FIXTURES / "gen-0.16-sleep-state-dp2.prom")
    report = check_json(["--file", path], capsys)
    (finding,) = [f for f in report["findings"] if f["id"] == "unbalanced_ranks"]
    assert (finding["engine"], finding["severity"]) == ("1", "warning")
    assert "engine 0 of the same server uses 20.0% of its KV cache" in finding["message"]
    # ranks loaded alike (engine 0 at 60 %): none
    balanced = tmp_path / "balanced.prom"
    text = (FIXTURES / "gen-0.16-sleep-state-dp2.prom").read_text()
    balanced.write_text(re.sub(r'(kv_cache_usage_perc\{[^}]*engine="0"[^}]*\}) 0\.2\b', r"\1 0.6", text))
    assert balanced.read_text() != text
    assert "unbalanced_ranks" not in [f["id"] for f in check_json(["--file", str(balanced)], capsys)["findings"]]


def test_more_tensor_parallel_ranks_on_the_page_than_planned_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    # An SGLang server whose scheduler gauges come from tp_rank 0 and 1 was told "Raise --tp-size from 1 to 2".
    path = str(FIXTURES.parent / "sglang-metrics" / "gen-0.5.2-total-retracted-tp2.prom")
    report = check_json(["--file", path, "--gpu", "H100"], capsys)
    finding = next(f for f in report["findings"] if f["id"] == "tensor_parallel_mismatch")
    assert "shows 2 tensor-parallel ranks" in finding["message"] and "--tensor-parallel-size 1" in finding["message"]
    # with the caveat it still pasted "--tp-size 2", the size the server runs: a replica now, or the
    # size to tell kvwatch
    advice = report["series"][0]["advice"]
    (scale_out,) = [a for a in advice if a["action"] == "add_replica"]
    assert scale_out["engine_args"] is None and "--tensor-parallel-size 2 (the ranks" in scale_out["message"]
    assert scale_out["message"].startswith("Add a replica behind the gateway")
    effects = {a["action"]: a["projected_effect"] for a in advice}
    assert "does not describe this engine" in effects["quantize_weights"]
    agreeing = check_json(["--file", path, "--gpu", "H100", "--tensor-parallel-size", "2"], capsys)
    assert "tensor_parallel_mismatch" not in [f["id"] for f in agreeing["findings"]]
    (tp,) = [a for a in agreeing["series"][0]["advice"] if a["action"] == "add_tensor_parallelism"]
    assert tp["engine_args"] == ["--tp-size", "4"]
    # every data-parallel rank's fixes, not only those of the rank the finding names
    dp2 = str(FIXTURES.parent / "sglang-metrics" / "gen-rank-labels-dp2.prom")
    ranks = check_json(["--file", dp2, "--gpu", "H100"], capsys)
    assert "tensor_parallel_mismatch" in [f["id"] for f in ranks["findings"]]
    scale_outs = [a for s in ranks["series"] for a in s["advice"] if a["action"] == "add_replica"]
    assert scale_outs and all(a["engine_args"] is None for a in scale_outs)


def test_a_pd_decode_server_before_0_20_is_no_leak_when_its_page_shows_kv_transfers(
        capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's scheduler allocates a decode server's blocks before their KV arrives (WAITING_FOR_REMOTE_KVS) and
    # counts those requests as waiting; 0.20 splits them off (reason="deferred"). Before, a page with the NIXL
    # connector's metrics was called a KV leak: critical, restart the engine.
    report = check_json(["--file", str(FIXTURES / "gen-0.14-pd-decode-nixl.prom")], capsys)
    assert "kv_usage_stuck" not in [f["id"] for f in report["findings"]]
    bound = next(f for f in report["findings"] if f["id"] == "kv_bound")
    assert "a decode server's incoming" in bound["message"]
    without = "".join(line + "\n" for line in (FIXTURES / "gen-0.14-pd-decode-nixl.prom").read_text().splitlines()
                      if "nixl" not in line)
    from kvwatch.payload import interpret

    assert interpret(without, None, timestamp=0.0).readings[0].waiting_holds_no_kv  # a leak, without transfers


def test_a_saved_page_widened_by_one_character_is_held_as_a_live_one(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # check --file decoded without the 2x text cap that a live fetch applies: the same page read offline only
    plain = (FIXTURES / "gen-0.9-both-usage-names.prom").read_bytes()
    page = tmp_path / "m.prom"
    page.write_bytes("# \N{GRINNING FACE} wide\n".encode() + plain)
    assert main(["check", "--file", str(page), "--json", "--max-body-bytes", str(len(plain) + 1024)]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["reason"] == "too_large" and "over twice --max-body-bytes" in error["message"]


def test_preemptions_long_ago_are_context_and_a_full_cache_makes_them_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's counter is a lifetime total: 7 preemptions at 25 % usage may be a week old. As a warning they failed
    # every `check --fail-on warning` cron run until the engine restarted.
    page = (FIXTURES / "gen-0.9-both-usage-names.prom").read_text() + (
        '# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{engine="0",model_name="qwen3-8b"} 7\n')
    (tmp_path / "old.prom").write_text(page)
    report = check_json(["--file", str(tmp_path / "old.prom")], capsys)
    (found,) = report["findings"]
    assert (found["id"], found["severity"]) == ("preemptions", "info")
    assert "25.0% full now: one poll cannot tell" in found["message"]
    assert main(["check", "--file", str(tmp_path / "old.prom"), "--fail-on", "warning"]) == 0
    capsys.readouterr()
    (tmp_path / "full.prom").write_text(page.replace("} 0.25", "} 0.97"))
    full = check_json(["--file", str(tmp_path / "full.prom")], capsys)
    assert ("preemptions", "warning") in [(f["id"], f["severity"]) for f in full["findings"]]


def test_a_mix_ceiling_below_the_worst_case_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    # Engine 0 holds 157,286 tokens for 16 running requests, 9,830 each, past the 8,192 no request can exceed: KV
    # that no running request holds (a request deferred with its KV) counts against the mix, so its ceiling (16.7)
    # sits below the max-model-len one (20.0). Read bare, the two contradicted each other.
    assert main(["check", "--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "max concurrency" in line]
    assert lines[0].endswith("16.7 at the observed mix, 20.0 at max-model-len (the mix is below it: KV held by no "
                             "running request counts against it)")
    assert lines[1].endswith("36.0 at the observed mix, 20.0 at max-model-len")


def test_preemptions_warn_with_kv_bound_when_the_next_prompt_does_not_fit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 85 % used, a queue, and prompts of 40k tokens on average: kv_bound (the next prompt does not fit), so the
    # preemptions beside it are the same thrash, not context (they read "info" at 85 %).
    labels = 'engine="0",model_name="qwen3-8b"'
    page = (FIXTURES / "gen-0.9-both-usage-names.prom").read_text().replace("} 0.25", "} 0.85").replace(
        f"vllm:num_requests_waiting{{{labels}}} 0.0", f"vllm:num_requests_waiting{{{labels}}} 5.0") + (
        f"# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{{{labels}}} 7\n"
        f"# TYPE vllm:request_prompt_tokens histogram\n"
        f'vllm:request_prompt_tokens_bucket{{{labels},le="+Inf"}} 10\n'
        f"vllm:request_prompt_tokens_sum{{{labels}}} 400000\nvllm:request_prompt_tokens_count{{{labels}}} 10\n")
    (tmp_path / "long.prom").write_text(page)
    found = {f["id"]: f["severity"] for f in check_json(["--file", str(tmp_path / "long.prom")], capsys)["findings"]}
    assert found["kv_bound"] == "critical" and found["preemptions"] == "warning"


def test_a_mamba_hybrids_stale_block_size_label_is_not_its_blocks_size(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # (vllm issue 42966) From 0.20 vLLM's worker raises a Mamba hybrid's block size so an attention
    # page holds a Mamba state (Granite-4.0-H: 16 -> 528) and, before vllm PR 42967, cache_config_info kept 16 while
    # num_gpu_blocks counts the raised blocks. kvwatch multiplied by the label: a pool 33x too small, and a
    # capacity_mismatch blaming another process on the GPU.
    from kvwatch.capacity.kv import blocks_per_group_tokens
    from kvwatch.exposition import parse
    from kvwatch.serve.sidecar_capacity import build_sidecar_capacity
    from kvwatch.settings import ServeSettings

    model = "ibm-granite/granite-4.0-h-small"
    text = (FIXTURES / "gen-0.20.2-gptoss-two-groups.prom").read_text().replace("openai/gpt-oss-20b", model)
    labels = dict(parse(text).samples("vllm:cache_config_info")[0].labels)
    capacity, why = build_sidecar_capacity(ServeSettings(gpu="H100"), model, labels)
    assert capacity is not None, why
    layout, blocks = capacity.plan.layout, capacity.plan.num_gpu_blocks
    assert labels["block_size"] == "16" and layout.block_size > 16 and layout.num_groups > 1
    payload = tmp_path / "granite.prom"
    payload.write_text(text.replace('num_gpu_blocks="149506"', f'num_gpu_blocks="{blocks}"'))
    report = check_json(["--file", str(payload), "--gpu", "H100"], capsys)
    series = report["series"][0]
    assert series["kv_capacity_tokens"] == blocks_per_group_tokens(blocks, layout.num_groups, layout.block_size)
    assert series["block_size"] == layout.block_size
    ids = [f["id"] for f in report["findings"]]
    assert "capacity_mismatch" not in ids and "block_size_label_stale" in ids


def test_a_v0_engine_on_a_0_9_to_0_10_label_set_shares_no_blocks_among_kv_groups(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The V0 engine (VLLM_USE_V1=0, to 0.10) writes the 0.8.5+ CacheConfig (swap_space beside
    # swap_space_bytes, cpu_kvcache_space_bytes from 0.9) but no engine label, and every block holds every layer.
    # Read with 0.9's rules, gemma-2's two KV groups halved its capacity.
    text = (FIXTURES / "neuron-v0-block1024.prom").read_text()
    text = text.replace('block_size="1024"', 'block_size="16"').replace('num_gpu_blocks="4"', 'num_gpu_blocks="10000"')
    text = text.replace('cpu_offload_gb="0.0"', 'cpu_kvcache_space_bytes="None",cpu_offload_gb="0.0"')
    text = text.replace("tinyLlama/TinyLlama-1.1B-Chat-v1.0", "google/gemma-2-9b-it")
    assert "google/gemma-2-9b-it" in text
    payload = tmp_path / "v0-gemma.prom"
    payload.write_text(text)
    report = check_json(["--file", str(payload)], capsys)
    assert report["version_range"] == "v0"
    assert report["series"][0]["kv_capacity_tokens"] == 10000 * 16


def test_a_file_ending_mid_line_is_read_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prometheus reads a last line without its newline (a "\n".join(lines) page), and so does check; but a file cut
    # short (an interrupted curl > file, "25.0" saved as "2") ends so too, and nothing in a file tells them apart.
    payload = tmp_path / "cut.prom"
    payload.write_text((FIXTURES / "gen-0.11-kv-only.prom").read_text().rstrip("\n"))
    assert main(["check", "--file", str(payload), "--json"]) in (0, 1)
    captured = capsys.readouterr()
    assert json.loads(captured.out)["series"] and "ends without a newline" in captured.err


def test_a_histogram_kvwatch_cannot_read_is_named_and_the_page_read(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # Prometheus stores le="abc" as written; check refused the page ("parse") and said nothing
    # of its KV usage.
    payload = tmp_path / "le.prom"
    text = (FIXTURES / "gen-0.11-kv-only.prom").read_text()
    payload.write_text(text.replace('le="0.5"', 'le="abc"', 1))
    assert main(["check", "--file", str(payload), "--json"]) in (0, 1)
    captured = capsys.readouterr()
    assert json.loads(captured.out)["series"][0]["kv_usage_ratio"] == 0.1
    assert "vllm:e2e_request_latency_seconds is not read (expected float as value for 'le' label, got 'abc')" in \
        captured.err


def test_models_without_a_plan_for_one_reason_are_named_on_one_line(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # three models, one line each saying the same "the memory budget needs the GPU"
    lines = []
    for model in ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"):
        labels = f'engine="0",model_name="{model}"'
        lines += [f"vllm:kv_cache_usage_perc{{{labels}}} 0.97", f"vllm:num_requests_running{{{labels}}} 30",
                  f"vllm:num_requests_waiting{{{labels}}} 6"]
    payload = tmp_path / "two.prom"
    payload.write_text("\n".join(lines) + "\n")
    main(["check", "--file", str(payload)])
    said = [line for line in capsys.readouterr().err.splitlines() if "no capacity plan" in line]
    assert len(said) == 1 and "no capacity plan for Qwen/Qwen2.5-7B-Instruct, meta-llama/Llama-3.1-8B-Instruct: " \
        "the memory budget needs the GPU" in said[0], said


def test_an_engine_with_two_configurations_is_said_unknown_once(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # check said why the capacity is unknown and also "the engine does not report KV
    # capacity here: use kvwatch plan", which contradicts it (kvwatch refuses the formula there on purpose)
    text = (FIXTURES / "gen-0.11.0-gptoss-issue28924.prom").read_text()
    config = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    payload = tmp_path / "two.prom"
    payload.write_text(text.replace(config, config + "\n" + config.replace('num_gpu_blocks="9271"',
                                                                           'num_gpu_blocks="9000"')))
    main(["check", "--file", str(payload), "--json"])
    ids = [f["id"] for f in json.loads(capsys.readouterr().out)["findings"]]
    assert "capacity_unknown" not in ids and "value_unknown" in ids


def test_the_text_says_when_the_capacity_is_kvwatchs_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    # an engine reporting no capacity, with --gpu: the formula's figure read as the engine's own
    # in the text (only --json's capacity_source said "formula")
    page = str(FIXTURES / "gen-0.8.5-engine-label.prom")
    assert main(["check", "--file", page, "--gpu", "H100-80GB"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  KV capacity")]
    assert line.endswith("tokens (kvwatch's estimate from the model and the card: the engine reports none)")
    assert main(["check", "--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom")]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  KV capacity")]
    assert lines and all(x.endswith(" tokens") for x in lines)  # the engine's own: no word


def test_a_mamba_hybrid_kvwatch_does_not_know_has_an_unknown_capacity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM pads a Mamba hybrid's state page to the attention page and says so in
    # cache_config_info (mamba_page_size_padded): its blocks are shared among KV groups, so blocks x block_size
    # over-states the pool by their number. For a model kvwatch does not know that number is unknown, and so is the
    # capacity (it read 1,632,000 tokens for a pool of 408,000 on Qwen3-Next's label set); known, it is divided.
    text = (FIXTURES / "gen-0.20.2-gptoss-two-groups.prom").read_text().replace(
        'mamba_page_size_padded="None"', 'mamba_page_size_padded="1114112"')
    unknown = tmp_path / "hybrid.prom"
    unknown.write_text(text.replace("openai/gpt-oss-20b", "acme/unheard-of-hybrid"))
    report = check_json(["--file", str(unknown)], capsys)
    series = report["series"][0]
    assert (series["kv_capacity_tokens"], series["capacity_source"]) == (None, "unknown")
    assert series["max_concurrency_max_model_len"] is None and series["kv_used_tokens"] is None
    ids = [f["id"] for f in report["findings"]]
    assert "capacity_groups_unknown" in ids and "capacity_unknown" not in ids
    known = tmp_path / "known.prom"
    known.write_text(text.replace("openai/gpt-oss-20b", "Qwen/Qwen3-Next-80B-A3B-Instruct"))
    series = check_json(["--file", str(known)], capsys)["series"][0]
    assert series["capacity_source"] == "engine_num_gpu_blocks" and series["kv_capacity_tokens"] < 149506 * 16


def test_a_formula_capacity_has_vllms_max_model_len_ceiling_for_its_layout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No blocks on the page (num_gpu_blocks None): the capacity is the formula's, and its ceiling
    # at max-model-len was capacity ÷ length, every group charged every token: Gemma-3-27B at 32k read 0.9 beside
    # the lower-max-model-len advice's "from 2.4". It is vLLM's sum on the formula's blocks, as plan prints.
    from kvwatch.payload import interpret
    from kvwatch.serve.sidecar_capacity import CapacityResolver
    from kvwatch.settings import ServeSettings

    model = "google/gemma-3-27b-it"
    text = (FIXTURES / "gen-0.9-both-usage-names.prom").read_text().replace('num_gpu_blocks="12000"',
                                                                           'num_gpu_blocks="None"')
    payload = tmp_path / "formula.prom"
    payload.write_text(text.replace(f'model_name="{interpret_names(text)}"', f'model_name="{model}"'))
    series = check_json(["--file", str(payload), "--gpu", "H100", "--max-model-len", "32768"], capsys)["series"][0]
    assert series["capacity_source"] == "formula"
    reading = interpret(payload.read_text(), None, timestamp=0.0).readings[0]
    plan = CapacityResolver(ServeSettings(gpu="H100", max_model_len=32768)).sidecar(reading)[0].plan
    assert series["max_concurrency_max_model_len"] == pytest.approx(plan.max_concurrency_at_max_model_len)
    assert series["max_concurrency_max_model_len"] > 1.5 * series["kv_capacity_tokens"] / 32768


def test_a_usage_of_minus_zero_reads_as_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a page whose usage gauge is -0.0 printed "KV usage -0.0%"
    from kvwatch.plausible import check_reading

    reading, dropped = check_reading(Reading(model_name="m", engine="0", kv_usage_ratio=-0.0))
    assert str(reading.kv_usage_ratio) == "0.0" and dropped == ()
    page = tmp_path / "m.prom"
    page.write_text('vllm:kv_cache_usage_perc{engine="0",model_name="m"} -0.0\n'
                    'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
                    'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n')
    main(["check", "--file", str(page)])
    assert "-0.0%" not in capsys.readouterr().out


def test_model_flags_meeting_a_page_of_several_models_are_said(capsys: pytest.CaptureFixture[str]) -> None:
    # Triton's page serves two models: --model sized both as Llama with the whole card, silently
    main(["check", "--file", str(FIXTURES / "gen-triton-vllm-backend.prom"), "--model",
          "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100"])
    assert "describe one model, and this page serves 2 (llama3_8b, mistral_7b)" in capsys.readouterr().err
    main(["check", "--file", str(FIXTURES / "gen-0.33-dp2-capacity-labels.prom"), "--model",
          "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100"])  # two engines of one model: nothing to say
    assert "describe one model" not in capsys.readouterr().err


def test_check_reads_at_most_max_series_and_says_how_many_it_left_out(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # a page of 273,000 model names ran for over 10 minutes: check read every one
    page = tmp_path / "models.prom"
    page.write_text("".join(f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1\n'
                            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m{i}"}} 0.5\n' for i in range(100)))
    assert main(["check", "--file", str(page), "--json", "--max-series", "3"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert len(report["series"]) == 3 and report["series_dropped"] == 97
    assert "97 (model_name, engine) series more than --max-series 3, left out" in err
    assert main(["check", "--file", str(page), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["series_dropped"] == 100 - 64


def test_a_full_cache_with_no_queue_count_says_the_bottleneck_cannot_be_told() -> None:
    # usage 97 % with no waiting family raised no finding: kv_bound needs a waiting request
    from kvwatch.payload import interpret

    page = ('vllm:kv_cache_usage_perc{engine="0",model_name="m"} %s\n'
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1\n')
    for usage, severity in (("0.97", "warning"), ("0.40", "info")):
        found = {f["id"]: f for f in build_report(interpret(page % usage, None, timestamp=0.0))["findings"]}
        assert found["queue_unknown"]["severity"] == severity
        assert ("may be the bottleneck" in found["queue_unknown"]["message"]) == (severity == "warning")
    with_queue = page % "0.97" + 'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
    impossible = build_report(interpret(with_queue.replace("} 0\n", "} -4\n"), None, timestamp=0.0))
    ids = {f["id"] for f in impossible["findings"]}  # a count the page has, impossible: said so, not "no count"
    assert "implausible_values" in ids and "queue_unknown" not in ids
    report = build_report(interpret(with_queue, None, timestamp=0.0))
    assert "queue_unknown" not in {f["id"] for f in report["findings"]}


def test_a_full_cache_with_no_running_count_says_the_bottleneck_cannot_be_told() -> None:
    # 93 % full with 5 waiting and no running family read "Findings: none, nothing to fix" (a standing queue needs
    # the running count), and so did 97 % with none waiting (kv_full needs it too)
    from kvwatch.payload import interpret

    page = ('vllm:kv_cache_usage_perc{engine="0",model_name="m"} %s\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} %s\n'
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1\n')
    for usage, waiting, severity in (("0.93", "5", "warning"), ("0.40", "0", "info")):
        found = {f["id"]: f for f in build_report(interpret(page % (usage, waiting), None, timestamp=0.0))["findings"]}
        assert found["running_unknown"]["severity"] == severity, usage
        assert ("may be the bottleneck" in found["running_unknown"]["message"]) == (severity == "warning")
    # 97 % with none waiting: kv_full with its fixes, as serve reads the poll (saturated: bottleneck, fixes ranked),
    # the missing count said in it; a warning without fixes before
    report = build_report(interpret(page % ("0.97", "0"), None, timestamp=0.0))
    (full,) = [f for f in report["findings"] if f["id"] == "kv_full"]
    assert "no running count" in full["message"] and report["series"][0]["advice"]
    # at 0.95 a queue is kv_bound whatever runs; with the running count there, no such finding
    found = build_report(interpret(page % ("0.97", "5"), None, timestamp=0.0))["findings"]
    assert "kv_bound" in {f["id"] for f in found} and "running_unknown" not in {f["id"] for f in found}
    running = page % ("0.93", "5") + 'vllm:num_requests_running{engine="0",model_name="m"} 24\n'
    assert "running_unknown" not in {f["id"] for f in build_report(interpret(running, None, timestamp=0.0))["findings"]}


@pytest.mark.parametrize(("usage", "waiting", "kv_bound"), [("0.91", 1, False), ("0.91", 40, True), ("0.96", 1, True)])
def test_a_few_arrivals_waiting_beside_hundreds_running_below_the_saturation_are_not_kv_bound(
        usage: str, waiting: int, kv_bound: bool) -> None:
    # a critical "the KV cache is the bottleneck" for one request beside 300 running at 0.91
    from kvwatch.payload import interpret

    page = (f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 300\n'
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="40000"} 1\n')
    ids = {f["id"] for f in build_report(interpret(page, None, timestamp=0.0))["findings"]}
    assert ("kv_bound" in ids) == kv_bound and "scheduler_limited" not in ids


def test_a_usage_beside_a_threshold_is_printed_on_its_own_side_of_it() -> None:
    # 0.8999 read "KV is only 90.0% used: the scheduler limits" beside 0.90's critical kv_bound
    from kvwatch.capacity.units import percent

    assert [percent(x) for x in (0.8999, 0.9, 0.9499999, 0.95, 0.0500001, 0.55, 0.123)] == [
        "89.99%", "90.0%", "94.99999%", "95.0%", "5.00001%", "55.0%", "12.3%"]
    near = derive(Reading("m", kv_usage_ratio=0.8999, requests_running=20.0, requests_waiting=5.0,
                          kv_capacity_tokens=100_000.0), None)
    (limited,) = findings([near])
    assert limited.id == "scheduler_limited" and "while KV is only 89.99% used" in limited.message


def test_the_limit_is_not_one_under_95_percent_of_the_ceiling_by_float_rounding(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 24 running at 0.95: the ceiling is 24 / 0.95 = 25.26 and 95 % of it 24, but 0.95 * 24 / 0.95 = 23.999... read 23.
    text = (FIXTURES / "gen-0.9-both-usage-names.prom").read_text()
    text = re.sub(r"} 0\.25$", "} 0.95", text, flags=re.M)
    text = re.sub(r"(num_requests_running\{[^}]*\}) 20\.0", r"\1 24.0", text)
    text = re.sub(r"(num_requests_waiting\{[^}]*\}) 0\.0", r"\1 5.0", text)
    page = tmp_path / "full.prom"
    page.write_text(text)
    report = check_json(["--file", str(page)], capsys)
    (series,) = report["series"]
    assert (series["kv_usage_ratio"], series["requests_running"]) == (0.95, 24.0)
    (limit,) = [a for a in series["advice"] if a["action"] == "limit_concurrency"]
    assert "Limit concurrency to 24 " in limit["message"]


@pytest.mark.parametrize("capture", ["gen-0.5.23-pd-prefill.prom", "gen-0.5.23-pd-decode-transfers.prom"])
def test_preemptions_never_advise_a_concurrency_limit_that_frees_no_kv(capture: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # "Lower concurrency" stood beside kv_bound's "no concurrency limit follows" on a PD prefill server, and beside
    # an advice that gives no limit with nothing running.
    report = check_json(["--file", str(Path(__file__).parent / "fixtures" / "sglang-metrics" / capture)], capsys)
    (preemptions,) = [f for f in report["findings"] if f["id"] == "preemptions"]
    assert preemptions["severity"] == "warning"
    message = preemptions["message"]
    assert "Lower concurrency" not in message and ("would not free it" in message or "would free none" in message)
    assert not any(a["action"] == "limit_concurrency" for s in report["series"] for a in s["advice"])


def test_a_full_cache_with_no_queue_is_a_finding_with_the_sidecars_fixes(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # 97 % full, 20 running, none waiting: check said "nothing to fix" while serve read the same page as saturated
    # (bottleneck once it lasts) and advised a limit. Below the line, still nothing.
    text = (FIXTURES / "gen-0.9-both-usage-names.prom").read_text()
    for usage, expected in (("0.97", ["kv_full"]), ("0.94", [])):
        page = tmp_path / f"{usage}.prom"
        page.write_text(re.sub(r"} 0\.25$", f"}} {usage}", text, flags=re.M))
        report = check_json(["--file", str(page)], capsys)
        assert [f["id"] for f in report["findings"] if f["id"].startswith("kv_")] == expected
        # info, not warning: nothing waits, so nobody is hurt yet (kv_bound, with a queue, is the warning)
        assert [f["severity"] for f in report["findings"] if f["id"] == "kv_full"] == ["info"] * len(expected)
        (series,) = report["series"]
        assert [a["action"] for a in series["advice"]][:1] == (["limit_concurrency"] if expected else [])


def test_capacity_unknown_speaks_of_the_engine_on_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    # It listed vLLM's, SGLang's and TensorRT-LLM's cases on every page, and sent an SGLang page (with --model and
    # --gpu given) to `kvwatch plan`, whose vLLM sums kvwatch does not take for SGLang's pool
    path = str(FIXTURES.parent / "sglang-metrics" / "gen-0.5.2-total-retracted-tp2.prom")
    report = check_json(["--file", path, "--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "H100"], capsys)
    (unknown,) = {f["message"] for f in report["findings"] if f["id"] == "capacity_unknown"}
    assert unknown.startswith("The engine does not report KV capacity here (SGLang without max_total_num_tokens: "
                              "early 2025, 0.5.2-0.5.5)")
    assert "vLLM:" not in unknown and "TensorRT-LLM" not in unknown and "use `kvwatch plan`" not in unknown


def test_capacity_mismatch_is_said_once_per_model_and_only_of_causes_the_page_allows(
        capsys: pytest.CaptureFixture[str]) -> None:
    # The same paragraph printed for each data-parallel rank; and a page detected as vLLM 0.11 was told "vLLM >= 0.21
    # subtracts its CUDA-graph memory", the plan's default rules being newer than the page
    dp2 = str(FIXTURES / "gen-0.16-sleep-state-dp2.prom")
    report = check_json(["--file", dp2, "--model", "Qwen/Qwen3-8B", "--gpu", "H100"], capsys)
    assert [f["engine"] for f in report["findings"] if f["id"] == "capacity_mismatch"] == ["0"]
    # every rank's fixes still carry the caveat (engine 1, the full one, lost it when only engine 0's was kept)
    (full,) = [s for s in report["series"] if s["advice"]]
    assert all("does not describe this engine" in a["projected_effect"] for a in full["advice"]
               if a["action"] in ("quantize_weights", "add_tensor_parallelism")), full["advice"]
    old = str(FIXTURES / "gen-0.11-kv-only.prom")
    report = check_json(["--file", old, "--model", "Qwen/Qwen3-8B", "--gpu", "H100"], capsys)
    (mismatch,) = [f["message"] for f in report["findings"] if f["id"] == "capacity_mismatch"]
    assert "subtracts its CUDA-graph memory" not in mismatch and "another process on the GPU" in mismatch


def test_a_vllm_0_34_pool_measured_by_the_engine_is_not_judged_by_0_33s_sums(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM 0.34's extensible KV cache sizes the pool from measured memory at utilization 1.0: 0.33's sums said a
    # serving Qwen2.5-32B "will not start" and its 41,024 tokens were "21 % above the formula".
    from kvwatch.engines.vllm import vllm_version_from_cache_config

    page = (FIXTURES / "gen-0.34-extensible-kv.prom").read_text()
    poll = interpret(page, None, timestamp=0.0)
    assert vllm_version_from_cache_config(poll.readings[0].cache_config) == (0, 34)

    def check_page(text: str) -> tuple[set[str], dict]:
        path = tmp_path / "page.prom"
        path.write_text(text)
        report = check_json(["--file", str(path), "--model", "Qwen/Qwen2.5-32B-Instruct", "--gpu", "H100",
                             "--max-model-len", "32768"], capsys)
        return {f["id"] for f in report["findings"]}, report

    found, report = check_page(page)
    assert "kv_bound" in found and not found & {"capacity_mismatch", "vllm_will_not_start"}
    assert report["series"][0]["kv_capacity_tokens"] == 41024
    # what frees memory adds to the measured pool: 0.33's ratios scaled it (FP8 weights x4.68, TP x2 x9.27); an FP8
    # KV cache still halves the bytes a token takes, x2.00
    effects = {a["action"]: a["projected_effect"] for a in report["series"][0]["advice"]}
    assert effects["quantize_weights"].startswith("More KV capacity by what it frees")
    assert effects["add_tensor_parallelism"].startswith("More KV capacity by what it frees")
    assert "(x2.00)" in effects["quantize_kv_cache"]
    # ... but a model whose one KV head is replicated at TP 2 still gets the replica: more TP frees only a little
    # of its weights (it said "raise --tensor-parallel-size" on the measured pool alone)
    gemma = tmp_path / "gemma.prom"
    gemma.write_text(page.replace("Qwen/Qwen2.5-32B-Instruct", "google/gemma-3-1b-it"))
    report = check_json(["--file", str(gemma), "--model", "google/gemma-3-1b-it", "--gpu", "H100",
                         "--max-model-len", "32768"], capsys)
    actions = [a["action"] for a in report["series"][0]["advice"]]
    assert "add_replica" in actions and "add_tensor_parallelism" not in actions
    # the same settings under 0.33's rules (the label set without the 0.34 field) are judged as before
    assert {"vllm_will_not_start", "capacity_mismatch"} & check_page(
        page.replace('enable_extensible_kv_cache="True",', ""))[0]
    # ... and so is a 0.34 engine whose extensible cache is off (it says so): its classic sums are vLLM's again
    assert {"vllm_will_not_start", "capacity_mismatch"} & check_page(
        page.replace('enable_extensible_kv_cache="True"', 'enable_extensible_kv_cache="False"'))[0]
