"""Accuracy targets on real vLLM startup logs (tests/fixtures/calibration, see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.capacity.calibrate import evaluate, load_rows, main, render_markdown, summary

CSV = Path(__file__).parent / "fixtures" / "calibration" / "vllm_kv_capacity.csv"


@pytest.fixture(scope="module")
def results():
    return evaluate(load_rows(CSV))


def test_logged_components_within_1pct_standard_and_5pct_sliding(results):
    logged = [r for r in results if r.is_logged]
    assert len(logged) >= 30
    assert {r.kind for r in logged} >= {"standard", "sliding"}
    for r in logged:
        limit = 0.05 if r.kind == "sliding" else 0.01
        assert abs(r.error) <= limit, (r.line, r.model, r.error)


def test_name_and_settings_alone_median_within_10pct(results):
    s = summary(results)
    assert s["estimated_rows"] >= 30
    assert s["estimated_median_abs_error"] <= 0.10


def test_table_renders_every_result(results, capsys):
    table = render_markdown(results)
    assert table.count("\n| ") == len(results)  # one line per result after the header
    assert main([str(CSV)]) == 0
    assert "median absolute error" in capsys.readouterr().out
    assert main(["/nonexistent.csv"]) == 2


def test_pp_rows_use_the_planners_own_last_stage_term_and_are_not_called_logged(results):
    pp = [r for r in results if r.is_logged and "PP" in r.setting]
    assert {r.line for r in pp} == {15, 16}
    for r in pp:
        assert r.mode == "logged + est. PP sampler"  # a corrected figure, not a logged one
        assert abs(r.error) <= 0.01
        # from rank 0's logged figures alone the model is off by more than the 1% target: published, not hidden
        assert r.raw_error is not None and r.raw_error > 0.01
    assert all(r.raw_error is None for r in results if r.mode == "logged")
    table = render_markdown(results)
    assert "from the logged rank-0 figures alone" in table and "+1.40% (line 15)" in table
