"""Trace readers on the shipped samples, rate scaling, time compression, block bootstrap, load profiles."""

from __future__ import annotations

import gzip
import random
import re
import statistics
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from kvwatch.sim.engine import Request
from kvwatch.sim.load import PROFILE_KINDS, LoadGenerator, LoadProfile, generate
from kvwatch.sim.traces import (
    TRACE_COLUMNS,
    TraceError,
    active_seconds,
    block_bootstrap,
    compress_time,
    detect_format,
    empty_blocks,
    load_trace,
    packaged_trace,
    read_azure_csv,
    read_mooncake_jsonl,
    scale_rate,
    span_of,
    spread_quantized,
)


def test_azure_sample_is_read_with_its_quirks() -> None:
    path = packaged_trace("azure_conv_sample.csv")
    raw = path.read_bytes()
    assert b"\r\n" in raw and not raw.endswith(b"\n")  # CRLF, no trailing newline, as upstream
    requests = read_azure_csv(path)
    assert len(requests) == raw.count(b"\r\n")  # header + n rows joined by n separators
    first, second = requests[0], requests[1]
    # 2023-11-16 18:15:46.6805900,374,44 then 18:15:50.9951690,396,109
    assert (first.arrival_time, first.prompt_tokens, first.output_tokens) == (0.0, 374, 44)
    assert second.arrival_time == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    assert (second.prompt_tokens, second.output_tokens) == (396, 109)
    times = [r.arrival_time for r in requests]
    assert times == sorted(times) and times[-1] < 600.0
    assert read_azure_csv(path.read_text()) == requests  # text works as well as a path


def test_azure_code_sample_and_load_trace_dispatch() -> None:
    requests = load_trace(packaged_trace("azure_code_sample.csv"))
    assert len(requests) > 1000
    assert statistics.mean(r.prompt_tokens for r in requests) > 1000  # the code trace is prompt-heavy


