"""Gemma 2: (1+w) RMSNorm, scaled embeddings, sandwich norms, soft-capping, alternating sliding window."""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config
from converters.registry import Converter, Target, register_converter
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, LayerType, ModelConfig, ResidualSpec

L = "model.layers.{layer}."
C = "layers.{layer}."

GEMMA2_WEIGHT_MAP: dict[str, Target] = {
    "model.embed_tokens.weight": "embed.weight",
    L + "input_layernorm.weight": C + "attn_norm.weight",
    L + "self_attn.q_proj.weight": (C + "attn.qkv.weight", 0),
    L + "self_attn.k_proj.weight": (C + "attn.qkv.weight", 1),
    L + "self_attn.v_proj.weight": (C + "attn.qkv.weight", 2),
    L + "self_attn.o_proj.weight": C + "attn.o.weight",
    # unlike llama, gemma's post_attention_layernorm normalizes the attention output
    L + "post_attention_layernorm.weight": C + "post_attn_norm.weight",
    L + "pre_feedforward_layernorm.weight": C + "mlp_norm.weight",
    L + "post_feedforward_layernorm.weight": C + "post_mlp_norm.weight",
    L + "mlp.gate_proj.weight": (C + "mlp.gate_up.weight", 0),
    L + "mlp.up_proj.weight": (C + "mlp.gate_up.weight", 1),
    L + "mlp.down_proj.weight": C + "mlp.down.weight",
    "model.norm.weight": "final_norm.weight",
    "lm_head.weight": "lm_head.weight",
}


def gemma_block(hf: dict[str, Any], default_types: list[LayerType], qk_norm: bool = False) -> BlockSpec:
    """The block gemma2 and gemma3 share: (1 + w) norms, sandwich norms, query_pre_attn_scalar, softcap."""
    types = hf_config.layer_types(hf, default_types)
    return BlockSpec(
        norm=hf_config.rms_norm(hf, weight_offset=1.0),
        attention=AttentionSpec(
            qk_norm=qk_norm,
            scale=float(hf.get("query_pre_attn_scalar") or hf_config.head_dim(hf)) ** -0.5,
            logit_softcap=hf_config.softcap(hf.get("attn_logit_softcapping")),
            sliding_window=hf.get("sliding_window") if "sliding_attention" in types else None,
            layer_types=types),
        mlp=hf_config.gated_mlp(hf),
        residual=ResidualSpec(post_attention_norm=True, post_mlp_norm=True),
    )


def gemma_outside_block(hf: dict[str, Any]) -> dict[str, Any]:
    """ModelConfig fields outside the block gemma2 and gemma3 share: scaled embeddings, capped logits."""
    return dict(embedding_multiplier=hf_config.gemma_embedding_multiplier(hf["hidden_size"]),
                tie_word_embeddings=hf_config.tie_word_embeddings(hf, True),
                final_logit_softcap=hf_config.softcap(hf.get("final_logit_softcapping")))


@register_converter("gemma2")
class Gemma2Converter(Converter):
    weight_map = GEMMA2_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        n = hf["num_hidden_layers"]
        # even layers slide, odd layers are global
        default: list[LayerType] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
        return ModelConfig(architecture=cls.model_type, **hf_config.dims(hf),
                           rope=hf_config.rope(hf, hf_config.head_dim(hf)), block=gemma_block(hf, default),
                           **gemma_outside_block(hf))
