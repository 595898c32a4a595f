"""Real request traces as simulator input: readers, rate scaling, time compression, block bootstrap.

Readers take a path or the text itself and return requests sorted by arrival, times relative to the
first request. Every transformation is pure and deterministic for a given ``seed``.

* Azure LLM inference trace 2023 (CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``; CRLF line ends, no
  trailing newline, 7 fractional digits).
* Mooncake FAST'25 traces (JSON lines ``timestamp`` in ms, ``input_length``, ``output_length``,
  ``hash_ids`` of 512-token prefix blocks). Its timestamps are quantized to ~3 s, so requests sharing
  one timestamp are spread uniformly over the following ``jitter_seconds`` (otherwise the replay makes
  artificial 3-second bursts).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from kvwatch.sim.engine import Request

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
Multiplier = float | Callable[[float], float]


class TraceError(ValueError):
    """A trace file is malformed; the message names the file and line."""


def _text(source: str | Path) -> tuple[str, str]:
    """(text, name) from a path or from the text itself (anything containing a newline)."""
    if isinstance(source, Path) or "\n" not in source:
        path = Path(source)
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except OSError as exc:
            raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise TraceError(f"trace {path} is not UTF-8 text") from None
    return source, "<text>"


def _parse_azure_time(value: str) -> float:
    # Python's fromisoformat takes at most 6 fractional digits; the trace has 7.
    date, _, frac = value.strip().partition(".")
    seconds = datetime.fromisoformat(date).timestamp()
    return seconds + (float("0." + frac) if frac else 0.0)


def read_azure_csv(source: str | Path) -> list[Request]:
    """Requests of an Azure LLM inference trace (CSV); 0 generated tokens count as 1 (vLLM emits one)."""
    text, name = _text(source)
    lines = text.splitlines()  # handles CRLF and a missing final newline
    if not lines or tuple(c.strip() for c in lines[0].lstrip("\ufeff").split(",")) != AZURE_HEADER:
        raise TraceError(f"{name}: line 1 must be the header {','.join(AZURE_HEADER)}")
    rows: list[tuple[float, int, int]] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        parts = line.split(",")
        try:
            if len(parts) != 3:
                raise ValueError("expected 3 columns")
            t, prompt, output = _parse_azure_time(parts[0]), int(parts[1]), int(parts[2])
            if prompt < 1 or output < 0:
                raise ValueError("token counts must be positive")
        except ValueError as exc:
            raise TraceError(f"{name}: line {number}: {exc}: {line[:80]!r}") from None
        rows.append((t, prompt, output))
    if not rows:
        raise TraceError(f"{name}: no requests")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [Request(t - t0, p, max(1, o)) for t, p, o in rows]


def read_mooncake_jsonl(source: str | Path, *, jitter_seconds: float = 3.0, seed: int = 0) -> list[Request]:
    """Requests of a Mooncake trace; ``jitter_seconds=0`` keeps the quantized timestamps."""
    text, name = _text(source)
    rng = random.Random(seed)
    raw: list[tuple[float, int, int, tuple[int, ...]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            t = float(row["timestamp"]) / 1000.0
            prompt, output = int(row["input_length"]), int(row["output_length"])
            hashes = tuple(int(h) for h in row.get("hash_ids", ()))
            if prompt < 1 or output < 0 or t < 0:
                raise ValueError("lengths must be positive and timestamp >= 0")
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"{name}: line {number}: {type(exc).__name__}: {exc}") from None
        raw.append((t, prompt, output, hashes))
    if not raw:
        raise TraceError(f"{name}: no requests")
    raw.sort(key=lambda r: r[0])
    t0 = raw[0][0]
    out = []
    for t, prompt, output, hashes in raw:
        shift = rng.uniform(0.0, jitter_seconds) if jitter_seconds > 0 else 0.0
        out.append(Request(t - t0 + shift, prompt, max(1, output), hashes))
    out.sort(key=lambda r: r.arrival_time)
    return out


def span_of(requests: Sequence[Request]) -> float:
    """Length of the trace's time window (a little past its last arrival, so blocks tile cleanly)."""
    if not requests:
        return 0.0
    return max(r.arrival_time for r in requests) + 1e-6


def compress_time(requests: Sequence[Request], factor: float) -> list[Request]:
    """Arrivals ``factor`` times closer together (rate × factor); request sizes unchanged."""
    if factor <= 0:
        raise ValueError("compress_time factor must be > 0")
    return [replace(r, arrival_time=r.arrival_time / factor) for r in requests]


def shift(requests: Sequence[Request], offset: float) -> list[Request]:
    return [replace(r, arrival_time=r.arrival_time + offset) for r in requests]


