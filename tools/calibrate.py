"""Check the capacity model against real vLLM startup logs and print the per-row error table.

A developer tool, outside the installed package: ``.venv/bin/python tools/calibrate.py [CSV]``
(default ``tests/fixtures/calibration/vllm_kv_capacity.csv``) prints the Markdown table published in
docs/capacity.md. Two modes per row:

- ``logged``: the row's own weights, activation peak and non-torch memory (as vLLM printed them) go in;
  only the budget -> blocks -> tokens arithmetic is tested. With pipeline parallelism ``plan_capacity`` adds
  the last stage's sampler to rank 0's logged activation (an estimate), so those rows are marked
  ``logged + est. PP sampler`` and their error from the logged figures alone is reported too.
- ``estimated``: only the model name and the settings go in (weights, activation and non-torch are the
  model's estimates); this is what ``kvwatch plan --model X --gpu Y`` would say.
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kvwatch.capacity.memory import GIB, resolve_quantization
from kvwatch.capacity.planner import DeploymentSpec, SpecError, parse_version, plan_capacity
from kvwatch.capacity.presets import PresetError, match_model, resolve_gpu

DEFAULT_CSV = Path("tests/fixtures/calibration/vllm_kv_capacity.csv")
FITTED_ON = "v0.19"  # the rows the estimate constants in memory.py were fitted on (in-sample)


@dataclass(frozen=True)
class RowResult:
    line: int  # CSV line number (header = 1)
    model: str
    setting: str
    kind: str  # standard, mla, sliding
    mode: str  # "logged", "logged + est. PP sampler" or "estimated"
    predicted: int
    actual: int
    raw_predicted: int | None = None  # PP rows: from the logged rank-0 figures alone (no last-stage term)

    @property
    def error(self) -> float:
        """Signed relative error of the predicted token count."""
        return (self.predicted - self.actual) / self.actual

    @property
    def raw_error(self) -> float | None:
        """PP rows: the error of the logged figures alone, without the estimated last-stage sampler term."""
        return None if self.raw_predicted is None else (self.raw_predicted - self.actual) / self.actual

    @property
    def in_sample(self) -> bool:
        """The estimate constants (activation, non-torch) were fitted on the vLLM 0.19 rows."""
        return FITTED_ON in self.setting

    @property
    def is_logged(self) -> bool:
        return self.mode.startswith("logged")


def load_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _float(row: dict[str, str], key: str) -> float | None:
    text = (row.get(key) or "").strip()
    return float(text) if text else None


def _int(row: dict[str, str], key: str) -> int | None:
    value = _float(row, key)
    return int(value) if value is not None else None


def _quantization(row: dict[str, str]) -> str | None:
    """The row's vLLM quantization method as --quantization (a loader name defers to the checkpoint's scheme,
    which for a quantized repack is the one its name implies)."""
    text = (row.get("quantization") or "").strip().split(" ")[0].lower()
    return text or None


def _base_spec(row: dict[str, str]) -> tuple[DeploymentSpec, str] | None:
    """The settings part of a row (no measured memory), or None when the model has no preset."""
    try:
        match = match_model(row["model"].split(" (")[0])
    except PresetError:
        return None
    arch = match.arch
    kind = "mla" if arch.is_mla else "sliding" if arch.has_sliding_window else "standard"
    gpu_bytes = _float(row, "gpu_total_gib")
    gpu_name = row.get("gpu") or None
    preset = None
    if gpu_name:
        try:
            preset = resolve_gpu(gpu_name.split(" (")[0])
        except PresetError:
            preset = None
    if gpu_bytes is not None:
        gpu_bytes *= GIB
    elif preset is not None:
        gpu_bytes = float(preset.total_memory_bytes)
    spec = DeploymentSpec(
        arch=arch,
        gpu_memory_bytes=gpu_bytes,
        gpu_name=gpu_name,
        gpu_compute_capability=preset.compute_capability if preset else None,
        gpu_memory_utilization=_float(row, "gpu_memory_utilization"),
        tensor_parallel_size=_int(row, "tp") or 1,
        pipeline_parallel_size=_int(row, "pp") or 1,
        dtype=(row.get("dtype") or "auto").strip() or "auto",
        kv_cache_dtype=(row.get("kv_cache_dtype") or "auto").strip() or "auto",
        quantization=_quantization(row),
        block_size=_int(row, "block_size") or 16,
        max_model_len=_int(row, "max_model_len"),
        vllm_version=parse_version(row.get("vllm_version") or None),
    )
    return spec, kind


def _setting(spec: DeploymentSpec, row: dict[str, str]) -> str:
    parts = [row.get("gpu") or "?", f"TP{spec.tensor_parallel_size}"]
    if spec.pipeline_parallel_size > 1:
        parts.append(f"PP{spec.pipeline_parallel_size}")
    parts.append(f"len {spec.max_model_len}" if spec.max_model_len else "len default")
    if spec.dtype != "auto":
        parts.append(spec.dtype)
    if spec.kv_cache_dtype != "auto":
        parts.append(f"kv {spec.kv_cache_dtype}")
    resolved = resolve_quantization(spec.quantization, spec.arch)
    if spec.quantization and resolved and resolved.scheme != spec.quantization:
        parts.append(f"q {spec.quantization} → {resolved.scheme}")
    elif resolved:
        parts.append(f"q {resolved.scheme}")
    parts.append(f"v{row.get('vllm_version') or '?'}")
    return ", ".join(parts)


def evaluate(rows: Sequence[dict[str, str]]) -> list[RowResult]:
    """Every row with vLLM's token count and a known model, in both modes where the row allows."""
    results: list[RowResult] = []
    for line, row in enumerate(rows, start=2):
        actual = _int(row, "kv_cache_tokens")
        base = _base_spec(row)
        if actual is None or base is None:
            continue
        spec, kind = base
        setting = _setting(spec, row)
        logged = [_float(row, k) for k in ("gpu_total_gib", "gpu_memory_utilization", "weights_gib",
                                           "activation_peak_gib", "non_torch_gib")]
        if all(v is not None for v in logged):
            total, util, weights, activation, non_torch = (float(v or 0) for v in logged)
            measured = replace(spec, weights_bytes=weights * GIB, activation_bytes=activation * GIB,
                               non_torch_bytes=non_torch * GIB)
            plan = plan_capacity(measured)
            # With PP the planner adds the last stage's sampler to rank 0's logged activation (an estimate), so
            # such rows are not purely "logged"; the raw figure is what the logged numbers alone give.
            raw = None
            mode = "logged"
            if plan.pp_last_stage_extra_bytes:
                mode = "logged + est. PP sampler"
                raw_spec = replace(spec, available_kv_bytes=(total * util - weights - activation - non_torch) * GIB)
                raw = plan_capacity(raw_spec).kv_cache_tokens
            results.append(RowResult(line, row["model"], setting, kind, mode, plan.kv_cache_tokens, actual, raw))
        if spec.gpu_memory_bytes is not None:
            try:
                estimate = plan_capacity(spec)
            except SpecError:
                continue
            results.append(RowResult(line, row["model"], setting, kind, "estimated", estimate.kv_cache_tokens,
                                     actual))
    return results


