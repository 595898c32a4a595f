"""kvwatch's parser against the reference parsers' own test data (vendored in tests/fixtures/exposition-conformance,
sources in its README): every valid case parses to the reference values, every invalid one is a ParseError
on the line Go names, and property-based round trips through prometheus_client."""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary, generate_latest

from kvwatch.exposition import Exposition, ParseError, parse

HERE = Path(__file__).parent / "fixtures" / "exposition-conformance"
GO = json.loads((HERE / "prometheus-common-text-parse.json").read_text())


def _value(v: Any) -> float:
    return float(v) if not isinstance(v, str) else {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}[v]


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _families(exposition: Exposition) -> dict[str, Any]:
    return {f.name: f for f in exposition}


# kvwatch reads one value per series. Go's scenario 7 has one series at scrape time (no timestamp) and at an explicit
# time, and returns both points; kvwatch keeps the scrape-time one, the newest (kvwatch.exposition's docstring).
KEPT_POINTS: dict[int, list[int]] = {7: [0]}  # scenario: the reference samples kvwatch keeps


@pytest.mark.parametrize("case", GO["valid"], ids=lambda c: f"go-{c['go_scenario']}")
def test_go_valid_cases_parse_to_the_reference_values(case: dict[str, Any]) -> None:
    got = _families(parse(case["in"]))
    assert set(got) == {f["name"] for f in case["families"]}
    for want in case["families"]:
        family = got[want["name"]]
        assert (family.type, family.help) == (want["type"], want["help"])
        samples = want["samples"]
        if case["go_scenario"] in KEPT_POINTS:
            samples = [samples[i] for i in KEPT_POINTS[case["go_scenario"]]]
        assert len(family.samples) == len(samples)
        for sample, (name, labels, value) in zip(family.samples, samples, strict=True):
            assert (sample.name, sample.labels) == (name, labels)
            assert _same(sample.value, _value(value)), (sample, value)


def _go_line(message: str) -> int:
    match = re.search(r"in line (\d+)", message)
    assert match
    return int(match.group(1))


@pytest.mark.parametrize("case", GO["errors"], ids=lambda c: f"go-error-{c['go_scenario']}")
def test_go_error_cases_are_parse_errors_on_the_same_line(case: dict[str, Any]) -> None:
    text: str | bytes = bytes.fromhex(case["in_hex"]) if "in_hex" in case else case["in"]
    with pytest.raises(ParseError) as info:
        parse(text)
    assert str(info.value).startswith(f"line {_go_line(case['go_error_utf8'])}:"), (str(info.value), case)


@pytest.mark.parametrize("prefix", GO["missing_metric_name"]["prefixes"])
@pytest.mark.parametrize("sample", GO["missing_metric_name"]["samples"])
def test_go_missing_metric_name_is_an_error_on_the_sample_line(prefix: str, sample: str) -> None:
    with pytest.raises(ParseError, match=f"^line {prefix.count(chr(10)) + 1}: invalid metric name"):
        parse(prefix + sample)


def test_a_filtered_parse_agrees_with_the_full_parse_on_what_it_keeps() -> None:
    for case in GO["valid"]:
        full = _families(parse(case["in"]))
        for name in full:
            part = parse(case["in"], wanted={name})
            assert [(s.name, s.labels) for s in part.samples(name)] == [(s.name, s.labels) for s in full[name].samples]


# ------------------------------------------------------------------------ OpenMetrics project test data

OM_DIR = HERE / "openmetrics"
OM_CASES = sorted(p for p in OM_DIR.iterdir() if p.is_dir())
OM_EXPECT = json.loads((OM_DIR / "expected.json").read_text())


@pytest.mark.parametrize("case", OM_CASES, ids=lambda p: p.name)
def test_openmetrics_cases(case: Path) -> None:
    text = next(p for p in case.iterdir() if p.name.startswith("metrics")).read_text()
    want = OM_EXPECT[case.name]
    if want["kvwatch"] == "error":
        with pytest.raises(ParseError):
            parse(text)
        return
    got = parse(text)
    for name, samples in want.get("samples", {}).items():
        assert [(s.name, s.labels) for s in got.samples(name)] == [(n, labels) for n, labels, _ in samples]
        assert all(_same(s.value, _value(v)) for s, (_, _, v) in zip(got.samples(name), samples, strict=True))
    for name, help_text in want.get("help", {}).items():
        family = got.get(name)
        assert family is not None and family.help == help_text


