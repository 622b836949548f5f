"""Qwen2-MoE (Qwen1.5-MoE): qwen2 attention, routed experts plus a shared expert under a sigmoid gate."""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config, moe_config
from converters.archs.llama import LLAMA_WEIGHT_MAP
from converters.registry import Converter, Target, register_converter
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, ModelConfig

L = "model.layers.{layer}."
C = "layers.{layer}."

# the routed experts' names, shared with qwen3_moe
QWEN_MOE_EXPERTS: dict[str, Target] = {
    L + "mlp.gate.weight": C + "mlp.router.weight",
    L + "mlp.experts.{expert}.gate_proj.weight": (C + "mlp.experts.gate_up.weight", 0),
    L + "mlp.experts.{expert}.up_proj.weight": (C + "mlp.experts.gate_up.weight", 1),
    L + "mlp.experts.{expert}.down_proj.weight": C + "mlp.experts.down.weight",
}
QWEN_ATTENTION: dict[str, Target] = {k: v for k, v in LLAMA_WEIGHT_MAP.items() if ".mlp." not in k}

QWEN2_MOE_WEIGHT_MAP: dict[str, Target] = {
    **QWEN_ATTENTION,
    **QWEN_MOE_EXPERTS,
    L + "mlp.shared_expert.gate_proj.weight": (C + "mlp.shared.gate_up.weight", 0),
    L + "mlp.shared_expert.up_proj.weight": (C + "mlp.shared.gate_up.weight", 1),
    L + "mlp.shared_expert.down_proj.weight": C + "mlp.shared.down.weight",
    L + "mlp.shared_expert_gate.weight": C + "mlp.shared_gate.weight",
}


@register_converter("qwen2_moe")
class Qwen2MoeConverter(Converter):
    weight_map = QWEN2_MOE_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        layers = hf["num_hidden_layers"]
        types = hf_config.layer_types(hf, ["full_attention"] * layers)
        window = hf.get("sliding_window") if "sliding_attention" in types else None
        bias = bool(hf.get("qkv_bias", True))
        block = BlockSpec(
            norm=hf_config.rms_norm(hf),
            attention=AttentionSpec(qkv_bias=bias, sliding_window=window, layer_types=types),
            mlp=moe_config.moe_mlp(hf, norm_topk=bool(hf.get("norm_topk_prob", False)),
                                   shared_expert_size=int(hf.get("shared_expert_intermediate_size") or 0),
                                   shared_expert_gate=True),
        )
        return ModelConfig(architecture=cls.model_type, **moe_config.moe_dims(hf, "moe_intermediate_size"),
                           rope=hf_config.rope(hf, hf_config.head_dim(hf)), block=block,
                           tie_word_embeddings=hf_config.tie_word_embeddings(hf, False))
