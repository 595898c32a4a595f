"""The advisor: when the KV cache is filling or saturated, the fixes, cheapest first, with their effect.

The tutorial's decision loop, in order of cost: limit concurrency at the gateway (free, immediate), lower
``--max-model-len`` (a restart; only when observed requests sit far below it), quantize the weights, then store
the KV cache in FP8 (each a restart and a quality check; they need the model to size the gain), add tensor
parallelism (the next size vLLM accepts, within one node) or, beyond the node, a replica. Every fix that changes
an engine setting carries ``engine_args``, pasteable onto that engine's command line in its own flag names
(vLLM, SGLang, TensorRT-LLM's ``trtllm-serve``: :data:`ENGINE_FLAGS`); a concurrency limit carries
``concurrency``.
Capacities are the engine's reported pool when known; the capacity model's what-if plans only scale it.
Pure: the caller passes the forecast's numbers and, when the model is known, the capacity plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvwatch.derived import ceiling_request_size
from kvwatch.forecast.thresholds import SATURATION_USAGE, whole_requests
from kvwatch.model import SGLANG, TENSORRT_LLM, VLLM, Histogram

if TYPE_CHECKING:  # types only: the advisor loads neither the capacity model nor the forecaster
    from kvwatch.capacity.architecture import ModelArch
    from kvwatch.capacity.planner import CapacityPlan
    from kvwatch.forecast.forecaster import ForecastResult
    from kvwatch.model import Reading

LIMIT_CONCURRENCY = "limit_concurrency"
LOWER_MAX_MODEL_LEN = "lower_max_model_len"
QUANTIZE_WEIGHTS = "quantize_weights"
QUANTIZE_KV_CACHE = "quantize_kv_cache"
ADD_TENSOR_PARALLELISM = "add_tensor_parallelism"
# The last fix when more tensor parallelism cannot help (no size vLLM accepts fits the node, it would not raise the
# ceiling, or --num-gpu-blocks-override fixes the pool): labelled add_tensor_parallelism, it named a fix doing nothing.
ADD_REPLICA = "add_replica"
ACTIONS: tuple[str, ...] = (LIMIT_CONCURRENCY, LOWER_MAX_MODEL_LEN, QUANTIZE_WEIGHTS, QUANTIZE_KV_CACHE,
                            ADD_TENSOR_PARALLELISM, ADD_REPLICA)
ADVISE_IN_STATES: frozenset[str] = frozenset({"filling", "bottleneck"})
# Lower --max-model-len only when the longest observed request is below this share of it.
MAX_MODEL_LEN_SLACK = 0.5
# The concurrency limit keeps KV usage under the forecaster's saturation threshold.
LIMIT_USAGE = SATURATION_USAGE
DEFAULT_GPUS_PER_NODE = 8
# Triton's TensorRT-LLM backend: the same engine, but configured in the engine build (trtllm-build) and the model's
# config.pbtxt, not by launch flags (kvwatch.check picks it for version_range "triton-backend*").
TRITON_TENSORRT_LLM = "tensorrt-llm-triton"
ENGINE_NAMES = {VLLM: "vLLM", SGLANG: "SGLang", TENSORRT_LLM: "TensorRT-LLM",
                TRITON_TENSORRT_LLM: "Triton's TensorRT-LLM backend"}
# Where a kind whose settings are no flags takes them (its name carried this, nested in every sentence naming it)
SETTINGS_PLACE = {TRITON_TENSORRT_LLM: "in the engine build and its config.pbtxt"}
# Kinds whose settings are no command-line flags: their fixes carry no engine_args.
CONFIGURED_NOT_LAUNCHED = frozenset({TRITON_TENSORRT_LLM})
# Each engine's own launch flag for what a fix changes (from each engine's server-argument reference:
# vLLM's engine args, SGLang's server arguments, trtllm-serve's options). None: no launch flag for it.
ENGINE_FLAGS: dict[str, dict[str, str | None]] = {
    VLLM: {"concurrency": "--max-num-seqs", "max_model_len": "--max-model-len", "quantization": "--quantization",
           "tensor_parallel": "--tensor-parallel-size", "token_budget": "--max-num-batched-tokens"},
    SGLANG: {"concurrency": "--max-running-requests", "max_model_len": "--context-length",
             "quantization": "--quantization", "tensor_parallel": "--tp-size", "token_budget": "--max-prefill-tokens"},
    # TensorRT-LLM takes the weights' quantization from the checkpoint it serves, not from a flag.
    TENSORRT_LLM: {"concurrency": "--max_batch_size", "max_model_len": "--max_seq_len", "quantization": None,
                   "tensor_parallel": "--tp_size", "token_budget": "--max_num_tokens"},
    TRITON_TENSORRT_LLM: {"concurrency": "max_batch_size", "max_model_len": "max_seq_len", "quantization": None,
                          "tensor_parallel": "tp_size", "token_budget": "max_num_tokens"},
}


def engine_flags(engine_kind: str) -> dict[str, str | None]:
    """The engine's launch flags for what a fix changes (vLLM's for an engine kvwatch has none for)."""
    return ENGINE_FLAGS.get(engine_kind, ENGINE_FLAGS[VLLM])


# How each engine is told to keep its KV cache in FP8, and the flags for it (None: no launch flag).
FP8_KV_CACHE = {VLLM: "--kv-cache-dtype fp8", SGLANG: "--kv-cache-dtype fp8_e4m3",
                TENSORRT_LLM: "kv_cache_config.dtype: fp8 in trtllm-serve's options YAML, --config or "
                              "--extra_llm_api_options",
                TRITON_TENSORRT_LLM: "an engine built with an FP8 KV cache, trtllm-build"}
FP8_KV_CACHE_ARGS: dict[str, tuple[str, ...] | None] = {VLLM: ("--kv-cache-dtype", "fp8"),
                                                        SGLANG: ("--kv-cache-dtype", "fp8_e4m3")}


@dataclass(frozen=True)
class Advice:
    action: str
    rank: int  # 1 = do this first
    message: str  # what to do, in the operator's terms
    projected_effect: str  # what it buys, in numbers when they are known
    engine_args: tuple[str, ...] | None = None  # flags to paste onto the engine's command line, when it has them
    concurrency: int | None = None  # the concurrency limit, when the fix limits concurrency
    engine_kind: str = VLLM  # whose flags engine_args are

    @property
    def vllm_args(self) -> tuple[str, ...] | None:
        """``engine_args`` on a vLLM series (the name the JSON had before other engines), else None."""
        return self.engine_args if self.engine_kind == VLLM else None

    def as_json(self) -> dict[str, Any]:
        def listed(args: tuple[str, ...] | None) -> list[str] | None:
            return list(args) if args is not None else None

        return {"action": self.action, "rank": self.rank, "message": self.message,
                "projected_effect": self.projected_effect, "engine_args": listed(self.engine_args),
                "vllm_args": listed(self.vllm_args), "concurrency": self.concurrency}


def _top_bucket_bound(histogram: Histogram) -> float | None:
    """The upper bound of the highest bucket holding a request (no request is longer); None when that is the
    ``+Inf`` bucket or there are no buckets."""
    previous = 0.0
    top = None
    for bound, cumulative in zip(histogram.bounds, histogram.cumulative, strict=False):
        if cumulative > previous:
            top = bound
        previous = cumulative
    return top if top is not None and math.isfinite(top) else None


def longest_request_bound(lengths: Mapping[str, Histogram]) -> float | None:
    """At most this many tokens (prompt + output) in any request the histograms counted: the sum of the two
    highest occupied buckets' upper bounds. None without both histograms' buckets, or when a request sits in a
    ``+Inf`` bucket: the longest request is then unknown, and no --max-model-len is proposed from a guess."""
    prompt, output = lengths.get("prompt"), lengths.get("generation")
    if prompt is None or output is None:
        return None
    top_prompt, top_output = _top_bucket_bound(prompt), _top_bucket_bound(output)
    return top_prompt + top_output if top_prompt is not None and top_output is not None else None


def next_tensor_parallel_size(arch: ModelArch, current: int, gpus_per_node: int) -> int | None:
    """The smallest tensor-parallel size above ``current`` that vLLM accepts (tensor_parallel_refusal) and one
    node holds, else None."""
    from kvwatch.capacity.architecture import tensor_parallel_refusal

    for tp in range(current + 1, gpus_per_node + 1):
        if tensor_parallel_refusal(arch, tp) is None:
            return tp
    return None


def advise(
    state: str,
    *,
    recommended_max_concurrency: int | None = None,
    running: float | None = None,
    capacity_tokens: float | None = None,
    capacity_plan: CapacityPlan | None = None,
    longest_request_tokens: float | None = None,
    max_model_len: int | None = None,
    kv_tokens_per_request: float | None = None,
    concurrency_ceiling: float | None = None,
    ceiling_request_tokens: float | None = None,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    engine_kind: str = VLLM,
    ranks_per_flag: int = 1,
    pool_blocks: float | None = None,
    fixed_blocks: float | None = None,
    other_ranks: Sequence[tuple[str | None, float]] = (),
) -> list[Advice]:
    """Ranked fixes for ``state`` (empty unless filling or bottleneck).

    ``capacity_tokens`` is the engine's KV pool when known (else unknown: the plan's gains are then ratios alone);
    ``capacity_plan`` is a :class:`kvwatch.capacity.CapacityPlan` when the model is known: its what-if
    scenarios size the quantization and tensor-parallel gains, as ratios applied to that pool.
    ``kv_tokens_per_request`` is the live average of KV tokens per running request (the observed mix) and
    ``concurrency_ceiling`` the observed-mix ceiling the caller reports beside the advice: the limit never
    exceeds the threshold's share of it, and the ceilings in the effects start from it, compared at
    ``ceiling_request_tokens`` (kvwatch.derived.ceiling_request_size; else the pool ÷ the ceiling). ``engine_kind``
    names the engine whose flags the fixes give; ``ranks_per_flag`` is how many data-parallel ranks of the model one
    server runs (SGLang's dp_rank series): the gateway's limit is the per-rank one times that, and with
    --enable-dp-attention SGLang divides --max-running-requests over them (tp_worker.py), which the payload does
    not say, so the message gives both values and ``engine_args`` the per-rank one. ``pool_blocks``: the engine's
    own blocks in the plan's block size, for the worst-case ceilings of the max-model-len fix. ``fixed_blocks``: the
    engine's ``--num-gpu-blocks-override``, which fixes the pool: no quantization fix, and a replica or removing the
    override instead of more tensor parallelism (neither frees KV while it is set). ``other_ranks``: (engine,
    observed-mix ceiling) of the server's other ranks of the model: one flag limits every rank, so the message names a
    rank whose own mix fits fewer (and its limit), else what the limit costs a rank whose own mix fits more.
    """
    if state not in ADVISE_IN_STATES:
        return []
    flags = engine_flags(engine_kind)
    plan_tokens = float(capacity_plan.kv_cache_tokens) if capacity_plan is not None and \
        capacity_plan.kv_cache_tokens else None
    # capacity_tokens: the engine's pool (the formula's where the engine reports none and kvwatch.capacity.series took
    # it), never the plan's beside a capacity left unknown on purpose (two pods' cache_config_info sets on one page,
    # SGLang's and TensorRT-LLM's pools): the gains are then the plan's ratios alone.
    ceiling = concurrency_ceiling
    if ceiling is None and capacity_tokens and kv_tokens_per_request:
        ceiling = capacity_tokens / kv_tokens_per_request
    # The request size behind that ceiling, at which a change's ceiling is sized (as serve's what-if gauges are)
    size = ceiling_request_tokens or (
        capacity_tokens / ceiling if capacity_tokens and ceiling else kv_tokens_per_request)

    def ceiling_gain(changed: CapacityPlan | None) -> float | None:
        if capacity_plan is None or not size:
            return None
        from kvwatch.capacity.whatif import ceiling_ratio

        return ceiling_ratio(capacity_plan, changed, size)

    out: list[Advice] = []
    # (with nothing running, a limit on running requests frees none of the KV held: transfers, or a leak)
    limit = concurrency_limit(recommended_max_concurrency, ceiling) if running != 0 else None
    if limit is not None:
        out.append(_limit_advice(limit, running, ceiling, engine_kind, ranks_per_flag, other_ranks))
    lowered = _lower_max_model_len(max_model_len, longest_request_tokens)
    if lowered is not None and max_model_len is not None and longest_request_tokens is not None:
        out.append(_max_model_len_advice(max_model_len, lowered, longest_request_tokens, flags["max_model_len"],
                                         _worst_case_ceilings(capacity_plan, pool_blocks, capacity_tokens,
                                                              max_model_len, lowered)))
    if not fixed_blocks:  # (while --num-gpu-blocks-override fixes the pool, neither quantization adds KV)
        out += _quantization_advice(capacity_plan, _whatif(capacity_plan), plan_tokens, capacity_tokens, ceiling,
                                    engine_kind, ceiling_gain)

    if fixed_blocks:
        out.append(_fixed_pool_advice(fixed_blocks, capacity_tokens, ceiling))
    else:
        out.append(_tensor_parallel_advice(capacity_plan, plan_tokens, capacity_tokens, ceiling, gpus_per_node,
                                           flags["tensor_parallel"] or "--tensor-parallel-size", ceiling_gain))
    launched = engine_kind not in CONFIGURED_NOT_LAUNCHED
    return [Advice(a.action, rank, a.message, a.projected_effect, a.engine_args if launched else None,
                   a.concurrency, engine_kind) for rank, a in enumerate(out, 1)]


def _limit_advice(limit: int, running: float | None, ceiling: float | None, engine_kind: str, ranks_per_flag: int,
                  other_ranks: Sequence[tuple[str | None, float]]) -> Advice:
    """Limit concurrency to ``limit`` (per data-parallel rank where one server runs ``ranks_per_flag`` of them; see
    :func:`advise` for ``other_ranks``)."""
    flags, engine = engine_flags(engine_kind), ENGINE_NAMES.get(engine_kind, engine_kind)
    now = f"; now {running:.0f} running" if running is not None else ""
    held = f"the KV cache holds ~{ceiling:.1f} at the observed mix{now}" if ceiling else now.lstrip("; ")
    ranks = max(1, ranks_per_flag)
    ranks_note = ""
    others = other_ranks if ranks > 1 else ()
    tightest = min(others, key=lambda rank: rank[1], default=None)
    roomiest = max(others, key=lambda rank: rank[1], default=None)
    smallest = limit  # the tightest rank's limit: the server's total at the gateway is that times the ranks
    if tightest is not None and (tight := concurrency_limit(None, tightest[1])) is not None and tight < limit:
        smallest = tight
        # One flag limits every rank: this limit overfills a rank whose mix fits fewer (15 where 13.5 fit). Said,
        # not applied: one poll's mix of a quiet rank (one long request) cut a busy rank's limit from 15 to 3.
        ranks_note = (f" One flag limits every rank: engine {tightest[0]}'s own mix fits only ~{tightest[1]:.1f} "
                      f"(its limit would be {tight}); pass {tight} instead while its requests stay that large.")
    elif roomiest is not None and (roomy := concurrency_limit(None, roomiest[1])) is not None and roomy > limit:
        ranks_note = (f" The limit holds engine {roomiest[0]} to {limit} too, though its own mix fits "
                      f"~{roomiest[1]:.1f} (its limit would be {roomy}): the ranks' request mixes differ, and one "
                      "flag cannot follow both.")
    # (the server's total is the smallest rank's limit times the ranks, as docs/runbooks.md builds it from
    # kvwatch_recommended_max_concurrency: this rank's limit times them overfilled the tightest rank)
    tightest_says = f", by engine {tightest[0]}'s {smallest}" if smallest < limit and tightest is not None else ""
    gateway = f"{limit} per data-parallel rank ({smallest * ranks} for the server's {ranks}{tightest_says})" \
        if ranks > 1 else f"{limit}"
    # vLLM's engine cores each schedule their own requests (the flag is per engine); SGLang divides the flag
    # over its ranks only with --enable-dp-attention, which the payload does not say.
    dp_attention = "" if ranks == 1 else (
        f"; {flags['concurrency']} applies to each engine" if engine_kind == VLLM else
        f"; with --enable-dp-attention {engine} divides the flag over its {ranks} ranks: pass {smallest * ranks} then")
    return Advice(
        LIMIT_CONCURRENCY, 0,
        f"Limit concurrency to {gateway} at the gateway, or "
        + (f"set {flags['concurrency']} {limit} {SETTINGS_PLACE[engine_kind]} of {engine}"
           if engine_kind in SETTINGS_PLACE else f"pass {flags['concurrency']} {limit} to {engine}") +
        f"{dp_attention}" + (f" ({held})." if held else ".") + ranks_note,
        f"KV usage stays under {LIMIT_USAGE:.0%} at the observed request mix; excess requests wait at the "
        "gateway instead of being preempted and recomputed.",
        engine_args=_args(flags["concurrency"], limit), concurrency=limit,
    )


def _max_model_len_advice(max_model_len: int, lowered: int, longest: float, flag: str | None,
                          ceilings: tuple[float | None, float | None]) -> Advice:
    """Lower ``max_model_len`` to ``lowered`` (``flag``: the engine's), with the worst-case ceilings before and after
    (:func:`_worst_case_ceilings`)."""
    now_ceiling, new_ceiling = ceilings
    factor = new_ceiling / now_ceiling if now_ceiling else max_model_len / lowered
    worst = f" (from {now_ceiling:.1f} to {new_ceiling:.1f} requests of full length)" if now_ceiling else ""
    return Advice(
        LOWER_MAX_MODEL_LEN, 0,
        f"Lower {flag} from {max_model_len} to {lowered}: no request since the engine "
        f"started was longer than {longest:,.0f} tokens (the length histograms' "
        "buckets); a longer one would then be refused.",
        f"The worst-case concurrency ceiling rises {factor:.1f}x{worst}. With chunked prefill on (vLLM V1) the KV "
        "pool itself is unchanged, so usage at today's mix does not drop; with it off (the V0 engine's default up "
        "to 32K tokens) a step holds a whole prompt, so the profiling peak shrinks and the pool grows a little.",
        engine_args=_args(flag, lowered),
    )


def _quantization_advice(capacity_plan: CapacityPlan | None, whatif: Mapping[str, Any], plan_tokens: float | None,
                         base_tokens: float | None, ceiling: float | None, engine_kind: str,
                         ceiling_gain: Callable[[CapacityPlan | None], float | None]) -> list[Advice]:
    """FP8 weights, then an FP8 KV cache, each where the plan's what-if gains tokens."""
    flags, engine = engine_flags(engine_kind), ENGINE_NAMES.get(engine_kind, engine_kind)
    out: list[Advice] = []
    quantized = whatif.get("fp8_weights")
    if quantized is not None and plan_tokens and quantized.kv_cache_tokens and \
            quantized.kv_cache_tokens > plan_tokens:
        gain = quantized.kv_cache_tokens / plan_tokens
        how = (f"{flags['quantization']} fp8" if flags["quantization"] else
               f"serve an FP8-quantized checkpoint: {engine} takes the quantization from the checkpoint")
        measured = capacity_plan is not None and capacity_plan.pool_measured_by_engine
        out.append(Advice(
            QUANTIZE_WEIGHTS, 0,
            f"Quantize the weights to FP8 ({how}): frees GPU memory for the KV cache.",
            MEASURED_POOL_EFFECT if measured else
            _capacity_text(base_tokens, gain, ceiling, ceiling_gain(quantized.plan)) + ".",
            engine_args=_args(flags["quantization"], "fp8"),
        ))
    # Its own fix, not a side note of the weights' (it vanished with them: weights already FP8, say), and often
    # the larger gain: one byte per KV element instead of the model's two.
    kv_fp8 = whatif.get("fp8_kv_cache")
    if capacity_plan is not None and kv_fp8 is not None and plan_tokens and kv_fp8.kv_cache_tokens and \
            kv_fp8.kv_cache_tokens > plan_tokens:
        from kvwatch.capacity.whatif import kv_element_bytes

        out.append(Advice(
            QUANTIZE_KV_CACHE, 0,
            f"Store the KV cache in FP8 ({FP8_KV_CACHE.get(engine_kind, FP8_KV_CACHE[VLLM])}): one byte per KV "
            f"element instead of the {kv_element_bytes(capacity_plan.spec)} the plan has (a restart, and a quality "
            "check on your own prompts).",
            _capacity_text(base_tokens, kv_fp8.kv_cache_tokens / plan_tokens, ceiling, ceiling_gain(kv_fp8.plan)) + ".",
            engine_args=FP8_KV_CACHE_ARGS.get(engine_kind),
        ))
    return out


# Where vLLM >= 0.34 measures its own pool (CapacityPlan.pool_measured_by_engine), memory freed by a change adds to
# that pool; kvwatch's sums are 0.33's and scaled it by their own ratio (FP8 weights x4.68 on a full card).
MEASURED_POOL_EFFECT = ("More KV capacity by what it frees; vLLM >= 0.34 sizes its pool from memory it measures, which "
                        "kvwatch's sums (0.33's) do not size.")


def concurrency_limit(recommended: int | None, ceiling: float | None) -> int | None:
    """The concurrency limit kvwatch recommends (one figure: the advice's and kvwatch_recommended_max_concurrency):
    the forecaster's (95 % of the cache at the last 30 minutes' KV tokens per running request), never above
    95 % of the observed-mix ceiling reported beside it (kvwatch_max_concurrency{basis="observed_mix"}, this
    poll's mix), which bounds it alone when the forecaster has no figure yet."""
    if ceiling is None or ceiling <= 0:
        return recommended
    capped = whole_requests(LIMIT_USAGE * ceiling)
    return capped if recommended is None else min(recommended, capped)


def _args(flag: str | None, value: object) -> tuple[str, ...] | None:
    return (flag, str(value)) if flag else None


def _worst_case_ceilings(capacity_plan: CapacityPlan | None, pool_blocks: float | None, base_tokens: float | None,
                         max_model_len: int, lowered: int) -> tuple[float | None, float | None]:
    """vLLM's concurrency at ``max_model_len`` and at ``lowered``: with the model's layout (whole blocks in every KV
    group, a sliding-window group capped at its window, so halving the length does not double it) on the engine's
    blocks (``pool_blocks``, else the plan's), as the report's max-model-len ceiling; without the model, the pool's
    tokens over the length."""
    if capacity_plan is not None:
        from kvwatch.capacity.kv import max_concurrency_at_max_model_len

        blocks = int(pool_blocks or capacity_plan.num_gpu_blocks)
        layout, in_flight = capacity_plan.layout, capacity_plan.in_flight_tokens
        if blocks > 0:
            return (max_concurrency_at_max_model_len(layout, blocks, max_model_len, in_flight),
                    max_concurrency_at_max_model_len(layout, blocks, lowered, in_flight))
    if base_tokens:
        return base_tokens / max_model_len, base_tokens / lowered
    return None, None


def _capacity_text(base_tokens: float | None, gain: float, ceiling: float | None,
                   ceiling_gain: float | None = None) -> str:
    """The gain on the pool; by the plan's ratio alone where the pool is unknown (an engine kvwatch cannot size).
    ``ceiling_gain``: the change's ratio of ceilings at the observed mix (kvwatch.capacity.whatif.ceiling_ratio, as
    kvwatch_whatif_max_concurrency), else the pool's."""
    text = (f"KV capacity {base_tokens:,.0f} -> {base_tokens * gain:,.0f} tokens (x{gain:.2f})" if base_tokens else
            f"KV capacity about x{gain:.2f} (vLLM's memory sums; this engine's pool size is unknown)")
    if ceiling:
        after = ceiling * (gain if ceiling_gain is None else ceiling_gain)
        text += f"; at the observed mix the ceiling goes from {ceiling:.1f} to {after:.1f} concurrent requests"
    return text


def _fixed_pool_advice(fixed_blocks: float, base_tokens: float | None, ceiling: float | None) -> Advice:
    """The last fix while ``--num-gpu-blocks-override`` fixes the pool: memory freed by lighter weights or more
    tensor parallelism does not reach it (vLLM takes the override as the block count), so a replica, or the
    override removed so that vLLM sizes the pool from memory."""
    replica = ("a second engine with the same "
               + (f"{base_tokens:,.0f}-token KV pool" if base_tokens else "KV pool")
               + (f" doubles the ceiling for this traffic (from {ceiling:.1f} to {2 * ceiling:.1f} concurrent "
                  "requests)" if ceiling else " doubles the capacity for this traffic") + ".")
    return Advice(ADD_REPLICA, 0,
                  f"Add a replica behind the gateway, or remove --num-gpu-blocks-override ({fixed_blocks:,.0f} blocks) "
                  "so that vLLM sizes the pool from the GPU memory: while it is set, quantized weights or more tensor "
                  "parallelism add no KV.",
                  replica[0].upper() + replica[1:])


def _tensor_parallel_advice(capacity_plan: CapacityPlan | None, plan_tokens: float | None, base_tokens: float | None,
                            ceiling: float | None, gpus_per_node: int, flag: str,
                            ceiling_gain: Callable[[CapacityPlan | None], float | None]) -> Advice:
    """The next valid tensor-parallel size (``flag``: the engine's) within one node, sized by the plan; else a
    replica."""
    replica = ("Add a replica behind the gateway: a second engine with the same "
               + (f"{base_tokens:,.0f}-token KV pool" if base_tokens else "KV pool")
               + (f" doubles the ceiling for this traffic (from {ceiling:.1f} to {2 * ceiling:.1f} "
                  "concurrent requests)" if ceiling else " doubles the capacity for this traffic")
               + ", at the price of a second copy of the weights.")
    spec = getattr(capacity_plan, "spec", None)
    arch = getattr(spec, "arch", None)
    if spec is None or arch is None:
        return Advice(ADD_REPLICA, 0,
                      f"Add a replica behind the gateway, or raise {flag} to a size that divides "
                      "the model's attention heads (kvwatch names it once it can plan the deployment, which needs "
                      "the model, from --model, --model-config or a preset matching model_name, the card, --gpu or "
                      "--gpu-memory-gib, and settings the engine accepts: why it could not is on stderr or in the "
                      "log).",
                      replica)
    tp = spec.tensor_parallel_size
    if capacity_plan is not None and not capacity_plan.kv_cache_tokens:
        # The engine serves, and the plan at this size leaves no memory for a KV cache: it does not describe this
        # server, so a flag sized from it is a guess (an 80B model: "raise --tp-size from 1 to 2", where TP 2 has
        # no KV cache either)
        return Advice(ADD_REPLICA, 0,
                      f"Add a replica behind the gateway, or pass kvwatch --tensor-parallel-size with the {flag} this "
                      f"server runs: kvwatch's plan at {tp} leaves no memory for a KV cache, so it does not describe "
                      "this server and cannot size more tensor parallelism.", replica)
    nxt = next_tensor_parallel_size(arch, tp, gpus_per_node)
    if nxt is None:
        return Advice(ADD_REPLICA, 0,
                      f"Add a replica behind the gateway: no tensor-parallel size above {tp} that vLLM accepts for "
                      f"this model (it must divide the {arch.num_attention_heads} attention heads, and divide or be a "
                      f"multiple of the {'/'.join(map(str, arch.kv_head_counts))} KV heads) fits one "
                      f"{gpus_per_node}-GPU node "
                      "(--gpus-per-node).", replica)
    from kvwatch.capacity.whatif import tensor_parallel_plan

    replicated = ""
    most = max(arch.kv_head_counts)
    if not arch.is_mla and most < nxt:
        replicated = (f" The model's {most} KV head{'s are' if most != 1 else ' is'} replicated at this size (each GPU "
                      "keeps one, "
                      f"{nxt // most} copies of each), so the KV per token stops shrinking.")
    elif not arch.is_mla and min(arch.kv_head_counts) < nxt:
        replicated = (f" Some layers' {min(arch.kv_head_counts)} KV heads are replicated at this size: only the "
                      "other layers' KV per token shrinks.")
    elif arch.is_mla:
        replicated = " Every GPU keeps the whole MLA latent: more TP frees only the weights' share."
    more = (nxt - tp) * spec.pipeline_parallel_size  # every pipeline stage gets the wider tensor parallelism
    message = (f"Raise {flag} from {tp} to {nxt} ({more} more GPU"
               f"{'s' if more != 1 else ''} per replica), or add a replica behind the gateway.{replicated}")
    after = tensor_parallel_plan(spec, nxt)
    gain = ceiling_gain(after) if after is not None else None
    if gain is not None and gain <= 1.0:
        # (Gemma-3-1B's one KV head: "raise it to 2 ... the ceiling goes from 1535.6 to 1514.0")
        return Advice(ADD_REPLICA, 0,
                      f"Add a replica behind the gateway: raising {flag} from {tp} to {nxt} would not raise this "
                      f"ceiling (x{gain:.2f} at the observed mix).{replicated}", replica)
    if gain is not None and gain < nxt / tp:
        # The same GPUs as replicas multiply the ceiling by nxt / tp; more TP gains less where KV heads are
        # replicated or the latent is not split (MLA): a 2-KV-head model at TP 4 gained x1.05 for 2 more GPUs.
        return Advice(ADD_REPLICA, 0,
                      f"Add a replica behind the gateway: raising {flag} from {tp} to {nxt} ({more} more GPU"
                      f"{'s' if more != 1 else ''} per replica) raises this ceiling x{gain:.2f} at the observed mix "
                      f"for x{nxt / tp:.2f} the GPUs, where replicas raise it as much as their GPUs.{replicated}",
                      replica)
    if capacity_plan is not None and capacity_plan.pool_measured_by_engine:
        # (after the replica's tests: 0.33's ratio overstates a measured pool's gain, so one below them stands; one
        # above them is no size for it)
        effect = f"{MEASURED_POOL_EFFECT} {replica}"
    elif after is not None and plan_tokens:
        effect = _capacity_text(base_tokens, after.kv_cache_tokens / plan_tokens, ceiling, ceiling_gain(after)) + "."
    else:
        effect = "More KV capacity once the weights are split (the capacity model cannot size it here). " + replica
    return Advice(ADD_TENSOR_PARALLELISM, 0, message, effect, engine_args=(flag, str(nxt)))


def _whatif(capacity_plan: CapacityPlan | None) -> dict[str, Any]:
    if capacity_plan is None:
        return {}
    from kvwatch.capacity import whatif_scenarios

    try:
        return {s.name: s for s in whatif_scenarios(capacity_plan.spec)}
    except (ValueError, ArithmeticError):
        return {}  # a plan the what-if math cannot vary: advise without those numbers


def _lower_max_model_len(max_model_len: int | None, longest: float | None) -> int | None:
    """A power of two with 25 % margin over the longest observed request (prompt + output, at most this many tokens:
    :func:`longest_request_bound`), if well below the setting; None when the longest request is not known (a guess
    from the mean would cut off the tail)."""
    if not max_model_len or not longest:
        return None
    if longest > MAX_MODEL_LEN_SLACK * max_model_len:
        return None
    proposed = 2 ** math.ceil(math.log2(max(longest * 1.25, 16)))
    return proposed if proposed <= max_model_len // 2 else None


def advise_from_result(result: ForecastResult, reading: Reading | None = None, *,
                       capacity_plan: CapacityPlan | None = None,
                       max_model_len: int | None = None, concurrency_ceiling: float | None = None,
                       gpus_per_node: int = DEFAULT_GPUS_PER_NODE, engine_kind: str | None = None,
                       ranks_per_flag: int = 1, longest_request_tokens: float | None = None,
                       other_ranks: Sequence[tuple[str | None, float]] = ()) -> list[Advice]:
    """``advise`` fed from a :class:`kvwatch.forecast.ForecastResult` and core's ``Reading`` (what the
    sidecar, ``kvwatch check`` and the demo call). The longest request comes from the reading's length histograms'
    buckets, or ``longest_request_tokens`` (the sidecar's last reading of them) where this reading has none."""
    from kvwatch.capacity.findings import leaking

    if engine_kind is None:  # whose flags: the reading's engine (check names Triton's backend apart)
        engine_kind = reading.engine_kind if reading is not None else VLLM
    if reading is not None and leaking(reading):
        return []  # a full cache no request holds: no capacity fix applies (kvwatch.capacity.findings.leaking)
    if reading is not None and reading.lengths:
        longest = longest_request_bound(reading.lengths)
    else:
        longest = longest_request_tokens  # the sidecar's last reading of the buckets, where this one has none
    running = reading.requests_running if reading is not None else None
    capacity = reading.kv_capacity_tokens if reading is not None else None
    per_request = result.estimates.get("tokens_per_running_request")
    recommended = result.recommended_max_concurrency
    if reading is not None and reading.prefill_server:
        # Its KV is held by requests in transfer to the decode servers, not by the ones it runs: a limit from its
        # running count would throttle the whole prefill/decode pipeline (kvwatch.derived.max_concurrency).
        per_request = recommended = concurrency_ceiling = None
    blocks = reading.num_gpu_blocks if reading is not None and capacity_plan is not None and \
        reading.block_size == capacity_plan.layout.block_size else None
    from kvwatch.engines.vllm import override_blocks

    fixed = override_blocks(reading.cache_config) if reading is not None and engine_kind == VLLM else None
    shown = reading.tensor_parallel_ranks if reading is not None else None
    fixes = advise(
        result.state,
        recommended_max_concurrency=recommended,
        running=running,
        capacity_tokens=capacity or result.estimates.get("capacity_tokens"),
        capacity_plan=capacity_plan,
        longest_request_tokens=longest,
        max_model_len=max_model_len,
        kv_tokens_per_request=per_request,
        concurrency_ceiling=concurrency_ceiling,
        ceiling_request_tokens=ceiling_request_size(reading, concurrency_ceiling) if reading is not None else None,
        gpus_per_node=gpus_per_node,
        engine_kind=engine_kind,
        ranks_per_flag=ranks_per_flag,
        pool_blocks=blocks,
        fixed_blocks=fixed,
        other_ranks=other_ranks,
    )
    if capacity_plan is not None and shown and shown > capacity_plan.spec.tensor_parallel_size:
        return as_shown_ranks(fixes, shown)
    return fixes


def as_shown_ranks(fixes: Sequence[Advice], shown_ranks: int) -> list[Advice]:
    """``fixes`` for a server whose payload shows ``shown_ranks`` tensor-parallel ranks (SGLang's tp_rank copies),
    more than the plan kvwatch was given: a TP fix sized from the plan (a flag to paste) would raise the size "from"
    one the server does not run ("raise --tp-size from 1 to 2" on two tp_ranks), so it becomes a replica, or the size
    to tell kvwatch (check's ``tensor_parallel_mismatch`` says so; the sidecar ranked the TP fix)."""
    return [Advice(ADD_REPLICA, a.rank,
                   f"Add a replica behind the gateway, or pass kvwatch --tensor-parallel-size {shown_ranks} (the "
                   "ranks this server shows) to size a larger tensor-parallel fix.",
                   "A second engine with the same KV pool doubles the capacity for this traffic.",
                   engine_kind=a.engine_kind)
            if a.action == ADD_TENSOR_PARALLELISM and a.engine_args else a for a in fixes]
