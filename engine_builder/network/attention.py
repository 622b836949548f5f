"""One self-attention block over a static KV cache, as a generic exporter writes it.

    qkv = x @ Wqkv.T (+ b)  -> Split -> [q; k; v]   (optional per-head norm on q and k)
    rotary(q), rotary(k)
    present = ScatterND(past, write_indices, new)   the whole buffer comes back out
                                                    (int8 cache: new quantized, present dequantized)
    repeat K/V heads (GQA) -> MatMul(q, kT) -> Mul(scale) [-> softcap] -> Add(mask) -> Softmax -> MatMul(v)

Later passes fuse this into Attention / TensorScatter / GroupQueryAttention; the graph
itself stays in portable ops so it runs anywhere and is the numerics reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from engine_builder.formats.model_config import ModelConfig
from engine_builder.network import kv_quant
from engine_builder.network.builder import FLOAT, GraphBuilder
from engine_builder.network.linear import linear
from engine_builder.network.masks import AttentionMasks
from engine_builder.network.norms import checkpoint_norm
from engine_builder.network.paged_attention import PagedMasks, head_major_scale, paged_attend, paged_update
from engine_builder.network.rotary import RotaryTables, apply_rotary
from engine_builder.network.weights import CheckpointWeights


@dataclass(frozen=True)
class AttentionOutputs:
    out: ir.Value  # [batch, seq, hidden]
    present_key: ir.Value  # [batch, kv_heads, max_seq, head_dim]
    present_value: ir.Value  # [batch, kv_heads, max_seq, head_dim]


def self_attention(b: GraphBuilder, x: ir.Value, cfg: ModelConfig, w: CheckpointWeights, layer: int,
                   rotary: RotaryTables | None, masks: AttentionMasks, past_key: ir.Value,
                   past_value: ir.Value) -> AttentionOutputs:
    """x: [batch, seq, hidden] (already normalized); ROTARY None: positions come from elsewhere (learned)."""
    p = f"layers.{layer}.attn."
    heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    spec = cfg.block.attention
    sliding = spec.layer_types[layer] == "sliding_attention"
    with b.scope("attn"):
        qkv_bias = w[p + "qkv.bias"] if spec.qkv_bias else None
        qkv = linear(b, w, x, p + "qkv", qkv_bias)  # [batch, seq, q_dim + 2 kv_dim]
        q, k, v = b.op_multi("Split", qkv, b.ints([cfg.q_dim, cfg.kv_dim, cfg.kv_dim]), axis=-1, num_outputs=3)
        q = b.op("Reshape", q, b.ints([0, 0, heads, head_dim]))  # [batch, seq, heads, head_dim]
        k = b.op("Reshape", k, b.ints([0, 0, kv_heads, head_dim]))  # [batch, seq, kv_heads, head_dim]
        v = b.op("Reshape", v, b.ints([0, 0, kv_heads, head_dim]))
        if spec.qk_norm:  # qwen3, gemma3: per-head norm before rotary
            q = checkpoint_norm(b, q, w, p + "q_norm", cfg.block.norm, name="q_norm")
            k = checkpoint_norm(b, k, w, p + "k_norm", cfg.block.norm, name="k_norm")
        q = b.op("Transpose", q, perm=[0, 2, 1, 3])  # [batch, heads, seq, head_dim]
        k = b.op("Transpose", k, perm=[0, 2, 1, 3])  # [batch, kv_heads, seq, head_dim]
        v = b.op("Transpose", v, perm=[0, 2, 1, 3])
        if rotary is not None:
            q = apply_rotary(b, q, rotary, head_dim)
            k = apply_rotary(b, k, rotary, head_dim)

        # write the new tokens into the cache; attention reads the whole updated buffer
        if w.quantization.kv_cache == "int8":
            low, high = (b.const(float(bound)) for bound in kv_quant.INT8_RANGE)
            k_scale, v_scale = w.stored(p + "k_cache_scale"), w.stored(p + "v_cache_scale")  # [1, kv_heads, 1, hd]
            k, v = kv_quant.quantize(b.op, k, k_scale, low, high), kv_quant.quantize(b.op, v, v_scale, low, high)
        scale = spec.scale if spec.scale is not None else head_dim ** -0.5
        if isinstance(masks, PagedMasks):  # --kv-layout paged: pool + block table (network/paged_attention.py)
            present_key, cached_key = paged_update(b, past_key, k, masks, kv_heads, head_dim)
            present_value, cached_value = paged_update(b, past_value, v, masks, kv_heads, head_dim)
            if w.quantization.kv_cache == "int8":
                cached_key = kv_quant.dequantize(b.op, cached_key, head_major_scale(b, k_scale, kv_heads, head_dim))
                cached_value = kv_quant.dequantize(b.op, cached_value,
                                                   head_major_scale(b, v_scale, kv_heads, head_dim))
            out = paged_attend(b, q, cached_key, cached_value, masks.sliding if sliding else masks.full,
                               masks.output_shape, heads=heads, kv_heads=kv_heads, head_dim=head_dim, scale=scale,
                               softcap=spec.logit_softcap)
            out = linear(b, w, out, p + "o", w[p + "o.bias"] if spec.o_bias else None)  # [batch, seq, hidden]
            return AttentionOutputs(out, present_key, present_value)
        else:
            present_key = b.op("ScatterND", past_key, masks.write_indices, k)  # [batch, kv_heads, max_seq, head_dim]
            present_value = b.op("ScatterND", past_value, masks.write_indices, v)
            cached_key, cached_value = present_key, present_value
        if w.quantization.kv_cache == "int8":
            cached_key = kv_quant.dequantize(b.op, cached_key, k_scale)
            cached_value = kv_quant.dequantize(b.op, cached_value, v_scale)
        keys = _repeat_kv(b, cached_key, heads, kv_heads, head_dim)  # [batch, heads, max_seq, head_dim]
        values = _repeat_kv(b, cached_value, heads, kv_heads, head_dim)

        scores = b.op("MatMul", q, b.op("Transpose", keys, perm=[0, 1, 3, 2]))  # [batch, heads, seq, max_seq]
        scores = b.op("Mul", scores, b.const(scale))
        if spec.logit_softcap:  # gemma2: cap * tanh(scores / cap), before the mask
            cap = b.const(spec.logit_softcap)
            scores = b.op("Mul", b.op("Tanh", b.op("Div", scores, cap)), cap)
        scores = b.op("Add", scores, masks.sliding if sliding else masks.full)
        if b.dtype == FLOAT:
            probs = b.op("Softmax", scores, axis=-1)
        else:  # transformers takes the softmax in float32
            probs = b.cast(b.op("Softmax", b.cast(scores, FLOAT), axis=-1), b.dtype)
        out = b.op("MatMul", probs, values)  # [batch, heads, seq, head_dim]
        out = b.op("Reshape", b.op("Transpose", out, perm=[0, 2, 1, 3]), b.ints([0, 0, cfg.q_dim]))
        out = linear(b, w, out, p + "o", w[p + "o.bias"] if spec.o_bias else None)  # [batch, seq, hidden]
    return AttentionOutputs(out, present_key, present_value)


def _repeat_kv(b: GraphBuilder, x: ir.Value, heads: int, kv_heads: int, head_dim: int) -> ir.Value:
    """[batch, kv_heads, max_seq, head_dim] -> [batch, heads, max_seq, head_dim], each KV head
    repeated heads/kv_heads times in place (transformers' repeat_kv: expand + reshape)."""
    if heads == kv_heads:
        return x
    x = b.op("Unsqueeze", x, b.ints([2]))  # [batch, kv_heads, 1, max_seq, head_dim]
    x = b.op("Expand", x, b.ints([1, 1, heads // kv_heads, 1, 1]))  # [batch, kv_heads, rep, max_seq, head_dim]
    return b.op("Reshape", x, b.ints([0, heads, -1, head_dim]))