def test_mooncake_sample_is_jittered_over_three_seconds() -> None:
    path = packaged_trace("mooncake_conversation_sample.jsonl")
    quantized = read_mooncake_jsonl(path, jitter_seconds=0)
    jittered = read_mooncake_jsonl(path, seed=1)
    assert len(quantized) == len(jittered) == len(path.read_text().splitlines())
    assert len({r.arrival_time for r in quantized}) < len(quantized) / 3  # many share a timestamp
    assert len({r.arrival_time for r in jittered}) == len(jittered)
    by_size = Counter((r.prompt_tokens, r.output_tokens, r.hash_ids) for r in quantized)
    assert by_size == Counter((r.prompt_tokens, r.output_tokens, r.hash_ids) for r in jittered)
    first = quantized[0]
    assert (first.prompt_tokens, first.output_tokens, first.hash_ids[:3]) == (6758, 500, (0, 1, 2))
    assert all(len(r.hash_ids) == -(-r.prompt_tokens // 512) for r in quantized)
    assert max(j.arrival_time - q.arrival_time for q, j in zip(
        sorted(quantized, key=lambda r: (r.arrival_time, r.hash_ids)),
        sorted(jittered, key=lambda r: (r.arrival_time - (r.arrival_time % 3), r.hash_ids)), strict=True)) < 6
    assert read_mooncake_jsonl(path, seed=1) == jittered


@pytest.mark.parametrize(("text", "message"), [
    ("a,b,c\r\n2023-11-16 18:15:46.68,1,2", "header"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.68,1,2\r\n2023-11-16 18:15:47,x,2",
     "line 3"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\r\n", "no requests"),
])
def test_malformed_azure_input_names_the_line(text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        read_azure_csv(text + "\n" if "\n" not in text else text)


def test_malformed_mooncake_input_and_missing_file() -> None:
    with pytest.raises(TraceError, match="line 2"):
        read_mooncake_jsonl('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n')
    with pytest.raises(TraceError, match="cannot read"):
        read_mooncake_jsonl(Path("/nonexistent/trace.jsonl"))
    with pytest.raises(TraceError, match="cannot read"):
        load_trace("trace.parquet")


def test_format_is_detected_from_content_not_the_file_name(tmp_path: Path) -> None:
    azure = tmp_path / "requests.txt"
    azure.write_text(packaged_trace("azure_conv_sample.csv").read_text())
    mooncake = tmp_path / "requests.csv"  # a misleading extension
    mooncake.write_text(packaged_trace("mooncake_conversation_sample.jsonl").read_text())
    assert (detect_format(azure), detect_format(mooncake)) == ("azure", "mooncake")
    assert load_trace(azure) == read_azure_csv(packaged_trace("azure_conv_sample.csv"))
    assert len(load_trace(mooncake)) == len(read_mooncake_jsonl(packaged_trace("mooncake_conversation_sample.jsonl")))
    other = tmp_path / "x.csv"
    other.write_text("time,prompt,output\n0,1,1\n")
    with pytest.raises(TraceError, match="not an Azure CSV"):
        load_trace(other)


def test_rate_scaling_thins_and_superposes() -> None:
    requests = read_azure_csv(packaged_trace("azure_conv_sample.csv"))
    half = scale_rate(requests, 0.5, seed=3)
    assert len(half) == pytest.approx(len(requests) / 2, rel=0.06)
    assert set(half) <= set(requests)
    triple = scale_rate(requests, 3.0, seed=3)
    assert len(triple) == 3 * len(requests)
    assert max(r.arrival_time for r in triple) < 600.0
    assert Counter(r.prompt_tokens for r in triple) == Counter({k: 3 * v for k, v in
                                                                Counter(r.prompt_tokens for r in requests).items()})
    ramp = scale_rate(requests, lambda t: 2.0 * t / 600.0, seed=3)  # 0 -> 2x over the sample
    early = sum(1 for r in ramp if r.arrival_time < 300)
    late = len(ramp) - early
    assert late > 2 * early
    assert scale_rate(requests, 2.5, seed=9) == scale_rate(requests, 2.5, seed=9)


def test_time_compression_and_block_bootstrap() -> None:
    requests = read_azure_csv(packaged_trace("azure_conv_sample.csv"))
    fast = compress_time(requests, 10.0)
    assert fast[-1].arrival_time == pytest.approx(requests[-1].arrival_time / 10)
    assert [r.prompt_tokens for r in fast] == [r.prompt_tokens for r in requests]
    long = block_bootstrap(requests, 3600.0, block_seconds=120.0, seed=4)
    assert min(r.arrival_time for r in long) >= 0 and max(r.arrival_time for r in long) < 3600.0
    assert len(long) == pytest.approx(6 * len(requests), rel=0.15)
    assert {(r.prompt_tokens, r.output_tokens) for r in long} <= {(r.prompt_tokens, r.output_tokens) for r in requests}
    assert block_bootstrap(requests, 3600.0, block_seconds=120.0, seed=4) == long
    with pytest.raises(ValueError, match="shorter than one"):
        block_bootstrap(requests, 100.0, block_seconds=10_000.0)


@pytest.mark.parametrize("kind", PROFILE_KINDS)
def test_load_profiles_follow_their_rate(kind: str) -> None:
    profile = LoadProfile(kind, rate=2.0, rate_end=8.0, period_seconds=1000.0, prompt_tokens=500, output_tokens=100)
    requests = generate(profile, 4000.0, seed=1)
    assert requests == generate(profile, 4000.0, seed=1)
    assert all(isinstance(r, Request) and r.prompt_tokens <= profile.max_prompt_tokens for r in requests)
    first = sum(1 for r in requests if r.arrival_time < 500) / 500
    late = sum(1 for r in requests if 1000 <= r.arrival_time < 1500) / 500
    expected = {"constant": (2.0, 2.0), "ramp": (3.5, 8.0), "step": (2.0, 8.0), "diurnal": (5.0, 5.0)}
    if kind in expected:
        assert first == pytest.approx(expected[kind][0], rel=0.2)
        assert late == pytest.approx(expected[kind][1], rel=0.2)
        if kind == "diurnal":  # trough at 0, peak at half a period
            trough = sum(1 for r in requests if r.arrival_time < 100)
            assert sum(1 for r in requests if 450 <= r.arrival_time < 550) > 2.5 * trough
    else:  # bursty: the mean lies between the calm and the burst rate
        assert 2.0 < len(requests) / 4000 < 8.0
    assert statistics.mean(r.prompt_tokens for r in requests) == pytest.approx(500, rel=0.15)
    assert statistics.mean(r.output_tokens for r in requests) == pytest.approx(100, rel=0.15)


def test_generator_streams_the_same_requests_in_chunks() -> None:
    profile = LoadProfile("bursty", rate=1.0, rate_end=10.0, period_seconds=100.0)
    streamed = LoadGenerator(profile, seed=5)
    chunks = [r for t in range(10, 1001, 10) for r in streamed.take_until(float(t))]
    assert chunks == generate(profile, 1000.0, seed=5)


def test_azure_columns_are_read_by_name_and_times_may_name_a_zone(tmp_path: Path) -> None:
    # The multimodal trace's layout (TIMESTAMP,NumImages,ContextTokens,GeneratedTokens), columns reordered,
    # and times with a zone as ISO 8601 allows: the same requests as the 2023 layout.
    plain = read_azure_csv("TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                           "2023-11-16 18:15:46.6800000,100,0\r\n2023-11-16 18:15:47.1234567,200,5")
    other = read_azure_csv("GeneratedTokens,NumImages,TIMESTAMP,ContextTokens\n"
                           "0,2,2023-11-16T18:15:46.68Z,100\n5,0,2023-11-16 19:15:47.1234567+01:00,200\n")
    assert other == plain
    # an hours-only zone, as PostgreSQL writes it (refused as "not an ISO 8601 time")
    assert read_azure_csv("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68+00,100,0\n"
                          "2023-11-16 20:15:47.1234567+02,200,5\n") == plain
    assert [(r.arrival_time, r.prompt_tokens, r.output_tokens) for r in plain] == [
        (0.0, 100, 1), (pytest.approx(0.4434567), 200, 5)]
    path = tmp_path / "multimodal.csv"
    path.write_text("TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n2024-10-15 00:00:00.000+00:00,1,10,2\n")
    assert detect_format(path) == "azure" and len(load_trace(path)) == 1


def test_burstgpt_csv_leaves_out_failed_requests(tmp_path: Path) -> None:
    # BurstGPT's columns (github.com/HPMLL/BurstGPT): Timestamp in seconds, Model, Request tokens, Response
    # tokens, Total tokens, Log Type; 0 response tokens mark a failed request.
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "45,ChatGPT,1087,230,1317,Conversation log\n"
                    "60,GPT-4,300,0,300,API log\n"
                    "118,GPT-4,417,276,693,Conversation log\n")
    assert detect_format(path) == "burstgpt"
    assert [(r.arrival_time, r.prompt_tokens, r.output_tokens) for r in load_trace(path)] == [
        (0.0, 472, 18), (40.0, 1087, 230), (113.0, 417, 276)]
    assert set(TRACE_COLUMNS["burstgpt"]) == {"Timestamp", "Request tokens", "Response tokens"}


def test_gzip_compressed_traces_read_like_the_plain_files(tmp_path: Path) -> None:
    for name in ("azure_code_sample.csv", "mooncake_conversation_sample.jsonl"):
        packed = tmp_path / (name + ".gz")  # the name does not matter; the content does
        packed.write_bytes(gzip.compress(packaged_trace(name).read_bytes()))
        assert detect_format(packed) == detect_format(packaged_trace(name))
        assert load_trace(packed, seed=4) == load_trace(packaged_trace(name), seed=4)
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes(gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n")[:-6])
    with pytest.raises(TraceError):
        load_trace(broken)


@pytest.mark.parametrize(("content", "said"), [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1e400,5\n", "not a finite number"),
    ('{"timestamp": NaN, "input_length": 5, "output_length": 3}\n', "not a finite number"),
    ('{"timestamp": 0, "input_length": 1e400, "output_length": 3}\n', "not a finite number"),
    ('{"timestamp": 0, "input_length": true, "output_length": 3}\n', "not a number"),
    ('{"ts": 0, "input_length": 5}\n', "no timestamp, output_length (a Mooncake line has"),
    ("Timestamp,Request tokens,Response tokens\ninf,5,3\n", "arrival time must be a finite number"),
    # negative counts were dropped rows, BurstGPT's even before the check ran
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-5,402\n", "token counts cannot be negative"),
    ("Timestamp,Request tokens,Response tokens\n100,-40,-7\n", "token counts cannot be negative"),
    ('{"timestamp": 0, "input_length": -5, "output_length": 3}\n', "lengths cannot be negative"),
])
def test_impossible_fields_are_trace_errors_naming_the_line(tmp_path: Path, content: str, said: str) -> None:
    path = tmp_path / "trace"
    path.write_text(content)
    with pytest.raises(TraceError, match=re.escape(said)) as caught:
        load_trace(path)
    assert "line " in str(caught.value)


def test_a_byte_order_mark_and_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"timestamp": 0, "input_length": 5, "output_length": 3}\n')
    assert [r.prompt_tokens for r in load_trace(path)] == [5]
    with pytest.raises(TraceError, match="is a directory"):
        load_trace(tmp_path)


def test_times_without_a_zone_are_utc_whatever_the_machines_zone(tmp_path: Path, monkeypatch) -> None:
    import time

    # The night US clocks went back an hour: three hours of wall time, read in New York, would be four.
    path = tmp_path / "dst.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-05 00:30:00,5,3\n2023-11-05 03:30:00,5,3\n")
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert load_trace(path)[-1].arrival_time == 3 * 3600.0
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_a_damaged_gzip_stream_is_a_trace_error_not_a_traceback(tmp_path: Path) -> None:
    import gzip

    data = bytearray(gzip.compress(packaged_trace("azure_conv_sample.csv").read_bytes()))
    data[200:260] = bytes(60)  # damaged compressed data: zlib.error, which the readers did not catch
    path = tmp_path / "damaged.csv.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="broken gzip file"):
        load_trace(path)


def test_empty_prompts_are_left_out_and_blank_lines_before_the_header_skipped(tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text("\nTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,0,5\n2023-11-16 18:15:47,7,5\n")
    assert [r.prompt_tokens for r in load_trace(azure)] == [7]  # vLLM refuses an empty prompt: no KV held
    burst = tmp_path / "burst.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,GPT-4,0,418,418,Conversation log\n6,GPT-4,9,3,12,Conversation log\n")
    assert [r.prompt_tokens for r in load_trace(burst)] == [9]
    mooncake = tmp_path / "mc.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 0, "output_length": 3}\n'
                        '{"timestamp": 5, "input_length": 4, "output_length": 3, "hash_ids": ["a1b2", 7]}\n')
    (request,) = load_trace(mooncake)
    assert request.prompt_tokens == 4 and len(request.hash_ids) == 2  # a hex id is an id, not a refusal
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"timestamp": 0, "input_length": 4, "output_length": 3}\nnot json\n')
    with pytest.raises(TraceError, match="line 2: not a JSON object"):
        load_trace(garbage)


def test_a_byte_that_is_not_utf8_in_a_column_not_read_is_harmless_and_names_its_column_where_read(
        tmp_path: Path) -> None:
    # One Windows-1252 byte anywhere refused the whole trace ("not UTF-8 text", no line); errors named no column.
    header = "TIMESTAMP,ContextTokens,GeneratedTokens,Model\n"
    rows = "2023-11-16 18:15:46.68,100,10,caf\xe9\n2023-11-16 18:15:47.00,200,20,x\n".encode("latin-1")
    path = tmp_path / "cp1252.csv"
    path.write_bytes(header.encode() + rows)
    gz = tmp_path / "cp1252.csv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert [r.prompt_tokens for r in load_trace(path)] == [r.prompt_tokens for r in load_trace(gz)] == [100, 200]
    path.write_bytes(header.encode() + "2023-11-16 18:15:46.68,1\xe90,10,x\n".encode("latin-1"))
    with pytest.raises(TraceError, match=r"line 2: ContextTokens: "):
        load_trace(path)
    with pytest.raises(TraceError, match=r"line 2: output_length: not a number: None"):
        read_mooncake_jsonl('{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                            '{"timestamp": 1, "input_length": 5, "output_length": null}\n')
    utf16 = tmp_path / "utf16.csv"
    utf16.write_bytes(header.encode("utf-16"))
    with pytest.raises(TraceError, match="UTF-16 text: save it as UTF-8"):
        load_trace(utf16)
    partial = tmp_path / "two_columns.csv"
    partial.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,100\n")
    with pytest.raises(TraceError, match="Azure CSV header without the column GeneratedTokens"):
        load_trace(partial)


def test_times_cut_to_the_minute_are_spread_over_it_and_fine_times_are_kept(tmp_path: Path) -> None:
    # an Azure trace with minute timestamps replayed each minute's requests at one instant: the
    # simulated capacity and every method's lead changed (kvwatch's median lead 6.5 -> 26.2 min).
    path = tmp_path / "minutes.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:{15 + i // 50:02d},{100 + i},10\n" for i in range(500)))
    times = [r.arrival_time for r in load_trace(path)]
    assert len(set(times)) == 500 and times == sorted(times)
    assert all(60 * (i // 50) <= t < 60 * (i // 50 + 1) for i, t in enumerate(times))  # each minute keeps its 50
    assert max(b - a for a, b in pairwise(times)) < 30  # no minute-long silence between one-instant bursts
    # Times fine enough to be distinct (the real 2023 files: 7 decimals) are kept as they are.
    fine = [(i * 0.37, 100, 10) for i in range(100)] + [(37.0, 5, 5)]
    assert spread_quantized(fine) is fine


def test_the_bootstrap_and_the_rate_skip_a_gap_in_the_trace() -> None:
    # two hours a day apart: 92 % of the blocks were empty, the bootstrap drew mostly silence and
    # the rate over the whole span read 12x too low, so "load 1.0" filled a seventh of the cache.
    from kvwatch.backtest.traces import content_defaults

    hour = [Request(i * 0.5, 500, 100) for i in range(7200)]
    gapped = hour + [Request(86400.0 + r.arrival_time, r.prompt_tokens, r.output_tokens) for r in hour]
    empty, blocks = empty_blocks(gapped)
    assert (blocks, empty) == (299, 276)  # 12 + 11 whole blocks hold requests (the last one is cut short)
    assert content_defaults(gapped) == content_defaults(hour)
    boot = block_bootstrap(gapped, 3600.0, seed=3)
    assert len(boot) == 7200  # 12 full blocks of 600 requests, none empty
    # A sparse trace's quiet blocks are its traffic, not gaps: one request every 200 s on average leaves a fifth of
    # its 5-minute blocks empty, and none of them is a gap (no 30-minute run its rate makes unlikely).
    rng = random.Random(7)
    sparse, t = [], 0.0
    while t < 86400.0:
        t += rng.expovariate(0.005)
        sparse.append(Request(t, 500, 100))
    assert empty_blocks(sparse) == (0, 288)
    assert active_seconds(sparse) == span_of(sparse)  # its rate is taken over its whole span


def test_a_header_in_another_case_is_read_and_other_near_misses_say_what_is_wrong(tmp_path: Path) -> None:
    # each of these got the same "not an Azure CSV, a BurstGPT CSV nor a Mooncake JSONL" line.
    lower = tmp_path / "lower.csv"
    lower.write_text("timestamp,contexttokens,generatedtokens\n2023-11-16 18:15:46.5,100,10\n"
                     "2023-11-16 18:15:47.5,200,20\n")
    assert [(r.prompt_tokens, r.output_tokens) for r in load_trace(lower)] == [(100, 10), (200, 20)]
    cases = {
        "array.json": (b'[{"timestamp": 0, "input_length": 5, "output_length": 3}]\n', "a JSON array"),
        "semi.csv": (b"TIMESTAMP;ContextTokens;GeneratedTokens\n", "not comma-separated"),
        "trace.csv.xz": (b"\xfd7zXZ\x00\x00\x04", "xz-compressed: decompress it to a file first"),
        "trace.zip": (b"PK\x03\x04\x14\x00", "zip-compressed"),
    }
    for name, (content, said) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(TraceError, match=re.escape(said)):
            detect_format(path)
    # a tarball of a good trace read as "an Azure CSV header without the column TIMESTAMP"
    import io
    import tarfile

    for mode, suffix, said in (("w", "tar", "is a tar archive: extract"), ("w:gz", "tar.gz", "(gzip-compressed)")):
        archive = tmp_path / f"trace.{suffix}"
        with tarfile.open(archive, mode) as tar:
            data = lower.read_bytes()
            info = tarfile.TarInfo("AzureLLMInferenceTrace_code.csv")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        with pytest.raises(TraceError, match=re.escape(said)):
            detect_format(archive)


def test_an_error_names_the_files_own_line_after_blank_lines_before_the_header(tmp_path: Path) -> None:
    # two blank lines before the header: an error on line 5 was reported on line 3.
    path = tmp_path / "blank.csv"
    path.write_text("\n\nTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,100,10\nnot a time,5,5\n")
    with pytest.raises(TraceError, match="line 5: "):
        load_trace(path)


def test_a_timestamp_far_from_the_rest_is_refused_not_allocated() -> None:
    # One date typed 9999- made the gap bookkeeping hold a list entry per 5 minutes of 8,000 years (a MemoryError
    # after 6.6 GB); 1e300 s overflowed with a traceback. Refused, naming the gap
    rows = "".join(f"2023-11-16 18:{m:02d}:00.0000000,100,10\n" for m in range(30))
    for far in ("9999-11-16 18:00:00.0000000", "2124-11-16 18:00:00.0000000"):
        with pytest.raises(TraceError, match="a timestamp far from the rest"):
            read_azure_csv("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows + f"{far},100,10\n")
    # the odd row named by its time, also when it is the earliest (a null date written as 1970: the message named
    # the normal rows, "before the arrival 19,678 days after the first")
    with pytest.raises(TraceError, match=r"with 1 arrival on its far side, from 1970-01-01 00:00:00 UTC"):
        read_azure_csv("TIMESTAMP,ContextTokens,GeneratedTokens\n1970-01-01 00:00:00.0000000,100,10\n" + rows)
    burst = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "".join(
        f"{t},m,100,10,110,x\n" for t in range(30)) + "1e300,m,100,10,110,x\n"
    with pytest.raises(TraceError, match="far from the rest"):
        load_trace_from(burst, "burst.csv")
    moon = "".join(f'{{"timestamp": {t * 1000}, "input_length": 10, "output_length": 5}}\n' for t in range(30))
    with pytest.raises(TraceError, match="far from the rest"):
        read_mooncake_jsonl(moon + '{"timestamp": 1e12, "input_length": 10, "output_length": 5}\n')


def load_trace_from(text: str, name: str, tmp: Path | None = None) -> list[Request]:
    import tempfile

    folder = Path(tempfile.mkdtemp()) if tmp is None else tmp
    path = folder / name
    path.write_text(text)
    return load_trace(path)


def test_a_row_with_more_fields_than_the_header_is_refused() -> None:
    # "0,llama,3,193,..." with an unquoted comma in Model was read by position: prompt 3, output 193
    text = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,llama,100,10,110,x\n"
            "1,llama,3,193,109,302,Conversation log\n")
    with pytest.raises(TraceError, match=r"line 3: 7 fields where the header has 6 \(an unquoted comma\?\)"):
        load_trace_from(text, "burst.csv")
    quoted = load_trace_from(text.replace("llama,3,193", '"llama,3",193'), "burst.csv")  # quoted, it reads
    assert [(r.prompt_tokens, r.output_tokens) for r in quoted] == [(100, 10), (193, 109)]


def test_the_rows_left_out_are_counted_by_reason(tmp_path: Path) -> None:
    # 1,800 of 2,000 rows with no prompt were dropped without a word, and the run simulated the rest at 10x the rate
    rows = "".join(f"2023-11-16 18:{m // 60:02d}:{m % 60:02d}.0000000,{0 if m % 10 else 100},10\n" for m in range(600))
    left_out: dict[str, int] = {}
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    assert len(load_trace(path, left_out=left_out)) == 60 and left_out == {"ContextTokens 0": 540}
    burst = tmp_path / "b.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "".join(
        f"{t},m,100,{0 if t % 4 == 0 else 10},110,x\n" for t in range(40)))
    left_out = {}
    assert len(load_trace(burst, left_out=left_out)) == 30 and left_out == {"Response tokens 0 (failed)": 10}


