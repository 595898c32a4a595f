"""Accuracy targets on real vLLM startup logs (tests/fixtures/calibration, see its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repo_scripts import load_script

_calibrate = load_script("tools/calibrate.py", "kvwatch_tools_calibrate")
evaluate, evaluate_budgets, load_rows, main = (_calibrate.evaluate, _calibrate.evaluate_budgets,
                                               _calibrate.load_rows, _calibrate.main)
render_budgets, render_markdown, summary = _calibrate.render_budgets, _calibrate.render_markdown, _calibrate.summary

CSV = Path(__file__).parent / "fixtures" / "calibration" / "vllm_kv_capacity.csv"


@pytest.fixture(scope="module")
def results():
    return evaluate(load_rows(CSV))


@pytest.fixture(scope="module")
def budgets():
    return evaluate_budgets(load_rows(CSV))


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
    # ... which is mostly in-sample: both medians are published, and out of sample is far worse
    assert s["estimated_in_sample_rows"] + s["estimated_out_of_sample_rows"] == s["estimated_rows"]
    assert s["estimated_in_sample_rows"] >= 30 and s["estimated_out_of_sample_rows"] >= 7
    assert s["estimated_median_abs_error_in_sample"] <= 0.005
    assert 0.03 <= s["estimated_median_abs_error_out_of_sample"] <= 0.10
    table = render_markdown(results)
    assert "in-sample" in table and "other versions and GPUs" in table


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


# What the logs and notes say happened (README: failed starts are included on purpose).
FAILED_STARTS = {36: "No available memory for the cache blocks", 46: "max seq len 29000 > KV cache 23648",
                 49: "max seq len 131072 > KV cache 81536", 52: "default max_model_len did not fit",
                 53: "negative KV, EngineCore failed to start"}


def test_rows_without_a_token_count_are_checked_for_budget_and_verdict(budgets):
    by_line = {b.line: b for b in budgets}
    assert {33, 34, 35, 36, 37, 38, 39, 40, 52, 53} <= {b.line for b in budgets if not b.has_tokens}
    # vLLM's own available figure through kvwatch's start check gives what happened, on every row
    for b in budgets:
        assert b.logged_starts == (b.line not in FAILED_STARTS), (b.line, b.model)
    # the estimate from the name and settings alone: same verdict except the documented misses (capacity.md)
    # (53, gpt-oss-120b on one H100 with no version given, is now called a failed start too: the current rules
    # subtract the CUDA-graph estimate, which its 2.14 GiB shortfall did not leave room for)
    assert {b.line for b in budgets if b.estimated_starts != b.logged_starts} == {46, 52, 55}
    assert not by_line[36].estimated_starts  # the 70B FP8 on one H100 is called a failed start
    # the v0.19 sweep: budgets within 0.3 GiB; the version-unknown llm-d-benchmark rows: within 5 GiB. (Not the PP
    # rows: their logged figure is rank 0's, the estimate the last stage's, which also runs the sampler.)
    assert all(abs(b.available_error_gib) <= 0.3 for b in budgets if 2 <= b.line <= 32 and b.line not in (15, 16))
    assert all(-0.8 <= by_line[line].available_error_gib <= -0.7 for line in (15, 16))
    assert all(abs(by_line[line].available_error_gib) <= 5.0 for line in range(33, 41))
    table = render_budgets(budgets)
    assert table.count("\n| ") == len(budgets)
    assert "disagrees on lines 46, 52, 55" in table
