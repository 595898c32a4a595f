"""Capacity findings for ``check`` (and the sidecar's log): what the engine's own numbers say is wrong (pure).

- ``vllm_will_not_start``: the settings kvwatch was given describe a deployment vLLM refuses (the plan's errors,
  e.g. a --max-model-len past the model's length);
- ``capacity_mismatch``: the formula and the engine's reported pool differ by more than 10 %, with both numbers
  and the likely causes;
- ``max_model_len_mismatch``: kvwatch was given a ``--max-model-len`` other than the one the engine runs (vLLM
  >= 0.25 tells it through ``cache_config_info``);
- ``engine_setting_mismatch``: kvwatch was given a ``--kv-cache-dtype``, ``--gpu-memory-utilization`` or
  ``--block-size`` other than the engine's ``cache_config_info`` says it runs (the what-ifs then offer a change the
  engine already has: FP8 KV as a 2x gain to an engine on FP8);
- ``block_size_label_stale``: a Mamba hybrid's ``block_size`` label is the size asked for, not the raised one its
  blocks hold (vllm issue 42966): kvwatch counts the blocks at the raised size;
- ``kv_usage_stuck``: KV usage near 100 % with nothing running: blocks are not being freed (a leak, vllm issue
  27073), whether or not requests queue behind it (they wait for blocks no request holds);
- ``request_exceeds_pool``: requests wait for room while nothing runs and the cache is nearly empty: the head of
  the queue needs more KV than the whole pool, and vLLM's scheduler waits for it forever (vllm issue 39734); where
  kvwatch's figures say a --max-model-len request fits, the message says the cause cannot be told (a scheduler
  stalled with free KV looks the same).

``check`` judges the last two on one snapshot; ``serve`` exports them as ``kvwatch_capacity_finding{finding}``
once the same condition (:func:`live_finding`, one definition for both) has held on every poll for
:data:`SUSTAINED_SECONDS` of the poll clock (:class:`HeldSince`), so a moment between two requests is not one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.capacity.kv import UnsizedKvDtype, kv_dtype_bytes
from kvwatch.capacity.planner import CUDA_GRAPHS_SUBTRACTED_SINCE, GRAPH_SUBTRACTING_VLLM, CapacityPlan
from kvwatch.capacity.units import GIB, percent
from kvwatch.forecast.thresholds import SATURATION_USAGE
from kvwatch.model import Reading

MISMATCH_RATIO = 0.10
# A cache_config_info whose kv_cache_max_concurrency was rounded (not vLLM's own str()) pins the length to ~0.1 %.
MAX_MODEL_LEN_TOLERANCE = 0.005
STUCK_USAGE = SATURATION_USAGE  # full, as everywhere else (the VLLMRequestExceedsPool alert reads the same)
EMPTY_USAGE = 0.05
# What vLLM >= 0.21 subtracts for CUDA graphs before sizing the cache, per GPU, as the calibration logs print
# it ("cuda_graph est/actual", tests/fixtures/calibration/vllm_kv_capacity.csv): measured 0.51 to 1.79 GiB (the
# messages' "0.5-1.8"), estimated 0.49 to 1.82; the range allows a little past the largest.
CUDA_GRAPH_GIB_RANGE = (0.5, 1.85)
# serve: how long a live finding's condition must hold, in the poll clock, before it is exported as 1.
SUSTAINED_SECONDS = 300.0
LIVE_FINDINGS = ("kv_usage_stuck", "request_exceeds_pool")


@dataclass(frozen=True)
class CapacityFinding:
    id: str
    severity: str  # critical | warning | info
    message: str


def plan_refusals(plan: CapacityPlan) -> list[CapacityFinding]:
    """The plan's errors: vLLM would not start with the settings kvwatch was given (not those of its memory sums
    where vLLM measures the pool itself: a serving 0.34 engine was told it would not start)."""
    return [CapacityFinding("vllm_will_not_start", "warning", f"With the deployment settings kvwatch was given: "
                            f"{error}. Either the settings are not the engine's, or a restart with them will fail.")
            for error in vllm_refusals(plan)]


def vllm_refusals(plan: CapacityPlan) -> tuple[str, ...]:
    """The plan's errors that are vLLM's: all but its memory budget's where the engine measures its pool
    (CapacityPlan.pool_measured_by_engine)."""
    return tuple(e for e in plan.errors if not (plan.pool_measured_by_engine and e in plan.memory_errors))


def capacity_mismatch(formula_tokens: float, reported_tokens: float | None,
                      plan: CapacityPlan | None = None, override_blocks: float | None = None,
                      engine_utilization: float | None = None,
                      page_at_most: tuple[int, int] | None = None) -> CapacityFinding | None:
    """A finding when the formula and the engine's pool differ by more than :data:`MISMATCH_RATIO`;
    ``override_blocks``: the engine's --num-gpu-blocks-override, which sizes the pool instead of the memory;
    ``engine_utilization``: the engine's own --gpu-memory-utilization (``vllm:cache_config_info``), which rules
    that cause out when the plan used it; ``page_at_most``: the newest release the page's metric names allow (a
    page detected as 0.11 was told of 0.21's CUDA-graph subtraction, the plan's default rules being newer)."""
    if not reported_tokens or reported_tokens <= 0 or formula_tokens <= 0:
        return None
    gap = formula_tokens / reported_tokens - 1
    if abs(gap) <= MISMATCH_RATIO:
        return None
    causes: list[str] = []
    if override_blocks:  # the cause, stated by the engine itself: no guesses beside it
        return CapacityFinding("capacity_mismatch", "info", (
            f"The capacity formula says {formula_tokens:,.0f} KV tokens from the GPU memory, the engine reports "
            f"{reported_tokens:,.0f}: it runs with --num-gpu-blocks-override {override_blocks:,.0f}, which fixes its "
            "pool whatever the memory. The engine's figure is the one kvwatch uses."))
    # The pool's bytes scale with its tokens in every layout (tokens are blocks // groups, or blocks ÷ blocks per
    # request): the missing memory is that share of the formula's pool, not tokens × bytes per token (which misses
    # the sliding groups' and the page-size unification's bytes).
    pool = getattr(plan, "available_kv_bytes", None)
    spec = getattr(plan, "spec", None)
    version = getattr(spec, "vllm_version", None)
    assumed = getattr(spec, "gpu_memory_utilization", None)
    utilization_known = engine_utilization is not None and assumed == engine_utilization
    # The engine's own utilization, when it differs from the plan's, is a cause only in the gap's direction (given
    # 0.8 where it runs 0.92, a formula above the engine's pool was blamed on "a lower utilization").
    utilization: list[str] = []
    if engine_utilization is None or assumed is None:
        utilization = [f"a {'lower' if gap > 0 else 'higher'} --gpu-memory-utilization than kvwatch assumed"]
    elif (engine_utilization < assumed) == (gap > 0) and engine_utilization != assumed:
        utilization = [f"--gpu-memory-utilization {assumed:g} given to kvwatch where the engine runs "
                       f"{engine_utilization:g}"]
    if gap > 0:
        missing_gib = pool * (1 - reported_tokens / formula_tokens) / GIB if pool else None
        others = [*utilization,
                  "another process on the GPU at startup (its memory counts against vLLM's profile)",
                  "larger weights (an unquantized or bigger checkpoint) or a longer profiled batch "
                  "(--max-num-batched-tokens)"]
        graphs = f"{GRAPH_SUBTRACTING_VLLM} subtracts its CUDA-graph memory before sizing the cache"
        low, high = CUDA_GRAPH_GIB_RANGE
        if (version is not None and version < CUDA_GRAPHS_SUBTRACTED_SINCE) or (
                page_at_most is not None and page_at_most < CUDA_GRAPHS_SUBTRACTED_SINCE):
            causes += others  # (these releases subtract no graph memory)
        elif missing_gib is not None and low <= missing_gib <= high:
            causes += [f"{graphs} ({missing_gib:.2f} GiB per GPU is missing, within the 0.5-1.8 GiB the logs show)",
                       *others]
        elif missing_gib is not None:  # the graphs cannot explain a gap of this size: the other causes first
            causes += [*others, f"{graphs} (not alone: {missing_gib:.2f} GiB per GPU is missing, outside the "
                                "0.5-1.8 GiB the logs show)"]
        else:  # no per-token size to weigh the gap with
            causes += [graphs, *others]
    else:
        causes += [*utilization,
                   "an FP8 KV cache (--kv-cache-dtype fp8) or quantized weights kvwatch was not told about",
                   "a smaller model, more tensor or pipeline parallelism, or --kv-cache-memory-bytes"]
    # (a PP 2 page checked without --pipeline-parallel-size read 56 % low and named every flag but that one)
    causes.append("--model/--gpu/--tensor-parallel-size/--pipeline-parallel-size/--dtype not describing this "
                  "deployment")
    return CapacityFinding("capacity_mismatch", "warning", (
        f"The capacity formula says {formula_tokens:,.0f} KV tokens, the engine reports {reported_tokens:,.0f} "
        + (f"(the formula is {percent(abs(gap))} {'higher' if gap > 0 else 'lower'}" if abs(gap) < 1 else
           f"(the formula is {formula_tokens / reported_tokens:.1f} times the engine's")
        + (f", with the engine's own --gpu-memory-utilization {engine_utilization:g}" if utilization_known else "")
        + f"). Likely causes: {'; '.join(causes)}. The engine's figure is the one kvwatch uses."))


def block_size_label_stale(label: float | None, engine_block_size: float | None) -> CapacityFinding | None:
    """A finding when the block size kvwatch counts the engine's blocks at (kvwatch.capacity.series
    .engine_block_size) is not the engine's own ``block_size`` label."""
    if label is None or engine_block_size is None or label == engine_block_size:
        return None
    return CapacityFinding("block_size_label_stale", "info", (
        f"The engine's cache_config_info says block_size {label:g}, but vLLM raises this hybrid model's block size "
        f"to {engine_block_size:g} tokens (so an attention page holds a Mamba state) and counts num_gpu_blocks in "
        "those: the label is the size asked for (vllm issue 42966, fixed by vllm PR 42967). kvwatch counts the "
        f"blocks at {engine_block_size:g} tokens."))


