"""Phi-3 / Phi-3.5 / Phi-4-mini: q/k/v and gate/up already fused, partial rotary, longrope."""

from __future__ import annotations

from typing import Any

from converters import hf_config
from converters.base import Converter, Target, register_converter
from engine_builder.config import ModelConfig

L = "model.layers.{layer}."
C = "layers.{layer}."

PHI3_WEIGHT_MAP: dict[str, Target] = {
    "model.embed_tokens.weight": "embed.weight",
    L + "input_layernorm.weight": C + "attn_norm.weight",
    # stored as [q; k; v] rows, which is our fused layout already
    L + "self_attn.qkv_proj.weight": C + "attn.qkv.weight",
    L + "self_attn.o_proj.weight": C + "attn.o.weight",
    L + "post_attention_layernorm.weight": C + "mlp_norm.weight",
    # stored as [gate; up] rows
    L + "mlp.gate_up_proj.weight": C + "mlp.gate_up.weight",
    L + "mlp.down_proj.weight": C + "mlp.down.weight",
    L + "self_attn.rotary_emb.inv_freq": None,
    "model.norm.weight": "final_norm.weight",
    "lm_head.weight": "lm_head.weight",
}


@register_converter("phi3")
class Phi3Converter(Converter):
    weight_map = PHI3_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        kw = hf_config.common(hf, tie_default=False)
        window, types = hf_config.uniform_window(hf, kw["num_layers"])
        return ModelConfig(architecture=cls.model_type, **kw, rope=hf_config.rope(hf, kw["head_dim"]),
                           sliding_window=window, layer_types=types)
