"""Reading HF config.json fields that several architectures share: dims, rope, norm and MLP specs.

Handles both the transformers 4 layout (rope_theta + rope_scaling) and the transformers 5
layout (rope_parameters, optionally keyed by layer type).
"""

from __future__ import annotations

import math
from typing import Any

from engine_builder.formats.model_config import Activation, LayerType, MlpSpec, NormSpec, RopeConfig, RopeScaling
from engine_builder.util.errors import UnsupportedError

_ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu", "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    # transformers' ACT2FN "gelu" is the exact erf form (gpt-neox)
    "gelu": "gelu",
}
_ROPE_TYPES = {"default": "default", "linear": "linear", "dynamic": "dynamic", "llama3": "llama3",
               "yarn": "yarn", "longrope": "longrope", "su": "longrope"}


def activation(hf: dict[str, Any]) -> Activation:
    name = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if name not in _ACTIVATIONS:
        raise UnsupportedError(f"activation {name!r} is not supported; supported: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def head_dim(hf: dict[str, Any]) -> int:
    return hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]


def _rope_params(hf: dict[str, Any], layer_type: LayerType) -> dict[str, Any]:
    """The rope parameter dict for one layer type, in the transformers 5 shape."""
    params = hf.get("rope_parameters")
    if params:
        if "full_attention" in params or "sliding_attention" in params:
            return dict(params.get(layer_type) or params.get("full_attention") or {})
        return dict(params)
    # transformers 4: rope_scaling applies to global layers; gemma3's local layers have their own base
    if layer_type == "sliding_attention" and hf.get("rope_local_base_freq") is not None:
        return {"rope_type": "default", "rope_theta": hf["rope_local_base_freq"]}
    params = dict(hf.get("rope_scaling") or {})
    params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    return params


def rope(hf: dict[str, Any], dim_per_head: int, local: bool = False) -> RopeConfig:
    params = _rope_params(hf, "full_attention")
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in _ROPE_TYPES:
        raise UnsupportedError(f"rope scaling {kind!r} is not supported; supported: {', '.join(_ROPE_TYPES)}")
    kind = _ROPE_TYPES[kind]
    partial = params.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or 1.0
    original = params.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
    factor = params.get("factor")
    if kind in ("longrope", "yarn") and factor is None and original:
        # phi3 (longrope) and transformers' yarn derive the factor from the context extension
        factor = hf["max_position_embeddings"] / original
    scaling = RopeScaling(
        type=kind, factor=float(factor or 1.0), original_max_position_embeddings=original,
        low_freq_factor=params.get("low_freq_factor"), high_freq_factor=params.get("high_freq_factor"),
        beta_fast=params.get("beta_fast"), beta_slow=params.get("beta_slow"), mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"), truncate=params.get("truncate"),
        attention_factor=params.get("attention_factor"),
        short_factor=tuple(params["short_factor"]) if params.get("short_factor") else None,
        long_factor=tuple(params["long_factor"]) if params.get("long_factor") else None,
    ) if kind != "default" else RopeScaling()
    local_theta = _rope_params(hf, "sliding_attention").get("rope_theta") if local else None
    dim = int(dim_per_head * partial)
    return RopeConfig(theta=float(params.get("rope_theta", 10000.0)), dim=dim - dim % 2,
                      scaling=scaling, local_theta=float(local_theta) if local_theta else None)


def layer_types(hf: dict[str, Any], default: list[LayerType]) -> tuple[LayerType, ...]:
    types = hf.get("layer_types") or default
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise UnsupportedError(f"layer type(s) {', '.join(unknown)} are not supported")
    return tuple(types)


def dims(hf: dict[str, Any]) -> dict[str, int]:
    """ModelConfig's dims, which every decoder-only architecture reads the same way."""
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"], head_dim=head_dim(hf),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
    )


def tie_word_embeddings(hf: dict[str, Any], default: bool) -> bool:
    return bool(hf.get("tie_word_embeddings", default))


def rms_norm(hf: dict[str, Any], weight_offset: float = 0.0) -> NormSpec:
    return NormSpec(kind="rms_norm", eps=float(hf.get("rms_norm_eps", 1e-6)), weight_offset=weight_offset)


def gated_mlp(hf: dict[str, Any], bias: bool = False) -> MlpSpec:
    return MlpSpec(kind="gated", activation=activation(hf), bias=bias)


def full_attention(hf: dict[str, Any]) -> tuple[LayerType, ...]:
    return ("full_attention",) * hf["num_hidden_layers"]


def softcap(value: float | None) -> float | None:
    """HF writes no cap as None or 0."""
    return float(value) if value else None


def gemma_embedding_multiplier(hidden_size: int) -> float:
    return math.sqrt(hidden_size)


def uniform_window(hf: dict[str, Any], num_layers: int) -> tuple[int | None, tuple[LayerType, ...]]:
    """mistral, phi3: one sliding_window for every layer when the config sets it."""
    window = hf.get("sliding_window")
    kind: LayerType = "sliding_attention" if window else "full_attention"
    return window, layer_types(hf, [kind] * num_layers)
