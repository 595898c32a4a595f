"""``kvwatch backtest``: replay a trace through the simulator and score kvwatch against the baselines.

Exit codes: 0 ok, 2 bad usage (the message names the flag), 1 runtime failure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace

from kvwatch.backtest.scenarios import (
    BLOCK_SECONDS,
    DEFAULT_MAX_MODEL_LEN,
    LONG_PROMPT_RANGE,
    MAX_SCALE,
    PROFILES,
    Scenario,
    ScenarioError,
    block_seconds_for,
    load_trace_head,
    validate,
)
from kvwatch.backtest.scoring import WARMUP_SECONDS
from kvwatch.settings import SettingsError, path_argument, png_output_path
from kvwatch.sim.engines_wire import ENGINES
from kvwatch.sim.traces import (
    DENSE_REQUESTS_PER_SECOND,
    MOONCAKE_UNIT_HINT,
    TRACE_COLUMNS,
    TraceError,
    active_seconds,
    detect_format,
    empty_blocks,
    packaged_or_given,
    packaged_trace_names,
    span_of,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Replay a real request trace (block-bootstrapped, shaped by a load profile) through the built-in vLLM "
        "simulator, poll it every 10 s, run kvwatch's forecaster and four baselines on the same polls, and "
        "score early warnings against the simulated saturation events. Load is offered KV demand as a "
        "fraction of the simulated capacity (1.0: mean demand equals the cache)."
    )
    parser.add_argument("--trace", type=path_argument, required=True,
                        help="any file in the Azure CSV format (columns read: TIMESTAMP, ContextTokens, "
                             "GeneratedTokens), the BurstGPT CSV format (Timestamp s, Request tokens, Response "
                             "tokens) or the Mooncake JSONL format (timestamp ms, input_length, output_length, "
                             "hash_ids), gzip-compressed or not; detected from its content; or a packaged sample by "
                             f"name: {', '.join(packaged_trace_names())}")
    parser.add_argument("--profile", choices=PROFILES, default="ramp",
                        help="ramp: start→peak (after 30 min at start); step: jumps at half time; diurnal: daily "
                             "swing; steady: holds peak; restart: steady with an engine restart at half time; "
                             "mixshift: requests grow at half time; burst-short: ramp with +0.5 load for 20 s every "
                             "2 min; burst-long: start, with peak for 10 min every 45 min (default ramp)")
    parser.add_argument("--hours", type=float, default=3.0,
                        help="simulated hours, above 0.5 (the warm-up) and at most 168 (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap and simulator seed (default 0)")
    parser.add_argument("--start-load", type=float, default=0.5, help="load at the start (default 0.5)")
    parser.add_argument("--peak-load", type=float, default=1.3, help="peak load (default 1.3)")
    parser.add_argument("--rate-scale", type=float, default=None,
                        help="multiply the trace's native rate (default: tuned for the Azure and Mooncake traces by "
                             "name, else to ~20 requests/s from the trace's content; docs/forecasting.md)")
    parser.add_argument("--engine-speedup", type=float, default=None,
                        help="divide the simulated step costs (default: tuned by name, else from the trace's "
                             "prompt and output lengths, so compute stays unsaturated)")
    parser.add_argument("--prompt-scale", type=float, default=1.0,
                        help="multiply every prompt length (long-context stress; prompt + output capped at "
                             "--max-model-len; default 1)")
    parser.add_argument("--long-fraction", type=float, default=0.0,
                        help="replace this share of prompts by log-uniform 16k-128k-token ones (capped at "
                             "--max-model-len; default 0)")
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN,
                        help=f"longest prompt + output the scenario may create (default {DEFAULT_MAX_MODEL_LEN})")
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="read each poll through this engine's /metrics names and kvwatch's adapter "
                             "(default: straight from the simulator)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--plot", type=path_argument, default=None, metavar="PNG",
                        help="draw the timeline to this .png file (its path is printed on stderr)")


JSON_USAGE_ERRORS = True  # kvwatch.cli: with --json, bad usage is also {"error": {"reason": "usage", ...}}


def run(args: argparse.Namespace) -> int:
    from kvwatch.backtest.runner import run_scenario
    from kvwatch.backtest.traces import defaults_for, named

    if args.plot is not None:
        args.plot = png_output_path(args.plot)
    args.trace = packaged_or_given(args.trace)
    scenario = Scenario(
        trace_name=args.trace.name,
        profile=args.profile,
        hours=args.hours,
        seed=args.seed,
        start_load=args.start_load,
        peak_load=args.peak_load,
        rate_scale=args.rate_scale if args.rate_scale is not None else 1.0,
        engine_speedup=args.engine_speedup if args.engine_speedup is not None else 1.0,
        prompt_scale=args.prompt_scale,
        long_fraction=args.long_fraction,
        max_model_len=args.max_model_len,
    )
    try:
        validate(scenario)  # the flags first: a bad --hours must not wait for a million-row trace to be read
        left_out: dict[str, int] = {}
        trace, truncated = load_trace_head(args.trace, left_out, max_model_len=args.max_model_len)
        trace_format = detect_format(args.trace)
    except (ScenarioError, TraceError) as exc:
        raise SettingsError(str(exc)) from None
    rate_scale, speedup = defaults_for(args.trace, trace, prompt_scale=args.prompt_scale,
                                       long_fraction=args.long_fraction, max_model_len=args.max_model_len,
                                       rate_scale=args.rate_scale)
    scenario = replace(scenario, rate_scale=args.rate_scale if args.rate_scale is not None else rate_scale,
                       engine_speedup=args.engine_speedup if args.engine_speedup is not None else speedup)
    plot_failed = False
    try:
        validate(scenario)
        result = run_scenario(scenario, trace, engine=args.engine)
    except ScenarioError as exc:
        raise SettingsError(str(exc)) from None
    if args.plot is not None:
        from kvwatch.backtest.plot import plot_run

        try:
            plot_run(result, args.plot)
        except (OSError, ValueError) as exc:  # the scores still print below; the exit code says it failed
            sys.stderr.write(f"kvwatch backtest: cannot write the plot {args.plot}: {exc}\n")
            plot_failed = True
        else:
            sys.stderr.write(f"plot: {args.plot.resolve()}\n")
    report = result.to_json()
    report["scenario"]["trace_format"] = trace_format
    columns = dict(TRACE_COLUMNS[trace_format])
    if "hash_ids" in columns and not any(r.hash_ids for r in trace):
        del columns["hash_ids"]  # a Mooncake file without them: nothing of the column was read
    report["scenario"]["trace_columns"] = columns
    report["scenario"]["engine"] = args.engine  # whose /metrics wire the polls were read through
    report["scenario"]["trace_requests_read"] = len(trace)
    report["scenario"]["trace_rows_left_out"] = left_out
    report["scenario"]["trace_truncated"] = truncated
    report["scenario"]["trace_hours_read"] = round(span_of(trace) / 3600.0, 2)
    # (over its blocks outside gaps: the rate the trace's defaults are sized from, traces.content_defaults)
    report["scenario"]["trace_requests_per_second"] = round(len(trace) / active_seconds(trace), 3)
    block = block_seconds_for(trace)
    empty, blocks = empty_blocks(trace, block)
    report["scenario"]["trace_empty_blocks"] = {"empty": empty, "blocks": blocks}
    # The bootstrap draws whole blocks: the part of the trace after its last whole block is never drawn (the
    # packaged samples span just under 10 minutes, so one 5-minute block, half their requests).
    report["scenario"]["trace_requests_in_blocks"] = sum(r.arrival_time < blocks * block for r in trace)
    report["scenario"]["trace_block_seconds"] = block
    # Rows longer than --max-model-len (before --prompt-scale) whose prompt fits: capped at it (shape_lengths).
    report["scenario"]["trace_requests_capped"] = sum(
        r.prompt_tokens + r.output_tokens > args.max_model_len for r in trace)
    report["scenario"]["scale_defaults_from"] = _defaults_from(
        args.rate_scale is not None, args.engine_speedup is not None, named(args.trace),
        shaped=speedup != defaults_for(args.trace)[1])  # (a long shaping that needs no faster engine keeps its own)
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=_json_number)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(_text(report))
    return 1 if plot_failed else 0


SLOW_TRACE_SCALE = 100.0
"""A default rate scale above this (the tuned traces run at 2-8 x) is a trace in another time unit, maybe: said."""


def _defaults_from(rate_given: bool, speedup_given: bool, by_name: bool, *, shaped: bool = False) -> str:
    """Where the rate scale and the engine speedup came from: ``flags``, ``trace name``, ``trace content``, or
    one from a flag and the other from the trace ("rate from flags, engine from trace content"). ``shaped``: a named
    trace's engine sized from its content for long prompts (--prompt-scale, --long-fraction), not its tuned one."""
    # (a rate from the flags sizes the engine from the trace's content, even for a named trace: traces.defaults_for)
    default = "trace name" if by_name and not rate_given else "trace content"
    if rate_given and speedup_given:
        return "flags"
    if by_name and shaped and not rate_given and not speedup_given:
        return "rate from trace name, engine from trace content"
    if rate_given or speedup_given:
        return f"{'rate' if rate_given else 'engine'} from flags, {'engine' if rate_given else 'rate'} from {default}"
    return default


