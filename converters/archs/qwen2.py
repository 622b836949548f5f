"""Qwen2 / Qwen2.5: the llama layout with q/k/v biases; sliding window only above max_window_layers."""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config
from converters.archs.llama import LLAMA_WEIGHT_MAP
from converters.registry import Converter, register_converter
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, LayerType, ModelConfig


def qwen_layer_types(hf: dict[str, Any], num_layers: int) -> tuple[tuple[LayerType, ...], int | None]:
    """Sliding window applies to layers >= max_window_layers, and only with use_sliding_window."""
    if not hf.get("use_sliding_window"):
        return ("full_attention",) * num_layers, None
    first = hf.get("max_window_layers", num_layers)
    default: list[LayerType] = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    types = hf_config.layer_types(hf, default)
    return types, hf.get("sliding_window") if "sliding_attention" in types else None


@register_converter("qwen2")
class Qwen2Converter(Converter):
    weight_map = LLAMA_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        types, window = qwen_layer_types(hf, hf["num_hidden_layers"])
        block = BlockSpec(
            norm=hf_config.rms_norm(hf),
            attention=AttentionSpec(qkv_bias=True, sliding_window=window, layer_types=types),
            mlp=hf_config.gated_mlp(hf),
        )
        return ModelConfig(architecture=cls.model_type, **hf_config.dims(hf),
                           rope=hf_config.rope(hf, hf_config.head_dim(hf)), block=block,
                           tie_word_embeddings=hf_config.tie_word_embeddings(hf, False))
