"""KV cache geometry: bytes per token, layer groups, blocks, tokens and concurrency (pure).

Follows vLLM's own arithmetic (``vllm/v1/core/kv_cache_utils.py``, ``kv_cache_interface.py``):

- standard attention, per rank: ``2 × layers_on_rank × max(1, kv_heads // TP) × head_dim × kv_bytes``
  (heads are replicated, not split, once TP exceeds them; PP divides the layers);
- MLA: ``layers × (kv_lora_rank + qk_rope_head_dim) × kv_bytes``, not divided by TP (plus DeepSeek-V3.2's
  indexer keys, 132 B per token and layer);
- sliding-window / hybrid models: layers are bucketed by attention type and cut into equal groups of
  ``group_size`` layers (the smallest bucket, or the largest when it is under 1.5× the smallest);
  one block id spans one page per layer slot of a group, so a "block row" costs
  ``group_size × page`` bytes, and every group draws its own block ids from the shared pool;
- layer types with KV heads / head sizes of their own (Gemma 4's full layers, MiMo-V2-Flash): each group's
  page is its layers' bytes per token × block size, and vLLM makes them equal by multiplying the block size of the
  groups with the smaller page (``unify_kv_cache_spec_page_size``), so those groups hold fewer blocks per request;
- hybrid Mamba / linear-attention models (:mod:`kvwatch.capacity.mamba`): Mamba layers form groups of their own
  whose page (one request's state) is padded to the attention page, after vLLM raised the attention block size
  until that page holds a state; a request holds a fixed number of blocks in each Mamba group whatever its length
  (:func:`mamba_state_blocks`: 1, or 2-3 with prefix caching's "align" mode).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from kvwatch.capacity import mamba
from kvwatch.capacity.architecture import ModelArch
from kvwatch.capacity.layers import CHUNKED, FULL, MAMBA, MLP_ONLY, SLIDING
from kvwatch.capacity.units import DTYPE_BYTES

# vLLM versions that matter for the reported token count, as (major, minor) tuples.
HYBRID_GROUPING_SINCE = (0, 9)  # before: every attention layer treated as full attention, one group
# With pipeline parallelism the groups are the whole model's, each stage holding its share (get_kv_cache_configs;
# read in 0.11-0.32, not in 0.9-0.10, for which kvwatch groups the largest stage's layers on their own).
STAGED_GROUPS_SINCE = (0, 11)
# From here "KV cache size" = int(max_concurrency × max_model_len): 0.20.2's _report_kv_cache_config (0.20.0 and
# 0.20.1 still log blocks // groups × block_size; kvwatch's versions have no patch number, and plan says so).
TOKENS_FROM_CONCURRENCY_SINCE = (0, 20)
# A sliding-window group holds window - 1 + X tokens per request, a chunked-local one chunk + X: X =
# max_num_batched_tokens up to 0.25, VllmConfig.max_in_flight_tokens (max_concurrent_batches ×
# max_num_batched_tokens) from 0.26.0 (the first release whose vllm/v1/kv_cache_interface.py reads it).
IN_FLIGHT_TOKENS_SINCE = (0, 26)
# Llama-4's chunked local attention gets its own KV-cache groups once the hybrid manager stays on for it:
# VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to "1" from 0.14.0 (vllm/envs.py; "0" in 0.12-0.13,
# when every layer held every token like full attention).
CHUNKED_HYBRID_SINCE = (0, 14)
# Prefix caching on hybrid Mamba models: ModelConfig.is_prefix_caching_supported says True for them from 0.26.0,
# and MambaModelConfig then sets mamba_cache_mode "align": a Mamba group holds 2 state blocks per request
# (MambaSpec.max_memory_usage_bytes), plus 1 prefill checkpoint block for Mamba2 mixers from 0.32.0
# (mamba_mixer2.py: num_prefill_checkpoint_blocks=1). Mode "none" (prefix caching off) holds 1. It is on by
# default only from 0.28.0: 0.26 and 0.27 keep it opt-in for hybrids (arg_utils.py: default_prefix_caching =
# is_prefix_caching_supported and not is_hybrid), and there an opted-in model that supports Mamba prefix caching
# gets mode "all" (not modelled: kvwatch counts "align").
HYBRID_PREFIX_CACHING_SINCE = (0, 26)
HYBRID_PREFIX_CACHING_DEFAULT_SINCE = (0, 28)
MAMBA_CHECKPOINT_BLOCK_SINCE = (0, 32)
# NemotronH's temporal SSM state: the config's mamba_ssm_cache_dtype, else float32 from 0.20.0 (float16 before:
# NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE in vllm/model_executor/models/config.py).
NEMOTRON_SSM_FP32_SINCE = (0, 20)
# V1 keeps Mamba states in the shared block pool with unified page sizes from 0.10.2 (vllm PR 20016); before that
# the V0 engine had a separate Mamba cache outside the KV pool.
MAMBA_PAGES_SINCE = (0, 10)
# Attention layer types whose pages differ (their own KV heads / head sizes: ModelArch.attention_dims). vLLM's
# get_kv_cache_groups (vllm/v1/core/kv_cache_utils.py) runs unify_kv_cache_spec_page_size first: every layer whose
# page is smaller than the largest gets block_size × (largest ÷ its page) when that divides, so one block id is the
# same number of bytes in every group, and a request holds cdiv(len, that block size) blocks in such a group (its
# spec's max_memory_usage_bytes ÷ the unified page). Read in 0.14, 0.16, 0.18, 0.20, 0.26, 0.28, 0.30 and 0.32;
# 0.11 has no unification and raises NotImplementedError for unequal pages (0.12-0.13 not read). A page that does
# not divide the largest: NotImplementedError ("Cannot unify by adjusting block_size") up to 0.20; from 0.26 the
# page is padded to the largest and keeps its block size (0.26-0.28 only on backends that index KV by the block
# stride, else still NotImplementedError: a warning says so; 0.30 and 0.32 for any non-MLA attention layer;
# 0.21-0.25 not read). From 0.30 a block-outermost VLLM_KV_CACHE_LAYOUT packs such layers instead
# (_get_packed_kv_cache_groups), not modelled: the default layouts (LBNHC, FlashInfer's LBHNC) are not.
UNIFIED_PAGE_SIZES_SINCE = (0, 14)
PADDED_PAGE_SIZES_SINCE = (0, 26)
PADDED_PAGES_ANY_BACKEND_SINCE = (0, 30)
# V heads of their own size in the cache (head_size_v): vLLM 0.14-0.18's MiMo-V2-Flash pads V to the K head size
# before attention (mimo_v2_flash.py) and its SlidingWindowSpec has no head_size_v (vllm/v1/kv_cache_interface.py);
# 0.20 passes head_size_v and stores heads × (head_size + head_size_v) (0.19 not read).
SEPARATE_V_HEAD_SIZE_SINCE = (0, 20)


def in_flight_tokens(max_num_batched_tokens: int, pp: int, version: tuple[int, int]) -> int:
    """The X above. From 0.26: ``max_concurrent_batches × max_num_batched_tokens``, where vLLM's V1 runner has
    2 batches in flight with async scheduling (its default, PP = 1) and ``pp`` with pipeline parallelism."""
    if version < IN_FLIGHT_TOKENS_SINCE:
        return max_num_batched_tokens
    return max_num_batched_tokens * (2 if pp <= 1 else pp)


def mamba_cache_mode(version: tuple[int, int], enable_prefix_caching: bool | None,
                     given: str | None = None) -> str:
    """vLLM's ``mamba_cache_mode`` on a hybrid model: the one given, else "align" with prefix caching on (None:
    vLLM's default, on from HYBRID_PREFIX_CACHING_DEFAULT_SINCE) from HYBRID_PREFIX_CACHING_SINCE, else "none"."""
    if given:
        return given
    enabled = version >= HYBRID_PREFIX_CACHING_DEFAULT_SINCE if enable_prefix_caching is None \
        else enable_prefix_caching
    return "align" if enabled and version >= HYBRID_PREFIX_CACHING_SINCE else "none"