def _json_number(value: object) -> object:
    raise TypeError(f"not JSON serialisable: {value!r}")


def _text(report: dict) -> str:
    scen = report["scenario"]
    kv = report["methods"]["kvwatch"]
    lines = [
        f"{scen['trace']} {scen['profile']} {scen['load']} for {report['hours']:g} h "
        f"(seed {scen['seed']}, {scen['requests']} requests, capacity {scen['capacity_tokens']:.0f} tokens): "
        f"{report['events']} saturation event(s), {kv['warmup_events']} of them in a warm-up (not scored); "
        f"{kv['monitored_hours']:.1f} monitored hours",
        f"trace format {scen['trace_format']}; columns read: "
        + "; ".join(f"{name} = {meaning}" for name, meaning in scen["trace_columns"].items()),
        f"simulated at {scen['rate_scale']:g} x the trace's rate on an engine {scen['engine_speedup']:g} x the "
        f"default's speed (defaults from the {scen['scale_defaults_from']}; --rate-scale, --engine-speedup)",
        "polls read " + (f"through {scen['engine']}'s /metrics and kvwatch's adapter (--engine)" if scen["engine"]
                         else "straight from the simulator (--engine: through an engine's /metrics)"),
    ]
    if scen["prompt_scale"] != 1.0 or scen["long_fraction"] > 0.0:
        # (the JSON said --prompt-scale 4, the text nothing)
        low, high = LONG_PROMPT_RANGE
        lines.append("long context: "
                     + "; ".join(part for part in (
                         f"prompts x {scen['prompt_scale']:g} (--prompt-scale)" if scen["prompt_scale"] != 1.0 else "",
                         f"{100 * scen['long_fraction']:.3g} % of requests get a {low // 1024}k-{high // 1024}k-token "
                         "prompt (--long-fraction)" if scen["long_fraction"] > 0.0 else "") if part)
                     + f"; every request capped at --max-model-len {scen['max_model_len']:,}")
    lines.append(f"trace read: {scen['trace_requests_read']:,} requests over {scen['trace_hours_read']:g} h"
                 + "".join(f"; {count:,} rows left out ({why})" for why, count in scen["trace_rows_left_out"].items()))
    if scen["trace_requests_in_blocks"] < scen["trace_requests_read"]:
        lines.append(f"note: the bootstrap draws whole {scen['trace_block_seconds']:g}-s blocks, "
                     f"{scen['trace_empty_blocks']['blocks']} here: {scen['trace_requests_in_blocks']:,} of the "
                     f"{scen['trace_requests_read']:,} requests read; those after the last whole block are never "
                     "drawn")
    elif scen["trace_empty_blocks"]["blocks"] == 1:
        # (a 3-minute trace replayed its one block 40 times over an hour, and nothing said so)
        lines.append(f"note: the trace makes one block of {scen['trace_block_seconds']:,.0f} s, shorter than the "
                     f"bootstrap's {BLOCK_SECONDS:g}-s ones: every draw repeats it whole, so the arrivals repeat with "
                     "that period (a longer trace gives the bootstrap blocks to choose from)")
    scored = report["events"] - kv["warmup_events"]
    if not scored and kv["warmup_events"]:
        # (a cache saturated from its first minutes was told to raise the load)
        lines.append(f"note: no saturation event after the {WARMUP_SECONDS / 60:.0f}-minute warm-up, so nothing is "
                     "scored (the tables show dashes): saturation began during the warm-up and no new event followed "
                     "(one needs 10 minutes unsaturated first), so the load saturates from the start: lower "
                     "--peak-load or --rate-scale, or use --profile ramp")
    elif not scored:
        # (runs of under an hour printed tables of dashes and no word why)
        lines.append(f"note: no saturation event after the {WARMUP_SECONDS / 60:.0f}-minute warm-up, so nothing is "
                     "scored (the tables show dashes): a run needs about 2 hours to show an early warning, and a "
                     "load that saturates (--peak-load, --rate-scale)")
    read_rate = scen["trace_requests_per_second"]
    if scen["trace_format"] == "mooncake" and read_rate > DENSE_REQUESTS_PER_SECOND:
        # (a day in seconds read as 86 s, and nothing said so)
        lines.append(f"note: the trace reads as {read_rate:,.0f} requests a second over "
                     f"{scen['trace_hours_read']:g} h: if it is not that dense, its times are in seconds "
                     f"({MOONCAKE_UNIT_HINT})")
    if scen["rate_scale"] >= MAX_SCALE:
        lines.append(f"note: the trace's rate is so low that it is simulated at the bound, {MAX_SCALE:g} x, over "
                     f"{scen['trace_hours_read']:g} h read: if that span is not the trace's, its times are in another "
                     "unit than the format's (milliseconds read as seconds make a trace 1000 x longer)")
    elif scen["rate_scale"] > SLOW_TRACE_SCALE and "rate from flags" not in scen["scale_defaults_from"] and \
            scen["scale_defaults_from"] != "flags":
        # (a BurstGPT file in milliseconds ran at 418 x without a word: the tuned traces run at 2-8 x)
        lines.append(f"note: the trace's rate is simulated at {scen['rate_scale']:g} x to fill the cache, over "
                     f"{scen['trace_hours_read']:g} h read: if that span is not the trace's, its times are in another "
                     "unit than the format's (milliseconds read as seconds make a trace 1000 x longer)")
    if scen["trace_truncated"]:
        lines.append(f"note: read the trace's first {scen['trace_requests_read']:,} requests, its first "
                     f"{scen['trace_hours_read']:g} h (a longer trace is not held whole); the bootstrap draws its "
                     "5-minute blocks from them")
    if scen["trace_requests_capped"]:
        lines.append(f"note: {scen['trace_requests_capped']:,} of the {scen['trace_requests_read']:,} requests read "
                     f"are longer than --max-model-len {scen['max_model_len']:,} as the trace has them, and are capped "
                     "at it: the output kept, the prompt shortened to fit (vLLM would stop the output at the limit)")
    gaps = scen["trace_empty_blocks"]
    if gaps["empty"]:
        lines.append(f"note: {gaps['empty']:,} of the trace's {gaps['blocks']:,} 5-minute blocks are gaps in its "
                     "collection (runs of 30 minutes or more with no request where its rate expects 7 or more): its "
                     f"rate and the bootstrap use the other {gaps['blocks'] - gaps['empty']:,}")
    if scen["capacity_tokens"] > 1.05 * max(1, scen["mean_demand_tokens"]):
        lines.append(f"note: the capacity is the longest request's, above the mean demand of "
                     f"{scen['mean_demand_tokens']:,} tokens: load 1.0 fills less than the whole cache (raise "
                     "--rate-scale, or lower --max-model-len)")
    lines.append(f"{'method':24s} {'recall@0':>8s} {'@5m':>6s} {'@15m':>6s} {'@30m':>6s} {'on 5m before':>12s} "
                 f"{'median lead':>12s} {'precision':>9s} {'false alarms':>12s} {'per day':>8s}")
    for name, m in report["methods"].items():
        r = m["recall"]
        lead = m["median_lead_seconds"]
        lines.append(
            f"{name:24s} {_f(r['0']):>8s} {_f(r['300']):>6s} {_f(r['900']):>6s} {_f(r['1800']):>6s} "
            f"{_f(m['active_5m_before']):>12s} {('-' if lead is None else f'{lead / 60:.1f} min'):>12s} "
            f"{_f(m['precision']):>9s} {m['false_alarms']:>12d} {_f(m['false_alarms_per_day']):>8s}"
        )
    lines += ["(recall@L counts an onset led by at least L: by a warning that began at most 60 minutes before it, "
              "outside a saturation, and was still on at the onset; 'on 5m before' any warning on through the 5 "
              "minutes before it, however early it began; false alarms per day need 24 monitored hours)", ""]
    lines.append(f"{'calibration':24s} {'Brier kvwatch':>13s} {'predict_linear':>14s} {'climatology':>11s} {'n':>5s}")
    for horizon, block in report["calibration"].items():
        lines.append(f"{'risk within ' + horizon:24s} {_f(block['kvwatch']['brier']):>13s} "
                     f"{_f(block['predict_linear']['brier']):>14s} {_f(block['climatology']['brier']):>11s} "
                     f"{block['kvwatch']['n']:>5d}")
    return "\n".join(lines) + "\n"


def _f(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"
