"""The capacity plan: memory budget -> KV blocks -> tokens -> concurrency ceilings (pure core).

:class:`DeploymentSpec` is everything the sums need; :func:`plan_capacity` does them without I/O.
``DeploymentSpec.from_settings`` resolves presets and config files through :mod:`kvwatch.capacity.presets`,
the one module of the package that reads files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from kvwatch.capacity import kv, memory, quantization, support
from kvwatch.capacity.architecture import ModelArch, block_quant_split, tensor_parallel_refusal
from kvwatch.capacity.layers import MAMBA
from kvwatch.capacity.mamba import MambaConfigError
from kvwatch.capacity.quantization import CHECKPOINT_KV_FP8_SINCE
from kvwatch.capacity.units import GIB

# The current rules: default utilization 0.92, tokens = concurrency x max_model_len, CUDA graphs subtracted.
DEFAULT_VLLM_VERSION = (0, 33)
# From 0.21 vLLM subtracts its CUDA-graph memory estimate before sizing the KV cache
# (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default), unless --enforce-eager captures no graphs.
CUDA_GRAPHS_SUBTRACTED_SINCE = (0, 21)


def release(version: tuple[int, int]) -> str:
    """A vLLM release as its docs write it: (0, 21) -> "0.21"."""
    return f"{version[0]}.{version[1]}"


# The releases every text about that rule names, from the constant (the release was typed into four messages)
GRAPH_SUBTRACTING_VLLM = f"vLLM >= {release(CUDA_GRAPHS_SUBTRACTED_SINCE)}"
OLD_DEFAULT_UTILIZATION_BEFORE = (0, 20)


class SpecError(ValueError):
    """The deployment is under-specified (message names the flag that would fix it).

    ``plan_hint`` is an extra way out that only ``kvwatch plan`` has (its measured-memory flags); ``serve``
    logs the message without it.
    """

    def __init__(self, message: str, plan_hint: str = "") -> None:
        super().__init__(message)
        self.plan_hint = plan_hint


def parse_version(text: str | None) -> tuple[int, int]:
    """``"0.19.0"`` -> (0, 19); ``None`` -> the default (a current vLLM)."""
    if not text:
        return DEFAULT_VLLM_VERSION
    parts = [p for p in text.strip().lstrip("v").split(".")[:2]]
    try:
        if not parts[0].isdecimal():  # int() took "-1" (and " 1"): a negative version crashed the rules' lookups
            raise ValueError(parts[0])
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdecimal()) or 0) if len(parts) > 1 else 0
    except (ValueError, IndexError):
        raise SpecError(f"invalid vLLM version {text!r} (expected e.g. 0.19.0)") from None


# vLLM 0.34.0's extensible KV cache (CacheConfig.enable_extensible_kv_cache, on by default on CUDA and ROCm, off with
# --kv-cache-memory-bytes or --num-gpu-blocks-override) sizes the pool from memory measured after warm-up, at
# --gpu-memory-utilization 1.0 unless one is given, less a margin for the activation and CUDA-graph peaks, in blocks of
# 64 by default (read in the 0.34.0 wheel: vllm/config/cache.py, vllm/v1/worker/gpu_worker.py). kvwatch does not model
# it: its sums stay 0.33's, and say so.
EXTENSIBLE_KV_SINCE = (0, 34)


def default_gpu_memory_utilization(version: tuple[int, int]) -> float:
    """vLLM's default --gpu-memory-utilization: 0.9 up to 0.16, 0.92 from 0.20."""
    return 0.92 if version >= OLD_DEFAULT_UTILIZATION_BEFORE else 0.9


class DeploymentOptions(Protocol):
    """What :meth:`DeploymentSpec.from_settings` reads: the deployment options of kvwatch.settings'
    ``DeploymentSettings`` (the settings layer sits above the core, so the core names only the fields)."""

    model: str | None
    model_config_path: Path | None
    gpu: str | None
    gpu_memory_gib: float | None
    gpu_memory_utilization: float | None
    tensor_parallel_size: int
    pipeline_parallel_size: int
    dtype: str
    kv_cache_dtype: str
    quantization: str | None
    block_size: int
    max_model_len: int | None
    max_num_batched_tokens: int | None
    max_num_seqs: int | None