def max_model_len_mismatch(given: int | None, engine: int | None, source: str) -> CapacityFinding | None:
    """A finding when kvwatch's ``--max-model-len`` and the engine's differ by more than
    :data:`MAX_MODEL_LEN_TOLERANCE` (kvwatch.capacity.series.engine_max_model_len_of, which names ``source``; None:
    nothing to compare)."""
    if not given or not engine or abs(given / engine - 1) <= MAX_MODEL_LEN_TOLERANCE:
        return None
    return CapacityFinding("max_model_len_mismatch", "warning", (
        f"kvwatch was given --max-model-len {given}, but the engine runs {engine:,} ({source}). The formula and "
        f"the what-if ceilings use {given:,}, "
        f"the advice the engine's {engine:,}; give kvwatch --max-model-len {engine}, or leave it unset to "
        "take the engine's."))


# The deployment settings the engine's cache_config_info also tells: (setting, flag, label).
ENGINE_TOLD_SETTINGS = (("kv_cache_dtype", "--kv-cache-dtype", "cache_dtype"),
                        ("gpu_memory_utilization", "--gpu-memory-utilization", "gpu_memory_utilization"),
                        ("block_size", "--block-size", "block_size"))


def _kv_element_bytes(dtype: str) -> int | None:
    # "auto" is the model's dtype: 2 bytes for the models vLLM serves (an fp32 checkpoint runs as bf16/fp16)
    try:
        return kv_dtype_bytes(dtype, 2)
    except UnsizedKvDtype:
        return None


