"""Reading the MoE fields of an HF config.json (mixtral, qwen2_moe, qwen3_moe) into MlpSpec kind "moe"."""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config
from engine_builder.formats.model_config import MlpSpec
from engine_builder.util.errors import UnsupportedError


def num_experts(hf: dict[str, Any]) -> int:
    # transformers 5 writes qwen3_moe's num_experts as num_local_experts (an attribute_map alias)
    return int(hf.get("num_experts") or hf.get("num_local_experts") or 0)


def moe_mlp(hf: dict[str, Any], *, norm_topk: bool, shared_expert_size: int = 0,
            shared_expert_gate: bool = False) -> MlpSpec:
    """Every layer sparse. Qwen's mixed layouts (mlp_only_layers, decoder_sparse_step > 1) put a dense
    MLP of another width in some layers, which a BlockSpec shared by every layer cannot say."""
    layers = hf["num_hidden_layers"]
    step = int(hf.get("decoder_sparse_step") or 1)
    dense = sorted(set(hf.get("mlp_only_layers") or []) | {i for i in range(layers) if (i + 1) % step})
    if dense:
        raise UnsupportedError(
            f"{hf.get('model_type')}: layers {dense[:8]} have a dense MLP (mlp_only_layers / decoder_sparse_step "
            f"{step}); only MoE models whose every layer is sparse are supported")
    return MlpSpec(kind="moe", activation=hf_config.activation(hf), num_experts=num_experts(hf),
                   top_k=int(hf.get("num_experts_per_tok") or 0), norm_topk=norm_topk,
                   shared_expert_size=shared_expert_size, shared_expert_gate=shared_expert_gate)


def moe_dims(hf: dict[str, Any], expert_size_key: str) -> dict[str, int]:
    """hf_config.dims with intermediate_size the width of one routed expert."""
    size = hf.get(expert_size_key)
    if not size:
        raise UnsupportedError(f"{hf.get('model_type')}: config.json has no {expert_size_key} (the width of "
                               "one expert); check the config")
    return {**hf_config.dims(hf), "intermediate_size": int(size)}