@dataclass(frozen=True)
class DeploymentSpec:
    """One vLLM deployment, per GPU. Measured ``*_bytes`` overrides win over estimates."""

    arch: ModelArch | None = None
    gpu_memory_bytes: float | None = None
    gpu_name: str | None = None  # only to pick vLLM's default batch limits (A100s get the small ones)
    gpu_compute_capability: tuple[int, int] | None = None  # picks vLLM's MXFP4 MoE kernel (weight padding)
    gpu_bf16_tflops: float | None = None  # dense BF16 peak, only for the long-context prefill estimate
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    # The checkpoint's quantization method when kv_cache_dtype is the FP8 cache it declares ("auto" resolved).
    kv_cache_dtype_from: str | None = None
    quantization: str | None = None
    block_size: int = 16
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    enforce_eager: bool = False  # no CUDA graphs: nothing subtracted for them
    cuda_graph_bytes: float | None = None  # measured ("CUDAGraph memory" in vLLM's log) overrides the estimate
    enable_chunked_prefill: bool = True  # vLLM V1's default; off: one step must hold a whole prompt
    # None: vLLM's default (on wherever the model supports it; for hybrids from 0.28, kv.mamba_cache_mode)
    enable_prefix_caching: bool | None = None
    mamba_cache_mode: str | None = None  # the engine's, when known (cache_config_info); else vLLM's default
    allow_long_max_model_len: bool = False  # vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    vllm_version: tuple[int, int] = DEFAULT_VLLM_VERSION
    weights_bytes: float | None = None
    # vLLM's --cpu-offload-gb (per GPU): that much of the estimated weights lives in CPU memory, not on the GPU
    cpu_offload_bytes: float = 0.0
    activation_bytes: float | None = None
    non_torch_bytes: float | None = None
    available_kv_bytes: float | None = None
    # The pool is vLLM's --kv-cache-memory-bytes (it skips profiling): no utilization and no freed memory moves it.
    kv_pool_fixed: bool = False
    # vLLM >= 0.34's extensible KV cache (EXTENSIBLE_KV_SINCE): None, its default (on); False where the engine says it
    # is off (its cache_config_info, or a --num-gpu-blocks-override, which turns it off)
    extensible_kv_cache: bool | None = None
    # available_kv_bytes is the "Available KV cache memory" rank 0 logs (kvwatch plan --available-kv-gib), not the
    # pool: with pipeline parallelism the last stage, which also runs the sampler, has less, and sizes the pool.
    available_kv_logged_on_rank0: bool = False
    kv_bytes_per_token: float | None = None

    @classmethod
    def from_settings(cls, settings: DeploymentOptions, **overrides: Any) -> DeploymentSpec:
        """From a ``DeploymentSettings`` (model/GPU presets resolved here) plus measured overrides.

        Overrides are any field of this class (e.g. ``weights_bytes=...``, ``vllm_version=(0, 19)``).
        """
        from kvwatch.capacity import presets  # (the file reads: packaged presets, a user's config.json)

        arch: ModelArch | None = None
        quantization = settings.quantization
        if settings.model_config_path is not None and settings.model:
            raise SpecError("--model and --model-config are both set: pass one of them (the config.json would "
                            "silently win over the preset)")
        if settings.model_config_path is not None:
            arch = presets.load_config_file(settings.model_config_path)
        elif settings.model:
            arch = presets.match_model(settings.model).arch  # a repack's implied scheme is its checkpoint's
        gpu_bytes, gpu_name, capability, tflops = None, settings.gpu, None, None
        if settings.gpu:
            gpu = presets.resolve_gpu(settings.gpu)
            gpu_bytes, gpu_name, capability = float(gpu.total_memory_bytes), gpu.name, gpu.compute_capability
            tflops = gpu.bf16_tflops
        if settings.gpu_memory_gib is not None:  # what the card really reports wins over the preset
            gpu_bytes = settings.gpu_memory_gib * GIB
        version = overrides.pop("vllm_version", DEFAULT_VLLM_VERSION)
        if isinstance(version, str):
            version = parse_version(version)
        kv_cache_dtype, kv_from = settings.kv_cache_dtype, None
        declared = arch.checkpoint_kv_cache if arch is not None else None
        if kv_cache_dtype == "auto" and declared is not None and \
                version >= CHECKPOINT_KV_FP8_SINCE[declared[1]]:
            kv_cache_dtype, kv_from = declared[0], declared[1]  # as vLLM resolves "auto"
        spec = cls(
            arch=arch,
            gpu_memory_bytes=gpu_bytes,
            gpu_name=gpu_name,
            gpu_compute_capability=capability,
            gpu_bf16_tflops=tflops,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            tensor_parallel_size=settings.tensor_parallel_size,
            pipeline_parallel_size=settings.pipeline_parallel_size,
            dtype=settings.dtype,
            kv_cache_dtype=kv_cache_dtype,
            kv_cache_dtype_from=kv_from,
            quantization=quantization,
            block_size=settings.block_size,
            max_model_len=settings.max_model_len,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_num_seqs=settings.max_num_seqs,
            vllm_version=version,
        )
        return replace(spec, **overrides)