def _same_setting(name: str, given: Any, told: str, raised_block_size: int | None = None) -> bool:
    """Whether a given setting and the engine's label say the same for the plan (KV dtypes: the same size; a block
    size the plan raises, a Mamba hybrid's, the raised one: vLLM's label says it from vllm PR 42967)."""
    if name == "block_size" and raised_block_size is not None and told in (str(raised_block_size),
                                                                          f"{raised_block_size}.0"):
        return True
    if name == "kv_cache_dtype":
        a, b = str(given).lower(), told.lower()
        return a == b or (_kv_element_bytes(a) is not None and _kv_element_bytes(a) == _kv_element_bytes(b))
    try:
        return abs(float(given) - float(told)) <= 1e-9 * max(1.0, abs(float(given)))
    except ValueError:
        return True  # a label that is no number tells nothing


def raised_block_size(plan: CapacityPlan | None) -> int | None:
    """The block size a plan raises the one asked for to (a Mamba hybrid's), else None (no plan, or none raised)."""
    return int(plan.layout.block_size) if plan is not None and plan.layout.block_size_raised else None


def deployment_mismatches(max_model_len: int | None, given: Mapping[str, Any], reading: Reading,
                          plan: CapacityPlan | None) -> list[CapacityFinding]:
    """The findings of settings kvwatch was given that the engine says it runs otherwise (``max_model_len`` as
    given; ``given`` from :func:`given_engine_settings`; ``plan`` the reading's model's, or None): serve logs them,
    check reports them."""
    from kvwatch.capacity.series import engine_max_model_len_of

    found = (max_model_len_mismatch(max_model_len, *engine_max_model_len_of(reading)),
             engine_setting_mismatch(given, reading.cache_config, raised_block_size(plan)))
    return [f for f in found if f is not None]


