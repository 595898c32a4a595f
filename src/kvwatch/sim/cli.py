"""``kvwatch simulate``: the built-in vLLM simulator, serving ``/metrics`` or running headless.

Serving: the simulated clock runs ``--clock-speed`` times real time and ``/metrics`` answers as the chosen vLLM
version would. The first line on stdout is ``serving http://HOST:PORT/metrics`` (``--port 0`` picks a
free port). Headless (``--no-serve``): runs ``--duration-seconds`` of simulated time as fast as possible
and prints a summary (``--json``: one JSON object).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvwatch.capacity.kv import VLLM_BLOCK_SIZES  # (the one list: serve and plan refuse any other too)
from kvwatch.settings import SettingsError, check_listen_address, path_argument
from kvwatch.sim import buckets
from kvwatch.sim.engine import EngineConfig, EngineSnapshot, Request, Simulator, StepTimeModel
from kvwatch.sim.engines_wire import ENGINES
from kvwatch.sim.load import PROFILE_KINDS, LoadGenerator, LoadProfile
from kvwatch.sim.metrics import DEFAULT_PROFILE, MULTIPROCESS_PROFILES, PROFILES, SINGLE_ENGINE_PROFILES
from kvwatch.sim.server import Feed, SimulationService, TraceFeed, make_server, start_ticker
from kvwatch.sim.traces import TraceError, load_trace, packaged_or_given, packaged_trace_names, scale_rate
from kvwatch.stop_signals import StopSignals

SAMPLE_EVERY_SECONDS = 1.0  # headless statistics sample the engine like a 1 s scrape would


class ClockSpeed(argparse.Action):
    """``--clock-speed``, whose old name ``--speed`` still works and says that it is deprecated."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string is not None and not "--clock-speed".startswith(option_string):  # --speed, or --spee
            print(f"{parser.prog}: --speed is a deprecated alias: use --clock-speed", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    srv = parser.add_argument_group("serving")
    srv.add_argument("--listen-address", default="127.0.0.1", help="address to serve /metrics on")
    srv.add_argument("--port", type=int, default=8000, help="port to serve /metrics on (0: pick a free one)")
    # One name per idea: kvwatch serve's setting is --clock-speed too.
    srv.add_argument("--clock-speed", "--speed", dest="speed", type=float, default=1.0, action=ClockSpeed,
                     help="simulated seconds per wall-clock second (at most 10000); --speed is a deprecated alias")
    srv.add_argument("--no-serve", action="store_true", help="run headless as fast as possible, then print a summary")
    srv.add_argument("--duration-seconds", type=float, default=None,
                     help="simulated seconds to run (required with --no-serve; when serving, stop after it)")
    srv.add_argument("--json", action="store_true", help="with --no-serve: print the summary as one JSON object")
    srv.add_argument("--restart-at-seconds", type=_times, default=(), metavar="T[,T...]",
                     help="simulated times at which the server restarts (in-flight work lost, counters reset)")

    eng = parser.add_argument_group("engine (vLLM's own flag names)")
    eng.add_argument("--engine", choices=ENGINES, default="vllm",
                     help="whose /metrics names to speak: vllm (see --vllm-version), sglang (current collector.py "
                     "names) or tensorrt-llm (trtllm-serve's trtllm_* names; one data-parallel engine)")
    eng.add_argument("--vllm-version", choices=PROFILES, default=DEFAULT_PROFILE, help="which vLLM's /metrics to speak")
    eng.add_argument("--num-gpu-blocks", type=int, default=2048, help="KV blocks per engine (like "
                     "--num-gpu-blocks-override)")
    eng.add_argument("--block-size", type=int, default=16,
                     help=f"tokens per KV block: {', '.join(map(str, VLLM_BLOCK_SIZES))} (vLLM's sizes)")
    eng.add_argument("--data-parallel-size", type=int, default=1, help="data-parallel engines behind the endpoint")
    eng.add_argument("--max-num-seqs", type=int, default=256, help="most requests running at once per engine")
    eng.add_argument("--max-num-batched-tokens", type=int, default=8192, help="token budget of one step")
    eng.add_argument("--max-model-len", type=int, default=8192,
                     help="longest prompt+output accepted (longer requests are rejected as vLLM does)")
    eng.add_argument("--enable-prefix-caching", action="store_true",
                     help="share prefix blocks (trace hash_ids); off by default, unlike vLLM V1")
    eng.add_argument("--model-name", default="meta-llama/Llama-3.1-8B-Instruct", help="served model name label")
    eng.add_argument("--multiprocess", action="store_true",
                     help="expose through prometheus_client's multiprocess mode, as V1 with --api-server-count > 1 "
                     "and V0's default frontend do (no process_* families, pid on gauges without a mode, _sum first)")
    step = StepTimeModel()
    eng.add_argument("--step-fixed-ms", type=float, default=round(step.fixed_seconds * 1000, 6),
                     help="fixed cost of one engine step")
    eng.add_argument("--step-decode-token-ms", type=float, default=round(step.per_decode_token_seconds * 1000, 6),
                     help="cost per decode token in a step")
    eng.add_argument("--step-prefill-token-ms", type=float, default=round(step.per_prefill_token_seconds * 1000, 6),
                     help="cost per prefill token in a step")

    load = parser.add_argument_group("load")
    load.add_argument("--profile", choices=PROFILE_KINDS, default="constant", help="arrival-rate shape")
    load.add_argument("--rate", type=float, default=None,
                      help=f"requests per second (start of the profile; default {DEFAULT_RATE:g}, at most 10000)")
    load.add_argument("--rate-end", type=float, default=None, help="the profile's other rate (ramp end, step, peak)")
    load.add_argument("--period-seconds", type=float, default=None,
                      help="ramp length, step time, diurnal period or mean burst cycle (simulated seconds; "
                      f"default {DEFAULT_PERIOD_SECONDS:g})")
    load.add_argument("--prompt-tokens", type=float, default=1000.0,
                      help="mean prompt length (at most --max-model-len)")
    load.add_argument("--output-tokens", type=float, default=200.0,
                      help="mean output length (at most --max-model-len)")
    load.add_argument("--trace", type=path_argument, default=None,
                      help="replay a trace instead (Azure or BurstGPT CSV, Mooncake JSONL, detected from the "
                      "content; gzip is fine; or a packaged sample by name: "
                      f"{', '.join(packaged_trace_names())}); loops when it ends; "
                      "requests longer than --max-model-len are rejected (a warning at startup says how many)")
    load.add_argument("--rate-scale", type=float, default=1.0,
                      help="with --trace: arrival-rate multiplier (at most 1000)")
    load.add_argument("--seed", type=int, default=0, help="random seed (runs are deterministic for a seed)")


def _times(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated seconds, e.g. 600,1800") from None
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError("restart times must be finite and > 0")
    return values


# Upper bounds: past these a run is not slow but broken (a request flood, a clock the engine cannot follow,
# a step longer than any real one), so they are flag errors rather than long runs.
MAX_SPEED = 10_000.0  # the engine simulates ~1,000-4,000x real time; beyond this it could never keep up
MAX_RATE = 10_000.0  # requests per simulated second
DEFAULT_PERIOD_SECONDS = 600.0  # the profile's time scale when --period-seconds is not given
DEFAULT_RATE = 2.0  # requests per second when --rate is not given
MAX_RATE_SCALE = 1_000.0  # copies of the trace superposed
MAX_STEP_FIXED_MS = 60_000.0
MAX_STEP_TOKEN_MS = 1_000.0
MAX_DATA_PARALLEL = 1_024
MAX_MODEL_LEN = buckets.REQUEST_TOKENS[-1]  # token histograms are recorded up to here


def check(ok: bool, flag: str, message: str, value: Any) -> None:
    """SettingsError naming ``flag`` unless ``ok``."""
    if not ok:
        raise SettingsError(f"invalid value {value!r} for {flag}: {message}")


def check_number(value: float, flag: str, low: float, high: float, *, low_open: bool = False) -> None:
    """A finite number in [low, high] (or (low, high] with ``low_open``); NaN and infinities are refused."""
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    check(ok, flag, f"must be a finite number {'>' if low_open else '>='} {low:g} and <= {high:g}", value)


def _fits_one_request(args: argparse.Namespace) -> None:
    """vLLM sizes the cache for at least one request of max_model_len; refuse a cache that cannot."""
    usable = args.num_gpu_blocks - 1
    needed = -(-args.max_model_len // args.block_size)
    if needed > usable:
        raise SettingsError(
            f"--num-gpu-blocks {args.num_gpu_blocks} ({usable} usable blocks x {args.block_size} tokens = "
            f"{usable * args.block_size} tokens) cannot hold one request of --max-model-len {args.max_model_len} "
            f"({needed} blocks): lower --max-model-len to <= {usable * args.block_size} or raise --num-gpu-blocks "
            f"to >= {needed + 1}")


def build(args: argparse.Namespace, warn: Callable[[str], None] | None = None) -> tuple[Simulator, Feed, dict]:
    """Simulator, request feed and render options from the flags; SettingsError names a bad flag.

    ``warn`` receives one line per thing worth knowing before the run (e.g. trace requests that
    ``--max-model-len`` will reject).
    """
    check(args.num_gpu_blocks >= 2, "--num-gpu-blocks", "must be >= 2", args.num_gpu_blocks)
    check(args.block_size in VLLM_BLOCK_SIZES, "--block-size",
          f"vLLM takes {', '.join(map(str, VLLM_BLOCK_SIZES))}", args.block_size)
    try:  # (serve's check: an empty address listened on every interface)
        check_listen_address(args.listen_address)
    except ValueError as exc:
        check(False, "--listen-address", str(exc), args.listen_address)
    check(1 <= args.data_parallel_size <= MAX_DATA_PARALLEL, "--data-parallel-size",
           f"must be 1..{MAX_DATA_PARALLEL}", args.data_parallel_size)
    check(args.max_num_seqs >= 1, "--max-num-seqs", "must be >= 1", args.max_num_seqs)
    check(args.max_num_batched_tokens >= 1, "--max-num-batched-tokens", "must be >= 1", args.max_num_batched_tokens)
    check(2 <= args.max_model_len <= MAX_MODEL_LEN, "--max-model-len", f"must be 2..{MAX_MODEL_LEN}",
           args.max_model_len)
    _fits_one_request(args)
    check_number(args.speed, "--clock-speed", 0, MAX_SPEED, low_open=True)
    # A trace gives the arrivals (--rate-scale scales them): the profile's flags were taken and changed nothing.
    if args.trace is not None:
        for flag, value in (("--profile", args.profile if args.profile != "constant" else None), ("--rate", args.rate),
                            ("--rate-end", args.rate_end), ("--period-seconds", args.period_seconds)):
            check(value is None, flag, "shapes the synthetic load, which --trace replaces: --rate-scale scales the "
                  "trace's rate", value)
    if args.rate is None:
        args.rate = DEFAULT_RATE
    check_number(args.rate, "--rate", 0, MAX_RATE)
    if args.rate_end is not None:
        check_number(args.rate_end, "--rate-end", 0, MAX_RATE)
    # The constant profile has no other rate and no period: taken, they changed nothing but the random draws, and a
    # run meant to fill the cache ran flat.
    for flag, value in (("--rate-end", args.rate_end), ("--period-seconds", args.period_seconds)):
        check(args.profile != "constant" or value is None, flag,
              "shapes a profile: add --profile ramp, step, diurnal or bursty (the default, constant, holds --rate)",
              value)
    if args.period_seconds is None:
        args.period_seconds = DEFAULT_PERIOD_SECONDS
    # Below a second, the bursty profile would flip between burst and calm ~10^k times a simulated second.
    check_number(args.period_seconds, "--period-seconds", 1, 1e9)
    # Means above max_model_len make no sense (sizes are capped below it) and overflow the lognormal draw. With
    # --trace the trace gives the lengths: the flags are unused, so not checked (a default above a short
    # --max-model-len refused a trace run).
    if args.trace is None:
        check_number(args.prompt_tokens, "--prompt-tokens", 1, args.max_model_len)
        check_number(args.output_tokens, "--output-tokens", 1, args.max_model_len)
    check_number(args.rate_scale, "--rate-scale", 0, MAX_RATE_SCALE, low_open=True)
    check(args.trace is not None or args.rate_scale == 1.0, "--rate-scale", "scales a --trace's rate: give --trace "
          "(the load profile's rate is --rate)", args.rate_scale)
    check(args.no_serve or not args.json, "--json", "prints the summary of a --no-serve run (a server prints none)",
          True)
    check_number(args.step_fixed_ms, "--step-fixed-ms", 0, MAX_STEP_FIXED_MS, low_open=True)
    check_number(args.step_decode_token_ms, "--step-decode-token-ms", 0, MAX_STEP_TOKEN_MS)
    check_number(args.step_prefill_token_ms, "--step-prefill-token-ms", 0, MAX_STEP_TOKEN_MS)
    if args.duration_seconds is not None:
        check_number(args.duration_seconds, "--duration-seconds", 0, 1e12, low_open=True)
        late = [t for t in args.restart_at_seconds if t > args.duration_seconds]  # (one at the end still happens)
        check(not late, "--restart-at-seconds", f"comes after --duration-seconds {args.duration_seconds:g}: the run "
              "ends first", ",".join(f"{t:g}" for t in late))  # (it was taken, and never restarted)
    if args.no_serve and args.duration_seconds is None:  # (not "invalid value None": nothing was given)
        raise SettingsError("--no-serve needs --duration-seconds (the simulated seconds to run)")
    check(args.data_parallel_size == 1 or args.vllm_version not in SINGLE_ENGINE_PROFILES, "--data-parallel-size",
           f"vLLM {args.vllm_version} has no engine label, so it serves one engine", args.data_parallel_size)
    check(not args.multiprocess or args.vllm_version in MULTIPROCESS_PROFILES, "--multiprocess",
           f"vLLM {args.vllm_version} has no multiprocess metrics mode (one API server)", True)
    check(args.engine != "tensorrt-llm" or args.data_parallel_size == 1, "--data-parallel-size",
          "trtllm-serve exposes one engine (no rank label)", args.data_parallel_size)
    check(args.engine == "vllm" or not args.multiprocess, "--multiprocess", "is a vLLM exposition mode", True)
    check(1 <= args.port <= 65535 or args.port == 0, "--port", "must be 0..65535", args.port)

    step = StepTimeModel(args.step_fixed_ms / 1000, args.step_decode_token_ms / 1000, args.step_prefill_token_ms / 1000)
    config = EngineConfig(
        num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, data_parallel_size=args.data_parallel_size,
        enable_prefix_caching=args.enable_prefix_caching, step=step, max_model_len=args.max_model_len,
    )
    feed: Feed
    if args.trace is not None:
        try:
            requests = load_trace(packaged_or_given(args.trace), seed=args.seed)
        except TraceError as exc:
            raise SettingsError(f"invalid value for --trace: {exc}") from None
        if args.rate_scale != 1.0:
            try:
                requests = scale_rate(requests, args.rate_scale, seed=args.seed)
            except ValueError as exc:
                raise SettingsError(f"invalid value {args.rate_scale!r} for --rate-scale: {exc}") from None
        check(bool(requests), "--rate-scale", "leaves no requests of the trace", args.rate_scale)
        too_long, longest = too_long_for(requests, args.max_model_len)
        if too_long and warn is not None:
            warn(f"warning: {too_long} of {len(requests)} trace requests ({too_long / len(requests):.0%}) are "
                 f"longer than --max-model-len {args.max_model_len} and will be rejected, as vLLM rejects them "
                 f"(HTTP 400; counted in requests_rejected); the longest is {longest} tokens: raise "
                 "--max-model-len (and --num-gpu-blocks) to replay them")
        feed = TraceFeed(requests)
    else:
        max_output = max(1, args.max_model_len // 4)
        feed = LoadGenerator(LoadProfile(
            kind=args.profile, rate=args.rate, rate_end=args.rate_end, period_seconds=args.period_seconds,
            prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
            max_prompt_tokens=max(1, args.max_model_len - max_output), max_output_tokens=max_output,
        ), seed=args.seed)
    if args.engine != "vllm":
        return Simulator(config, seed=args.seed), feed, {"engine": args.engine, "model_name": args.model_name}
    render_options = {"profile": args.vllm_version, "model_name": args.model_name, "multiprocess": args.multiprocess,
                      "max_model_len": args.max_model_len, "enable_prefix_caching": args.enable_prefix_caching,
                      "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}
    return Simulator(config, seed=args.seed), feed, render_options


def too_long_for(requests: Sequence[Request], max_model_len: int) -> tuple[int, int]:
    """(requests whose prompt + output exceed ``max_model_len``, the longest prompt + output)."""
    lengths = [r.prompt_tokens + r.output_tokens for r in requests]
    return sum(1 for n in lengths if n > max_model_len), max(lengths, default=0)


def run(args: argparse.Namespace) -> int:
    simulator, feed, render_options = build(args, warn=lambda line: print(f"kvwatch simulate: {line}",
                                                                         file=sys.stderr, flush=True))
    if not args.no_serve and args.engine == "vllm":
        # A served process starts now, as vLLM's process_start_time_seconds says: a fixed start shared by every
        # simulator made a killed and restarted one look like counters going down under one start (read as
        # impossible values, the forecaster kept its history). Headless runs keep the fixed one (deterministic).
        render_options = {**render_options, "start_time": round(time.time(), 2)}
    service = SimulationService(simulator, feed, render_options, speed=args.speed, restarts=args.restart_at_seconds)
    if args.no_serve:
        return _headless(service, args)
    return _serve(service, args)


def summarize(samples: list[tuple[EngineSnapshot, ...]], submitted: int, wall_seconds: float) -> dict[str, Any]:
    """The headless summary over per-second samples."""
    last = samples[-1]
    usages = [s.kv_usage for snap in samples for s in snap]
    simulated = last[0].time
    return {
        "simulated_seconds": simulated,
        "wall_seconds": round(wall_seconds, 4),
        "speedup": round(simulated / wall_seconds, 1) if wall_seconds > 0 else None,
        "requests_submitted": submitted,
        "requests_completed": sum(s.requests_completed for s in last),
        "requests_rejected": sum(s.requests_rejected_total for s in last),
        "requests_running": sum(s.num_running for s in last),
        "requests_waiting": sum(s.num_waiting for s in last),
        "preemptions": sum(s.preemptions_total for s in last),
        "kv_usage_mean": sum(usages) / len(usages),
        "kv_usage_max": max(usages),
        "prompt_tokens": sum(s.prompt_tokens_total for s in last),
        "generation_tokens": sum(s.generation_tokens_total for s in last),
    }


def _headless(service: SimulationService, args: argparse.Namespace) -> int:
    duration = float(args.duration_seconds)
    started = time.perf_counter()
    samples = []
    t = 0.0
    while t < duration:
        t = min(duration, t + SAMPLE_EVERY_SECONDS)
        samples.append(service.advance(t))
    summary = summarize(samples, service.submitted, time.perf_counter() - started)
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key:20} {value}")
    return 0


def _serve(service: SimulationService, args: argparse.Namespace) -> int:
    try:
        server = make_server(service, args.listen_address, args.port)
    except OSError as exc:
        print(f"kvwatch simulate: cannot listen on --listen-address {args.listen_address} --port {args.port}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 2
    signals = StopSignals().install()  # before the line that says it serves: a stop from then on is clean
    host, port = server.server_address[:2]
    print(f"serving http://{f'[{host}]' if ':' in host else host}:{port}/metrics", flush=True)
    speaks = f"vLLM {args.vllm_version}" if args.engine == "vllm" else args.engine
    print(f"{speaks} simulator: {args.data_parallel_size} x {args.num_gpu_blocks} blocks of "
          f"{args.block_size} tokens, speed x{args.speed:g}", file=sys.stderr, flush=True)
    stop = threading.Event()  # the ticker's (set from this thread only: kvwatch.stop_signals)
    ticker = start_ticker(service, stop)
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    serving.start()
    try:
        signals.wait(None if args.duration_seconds is None else args.duration_seconds / args.speed)
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        ticker.join(timeout=2)
        signals.restore()
    return 0
