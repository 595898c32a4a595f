"""What the simulated vLLM is started with and what it is asked: engine configuration, step-time model, requests.

Plain frozen dataclasses (pure), shared by the scheduler, the block pool, the statistics and the load generators.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FINISH_REASONS = ("stop", "length", "abort")


@dataclass(frozen=True)
class StepTimeModel:
    """Duration of one engine step. Defaults: plausible for an 8B model in bf16 on one H100."""

    fixed_seconds: float = 0.006  # scheduler + launch overhead + weight reads of a small batch
    per_decode_token_seconds: float = 0.00012  # batch 100 decodes in ~18 ms
    per_prefill_token_seconds: float = 0.00006  # ~16k prompt tokens/s

    def __post_init__(self) -> None:
        if not all(math.isfinite(x) for x in (self.fixed_seconds, self.per_decode_token_seconds,
                                              self.per_prefill_token_seconds)):
            raise ValueError("StepTimeModel times must be finite")
        if self.fixed_seconds <= 0:
            raise ValueError("StepTimeModel.fixed_seconds must be > 0")
        if self.per_decode_token_seconds < 0 or self.per_prefill_token_seconds < 0:
            raise ValueError("StepTimeModel per-token costs must be >= 0")

    def duration(self, prefill_tokens: int, decode_tokens: int) -> float:
        return (self.fixed_seconds + self.per_prefill_token_seconds * prefill_tokens
                + self.per_decode_token_seconds * decode_tokens)

@dataclass(frozen=True)
class EngineConfig:
    """What ``vllm serve`` would be started with (per data-parallel engine, except DP size itself)."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    data_parallel_size: int = 1
    enable_prefix_caching: bool = False
    step: StepTimeModel = field(default_factory=StepTimeModel)
    # Longest prompt+output accepted (vLLM's --max-model-len); None: only what fits in the cache.
    max_model_len: int | None = None
    # Token span of one trace hash id (Mooncake: 512); prefix blocks are keyed (hash_id, sub-block).
    hash_block_tokens: int = 512

    def __post_init__(self) -> None:
        checks = {
            "num_gpu_blocks": self.num_gpu_blocks >= 2,
            "block_size": self.block_size >= 1,
            "max_num_seqs": self.max_num_seqs >= 1,
            "max_num_batched_tokens": self.max_num_batched_tokens >= 1,
            "data_parallel_size": self.data_parallel_size >= 1,
            "hash_block_tokens": self.hash_block_tokens >= 1,
            "max_model_len": self.max_model_len is None or self.max_model_len >= 2,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"EngineConfig.{name} has an invalid value {getattr(self, name)!r}")

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can hold: one block of the pool is vLLM's reserved null block."""
        return self.num_gpu_blocks - 1


@dataclass(frozen=True)
class Request:
    """One request as a trace or a load profile describes it."""

    arrival_time: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    finish_reason: str = "stop"  # what vLLM reports when it ends: "stop" (EOS) or "length" (max_tokens)

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("Request needs prompt_tokens >= 1 and output_tokens >= 1")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Request.finish_reason must be one of {FINISH_REASONS}")