def given_engine_settings(settings: Any) -> dict[str, Any]:
    """The :data:`ENGINE_TOLD_SETTINGS` passed to kvwatch as a flag or variable (pydantic's ``model_fields_set``)."""
    return {name: getattr(settings, name) for name, _, _ in ENGINE_TOLD_SETTINGS if name in settings.model_fields_set}


def engine_setting_mismatch(given: Mapping[str, Any], cache_config: Mapping[str, str],
                            raised_block_size: int | None = None) -> CapacityFinding | None:
    """A finding when a setting kvwatch was given (``given``: setting name -> value, only those passed) differs from
    what the engine's ``cache_config_info`` says it runs (:data:`ENGINE_TOLD_SETTINGS`). ``raised_block_size``: the
    block size kvwatch's plan raises the given one to (a Mamba hybrid), None where it raises none."""
    differ = [f"{flag} {given[name]} where the engine runs {label} {cache_config[label]}"
              for name, flag, label in ENGINE_TOLD_SETTINGS
              if name in given and given[name] is not None and cache_config.get(label) not in (None, "", "None")
              and not _same_setting(name, given[name], cache_config[label], raised_block_size)]
    if not differ:
        return None
    return CapacityFinding("engine_setting_mismatch", "warning", (
        f"kvwatch was given {'; '.join(differ)}. The formula and the what-if ceilings use what kvwatch was given, so "
        "they describe another deployment (a what-if may offer what the engine already has); give kvwatch the "
        "engine's values, or leave them unset to take the engine's."))


def kv_usage_stuck(usage: float | None, running: float | None, waiting: float | None,
                   deferred: float | None = None, queue_holds_no_kv: bool = False) -> CapacityFinding | None:
    """KV usage near full with nothing running: only a leak holds blocks then. On vLLM (``queue_holds_no_kv``) a
    waiting request holds no blocks, so requests waiting behind it wait for blocks nobody holds (limiting
    concurrency or adding capacity would not help); not when they wait for a KV transfer (``deferred``, vLLM >=
    0.20): a PD decode server allocates their blocks before they run. Elsewhere a queue may hold the KV (an SGLang
    PD prefill server runs nothing and holds its transfers, and some releases label it "unified"), so only nothing
    running and nothing waiting is a leak. An unknown count is not zero: without both counts there is no finding."""
    if usage is None or running is None or waiting is None or usage < STUCK_USAGE or running or deferred \
            or (waiting and not queue_holds_no_kv):
        return None
    queue = (f" and {waiting:g} request{'s' if waiting != 1 else ''} waiting for the blocks it holds"
             if waiting else " or waiting")
    transfer = (" (On a PD-disaggregated decode server, requests waiting for their KV transfer hold blocks too: "
                "there a short spell is normal.)" if waiting and deferred is None else "")
    return CapacityFinding("kv_usage_stuck", "critical", (
        f"KV cache is {percent(usage)} used with no request running{queue}: finished requests' blocks are not "
        "being freed (a KV leak, as in vllm issue 27073, after over-long requests were rejected). Prefix-cache "
        "blocks do not count as usage, so this is not caching, and limiting concurrency or adding capacity does "
        f"not help. If it persists, restart the engine and report the engine's version.{transfer}"))