# ------------------------------------------------------------------------ property-based

_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True).filter(lambda n: not n.startswith("__"))
_label_names = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,8}", fullmatch=True)
# Any Unicode but lone surrogates (not encodable as UTF-8, which the exposition is).
# (no NUL: Prometheus' lexer ends a page there, and kvwatch refuses one: test_exposition's NUL test)
_texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=16)
_floats = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def _registries(draw: st.DrawFn) -> CollectorRegistry:
    registry = CollectorRegistry()
    used: set[str] = set()
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["gauge", "counter", "histogram", "summary", "info"]))
        base = draw(_names.filter(lambda n, u=used: not any(n.startswith(x) or x.startswith(n) for x in u)))
        used.add(base)
        labels = draw(st.lists(_label_names.filter(lambda n: n not in ("le", "quantile")), max_size=3, unique=True))
        help_text = draw(_texts)
        values = draw(st.lists(st.tuples(st.tuples(*[_texts] * len(labels)), _floats), min_size=1, max_size=3,
                               unique_by=lambda v: v[0]))
        with contextlib.suppress(ValueError):  # prometheus_client refuses some names (e.g. a _total clash)
            if kind == "gauge":
                m: Any = Gauge(base, help_text, labels, registry=registry)
                for key, value in values:
                    (m.labels(*key) if labels else m).set(value)
            elif kind == "counter":
                m = Counter(base, help_text, labels, registry=registry)
                for key, value in values:
                    (m.labels(*key) if labels else m).inc(abs(value) if math.isfinite(value) else 1.0)
            elif kind == "histogram":
                m = Histogram(base, help_text, labels, buckets=(0.5, 1.0, 10.0), registry=registry)
                for key, value in values:
                    (m.labels(*key) if labels else m).observe(value if math.isfinite(value) else 1.0)
            elif kind == "summary":
                m = Summary(base, help_text, labels, registry=registry)
                for key, value in values:
                    (m.labels(*key) if labels else m).observe(value if math.isfinite(value) else 1.0)
            else:
                m = Info(base, help_text, labels, registry=registry)
                for key, _ in values:
                    (m.labels(*key) if labels else m).info({"version": draw(_texts)})
    return registry


@settings(max_examples=120, deadline=None)
@given(_registries())
def test_prometheus_client_registries_round_trip_exactly(registry: CollectorRegistry) -> None:
    want = [(m.name, m.type, m.documentation, [(s.name, s.labels, s.value) for s in m.samples])
            for m in registry.collect()]
    text = generate_latest(registry).decode()
    got = parse(text)
    seen = {s.name for f in got for s in f.samples}
    for name, kind, doc, samples in want:
        for sample_name, labels, value in samples:
            assert sample_name in seen
            family = next(f for f in got if any(s.name == sample_name for s in f.samples))
            match = [s for s in family.samples if s.name == sample_name and s.labels == labels]
            assert len(match) == 1, (sample_name, labels)
            assert _same(match[0].value, float(value))
        if kind != "info":
            names = {kind} if kind != "counter" else {"counter"}
            family_name = name + "_total" if kind == "counter" else name
            family = got.get(family_name)
            # Go's parser skips the blanks between the name and the HELP text, so leading blanks of a help are
            # not part of it: the text after them comes back exactly.
            assert family is not None and family.type in names and family.help == doc.lstrip(" \t")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_parse_error(data: bytes) -> None:
    with contextlib.suppress(ParseError):
        parse(data)


_fragments = st.sampled_from(["# HELP ", "# TYPE ", "# EOF\n", "a", "b_sum", "_bucket", "{", "}", '"', "=", ",", " ",
                              "\t", "\n", "\\", "le", "quantile", "1", "-1", "NaN", "+Inf", "e5", ".", "histogram",
                              "summary", "counter", "gauge", "\x00", "é", "{\"x.y\"", "_total", "_created", " # "])


@settings(max_examples=400, deadline=None)
@given(st.lists(_fragments, max_size=40).map("".join), st.sampled_from([None, {"a"}, {"b_sum", "a"}]))
def test_exposition_shaped_noise_raises_only_parse_error(text: str, wanted: set[str] | None) -> None:
    with contextlib.suppress(ParseError):
        parse(text, wanted)
