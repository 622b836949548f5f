"""Mistral: the llama layout, with an optional sliding window on every layer."""

from __future__ import annotations

from typing import Any

from converters import hf_config
from converters.base import Converter, register_converter
from converters.llama import LLAMA_WEIGHT_MAP
from engine_builder.config import ModelConfig


@register_converter("mistral")
class MistralConverter(Converter):
    weight_map = LLAMA_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        kw = hf_config.common(hf, tie_default=False)
        window, types = hf_config.uniform_window(hf, kw["num_layers"])
        return ModelConfig(architecture=cls.model_type, **kw, rope=hf_config.rope(hf, kw["head_dim"]),
                           sliding_window=window, layer_types=types)
