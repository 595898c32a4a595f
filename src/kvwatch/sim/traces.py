"""Real request traces as simulator input: readers, rate scaling, time compression, block bootstrap.

Readers take a path or the text itself and return requests sorted by arrival, times relative to the
first request. Every transformation is pure and deterministic for a given ``seed``.

* Azure LLM inference traces (CSV with the columns ``TIMESTAMP,ContextTokens,GeneratedTokens``: the 2023
  files, CRLF line ends, no trailing newline, 7 fractional digits; the same columns in any order and case beside
  others, e.g. the 2024 week-long files or the multimodal trace's ``NumImages``, and ISO 8601 times with a
  time zone).
* BurstGPT (CSV ``Timestamp`` in seconds, ``Request tokens``, ``Response tokens`` and others): rows with 0
  response tokens are requests that failed (the dataset's own definition) and are left out.
* Mooncake FAST'25 traces (JSON lines ``timestamp`` in ms, ``input_length``, ``output_length``,
  ``hash_ids`` of 512-token prefix blocks). Its timestamps are quantized to ~3 s, so requests sharing
  one timestamp are spread uniformly over the following ``jitter_seconds`` (otherwise the replay makes
  artificial 3-second bursts). A CSV trace whose times are quantized (cut to the second or the minute) is
  spread over its own step the same way (:func:`spread_quantized`).

Any of them may be gzip-compressed (detected from the content, like the format).
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import random
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any

from kvwatch.sim.engine import Request

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_HEADER = ("Timestamp", "Request tokens", "Response tokens")
Multiplier = float | Callable[[float], float]


class TraceError(ValueError):
    """A trace file is malformed; the message names the file and line."""


def _lines(source: str | Path) -> tuple[Iterator[str], str]:
    """(the lines, without their line ends, name) of a path or of the text itself (anything containing a
    newline). A file is read as a stream, never whole (a week-long trace is gigabytes), inflated on the way when
    it is gzip-compressed (told by its first bytes, not its name); a byte-order mark is not part of line 1."""
    if not isinstance(source, Path) and "\n" in source:
        return iter(source.lstrip("\ufeff").splitlines()), "<text>"
    path = Path(source)
    try:
        with path.open("rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    return _stream(path, gzipped), str(path)


def _stream(path: Path, gzipped: bool) -> Iterator[str]:
    # A byte that is not UTF-8 (a Windows-1252 model name) reads as U+FFFD: harmless in a column that is not read,
    # and a number error naming its line and column in one that is.
    try:
        with (gzip.open(path, "rt", encoding="utf-8-sig", errors="replace") if gzipped
              else path.open(encoding="utf-8-sig", errors="replace")) as handle:  # universal newlines
            for line in handle:
                yield line.rstrip("\n")
    except (OSError, EOFError, zlib.error) as exc:  # gzip's BadGzipFile is an OSError; damaged data a zlib.error
        raise TraceError(f"trace {path} is a broken gzip file: {exc}" if gzipped else
                         f"cannot read trace {path}: {exc}") from None


_ISO_TIME = re.compile(r"\s*(\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d)?)(\.\d+)?\s*(Z|[+-]\d\d(?::?\d\d)?)?\s*")


def _parse_azure_time(value: str) -> float:
    """Seconds of an ISO 8601 time (any number of fractional digits: Python's fromisoformat takes at most 6,
    the 2023 trace has 7), in its time zone when it names one, else UTC (never the machine's zone: a
    daylight-saving change would stretch or shrink the trace)."""
    match = _ISO_TIME.fullmatch(value)
    if match is None:
        raise ValueError(f"not an ISO 8601 time: {value.strip()!r}")
    stamp, frac, zone = match.groups()
    if zone is not None and len(zone) == 3:  # hours only, as PostgreSQL writes it ("+00")
        zone += ":00"
    seconds = datetime.fromisoformat(stamp + ("+00:00" if zone in ("Z", None) else zone)).timestamp()
    return seconds + (float(frac) if frac else 0.0)


def _csv_columns(header: str, wanted: tuple[str, ...]) -> list[int] | None:
    """Where each of ``wanted`` is among a CSV header's columns (any order, any case, others ignored); None if one is
    missing."""
    names = [c.strip().lower() for c in next(csv.reader([header.lstrip("\ufeff")]), [])]
    keys = [w.lower() for w in wanted]
    twice = [w for w, k in zip(wanted, keys, strict=True) if names.count(k) > 1]
    if twice:  # else the first of two would be read without a word
        raise ValueError(f"the header names {', '.join(twice)} twice: which one is meant?")
    return [names.index(k) for k in keys] if all(k in names for k in keys) else None


MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


def _number(value: object) -> float:
    """A finite number from a trace field (JSON's true/false are not numbers here, nor NaN or ±Infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"not a number: {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {value!r}")
    return number


def _tokens(value: object) -> int:
    """A token count: a finite whole number (1e400 or NaN is an error, not an OverflowError; 12.7 is one too: it
    was cut to 12 without a word, and 0.5 left out as "0")."""
    number = _number(value)
    if not number.is_integer():
        raise ValueError(f"not a whole number of tokens: {value!r}")
    return int(number)


def _column(name: str, parse: Callable[[Any], Any], value: object) -> Any:
    """``parse(value)``; its error names the column."""
    try:
        return parse(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"{name}: {exc}") from None


def _hash_ids(value: object) -> tuple[int, ...]:
    """Prefix block ids as integers: numbers as they are, any other id (a hex string) by a stable checksum; they
    only need to compare equal where the blocks are equal."""
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(h if isinstance(h, int) and not isinstance(h, bool) else zlib.crc32(str(h).encode()) for h in value)


def read_azure_csv(source: str | Path, *, max_requests: int | None = None,
                   left_out: dict[str, int] | None = None) -> list[Request]:
    """Requests of an Azure LLM inference trace (CSV); 0 generated tokens count as 1 (vLLM emits one)."""
    rows = _read_csv(source, AZURE_HEADER, _parse_azure_time, max_rows=max_requests, left_out=left_out)
    return [Request(t, p, max(1, o)) for t, p, o in rows]


def read_burstgpt_csv(source: str | Path, *, max_requests: int | None = None,
                      left_out: dict[str, int] | None = None) -> list[Request]:
    """Requests of a BurstGPT trace (CSV); the failed ones (0 response tokens) are left out."""
    rows = _read_csv(source, BURSTGPT_HEADER, float, keep=lambda _t, _p, output: output > 0, max_rows=max_requests,
                     left_out=left_out)
    return [Request(t, p, o) for t, p, o in rows]


MAX_SPAN_SECONDS = 400 * 86400.0  # longer than any published trace (BurstGPT: 121 days): a stray timestamp


def _all_left_out(left_out: dict[str, int]) -> str:
    """What the rows of a trace without a request were, when the reader left them all out (a
    trace of failed requests read as "no requests", its rows unmentioned)."""
    if not left_out:
        return ""
    return ": every row was left out (" + "; ".join(f"{count:,} with {why}" for why, count in left_out.items()) + ")"


def _checked_span(times: Sequence[float], name: str) -> None:
    """Refuse a trace whose times lie further apart than any real trace's (:data:`MAX_SPAN_SECONDS`): one date
    typed 9999-, or milliseconds among seconds, made the gap bookkeeping allocate gigabytes, or overflow."""
    first, last = min(times), max(times)
    if last - first > MAX_SPAN_SECONDS:
        ordered = sorted(times)
        gap, cut = max((b - a, i) for i, (a, b) in enumerate(pairwise(ordered), start=1))
        # The fewer arrivals on one side of the widest gap are the odd ones: named by their time, which the file
        # holds as written (the side "before the arrival N days after the first" named the normal data when the
        # stray row was the earliest)
        few = ordered[:cut] if cut <= len(ordered) - cut else ordered[cut:]

        def days(seconds: float) -> str:
            return f"{seconds / 86400:,.0f}" if seconds < 1e12 else f"{seconds / 86400:.3g}"

        raise TraceError(f"{name}: the requests span {days(last - first)} days, the widest gap {days(gap)} days, "
                         f"with {len(few):,} arrival{'s' if len(few) > 1 else ''} on its far side, from "
                         f"{_when(few[0])}: a timestamp far from the rest (a typo in a date, a null date written as "
                         f"1970, milliseconds among seconds?); a trace may span at most "
                         f"{MAX_SPAN_SECONDS / 86400:.0f} days")


def _when(t: float) -> str:
    """An arrival time as a reader finds it in the file: a UTC date where it is one, else the number."""
    try:
        return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") + f" ({t:g} s)"
    except (OverflowError, OSError, ValueError):
        return f"{t:g} s"


def _read_csv(source: str | Path, columns: tuple[str, str, str], time: Callable[[str], float],
              keep: Callable[[float, int, int], bool] | None = None,
              max_rows: int | None = None, left_out: dict[str, int] | None = None) -> list[tuple[float, int, int]]:
    """(arrival relative to the first, prompt tokens, output tokens) of the rows of a CSV trace, by arrival: the
    first ``max_rows`` kept rows in file order when given; ``left_out`` counts the rows left out, by reason."""
    left_out = left_out if left_out is not None else {}
    lines, name = _lines(source)
    header, header_line = None, 0
    for line in lines:  # blank lines before it are no header
        header_line += 1
        if line.strip():
            header = line
            break
    try:
        where = _csv_columns(header, columns) if header is not None else None
    except ValueError as exc:
        raise TraceError(f"{name}: line {header_line}: {exc}") from None
    if where is None:
        raise TraceError(f"{name}: line {max(1, header_line)} must be a header with the columns {','.join(columns)}")
    fields = len(next(csv.reader([header]), []))
    rows: list[tuple[float, int, int]] = []
    unordered: int | None = None  # the first line whose arrival is earlier than the row before it
    numbered = enumerate(lines, start=header_line + 1)  # error messages name the file's own line
    for number, line in numbered:
        if not line.strip():
            continue
        if '"' in line:
            # a quoted field may hold line ends (a CSV writer's prompt text): it runs on to the quote that closes
            # it (refused as "expected at least 3 columns" on the next line)
            joined = 0
            while _ends_in_quoted_field(line):
                more = next(numbered, None)
                joined += 1
                if more is None or joined > MAX_QUOTED_LINES:  # (a stray quote must not read the file into one row)
                    raise TraceError(f"{name}: line {number}: a quoted field opened here is not closed"
                                     + ("" if more is None else f" within {MAX_QUOTED_LINES:,} lines"))
                line += "\n" + more[1]
            try:
                parts = next(csv.reader([line]), [])
            except csv.Error as exc:
                raise TraceError(f"{name}: line {number}: {exc}: {line[:80]!r}") from None
        else:
            parts = line.split(",")  # the 2023 files: no quotes
        try:
            if len(parts) > fields:  # read by position, its columns would be the wrong ones
                raise ValueError(f"{len(parts)} fields where the header has {fields} (an unquoted comma?)")
            if len(parts) <= max(where):
                raise ValueError(f"expected at least {max(where) + 1} columns")
            t, prompt, output = (_column(columns[i], parse, parts[where[i]])
                                 for i, parse in enumerate((time, _tokens, _tokens)))
            if not math.isfinite(t):
                raise ValueError("the arrival time must be a finite number")
            if prompt < 0 or output < 0:  # checked before `keep`: a broken row is an error, not a failed request
                raise ValueError("token counts cannot be negative")
            if keep is not None and not keep(t, prompt, output):
                left_out[f"{columns[2]} 0 (failed)"] = left_out.get(f"{columns[2]} 0 (failed)", 0) + 1
                continue
            if prompt < 1:  # an empty prompt: vLLM refuses the request, so it holds no KV
                left_out[f"{columns[1]} 0"] = left_out.get(f"{columns[1]} 0", 0) + 1
                continue
        except ValueError as exc:
            raise TraceError(f"{name}: line {number}: {exc}: {line[:80]!r}") from None
        if rows and t < rows[-1][0] and unordered is None:
            unordered = number
        rows.append((t, prompt, output))
        if max_rows is not None and len(rows) >= max_rows:
            if unordered is not None and any(rest.strip() for _, rest in numbered):
                raise TraceError(_unordered_head(name, unordered))
            break
    if not rows:
        raise TraceError(f"{name}: no requests{_all_left_out(left_out)}")
    _checked_span([t for t, _, _ in rows], name)
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return spread_quantized([(t - t0, p, o) for t, p, o in rows])


def _unordered_head(name: str, line: int) -> str:
    """A file longer than the rows read whose rows are not in time order: its first rows are not its first hours
    (3 million shuffled rows read 1 million over the whole week: a rate 3x too low, said to be "the first 175 h")."""
    return (f"{name}: line {line}: an arrival earlier than the row before it, in a file longer than kvwatch reads: "
            "its first rows are not its first hours; sort the file by time")


MAX_QUOTED_LINES = 1000  # the lines one quoted CSV field may run over (a prompt's text)


def _ends_in_quoted_field(line: str) -> bool:
    """Whether a CSV line ends inside a quoted field, so the row goes on: a quote opens one only at a field's start
    (csv's rule; a stray one inside a field, ``a 5" screen``, is text), ``""`` inside it is a
    quote, and a lone one closes it."""
    quoted, at_start = False, True
    i = 0
    while i < len(line):
        char = line[i]
        if quoted:
            if char == '"':
                if line[i + 1:i + 2] == '"':
                    i += 1
                else:
                    quoted = False
        elif char == '"' and at_start:
            quoted = True
        at_start = not quoted and char == ","
        i += 1
    return quoted


QUANTIZED_SHARE = 2.0  # rows per distinct timestamp at which a CSV trace's times read as quantized


def _quantum(times: Sequence[float]) -> float | None:
    """The shortest step between two distinct times when they are quantized (``QUANTIZED_SHARE`` or more rows per
    distinct time), else None."""
    distinct = sorted(set(times))
    if len(distinct) < 2 or len(times) < QUANTIZED_SHARE * len(distinct):
        return None
    return min(b - a for a, b in pairwise(distinct))


def spread_quantized(rows: list[tuple[float, int, int]], seed: int = 0) -> list[tuple[float, int, int]]:
    """Rows whose times are quantized (on average ``QUANTIZED_SHARE`` or more rows share one: a trace cut to the
    second or the minute) spread uniformly over the quantum, the shortest step between two distinct times; the
    replay made bursts of them (a minute's requests at one instant), as Mooncake's 3-s steps did. Times fine enough
    to be distinct are kept as they are."""
    quantum = _quantum([t for t, _, _ in rows])
    if quantum is None:
        return rows
    rng = random.Random(seed)
    spread = [(t + rng.uniform(0.0, quantum), p, o) for t, p, o in rows]
    spread.sort(key=lambda r: r[0])
    return spread


MOONCAKE_UNIT_HINT = "a Mooncake JSONL timestamp is in milliseconds: seconds there read 1000x shorter"
MOONCAKE_JITTER_SECONDS = 3.0  # the spread of a Mooncake trace's quantized timestamps (read_mooncake_jsonl)
DENSE_REQUESTS_PER_SECOND = 100.0
"""A rate read from a trace above which its time unit is worth a word: the public traces run at 3-45 requests a
second (Mooncake's about 3-6, Azure 2024's conversation 45)."""


def read_mooncake_jsonl(source: str | Path, *, jitter_seconds: float = MOONCAKE_JITTER_SECONDS, seed: int = 0,
                        max_requests: int | None = None, left_out: dict[str, int] | None = None) -> list[Request]:
    """Requests of a Mooncake trace (the first ``max_requests`` lines' when given); ``jitter_seconds=0`` keeps
    the quantized timestamps. Times quantized more coarsely than ``jitter_seconds`` (cut to the minute) are spread
    over their own step, as a CSV trace's (:func:`spread_quantized`): 3 s of a minute's requests made a sawtooth.
    ``left_out`` counts the lines left out, by reason."""
    left_out = left_out if left_out is not None else {}
    lines, name = _lines(source)
    rng = random.Random(seed)
    raw: list[tuple[float, int, int, tuple[int, ...]]] = []
    unordered: int | None = None  # the first line whose arrival is earlier than the line before it
    numbered = enumerate(lines, start=1)
    for number, line in numbered:
        if max_requests is not None and len(raw) >= max_requests:
            if unordered is not None and (line.strip() or any(rest.strip() for _, rest in numbered)):
                raise TraceError(_unordered_head(name, unordered))
            break
        if not line.strip():
            continue
        try:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON object ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise TypeError("not a JSON object")
            missing = [f for f in MOONCAKE_FIELDS if f not in row]
            if missing:
                raise KeyError(f"no {', '.join(missing)} (a Mooncake line has {', '.join(MOONCAKE_FIELDS)})")
            t = _column("timestamp", _number, row["timestamp"]) / 1000.0
            prompt, output = (_column(f, _tokens, row[f]) for f in ("input_length", "output_length"))
            hashes = _hash_ids(row.get("hash_ids", ()))
            if prompt < 0 or output < 0 or not 0 <= t < math.inf:
                raise ValueError("lengths cannot be negative and the timestamp must be a finite number >= 0")
            if prompt < 1:  # an empty prompt: vLLM refuses the request, so it holds no KV
                left_out["input_length 0"] = left_out.get("input_length 0", 0) + 1
                continue
        except KeyError as exc:
            raise TraceError(f"{name}: line {number}: {exc.args[0]}") from None
        except (ValueError, TypeError, OverflowError) as exc:
            raise TraceError(f"{name}: line {number}: {exc}") from None
        if raw and t < raw[-1][0] and unordered is None:
            unordered = number
        raw.append((t, prompt, output, hashes))
    if not raw:
        raise TraceError(f"{name}: no requests{_all_left_out(left_out)}")
    _checked_span([t for t, _, _, _ in raw], name)
    raw.sort(key=lambda r: r[0])
    t0 = raw[0][0]
    quantum = _quantum([t for t, _, _, _ in raw])
    if quantum is None:  # times fine enough to be distinct are kept as they are (jitter would move them)
        jitter_seconds = 0.0
    elif jitter_seconds > 0 and quantum > 1.5 * jitter_seconds:
        jitter_seconds = quantum
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


GAP_MIN_SECONDS = 1800.0  # a run of empty blocks shorter than this is quiet traffic, not a gap in the collection
GAP_MIN_EXPECTED = 7.0  # ... and so is one in which the trace's rate expects fewer arrivals (P(none) > e^-7)


def _gap_flags(requests: Sequence[Request], block_seconds: float) -> list[bool]:
    """Per whole ``block_seconds`` block of the trace: is it in a gap of its collection? A gap is a run of blocks
    with no request lasting at least GAP_MIN_SECONDS in which the trace's rate (over its other blocks) expects at
    least GAP_MIN_EXPECTED arrivals: two hours a day apart is 92 % gap, while a trace of one request every few
    minutes keeps its quiet blocks (they are its traffic)."""
    n_blocks = int(span_of(requests) // block_seconds)
    held = [False] * n_blocks
    for r in requests:
        index = int(r.arrival_time // block_seconds)
        if index < n_blocks:
            held[index] = True
    busy = sum(held)
    rate = len(requests) / (busy * block_seconds) if busy else 0.0
    gaps = [False] * n_blocks
    start = None
    for i, has in enumerate([*held, True]):  # a sentinel closes a run at the end
        if not has and start is None:
            start = i
        elif has and start is not None:
            seconds = (i - start) * block_seconds
            if seconds >= GAP_MIN_SECONDS and rate * seconds >= GAP_MIN_EXPECTED:
                gaps[start:i] = [True] * (i - start)
            start = None
    return gaps


def empty_blocks(requests: Sequence[Request], block_seconds: float = 300.0) -> tuple[int, int]:
    """(blocks in gaps of the trace's collection, all blocks) of its whole ``block_seconds`` blocks
    (:func:`_gap_flags`): neither its rate nor the bootstrap counts them."""
    gaps = _gap_flags(requests, block_seconds)
    return sum(gaps), len(gaps)


def active_seconds(requests: Sequence[Request], block_seconds: float = 300.0) -> float:
    """The trace's span without its gaps (:func:`empty_blocks`): the whole span of a trace with none."""
    empty, _ = empty_blocks(requests, block_seconds)
    return span_of(requests) - empty * block_seconds


def block_bootstrap(requests: Sequence[Request], duration: float, *, block_seconds: float = 300.0, seed: int = 0,
                    span: float | None = None) -> list[Request]:
    """A ``duration``-long trace of random ``block_seconds`` blocks of the input (times inside blocks kept), drawn
    from the blocks outside the gaps of the trace's collection (:func:`empty_blocks`)."""
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
    gaps = _gap_flags(requests, block_seconds) if span is None else [False] * n_blocks
    blocks = [b for b, gap in zip(blocks, gaps, strict=False) if not gap] or blocks
    rng = random.Random(seed)
    out: list[Request] = []
    start = 0.0
    while start < duration:
        chosen = blocks[rng.randrange(len(blocks))]
        base = (chosen[0].arrival_time // block_seconds) * block_seconds if chosen else 0.0
        for r in chosen:
            t = start + r.arrival_time - base
            if t < duration:
                out.append(replace(r, arrival_time=t))
        start += block_seconds
    return out


# The columns each format's reader uses (everything else in a row is ignored); token counts are whole numbers.
_SPREAD = (f"; where {QUANTIZED_SHARE:g} or more rows share a time on average (a trace cut to the second or minute), "
           "each is moved by a random part of the step between times")
TRACE_COLUMNS: dict[str, dict[str, str]] = {
    "azure": {"TIMESTAMP": f"arrival time (ISO 8601){_SPREAD}",
              "ContextTokens": "prompt tokens (0: an empty prompt vLLM refuses, left out)",
              "GeneratedTokens": "output tokens (0 counts as 1)"},
    "burstgpt": {"Timestamp": f"arrival time in seconds{_SPREAD}",
                 "Request tokens": "prompt tokens (0: an empty prompt vLLM refuses, left out)",
                 "Response tokens": "output tokens (0: a failed request, left out)"},
    "mooncake": {"timestamp": f"arrival time in milliseconds{_SPREAD} (at least {MOONCAKE_JITTER_SECONDS:g} s)",
                 "input_length": "prompt tokens (0: an empty prompt vLLM refuses, left out)",
                 "output_length": "output tokens (0 counts as 1)",
                 "hash_ids": "512-token prefix block hashes (kvwatch simulate's prefix caching; the backtest "
                             "simulates none)"},
}
_READERS: dict[str, Callable[..., list[Request]]] = {"azure": read_azure_csv, "burstgpt": read_burstgpt_csv}


# Compressions kvwatch does not inflate, by their magic bytes (gzip it does).
_OTHER_COMPRESSION = {"xz": b"\xfd7zXZ\x00", "bzip2": b"BZh", "zip": b"PK\x03\x04", "zstd": b"\x28\xb5\x2f\xfd"}


def detect_format(path: str | Path) -> str:
    """``"azure"``, ``"burstgpt"`` or ``"mooncake"`` from the file's first non-empty line, whatever its name."""
    try:
        with Path(path).open("rb") as raw:
            magic = raw.read(6)
            gzipped = magic[:2] == b"\x1f\x8b"
    except IsADirectoryError:
        raise TraceError(f"trace {path} is a directory, not a file") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    try:
        with (gzip.open(path, "rb") if gzipped else Path(path).open("rb")) as handle:
            head = handle.read(2)
            if head in (b"\xff\xfe", b"\xfe\xff"):
                raise TraceError(f"trace {path} is UTF-16 text: save it as UTF-8")
            start = head + handle.read(1 << 16)  # the first line is a header, or a JSON object told by its "{"
            first = next((line for line in start.splitlines() if line.strip()), b"")
    except (OSError, EOFError, zlib.error) as exc:  # (gzip's BadGzipFile is an OSError)
        if gzipped:
            raise TraceError(f"trace {path} is a broken gzip file: {exc}") from None
        raise TraceError(f"cannot read trace {path}: {getattr(exc, 'strerror', None) or exc}") from None
    for packing, prefix in _OTHER_COMPRESSION.items():
        if magic.startswith(prefix):
            raise TraceError(f"trace {path} is {packing}-compressed: decompress it to a file first (kvwatch reads "
                             "plain and gzip-compressed files)")
    if start[257:262] == b"ustar":  # a POSIX tar header's magic (read as "a CSV header without TIMESTAMP")
        raise TraceError(f"trace {path} is a tar archive" + (" (gzip-compressed)" if gzipped else "")
                         + ": extract the trace from it first (tar xf)")
    if b"\x00" in start[:4096]:  # no text trace holds a NUL byte (a Parquet file read as "not comma-separated")
        raise TraceError(f"trace {path} is a binary file" + (" (after decompressing)" if gzipped else "")
                         + ": kvwatch reads CSV or JSON-lines text in UTF-8 (export Parquet or Arrow to CSV, save "
                         "UTF-16 text as UTF-8)")
    first = first.decode("utf-8", errors="replace").lstrip("\ufeff")  # a byte-order mark is not part of line 1
    if not first.strip():
        raise TraceError(f"trace {path} is empty" + (" (after decompressing)" if gzipped else "")
                         + ": no line to read a header or a request from")
    if first.lstrip().startswith("{"):
        return "mooncake"
    if first.lstrip().startswith("["):
        raise TraceError(f"{path}: a JSON array; kvwatch reads Mooncake traces as JSON lines, one object per line "
                         "with timestamp, input_length, output_length (jq -c '.[]' turns one into the other)")
    for kind, header in (("azure", AZURE_HEADER), ("burstgpt", BURSTGPT_HEADER)):
        try:
            if _csv_columns(first, header) is not None:
                return kind
        except ValueError as exc:
            raise TraceError(f"{path}: line 1: {exc}") from None
    names = {c.strip().lower() for c in next(csv.reader([first]), [])}
    if len(names) <= 1 and any(sep in first for sep in (";", "\t", "|")):
        raise TraceError(f"{path}: line 1 is not comma-separated; kvwatch reads CSV with commas (columns "
                         f"{','.join(AZURE_HEADER)} or {','.join(BURSTGPT_HEADER)})")
    for kind, header in (("an Azure", AZURE_HEADER), ("a BurstGPT", BURSTGPT_HEADER)):
        missing = [c for c in header if c.lower() not in names]
        if len(missing) < len(header):
            raise TraceError(f"{path}: line 1 looks like {kind} CSV header without the column "
                             f"{', '.join(missing)} (it needs {','.join(header)})")
    shown = first.strip()[:60]
    raise TraceError(f"{path}: line 1 ({shown!r}) is not an Azure CSV header (columns {','.join(AZURE_HEADER)}), a "
                     f"BurstGPT CSV header (columns {','.join(BURSTGPT_HEADER)}) nor a Mooncake JSONL line (a JSON "
                     "object with timestamp, input_length, output_length)")


def load_trace(path: str | Path, *, seed: int = 0, max_requests: int | None = None,
               left_out: dict[str, int] | None = None) -> list[Request]:
    """Read a trace of any of the formats, detected from its content (not its file name); with
    ``max_requests``, only its first requests in file order (a week-long trace held whole is gigabytes);
    ``left_out`` counts the rows left out, by reason (an empty prompt, a failed request)."""
    kind = detect_format(path)
    if kind == "mooncake":
        return read_mooncake_jsonl(Path(path), seed=seed, max_requests=max_requests, left_out=left_out)
    return _READERS[kind](Path(path), max_requests=max_requests, left_out=left_out)


def packaged_trace_names() -> list[str]:
    """The trace samples shipped with kvwatch (kvwatch/data/traces/)."""
    folder = Path(__file__).resolve().parent.parent / "data" / "traces"
    return sorted(p.name for p in folder.iterdir() if p.suffix in (".csv", ".jsonl"))


def packaged_or_given(path: Path) -> Path:
    """A bare name that is no file here but one of the packaged samples (azure_conv_sample.csv, ...) names the
    sample, for ``backtest --trace`` and ``simulate --trace`` alike: an installed kvwatch's users need not find
    site-packages."""
    if path.exists() or path.parent != Path(".") or path.name not in packaged_trace_names():
        return path  # (not the folder's README.md)
    return packaged_trace(path.name)


def packaged_trace(name: str) -> Path:
    """Path of a small trace sample shipped with kvwatch (see kvwatch/data/traces/README.md)."""
    path = Path(__file__).resolve().parent.parent / "data" / "traces" / name
    if not path.is_file():
        raise TraceError(f"no packaged trace sample named {name}")
    return path
