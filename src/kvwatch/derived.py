"""Per-series derived values, computed in one place for ``serve`` and ``check`` (pure).

:func:`derive` turns one :class:`~kvwatch.model.Reading` (plus its history, when there is one) into the
:class:`SeriesState` that is exported: the preemption rate, the mean request footprint, the concurrency
ceilings and the headroom under them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvwatch.history import SeriesHistory
from kvwatch.model import Reading

RATE_WINDOW_SECONDS = 60.0
"""Window of ``kvwatch_preemptions_per_second`` and of the recent request mix (poll-clock seconds)."""


@dataclass(frozen=True)
class SeriesState:
    """One series as exported: the reading plus derived values and analyzer results."""

    reading: Reading
    preemptions_per_second: float | None = None
    max_concurrency: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    concurrency_headroom: float | None = None
    mean_request_tokens: float | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


def _mean_parts(reading: Reading, history: SeriesHistory | None, window: float) -> tuple[float, float] | None:
    """Mean prompt and mean generated tokens of a finished request, recent window first, else lifetime."""
    if history is not None:
        parts = [history.increase(f, window) for f in (
            "request_prompt_tokens_sum", "request_prompt_tokens_count",
            "request_generation_tokens_sum", "request_generation_tokens_count")]
        if all(p is not None for p in parts):
            p_sum, p_count, g_sum, g_count = (p[0] for p in parts)  # type: ignore[index]
            if p_count > 0 and g_count > 0:
                return p_sum / p_count, g_sum / g_count
    if reading.request_prompt_tokens_count and reading.request_generation_tokens_count and \
            reading.request_prompt_tokens_sum is not None and reading.request_generation_tokens_sum is not None:
        return (reading.request_prompt_tokens_sum / reading.request_prompt_tokens_count,
                reading.request_generation_tokens_sum / reading.request_generation_tokens_count)
    return None


def mean_request_tokens(reading: Reading, history: SeriesHistory | None = None,
                        window: float = RATE_WINDOW_SECONDS) -> float | None:
    """Mean size of a finished request (prompt + generated tokens), recent window first, else lifetime."""
    parts = _mean_parts(reading, history, window)
    return sum(parts) if parts is not None else None


def mean_request_kv_tokens(reading: Reading, history: SeriesHistory | None = None,
                           window: float = RATE_WINDOW_SECONDS) -> float | None:
    """The KV a finished request held of its own: its prompt less the share the prefix cache served
    (``Reading.prefix_cached_share``, the figure the forecaster discounts waiting prompts by), plus its generated
    tokens. A shared system prompt is held once for every request that reads it: counted whole per request, 600
    requests running at 0.96 of a pool read a ceiling of 250 and the advice cut them to 236."""
    return _kv_tokens(reading, _mean_parts(reading, history, window))


def _kv_tokens(reading: Reading, parts: tuple[float, float] | None) -> float | None:
    if parts is None:
        return None
    prompt, generated = parts
    return prompt * (1.0 - (reading.prefix_cached_share or 0.0)) + generated


LIVE_FOOTPRINT_MIN_USAGE = 0.01
"""Below this usage the live KV footprint per running request is a block or two: too coarse to size by."""


def blocks_shared_by_groups(config: Mapping[str, str]) -> bool:
    """Whether the engine's ``cache_config_info`` itself says its blocks are shared among KV groups: a Mamba hybrid
    whose state pages vLLM pads to the attention page (``mamba_page_size_padded``, set by its
    HybridAttentionMambaModelConfig, "None" elsewhere). A hybrid needing no padding, or an interleaved
    sliding-window model, says nothing (vLLM labels ``sliding_window`` only where every layer slides)."""
    return config.get("mamba_page_size_padded", "None") not in ("None", "", "0")


def block_pool(reading: Reading) -> tuple[float | None, float | None]:
    """(blocks, tokens per block) when they describe the token pool, else (None, None).

    On hybrid models vLLM rewrites ``block_size`` after KV init to the smallest group's (vllm issue 51163), so
    ``blocks × block_size`` no longer matches the reported capacity; the block figures are then not used, nor
    where the payload says the blocks are shared among groups (:func:`blocks_shared_by_groups`).
    """
    blocks, size, capacity = reading.num_gpu_blocks, reading.block_size, reading.kv_capacity_tokens
    if not blocks or not size or blocks <= 0 or size <= 0:
        return None, None
    if capacity is None and blocks_shared_by_groups(reading.cache_config):
        return None, None  # (a known model's capacity is divided among its groups: the ratio below tells)
    if capacity is not None and not 0.9 <= blocks * size / capacity <= 1.1:
        return None, None
    return blocks, size


def max_concurrency(reading: Reading, mean_tokens: float | None, max_model_len: int | None) -> dict[str, float]:
    """Concurrency ceilings by basis: ``observed_mix`` and ``max_model_len`` (vLLM's own figure when reported,
    else blocks per request at max length).

    ``observed_mix`` is the smaller of two estimates, whichever are known: capacity ÷ the live footprint
    (KV tokens in use ÷ running requests, i.e. running ÷ usage) and capacity ÷ ``mean_tokens``, the KV a finished
    request held of its own (:func:`mean_request_kv_tokens`: prompt less its prefix-cached share, plus output).
    Neither alone is conservative: the finished mean under-weights long requests, which stay in flight longest and
    so dominate what the cache holds; the live footprint under-counts young requests, which will still grow (on a
    ramp of long outputs it read 67-85 where 52 ran without preemption, and the finished mean 50). Under KV
    pressure the live one is mostly the smaller, and it is the same footprint the advisor's concurrency limit uses.
    When the block pool is known (:func:`block_pool`), the mean request is also counted in whole blocks
    (``blocks ÷ ceil(mean ÷ block_size)``), and the ceiling never exceeds the number of blocks. On a model whose
    layout counts by group (several KV groups, a window) and which kvwatch knows (``Reading.layout_pool``), the
    mean request is counted as that layout holds it instead."""
    out: dict[str, float] = {}
    capacity = reading.kv_capacity_tokens
    estimates = []
    usage, running = reading.kv_usage_ratio, reading.requests_running
    # A PD prefill server's KV is held mostly by requests whose KV is still being sent to a decode server, which
    # its running count (0, or from SGLang 0.5.23 the current forward batch) does not hold: no live footprint.
    if usage is not None and usage > LIVE_FOOTPRINT_MIN_USAGE and running and not reading.prefill_server:
        estimates.append(running / usage)
    blocks, block_size = block_pool(reading)
    if reading.layout_pool is not None and mean_tokens:
        # A sliding (chunked) group holds a request's window, a Mamba group its state: the engine's token figure
        # charges every token in every group (gpt-oss-20b at 2,000 tokens: 598 where its blocks hold 1,113).
        estimates.append(reading.layout_pool.requests_at(mean_tokens))
    elif capacity is not None and mean_tokens:
        estimates.append(capacity / mean_tokens)
    if blocks is not None and block_size and mean_tokens and reading.layout_pool is None:
        # A request holds whole blocks: a 287-token request takes one 1024-token block, not 287/1024 of one.
        estimates.append(blocks / math.ceil(mean_tokens / block_size))
    if estimates:
        # Every running request holds at least one block, so no basis can exceed the block count.
        out["observed_mix"] = min(min(estimates), blocks) if blocks is not None else min(estimates)
    if reading.kv_max_concurrency is not None:
        out["max_model_len"] = reading.kv_max_concurrency
    elif max_model_len:
        if blocks is not None and block_size:
            out["max_model_len"] = blocks / math.ceil(max_model_len / block_size)
        elif capacity is not None and (reading.num_gpu_blocks is None or not reading.block_size):
            out["max_model_len"] = capacity / max_model_len
        # else blocks that are not the capacity: shared among KV groups (a sliding-window or hybrid model, where the
        # capacity was divided by their number, kvwatch.capacity.series) or a rewritten block size. The ceiling
        # needs the model's layout (kvwatch.capacity.series.engine_max_concurrency): unknown without it; the blocks
        # alone gave 292 requests of 8,192 tokens for a pool of 1,196,048 tokens.
    return out


def ceiling_request_size(reading: Reading, ceiling: float | None) -> float | None:
    """The request size behind an observed-mix ``ceiling``, at which a change's ceiling is compared (the what-ifs,
    the advice's effects): capacity ÷ ceiling, or on a layout pool the length of which that layout holds ``ceiling``
    (capacity ÷ ceiling there is in the engine's token units, no request length: Gemma-3 at an 8,000-token mean read
    2,548, and its what-ifs 2-7 % off plan's)."""
    if not ceiling or ceiling <= 0:
        return None
    if reading.layout_pool is not None:
        return reading.layout_pool.length_at(ceiling)
    return reading.kv_capacity_tokens / ceiling if reading.kv_capacity_tokens else None


def observed_mix_ceiling(reading: Reading, history: SeriesHistory | None) -> float | None:
    """``kvwatch_max_concurrency{basis="observed_mix"}`` of this poll (what the advice's limit and the what-ifs
    start from)."""
    return max_concurrency(reading, mean_request_kv_tokens(reading, history), None).get("observed_mix")


def derive(reading: Reading, history: SeriesHistory | None, max_model_len: int | None = None,
           extra: Mapping[str, Any] | None = None) -> SeriesState:
    """The exported view of one series (history may be None for a one-shot ``kvwatch check``)."""
    parts = _mean_parts(reading, history, RATE_WINDOW_SECONDS)  # (once: both means are read from it)
    mean_tokens = sum(parts) if parts is not None else None
    ceilings = max_concurrency(reading, _kv_tokens(reading, parts), max_model_len)
    headroom = None
    usage = reading.kv_usage_ratio
    # Room needs a known fill, and an engine awake to take requests: without the usage, "ceiling - running" was
    # exported uncapped (27.6 of 30.6 for an engine whose usage read NaN), and an asleep engine's into the fleet's sum.
    if "observed_mix" in ceilings and reading.requests_running is not None and usage is not None \
            and 0.0 <= usage <= 1.0 and not reading.asleep:
        ceiling = ceilings["observed_mix"]
        # No more requests fit than the free tokens hold, at the ceiling's request size: KV held by no running
        # request (a PD server's transfers, a leak) left "ceiling - 0" for a cache 97 % full.
        headroom = min(ceiling - reading.requests_running, (1.0 - usage) * ceiling)
    rate = history.rate("preemptions_total", RATE_WINDOW_SECONDS) if history is not None else None
    return SeriesState(
        reading=reading,
        preemptions_per_second=rate,
        max_concurrency=MappingProxyType(ceilings),
        concurrency_headroom=headroom,
        mean_request_tokens=mean_tokens,
        extra=MappingProxyType(dict(extra or {})),
    )
