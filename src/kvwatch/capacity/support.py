"""Which vLLM releases serve an architecture: the ones vLLM dropped, and the last release that served each; and
the architectures whose KV layout kvwatch does not model.

vLLM refuses a dropped architecture at startup ("Model architecture X was supported in vLLM until vY, and is not
supported anymore", ModelRegistry._raise_for_unsupported). The table is vLLM 0.30's ``_PREVIOUSLY_SUPPORTED_MODELS``
(vllm/model_executor/models/registry.py); an architecture dropped after 0.30 is not in it.
"""

from __future__ import annotations

from collections.abc import Iterable

LAST_SERVED_IN: dict[str, str] = {
    # vLLM's table says 0.10.2, but 0.11 still registers it (its registry.py and motif.py); 0.14 does not.
    "MotifForCausalLM": "0.11.0",
    "Phi3SmallForCausalLM": "0.9.2",
    "Phi4FlashForCausalLM": "0.10.2",
    "Phi4MultimodalForCausalLM": "0.12.0",
    "JAISLMHeadModel": "0.22.0",
    "ErnieModel": "0.23.0",
    "ErnieForSequenceClassification": "0.23.0",
    "ErnieForTokenClassification": "0.23.0",
    "InternLM2VEForCausalLM": "0.23.0",
    "QWenLMHeadModel": "0.23.0",
    "QwenVLForConditionalGeneration": "0.23.0",
    "InternLMForCausalLM": "0.23.0",
    "DonutForConditionalGeneration": "0.10.2",
    "MllamaForConditionalGeneration": "0.10.2",
    "XverseForCausalLM": "0.23.0",
    "Dots1ForCausalLM": "0.23.0",
    "BambaForCausalLM": "0.23.0",
    "MiniMaxForCausalLM": "0.23.0",
    "MiniMaxText01ForCausalLM": "0.23.0",
    "MiniMaxM1ForCausalLM": "0.23.0",
    "MiniMaxVL01ForConditionalGeneration": "0.23.0",
    "BaiChuanForCausalLM": "0.23.0",
    "BaichuanForCausalLM": "0.23.0",
    "AquilaModel": "0.24.0",
    "AquilaForCausalLM": "0.24.0",
    "Grok1ModelForCausalLM": "0.24.0",
    "Grok1ForCausalLM": "0.24.0",
    "TarsierForConditionalGeneration": "0.24.0",
    "Tarsier2ForConditionalGeneration": "0.23.0",
    "MantisForConditionalGeneration": "0.24.0",
    "MusicFlamingoForConditionalGeneration": "0.24.0",
    "AyaVisionForConditionalGeneration": "0.24.0",
    "TeleChatForCausalLM": "0.25.0",
    "PersimmonForCausalLM": "0.25.0",
    "FuyuForCausalLM": "0.25.0",
    "Plamo2ForCausalLM": "0.26.0",
    "OuroForCausalLM": "0.26.0",
    "ArcticForCausalLM": "0.28.0",
    "ChameleonForConditionalGeneration": "0.28.0",
    "Cheers": "0.28.0",
    "CheersForConditionalGeneration": "0.28.0",
    "Fairseq2LlamaForCausalLM": "0.28.0",
    "FireRedLIDForConditionalGeneration": "0.28.0",
    "GritLM": "0.28.0",
    "HCXVisionForCausalLM": "0.28.0",
    "MPTForCausalLM": "0.28.0",
    "MptForCausalLM": "0.28.0",
    "RWForCausalLM": "0.28.0",
    "StableLMEpochForCausalLM": "0.28.0",
    "PrithviGeoSpatialMAE": "0.28.0",
}


def _dropped(arch: str, version: tuple[int, int]) -> str | None:
    last = LAST_SERVED_IN.get(arch)
    return last if last is not None and version > tuple(int(part) for part in last.split(".")[:2]) else None


def dropped_warning(architectures: Iterable[str], version: tuple[int, int]) -> str | None:
    """Why vLLM at ``version`` (major, minor) has no model class for the model any more, or None: only when none
    of ``architectures`` is served (vLLM tries each). vLLM then tries its Transformers backend before it refuses
    (ModelRegistry, model_impl "auto"), so this is a warning, not a certain refusal."""
    names = list(architectures)
    dropped = [(arch, _dropped(arch, version)) for arch in names]
    if not names or any(last is None for _, last in dropped):
        return None
    arch, last = dropped[0]
    return (f"vLLM {version[0]}.{version[1]} has no model class for {arch} any more (supported until v{last}, "
            "vllm/model_executor/models/registry.py): it starts only if its Transformers backend can serve the "
            f"model, else it refuses it; plan for --vllm-version {str(last).rsplit('.', 1)[0]}")


# Model classes whose KV cache vLLM lays out in a way kvwatch does not model (vLLM 0.32's sources): a plan reads
# their config.json as plain attention, and vLLM's figures differ by far more than the estimate's margins.
UNMODELLED: dict[str, str] = {
    "DeepseekV4ForCausalLM": "compressed MLA states, a sliding-window cache, the compressor's state and an indexer "
                             "(vllm/model_executor/models/deepseek_v4/attention.py)",
    # MiniMaxM3IndexerCache: an MLA-style spec of one bf16 index_head_dim vector per token,
    # not split by TP, beside each sparse layer's KV (+12.5 % of those layers at TP 1, +50 % at TP 4)
    "MiniMaxM3ForCausalLM": "an index-key side cache beside the sparse attention layers' KV (index_head_dim values "
                            "per token and layer, not split by tensor parallelism; "
                            "vllm/model_executor/models/minimax_m3/common/indexer.py)",
    "MiniMaxM3VLForConditionalGeneration": "an index-key side cache beside the sparse attention layers' KV "
                                           "(index_head_dim values per token and layer, not split by tensor "
                                           "parallelism; vllm/model_executor/models/minimax_m3/common/indexer.py)",
    # (served until 0.10.2, LAST_SERVED_IN above: the plan its dropped-architecture warning points at read every
    # layer as a 512-token window, 3.6x vLLM's KV bytes a token)
    "Phi4FlashForCausalLM": "a Mamba state in every mb_per_layer-th layer, sliding-window attention in the first "
                            "half's other layers, one full-attention layer whose KV the later attention layers share "
                            "(kv_sharing_target_layer_name; vllm/model_executor/models/phi4flash.py)",
    "IQuestLoopCoderForCausalLM": "one attention layer per loop (loop_num, 2 when unset), the loops after the first "
                                  "with a sliding window of loop_window_size (vllm/model_executor/models/"
                                  "iquest_loopcoder.py): 80 layers hold about a third of the tokens kvwatch says",
}


def unmodelled_warning(architectures: Iterable[str]) -> str | None:
    """Why the KV figures of a model whose class kvwatch does not model (:data:`UNMODELLED`) are not vLLM's."""
    arch = next((a for a in architectures if a in UNMODELLED), None)
    if arch is None:
        return None
    return (f"kvwatch does not model {arch}'s KV cache: vLLM keeps {UNMODELLED[arch]}. The KV figures here treat it "
            "as plain attention and can be far off; size it from vLLM's startup log ('GPU KV cache size', "
            "--available-kv-gib and --kv-bytes-per-token)")
