"""Mistral: the llama layout, with an optional sliding window on every layer."""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config
from converters.archs.llama import LLAMA_WEIGHT_MAP
from converters.registry import Converter, register_converter
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, ModelConfig


@register_converter("mistral")
class MistralConverter(Converter):
    weight_map = LLAMA_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        window, types = hf_config.uniform_window(hf, hf["num_hidden_layers"])
        block = BlockSpec(
            norm=hf_config.rms_norm(hf),
            attention=AttentionSpec(sliding_window=window, layer_types=types),
            mlp=hf_config.gated_mlp(hf),
        )
        return ModelConfig(architecture=cls.model_type, **hf_config.dims(hf),
                           rope=hf_config.rope(hf, hf_config.head_dim(hf)), block=block,
                           tie_word_embeddings=hf_config.tie_word_embeddings(hf, False))