def mamba_state_blocks(arch: ModelArch, version: tuple[int, int], mode: str) -> int:
    """State blocks one request holds in each Mamba group (see HYBRID_PREFIX_CACHING_SINCE); 0 for mode "all"
    (0.15-0.31: a state per block of the request, ``cdiv(len, block_size)`` like full attention)."""
    if mode == "all":
        return 0
    if mode != "align":
        return 1
    checkpoint = (arch.mamba_dims is not None and arch.mamba_dims.kind == mamba.MAMBA2
                  and version >= MAMBA_CHECKPOINT_BLOCK_SINCE)
    return 2 + int(checkpoint)


def mamba_ssm_dtype_bytes(arch: ModelArch, version: tuple[int, int]) -> int | None:
    """Bytes of the temporal SSM state when vLLM does not keep it in the model dtype, else None."""
    if arch.mamba_dims is not None and arch.mamba_dims.kind == mamba.KDA:
        # KDA's recurrent state is float32 in every release with Kimi-Linear (kda_state_dtype in
        # vllm/model_executor/layers/mamba/mamba_utils.py); from 0.30 only --mamba-ssm-cache-dtype, which kvwatch
        # does not take, changes it (Kimi's config.json does not).
        return 4
    dtype = arch.mamba_ssm_cache_dtype
    if dtype is None and arch.model_type == "nemotron_h" and version >= NEMOTRON_SSM_FP32_SINCE:
        dtype = "float32"
    return kv_dtype_bytes(dtype, 2) if dtype and dtype != "auto" else None  # (checked when the config was read)


@dataclass(frozen=True)
class KVGroup:
    kind: str  # FULL, SLIDING, CHUNKED or MAMBA
    num_layers: int  # real layers in this group (<= group_size; the rest is padding)
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    # Layer types with KV dims of their own (UNIFIED_PAGE_SIZES_SINCE): this group's tokens per block and its layers'
    # bytes per token and layer when they are not the layout's (0: the layout's block_size /
    # bytes_per_token_per_layer). block_size × bytes_per_token_per_layer is the layout's page, or less when the
    # page is padded to it.
    block_size: int = 0
    bytes_per_token_per_layer: int = 0


