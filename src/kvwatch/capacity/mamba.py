"""Mamba / linear-attention state pages and vLLM's page-size unification for hybrid models (pure).

vLLM (V1, >= 0.10.2) keeps one constant-size state per request and per Mamba / linear-attention layer in the same
block pool as the attention KV cache. Its ``HybridAttentionMambaModelConfig.verify_and_update_config``
(``vllm/model_executor/models/config.py``; later ``_align_hybrid_block_size`` in ``vllm/platforms/interface.py``)
makes every page the same size:

- the Mamba page is the sum of its state tensors (``MambaSpec.page_size_bytes``), shapes from
  ``MambaStateShapeCalculator`` (``vllm/model_executor/layers/mamba/mamba_utils.py``), dtype the model's unless
  ``--mamba-ssm-cache-dtype`` says otherwise;
- the attention block size becomes ``A × ceil(mamba_page / (A × attention_bytes_per_token))`` when the
  user's ``--block-size`` is smaller ("Setting attention block size to N tokens ..." in the startup log), ``A``
  the alignment of :func:`hybrid_block_alignment` (16 on FlashAttention; it depends on the release, on MLA and,
  from 0.20, on ``--block-size`` itself);
- the Mamba page is then padded up to the attention page ("Padding mamba page size by X% ...").

A request holds ``ceil(len / block_size)`` blocks in each attention group and exactly one block in each Mamba group
(no prefix caching; vLLM's "align" prefix-caching mode keeps more, which kvwatch does not model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAMBA1 = "mamba1"
MAMBA2 = "mamba2"
GATED_DELTA_NET = "gated_delta_net"  # Qwen3-Next's linear attention
LINEAR_ATTENTION = "linear_attention"  # MiniMax's lightning attention
KDA = "kda"  # Kimi-Linear's Kimi Delta Attention (vllm/model_executor/layers/kda.py)
SHORT_CONV = "short_conv"  # LFM2's gated short convolution (vllm/model_executor/models/lfm2.py)
HYBRID_BLOCK_ALIGNMENT = 16  # "some attention backends (e.g. FA) only support block sizes that are multiples of 16"
# From 0.20 vLLM aligns to max(the backend's smallest kernel block, --block-size) (``kernel_block_alignment_size``
# in vllm/platforms/interface.py ``_align_hybrid_block_size``); 0.11-0.18 aligned to a fixed size whatever
# --block-size said (HybridAttentionMambaModelConfig in vllm/model_executor/models/config.py; 0.19 not read).
USER_BLOCK_ALIGNMENT_SINCE = (0, 20)
# MLA hybrids (Kimi-Linear): 0.14-0.18 aligned to 64 (128 only with --attention-backend CUTLASS_MLA, not modelled);
# from 0.20 to the MLA backend's smallest block (16 for FLASH_ATTN_MLA, Hopper's first choice); from 0.28 to at
# least 128 ("TRTLLM/FlashInfer MLA decode kernels require ..."; 0.26 does not, 0.27 not read).
MLA_HYBRID_ALIGNMENT_BEFORE_0_20 = 64
MLA_HYBRID_ALIGNMENT_128_SINCE = (0, 28)
MLA_HYBRID_MIN_ALIGNMENT = 128


class MambaConfigError(ValueError):
    """The config names a hybrid model but lacks a state dimension (message names the field)."""


@dataclass(frozen=True)
class MambaDims:
    """The state dimensions of one Mamba / linear-attention layer (whole model, not per rank)."""

    kind: str
    intermediate_size: int = 0  # mamba1 / mamba2: the inner width
    n_groups: int = 1
    num_heads: int = 0  # mamba2 heads; linear attention heads; gated delta net value heads
    head_dim: int = 0  # mamba2 head dim; linear attention head dim; gated delta net value head dim
    state_size: int = 0  # d_state
    conv_kernel: int = 4
    num_k_heads: int = 0  # gated delta net, KDA
    head_k_dim: int = 0  # gated delta net, KDA
    source: str = ""

    def state_shapes(self, tp: int) -> tuple[tuple[int, ...], ...]:
        """Per-rank state tensor shapes, as ``MambaStateShapeCalculator`` computes them."""
        if self.kind == LINEAR_ATTENTION:
            return ((self.num_heads // tp, self.head_dim, self.head_dim),)
        if self.kind == SHORT_CONV:  # short_conv_state_shape: the conv state alone, in the model's dtype
            return ((self.conv_kernel - 1, _divide(self.intermediate_size, tp, "conv_dim")),)
        if self.kind == KDA:  # conv states for q, k and v, then the recurrent state (kda_state_shape)
            conv_q = (self.conv_kernel - 1, _divide(self.num_heads * self.head_dim, tp, "KDA projection size"))
            conv_k = (self.conv_kernel - 1, _divide(self.num_k_heads * self.head_k_dim, tp, "KDA projection size"))
            return (conv_q, conv_k, conv_k,
                    (_divide(self.num_heads, tp, "KDA heads"), self.head_dim, self.head_dim))
        if self.kind == GATED_DELTA_NET:
            conv_dim = self.head_k_dim * self.num_k_heads * 2 + self.head_dim * self.num_heads
            return ((self.conv_kernel - 1, _divide(conv_dim, tp, "conv dim")),
                    (_divide(self.num_heads, tp, "linear_num_value_heads"), self.head_dim, self.head_k_dim))
        if self.kind == MAMBA1:
            inner = _divide(self.intermediate_size, tp, "mamba intermediate size")
            return ((self.conv_kernel - 1, inner), (inner, self.state_size))
        # mamba2: a single group is replicated when TP does not divide it (extra_groups_for_head_shards); more groups
        # than one must divide evenly (vLLM's MambaMixer2 asserts n_groups % tp == 0 or n_groups == 1)
        if self.n_groups > 1 and self.n_groups % tp:
            raise MambaConfigError(f"vLLM requires --tensor-parallel-size to divide the Mamba2 state groups "
                                   f"(n_groups {self.n_groups}) when there is more than one; {tp} does not")
        groups = self.n_groups if self.n_groups % tp == 0 else tp
        conv_dim = self.intermediate_size + 2 * groups * self.state_size
        return ((self.conv_kernel - 1, _divide(conv_dim, tp, "mamba conv dim")),
                (_divide(self.num_heads, tp, "mamba heads"), self.head_dim, self.state_size))

    def page_bytes(self, tp: int, dtype_bytes: int, ssm_dtype_bytes: int | None = None) -> int:
        """``MambaSpec.page_size_bytes`` before padding: the conv states (and linear attention's only state) in
        the model's dtype, the temporal state (the last tensor) in ``ssm_dtype_bytes`` (default: the model's)."""
        shapes = self.state_shapes(tp)
        temporal = len(shapes) - 1 if len(shapes) > 1 else None
        total = 0
        for i, shape in enumerate(shapes):
            size = ssm_dtype_bytes if i == temporal and ssm_dtype_bytes is not None else dtype_bytes
            total += math.prod(shape) * size
        return total


def _divide(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise MambaConfigError(f"vLLM requires --tensor-parallel-size to divide the {what} ({value}); {tp} does not")
    return value // tp


def hybrid_block_alignment(version: tuple[int, int], user_block_size: int, is_mla: bool = False) -> int:
    """The multiple vLLM rounds a hybrid model's attention block size up to (see USER_BLOCK_ALIGNMENT_SINCE)."""
    if version < USER_BLOCK_ALIGNMENT_SINCE:
        return MLA_HYBRID_ALIGNMENT_BEFORE_0_20 if is_mla else HYBRID_BLOCK_ALIGNMENT
    alignment = max(HYBRID_BLOCK_ALIGNMENT, user_block_size)
    if is_mla and version >= MLA_HYBRID_ALIGNMENT_128_SINCE:
        alignment = max(alignment, MLA_HYBRID_MIN_ALIGNMENT)
    return alignment


