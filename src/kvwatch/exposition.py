"""A fast, strict parser for the Prometheus text exposition format (and its OpenMetrics variant).

Conformance: a full parse (no ``wanted``) accepts and rejects what Prometheus' own text parser does
(``prometheus/common`` ``expfmt`` ``TextParser`` with UTF-8 names, the Prometheus 3 default). The cases
are vendored in ``tests/fixtures/exposition-conformance/`` and run by ``tests/test_exposition_conformance.py``:

- every line ends in ``\\n`` (a body that stops mid-line is truncated); only ``' '`` and ``'\\t'`` are blanks;
- names are ``[a-zA-Z_:][a-zA-Z0-9_:]*``, or any UTF-8 in quotes (``{"my.metric","label.name"="v"} 1``);
- escapes: ``\\\\``, ``\\"``, ``\\n`` (others are errors), in HELP text and label values alike;
- values are what Go's ``strconv.ParseFloat`` *and* Python's ``float()`` both read (ASCII digits, no
  ``_``, no hex, ``NaN``/``Inf`` spellings): ``1_000``, ``0x10``, ``١٢`` and ``1e999`` are errors;
  timestamps are decimal int64 (dropped: kvwatch stamps nothing; of one series at several times, the
  newest point is kept, and a point without a timestamp is at scrape time, the newest);
- one HELP and one TYPE per family, TYPE before the family's samples; types are Prometheus' own (a filtered
  parse, below, reads on past a second HELP or TYPE, or a TYPE after samples, as Prometheus' scrape does: the
  first stands);
  ``le``/``quantile`` of histograms/summaries are numbers; histogram counts are not negative (a filtered parse
  drops such a family, named in :attr:`Exposition.spoiled`, and reads the rest: Prometheus stores it as written);
  ``__name__`` is not a label; a label appears once per sample.
- **duplicate series** (one sample name with the same label set twice in one payload, at the same
  timestamp or both without one) with different values make the whole payload a :class:`ParseError`: the
  target contradicts itself, and keeping either copy would be a guess (docs/reliability.md). Copies with the
  same value are one sample, as Prometheus' TSDB stores them (``memSeries.appendable`` allows exact duplicates;
  NVIDIA Dynamo's frontend served vLLM's families four times). Prometheus' Go parser leaves this check to its
  caller; kvwatch is that caller.

OpenMetrics (the text ends in a ``# EOF`` line, which is how it is told apart; nothing after it is read):
counters are declared without ``_total``, the ``unknown``/``info``/``stateset`` types, ``# UNIT``, float
timestamps and exemplars (dropped) are accepted; a family's ``*_created`` samples are dropped (kvwatch never
needs creation times). In Prometheus text, ``x_created`` is a family of its own, as in Go.

Speed (docs/performance.md): lines are cut with ``str`` methods (the sample lines between two comment lines by one
``split``); a sample name resolves to its family once (a dict); canonical label sets (``k="v",...`` without
escapes) split on ``"``, anything else takes a character-level path that mirrors Go's state machine. With
``wanted`` (a set of family or sample names) samples outside it are skipped before their labels are read, a whole
block of an unwanted family (its lines after its TYPE, all starting with its name) is skipped in C with
``str.count``, and a run of lines of one unwanted sample name (histogram buckets) is passed over with one
``startswith`` a line: lines skipped either way are not validated, an unwanted family's HELP line neither
(prometheus-cpp writes HELP unescaped). A filtered parse also reads what Prometheus' own scrape parser
(``model/textparse/promlex.l``) reads and ``expfmt`` refuses: a sample line with blanks at its end, a last line
without its newline, and a backslash before any other character in a label value or HELP text, kept as written
(the full parse refuses them, as ``expfmt``), and labels without a comma between them (``{a="1" b="2"}``). A NUL
byte anywhere is an error in both: Prometheus' lexer reads it as the end of the page and stores nothing after it,
``up`` 1. A
``name{labels}`` text and a HELP/TYPE line validated once are remembered across parses (bounded caches: a sidecar
parses the same shape every poll). :func:`parse` never raises anything but :class:`ParseError`.
"""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


def _same(a: float, b: float) -> bool:
    """Two copies of one series say the same (NaN, a gauge with no value yet, equals NaN)."""
    return a == b or (a != a and b != b)


_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Scraped text (a label value, a message quoting one) fit for one line of a terminal or a log: its control
    characters escaped as Python writes them (``\\n``, ``\\x1b``). A model name holding a newline split the report
    and forged log lines; a terminal escape in it drove whoever read them."""
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)


class ParseError(ValueError):
    """The text is not a valid Prometheus exposition (the message names the line)."""


class TooLarge(ParseError):
    """The text holds more than one engine's page could: metric families (:data:`MAX_FAMILIES`), or JSON values
    (:data:`kvwatch.engines.trtllm.MAX_JSON_VALUES`)."""


# More metric families than any engine's page holds (vLLM exports about 60, a node's whole page a few thousand).
# Each name costs the parse its metadata whatever is kept: 500,000 names in a 16 MiB body took ~300 MB.
MAX_FAMILIES = 20_000
# Labels one sample may carry: vLLM's widest, cache_config_info, has 26. One line of 1.37M labels took 478 MiB
# to be refused; Prometheus' scrape config has label_limit for the same reason.
MAX_LABELS_PER_SAMPLE = 256


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


@dataclass(frozen=True)
class Exposition:
    """Families by name (only families with samples). OpenMetrics counters and info families are keyed by their
    ``_total`` / ``_info`` sample name, as Prometheus text names them."""

    families: Mapping[str, Family]
    # Every family name seen: declared by HELP/TYPE, or with samples read (including unwanted ones).
    names: frozenset[str] = frozenset()
    # Histograms and summaries a filtered parse dropped (a non-numeric ``le``, a negative count), with why.
    spoiled: Mapping[str, str] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def get(self, name: str) -> Family | None:
        return self.families.get(name)

    def samples(self, name: str) -> list[Sample]:
        family = self.families.get(name)
        return family.samples if family is not None else []

    def __iter__(self) -> Iterator[Family]:
        return iter(self.families.values())


Wanted = Callable[[str], bool] | Collection[str]
"""A family filter: a predicate on family names, or a set of family *and/or sample* names (faster)."""

_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Go's strconv.ParseFloat minus hex/underscores, intersected with Python's float(): ASCII only, and
# NaN without a sign (Go's special() reads a sign only before "inf").
# (Each digit run has one way to match: ``[0-9]+\.?[0-9]*`` split a run of digits every possible way before failing
# on what followed, quadratic in its length; 40,000 digits held the GIL, and the whole sidecar, for 15 s.)
_GO_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                       r"|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)|[nN][aA][nN]")
_INT64 = re.compile(r"[+-]?[0-9]+")
_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary",
          "untyped": "untyped", "gauge_histogram": "gaugehistogram", "gaugehistogram": "gaugehistogram"}
_OM_TYPES = {**_TYPES, "unknown": "unknown", "info": "info", "stateset": "stateset"}
_HISTOGRAMS = ("histogram", "gaugehistogram")
_OM_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count", "_gsum", "_gcount", "_info")
_OM_SUFFIXED = (("counter", "_total"), ("info", "_info"))  # OpenMetrics types declared without their samples' suffix
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_SKIP = None  # resolved-name marker: the sample is not wanted
_PARTS = ("_bucket", "_count", "_sum")  # a histogram's sample suffixes
_UNKNOWN = object()  # resolved-name marker: not seen yet
_INF = math.inf
_INFS = (math.inf, -math.inf)
_new_sample = tuple.__new__  # Sample(...) without NamedTuple's argument handling, per sample


class _Meta:
    """What Go's parser keeps per family while reading: its type, help, and whether samples came yet."""

    __slots__ = ("family", "help", "name", "type")

    def __init__(self, name: str) -> None:
        self.name = name
        self.type: str | None = None
        self.help: str | None = None
        self.family: Family | None = None