@dataclass(frozen=True)
class CapacityPlan:
    """The sums for one GPU (rank) of a deployment; every byte figure is per GPU."""

    spec: DeploymentSpec
    total_memory_bytes: float | None
    gpu_memory_utilization: float | None
    usable_bytes: float | None  # total x utilization
    weights_bytes: float | None
    activation_bytes: float | None  # with PP and a measured figure: rank 0's + pp_last_stage_extra_bytes
    non_torch_bytes: float | None
    available_kv_bytes: float
    kv_bytes_per_token: float
    layout: kv.KVLayout
    num_gpu_blocks: int
    kv_cache_tokens: int
    max_model_len: int | None
    max_num_batched_tokens: int
    in_flight_tokens: int  # what a sliding-window group holds beyond its window (kv.in_flight_tokens)
    max_num_seqs: int  # the scheduler's cap on running requests: --max-num-seqs, or vLLM's default for the card
    estimated: tuple[str, ...]  # which terms are estimates rather than measured
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    pp_last_stage_extra_bytes: float = 0.0  # the last PP stage's sampler, added to a measured rank-0 activation
    cuda_graph_bytes: float = 0.0  # subtracted before sizing the cache (vLLM >= 0.21 without --enforce-eager)
    notes: tuple[str, ...] = field(default_factory=tuple)
    # vLLM >= 0.34's extensible KV cache sizes the pool from memory it measures after warm-up (EXTENSIBLE_KV_SINCE):
    # these sums are 0.33's, so the pool and the memory refusals below (memory_errors) are not vLLM's there.
    pool_measured_by_engine: bool = False
    memory_errors: tuple[str, ...] = ()  # the errors of the memory budget (no KV left, a request that does not fit)

    @property
    def will_start(self) -> bool:
        return not self.errors

    def max_concurrency_at(self, avg_seq_len: float) -> float:
        """Requests of ``avg_seq_len`` KV tokens that fit at once (the tutorial's ceiling)."""
        return kv.max_concurrency_at(self.layout, self.num_gpu_blocks, avg_seq_len, self.in_flight_tokens)

    def running_limit_at(self, avg_seq_len: float) -> float:
        """Requests of ``avg_seq_len`` tokens vLLM runs at once: the KV ceiling, capped by ``max_num_seqs`` (past
        that cap the scheduler, not the KV cache, is the limit, and more KV buys no concurrency)."""
        return min(self.max_concurrency_at(avg_seq_len), float(self.max_num_seqs))

    @property
    def max_concurrency_at_max_model_len(self) -> float | None:
        """vLLM's "Maximum concurrency for max_model_len tokens per request"; None without max_model_len."""
        if not self.max_model_len:
            return None
        return kv.max_concurrency_at_max_model_len(self.layout, self.num_gpu_blocks, self.max_model_len,
                                                   self.in_flight_tokens)


def _max_len_errors(spec: DeploymentSpec, arch: ModelArch | None, warnings: list[str]) -> list[str]:
    """vLLM's refusal of a --max-model-len past the model's derived length (``_get_and_verify_max_len``);
    with VLLM_ALLOW_LONG_MAX_MODEL_LEN it starts, with a warning (appended to ``warnings``)."""
    derived, source = arch.derived_len(spec.vllm_version) if arch else (None, None)
    wanted = spec.max_model_len
    if not wanted or not derived or wanted <= derived:
        return []
    if arch is not None and arch.model_max_length and wanted <= arch.model_max_length:
        return []  # vLLM lets a config's own model_max_length override the derived length
    what = f"--max-model-len {wanted} is greater than the model's maximum length {derived} ({source})"
    if spec.allow_long_max_model_len:
        warnings.append(f"{what}: vLLM starts because VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, but positions past {derived} "
                        "give NaN with RoPE or out-of-bounds errors with absolute positions")
        return []
    return [f"vLLM will not start: {what}; lower --max-model-len to at most {derived} (or set "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, which vLLM says to use with extreme caution)"]


def _arch_or_error(spec: DeploymentSpec, what: str) -> ModelArch:
    if spec.arch is None:
        raise SpecError(f"{what} needs the model: pass --model NAME or --model-config PATH")
    return spec.arch


def _last_stage_sampler(flag: str, done: str, arch: ModelArch | None, seqs: int, notes: list[str],
                        warnings: list[str], estimated: list[str]) -> float:
    """The last pipeline stage's sampler, which a rank-0 figure from vLLM's log (``flag``) lacks: vLLM prints rank 0's
    profile but sizes the pool on the tightest stage, the last one. Its estimate in bytes, said in ``notes``; 0 with a
    warning without the model (its vocabulary)."""
    if arch is None:
        warnings.append(f"with pipeline parallelism vLLM sizes KV on the tightest stage; the last stage also runs the "
                        f"sampler, which a rank-0 {flag} does not include, and without the model (its vocabulary) "
                        "kvwatch cannot count it: the pool is overstated")
        return 0.0
    extra = float(memory.pp_last_stage_extra_bytes(arch, seqs))
    estimated.append("pp_last_stage_sampler")
    notes.append(f"pipeline parallelism: {flag} is read as rank 0's figure (the rank whose log vLLM prints); the last "
                 f"stage also runs the sampler, so {extra / GIB:.2f} GiB (max_num_seqs {seqs} × vocab "
                 f"{arch.vocab_size:,} × {memory.SAMPLER_BYTES_PER_LOGIT // 2} B, estimated) is {done}")
    return extra


