"""Gemma 3 (text): gemma2's layout plus (1+w) q/k norms and a separate rope base for local layers."""

from __future__ import annotations

import dataclasses
from typing import Any

from converters.archs import hf_config
from converters.archs.gemma2 import GEMMA2_WEIGHT_MAP, gemma_block, gemma_outside_block
from converters.registry import Converter, Target, register_converter
from engine_builder.formats.model_config import LayerType, ModelConfig

GEMMA3_WEIGHT_MAP: dict[str, Target] = {
    **GEMMA2_WEIGHT_MAP,
    "model.layers.{layer}.self_attn.q_norm.weight": "layers.{layer}.attn.q_norm.weight",
    "model.layers.{layer}.self_attn.k_norm.weight": "layers.{layer}.attn.k_norm.weight",
}


@register_converter("gemma3_text")
class Gemma3TextConverter(Converter):
    weight_map = GEMMA3_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        n, pattern = hf["num_hidden_layers"], hf.get("sliding_window_pattern", 6)
        # every pattern-th layer is global, the rest slide
        default: list[LayerType] = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
        return ModelConfig(architecture=cls.model_type, **hf_config.dims(hf),
                           rope=hf_config.rope(hf, hf_config.head_dim(hf), local=True),
                           block=gemma_block(hf, default, qk_norm=True), **gemma_outside_block(hf))


def _language_model(weight_map: dict[str, Target], prefix: str) -> dict[str, Target]:
    return {prefix + k.removeprefix("model."): v for k, v in weight_map.items() if k != "lm_head.weight"}


@register_converter("gemma3")
class Gemma3Converter(Converter):
    """The text decoder of multimodal Gemma 3 checkpoints; the vision tower is dropped on purpose."""

    weight_map = {
        **_language_model(GEMMA3_WEIGHT_MAP, "model.language_model."),  # transformers 5 names
        **_language_model(GEMMA3_WEIGHT_MAP, "language_model.model."),  # transformers 4 names
        "lm_head.weight": "lm_head.weight",
        "language_model.lm_head.weight": "lm_head.weight",
        "model.vision_tower.*": None, "vision_tower.*": None,
        "model.multi_modal_projector.*": None, "multi_modal_projector.*": None,
    }

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        text = {"tie_word_embeddings": hf.get("tie_word_embeddings", True), **hf.get("text_config", {})}
        text.setdefault("vocab_size", 262208)
        cfg = Gemma3TextConverter.config_from_hf(text)
        return dataclasses.replace(cfg, architecture=cls.model_type)
