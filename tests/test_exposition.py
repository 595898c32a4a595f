"""The exposition parser: formats vLLM serves, hostile input, and agreement with prometheus_client."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.exposition import ParseError, parse

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-metrics"


def test_help_type_labels_and_values() -> None:
    text = (
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
    )
    family = parse(text).get("vllm:kv_cache_usage_perc")
    assert family is not None
    assert family.type == "gauge"
    assert family.help == "KV-cache usage. 1 means 100 percent usage."
    assert family.samples == [("vllm:kv_cache_usage_perc", {"engine": "0", "model_name": "m"}, 0.25)]


def test_escaped_label_values_and_special_floats() -> None:
    text = (
        '# TYPE x gauge\n'
        'x{a="q\\"uote",b="back\\\\slash",c="new\\nline",d="brace}, comma"} NaN\n'
        'x{a="2"} +Inf\n'
        'x{a="3"} -Inf 1700000000000\n'
    )
    samples = parse(text).samples("x")
    assert samples[0].labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline", "d": "brace}, comma"}
    assert math.isnan(samples[0].value)
    assert samples[1].value == math.inf
    assert samples[2].value == -math.inf  # the timestamp is accepted and dropped


def test_histogram_samples_in_multiprocess_order_group_under_family() -> None:
    exposition = parse((FIXTURES / "gen-multiprocess-pid.prom").read_text())
    names = [s.name for s in exposition.samples("vllm:request_prompt_tokens")]
    assert names == ["vllm:request_prompt_tokens_sum", "vllm:request_prompt_tokens_bucket",
                     "vllm:request_prompt_tokens_bucket", "vllm:request_prompt_tokens_count"]


def test_created_samples_are_dropped_and_duplicates_kept() -> None:
    exposition = parse((FIXTURES / "v0.10.0-glm45-deprecated-and-new.prom").read_text())
    assert "vllm:gpu_prefix_cache_queries_created" not in exposition
    assert exposition.get("vllm:gpu_prefix_cache_hits_created") is None
    assert exposition.samples("vllm:prefix_cache_queries_total")[0].value == 32.0
    dup = parse('a{x="1"} 1\na{x="1"} 2\n').samples("a")
    assert [s.value for s in dup] == [1.0, 2.0]


def test_openmetrics_variant() -> None:
    text = (
        "# TYPE vllm:prompt_tokens counter\n"
        "# HELP vllm:prompt_tokens Number of prefill tokens processed.\n"
        "# UNIT vllm:prompt_tokens tokens\n"
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 5.0\n'
        'vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9\n'
        "# EOF\n"
    )
    family = parse(text).get("vllm:prompt_tokens_total")
    assert family is not None and family.type == "counter"
    assert family.help == "Number of prefill tokens processed."
    assert [s.value for s in family.samples] == [5.0]


def test_sample_before_its_type_line_still_finds_family() -> None:
    text = 'h_sum{a="1"} 3\n# TYPE h histogram\nh_count{a="1"} 2\n'
    family = parse(text).get("h")
    assert family is not None and family.type == "histogram" and len(family.samples) == 2


def test_wanted_skips_families_but_records_their_names() -> None:
    text = '# TYPE a gauge\na{x="1"} 1\nb{x="1"} 2\nc 3\n'
    exposition = parse(text, wanted=lambda name: name == "a")
    assert set(exposition.families) == {"a"}
    assert {"a", "b", "c"} <= exposition.names


def test_crlf_and_blank_lines() -> None:
    exposition = parse("# TYPE a gauge\r\n\r\na 1\r\n")
    assert exposition.samples("a")[0].value == 1.0


@pytest.mark.parametrize("text", [
    "<!DOCTYPE html><html><body>502 Bad Gateway</body></html>",
    "a{x=\"1\" 1\n",
    'a{x="1"}\n',
    "a one\n",
    'a{x=1} 1\n',
    '{x="1"} 1\n',
    "a 1 2 3\n",
    "\x00\x01\x02",
])
def test_garbage_raises_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse(text)


def test_empty_text_is_an_empty_exposition() -> None:
    assert not parse("").families


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.prom")), ids=lambda p: p.name)
def test_agrees_with_prometheus_client(path: Path) -> None:
    text = path.read_text()
    ours = {(s.name, tuple(sorted(s.labels.items())), s.value) for f in parse(text) for s in f.samples}
    theirs = {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for f in text_string_to_metric_families(text) for s in f.samples
        if not s.name.endswith("_created")
    }
    assert ours == theirs


_line_chars = st.sampled_from([*list('abc:_{}=",\\ \t\n#01.+-eEInfNa'), "HELP", "TYPE", "vllm:x", "le", "\r"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_line_chars, max_size=60).map("".join))
def test_fuzz_only_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        parse(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_arbitrary_unicode_only_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        parse(text, wanted=lambda name: True)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True),
                       # NUL is rejected on purpose (binary body), so label values never hold it.
                       st.text(st.characters(blacklist_characters="\x00"), max_size=12), max_size=4),
       st.floats(allow_nan=False))
def test_roundtrip_escaped_labels(labels: dict[str, str], value: float) -> None:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    body = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())
    parsed = parse(f"m{{{body}}} {value!r}\n").samples("m")
    assert parsed[0].labels == labels and parsed[0].value == value


def test_openmetrics_exemplars_are_ignored_not_an_error() -> None:
    text = (
        "# TYPE h histogram\n"
        'h_bucket{le="1"} 1 # {trace_id="x"} 0.5\n'
        'h_bucket{le="+Inf"} 2 # {trace_id="y"} 3.5 1700000000.5\n'
        "h_count 2\n"
        "# TYPE c counter\n"
        'c_total 5 # {span="a # b"} 1\n'
        'g{path="/a # b"} 3\n'  # ' # ' inside a label value is not an exemplar
        "# EOF\n"  # exemplars exist only in OpenMetrics, which always ends so
    )
    e = parse(text)
    assert [(s.labels, s.value) for s in e.samples("h")] == [({"le": "1"}, 1.0), ({"le": "+Inf"}, 2.0), ({}, 2.0)]
    assert e.samples("c_total")[0].value == 5.0
    assert e.samples("g")[0].labels == {"path": "/a # b"}


def test_nothing_after_eof_is_parsed() -> None:
    e = parse("a 1\n# EOF\nb 2\n{{not metrics at all\n")
    assert "b" not in e and e.samples("a")[0].value == 1.0
    assert "b" in parse("a 1\n# HELP b not the end # EOF\nb 2\n")  # only a line of its own ends the text


@pytest.mark.parametrize("value", ["1_000", "1_0.5", "0x10", "1e", "one"])
def test_values_python_reads_but_prometheus_does_not_are_errors(value: str) -> None:
    with pytest.raises(ParseError, match="bad value"):
        parse(f"a {value}\n")