def plan_capacity(spec: DeploymentSpec) -> CapacityPlan:
    """The whole calculation, step by step as vLLM does it (pure)."""
    tp, pp = spec.tensor_parallel_size, spec.pipeline_parallel_size
    arch = spec.arch
    estimated: list[str] = []
    warnings: list[str] = []
    errors: list[str] = []
    notes: list[str] = list(arch.notes) if arch else []
    if spec.kv_cache_dtype_from:
        notes.append(f"KV cache {spec.kv_cache_dtype}: the checkpoint's {spec.kv_cache_dtype_from} quantization_config "
                     "declares it, and vLLM takes it for --kv-cache-dtype auto (pass --kv-cache-dtype to plan another)")
    if arch is not None:  # DeepSeek sparse MLA: the dtype vLLM really serves, per release and GPU
        served, why = kv.sparse_mla_kv_cache_dtype(arch, spec.kv_cache_dtype, spec.vllm_version,
                                                   spec.gpu_compute_capability, tp)
        spec = replace(spec, kv_cache_dtype=served)
        notes += [why] if why else []
    quantization.check_name(spec.quantization)
    mismatch = quantization.method_mismatch(spec.quantization, arch.checkpoint_quant_method if arch else None)
    if mismatch:
        raise SpecError(mismatch)
    if spec.block_size not in kv.VLLM_BLOCK_SIZES:
        raise SpecError(f"invalid value {spec.block_size} for --block-size: vLLM accepts "
                        f"{', '.join(map(str, kv.VLLM_BLOCK_SIZES))}")
    dtype_bytes = memory.model_dtype_bytes(spec.dtype, arch)
    try:
        kv_bytes = kv.kv_dtype_bytes(spec.kv_cache_dtype, dtype_bytes)
    except kv.UnsizedKvDtype as exc:
        raise SpecError(str(exc)) from None
    util = spec.gpu_memory_utilization or default_gpu_memory_utilization(spec.vllm_version)
    total = spec.gpu_memory_bytes
    batched_default, seqs_default = memory.default_batch_limits(total or 80 * GIB, spec.gpu_name)
    max_model_len = spec.max_model_len or (arch.default_len(spec.vllm_version) if arch else None)
    longest = arch.derived_len(spec.vllm_version)[0] if arch else None
    if not spec.max_model_len and max_model_len and longest and max_model_len < longest:
        notes.append(f"max_model_len {max_model_len:,}: with no --max-model-len, vLLM >= 0.11.1 starts a LongRoPE "
                     f"model at its original_max_position_embeddings; pass --max-model-len {longest} for its full "
                     "context")
    length_errors = _max_len_errors(spec, arch, warnings)
    errors += length_errors
    # The longest --max-model-len vLLM accepts for this model, where the one asked for is refused: the memory
    # check below must not suggest a length past it (it is refused too).
    longest_accepted = arch.derived_len(spec.vllm_version)[0] if length_errors and arch is not None else None
    method = spec.quantization or (arch.checkpoint_quant_method if arch else None)
    refusal = quantization.capability_refusal(method, spec.vllm_version, spec.gpu_compute_capability, spec.gpu_name)
    if refusal:
        errors.append(refusal)
    capability = spec.gpu_compute_capability
    if spec.dtype.lower() in ("bfloat16", "bf16") and capability is not None and capability < (8, 0):
        # vLLM's platform check_if_supports_dtype at worker start (--dtype auto picks float16 there instead)
        errors.append(f"vLLM will not start: --dtype bfloat16 needs a GPU of compute capability 8.0 or more "
                      f"({spec.gpu_name or 'this GPU'} has {capability[0]}.{capability[1]}); pass --dtype half")
    for warning in (support.dropped_warning(arch.architectures, spec.vllm_version),
                    support.unmodelled_warning(arch.architectures)) if arch else ():
        if warning:
            warnings.append(warning)
    if spec.enable_chunked_prefill:
        batched = spec.max_num_batched_tokens or batched_default
    else:
        # vLLM's SchedulerConfig: without chunked prefill the default step holds a whole max_model_len prompt
        batched = spec.max_num_batched_tokens or max(max_model_len or 0, batched_default)
        if max_model_len and batched < max_model_len:
            errors.append(f"vLLM will not start: max_num_batched_tokens ({batched}) is smaller than max_model_len "
                          f"({max_model_len}) with chunked prefill off; raise --max-num-batched-tokens to "
                          f"{max_model_len}, lower --max-model-len, or enable chunked prefill")
    # vLLM's EngineArgs._set_default_args: the default max_num_seqs is at most the step's tokens (a step of 512
    # tokens runs 512 sequences; refused against the card's default of 1,024, a deployment that starts read "vLLM will
    # not start" and the inverse planner found none)
    seqs = spec.max_num_seqs or min(seqs_default, batched)
    if batched < seqs:
        # vLLM's SchedulerConfig._verify_args: every running request needs a token of the step
        errors.append(f"vLLM will not start: max_num_batched_tokens ({batched}) must be greater than or equal to "
                      f"max_num_seqs ({seqs}); raise --max-num-batched-tokens or lower --max-num-seqs")

    layout, per_token = _kv_geometry(spec, arch, kv_bytes, dtype_bytes, notes, warnings, errors)
    budget = _memory_budget(spec, util, dtype_bytes, batched, seqs, notes, warnings, estimated)
    available = budget.available

    blocks = kv.num_gpu_blocks(available, layout)
    in_flight = kv.in_flight_tokens(batched, pp, spec.vllm_version)
    tokens = kv.reported_kv_cache_tokens(layout, blocks, max_model_len, in_flight, spec.vllm_version)
    memory_errors: list[str] = []
    if available <= 0:
        # (none left exactly, as --available-kv-gib 0 says, is no shortfall: "short by -0.00 GiB" was printed)
        short = f" (short by {-available / GIB:.2f} GiB per GPU)" if -available / GIB >= 0.005 else ""
        memory_errors.append(f"vLLM will not start: no memory left for the KV cache{short}")
    elif max_model_len and blocks < kv.blocks_needed(layout, max_model_len, in_flight) and (
            longest_accepted is None or blocks < kv.blocks_needed(layout, longest_accepted, in_flight)):
        # (Where the model's own longest length fits, lowering to it, the refusal above, is the whole fix.)
        need = kv.blocks_needed(layout, max_model_len, in_flight) * layout.bytes_per_block_row
        memory_errors.append(f"vLLM will not start: one {max_model_len}-token request needs {need / GIB:.2f} GiB of "
                             f"KV but only {available / GIB:.2f} GiB is available (short by "
                             f"{(need - available) / GIB:.2f} GiB); lower --max-model-len to about "
                             f"{_fitting_len(layout, blocks, in_flight)}")
    errors += memory_errors
    measured_by_engine = (spec.vllm_version >= EXTENSIBLE_KV_SINCE and spec.available_kv_bytes is None
                          and not spec.kv_pool_fixed and spec.extensible_kv_cache is not False)
    if measured_by_engine:
        warnings.append(f"vLLM {release(EXTENSIBLE_KV_SINCE)}+ sizes the KV cache from memory it measures after "
                        "warm-up (its extensible KV cache, on by default on CUDA and ROCm), at "
                        "--gpu-memory-utilization 1.0 unless one is given and in blocks of 64 by default: these "
                        "figures are 0.33's sums, which kvwatch has not calibrated against it (the pool is likely "
                        "larger); pass --available-kv-gib from the engine's log for its own")
    if [e for e in estimated if e not in ("pp_last_stage_sampler", "cuda_graphs")]:
        warnings.append(f"estimated (not measured): {', '.join(estimated)}; pass --weights-gib/--activation-gib/"
                        "--non-torch-gib from vLLM's startup log for exact figures")
    if layout.is_hybrid and spec.vllm_version >= kv.TOKENS_FROM_CONCURRENCY_SINCE:
        notes.append("hybrid (sliding-window, chunked or Mamba) model: vLLM derives 'KV cache size' from "
                     "max_model_len, so it is not a byte-linear capacity")
    elif layout.is_hybrid:
        notes.append(f"hybrid (sliding-window, chunked or Mamba) model: vLLM before 0.20 reports 'KV cache size' as "
                     f"blocks // {layout.num_groups} groups × block size, which counts one group's tokens; the "
                     "ceiling counts what each group holds (a sliding group only its window), so it can exceed "
                     "that figure ÷ max_model_len")
    return CapacityPlan(
        spec=spec, total_memory_bytes=total, gpu_memory_utilization=util, usable_bytes=budget.usable,
        weights_bytes=budget.weights, activation_bytes=budget.activation, non_torch_bytes=budget.non_torch,
        pp_last_stage_extra_bytes=budget.pp_extra, cuda_graph_bytes=budget.cuda_graphs,
        available_kv_bytes=available, kv_bytes_per_token=per_token, layout=layout, num_gpu_blocks=blocks,
        kv_cache_tokens=tokens, max_model_len=max_model_len, max_num_batched_tokens=batched,
        in_flight_tokens=in_flight, max_num_seqs=seqs,
        estimated=tuple(estimated), warnings=tuple(warnings), errors=tuple(errors), notes=tuple(notes),
        pool_measured_by_engine=measured_by_engine, memory_errors=tuple(memory_errors),
    )