def attention_block_size(mamba_page: int, attention_bytes_per_token: int, user_block_size: int,
                         version: tuple[int, int], *, is_mla: bool = False) -> int:
    """The block size vLLM uses on a hybrid model: the user's when its page already holds a Mamba state, else
    the smallest multiple of :func:`hybrid_block_alignment` whose attention page does."""
    if mamba_page <= 0 or attention_bytes_per_token <= 0:
        return user_block_size
    alignment = hybrid_block_alignment(version, user_block_size, is_mla)
    needed = alignment * -(-mamba_page // (alignment * attention_bytes_per_token))
    return max(user_block_size, needed)


def padding_percent(mamba_page: int, attention_page: int) -> float:
    """What vLLM logs as "Padding mamba page size by X%"."""
    return 100.0 * (attention_page - mamba_page) / mamba_page if mamba_page else 0.0


def _first(cfg: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):  # a list or a word: say which field, not int()'s complaint
                raise MambaConfigError(f"config.json has {key} = {value!r:.60}: kvwatch needs a number there") from None
    return None


def mamba_dims_from_config(cfg: dict[str, Any], model_type: str, hidden: int) -> MambaDims | None:
    """The state dimensions from a hybrid model's ``config.json`` (the field names vLLM's model classes read);
    None when the family's fields are absent (the state pages are then not modelled, and a note says so)."""
    if cfg.get("linear_num_value_heads") and cfg.get("linear_value_head_dim"):  # Qwen3-Next
        heads, head_dim = _first(cfg, "linear_num_value_heads") or 0, _first(cfg, "linear_value_head_dim") or 0
        return MambaDims(GATED_DELTA_NET, num_heads=heads, head_dim=head_dim,
                         num_k_heads=_first(cfg, "linear_num_key_heads") or heads,
                         head_k_dim=_first(cfg, "linear_key_head_dim") or head_dim,
                         conv_kernel=_first(cfg, "linear_conv_kernel_dim") or 4,
                         source="linear_num_value_heads/linear_value_head_dim (gated delta net)")
    kda = _kda_dims(cfg.get("linear_attn_config"))
    if kda is not None:
        return kda
    if model_type == "bailing_hybrid":  # Ling/Ring 2.5 (lightning attention) and 3.0 (KDA) beside MLA layers
        heads, head_dim = _attention_heads(cfg, hidden)
        if not (heads and head_dim):
            return None
        if bailing_v3(cfg):  # bailing_moe_v3.py
            return MambaDims(KDA, num_heads=heads, head_dim=head_dim, num_k_heads=heads, head_k_dim=head_dim,
                             conv_kernel=_first(cfg, "short_conv_kernel_size") or 4,
                             source="num_attention_heads/head_dim/short_conv_kernel_size (KDA)")
        return MambaDims(LINEAR_ATTENTION, num_heads=heads, head_dim=head_dim,  # bailing_moe_linear.py
                         source="num_attention_heads/head_dim (linear attention)")
    if model_type.startswith("lfm2") and cfg.get("conv_L_cache"):  # LFM2's short convolution: (L - 1, conv_dim)
        # lfm2.py passes conv_dim; lfm2_moe.py and lfm2_vl.py pass hidden_size (vLLM 0.14-0.30)
        conv_dim = _first(cfg, "conv_dim") if model_type == "lfm2" else None
        return MambaDims(SHORT_CONV, intermediate_size=conv_dim or hidden, conv_kernel=_first(cfg, "conv_L_cache"),
                         source="conv_L_cache/" + ("conv_dim" if conv_dim else "hidden_size") + " (short convolution)")
    if "minimax" in model_type and cfg.get("attn_type_list"):  # lightning attention: (heads, d, d) per layer
        heads, head_dim = _attention_heads(cfg, hidden)
        if heads and head_dim:
            return MambaDims(LINEAR_ATTENTION, num_heads=heads, head_dim=head_dim,
                             source="num_attention_heads/head_dim (linear attention)")
        return None
    heads = _first(cfg, "mamba_n_heads", "mamba_num_heads", "n_mamba_heads")
    head_dim = _first(cfg, "mamba_d_head", "mamba_head_dim", "mamba_headdim")
    state = _first(cfg, "mamba_d_state", "ssm_state_size")
    if heads and head_dim and state:  # Mamba2: Granite-4.0-H, Bamba, Nemotron-H, Falcon-H1, Zamba2
        inner = _first(cfg, "mamba_d_ssm") or heads * head_dim
        return MambaDims(MAMBA2, intermediate_size=inner, num_heads=heads, head_dim=head_dim, state_size=state,
                         n_groups=_first(cfg, "mamba_n_groups", "n_groups", "mamba_ngroups") or 1,
                         conv_kernel=_first(cfg, "mamba_d_conv", "conv_kernel") or 4,
                         source="mamba_n_heads/mamba_d_head/mamba_d_state (Mamba2)")
    if model_type == "jamba" and state:  # Mamba1
        expand = _first(cfg, "mamba_expand") or 2
        return MambaDims(MAMBA1, intermediate_size=expand * hidden, state_size=state,
                         conv_kernel=_first(cfg, "mamba_d_conv") or 4, source="mamba_expand/mamba_d_state (Mamba1)")
    return None


def bailing_v3(cfg: dict[str, Any]) -> bool:
    """Ling/Ring 3.0 (BailingMoeV3ForCausalLM: KDA linear layers); else 2.5 (lightning attention)."""
    return any("BailingMoeV3" in str(a) for a in cfg.get("architectures") or [])


def _attention_heads(cfg: dict[str, Any], hidden: int) -> tuple[int | None, int | None]:
    """(num_attention_heads, head_dim or hidden ÷ heads): a linear-attention state's heads and size."""
    heads = _first(cfg, "num_attention_heads")
    return heads, _first(cfg, "head_dim") or (hidden // heads if heads else None)


def _kda_dims(linear: Any) -> MambaDims | None:
    """Kimi-Linear's KDA state from ``linear_attn_config`` (vLLM's KimiLinearForCausalLM passes num_heads,
    head_dim and short_conv_kernel_size; the key heads and dims equal the value ones)."""
    if not isinstance(linear, dict) or not linear.get("kda_layers"):
        return None
    heads, head_dim = _first(linear, "num_heads"), _first(linear, "head_dim")
    kernel = _first(linear, "short_conv_kernel_size")
    if not (heads and head_dim and kernel):
        return None
    return MambaDims(KDA, num_heads=heads, head_dim=head_dim, num_k_heads=heads, head_k_dim=head_dim,
                     conv_kernel=kernel, source="linear_attn_config num_heads/head_dim/short_conv_kernel_size (KDA)")
