"""Phi-3 / Phi-3.5 / Phi-4-mini: q/k/v and gate/up already fused, partial rotary, longrope."""

from __future__ import annotations

from converters.archs.mistral import MistralConverter
from converters.registry import Target, register_converter

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
class Phi3Converter(MistralConverter):
    """Mistral's config reading (one sliding window for all layers when set), phi3's fused weights."""

    weight_map = PHI3_WEIGHT_MAP