def _kv_geometry(spec: DeploymentSpec, arch: ModelArch | None, kv_bytes: int, dtype_bytes: int, notes: list[str],
                 warnings: list[str], errors: list[str]) -> tuple[kv.KVLayout, float]:
    """The KV layout (groups, block size, page bytes) and the KV bytes per token, as vLLM lays the pool out; what it
    notes, warns of or refuses added to ``notes``, ``warnings`` and ``errors``."""
    tp, pp = spec.tensor_parallel_size, spec.pipeline_parallel_size
    if spec.kv_bytes_per_token is not None:
        if spec.arch is not None:  # (the bytes are given; the model still decides which sizes vLLM accepts)
            _check_parallelism_and_dtype(spec, spec.arch)
        layout = kv.uniform_layout(round(spec.kv_bytes_per_token), spec.block_size)
        per_token = float(spec.kv_bytes_per_token)
    else:
        arch = _arch_or_error(spec, "the KV bytes per token")
        _check_parallelism_and_dtype(spec, arch)
        try:
            layout = kv.kv_layout(arch, tp, pp, kv_bytes, spec.block_size, spec.vllm_version, spec.kv_cache_dtype,
                                  model_dtype_bytes=dtype_bytes,
                                  cache_mode=kv.mamba_cache_mode(spec.vllm_version, spec.enable_prefix_caching,
                                                                 spec.mamba_cache_mode))
        except MambaConfigError as exc:
            raise SpecError(f"invalid value {tp} for --tensor-parallel-size: {exc}") from None
        per_token = float(layout.kv_bytes_per_token)
        if layout.mamba_page_bytes:
            notes.append(_hybrid_note(layout, spec.block_size))
        if arch.attention_dims and not arch.is_mla:
            notes.append(_unified_pages_note(arch, layout, tp, kv_bytes, spec.vllm_version))
        if arch.is_mla and layout.block_size % 64:
            # vLLM's CUDA platform forces these for FlashMLA, CUTLASS MLA and FlashInfer MLA (docs/capacity.md, "MLA
            # block size")
            notes.append(f"MLA on NVIDIA GPUs: vLLM raises the block size from {layout.block_size} to 64 tokens for "
                         "FlashMLA (its default where supported, Hopper) and FlashInfer MLA, or 128 for CUTLASS MLA "
                         "(Blackwell), logging 'Forcing kv cache block size to ...'; pass --block-size 64 (or 128) "
                         "for its figures (they differ only by the rounding to whole blocks)")
        errors += [layout.page_refusal] if layout.page_refusal else []
        warnings += [layout.page_warning] if layout.page_warning else []
    if arch is not None and not arch.is_mla and spec.kv_bytes_per_token is None:
        fewest, most = min(arch.kv_head_counts), max(arch.kv_head_counts)
        if most < tp:
            notes.append(f"TP={tp} exceeds the {most} KV heads: heads are replicated, so more TP does not shrink "
                         "the KV per token any further")
        elif fewest < tp:
            notes.append(f"TP={tp} exceeds the {fewest} KV heads of some layers: theirs are replicated, so more TP "
                         f"shrinks the KV per token only in the layers with more (up to TP={most})")
    if arch is not None and (split := block_quant_split(arch, tp)) is not None and split[1]:
        warnings.append(f"{EXPERT_PARALLEL_FLAG} needed: at TP={tp} {split[0]}, and vLLM refuses to load it so; with "
                        f"{EXPERT_PARALLEL_FLAG} each expert stays whole on one GPU (the KV cache is split as planned)")
    return layout, per_token