def test_mooncake_times_cut_to_the_minute_spread_over_the_minute() -> None:
    # A 3-s jitter on minute-quantized times made a once-a-minute sawtooth (usage 0 -> 100 %); the 3-s steps of the
    # published trace keep their 3-s jitter
    lines = "".join(f'{{"timestamp": {(i // 20) * 60000}, "input_length": 10, "output_length": 5}}\n'
                    for i in range(400))
    spread = read_mooncake_jsonl(lines, seed=1)
    within = [r.arrival_time % 60 for r in spread]
    assert max(within) > 30 and min(within) < 30
    three = read_mooncake_jsonl(lines.replace("60000", "3000"), seed=1)
    assert max(r.arrival_time % 3 for r in three) <= 3.0


def test_mooncake_times_fine_enough_to_be_distinct_are_kept() -> None:
    # millisecond-precise times were each moved by up to 3 s, reordering them, without a word
    times = [0, 95, 104, 106, 194, 1200, 2500, 2600, 4000, 4100]
    lines = "".join(f'{{"timestamp": {t}, "input_length": 10, "output_length": 5}}\n' for t in times)
    assert [r.arrival_time for r in read_mooncake_jsonl(lines, seed=5)] == pytest.approx([t / 1000 for t in times])
    assert "moved by a random part of the step" in TRACE_COLUMNS["mooncake"]["timestamp"]
    assert "moved by a random part of the step" in TRACE_COLUMNS["azure"]["TIMESTAMP"]


