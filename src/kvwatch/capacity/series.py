"""One capacity per series: which KV capacity every consumer uses, and where it came from (pure).

The engine's own figures come first, then the model/deployment settings:

1. ``engine_kv_cache_size_tokens``: vLLM's ``cache_config_info{kv_cache_size_tokens}`` (>= ~0.25, per engine);
2. ``engine_num_gpu_blocks``: ``num_gpu_blocks / engines × block_size`` from the same metric (the adapter's
   fallback), divided among the model's KV groups when the model is known (vLLM 0.9-0.19 on sliding-window
   and hybrid models; without the model it over-states by the group count); ``engine_metric``: a capacity
   the adapter read elsewhere than ``cache_config_info``;
3. ``formula``: the capacity plan built from the settings and the engine's cache_config_info values;
4. ``unknown``.

The pool in bytes (vllm issue 26850 asks vLLM to export it; kvwatch does) follows the same order: the engine's
``kv_cache_memory_bytes`` when vLLM was given it, else the engine's blocks × the plan's bytes per block row, else
the plan's budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvwatch.capacity.kv import LayoutPool, blocks_per_group_tokens, max_concurrency_at_max_model_len
from kvwatch.capacity.planner import CapacityPlan
from kvwatch.derived import block_pool, blocks_shared_by_groups
from kvwatch.engines.vllm import engine_max_model_len, label_number
from kvwatch.model import CAPACITY_UNDETERMINED, VLLM, Reading
from kvwatch.plausible import MAX_COUNT

SOURCES = ("engine_kv_cache_size_tokens", "engine_num_gpu_blocks", "engine_metric", "formula", "unknown")


def max_model_len_of(reading: Reading, given: int | None) -> int | None:
    """The ``--max-model-len`` a series runs: the engine's own where it says (vLLM >= 0.25 tells it through
    cache_config_info: kvwatch.engines.vllm.engine_max_model_len; SGLang exports its context length as a metric,
    ``Reading.max_model_len``), else the one kvwatch was given, else None
    (unknown). The engine's wins: a fix must start from what the engine runs (a wrong --max-model-len given to
    kvwatch made "lower it" paste a longer length), and ``max_model_len_mismatch`` reports the difference. The
    given one stands where the labels allow it: the engine's is derived from a concurrency label that may be
    rounded, and a given length the labels reproduce within that rounding is no contradiction."""
    if given and engine_max_model_len(reading.cache_config) and _labels_allow(reading.cache_config, given):
        return given
    return engine_max_model_len_of(reading)[0] or given


VLLM_MAX_MODEL_LEN_SOURCE = "vllm:cache_config_info: kv_cache_size_tokens / kv_cache_max_concurrency"


def engine_max_model_len_of(reading: Reading) -> tuple[int | None, str]:
    """The engine's own max model length and where it comes from: vLLM's cache_config_info labels, else a metric
    the engine exports (SGLang's context_len, ``Reading.max_model_len``); (None, "") when it says neither."""
    engine = engine_max_model_len(reading.cache_config)
    if engine:
        return engine, VLLM_MAX_MODEL_LEN_SOURCE
    own = getattr(reading, "max_model_len", None)
    return (int(own), "sglang:context_len") if own else (None, "")


def _labels_allow(config: Any, length: int) -> bool:
    """Whether ``kv_cache_size_tokens = int(kv_cache_max_concurrency × length)`` holds for a concurrency within the
    rounding of its label (as written: "20.0" pins it to ±0.05)."""
    tokens, text = label_number(config.get("kv_cache_size_tokens")), str(config.get("kv_cache_max_concurrency", ""))
    concurrency = label_number(text)
    if tokens is None or concurrency is None:
        return False
    decimals = len(text.split(".", 1)[1]) if "." in text and "e" not in text.lower() else 0
    half = 0.5 * 10.0 ** -decimals if decimals else 0.0
    return int((concurrency - half) * length) <= tokens <= int((concurrency + half) * length)


@dataclass(frozen=True)
class SeriesCapacity:
    tokens: float | None  # the capacity every consumer uses
    source: str  # one of SOURCES
    plan: CapacityPlan | None = None  # the formula's plan (what-ifs, advice); None when the model is not known
    pool_bytes: float | None = None  # the KV pool per GPU
    pool_source: str | None = None  # engine_kv_cache_memory_bytes | engine_num_gpu_blocks | engine_tokens | formula

    @property
    def formula_tokens(self) -> int | None:
        return self.plan.kv_cache_tokens if self.plan is not None else None

    def apply(self, reading: Reading) -> Reading:
        """The reading with this capacity: filled in where the engine reported none, and the engine's blocks
        divided among the model's KV groups (``_engine_block_tokens``), with vLLM's concurrency at max-model-len
        from them where the engine does not report it (:func:`engine_max_concurrency`); other readings are
        unchanged."""
        if self.source == "unknown" and reading.kv_capacity_tokens is not None:
            return replace(reading, kv_capacity_tokens=None)  # the adapter's figure, which resolve ruled out
        if reading.kv_capacity_tokens is None and self.tokens is not None:
            # used tokens follow (usage × capacity); the reading remembers that this is the formula's figure
            reading = replace(reading, kv_capacity_tokens=self.tokens, capacity_source="formula")
            concurrency = reading.kv_max_concurrency
            if concurrency is None and self.plan is not None and self.plan.spec.max_model_len:
                # vLLM's sum on the formula's blocks: capacity ÷ max_model_len charged every group every token
                # (Gemma-3 at 32k: 0.9 beside the advice's 2.4)
                concurrency = self.plan.max_concurrency_at_max_model_len
            return replace(reading, layout_pool=layout_pool(reading, self.plan), kv_max_concurrency=concurrency)
        block_size = engine_block_size(reading, self.plan)
        if block_size != reading.block_size:  # every consumer counts the blocks at the size they hold
            reading = replace(reading, block_size=block_size)
        if (pool := layout_pool(reading, self.plan)) is not None:
            reading = replace(reading, layout_pool=pool)
        concurrency = engine_max_concurrency(reading, self.plan)
        if self.source == "engine_num_gpu_blocks" and (self.tokens != reading.kv_capacity_tokens
                                                        or concurrency != reading.kv_max_concurrency):
            return replace(reading, kv_capacity_tokens=self.tokens, kv_max_concurrency=concurrency)
        return reading


def engine_block_size(reading: Reading, plan: CapacityPlan | None) -> float | None:
    """The tokens one of the engine's blocks holds: its ``block_size`` label, except where that label is stale. On a
    Mamba hybrid vLLM raises the block size so that an attention page holds a Mamba state; from 0.20 the worker does
    it and, until vllm PR 42967 (May 2026), ``cache_config_info`` kept the size asked for (vllm issue 42966:
    Qwen3.6-35B-A3B ran 528-token blocks, labelled 16), while ``num_gpu_blocks`` counts the raised blocks. A label
    equal to the size kvwatch's layout raises (by vLLM's rule, kvwatch.capacity.mamba.attention_block_size) is
    that stale one: the blocks hold the layout's size."""
    if plan is not None and plan.layout.block_size_raised and reading.block_size == plan.layout.requested_block_size:
        return float(plan.layout.block_size)
    return reading.block_size


def formula_in_engine_terms(plan: CapacityPlan, source: str) -> float:
    """The formula's capacity in the engine figure's own terms (``kvwatch_formula_kv_capacity_tokens``, and what
    ``capacity_mismatch`` compares). From its blocks (no kv_cache_size_tokens label) the engine's is
    ``blocks // groups × block_size`` (:func:`_engine_block_tokens`), so the formula's is too: its
    ``kv_cache_tokens`` follows vLLM >= 0.20's ``int(concurrency × max_model_len)``, which differs on
    sliding-window and hybrid models, and 0.18-0.20.x payloads cannot say which rule their release logs."""
    if source == "engine_num_gpu_blocks":
        return float(blocks_per_group_tokens(plan.num_gpu_blocks, plan.layout.num_groups, plan.layout.block_size))
    return float(plan.kv_cache_tokens)


def layout_pool(reading: Reading, plan: CapacityPlan | None) -> LayoutPool | None:
    """The pool as the model's layout fills it: the engine's blocks where they are counted at the layout's block
    size, the plan's where the capacity is the formula's; None where the layout does not count by group (one group,
    no window: the token figure is right) or without blocks."""
    if plan is None or not plan.layout.counts_by_group or reading.engine_kind != VLLM:
        return None  # (vLLM's layout: SGLang and TensorRT-LLM lay out their pools their own way)
    if reading.capacity_source == "formula":
        blocks = plan.num_gpu_blocks
    elif reading.num_gpu_blocks and engine_block_size(reading, plan) == plan.layout.block_size:
        blocks = int(reading.num_gpu_blocks)
    else:
        return None
    return LayoutPool(plan.layout, blocks, plan.in_flight_tokens) if blocks > 0 else None


def engine_max_concurrency(reading: Reading, plan: CapacityPlan | None) -> float | None:
    """vLLM's "Maximum concurrency for max_model_len tokens per request" from the engine's own blocks and the
    model's layout (kvwatch.capacity.kv.max_concurrency_at_max_model_len: whole blocks in every KV group, a
    sliding group holding its window): on a sliding-window or hybrid model ``blocks ÷ ceil(len ÷ block_size)``
    overstates it by the groups and the window (gpt-oss-20b: 73 where vLLM says 48). The engine's own label
    when it has one; None when the layout's block size is not the engine's (:func:`engine_block_size`)."""
    if reading.kv_max_concurrency is not None:
        return reading.kv_max_concurrency
    if plan is None or not plan.spec.max_model_len or not reading.num_gpu_blocks or \
            engine_block_size(reading, plan) != plan.layout.block_size:
        return None  # (a plan's default length is vLLM's default, not what the engine was started with)
    return max_concurrency_at_max_model_len(plan.layout, int(reading.num_gpu_blocks), plan.max_model_len,
                                            plan.in_flight_tokens)


def _engine_block_tokens(reading: Reading, plan: CapacityPlan | None, kv_groups: int | None) -> float:
    """The engine's pool in tokens from its blocks. The adapter's ``blocks × block_size`` is right for one KV
    group; a sliding-window or hybrid model's groups (interleaved layers, Mamba layers) share the pool, and
    vLLM 0.9-0.19 reports ``blocks // groups × block_size`` (kvwatch.capacity.kv.reported_kv_cache_tokens).
    The payload does not say how many groups there are (vLLM labels ``sliding_window`` only on models whose every
    layer slides, one group): the model's layout does, when kvwatch knows the model (``plan``, or
    ``kv_groups`` from the architecture alone when no plan could be built)."""
    groups = plan.layout.num_groups if plan is not None else kv_groups or 1
    block_size = engine_block_size(reading, plan)
    if (groups <= 1 and block_size == reading.block_size) or not reading.num_gpu_blocks or not block_size:
        return float(reading.kv_capacity_tokens)
    return float(blocks_per_group_tokens(int(reading.num_gpu_blocks), groups, int(block_size)))


def resolve(reading: Reading, plan: CapacityPlan | None, kv_groups: int | None = None) -> SeriesCapacity:
    """The capacity of one series: the engine's figures first, then the plan (docstring above). ``kv_groups``:
    the model's KV groups when it is known but no plan could be built (no card given)."""
    config = reading.cache_config
    engine_tokens = label_number(config.get("kv_cache_size_tokens"))
    if reading.capacity_source == CAPACITY_UNDETERMINED:
        tokens, source = None, "unknown"  # two configurations on the page: neither, nor the formula's
    elif reading.capacity_source == "formula" and plan is not None:
        tokens, source = float(plan.kv_cache_tokens), "formula"  # filled in before (SeriesCapacity.apply)
    elif engine_tokens is not None and 0 < engine_tokens <= MAX_COUNT:
        # (above 2^53 no count: implausible_values says it is ignored, and it was the capacity all the same)
        tokens, source = float(engine_tokens), "engine_kv_cache_size_tokens"
    elif reading.kv_capacity_tokens and label_number(config.get("num_gpu_blocks")):
        if plan is None and not kv_groups and blocks_shared_by_groups(config):
            # a Mamba hybrid kvwatch does not know: blocks × block_size over-states by its groups, their number
            # unknown (check's capacity_groups_unknown says so)
            tokens, source = None, "unknown"
        else:
            tokens, source = _engine_block_tokens(reading, plan, kv_groups), "engine_num_gpu_blocks"
    elif reading.kv_capacity_tokens:  # a capacity the adapter read elsewhere than cache_config_info
        tokens, source = float(reading.kv_capacity_tokens), "engine_metric"
    elif plan is not None and plan.will_start and reading.engine_kind == VLLM:
        # (the formula is vLLM's sums: SGLang and TensorRT-LLM size their pools their own way, so theirs is unknown)
        tokens, source = float(plan.kv_cache_tokens), "formula"
    else:
        tokens, source = None, "unknown"
    pool, pool_source = None, None
    memory = label_number(config.get("kv_cache_memory_bytes"))
    if memory is not None and memory > 0:
        pool, pool_source = float(memory), "engine_kv_cache_memory_bytes"
    elif plan is not None and plan.layout.bytes_per_block_row > 0 and reading.num_gpu_blocks and (
            block_pool(reading)[0] is not None or source == "engine_num_gpu_blocks"):
        # (the blocks sized the tokens above: a reading already carrying them divided among KV groups fails
        # block_pool's ratio, and gpt-oss's pool read the formula's 37.5 GB for the engine's 3.6)
        pool, pool_source = reading.num_gpu_blocks * float(plan.layout.bytes_per_block_row), "engine_num_gpu_blocks"
    elif plan is not None and source == "engine_metric" and tokens and not plan.layout.is_hybrid \
            and plan.kv_bytes_per_token > 0:
        # an engine that reports tokens, not blocks (SGLang's max_total_num_tokens): its pool is those tokens'
        # bytes; the formula's budget stood in, some 25 GB off on the GPU memory outside the KV cache
        pool, pool_source = tokens * float(plan.kv_bytes_per_token), "engine_tokens"
    elif plan is not None and plan.available_kv_bytes > 0 and reading.engine_kind == VLLM:
        pool, pool_source = float(plan.available_kv_bytes), "formula"
    return SeriesCapacity(tokens, source, plan, pool, pool_source)
