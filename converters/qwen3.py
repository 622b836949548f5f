"""Qwen3: per-head RMSNorm on q and k before rotary, no q/k/v biases by default."""

from __future__ import annotations

from typing import Any

from converters import hf_config
from converters.base import Converter, Target, register_converter
from converters.llama import LLAMA_WEIGHT_MAP
from converters.qwen2 import qwen_layer_types
from engine_builder.config import ModelConfig

QWEN3_WEIGHT_MAP: dict[str, Target] = {
    **LLAMA_WEIGHT_MAP,
    "model.layers.{layer}.self_attn.q_norm.weight": "layers.{layer}.attn.q_norm.weight",
    "model.layers.{layer}.self_attn.k_norm.weight": "layers.{layer}.attn.k_norm.weight",
}


@register_converter("qwen3")
class Qwen3Converter(Converter):
    weight_map = QWEN3_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        kw = hf_config.common(hf, tie_default=False)
        types, window = qwen_layer_types(hf, kw["num_layers"])
        bias = bool(hf.get("attention_bias", False))
        return ModelConfig(
            architecture=cls.model_type, **kw, rope=hf_config.rope(hf, kw["head_dim"]),
            qkv_bias=bias, o_bias=bias, qk_norm=True, sliding_window=window, layer_types=types,
        )
