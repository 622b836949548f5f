"""Qwen2 / Qwen2.5: the llama layout with q/k/v biases; sliding window only above max_window_layers."""

from __future__ import annotations

from typing import Any

from converters import hf_config
from converters.base import Converter, register_converter
from converters.llama import LLAMA_WEIGHT_MAP
from engine_builder.config import LayerType, ModelConfig


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
        kw = hf_config.common(hf, tie_default=False)
        types, window = qwen_layer_types(hf, kw["num_layers"])
        return ModelConfig(
            architecture=cls.model_type, **kw, rope=hf_config.rope(hf, kw["head_dim"]),
            qkv_bias=True, sliding_window=window, layer_types=types,
        )