@dataclass(frozen=True)
class KVLayout:
    """How one rank lays out its KV cache."""

    block_size: int  # tokens per block; the smallest group's when groups differ (KVGroup.block_size)
    bytes_per_token_per_layer: int  # one layer slot, one token, this rank (page_bytes ÷ block_size)
    group_size: int  # layer slots per group (a block row spans this many pages)
    groups: tuple[KVGroup, ...]
    num_attention_layers: int  # on this rank
    # Hybrid Mamba models: one layer's state per request before padding, and the --block-size asked for (vLLM
    # raises block_size above it so an attention page holds one state); 0 = not a hybrid Mamba layout.
    mamba_page_bytes: int = 0
    requested_block_size: int = 0
    # State blocks per request in each Mamba group (mamba_state_blocks; 0: one per block of the request, "all").
    mamba_blocks_per_request: int = 1
    # Layer types with KV dims of their own: the bytes per token of all this rank's attention layers (0: the
    # uniform bytes_per_token_per_layer × num_attention_layers), and why vLLM refuses to unify their pages (its
    # startup fails: "vLLM will not start") or may refuse (a warning); "" when it does not.
    attention_bytes_per_token: int = 0
    page_refusal: str = ""
    page_warning: str = ""

    def group_block_size(self, group: KVGroup) -> int:
        """Tokens per block in ``group`` (vLLM's per-group block size after page unification)."""
        return group.block_size or self.block_size

    @property
    def page_bytes(self) -> int:
        """One layer's page: the attention page, which every Mamba page is padded to."""
        return self.block_size * self.bytes_per_token_per_layer

    @property
    def mamba_padding_percent(self) -> float:
        return mamba.padding_percent(self.mamba_page_bytes, self.page_bytes)

    @property
    def block_size_raised(self) -> bool:
        return bool(self.mamba_page_bytes) and self.block_size != self.requested_block_size

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def bytes_per_block_row(self) -> int:
        return self.block_size * self.group_size * self.bytes_per_token_per_layer

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token costs in every attention layer of this rank (the textbook figure)."""
        return self.attention_bytes_per_token or self.bytes_per_token_per_layer * self.num_attention_layers

    @property
    def has_unified_pages(self) -> bool:
        """Whether vLLM unifies pages of different sizes here (some groups have their own block size or a padded
        page: KVGroup.block_size / bytes_per_token_per_layer)."""
        return any(g.block_size or g.bytes_per_token_per_layer for g in self.groups)

    @property
    def is_hybrid(self) -> bool:
        return self.num_groups > 1

    @property
    def has_windows(self) -> bool:
        """Whether a group holds a window of each request, not all of it (sliding or chunked-local attention)."""
        return any(_running_hold(self, g) is not None for g in self.groups)

    @property
    def counts_by_group(self) -> bool:
        """Whether only this layout counts the requests a pool holds: several KV groups (each request holds blocks in
        every one, a Mamba group its state) or a window; a pool's token figure charges every token everywhere."""
        return self.is_hybrid or self.has_windows


# vLLM's --block-size values (CacheConfig's BlockSize literal: 1..128 in 0.10-era copies, 256 added later).
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
# fp8_ds_mla: DeepSeek's FlashMLA layout, 656 B per token and layer (512 fp8 latent + 4 fp32 scales + 64 bf16
# rope dims) instead of (kv_lora_rank + rope) x 1 B: vLLM's kv_cache_dtype "fp8_ds_mla" for DeepSeek sparse MLA.
FP8_DS_MLA_BYTES = 656


# Which --kv-cache-dtype vLLM serves DeepSeek sparse MLA (V3.2: index_topk, so kvwatch's index_head_dim) as
# fp8_ds_mla, by release. 0.11-0.13: DeepseekV32ForCausalLM.verify_and_update_config turns "auto" and every fp8* into
# it (vllm/model_executor/models/config.py; 0.12-0.13 not read); 0.14-0.16: only fp8*. From 0.18 (0.17 not read)
# the MLA layer does it when its backend is FLASHMLA_SPARSE (vllm/model_executor/layers/attention/mla_attention.py),
# which vllm/platforms/cuda.py picks for an fp8 cache on Hopper (the other Hopper sparse backends take no fp8). On
# Blackwell (SM100) 0.18 prefers FLASHINFER_MLA_SPARSE at <= 16 heads per rank, 0.20 for any quantized cache: plain
# fp8 stays. On SM12x, from 0.26 (0.20 has no sparse backend there; 0.21-0.25 not read),
# FLASHINFER_MLA_SPARSE_SM120 turns "auto", fp8 and fp8_e4m3 into fp8_ds_mla.
DS_MLA_FOR_AUTO_BEFORE = (0, 14)
DS_MLA_BY_BACKEND_SINCE = (0, 18)
SM100_FLASHINFER_SPARSE_FOR_FP8_SINCE = (0, 20)
SM120_SPARSE_MLA_SINCE = (0, 26)
# GLM-5's sparse MLA on Blackwell (SM10x): GlmMoeDsaForCausalLM.verify_and_update_config turns --kv-cache-dtype auto
# into fp8_e4m3 ("Using fp8 kv-cache for GlmMoeDsaForCausalLM on SM10x", vllm/model_executor/models/config.py, from
# 0.32.0; 0.31 has no such rule), which FLASHINFER_MLA_SPARSE then keeps plain.
GLM_DSA_FP8_ON_SM100_SINCE = (0, 32)
# IndexCache (index_topk_freq / index_topk_pattern): only some sparse-MLA layers build an indexer and cache its keys
# from 0.21.0 (vllm/model_executor/models/deepseek_v2.py; index_skip_topk_offset read from 0.25, 2 before).
INDEX_CACHE_SINCE = (0, 21)
INDEX_SKIP_OFFSET_SINCE = (0, 25)
_FLASHINFER_SPARSE_MAX_HEADS = 16  # 0.18's head count per rank at or below which SM100 prefers FlashInfer


