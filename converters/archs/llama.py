"""Llama (and SmolLM2, TinyLlama, Llama 3.x): the reference decoder layout."""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config
from converters.registry import Converter, Target, register_converter
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, ModelConfig

L = "model.layers.{layer}."
C = "layers.{layer}."

LLAMA_WEIGHT_MAP: dict[str, Target] = {
    "model.embed_tokens.weight": "embed.weight",
    L + "input_layernorm.weight": C + "attn_norm.weight",
    L + "self_attn.q_proj.weight": (C + "attn.qkv.weight", 0),
    L + "self_attn.k_proj.weight": (C + "attn.qkv.weight", 1),
    L + "self_attn.v_proj.weight": (C + "attn.qkv.weight", 2),
    L + "self_attn.q_proj.bias": (C + "attn.qkv.bias", 0),
    L + "self_attn.k_proj.bias": (C + "attn.qkv.bias", 1),
    L + "self_attn.v_proj.bias": (C + "attn.qkv.bias", 2),
    L + "self_attn.o_proj.weight": C + "attn.o.weight",
    L + "self_attn.o_proj.bias": C + "attn.o.bias",
    # in llama the norm *after attention* is the one *before the MLP*
    L + "post_attention_layernorm.weight": C + "mlp_norm.weight",
    L + "mlp.gate_proj.weight": (C + "mlp.gate_up.weight", 0),
    L + "mlp.up_proj.weight": (C + "mlp.gate_up.weight", 1),
    L + "mlp.gate_proj.bias": (C + "mlp.gate_up.bias", 0),
    L + "mlp.up_proj.bias": (C + "mlp.gate_up.bias", 1),
    L + "mlp.down_proj.weight": C + "mlp.down.weight",
    L + "mlp.down_proj.bias": C + "mlp.down.bias",
    # recomputed from the config; old checkpoints saved it
    L + "self_attn.rotary_emb.inv_freq": None,
    "model.norm.weight": "final_norm.weight",
    "lm_head.weight": "lm_head.weight",
}


@register_converter("llama")
class LlamaConverter(Converter):
    weight_map = LLAMA_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        bias = bool(hf.get("attention_bias", False))
        block = BlockSpec(
            norm=hf_config.rms_norm(hf),
            attention=AttentionSpec(qkv_bias=bias, o_bias=bias, layer_types=hf_config.full_attention(hf)),
            mlp=hf_config.gated_mlp(hf, bias=bool(hf.get("mlp_bias", False))),
        )
        return ModelConfig(architecture=cls.model_type, **hf_config.dims(hf),
                           rope=hf_config.rope(hf, hf_config.head_dim(hf)), block=block,
                           tie_word_embeddings=hf_config.tie_word_embeddings(hf, False))
