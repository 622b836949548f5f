"""GPT-2: learned absolute positions, LayerNorm with bias, Conv1D weights, GELU-tanh MLP, tied lm_head.

What transformers' models/gpt2/modeling_gpt2.py computes, and the spec entry that says it:

    wte + wpe[position_ids]      token plus learned position embeddings   position_embedding="learned"
    ln_1 / ln_2 / ln_f           nn.LayerNorm(eps=layer_norm_epsilon)     NormSpec(layer_norm, bias=True)
    c_attn, c_proj, c_fc         Conv1D: x @ W + b with W [in, out]       transforms: Transposed to [out, in]
                                 (c_attn's columns are [q | k | v])       -> attn.qkv, in our [q; k; v] order
    attention                    softmax(q k^T * head_dim^-0.5 + mask) v  AttentionSpec(qkv_bias, o_bias, scale)
    mlp                          c_proj(act(c_fc(x))), n_inner or 4 h     MlpSpec(plain, activation_function)
    block                        pre-norm residual                        ResidualSpec()
    lm_head                      tied to wte                              tie_word_embeddings

GPT2LMHeadModel saves its tensors under `transformer.`; the original OpenAI checkpoints have no
prefix, and older ones carry the causal-mask buffers `attn.bias` / `attn.masked_bias` (dropped).
"""

from __future__ import annotations

from typing import Any

from converters.archs import hf_config
from converters.registry import Converter, Target, register_converter
from converters.transforms import Transform, Transposed
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, MlpSpec, ModelConfig, NormSpec, RopeConfig
from engine_builder.util.errors import UnsupportedError

L = "h.{layer}."
C = "layers.{layer}."

_NAMES: dict[str, Target] = {
    "wte.weight": "embed.weight",
    "wpe.weight": "pos_embed.weight",
    L + "ln_1.weight": C + "attn_norm.weight",
    L + "ln_1.bias": C + "attn_norm.bias",
    L + "attn.c_attn.weight": C + "attn.qkv.weight",
    L + "attn.c_attn.bias": C + "attn.qkv.bias",
    L + "attn.c_proj.weight": C + "attn.o.weight",
    L + "attn.c_proj.bias": C + "attn.o.bias",
    L + "ln_2.weight": C + "mlp_norm.weight",
    L + "ln_2.bias": C + "mlp_norm.bias",
    L + "mlp.c_fc.weight": C + "mlp.up.weight",
    L + "mlp.c_fc.bias": C + "mlp.up.bias",
    L + "mlp.c_proj.weight": C + "mlp.down.weight",
    L + "mlp.c_proj.bias": C + "mlp.down.bias",
    # the causal mask as a buffer, in checkpoints saved by older transformers
    L + "attn.bias": None,
    L + "attn.masked_bias": None,
    "ln_f.weight": "final_norm.weight",
    "ln_f.bias": "final_norm.bias",
}
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
PREFIXES = ("transformer.", "")  # GPT2LMHeadModel's names, the original checkpoints' names

GPT2_WEIGHT_MAP: dict[str, Target] = {
    **{prefix + name: target for prefix in PREFIXES for name, target in _NAMES.items()},
    "lm_head.weight": "lm_head.weight",
}
GPT2_TRANSFORMS: dict[str, Transform] = {prefix + L + name: Transposed() for prefix in PREFIXES for name in _CONV1D}


@register_converter("gpt2")
class GPT2Converter(Converter):
    weight_map = GPT2_WEIGHT_MAP
    transforms = GPT2_TRANSFORMS

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        if hf.get("scale_attn_by_inverse_layer_idx"):
            raise UnsupportedError("gpt2 config.json sets scale_attn_by_inverse_layer_idx (a softmax scale per layer), "
                                   "which trtbuild does not support; convert a model without it")
        if hf.get("add_cross_attention"):
            raise UnsupportedError("gpt2 config.json sets add_cross_attention (an encoder-decoder model); trtbuild "
                                   "builds decoder-only gpt2")
        hidden, heads = hf["n_embd"], hf["n_head"]
        head_dim = hidden // heads
        if head_dim * heads != hidden:
            raise UnsupportedError(f"gpt2 config.json: n_embd {hidden} is not a multiple of n_head {heads}; fix "
                                   f"config.json")
        # reorder_and_upcast_attn only changes the precision of the scores: ours are float32 already
        scale = head_dim ** -0.5 if hf.get("scale_attn_weights", True) else 1.0
        block = BlockSpec(
            norm=NormSpec(kind="layer_norm", eps=float(hf.get("layer_norm_epsilon", 1e-5)), bias=True),
            attention=AttentionSpec(qkv_bias=True, o_bias=True, scale=scale,
                                    layer_types=("full_attention",) * hf["n_layer"]),
            mlp=MlpSpec(kind="plain", activation=hf_config.activation(
                {"hidden_act": hf.get("activation_function", "gelu_new")}), bias=True),
        )
        return ModelConfig(
            architecture=cls.model_type, vocab_size=hf["vocab_size"], hidden_size=hidden,
            intermediate_size=hf.get("n_inner") or 4 * hidden, num_layers=hf["n_layer"], num_heads=heads,
            num_kv_heads=heads, head_dim=head_dim, max_position_embeddings=hf.get("n_positions", 1024),
            rope=RopeConfig(dim=0), block=block, tie_word_embeddings=hf_config.tie_word_embeddings(hf, True),
            position_embedding="learned")