def sparse_mla_kv_cache_dtype(arch: ModelArch, kv_cache_dtype: str, version: tuple[int, int],
                              capability: tuple[int, int] | None, tp: int) -> tuple[str, str | None]:
    """(the KV cache dtype vLLM runs a DeepSeek sparse MLA model with, a note on why) for ``--kv-cache-dtype``
    ``kv_cache_dtype`` (see DS_MLA_BY_BACKEND_SINCE); other models, and fp8_ds_mla itself, as asked, no note."""
    asked = kv_cache_dtype.lower()
    if not arch.is_mla or not arch.index_head_dim or asked == "fp8_ds_mla":
        return kv_cache_dtype, None
    fp8 = asked.startswith("fp8")
    values = int(arch.kv_lora_rank or 0) + int(arch.qk_rope_head_dim or 0)
    layout = (f"fp8_ds_mla, DeepSeek's FlashMLA layout ({FP8_DS_MLA_BYTES} B per token and layer instead of "
              f"{values} B fp8" + (f" or {values} model-dtype values" if asked == "auto" else "") + ")")
    if version < DS_MLA_BY_BACKEND_SINCE:
        if arch.model_type != "deepseek_v32":
            return kv_cache_dtype, None
        if fp8 or (asked == "auto" and version < DS_MLA_FOR_AUTO_BEFORE):
            return "fp8_ds_mla", (f"KV cache {layout}: vLLM {version[0]}.{version[1]}'s DeepseekV32ForCausalLM "
                                  f"config turns --kv-cache-dtype {kv_cache_dtype} into it")
        return kv_cache_dtype, None
    major = capability[0] if capability else None
    if major == 10 and asked == "auto" and version >= GLM_DSA_FP8_ON_SM100_SINCE and \
            "GlmMoeDsaForCausalLM" in arch.architectures:
        return "fp8_e4m3", ("KV cache fp8_e4m3, plain: vLLM's GlmMoeDsaForCausalLM config turns --kv-cache-dtype "
                            "auto into it on Blackwell (SM10x), and FLASHINFER_MLA_SPARSE keeps the standard layout")
    if major == 12:
        if version >= SM120_SPARSE_MLA_SINCE and asked in ("auto", "fp8", "fp8_e4m3"):
            return "fp8_ds_mla", (f"KV cache {layout}: on SM12x vLLM's FLASHINFER_MLA_SPARSE_SM120 backend serves "
                                  f"--kv-cache-dtype {kv_cache_dtype} in it")
        return kv_cache_dtype, None
    if not fp8:
        return kv_cache_dtype, None
    if major == 10:
        heads = arch.num_attention_heads // tp
        if version >= SM100_FLASHINFER_SPARSE_FOR_FP8_SINCE or heads <= _FLASHINFER_SPARSE_MAX_HEADS:
            return kv_cache_dtype, (f"KV cache {kv_cache_dtype} as plain fp8: on Blackwell (SM100) vLLM serves sparse "
                                    "MLA with FLASHINFER_MLA_SPARSE, which keeps the standard layout (FLASHMLA_SPARSE "
                                    "would use fp8_ds_mla)")
    gpu = {9: "Hopper", 10: "Blackwell (SM100)", None: "an unknown GPU (assumed Hopper)"}.get(major, "this GPU")
    return "fp8_ds_mla", (f"KV cache {layout}: on {gpu} vLLM serves sparse MLA with FLASHMLA_SPARSE, which stores "
                          f"--kv-cache-dtype {kv_cache_dtype} in it")


class UnsizedKvDtype(ValueError):
    """A KV cache dtype whose bytes per element (and scales) the model does not know: vLLM 0.33's nvfp4,
    ``*_per_token_head``, ``turboquant_*``. Sizing it as the model's dtype offered an FP8 cache as a 2x gain."""


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    """Bytes per KV element (:data:`kvwatch.capacity.units.DTYPE_BYTES`; ``auto``: the model's); UnsizedKvDtype for
    any other name."""
    kv = kv_cache_dtype.lower()
    if kv == "auto":
        return model_dtype_bytes
    if kv not in DTYPE_BYTES:
        raise UnsizedKvDtype(f"KV cache dtype {kv} is one kvwatch cannot size (its bytes per element and scales are "
                             "not modelled): no formula capacity, what-ifs or KV-dtype advice")
    return DTYPE_BYTES[kv]


def layers_on_rank(num_layers: int, pp: int) -> int:
    """Layers held by the largest pipeline stage (:func:`pp_stage_sizes`)."""
    return math.ceil(num_layers / pp)


