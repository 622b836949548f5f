"""GPT-NeoX (Pythia, GPT-NeoX-20B, StableLM-alpha): parallel residual, partial rotary, per-head fused q/k/v.

What transformers' models/gpt_neox/modeling_gpt_neox.py computes, and the spec entry that says it:

    input_layernorm,             nn.LayerNorm(eps=layer_norm_eps), bias   NormSpec(layer_norm, bias=True)
    post_attention_layernorm,
    final_layer_norm
    query_key_value              one Linear whose output is per head       transforms: HeadsInterleaved to
                                 [q_h | k_h | v_h] (view(-1, 3 * head))    our [q; k; v] rows; bias likewise
    rotary                       rotate_half on the first head_dim *       RopeConfig(dim=partial), the rest
                                 partial_rotary_factor (rotary_pct) dims   of each head passes through
    attention                    softmax(q k^T * head_dim^-0.5 + mask) v   AttentionSpec(qkv_bias, o_bias)
                                 dense (attention_bias for both)
    mlp                          dense_4h_to_h(act(dense_h_to_4h(x)))      MlpSpec(plain, hidden_act, bias)
    layer, use_parallel_residual x + mlp(ln2(x)) + attn(ln1(x))            ResidualSpec(layout="parallel")
                                 else x += attn(ln1(x)); x += mlp(ln2(x))  ResidualSpec()
    embed_out                    untied unless tie_word_embeddings         tie_word_embeddings

Transformers 4 configs say rotary_pct / rotary_emb_base, transformers 5 rope_parameters; a config
without either takes transformers' defaults (0.25, 10000).
"""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config
from converters.registry import Converter, Target, register_converter
from converters.transforms import HeadsInterleaved, Transform
from engine_builder.formats.model_config import (
    AttentionSpec,
    BlockSpec,
    MlpSpec,
    ModelConfig,
    NormSpec,
    ResidualSpec,
)
from engine_builder.util.errors import UnsupportedError

L = "gpt_neox.layers.{layer}."
C = "layers.{layer}."

GPT_NEOX_WEIGHT_MAP: dict[str, Target] = {
    "gpt_neox.embed_in.weight": "embed.weight",
    L + "input_layernorm.weight": C + "attn_norm.weight",
    L + "input_layernorm.bias": C + "attn_norm.bias",
    L + "attention.query_key_value.weight": C + "attn.qkv.weight",
    L + "attention.query_key_value.bias": C + "attn.qkv.bias",
    L + "attention.dense.weight": C + "attn.o.weight",
    L + "attention.dense.bias": C + "attn.o.bias",
    L + "post_attention_layernorm.weight": C + "mlp_norm.weight",
    L + "post_attention_layernorm.bias": C + "mlp_norm.bias",
    L + "mlp.dense_h_to_4h.weight": C + "mlp.up.weight",
    L + "mlp.dense_h_to_4h.bias": C + "mlp.up.bias",
    L + "mlp.dense_4h_to_h.weight": C + "mlp.down.weight",
    L + "mlp.dense_4h_to_h.bias": C + "mlp.down.bias",
    # buffers older checkpoints saved: the causal mask, and rotary frequencies recomputed from the config
    L + "attention.bias": None,
    L + "attention.masked_bias": None,
    L + "attention.rotary_emb.inv_freq": None,
    "gpt_neox.final_layer_norm.weight": "final_norm.weight",
    "gpt_neox.final_layer_norm.bias": "final_norm.bias",
    "embed_out.weight": "lm_head.weight",
}
GPT_NEOX_TRANSFORMS: dict[str, Transform] = {
    L + "attention.query_key_value.weight": HeadsInterleaved(),
    L + "attention.query_key_value.bias": HeadsInterleaved(),
}


def _rope_config(hf: dict[str, Any]) -> dict[str, Any]:
    """HF's config with the rotary fields where hf_config.rope reads them (transformers 5's rope_parameters)."""
    if hf.get("rope_parameters"):
        params = dict(hf["rope_parameters"])
    else:
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rotary_emb_base", hf.get("rope_theta", 10000.0)))
    params.setdefault("partial_rotary_factor", hf.get("rotary_pct", hf.get("partial_rotary_factor", 0.25)))
    return {**hf, "rope_parameters": params}


@register_converter("gpt_neox")
class GPTNeoXConverter(Converter):
    weight_map = GPT_NEOX_WEIGHT_MAP
    transforms = GPT_NEOX_TRANSFORMS

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        if hf.get("num_key_value_heads", hf["num_attention_heads"]) != hf["num_attention_heads"]:
            raise UnsupportedError("gpt_neox config.json sets num_key_value_heads; GPT-NeoX's fused q/k/v has one "
                                   "key and value head per query head; fix config.json")
        bias = bool(hf.get("attention_bias", True))
        block = BlockSpec(
            norm=NormSpec(kind="layer_norm", eps=float(hf.get("layer_norm_eps", 1e-5)), bias=True),
            attention=AttentionSpec(qkv_bias=bias, o_bias=bias, layer_types=hf_config.full_attention(hf)),
            mlp=MlpSpec(kind="plain", activation=hf_config.activation({"hidden_act": hf.get("hidden_act", "gelu")}),
                        bias=True),
            residual=ResidualSpec(layout="parallel" if hf.get("use_parallel_residual", True) else "sequential"),
        )
        dims = hf_config.dims(hf)
        dims["head_dim"] = hf["hidden_size"] // hf["num_attention_heads"]  # GPT-NeoX ignores a head_dim key
        return ModelConfig(architecture=cls.model_type, **dims,
                           rope=hf_config.rope(_rope_config(hf), dims["head_dim"]), block=block,
                           tie_word_embeddings=hf_config.tie_word_embeddings(hf, False))
