"""Qwen3: per-head RMSNorm on q and k before rotary, no q/k/v biases by default."""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config
from converters.archs.llama import LLAMA_WEIGHT_MAP
from converters.archs.qwen2 import qwen_layer_types
from converters.registry import Converter, Target, register_converter
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, ModelConfig

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
        types, window = qwen_layer_types(hf, hf["num_hidden_layers"])
        bias = bool(hf.get("attention_bias", False))
        block = BlockSpec(
            norm=hf_config.rms_norm(hf),
            attention=AttentionSpec(qkv_bias=bias, o_bias=bias, qk_norm=True, sliding_window=window,
                                    layer_types=types),
            mlp=hf_config.gated_mlp(hf),
        )
        return ModelConfig(architecture=cls.model_type, **hf_config.dims(hf),
                           rope=hf_config.rope(hf, hf_config.head_dim(hf)), block=block,
                           tie_word_embeddings=hf_config.tie_word_embeddings(hf, False))