@dataclass(frozen=True)
class BudgetResult:
    """A row with vLLM's "Available KV cache memory": the budget estimate and the start / no-start verdict."""

    line: int
    model: str
    setting: str
    logged_available_gib: float
    estimated_available_gib: float
    logged_starts: bool  # the plan from vLLM's own available figure (no memory, or one request does not fit)
    estimated_starts: bool  # the plan from the name and the settings alone
    has_tokens: bool  # the row also has a token count (it is in the token table)

    @property
    def available_error_gib(self) -> float:
        return self.estimated_available_gib - self.logged_available_gib


def evaluate_budgets(rows: Sequence[dict[str, str]]) -> list[BudgetResult]:
    """Every row with a logged available KV figure, a preset model and a known GPU, failed starts included."""
    out: list[BudgetResult] = []
    for line, row in enumerate(rows, start=2):
        logged = _float(row, "available_kv_gib")
        base = _base_spec(row)
        if logged is None or base is None or base[0].gpu_memory_bytes is None:
            continue
        spec, _ = base
        try:
            from_log = plan_capacity(replace(spec, available_kv_bytes=logged * GIB))
            estimate = plan_capacity(spec)
        except SpecError:
            continue
        out.append(BudgetResult(line, row["model"], _setting(spec, row), logged, estimate.available_kv_bytes / GIB,
                                from_log.will_start, estimate.will_start, _int(row, "kv_cache_tokens") is not None))
    return out