EXPERT_PARALLEL_FLAG = "--enable-expert-parallel"


@dataclass(frozen=True)
class _Budget:
    """Per GPU: the memory vLLM can use, what it spends before the KV cache, and what is left for it."""

    available: float
    usable: float | None = None
    weights: float | None = None
    activation: float | None = None
    non_torch: float | None = None
    cuda_graphs: float = 0.0
    pp_extra: float = 0.0


def _memory_budget(spec: DeploymentSpec, util: float, dtype_bytes: int, batched: int, seqs: int, notes: list[str],
                   warnings: list[str], estimated: list[str]) -> _Budget:
    """The KV budget per GPU: a measured ``--available-kv-gib`` (less the last pipeline stage's sampler where rank
    0 logged it), else the card × utilization less weights, activation peak, non-torch memory and, from vLLM 0.21,
    CUDA graphs, each measured where given and estimated (and named in ``estimated``) where not."""
    tp, pp = spec.tensor_parallel_size, spec.pipeline_parallel_size
    arch, total = spec.arch, spec.gpu_memory_bytes
    weights = activation = non_torch = usable = None
    cuda_graphs = 0.0
    pp_extra = 0.0
    if spec.available_kv_bytes is not None:
        available = float(spec.available_kv_bytes)
        weights, activation, non_torch = spec.weights_bytes, spec.activation_bytes, spec.non_torch_bytes
        if total is not None:
            usable = total * util
        if pp > 1 and spec.available_kv_logged_on_rank0:
            # (Llama-3.1-8B at PP 2 read 1.4 % too many tokens from rank 0's figure)
            pp_extra = _last_stage_sampler("--available-kv-gib", "taken from it", arch, seqs, notes, warnings,
                                           estimated)
            available -= pp_extra
    else:
        if total is None:
            raise SpecError("the memory budget needs the GPU: pass --gpu NAME or --gpu-memory-gib X",
                            plan_hint="(or a measured --available-kv-gib)")
        usable = total * util
        if spec.weights_bytes is not None:
            weights = float(spec.weights_bytes)
        else:
            weights = float(memory.estimate_weights_bytes(_arch_or_error(spec, "estimating weights (--weights-gib)"),
                                                          dtype_bytes, spec.quantization, tp, pp,
                                                          compute_capability=spec.gpu_compute_capability))
            estimated.append("weights")
            if spec.cpu_offload_bytes:
                # --cpu-offload-gb moves up to that much of each GPU's weights to CPU memory (vllm/config/offload.py:
                # "a virtual way to increase the GPU memory size"); a measured --weights-gib already excludes it.
                # Only the decoder layers' (vLLM offloads what make_layers builds, maybe_offload_to_cpu): the
                # embeddings and the LM head stay on the GPU (2 GiB of Llama-3.1-8B's were counted offloaded).
                layers = max(0.0, weights - memory.embedding_bytes(
                    _arch_or_error(spec, "estimating weights (--weights-gib)"), dtype_bytes, tp, pp))
                offloaded = min(layers, spec.cpu_offload_bytes)
                notes.append(f"--cpu-offload-gb: {offloaded / GIB:.2f} GiB of the {weights / GIB:.2f} GiB of weights "
                             "per GPU are in CPU memory (the decoder layers' only: the embeddings and the LM head "
                             "stay), so the KV budget gains it")
                weights -= offloaded
        if spec.activation_bytes is not None:
            activation = float(spec.activation_bytes)
            if pp > 1:  # (the same term as the calibration uses: docs/capacity.md, section 2)
                pp_extra = _last_stage_sampler("--activation-gib", "added for it", arch, seqs, notes, warnings,
                                               estimated)
                activation += pp_extra
        else:
            activation = float(memory.estimate_activation_bytes(
                _arch_or_error(spec, "estimating activations (--activation-gib)"), dtype_bytes, batched, seqs, tp, pp))
            estimated.append("activation")
            if batched > memory.ACTIVATION_FIT_MAX_TOKENS:
                warnings.append(
                    f"the activation estimate ({activation / GIB:.2f} GiB) is fitted on profile runs of at most "
                    f"{memory.ACTIVATION_FIT_MAX_TOKENS:,} tokens; this one runs {batched:,} at once, where a V0 "
                    "profile of Llama-3.1-8B without chunked prefill took about 110 KB a token, several times the "
                    "estimate's (2.99 GiB at 29,000 tokens: docs/capacity.md, calibration row 46): the KV "
                    "figures may be too high and vLLM may refuse to start; pass the activation vLLM logs "
                    "(--activation-gib)")
        if spec.non_torch_bytes is not None:
            non_torch = float(spec.non_torch_bytes)
        else:
            non_torch = float(memory.estimate_non_torch_bytes(tp, pp))
            estimated.append("non_torch")
        if spec.vllm_version >= CUDA_GRAPHS_SUBTRACTED_SINCE and not spec.enforce_eager:
            if spec.cuda_graph_bytes is not None:
                cuda_graphs = float(spec.cuda_graph_bytes)
            elif arch is not None:
                cuda_graphs = float(memory.estimate_cuda_graph_bytes(arch, pp))
                estimated.append("cuda_graphs")
            else:
                notes.append(f"{GRAPH_SUBTRACTING_VLLM} subtracts its CUDA-graph memory before sizing the KV cache; "
                             "without the model kvwatch cannot estimate it (the calibration logs show 0.5-1.8 GiB per "
                             "GPU)")
        available = usable - weights - activation - non_torch - cuda_graphs
    return _Budget(available=available, usable=usable, weights=weights, activation=activation, non_torch=non_torch,
                   cuda_graphs=cuda_graphs, pp_extra=pp_extra)


