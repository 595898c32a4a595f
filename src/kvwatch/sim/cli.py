"""``kvwatch simulate``: the built-in vLLM simulator, serving ``/metrics`` or running headless.

Serving: the simulated clock runs ``--speed`` times real time and ``/metrics`` answers as the chosen vLLM
version would. The first line on stdout is ``serving http://HOST:PORT/metrics`` (``--port 0`` picks a
free port). Headless (``--no-serve``): runs ``--duration-seconds`` of simulated time as fast as possible
and prints a summary (``--json``: one JSON object).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kvwatch.settings import SettingsError
from kvwatch.sim.engine import EngineConfig, EngineSnapshot, Simulator, StepTimeModel
from kvwatch.sim.load import PROFILE_KINDS, LoadGenerator, LoadProfile
from kvwatch.sim.metrics import PROFILES, SINGLE_ENGINE_PROFILES
from kvwatch.sim.server import Feed, SimulationService, TraceFeed, make_server, start_ticker
from kvwatch.sim.traces import TraceError, load_trace, scale_rate

SAMPLE_EVERY_SECONDS = 1.0  # headless statistics sample the engine like a 1 s scrape would


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    srv = parser.add_argument_group("serving")
    srv.add_argument("--listen-address", default="127.0.0.1", help="address to serve /metrics on")
    srv.add_argument("--port", type=int, default=8000, help="port to serve /metrics on (0: pick a free one)")
    srv.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall-clock second")
    srv.add_argument("--no-serve", action="store_true", help="run headless as fast as possible, then print a summary")
    srv.add_argument("--duration-seconds", type=float, default=None,
                     help="simulated seconds to run (required with --no-serve; when serving, stop after it)")
    srv.add_argument("--json", action="store_true", help="with --no-serve: print the summary as one JSON object")
    srv.add_argument("--restart-at-seconds", type=_times, default=(), metavar="T[,T...]",
                     help="simulated times at which the server restarts (in-flight work lost, counters reset)")

    eng = parser.add_argument_group("engine (vLLM's own flag names)")
    eng.add_argument("--vllm-version", choices=PROFILES, default="0.33", help="which vLLM's /metrics to speak")
    eng.add_argument("--num-gpu-blocks", type=int, default=2048, help="KV blocks per engine (like "
                     "--num-gpu-blocks-override)")
    eng.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    eng.add_argument("--data-parallel-size", type=int, default=1, help="data-parallel engines behind the endpoint")
    eng.add_argument("--max-num-seqs", type=int, default=256, help="most requests running at once per engine")
    eng.add_argument("--max-num-batched-tokens", type=int, default=8192, help="token budget of one step")
    eng.add_argument("--max-model-len", type=int, default=8192,
                     help="longest prompt+output accepted (longer requests are rejected as vLLM does)")
    eng.add_argument("--enable-prefix-caching", action="store_true", help="share prefix blocks (trace hash_ids)")
    eng.add_argument("--model-name", default="meta-llama/Llama-3.1-8B-Instruct", help="served model name label")
    eng.add_argument("--multiprocess", action="store_true",
                     help="expose as vLLM with --api-server-count > 1 does (pid labels, _sum before _bucket)")
    step = StepTimeModel()
    eng.add_argument("--step-fixed-ms", type=float, default=round(step.fixed_seconds * 1000, 6),
                     help="fixed cost of one engine step")
    eng.add_argument("--step-decode-token-ms", type=float, default=round(step.per_decode_token_seconds * 1000, 6),
                     help="cost per decode token in a step")
    eng.add_argument("--step-prefill-token-ms", type=float, default=round(step.per_prefill_token_seconds * 1000, 6),
                     help="cost per prefill token in a step")

    load = parser.add_argument_group("load")
    load.add_argument("--profile", choices=PROFILE_KINDS, default="constant", help="arrival-rate shape")
    load.add_argument("--rate", type=float, default=2.0, help="requests per second (start of the profile)")
    load.add_argument("--rate-end", type=float, default=None, help="the profile's other rate (ramp end, step, peak)")
    load.add_argument("--period-seconds", type=float, default=600.0,
                      help="ramp length, step time, diurnal period or mean burst cycle (simulated seconds)")
    load.add_argument("--prompt-tokens", type=float, default=1000.0, help="mean prompt length")
    load.add_argument("--output-tokens", type=float, default=200.0, help="mean output length")
    load.add_argument("--trace", type=Path, default=None,
                      help="replay a trace instead (.csv Azure, .jsonl Mooncake); loops when it ends")
    load.add_argument("--rate-scale", type=float, default=1.0, help="with --trace: arrival-rate multiplier")
    load.add_argument("--seed", type=int, default=0, help="random seed (runs are deterministic for a seed)")


def _times(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated seconds, e.g. 600,1800") from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("restart times must be > 0")
    return values


def _check(ok: bool, flag: str, message: str, value: Any) -> None:
    if not ok:
        raise SettingsError(f"invalid value {value!r} for {flag}: {message}")


def build(args: argparse.Namespace) -> tuple[Simulator, Feed, dict]:
    """Simulator, request feed and render options from the flags; SettingsError names a bad flag."""
    _check(args.num_gpu_blocks >= 2, "--num-gpu-blocks", "must be >= 2", args.num_gpu_blocks)
    _check(args.block_size >= 1, "--block-size", "must be >= 1", args.block_size)
    _check(args.data_parallel_size >= 1, "--data-parallel-size", "must be >= 1", args.data_parallel_size)
    _check(args.max_num_seqs >= 1, "--max-num-seqs", "must be >= 1", args.max_num_seqs)
    _check(args.max_num_batched_tokens >= 1, "--max-num-batched-tokens", "must be >= 1", args.max_num_batched_tokens)
    _check(args.max_model_len >= 2, "--max-model-len", "must be >= 2", args.max_model_len)
    _check(-(-args.max_model_len // args.block_size) <= args.num_gpu_blocks - 1, "--max-model-len",
           f"one request of that length needs more than the {args.num_gpu_blocks - 1} usable blocks "
           "(vLLM refuses to start)", args.max_model_len)
    _check(args.speed > 0, "--speed", "must be > 0", args.speed)
    _check(args.rate >= 0, "--rate", "must be >= 0", args.rate)
    _check(args.rate_end is None or args.rate_end >= 0, "--rate-end", "must be >= 0", args.rate_end)
    _check(args.period_seconds > 0, "--period-seconds", "must be > 0", args.period_seconds)
    _check(args.prompt_tokens >= 1, "--prompt-tokens", "must be >= 1", args.prompt_tokens)
    _check(args.output_tokens >= 1, "--output-tokens", "must be >= 1", args.output_tokens)
    _check(args.rate_scale > 0, "--rate-scale", "must be > 0", args.rate_scale)
    _check(args.step_fixed_ms > 0, "--step-fixed-ms", "must be > 0", args.step_fixed_ms)
    _check(args.step_decode_token_ms >= 0, "--step-decode-token-ms", "must be >= 0", args.step_decode_token_ms)
    _check(args.step_prefill_token_ms >= 0, "--step-prefill-token-ms", "must be >= 0", args.step_prefill_token_ms)
    _check(args.duration_seconds is None or args.duration_seconds > 0, "--duration-seconds", "must be > 0",
           args.duration_seconds)
    _check(not (args.no_serve and args.duration_seconds is None), "--duration-seconds", "required with --no-serve",
           None)
    _check(args.data_parallel_size == 1 or args.vllm_version not in SINGLE_ENGINE_PROFILES, "--data-parallel-size",
           f"vLLM {args.vllm_version} has no engine label, so it serves one engine", args.data_parallel_size)
    _check(not args.multiprocess or args.vllm_version not in SINGLE_ENGINE_PROFILES, "--multiprocess",
           f"vLLM {args.vllm_version} has no multiprocess metrics mode", True)
    _check(1 <= args.port <= 65535 or args.port == 0, "--port", "must be 0..65535", args.port)

    step = StepTimeModel(args.step_fixed_ms / 1000, args.step_decode_token_ms / 1000, args.step_prefill_token_ms / 1000)
    config = EngineConfig(
        num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, data_parallel_size=args.data_parallel_size,
        enable_prefix_caching=args.enable_prefix_caching, step=step, max_model_len=args.max_model_len,
    )
    feed: Feed
    if args.trace is not None:
        try:
            requests = load_trace(args.trace, seed=args.seed)
        except TraceError as exc:
            raise SettingsError(f"invalid value for --trace: {exc}") from None
        if args.rate_scale != 1.0:
            requests = scale_rate(requests, args.rate_scale, seed=args.seed)
        _check(bool(requests), "--rate-scale", "leaves no requests of the trace", args.rate_scale)
        feed = TraceFeed(requests)
    else:
        max_output = max(1, args.max_model_len // 4)
        feed = LoadGenerator(LoadProfile(
            kind=args.profile, rate=args.rate, rate_end=args.rate_end, period_seconds=args.period_seconds,
            prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
            max_prompt_tokens=max(1, args.max_model_len - max_output), max_output_tokens=max_output,
        ), seed=args.seed)
    render_options = {"profile": args.vllm_version, "model_name": args.model_name, "multiprocess": args.multiprocess,
                      "max_model_len": args.max_model_len, "enable_prefix_caching": args.enable_prefix_caching}
    return Simulator(config, seed=args.seed), feed, render_options


def run(args: argparse.Namespace) -> int:
    simulator, feed, render_options = build(args)
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
        print(f"kvwatch simulate: cannot listen on {args.listen_address}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    host, port = server.server_address[:2]
    print(f"serving http://{host}:{port}/metrics", flush=True)
    print(f"vLLM {args.vllm_version} simulator: {args.data_parallel_size} x {args.num_gpu_blocks} blocks of "
          f"{args.block_size} tokens, speed x{args.speed:g}", file=sys.stderr, flush=True)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ticker = start_ticker(service, stop)
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    serving.start()
    try:
        wall_limit = None if args.duration_seconds is None else args.duration_seconds / args.speed
        stop.wait(wall_limit)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        ticker.join(timeout=2)
        signal.signal(signal.SIGTERM, previous)
    return 0
