"""Mixtral: the mistral layer with a sparse MoE MLP, softmax router, top-k weights renormalized to 1."""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config, moe_config
from converters.archs.llama import LLAMA_WEIGHT_MAP
from converters.registry import Converter, Target, register_converter
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, ModelConfig

L = "model.layers.{layer}."
C = "layers.{layer}."
M = L + "block_sparse_moe."

MIXTRAL_WEIGHT_MAP: dict[str, Target] = {
    **{k: v for k, v in LLAMA_WEIGHT_MAP.items() if ".mlp." not in k},
    M + "gate.weight": C + "mlp.router.weight",
    # w1 = gate, w3 = up, w2 = down (the original Mixtral names, which transformers still writes)
    M + "experts.{expert}.w1.weight": (C + "mlp.experts.gate_up.weight", 0),
    M + "experts.{expert}.w3.weight": (C + "mlp.experts.gate_up.weight", 1),
    M + "experts.{expert}.w2.weight": C + "mlp.experts.down.weight",
}


@register_converter("mixtral")
class MixtralConverter(Converter):
    weight_map = MIXTRAL_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        window, types = hf_config.uniform_window(hf, hf["num_hidden_layers"])
        block = BlockSpec(
            norm=hf_config.rms_norm(hf),
            attention=AttentionSpec(sliding_window=window, layer_types=types),
            # MixtralTopKRouter always divides the top-k probabilities by their sum
            mlp=moe_config.moe_mlp(hf, norm_topk=True),
        )
        return ModelConfig(architecture=cls.model_type, **moe_config.moe_dims(hf, "intermediate_size"),
                           rope=hf_config.rope(hf, hf_config.head_dim(hf)), block=block,
                           tie_word_embeddings=hf_config.tie_word_embeddings(hf, False))