def pp_stage_sizes(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM splits them without VLLM_PP_LAYER_PARTITION (get_pp_indices in
    vllm/distributed/utils.py): evenly, the remainder one each to the stages before the last, last first."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    return sizes


def indexer_layers(arch: ModelArch, version: tuple[int, int] | None = None) -> int:
    """The layers that cache sparse-MLA indexer keys under ``version``'s rules (None: the current ones)."""
    return arch.indexer_layers(version is None or version >= INDEX_CACHE_SINCE,
                               None if version is None or version >= INDEX_SKIP_OFFSET_SINCE else 2)


def indexer_bytes_per_layer(arch: ModelArch, version: tuple[int, int] | None = None) -> int:
    """Indexer-key bytes per token, spread over the layers (the pool holds their sum, whichever layers hold them),
    rounded up: at most one byte per token and layer above vLLM's sum where only some layers hold them."""
    shared = indexer_layers(arch, version)
    return math.ceil(arch.indexer_bytes_per_token * shared / max(1, arch.num_layers))


def kv_bytes_per_token_per_layer(arch: ModelArch, tp: int, kv_bytes: int, kv_cache_dtype: str = "auto",
                                 layer_type: str | None = None, version: tuple[int, int] | None = None) -> int:
    """One layer's KV bytes per token on one rank; ``layer_type`` picks that type's dims (ModelArch.kv_dims: the
    model's own without it), ``version`` whether V keeps a head size of its own (SEPARATE_V_HEAD_SIZE_SINCE;
    None: the current rules)."""
    if arch.is_mla:
        indexer = indexer_bytes_per_layer(arch, version)
        if kv_cache_dtype.lower() == "fp8_ds_mla":
            return FP8_DS_MLA_BYTES + indexer
        return (int(arch.kv_lora_rank or 0) + int(arch.qk_rope_head_dim or 0)) * kv_bytes + indexer
    if layer_type is None or not arch.attention_dims:
        return 2 * max(1, arch.num_kv_heads // tp) * arch.head_dim * kv_bytes
    separate_v = version is None or version >= SEPARATE_V_HEAD_SIZE_SINCE
    return arch.kv_dims(layer_type).bytes_per_token(tp, kv_bytes, separate_v=separate_v)


def _bucket(kind: str, version: tuple[int, int], attention_chunk_size: int | None) -> str:
    """The attention type vLLM groups a layer of ``kind`` under in ``version``."""
    if kind == SLIDING and version >= HYBRID_GROUPING_SINCE:
        return SLIDING
    if kind == CHUNKED and attention_chunk_size and version >= CHUNKED_HYBRID_SINCE:
        return CHUNKED
    return FULL


def group_layers(layer_types: tuple[str, ...], sliding_window: int | None,
                 version: tuple[int, int], mamba_layers: int = 0,
                 attention_chunk_size: int | None = None) -> tuple[int, tuple[KVGroup, ...]]:
    """vLLM's equal-size grouping of layers by type: returns (group_size, groups). ``mamba_layers`` state layers
    (hybrid models with modelled state pages) form a bucket of their own."""
    if not layer_types and not mamba_layers:
        return 0, ()
    buckets: dict[str, int] = {}
    for kind in layer_types:
        key = _bucket(kind, version, attention_chunk_size)
        buckets[key] = buckets.get(key, 0) + 1
    if mamba_layers:
        buckets[MAMBA] = mamba_layers

    def group(kind: str, n: int) -> KVGroup:
        return _kv_group(kind, n, sliding_window, attention_chunk_size)

    if len(buckets) == 1:
        kind, count = next(iter(buckets.items()))
        return count, (group(kind, count),)
    group_size = _group_size(buckets.values())
    groups: list[KVGroup] = []
    for kind in (FULL, SLIDING, CHUNKED, MAMBA):
        remaining = buckets.get(kind, 0)
        while remaining > 0:
            groups.append(group(kind, min(group_size, remaining)))
            remaining -= group_size
    return group_size, tuple(groups)


def _group_size(bucket_sizes: Iterable[int]) -> int:
    """vLLM's layers per group: the smallest bucket's count, or the largest's when under 1.5 x the smallest."""
    sizes = list(bucket_sizes)
    smallest, largest = min(sizes), max(sizes)
    return largest if largest < smallest * 1.5 else smallest


def _kv_group(kind: str, n: int, sliding_window: int | None, attention_chunk_size: int | None) -> KVGroup:
    return KVGroup(kind, n, sliding_window if kind == SLIDING else None,
                   attention_chunk_size if kind == CHUNKED else None)


def _mamba_pages(arch: ModelArch, version: tuple[int, int]) -> bool:
    return arch.mamba_dims is not None and bool(arch.mamba_layers) and version >= MAMBA_PAGES_SINCE


def rank_groups(arch: ModelArch, pp: int, version: tuple[int, int]) -> tuple[int, tuple[KVGroup, ...]]:
    """(group_size, groups) of the pipeline stage whose block row is widest, whose slice of layers shares one
    block pool: the model's architecture and the vLLM version decide it, not the card (the grouping of
    :func:`kv_layout`, and what divides an engine's reported blocks among the groups)."""
    if pp > 1 and version >= STAGED_GROUPS_SINCE:
        staged = _staged_groups(arch, pp, version)
        if staged is not None:
            return staged
    types = arch.kv_cache_layer_types
    stage_types = types[:layers_on_rank(len(types), pp)]
    mamba_on_rank = layers_on_rank(arch.mamba_layers, pp) if _mamba_pages(arch, version) else 0
    return group_layers(stage_types, arch.sliding_window, version, mamba_on_rank, arch.attention_chunk_size)


def _staged_groups(arch: ModelArch, pp: int, version: tuple[int, int]) -> tuple[int, tuple[KVGroup, ...]] | None:
    """With pipeline parallelism and layers of several kinds, vLLM groups the whole model's layers (each kind's
    layers dealt round-robin into groups, ``layers[i::n]``) and each stage holds its share of every group
    (get_kv_cache_configs in vllm/v1/core/kv_cache_utils.py, 0.11-0.32); a stage's block row is its largest share,
    and the pool is the smallest stage's. Gemma-3-27B at PP 4: groups of 3 layer slots where grouping the first
    stage on its own gave 2 (31 % too many requests). None for one kind of layer (the stage's own layers are its
    one group) or a hybrid whose state layers' places are not known."""
    types = arch.layer_types or (FULL,) * arch.num_layers
    buckets: dict[str, list[int]] = {}
    for i, kind in enumerate(types[:max(0, len(types) - arch.kv_shared_layers)]):
        if kind not in (MAMBA, MLP_ONLY):
            buckets.setdefault(_bucket(kind, version, arch.attention_chunk_size), []).append(i)
    if _mamba_pages(arch, version):
        places = [i for i, kind in enumerate(types) if kind == MAMBA] or (
            list(range(len(types))) if arch.mamba_layers == len(types) else [])  # Falcon-H1: every layer
        if len(places) != arch.mamba_layers:
            return None
        buckets[MAMBA] = places
    if len(buckets) < 2:
        return None
    group_size = _group_size(len(layers) for layers in buckets.values())
    kinds = [k for k in (FULL, SLIDING, CHUNKED, MAMBA) if k in buckets]
    members = [(kind, buckets[kind][j::n]) for kind in kinds
               for n in [math.ceil(len(buckets[kind]) / group_size)] for j in range(n)]
    shares: list[int] = []
    start = 0
    for size in pp_stage_sizes(len(types), pp):
        share = [sum(start <= layer < start + size for layer in layers) for _, layers in members]
        if not shares or max(share) > max(shares):
            shares = share
        start += size
    return max(shares), tuple(_kv_group(kind, count, arch.sliding_window, arch.attention_chunk_size)
                              for (kind, _), count in zip(members, shares, strict=True))


def kv_layout(arch: ModelArch, tp: int, pp: int, kv_bytes: int, block_size: int,
              version: tuple[int, int], kv_cache_dtype: str = "auto", model_dtype_bytes: int | None = None,
              cache_mode: str = "none") -> KVLayout:
    """One rank's layout. Hybrid Mamba models with known state dimensions get vLLM's unified pages: the state
    (conv in the model dtype, temporal state in :func:`mamba_ssm_dtype_bytes`, default the model's) sets the block
    size, and ``cache_mode`` (:func:`mamba_cache_mode`) how many state blocks a request holds. Layer types with
    KV dims of their own (ModelArch.attention_dims) get vLLM's page unification (UNIFIED_PAGE_SIZES_SINCE): the
    largest page is the layout's, and the groups with a smaller one their own block size (KVGroup.block_size)."""
    on_rank = layers_on_rank(len(arch.kv_cache_layer_types), pp)
    per_layer = kv_bytes_per_token_per_layer(arch, tp, kv_bytes, kv_cache_dtype, version=version)
    group_size, groups = rank_groups(arch, pp, version)
    per_bucket = _bytes_by_bucket(arch, tp, kv_bytes, version, kv_cache_dtype)
    # The rank's layers, group by group (with pipeline parallelism the widest stage's share, rank_groups).
    total = sum(g.num_layers * per_bucket.get(g.kind, 0) for g in groups)
    if per_bucket:  # layer types with dims of their own: the largest page sets the page
        per_layer = max(per_bucket.values())
    mamba_page = 0
    effective_block = block_size
    if _mamba_pages(arch, version):
        mamba_page = arch.mamba_dims.page_bytes(tp, model_dtype_bytes or kv_bytes, mamba_ssm_dtype_bytes(arch, version))
        effective_block = mamba.attention_block_size(mamba_page, per_layer, block_size, version, is_mla=arch.is_mla)
    refusal = warning = ""
    if len(set(per_bucket.values())) > 1:
        groups, refusal, warning = _unify_pages(groups, per_bucket, effective_block, version)
    return KVLayout(
        block_size=effective_block,
        bytes_per_token_per_layer=per_layer,
        group_size=group_size,
        groups=groups,
        num_attention_layers=on_rank,
        mamba_page_bytes=mamba_page,
        requested_block_size=block_size,
        mamba_blocks_per_request=mamba_state_blocks(arch, version, cache_mode) if mamba_page else 1,
        attention_bytes_per_token=total if per_bucket else 0,
        page_refusal=refusal,
        page_warning=warning,
    )


def _bytes_by_bucket(arch: ModelArch, tp: int, kv_bytes: int, version: tuple[int, int],
                     kv_cache_dtype: str) -> dict[str, int]:
    """{group kind: its layers' bytes per token and layer} when layer types have KV dims of their own
    (ModelArch.attention_dims; their pages may still come out equal, as Gemma 4's do at TP 8); {} for every other
    model. Over the whole model's layers, as vLLM unifies the pages of the whole model's specs (a pipeline stage
    without a full layer still gets its page size). A kind that merges types of different sizes (only before
    UNIFIED_PAGE_SIZES_SINCE, which refuses them anyway) takes the largest."""
    if not arch.attention_dims or arch.is_mla:
        return {}
    per_bucket: dict[str, int] = {}
    for kind in set(arch.kv_cache_layer_types):
        size = kv_bytes_per_token_per_layer(arch, tp, kv_bytes, kv_cache_dtype, kind, version)
        key = _bucket(kind, version, arch.attention_chunk_size)
        per_bucket[key] = max(per_bucket.get(key, 0), size)
    return per_bucket


def _unify_pages(groups: tuple[KVGroup, ...], per_bucket: dict[str, int], block_size: int,
                 version: tuple[int, int]) -> tuple[tuple[KVGroup, ...], str, str]:
    """vLLM's ``unify_kv_cache_spec_page_size`` (see UNIFIED_PAGE_SIZES_SINCE) on the attention groups: (the groups
    with their own block sizes and bytes per token, why vLLM refuses to start or "", a warning or "")."""
    largest = max(per_bucket.values())
    sizes = ", ".join(f"{kind.split('_')[0]} layers {size:,} B" for kind, size in sorted(per_bucket.items()))
    refusal = warning = ""
    if version < UNIFIED_PAGE_SIZES_SINCE:
        refusal = (f"vLLM will not start: its attention layer types have KV pages of different sizes ({sizes} per "
                   f"token and layer), and vLLM {version[0]}.{version[1]} cannot unify them (0.11's "
                   "get_kv_cache_groups raises NotImplementedError; vLLM 0.14 and later multiply the smaller pages' "
                   "block size)")
    out: list[KVGroup] = []
    for group in groups:
        size = per_bucket.get(group.kind)
        if size is None:  # a Mamba group: its page is already padded to the attention page
            out.append(group)
            continue
        if size == largest or largest % size or refusal:
            out.append(replace(group, bytes_per_token_per_layer=size))
        else:
            out.append(replace(group, block_size=block_size * (largest // size), bytes_per_token_per_layer=size))
        if largest % size and not refusal:
            what = (f"the {group.kind.split('_')[0]} layers' KV page ({size:,} B per token and layer) does not "
                    f"divide the largest ({largest:,} B)")
            if version < PADDED_PAGE_SIZES_SINCE:
                refusal = (f"vLLM will not start: {what}, so unify_kv_cache_spec_page_size cannot unify them by "
                           "adjusting the block size (NotImplementedError)")
            elif version < PADDED_PAGES_ANY_BACKEND_SINCE and not warning:
                warning = (f"{what}: vLLM {version[0]}.{version[1]} pads that page to the largest only when the "
                           "attention backend indexes KV by the block stride, and refuses to start otherwise; "
                           "kvwatch assumes the padding")
    return tuple(out), refusal, warning


def uniform_layout(kv_bytes_per_token: int, block_size: int) -> KVLayout:
    """A layout when only the per-token byte count is known (one group, one 'layer')."""
    return KVLayout(block_size=block_size, bytes_per_token_per_layer=kv_bytes_per_token, group_size=1,
                    groups=(KVGroup(FULL, 1),), num_attention_layers=1)


def num_gpu_blocks(available_bytes: float, layout: KVLayout) -> int:
    if available_bytes <= 0 or layout.bytes_per_block_row <= 0:
        return 0
    return int(available_bytes // layout.bytes_per_block_row)


def tokens_needed(layout: KVLayout, seq_len: float) -> float:
    """Block-row tokens one running request of ``seq_len`` tokens holds, summed over groups, in whole blocks.

    A sliding-window group frees the blocks its window has passed as the request runs (vLLM's
    ``SlidingWindowManager.get_num_skipped_tokens``: the tokens before ``computed - window + 1``), so it holds at
    most ``window - 1`` tokens and the newest one's block (a window does not start on a block boundary; a request
    shorter than that, all its tokens, as full attention: a block more there made a window lower the ceiling); a
    chunked-local group at most its chunk (``ChunkedLocalAttentionManager`` frees what precedes the current chunk).
    What a prefill step adds beyond the window is held by the requests being prefilled only: :func:`in_flight_reserve`.
    Counted in tokens of the layout's ``block_size``: a group with larger blocks (unified pages) spends one block
    per its own block size.
    """
    total = 0.0
    for group in layout.groups:
        if group.kind == MAMBA:  # state blocks per request, whatever its length ("all": one per block)
            total += layout.block_size * layout.mamba_blocks_per_request if layout.mamba_blocks_per_request \
                else seq_len
            continue
        block = layout.group_block_size(group)
        cap = _running_hold(layout, group)
        # A group holding all of a request's tokens holds whole blocks of them (a request shorter than one a whole
        # one: 1-token requests read 16x as many fitting; at a hybrid's 784-token blocks a 1,000-token request
        # holds 1,568, not 1,000), as the sidecar's ceiling counts them (kvwatch.derived); a windowed group holds no
        # more than its window's hold, whose newest block is in it already.
        held = math.ceil(seq_len / block) * block
        total += _in_layout_blocks(layout, held if cap is None else min(held, cap), block)
    return total


def _running_hold(layout: KVLayout, group: KVGroup) -> float | None:
    """The most tokens a running request holds in a windowed group (``window - 1`` and a block; a chunked group's
    chunk), None where it holds all of its tokens."""
    if group.kind == SLIDING and group.sliding_window:
        return group.sliding_window - 1 + layout.group_block_size(group)
    if group.kind == CHUNKED and group.attention_chunk_size:
        return group.attention_chunk_size
    return None


def in_flight_reserve(layout: KVLayout, seq_len: float, in_flight_tokens: int, requests: float | None = None) -> float:
    """Block-row tokens of the pool that prefill steps hold beyond the windows of requests of ``seq_len`` tokens
    (with ``requests``, of that many: at most one prompt's each).

    A request being prefilled holds its window (chunk) plus the step's new tokens in each sliding (chunked-local)
    group: at most what it has beyond what a running one holds there (:func:`tokens_needed`: the window and a block,
    the chunk). The new tokens of the steps in flight are at most ``in_flight_tokens`` over all requests (the
    scheduler's token budget, :func:`in_flight_tokens`), which holds most when it is whole prompts:
    ``floor(budget ÷ L)`` of them, each that far beyond, and the rest of the budget as part of one more (one
    request's overhang alone understated it by 4 on Gemma-3 at 4,000 tokens). vLLM's
    ``max_memory_usage_bytes`` charges the budget to every request: its worst case at max_model_len
    (:func:`blocks_needed`), not the running state of many requests.
    """
    total = 0.0
    for group in layout.groups:
        steady = _running_hold(layout, group)  # beyond what a running request holds there (tokens_needed)
        beyond = seq_len - steady if steady else 0.0
        if beyond > 0:
            prompts = math.floor(in_flight_tokens / seq_len)
            held = min(float(in_flight_tokens), prompts * beyond + min(in_flight_tokens - prompts * seq_len, beyond))
            if requests is not None:
                held = min(held, requests * min(float(in_flight_tokens), beyond))
            total += _in_layout_blocks(layout, held, layout.group_block_size(group))
    return total


def _in_layout_blocks(layout: KVLayout, tokens: float, block: int) -> float:
    # a group with larger blocks (unified pages) spends one block id per `block` tokens: in the layout's
    # block_size tokens, that is tokens × block_size ÷ block
    return tokens if block == layout.block_size else tokens * layout.block_size / block


def blocks_needed(layout: KVLayout, seq_len: int, in_flight_tokens: int) -> int:
    """Whole blocks one request of ``seq_len`` tokens holds, summed over groups (vLLM's figure)."""
    total = 0
    for group in layout.groups:
        block = layout.group_block_size(group)
        if group.kind == MAMBA:
            total += layout.mamba_blocks_per_request or math.ceil(seq_len / layout.block_size)
        elif group.kind == SLIDING and group.sliding_window:
            cap = group.sliding_window - 1 + in_flight_tokens
            total += math.ceil(min(seq_len, cap) / block) + 1
        elif group.kind == CHUNKED and group.attention_chunk_size:
            total += math.ceil(min(seq_len, group.attention_chunk_size + in_flight_tokens) / block)
        else:
            total += math.ceil(seq_len / block)
    return total


def max_concurrency_at(layout: KVLayout, blocks: int, seq_len: float, in_flight_tokens: int) -> float:
    """How many running requests of ``seq_len`` tokens fit: the pool's tokens, less what prefill steps hold beyond
    the windows, ÷ tokens one request holds (on a model without windows, pool tokens ÷ ``seq_len`` in whole blocks,
    :func:`tokens_needed`). The steps hold
    no more than the requests there are can (one prompt's overhang each): with fewer requests than the budget's
    prompts, each is charged its own, vLLM's worst case (the budget taken whole fell below it)."""
    return max_concurrency_terms(layout, blocks, seq_len, in_flight_tokens)[0]


def max_concurrency_terms(layout: KVLayout, blocks: int, seq_len: float,
                          in_flight_tokens: int) -> tuple[float, float, float]:
    """(requests, tokens the prefill steps hold beyond the windows then, tokens one request holds) of
    :func:`max_concurrency_at`, for the plan's walk-through."""
    if seq_len <= 0:
        raise ValueError("sequence length must be positive")
    in_flight_tokens = max(0, in_flight_tokens)
    pool = blocks * layout.block_size
    per_request = tokens_needed(layout, seq_len)
    budget_bound = max(0.0, pool - in_flight_reserve(layout, seq_len, in_flight_tokens)) / per_request
    each_bound = pool / (per_request + in_flight_reserve(layout, seq_len, in_flight_tokens, requests=1))
    requests = max(budget_bound, each_bound)
    return requests, pool - requests * per_request, per_request


@dataclass(frozen=True)
class LayoutPool:
    """An engine's block pool as a model's layout fills it where that layout counts by group
    (:attr:`KVLayout.counts_by_group`: sliding or chunked-local groups free what a request's window has passed, a
    Mamba group holds a state), for the ceiling at a request size the engine's token figure cannot give: that figure
    is ``blocks ÷ groups`` or vLLM's concurrency × max_model_len, each request charged all its tokens in every
    group."""

    layout: KVLayout
    blocks: int
    in_flight_tokens: int

    def requests_at(self, seq_len: float) -> float:
        """Running requests of ``seq_len`` tokens that fit (:func:`max_concurrency_at`)."""
        return max_concurrency_at(self.layout, self.blocks, seq_len, self.in_flight_tokens)

    def length_at(self, requests: float) -> float:
        """The request length of which ``requests`` fit (the inverse of :meth:`requests_at`, which falls as the length
        grows), to 0.01 % in 1 to 2^24 tokens: the size a change's ceiling is compared at."""
        return _length_at(self, requests)


@functools.lru_cache(maxsize=256)
def _length_at(pool: LayoutPool, requests: float) -> float:
    # (cached: serve's what-ifs and its advice ask for the same pool and ceiling in one poll, ~20 fits each)
    low, high = 0.0, 24.0  # log2 of the length
    if pool.requests_at(1.0) <= requests:
        return 1.0
    if pool.requests_at(2.0 ** high) >= requests:
        return 2.0 ** high
    while high - low > 1.5e-4:  # (2^1.5e-4 - 1 ≈ 0.01 %)
        mid = (low + high) / 2
        low, high = (mid, high) if pool.requests_at(2.0 ** mid) > requests else (low, mid)
    # The bracket's upper end, where no more than ``requests`` fit: a request holds whole blocks, so as many fit at
    # every length of a block's step, and the upper end is the step's shortest length (just past the previous block
    # edge); the midpoint of that edge fell on either side of it (a ceiling read back at the step below).
    return 2.0 ** high


def max_concurrency_at_max_model_len(layout: KVLayout, blocks: int, max_model_len: int,
                                     in_flight_tokens: int) -> float:
    """vLLM's "Maximum concurrency for N tokens per request" (whole blocks per request)."""
    return blocks / blocks_needed(layout, max_model_len, in_flight_tokens)


def reported_kv_cache_tokens(layout: KVLayout, blocks: int, max_model_len: int | None,
                             in_flight_tokens: int, version: tuple[int, int]) -> int:
    """The "GPU KV cache size: N tokens" figure vLLM prints and exports, per version.

    Before 0.20: ``blocks // num_groups × block_size`` (vLLM's smallest group block size when they differ). From
    0.20: ``int(max_concurrency × max_model_len)``, which on sliding-window models depends on max_model_len (it is
    not a byte-linear capacity).
    """
    if version >= TOKENS_FROM_CONCURRENCY_SINCE and max_model_len:
        conc = max_concurrency_at_max_model_len(layout, blocks, max_model_len, in_flight_tokens)
        return int(conc * max_model_len)
    return blocks_per_group_tokens(blocks, layout.num_groups, layout.block_size)


def blocks_per_group_tokens(blocks: int, groups: int, block_size: int) -> int:
    """vLLM 0.9-0.19's token figure for a pool of ``blocks`` shared among ``groups`` KV groups (one group: all of
    them): ``blocks // groups × block_size``, the engine's as the formula's."""
    return blocks // max(1, groups) * block_size