class _Target(NamedTuple):
    """Where samples of one sample name go, resolved once per name."""

    append: Callable[[Sample], None]
    meta: _Meta
    kind: int  # 0 plain, 1 histogram bucket-ish (check le, non-negative), 2 histogram count, 3 summary


def parse(text: str | bytes, wanted: Wanted | None = None,
          admit: Callable[[dict[str, str]], bool] | None = None) -> Exposition:
    """Parse an exposition. ``wanted`` keeps only some families (see :data:`Wanted`). ``admit(labels)``, when
    given, is asked before a wanted sample is kept: a sample it refuses is validated but not kept (a caller's
    series cap, so that memory is bounded by the cap and not by the body)."""
    # The parse allocates a dict and a tuple per sample and frees nothing until it returns: cyclic GC passes
    # in between would only rescan them (measured: ~1/4 of the time on a large payload).
    enabled = gc.isenabled()
    gc.disable()
    try:
        parser = _Parser(text, wanted, admit)
        try:
            return parser.run()
        except (_OpenMetricsEnd, ParseError):
            # OpenMetrics is told by its '# EOF' line. Searching the whole body for it first costs about a tenth
            # of a filtered parse, so the body is read as Prometheus text until that line shows up (or an error
            # does), and only then again as OpenMetrics, up to that line.
            end = _eof(parser.text)
            if end is None:
                raise
            if _lines_after(parser.text, end):
                # OpenMetrics ends at '# EOF': a body going on is the text format, where that line is a comment
                # (two OpenMetrics scrapes glued together then fail on their repeated families, an error page after
                # one on its HTML; neither is cut off at the first '# EOF' any more).
                return _Parser(parser.text, wanted, admit, eof_is_comment=True).run()
        return _Parser(parser.text[:end], wanted, admit, openmetrics=True).run()
    except ParseError:
        raise
    except Exception as exc:  # a bug or a hostile input must never escape as anything else
        raise ParseError(f"cannot parse exposition: {type(exc).__name__}: {exc}") from exc
    finally:
        if enabled:
            gc.enable()


class _OpenMetricsEnd(Exception):
    """A Prometheus-text parse met an OpenMetrics ``# EOF`` line: the body is OpenMetrics."""


def _lines_after(text: str, eof: int) -> bool:
    """Whether anything but blank space follows the ``# EOF`` line starting at ``eof``."""
    stop = text.find("\n", eof)
    return stop != -1 and bool(text[stop:].strip())


def _eof(text: str) -> int | None:
    """Where an OpenMetrics ``# EOF`` line starts, if the text has one."""
    at = text.find("# EOF")
    while at != -1:
        if (at == 0 or text[at - 1] == "\n"):
            stop = text.find("\n", at)
            if not text[at + 5 : stop if stop != -1 else len(text)].strip():
                return at
        at = text.find("# EOF", at + 5)
    return None


def _next_comment(text: str, start: int) -> int:
    """Where the next line that starts with '#' begins, after ``start`` (not itself a '#'); -1: none.
    find() of one character is memchr, ~50x faster than a search for "\n#"."""
    at = text.find("#", start)
    while at != -1 and text[at - 1] != "\n":
        at = text.find("#", at + 1)
    return at


def _too_many_labels(lineno: int, name: str | None) -> TooLarge:
    return TooLarge(f"line {lineno}: more than {MAX_LABELS_PER_SAMPLE} labels on one sample of {name or ''!r}: "
                    "not an engine's (its widest has 26)")


def _err(lineno: int, msg: str, line: str | None = None) -> ParseError:
    where = f": {line[:80]!r}" if line is not None else ""
    if line is not None and line.endswith("\r"):  # Prometheus refuses it too, but the cause is worth naming
        where += " (CRLF line endings: the exposition format ends lines with LF alone)"
    if line is not None and line.startswith("\ufeff"):  # (`check --file` strips one; a fetched body keeps it)
        where += " (a UTF-8 byte-order mark before the first line: the exposition format has none)"
    return ParseError(f"line {lineno}: {msg}{where}")


