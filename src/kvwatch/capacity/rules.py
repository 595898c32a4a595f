"""The vLLM releases at which a rule of the capacity model changes, in one place: ``kvwatch plan`` names the range of
releases whose rules it applied (``vLLM 0.26-0.27 rules``), and a range must not span a change."""

from __future__ import annotations

from kvwatch.capacity import kv, mamba, max_len, planner, quantization

RULE_CHANGES: tuple[tuple[int, int], ...] = tuple(sorted({
    kv.HYBRID_GROUPING_SINCE, kv.STAGED_GROUPS_SINCE, kv.TOKENS_FROM_CONCURRENCY_SINCE, kv.IN_FLIGHT_TOKENS_SINCE,
    kv.CHUNKED_HYBRID_SINCE, kv.HYBRID_PREFIX_CACHING_SINCE, kv.HYBRID_PREFIX_CACHING_DEFAULT_SINCE,
    kv.MAMBA_CHECKPOINT_BLOCK_SINCE, kv.NEMOTRON_SSM_FP32_SINCE, kv.MAMBA_PAGES_SINCE, kv.UNIFIED_PAGE_SIZES_SINCE,
    kv.PADDED_PAGE_SIZES_SINCE, kv.PADDED_PAGES_ANY_BACKEND_SINCE, kv.SEPARATE_V_HEAD_SIZE_SINCE,
    kv.DS_MLA_FOR_AUTO_BEFORE, kv.DS_MLA_BY_BACKEND_SINCE, kv.SM100_FLASHINFER_SPARSE_FOR_FP8_SINCE,
    kv.SM120_SPARSE_MLA_SINCE, kv.GLM_DSA_FP8_ON_SM100_SINCE, kv.INDEX_CACHE_SINCE, kv.INDEX_SKIP_OFFSET_SINCE,
    mamba.USER_BLOCK_ALIGNMENT_SINCE, mamba.MLA_HYBRID_ALIGNMENT_128_SINCE,
    max_len.YARN_UNSCALED_SINCE, max_len.LONGROPE_DEFAULT_SINCE,
    planner.CUDA_GRAPHS_SUBTRACTED_SINCE, planner.OLD_DEFAULT_UTILIZATION_BEFORE, planner.EXTENSIBLE_KV_SINCE,
    *quantization.CHECKPOINT_KV_FP8_SINCE.values(),
}))


def rules_range(version: tuple[int, int], changes: tuple[tuple[int, int], ...] = RULE_CHANGES) -> str:
    """The vLLM releases whose capacity rules are the ones applied for ``version`` (``0.32-0.33``, ``>=0.34``,
    ``0.26-0.27``)."""
    lower = [c for c in changes if c <= version]
    upper = [c for c in changes if c > version]
    lo, hi = (max(lower) if lower else None), (min(upper) if upper else None)
    if lo is None and hi is not None:
        return f"<{hi[0]}.{hi[1]}"
    if hi is None and lo is not None:
        return f">={lo[0]}.{lo[1]}"
    assert lo is not None and hi is not None
    first = f"{lo[0]}.{lo[1]}"
    if hi[1] == 0:  # the release before a x.0 is not x.-1, and its number cannot be known
        return f">={first},<{hi[0]}.0"
    last = f"{hi[0]}.{hi[1] - 1}"
    return first if first == last else f"{first}-{last}"