def summary(results: Iterable[RowResult]) -> dict[str, float]:
    res = list(results)
    logged = [r for r in res if r.is_logged]
    estimated = [r for r in res if r.mode == "estimated"]

    def worst(kinds: set[str]) -> float:
        errs = [abs(r.error) for r in logged if r.kind in kinds]
        return max(errs) if errs else 0.0

    return {
        "logged_rows": len(logged),
        "estimated_rows": len(estimated),
        "logged_max_error_standard_mla": worst({"standard", "mla"}),
        "logged_max_error_sliding": worst({"sliding"}),
        "logged_pp_rows": len([r for r in logged if r.raw_error is not None]),
        "logged_max_raw_error_pp": max((abs(r.raw_error) for r in logged if r.raw_error is not None), default=0.0),
        "estimated_median_abs_error": _median_abs(estimated),
        "estimated_in_sample_rows": len([r for r in estimated if r.in_sample]),
        "estimated_median_abs_error_in_sample": _median_abs([r for r in estimated if r.in_sample]),
        "estimated_out_of_sample_rows": len([r for r in estimated if not r.in_sample]),
        "estimated_median_abs_error_out_of_sample": _median_abs([r for r in estimated if not r.in_sample]),
    }


def _median_abs(rows: Sequence[RowResult]) -> float:
    return statistics.median(abs(r.error) for r in rows) if rows else 0.0


def render_budgets(budgets: Sequence[BudgetResult]) -> str:
    """The available-KV table: vLLM's figure, the estimate from the name and settings, both verdicts."""
    def verdict(starts: bool) -> str:
        return "starts" if starts else "**fails**"

    lines = ["| line | model | setting | vLLM available KV | estimated | difference | vLLM's figure says | "
             "estimate says |",
             "|---:|---|---|---:|---:|---:|---|---|"]
    for b in budgets:
        lines.append(f"| {b.line} | {b.model} | {b.setting} | {b.logged_available_gib:.2f} GiB | "
                     f"{b.estimated_available_gib:.2f} GiB | {b.available_error_gib:+.2f} GiB | "
                     f"{verdict(b.logged_starts)} | {verdict(b.estimated_starts)} |")
    agree = sum(b.logged_starts == b.estimated_starts for b in budgets)
    misses = ", ".join(str(b.line) for b in budgets if b.logged_starts != b.estimated_starts) or "none"
    errs = [abs(b.available_error_gib) for b in budgets]
    lines += ["", f"- {len(budgets)} rows with vLLM's available KV ({sum(not b.has_tokens for b in budgets)} without "
              f"a token count): the verdict from the estimate agrees on {agree} (disagrees on lines {misses}); "
              f"median absolute budget error {statistics.median(errs) if errs else 0.0:.2f} GiB"]
    return "\n".join(lines)


def render_markdown(results: Sequence[RowResult]) -> str:
    lines = ["| line | model | setting | kind | mode | kvwatch tokens | vLLM tokens | error |",
             "|---:|---|---|---|---|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.line} | {r.model} | {r.setting} | {r.kind} | {r.mode} | {r.predicted:,} | "
                     f"{r.actual:,} | {r.error * 100:+.2f}% |")
    s = summary(results)
    lines += [
        "",
        f"- logged mode, {s['logged_rows']:.0f} rows: worst error {s['logged_max_error_standard_mla'] * 100:.2f}% on "
        f"standard/MLA rows, {s['logged_max_error_sliding'] * 100:.2f}% on sliding-window rows",
        f"- of those, {s['logged_pp_rows']:.0f} pipeline-parallel rows include the estimated last-stage sampler "
        "term (`logged + est. PP sampler`, as `kvwatch plan` applies it); from the logged rank-0 figures alone "
        "they are off by " + ", ".join(f"{r.raw_error * 100:+.2f}% (line {r.line})" for r in results
                                     if r.raw_error is not None),
        f"- estimated mode, {s['estimated_rows']:.0f} rows: median absolute error "
        f"{s['estimated_median_abs_error'] * 100:.2f}%, but that is mostly in-sample: the estimate constants were "
        f"fitted on the {s['estimated_in_sample_rows']:.0f} vLLM 0.19 rows (median "
        f"{s['estimated_median_abs_error_in_sample'] * 100:.2f}%); on the other "
        f"{s['estimated_out_of_sample_rows']:.0f} rows (other versions and GPUs) the median absolute error is "
        f"{s['estimated_median_abs_error_out_of_sample'] * 100:.2f}%",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0]) if args else DEFAULT_CSV
    if not path.is_file():
        print(f"calibrate: no such file {path}", file=sys.stderr)
        return 2
    rows = load_rows(path)
    print(render_markdown(evaluate(rows)))
    print()
    print(render_budgets(evaluate_budgets(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