@pytest.mark.parametrize(("value", "said"), [("12.7", "not a whole number of tokens: '12.7'"),
                                             ("0.5", "not a whole number of tokens: '0.5'")])
def test_a_fractional_token_count_is_an_error_not_cut(value: str, said: str) -> None:
    # 12.7 read as 12 and 0.5 was left out as "ContextTokens 0", which the file never held
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.98,100,10\n"
            f"2023-11-16 18:17:04.98,{value},10\n")
    with pytest.raises(TraceError, match=f"line 3: ContextTokens: {re.escape(said)}"):
        read_azure_csv(text)
    assert read_azure_csv(text.replace(value, "12.0"))[1].prompt_tokens == 12
    with pytest.raises(TraceError, match="not a whole number"):
        read_mooncake_jsonl('{"timestamp": 0, "input_length": 10, "output_length": 2.5}\n')


def test_a_quoted_field_over_several_lines_is_one_row_and_later_errors_name_the_files_line() -> None:
    # a CSV writer's prompt column with a line end inside quotes was refused on the next line
    header = "TIMESTAMP,ContextTokens,GeneratedTokens,prompt\n"
    rows = ('2023-11-16 18:17:03.98,100,10,"line one\nline two, with comma"\n'
            '2023-11-16 18:17:04.98,200,20,plain\n')
    requests = read_azure_csv(header + rows)
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(100, 10), (200, 20)]
    with pytest.raises(TraceError, match="line 5: ContextTokens"):
        read_azure_csv(header + rows + "2023-11-16 18:17:05.98,x,20,plain\n")
    with pytest.raises(TraceError, match=r"line 2: a quoted field opened here is not closed$"):
        read_azure_csv(header + '2023-11-16 18:17:03.98,100,10,"never closed\n2023-11-16 18:17:04.98,x\n')
    # a quote inside an unquoted field is text, as csv reads it (it ran the rows together, then a traceback)
    screens = read_azure_csv(header + '2023-11-16 18:17:03.98,100,10,a 5" screen\n'
                             '2023-11-16 18:17:04.98,200,20,a 7" one\n2023-11-16 18:17:05.98,300,30,plain\n')
    assert [r.prompt_tokens for r in screens] == [100, 200, 300]
    stray = header + '2023-11-16 18:17:03.98,100,10,"stray\n' + "2023-11-16 18:17:04.98,200,20,plain\n" * 2000
    with pytest.raises(TraceError, match="line 2: a quoted field opened here is not closed within 1,000 lines"):
        read_azure_csv(stray)


