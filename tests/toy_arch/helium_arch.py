"""Helium (kyutai), registered from the tests: the proof that an architecture the block spec already
describes is one file like this one, with nothing under converters/, engine_builder/ or passes/ changed.

What transformers' models/helium/modeling_helium.py computes, and the spec entry that says it:

    HeliumRMSNorm     x * rsqrt(mean(x^2) + eps) * w (eps 1e-8)       NormSpec(rms_norm, eps), no weight offset
    rotate_half       channel pairs (x[2i], x[2i+1]) -> (-x[2i+1],      RopeConfig(interleaved=True): GPT-J pairs,
                      x[2i]); cos/sin repeat_interleave'd               not llama's halves; weights stay as stored
    q/k/v_proj        bias = attention_bias; o_proj never has one       AttentionSpec(qkv_bias=..., o_bias=False)
    eager attention   softmax(q k^T / sqrt(head_dim) + mask) v, GQA    AttentionSpec(scale=None), full attention
    HeliumMLP         down(act(gate) * up), every bias = mlp_bias       MlpSpec(gated, hidden_act, bias)
    decoder layer     pre-norm residual, no sandwich norms              ResidualSpec()
    embeddings/head   unscaled embed_tokens, final norm, lm_head        ModelConfig defaults

One difference below float32: HeliumRMSNorm multiplies by w before casting back to a 16-bit activation
dtype, our rms_norm (llama's order) after; in float32, where the test compares, the two are the same ops.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from converters.archs import hf_config
from converters.archs.llama import LLAMA_WEIGHT_MAP
from converters.registry import Converter, Target, register_converter
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, ModelConfig

# llama's names, and no o_proj bias: Helium never has one
HELIUM_WEIGHT_MAP: dict[str, Target] = {k: v for k, v in LLAMA_WEIGHT_MAP.items() if not k.endswith("o_proj.bias")}


@register_converter("helium")
class HeliumConverter(Converter):
    weight_map = HELIUM_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        block = BlockSpec(
            norm=hf_config.rms_norm(hf),
            attention=AttentionSpec(qkv_bias=bool(hf.get("attention_bias", False)), o_bias=False,
                                    layer_types=hf_config.full_attention(hf)),
            mlp=hf_config.gated_mlp(hf, bias=bool(hf.get("mlp_bias", False))),
        )
        rope = dataclasses.replace(hf_config.rope(hf, hf_config.head_dim(hf)), interleaved=True)
        return ModelConfig(architecture=cls.model_type, **hf_config.dims(hf), rope=rope, block=block,
                           tie_word_embeddings=hf_config.tie_word_embeddings(hf, False))