def _check_parallelism_and_dtype(spec: DeploymentSpec, arch: ModelArch) -> None:
    """What vLLM refuses at startup (``ModelConfig.verify_with_parallel_config``), as a SpecError naming the flag."""
    tp, pp = spec.tensor_parallel_size, spec.pipeline_parallel_size
    refusal = tensor_parallel_refusal(arch, tp)
    if refusal:
        raise SpecError(f"invalid value {tp} for --tensor-parallel-size: {refusal}")
    if pp > arch.num_layers:
        raise SpecError(f"invalid value {pp} for --pipeline-parallel-size: more pipeline stages than the model's "
                        f"{arch.num_layers} layers")
    if spec.kv_cache_dtype.lower() == "fp8_ds_mla" and not arch.is_mla:
        raise SpecError("invalid value 'fp8_ds_mla' for --kv-cache-dtype: it is DeepSeek's MLA cache layout and "
                        f"{arch.name} has no MLA (use fp8)")


def _hybrid_note(layout: kv.KVLayout, requested: int) -> str:
    """What vLLM logs at startup for a hybrid Mamba model, and what it means for capacity."""
    mamba_groups = sum(1 for g in layout.groups if g.kind == MAMBA)
    raised = (f"vLLM raises the attention block size from {requested} to {layout.block_size} tokens so one page "
              f"holds a Mamba state" if layout.block_size_raised else f"block size {layout.block_size} already "
              "holds a Mamba state")
    per_request = layout.mamba_blocks_per_request
    held = ("one block" if per_request == 1 else "a state block per block of the request (mamba_cache_mode 'all')"
            if per_request == 0 else
            f"{per_request} blocks (prefix caching's 'align' mode keeps the running state and the last block-aligned "
            f"one{', plus a prefill checkpoint' if per_request > 2 else ''}; --no-enable-prefix-caching: 1)")
    return (f"hybrid Mamba model: one state is {layout.mamba_page_bytes:,} B per layer and request on this rank; "
            f"{raised}, and pads the state page by {layout.mamba_padding_percent:.2f}% to {layout.page_bytes:,} B "
            f"(as its startup log says). {mamba_groups} Mamba group(s) of up to {layout.group_size} layers on this "
            f"rank hold {held} per request whatever its length, so short requests cost more blocks than their "
            "tokens suggest")