def request_exceeds_pool(usage: float | None, running: float | None, waiting: float | None,
                         capacity_tokens: float | None = None,
                         max_model_len: int | None = None, deferred: float | None = None) -> CapacityFinding | None:
    """Requests wait for room, nothing runs, the cache is (nearly) empty: the first waiting request cannot fit at
    all. Requests ``deferred`` for a LoRA slot or a KV transfer (vLLM >= 0.20) wait for no room. Where kvwatch's own
    figures say a --max-model-len request fits the pool, the message does not claim the head is too large: the
    payload cannot tell that from a scheduler that stalled with free KV (vllm issues 45414, 53130)."""
    for_room = waiting - deferred if waiting and deferred else waiting
    if not for_room or running is None or running or usage is None or usage > EMPTY_USAGE:
        return None
    queued = f"{for_room:g} requests wait for room while nothing runs and KV is {percent(usage)} used"
    if capacity_tokens and max_model_len and max_model_len <= capacity_tokens:
        return CapacityFinding("request_exceeds_pool", "critical", (
            f"{queued}, yet by kvwatch's figures a --max-model-len request ({max_model_len:,} tokens) fits the "
            f"pool ({capacity_tokens:,.0f} tokens): the payload cannot tell a scheduler stalled with free KV (vllm "
            "issues 45414, 53130) from a head request the pool cannot hold after all (on hybrid models, vllm issue "
            "39734). Cancel the request at the head of the queue or restart the engine to unblock it, and report "
            "the engine's version."))
    size = ""
    if capacity_tokens and max_model_len:
        size = (f" The pool holds {capacity_tokens:,.0f} tokens but --max-model-len is {max_model_len:,}, so a "
                "long request can be admitted that never fits.")
    return CapacityFinding("request_exceeds_pool", "critical", (
        f"{queued}: the request at the head of the queue needs more KV than the whole pool, and vLLM's scheduler "
        f"waits for it forever (vllm issue 39734).{size} Lower --max-model-len to what the pool holds, or give the "
        "engine more KV memory; cancel the stuck request to unblock the queue."))


def live_finding(finding_id: str, usage: float | None, running: float | None, waiting: float | None,
                 capacity_tokens: float | None = None, max_model_len: int | None = None, *,
                 asleep: bool = False, prefill_server: bool = False,
                 deferred: float | None = None, queue_holds_no_kv: bool = False) -> CapacityFinding | None:
    """One of :data:`LIVE_FINDINGS` on one reading (the engine's usage, running and waiting), or None. An engine
    in vLLM's sleep mode has released its KV cache, so requests waiting while nothing runs are expected then; so
    is a PD prefill server's "nothing running" (SGLang's prefill loop never entered its running batch before 0.5.23,
    which reports the forward batch: the KV is held by requests whose cache is being transferred,
    sglang/srt/disaggregation/prefill.py)."""
    if (asleep or prefill_server) and finding_id in LIVE_FINDINGS:
        return None
    if finding_id == "kv_usage_stuck":
        return kv_usage_stuck(usage, running, waiting, deferred, queue_holds_no_kv)
    if finding_id == "request_exceeds_pool":
        return request_exceeds_pool(usage, running, waiting, capacity_tokens, max_model_len, deferred)
    raise ValueError(f"not a live finding: {finding_id!r} (known: {', '.join(LIVE_FINDINGS)})")


def leaking(reading: Reading) -> bool:
    """The ``kv_usage_stuck`` condition on one :class:`kvwatch.model.Reading`: a full cache no request holds. No
    capacity fix applies then (``check``'s kv_bound and the advisor give none); the leak finding says what to do."""
    return live_finding("kv_usage_stuck", reading.kv_usage_ratio, reading.requests_running,
                        reading.requests_waiting, asleep=reading.asleep, prefill_server=reading.prefill_server,
                        deferred=reading.requests_waiting_deferred,
                        queue_holds_no_kv=reading.waiting_holds_no_kv) is not None


@dataclass
class HeldSince:
    """How long a condition has held without a break, updated once per poll in O(1): from the first poll of the
    unbroken run that ends at the newest poll to that poll (0 when it does not hold now). A restart of the
    engine starts a new run (what came before belongs to another process)."""

    since: float | None = None

    def update(self, now: float, holds: bool, restarted: bool = False) -> float:
        if not holds:
            self.since = None
            return 0.0
        if self.since is None or restarted:
            self.since = now
        return now - self.since