class _Parser:
    def __init__(self, text: str | bytes, wanted: Wanted | None,
                 admit: Callable[[dict[str, str]], bool] | None = None, *, openmetrics: bool = False,
                 eof_is_comment: bool = False) -> None:
        self.admit = admit
        self.eof_is_comment = eof_is_comment
        if isinstance(text, (bytes, bytearray, memoryview)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as exc:
                lineno = bytes(text)[: exc.start].count(b"\n") + 1
                raise _err(lineno, "invalid UTF-8") from None
        elif not isinstance(text, str):
            raise ParseError("exposition must be text")
        elif not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _err(text.count("\n", 0, exc.start) + 1, "invalid UTF-8 (lone surrogate)") from None
        if (nul := text.find("\x00")) >= 0:
            # Prometheus' lexer ends the page there; a NUL kept in a model name also ended its read of kvwatch's own
            # page, where it was exported.
            raise _err(text.count("\n", 0, nul) + 1, "a NUL byte: Prometheus reads the page only up to it")
        self.text = text
        self.metas: dict[str, _Meta] = {}
        self.families: dict[str, Family] = {}
        self.names: set[str] = set()
        self.targets: dict[str, _Target | None] = {}
        self.seen: dict[tuple[str, ...], float] = {}  # each series' (point's) value, to tell copies from conflicts
        self.newest: dict[tuple[str, ...], tuple[float, Sample]] = {}  # a timestamped series' newest point
        self.superseded: set[int] = set()  # ids of the older points (dropped when the parse ends)
        self.checked_le: set[str] = {"+Inf"}  # le values known to be numbers (Go's parseFloat)
        self.spoiled: dict[str, str] = {}  # a filtered parse's unreadable distributions: family -> why
        self.block_lines = 0  # lines in the block _block_end last skipped
        self.openmetrics = openmetrics
        # A filtered parse is the sidecar's: it takes what Prometheus' own scrape parser does (promlex.l) where
        # expfmt is stricter, so a page Prometheus scrapes is read (module docstring).
        self.lenient = wanted is not None
        self.predicate: Callable[[str], bool] | None = None
        self.wanted_set: frozenset[str] | None = None
        self.skippable: dict[str, bool] = {}  # (a filtered parse: this wanted set's entry of _SKIPPABLE)
        if wanted is None:
            pass
        elif callable(wanted):
            self.predicate = wanted
        else:
            self.wanted_set = frozenset(wanted)
            skippable = _SKIPPABLE.get(self.wanted_set)
            if skippable is None:
                skippable = {}
                _remember(_SKIPPABLE, self.wanted_set, skippable)
            self.skippable = skippable

    # ------------------------------------------------------------------ driver

    def run(self) -> Exposition:
        text = self.text
        # Every line ends in a newline (Go: "unexpected end of input stream"), checked after the last line is
        # read, so that an error inside that line is the one reported, as in Go.
        unterminated = not self.openmetrics and bool(text[text.rfind("\n") + 1 :].strip(" \t"))
        pos, n, lineno = 0, len(text), 0
        next_comment = -1  # where the next comment line starts, once searched for from before pos
        find = text.find
        targets = self.targets
        seen = self.seen
        newest = self.newest  # stamped series: their points go through _store (the newest is kept)
        first_keys, next_keys, prefixes, comments = _FIRST_KEYS, _NEXT_KEYS, _PREFIXES, _COMMENTS
        wanted_set = self.wanted_set
        openmetrics = self.openmetrics
        checked_le = self.checked_le
        admit = self.admit
        # Families known to be skippable (OpenMetrics names counters apart from their samples: not there).
        skippable = self.skippable if wanted_set is not None and not openmetrics else None
        while pos < n:
            if text[pos] == "#":
                stop = find("\n", pos)
                if stop == -1:
                    stop = n
                line = text[pos:stop]
                lineno += 1
                pos = stop + 1
                known = comments.get(line)  # the same HELP/TYPE line in an earlier poll: already cut up
                if known is None:
                    if line[2:5] == "EOF" and line[:5] == "# EOF" and not line[5:].strip() and not self.eof_is_comment:
                        raise _OpenMetricsEnd  # (never in OpenMetrics mode: its text stops before that line)
                    skip_to = self._comment(line, lineno, stop)
                elif skippable is not None and skippable.get(known[1]):
                    # An unwanted family's metadata (a filtered parse does not validate those families).
                    self.names.add(known[1])
                    if pos < n and text[pos] == "#":
                        continue  # the TYPE line after a HELP line: its block is skipped from there
                    skip_to = self._block_end(known[1], stop)
                else:
                    skip_to = self._metadata(*known, line, lineno, stop)
                if skip_to is not None:
                    lineno += self.block_lines
                    pos = skip_to
                continue
            # A chunk: the lines up to the next one that starts with '#' (found by memchr), split in C and read
            # in one loop, instead of a search and a slice per line.
            if next_comment < pos:  # (kept between 1 MiB parts: the search walks every '#' in label values)
                next_comment = _next_comment(text, pos)
                if next_comment == -1:
                    next_comment = n
            end = next_comment
            if end - pos > _CHUNK_CHARS:  # a page without comments: split a part at a time, not the whole body
                cut = text.find("\n", pos + _CHUNK_CHARS)
                end = end if cut == -1 or cut + 1 >= end else cut + 1
            lines = text[pos:end].split("\n")
            if not lines[-1]:
                lines.pop()  # the chunk's last newline (an unterminated last line stays)
            chunk_start, base = pos, lineno
            pos, lineno = end, lineno + len(lines)
            run: str | None = None  # lines starting with it are an unwanted sample name's (histogram buckets)
            for lineno_here, line in enumerate(lines, base + 1):
                if run is not None:
                    if line.startswith(run):
                        continue  # not split, not validated
                    run = None
                if not line:
                    continue
                if line[0] in " \t":
                    stripped = line.lstrip(" \t")
                    if not stripped:
                        continue  # a blank line
                    if stripped[0] == "#":  # an indented comment (never '# EOF': that one starts its line)
                        stop = chunk_start + sum(len(x) + 1 for x in lines[: lineno_here - base]) - 1
                        skip_to = self._comment(stripped, lineno_here, stop)
                        if skip_to is not None:
                            pos, lineno = skip_to, lineno_here + self.block_lines
                            break
                        continue
                head, _, rest = line.rpartition(" ")
                hit = prefixes.get(head)
                if hit is not None:
                    # 'name{labels} value' with 'name{labels}' spelled exactly as in an earlier line or poll:
                    # validated and split already.
                    name, cached, key = hit
                else:
                    brace = line.find("{")
                    name = line[:brace] if brace != -1 else line.partition(" ")[0]
                target = targets.get(name, _UNKNOWN)
                if target is None:
                    if wanted_set is not None and len(line) > len(name):
                        run = line[: len(name) + 1]  # the lines after it of this unwanted name: no per-line work
                    continue
                if target is _UNKNOWN and line[0] not in " \t" and _valid_name(name):
                    # (before the careful path: an unread family's escapes are never resolved, 154 MB for a 16 MiB
                    # label of backslashes)
                    target = self._target(name, lineno_here, line)
                    if target is None:
                        continue
                if hit is not None:
                    careful = "\t" in rest  # (a space before the value would have left it in head)
                else:
                    careful = line[0] in " \t" or "\\" in line or "\t" in line or "  " in line or (
                        target is _UNKNOWN and not _valid_name(name))
                if careful:
                    self._slow(line, lineno_here)
                    continue
                if target is _UNKNOWN:
                    target = self._target(name, lineno_here, line)
                    if target is None:
                        continue
                if hit is not None:
                    labels = cached.copy()  # the cached dict itself is never handed out
                elif brace == -1:
                    labels = {}
                    rest = line[len(name) + 1 :]
                    key = (name, "")
                else:
                    if len(line) > 1024 and line.count('"', brace) > 2 * MAX_LABELS_PER_SAMPLE + 2:
                        raise _too_many_labels(lineno_here, name)
                    pieces = line[brace + 1 :].split('"')
                    tail = pieces[-1]
                    if tail[:2] == "} ":
                        rest = tail[2:]
                    elif tail[:3] == ",} ":
                        rest = tail[3:]
                    else:
                        self._slow(line, lineno_here)
                        continue
                    keys = pieces[0:-1:2]
                    if len(keys) > MAX_LABELS_PER_SAMPLE:  # (the count above keeps a far longer line unsplit)
                        raise _too_many_labels(lineno_here, name)
                    try:
                        keys[0] = first_keys[keys[0]]
                        if len(keys) > 1:
                            keys[1:] = map(next_keys.__getitem__, keys[1:])
                    except IndexError:
                        self._slow(line, lineno_here)  # '{}'
                        continue
                    except KeyError:
                        if not _learn_fragments(pieces[0:-1:2]):
                            self._slow(line, lineno_here)  # the careful path names what is wrong
                            continue
                        try:
                            keys = [first_keys[keys[0]] if keys[0] in first_keys else keys[0],
                                    *map(next_keys.__getitem__, pieces[2:-1:2])]
                        except KeyError:  # more labels than the cache holds: it was cleared while learning them
                            self._slow(line, lineno_here)
                            continue
                    labels = dict(zip(keys, pieces[1::2], strict=True))
                    if len(labels) != len(keys):
                        raise _err(lineno_here, f"duplicate label names for metric {name!r}", line)
                    # The series' identity is the canonical text of its labels (see _series_key); a line with
                    # its label names in order (prometheus_client sorts them) already is that text.
                    if tail[:2] == "} " and (len(keys) < 2 or (keys[0] < keys[1] if len(keys) == 2
                                                               else keys == sorted(keys))):
                        key = (name, line[brace + 1 : len(line) - len(rest) - 2])
                    else:
                        key = _series_key(name, labels)
                    if tail[:2] == "} ":
                        _remember(prefixes, line[: len(line) - len(rest) - 1], (name, dict(labels), key))
                kind = target.kind
                if kind == 3 or openmetrics or " " in rest:
                    self._add(target, name, labels, rest, lineno_here, line, key)  # type: ignore[arg-type]
                    continue
                # The common case inline: a plain value, no timestamp.
                try:
                    value = float(rest)
                except ValueError:
                    value = _value(rest, lineno_here, line)  # raises the error
                if "_" in rest or not rest.isascii() or value != value or value in _INFS or not rest.isprintable():
                    value = _value(rest, lineno_here, line)
                if (kind and (value < 0 or labels.get("le", "+Inf") not in checked_le)) or (newest and key in newest):
                    # A histogram sample whose checks are not known to pass (the careful store checks and raises),
                    # or a series also seen at an explicit time.
                    self._store(target, name, labels, value, lineno_here, line, None, key)  # type: ignore[arg-type]
                    continue
                if admit is not None and not admit(labels):
                    continue
                if key in seen:
                    if _same(seen[key], value):
                        continue  # an exact copy (a page served twice over)
                    raise _err(lineno_here, f"duplicate series {name}{labels}: the payload contradicts itself", line)
                seen[key] = value
                target.append(_new_sample(Sample, (name, labels, value)))  # type: ignore[union-attr]
        if unterminated and not self.lenient:
            raise _err(lineno, "unexpected end of input stream (no newline at the end)")
        for family_name in self.spoiled:
            self.families.pop(family_name, None)
        if self.superseded:  # a series at several explicit times: kvwatch reads one value, the newest point's
            for family in self.families.values():
                family.samples = [s for s in family.samples if id(s) not in self.superseded]
        return Exposition(families=self.families, names=frozenset(self.names), spoiled=self.spoiled)

    # ------------------------------------------------------------------ samples

    def _add(self, target: _Target, name: str, labels: dict[str, str], rest: str, lineno: int, line: str,
             key: tuple[str, ...]) -> None:
        """Value (and timestamp) of a sample line whose name and labels are read; then the family checks."""
        if self.openmetrics and " # " in rest:
            rest = rest[: rest.index(" # ")]  # an exemplar (its own labels were already split off the line)
        when = None
        if self.wanted_set is not None and rest[-1:] == " ":
            rest = rest.rstrip(" \t")  # blanks at the end: Prometheus' own scrape (promlex) skips them
        if " " in rest:
            value_text, _, stamp = rest.partition(" ")
            value = _value(value_text, lineno, line)
            when = self._timestamp(stamp, lineno, line)
        else:
            value = _value(rest, lineno, line)
        self._store(target, name, labels, value, lineno, line, when, key)

    def _distribution_problem(self, target: _Target, name: str, labels: dict[str, str], value: float) -> str | None:
        """What makes a histogram's or summary's sample unreadable as a distribution (expfmt refuses the page)."""
        if target.kind == 3:
            quantile = labels.get("quantile")
            if quantile is not None and not _is_go_float(quantile):
                return f"expected float as value for 'quantile' label, got {quantile!r}"
            return None
        le = labels.get("le")
        if le is not None and le not in self.checked_le:
            if not _is_go_float(le):
                return f"expected float as value for 'le' label, got {le!r}"
            self.checked_le.add(le)
        if value < 0:
            if target.kind == 2:
                return f"negative count for histogram {target.meta.name!r}"
            if le is not None and not name.endswith("_sum"):
                return f"negative bucket population for histogram {target.meta.name!r}"
        return None

    def _store(self, target: _Target, name: str, labels: dict[str, str], value: float, lineno: int,
               line: str, when: float | None = None, key: tuple[str, ...] | None = None) -> None:
        kind = target.kind
        if kind:
            problem = self._distribution_problem(target, name, labels, value)
            if problem is not None:
                if not self.lenient:
                    raise _err(lineno, problem, line)
                # Prometheus' scrape stores such a sample as written; kvwatch cannot read the distribution, so
                # the family is dropped (unknown to the adapters), not the page.
                # (no line number: the sidecar logs when the set of reasons changes, and lines move every poll)
                self.spoiled.setdefault(target.meta.name, problem)
                return
        # A series twice at one time (both without a timestamp, as always in vLLM's payloads) is a contradiction;
        # at two explicit times it is two points (Go's scenario 7 has such a pair), of which kvwatch reads the
        # newest: an adapter combining copies of a series would have added them up.
        if self.admit is not None and not self.admit(labels):
            return
        if key is None:
            key = _series_key(name, labels)
        point = key if when is None else (*key, repr(when))
        if point in self.seen:
            if _same(self.seen[point], value):
                return  # an exact copy
            raise _err(lineno, f"duplicate series {name}{labels}: the payload contradicts itself", line)
        self.seen[point] = value
        sample = _new_sample(Sample, (name, labels, value))
        if when is None:
            # Without a timestamp a point is at scrape time, newer than any stamped copy of its series.
            if self.newest and key in self.newest:
                self.superseded.add(id(self.newest[key][1]))
                self.newest[key] = (math.inf, sample)
        elif key in self.seen:
            self.superseded.add(id(sample))  # its series also came without a timestamp: that point is newer
        else:
            newest = self.newest.get(key)
            if newest is None or when > newest[0]:
                if newest is not None:
                    self.superseded.add(id(newest[1]))
                self.newest[key] = (when, sample)
            else:
                self.superseded.add(id(sample))
        target.append(sample)

    def _timestamp(self, stamp: str, lineno: int, line: str) -> float:
        """A sample's timestamp (milliseconds, or OpenMetrics seconds): validated, used only to tell points apart."""
        if self.openmetrics:
            stamp = stamp.partition(" # ")[0]
            if _GO_FLOAT.fullmatch(stamp) and not stamp.lower().lstrip("+-").startswith(("inf", "nan")):
                return float(stamp)
        elif _INT64.fullmatch(stamp):
            # (the length first, its leading zeros gone: int() of a number past 4,300 digits raises, "cannot parse"
            # without a line number)
            sign, digits = ("-" if stamp[0] == "-" else ""), stamp.lstrip("+-").lstrip("0") or "0"
            if len(digits) <= 19 and -(2**63) <= (value := int(sign + digits)) < 2**63:
                return value
            raise _err(lineno, f"timestamp {stamp[:40]!r} is out of the 64-bit range", line)
        if " " in stamp or "\t" in stamp:
            raise _err(lineno, "spurious string after timestamp", line)
        raise _err(lineno, f"expected integer as timestamp, got {stamp[:40]!r}", line)

    def _target(self, name: str, lineno: int, line: str) -> _Target | None:
        """Which family samples called ``name`` join (Go's setOrCreateCurrentMF), once per name."""
        meta = self._meta_for(name)
        if meta.type is None:
            meta.type = "untyped"
        family_name = meta.name
        self.names.add(family_name)
        # OpenMetrics' _created samples are creation times, not values of their family: never wanted.
        if (self.openmetrics and name != family_name and name.endswith("_created")) or \
                not self._wanted(name, family_name):
            self.targets[name] = _SKIP
            return _SKIP
        family = meta.family
        if family is None:
            family = Family(family_name, meta.type, meta.help or "")
            meta.family = family
            self.families[family_name] = family
        kind = 0
        if meta.type in _HISTOGRAMS and name != family_name:
            kind = 2 if name.endswith(("_count", "_gcount")) else 1
        elif meta.type in _HISTOGRAMS:
            kind = 1
        elif meta.type == "summary":
            kind = 3
        target = _Target(family.samples.append, meta, kind)
        self.targets[name] = target
        return target

    def _wanted(self, name: str, family_name: str) -> bool:
        # Once per sample name. A histogram's part on a page without its # TYPE line is a family of its own
        # ("x_bucket"): wanted with its histogram, as Prometheus reads the parts by name whatever the type.
        base = next((name[: -len(p)] for p in _PARTS if name.endswith(p)), None) if name == family_name else None
        if self.wanted_set is not None:
            wanted = self.wanted_set
            return name in wanted or family_name in wanted or (base is not None and base in wanted)
        if self.predicate is not None:
            return bool(self.predicate(family_name)) or (base is not None and bool(self.predicate(base)))
        return True

    def _meta_for(self, name: str) -> _Meta:
        """The family metadata ``name`` belongs to (a histogram's or summary's part joins its base), created if new."""
        metas = self.metas
        meta = metas.get(name)
        if meta is not None:
            return meta
        for suffix in (_OM_SUFFIXES if self.openmetrics else ("_count", "_sum", "_bucket")):
            if name.endswith(suffix) and len(name) > len(suffix):
                base = metas.get(name[: -len(suffix)])
                if base is None and self.openmetrics:
                    base = metas.get(name[: -len(suffix)] + "_total")  # a counter's _created
                if base is None or base.type is None:
                    continue
                if self.openmetrics or (base.type == "summary" and suffix != "_bucket") or base.type in _HISTOGRAMS:
                    return base
        if len(metas) >= MAX_FAMILIES:
            raise TooLarge(f"more than {MAX_FAMILIES:,} metric families (at {name!r}): not one engine's /metrics")
        meta = _Meta(name)
        metas[name] = meta
        return meta

    # ------------------------------------------------------------------ comments

    def _comment(self, line: str, lineno: int, stop: int) -> int | None:
        """A ``#`` line; returns where to continue when the family's sample block can be skipped whole."""
        keyword = line[2:6]
        if line[:2] == "# " and (keyword == "HELP" or keyword == "TYPE") and line[6:7] == " " and line[7:8] != " ":
            # The canonical spelling ('# TYPE name gauge'): the name ends at the next blank.
            name, sep, after = line[7:].partition(" ")
            if not sep or not _valid_name(name) or "\t" in name:
                return self._comment_careful(line, lineno, stop)
            after = " " + after
        else:
            return self._comment_careful(line, lineno, stop)
        skip_to = self._metadata(keyword, name, after, line, lineno, stop)
        # Remembered once it passed: a line refused here (an unknown TYPE) and then cached would be taken, in the
        # next poll of an unwanted family, for one already checked, and the same page would fail once and then read.
        _remember(_COMMENTS, line, (keyword, name, after))
        return skip_to

    def _comment_careful(self, line: str, lineno: int, stop: int) -> int | None:
        if self.lenient and metadata_keyword(line) is None:
            return None  # '#TYPE x': Prometheus' scrape (promlex.l) needs a blank after '#', else it is a comment
        body = line[1:].lstrip(" \t")
        keyword, sep, rest = _split_blank(body)
        if keyword not in ("HELP", "TYPE") or not sep:
            return None
        rest = rest.lstrip(" \t")
        if not rest:
            return None
        name, after = _metric_name(rest, lineno, line)
        if name is None:
            raise _err(lineno, "invalid metric name in comment", line)
        if not after:
            return None
        if after[0] not in " \t":
            raise _err(lineno, "invalid metric name in comment", line)
        return self._metadata(keyword, name, after, line, lineno, stop)

    def _metadata(self, keyword: str, name: str, after: str, line: str, lineno: int, stop: int) -> int | None:
        if self.openmetrics:
            # OpenMetrics declares counters and info families without the suffix their samples carry
            # (prometheus_client's Info("vllm:cache_config") writes vllm:cache_config_info samples): key them by
            # it, as Prometheus text names them.
            for kind, suffix in _OM_SUFFIXED:
                if name.endswith(suffix):
                    continue
                declared = self.metas.get(name + suffix)
                if keyword == "TYPE" and after.strip(" \t").lower() == kind:
                    base = self.metas.get(name)
                    name += suffix
                    if base is not None and base.help is not None and name not in self.metas:
                        self._meta_for(name).help = base.help
                    break
                if declared is not None and declared.type == kind:
                    name += suffix
                    break
        meta = self._meta_for(name)
        self.names.add(meta.name)
        text = after.lstrip(" \t")
        if not text:
            return None
        if self.lenient and (meta.help if keyword == "HELP" else meta.type) is not None:
            # A page merged from two (KServe's queue-proxy merges its own with the model server's) repeats a
            # family's HELP and TYPE, process_* for one. Prometheus' scrape reads a second HELP or TYPE, or a TYPE
            # after the family's samples, without complaint: a filtered parse keeps the first
            # and reads on (two scrapes glued together are still refused where a series has two values; exact
            # copies are one sample, a page served twice over). An unread family's lines are skipped unvalidated.
            if self.wanted_set is not None and meta.family is None and self._skippable(meta.name):
                return self._block_end(meta.name, stop)
            return None
        if keyword == "HELP":
            if meta.help is not None:
                raise _err(lineno, f"second HELP line for metric name {meta.name!r}", line)
            if self.wanted_set is not None and meta.family is None and self._skippable(meta.name):
                # An unread family's help is kept as written, unvalidated like its samples: prometheus-cpp
                # (Triton) writes HELP unescaped, and a "\d" there refused the whole page
                meta.help = text
                return self._block_end(meta.name, stop)
            meta.help = _unescape(text, lineno, line, self.lenient)
            if meta.family is not None:
                meta.family.help = meta.help
        else:
            if meta.type is not None:
                raise _err(lineno, f"second TYPE line for metric name {meta.name!r}, or TYPE reported after samples",
                           line)
            kind = (_OM_TYPES if self.openmetrics else _TYPES).get(text.lower())
            if kind is None:
                raise _err(lineno, f"unknown metric type {text[:40]!r}", line)
            meta.type = kind
        if self.wanted_set is not None and meta.family is None and self._skippable(meta.name):
            return self._block_end(meta.name, stop)
        return None

    def _skippable(self, family: str) -> bool:
        """True when no wanted name starts with ``family`` (so no wanted sample can hide in its block), and the
        family is no part of a wanted histogram typed on its own (``x_bucket`` with its own ``# TYPE`` line, as
        Prometheus' /federate writes them: :meth:`_wanted` reads such parts)."""
        assert self.wanted_set is not None
        known = self.skippable.get(family)
        if known is None:
            wanted = self.wanted_set
            known = not any(w.startswith(family) for w in wanted) and not any(
                family.endswith(p) and family[: -len(p)] in wanted for p in _PARTS)
            _remember(self.skippable, family, known)
        return known

    def _block_end(self, family: str, stop: int) -> int | None:
        """Where the run of lines after this metadata line, all starting with ``family``, ends; None if the
        run is empty or any line in it is something else (then it is read line by line)."""
        text = self.text
        nxt = _next_comment(text, stop)
        if nxt != -1:
            nxt -= 1
        end = len(text) if nxt == -1 else nxt
        if nxt == -1 and text.endswith("\n"):
            end -= 1
        if end <= stop:
            return None
        lines = text.count("\n" + family, stop, end)  # the long needle first: a fast search
        if not lines or text.count("\n", stop, end) != lines:
            return None
        self.block_lines = lines
        return end + 1

    # ------------------------------------------------------------------ the careful path

    def _slow(self, line: str, lineno: int) -> None:
        """A sample line in full generality (Go's state machine, one line at a time)."""
        i = len(line) - len(line.lstrip(" \t"))
        n = len(line)
        name: str | None = None
        labels: dict[str, str] = {}
        inside_braces = i < n and line[i] == "{"  # Go: only then may the braces hold the metric name
        if i < n and line[i] != "{":
            name, i = _metric_name_at(line, i, lineno)
            if not name:
                raise _err(lineno, "invalid metric name", line)
            while i < n and line[i] in " \t":
                i += 1
        if i < n and line[i] == "{":
            i += 1
            while True:
                while i < n and line[i] in " \t":
                    i += 1
                if i < n and line[i] == "}":
                    i += 1
                    break
                label, i = _label_name_at(line, i, lineno)
                if not label:
                    raise _err(lineno, f"invalid label name for metric {name or ''!r}", line)
                while i < n and line[i] in " \t":
                    i += 1
                if i >= n or line[i] != "=":
                    # A quoted metric name inside the braces: {"my.metric", ...}.
                    if i < n and line[i] in ",}" and inside_braces:
                        if name is not None:
                            raise _err(lineno, "multiple metric names", line)
                        name = _unquote(label, lineno, line) if label.startswith('"') else label
                        if line[i] == ",":
                            i += 1
                            continue
                        i += 1
                        break
                    raise _err(lineno, "expected '=' after label name", line)
                key = _unquote(label, lineno, line) if label.startswith('"') else label
                if key == "__name__":
                    raise _err(lineno, 'label name "__name__" is reserved', line)
                i += 1
                while i < n and line[i] in " \t":
                    i += 1
                if i >= n or line[i] != '"':
                    raise _err(lineno, "expected '\"' at start of label value", line)
                value, i = _quoted(line, i, lineno, "label value", self.lenient)
                if key in labels:
                    raise _err(lineno, f"duplicate label names for metric {name or ''!r}", line)
                if len(labels) == MAX_LABELS_PER_SAMPLE:
                    raise _too_many_labels(lineno, name)
                labels[key] = value
                while i < n and line[i] in " \t":
                    i += 1
                if i < n and line[i] == ",":
                    i += 1
                    continue
                if i < n and line[i] == "}":
                    i += 1
                    break
                if self.lenient and i < n and (line[i] == '"' or _LEGACY_LABEL.match(line, i)):
                    continue  # Prometheus' scrape (promparse.go's parseLVals) needs no comma between labels
                raise _err(lineno, "unexpected end of label value", line)
            while i < n and line[i] in " \t":
                i += 1
        if not name:
            raise _err(lineno, "invalid metric name", line)
        rest = line[i:]
        if self.openmetrics and " # " in rest:
            rest = rest[: rest.index(" # ")]
        if self.wanted_set is not None:
            rest = rest.rstrip(" \t")  # blanks at the end: Prometheus' own scrape (promlex) skips them
        value_text, sep, stamp = _split_blank(rest)
        value = _value(value_text, lineno, line)
        when = None
        if sep:
            stamp = stamp.lstrip(" \t")
            stamp_text, sep2, _ = _split_blank(stamp)
            when = self._timestamp(stamp_text, lineno, line)
            if sep2:
                raise _err(lineno, "spurious string after timestamp", line)
        target = self.targets.get(name, _UNKNOWN)
        if target is _UNKNOWN:
            target = self._target(name, lineno, line)
        if target is None:
            return
        self._store(target, name, labels, value, lineno, line, when)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- caches shared between parses

# A sidecar parses the same shape every poll, so what was validated once (a name, a label fragment such as
# 'engine=' or ',model_name=') is remembered across parses. Pure functions of the string; bounded, so a
# hostile target sending ever-new names cannot grow them without limit.
_CACHE_LIMIT = 4096
# ... and each entry at most this long: a HELP line or label set of megabytes, new every poll, is not remembered.
_CACHED_KEY_MAX_CHARS = 1024
# The most text split into lines at once: a 16 MiB body without comments was one chunk, held as ~40 MB of lines.
_CHUNK_CHARS = 1 << 20
_VALID_NAMES: dict[str, bool] = {}
_FIRST_KEYS: dict[str, str] = {}  # 'engine=' -> 'engine'
_NEXT_KEYS: dict[str, str] = {}  # ',model_name=' -> 'model_name'
_SKIPPABLE: dict[frozenset[str], dict[str, bool]] = {}  # wanted set -> family -> no wanted name starts with it
_PREFIXES: dict[str, tuple[str, dict[str, str], tuple[str, ...]]] = {}  # 'name{labels}' -> name, labels, key
_COMMENTS: dict[str, tuple[str, str, str]] = {}  # '# HELP name text' -> 'HELP', 'name', ' text'


def _remember(cache: dict, key: object, value: object) -> None:  # type: ignore[type-arg]
    if isinstance(key, str) and len(key) > _CACHED_KEY_MAX_CHARS:
        return  # (a long line is rarely repeated: held across parses, 4,096 of them grew 16 MiB a poll)
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value


def _valid_name(name: str) -> bool:
    known = _VALID_NAMES.get(name)
    if known is None:
        known = _LEGACY_NAME.fullmatch(name) is not None
        _remember(_VALID_NAMES, name, known)
    return known


def _learn_fragments(fragments: list[str]) -> bool:
    """Validate canonical label fragments (``key=`` first, ``,key=`` after) into the caches; False if one
    is not canonical (spaces, quotes in names, ``__name__``...), which the careful path then explains."""
    for index, fragment in enumerate(fragments):
        cache = _FIRST_KEYS if index == 0 else _NEXT_KEYS
        if fragment in cache:
            continue
        key = fragment[:-1] if index == 0 else fragment[1:-1]
        if fragment[-1:] != "=" or (index and fragment[:1] != ",") or key == "__name__" \
                or not _LEGACY_LABEL.fullmatch(key):
            return False
        _remember(cache, fragment, key)
    return True


# ---------------------------------------------------------------------- tokens

def metadata_keyword(line: str, pos: int = 0) -> str | None:
    """``HELP`` or ``TYPE`` where Prometheus' scrape lexer (promlex.l) reads a ``#`` line (at ``pos`` of ``line``)
    as metadata: '#', blanks, the keyword, a blank; None for a plain comment ('#HELP x', '# HELPER x')."""
    match = _METADATA_KEYWORD.match(line, pos)  # (matched in place: slices of a 60 MiB comment line peaked at 4x it)
    return match.group(1) if match else None


_METADATA_KEYWORD = re.compile(r"#[ \t]+(HELP|TYPE)[ \t]")


def _split_blank(text: str) -> tuple[str, str, str]:
    """Split at the first blank or tab (Go's readTokenUntilWhitespace). Searched in C: a character loop took a
    second a MiB of a comment line without a blank."""
    i = text.find(" ")
    tab = text.find("\t", 0, i if i >= 0 else len(text))
    if tab >= 0:
        i = tab
    if i < 0:
        return text, "", ""
    return text[:i], text[i], text[i + 1 :]


def _metric_name(text: str, lineno: int, line: str) -> tuple[str | None, str]:
    """A legacy or quoted metric name at the start of ``text``: (name or None, the rest)."""
    name, end = _metric_name_at(text, 0, lineno)
    return name, text[end:]


# The two below read at a position and return where they stopped: a line read by slicing off what remains after
# each name copied the rest of the line once per label (a 16 MiB line of labels took minutes).
def _metric_name_at(text: str, start: int, lineno: int) -> tuple[str | None, int]:
    """A legacy or quoted metric name at ``text[start]``: (name or None, the index after it)."""
    if text[start : start + 1] == '"':
        return _quoted(text, start, lineno, "metric name")
    match = _LEGACY_NAME.match(text, start)
    if match is None:
        return None, start
    return match.group(), match.end()


def _label_name_at(text: str, start: int, lineno: int) -> tuple[str, int]:
    """A legacy label name, or a quoted one returned *with* its quotes (it may be a quoted metric name), at
    ``text[start]``, and the index after it."""
    if text[start : start + 1] == '"':
        _, end = _quoted(text, start, lineno, "label name")
        return text[start:end], end
    match = _LEGACY_LABEL.match(text, start)
    if match is None:
        return "", start
    return match.group(), match.end()


def _unquote(quoted: str, lineno: int, line: str) -> str:
    return _quoted(quoted, 0, lineno, "name")[0]


def _quoted(text: str, start: int, lineno: int, what: str, lenient: bool = False) -> tuple[str, int]:
    """The string in quotes at ``text[start]`` (escapes resolved) and the index after its closing quote;
    ``lenient``: another escape is kept as written (Prometheus' scrape parser), not an error (expfmt)."""
    i = start + 1
    close = text.find('"', i)
    if close != -1 and "\\" not in text[i:close]:
        return text[i:close], close + 1
    out = _Pieces()
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt not in _ESCAPES and not (lenient and nxt not in ("", "\n")):
                raise _err(lineno, f"invalid escape sequence '\\{nxt}'", text)
            out.append(_ESCAPES.get(nxt, ch + nxt))
            i += 2
        elif ch == '"':
            return out.joined(), i + 1
        else:
            out.append(ch)
            i += 1
    raise _err(lineno, f"{what} {out.joined()[:40]!r} contains unescaped new-line", text)


def _unescape(text: str, lineno: int, line: str, lenient: bool = False) -> str:
    """HELP text: ``\\\\``, ``\\n`` and ``\\"`` are escapes, every other backslash is an error (``lenient``: kept)."""
    if "\\" not in text:
        return text
    out = _Pieces()
    i, n = 0, len(text)
    while i < n:
        j = text.find("\\", i)
        if j == -1:
            out.append(text[i:])
            break
        out.append(text[i:j])
        nxt = text[j + 1 : j + 2]
        if nxt not in _ESCAPES and not lenient:
            raise _err(lineno, f"invalid escape sequence '\\{nxt}'", line)
        out.append(_ESCAPES.get(nxt, "\\" + nxt))
        i = j + 2
    return out.joined()


class _Pieces:
    """A string built piece by piece, joined every ``FLUSH`` pieces: a list of one entry per character or escape
    cost 8 bytes each, 128 MB for a 16 MiB text of backslashes (234 MB for one at the default cap)."""

    FLUSH = 65536

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.joined_parts: list[str] = []

    def append(self, piece: str) -> None:
        self.pieces.append(piece)
        if len(self.pieces) >= self.FLUSH:
            self.joined_parts.append("".join(self.pieces))
            self.pieces.clear()

    def joined(self) -> str:
        return "".join(self.joined_parts) + "".join(self.pieces)


def _series_key(name: str, labels: dict[str, str]) -> tuple[str, ...]:
    """A series' identity: its name and the canonical exposition text of its labels (sorted, escaped, names
    quoted when not legacy). Equal for any spelling of one series."""
    parts = []
    for key in sorted(labels):
        value = labels[key].replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        if not _LEGACY_LABEL.fullmatch(key):
            key = '"' + key.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        parts.append(f'{key}="{value}"')
    text = ",".join(parts)
    return (name, text)


def _is_go_float(text: str) -> bool:
    return _GO_FLOAT.fullmatch(text) is not None and _finite_or_spelled(text)


def _finite_or_spelled(text: str) -> bool:
    # Go's ParseFloat fails with ErrRange where Python silently gives inf (1e999).
    value = float(text)
    return value not in (_INF, -_INF) or "n" in text.lower()


def _value(text: str, lineno: int, line: str) -> float:
    """A sample value Prometheus and Python both read; the common spellings take one ``float()``."""
    try:
        value = float(text)
    except ValueError:
        raise _err(lineno, f"expected float as value, got {text[:40]!r}", line) from None
    # float() also reads '1_0', ' 1', '١', '+nan' and '0x'-free hex-less forms Go refuses; the fast check
    # passes plain ASCII numbers, everything else is held against Go's grammar.
    suspicious = not text.isascii() or "_" in text or value != value or value in (_INF, -_INF)
    if (suspicious or not text.isprintable()) and not _is_go_float(text):
        raise _err(lineno, f"expected float as value, got {text[:40]!r}", line)
    return value