def scale_rate(requests: Sequence[Request], factor: Multiplier, *, seed: int = 0,
               span: float | None = None) -> list[Request]:
    """Multiply the arrival rate by ``factor`` (a number or a function of time) keeping the request mix.

    Below 1, each request is kept with probability ``factor`` (thinning). Above 1, independent copies of
    the trace, each circularly shifted by a random offset within ``span``, are superposed and thinned so
    the total matches: copy ``j`` keeps a request at time t with probability ``clip(m(t) - j, 0, 1)``.
    """
    if not requests:
        return []
    m = factor if callable(factor) else (lambda _t, f=float(factor): f)
    window = span if span is not None else span_of(requests)
    if window <= 0:
        raise ValueError("scale_rate needs a positive span")
    peak = max(m(r.arrival_time) for r in requests)
    if peak < 0 or not math.isfinite(peak):
        raise ValueError("scale_rate factor must be finite and >= 0")
    rng = random.Random(seed)
    out: list[Request] = []
    for copy in range(max(1, math.ceil(peak))):
        offset = 0.0 if copy == 0 else rng.uniform(0.0, window)
        for r in requests:
            t = (r.arrival_time + offset) % window if copy else r.arrival_time
            keep = min(1.0, max(0.0, m(t) - copy))
            if keep >= 1.0 or (keep > 0.0 and rng.random() < keep):
                out.append(replace(r, arrival_time=t) if copy else r)
    out.sort(key=lambda r: r.arrival_time)
    return out


def block_bootstrap(requests: Sequence[Request], duration: float, *, block_seconds: float = 300.0, seed: int = 0,
                    span: float | None = None) -> list[Request]:
    """A ``duration``-long trace of random ``block_seconds`` blocks of the input (times inside blocks kept)."""
    if duration <= 0 or block_seconds <= 0:
        raise ValueError("block_bootstrap needs duration > 0 and block_seconds > 0")
    window = span if span is not None else span_of(requests)
    n_blocks = int(window // block_seconds)
    if n_blocks < 1:
        raise ValueError(f"the trace spans {window:.0f} s, shorter than one {block_seconds:.0f} s block")
    blocks: list[list[Request]] = [[] for _ in range(n_blocks)]
    for r in requests:
        index = int(r.arrival_time // block_seconds)
        if index < n_blocks:
            blocks[index].append(r)
    rng = random.Random(seed)
    out: list[Request] = []
    start = 0.0
    while start < duration:
        chosen = blocks[rng.randrange(n_blocks)]
        base = (chosen[0].arrival_time // block_seconds) * block_seconds if chosen else 0.0
        for r in chosen:
            t = start + r.arrival_time - base
            if t < duration:
                out.append(replace(r, arrival_time=t))
        start += block_seconds
    return out


# The columns each format's reader uses (everything else in a row is ignored).
TRACE_COLUMNS: dict[str, dict[str, str]] = {
    "azure": {"TIMESTAMP": "arrival time (ISO 8601, 7 fractional digits)",
              "ContextTokens": "prompt tokens", "GeneratedTokens": "output tokens (0 counts as 1)"},
    "mooncake": {"timestamp": "arrival time in milliseconds", "input_length": "prompt tokens",
                 "output_length": "output tokens", "hash_ids": "512-token prefix block hashes (prefix caching)"},
}


def detect_format(path: str | Path) -> str:
    """``"azure"`` or ``"mooncake"`` from the file's first non-empty line, whatever its name."""
    try:
        with Path(path).open(encoding="utf-8") as handle:
            first = next((line for line in handle if line.strip()), "")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"trace {path} is not UTF-8 text") from None
    if first.lstrip().startswith("{"):
        return "mooncake"
    if tuple(c.strip() for c in first.lstrip("\ufeff").split(",")) == AZURE_HEADER:
        return "azure"
    raise TraceError(f"{path}: not an Azure 2023 CSV (header {','.join(AZURE_HEADER)}) nor a Mooncake JSONL trace "
                     "(one JSON object per line with timestamp, input_length, output_length)")


def load_trace(path: str | Path, *, seed: int = 0) -> list[Request]:
    """Read a trace of either format, detected from its content (not its file name)."""
    if detect_format(path) == "azure":
        return read_azure_csv(Path(path))
    return read_mooncake_jsonl(Path(path), seed=seed)


def packaged_trace(name: str) -> Path:
    """Path of a small trace sample shipped with kvwatch (see kvwatch/data/traces/README.md)."""
    path = Path(__file__).resolve().parent.parent / "data" / "traces" / name
    if not path.is_file():
        raise TraceError(f"no packaged trace sample named {name}")
    return path
