"""Qwen3-MoE: qwen3 attention (q/k norms) and routed experts only, top-k renormalized per norm_topk_prob."""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config, moe_config
from converters.archs.qwen2_moe import QWEN_ATTENTION, QWEN_MOE_EXPERTS
from converters.registry import Converter, Target, register_converter
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, ModelConfig

L = "model.layers.{layer}."
C = "layers.{layer}."

QWEN3_MOE_WEIGHT_MAP: dict[str, Target] = {
    **QWEN_ATTENTION,
    L + "self_attn.q_norm.weight": C + "attn.q_norm.weight",
    L + "self_attn.k_norm.weight": C + "attn.k_norm.weight",
    **QWEN_MOE_EXPERTS,
}


@register_converter("qwen3_moe")
class Qwen3MoeConverter(Converter):
    weight_map = QWEN3_MOE_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        # transformers' qwen3_moe masks every layer with the window when sliding_window is set
        window, types = hf_config.uniform_window(hf, hf["num_hidden_layers"])
        bias = bool(hf.get("attention_bias", False))
        block = BlockSpec(
            norm=hf_config.rms_norm(hf),
            attention=AttentionSpec(qkv_bias=bias, o_bias=bias, qk_norm=True, sliding_window=window,
                                    layer_types=types),
            mlp=moe_config.moe_mlp(hf, norm_topk=bool(hf.get("norm_topk_prob", False))),
        )
        return ModelConfig(architecture=cls.model_type, **moe_config.moe_dims(hf, "moe_intermediate_size"),
                           rope=hf_config.rope(hf, hf_config.head_dim(hf)), block=block,
                           tie_word_embeddings=hf_config.tie_word_embeddings(hf, False))