def test_a_binary_file_is_named_as_one(tmp_path: Path) -> None:
    # a Parquet file was "not comma-separated" (a tab byte in its header)
    path = tmp_path / "trace.parquet"
    path.write_bytes(b"PAR1\x00\x15\x04\x00" + bytes(range(256)) * 4)
    with pytest.raises(TraceError, match="is a binary file: kvwatch reads CSV or JSON-lines text"):
        detect_format(path)


def test_a_header_naming_a_read_column_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "twice.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n2023-11-16 18:17:03.98,100,10,7\n")
    for read in (detect_format, read_azure_csv):
        with pytest.raises(TraceError, match="line 1: the header names ContextTokens twice"):
            read(path)


def test_an_empty_trace_or_an_unknown_first_line_is_named(tmp_path: Path) -> None:
    # Every such file got one generic "not an Azure CSV ... nor a Mooncake JSONL"
    for name, content in (("empty.csv", b""), ("bom.csv", b"\xef\xbb\xbf\n\n"), ("empty.csv.gz", gzip.compress(b""))):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(TraceError, match="is empty"):
            detect_format(tmp_path / name)
    (tmp_path / "comment.csv").write_text("# exported 2024-05-01\nTIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(TraceError, match=r"line 1 \('# exported 2024-05-01'\)"):
        detect_format(tmp_path / "comment.csv")


def test_a_file_longer_than_what_is_read_must_be_in_time_order(tmp_path: Path) -> None:
    # 3 million shuffled rows read their first million in file order: the whole week thinned 3x, a rate 3x too low
    # reported as "the first 175 h". A file read whole may be in any order (it is sorted).
    head, *rows = packaged_trace("azure_conv_sample.csv").read_text().splitlines()
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)
    csv_path = tmp_path / "shuffled.csv"
    csv_path.write_text("\n".join([head, *shuffled]) + "\n")
    with pytest.raises(TraceError, match=r"line \d+: an arrival earlier than the row before it.*sort the file"):
        read_azure_csv(csv_path, max_requests=100)
    assert len(read_azure_csv(csv_path)) == len(rows)
    in_order = tmp_path / "sorted.csv"
    in_order.write_text("\n".join([head, *rows]) + "\n")
    assert len(read_azure_csv(in_order, max_requests=100)) == 100
    lines = packaged_trace("mooncake_conversation_sample.jsonl").read_text().splitlines()
    jsonl = tmp_path / "shuffled.jsonl"
    jsonl.write_text("\n".join([lines[-1], *lines[:-1]]) + "\n")  # the last arrival first
    with pytest.raises(TraceError, match=r"line 2: an arrival earlier"):
        read_mooncake_jsonl(jsonl, max_requests=100)
    assert len(read_mooncake_jsonl(jsonl, max_requests=len(lines))) == len(lines)