def _unified_pages_note(arch: ModelArch, layout: kv.KVLayout, tp: int, kv_bytes: int,
                        version: tuple[int, int]) -> str:
    """The per layer type KV sums, and the block sizes vLLM unifies the pages with (kv.UNIFIED_PAGE_SIZES_SINCE)."""
    parts = []
    for kind in dict.fromkeys(g.kind for g in layout.groups if g.kind != MAMBA):
        group = next(g for g in layout.groups if g.kind == kind)
        count = sum(g.num_layers for g in layout.groups if g.kind == kind)
        dims = arch.kv_dims(kind)
        heads = max(1, dims.num_kv_heads // tp)
        v = dims.v_head_dim if version >= kv.SEPARATE_V_HEAD_SIZE_SINCE else dims.head_dim
        parts.append(f"{count} {kind.split('_')[0]} layers × {heads} KV heads × ({dims.head_dim} K + {v} V head "
                     f"size) × {kv_bytes} B = {group.bytes_per_token_per_layer or layout.bytes_per_token_per_layer:,} "
                     "B per token and layer, block "
                     f"size {layout.group_block_size(group)}")
    padded = any(g.bytes_per_token_per_layer and layout.group_block_size(g) * g.bytes_per_token_per_layer
                 < layout.page_bytes for g in layout.groups)
    why = ("" if layout.page_refusal else
           f": vLLM makes every page {layout.page_bytes:,} B (unify_kv_cache_spec_page_size), multiplying the block "
           "size of the layers with the smaller page (those groups hold fewer, larger blocks per request)"
           if any(g.block_size for g in layout.groups) else
           f": vLLM pads the smaller pages to {layout.page_bytes:,} B (unify_kv_cache_spec_page_size)"
           if padded else f": every page is {layout.page_bytes:,} B on this rank")
    return (f"attention layer types with their own KV heads / head sizes: {'; '.join(parts)}, "
            f"{layout.kv_bytes_per_token:,} B per token in all{why}")


def _fitting_len(layout: kv.KVLayout, blocks: int, in_flight: int) -> int:
    """The longest max_model_len one request can still reach with ``blocks`` blocks (a hint)."""
    lo, hi = 0, 1 << 24
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv.blocks_needed(layout, mid, in_flight) <= blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo - lo % layout.block_size if lo >= layout.block_size else lo


