"""Rotary position embedding in plain ops: cos/sin tables from position_ids, rotate-half apply.

The tables are computed once per graph (per distinct frequency set) and shared by every
layer, the way transformers computes position_embeddings once per forward. The apply is
HF's `q * cos + rotate_half(q) * sin` with rotate_half as Slice/Neg/Concat, the exact
shape a RotaryEmbedding fusion pass looks for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from engine_builder.formats.rope_frequencies import RopeFrequencies
from engine_builder.network.builder import FLOAT, INT64, GraphBuilder

INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class RotaryTables:
    cos: ir.Value  # [batch, 1, seq, dim] compute dtype
    sin: ir.Value  # [batch, 1, seq, dim]
    dim: int
    interleaved: bool


def rotary_tables(b: GraphBuilder, position_ids: ir.Value, f: RopeFrequencies, name: str,
                  interleaved: bool = False) -> RotaryTables:
    """cos/sin of position * inv_freq, in float32 like transformers, then cast to the compute dtype."""
    with b.scope(name):
        pos = b.op("Unsqueeze", b.cast(position_ids, FLOAT), b.ints([-1]))  # [batch, seq, 1]
        inv_freq = b.tensor(f.inv_freq, f"{name}.inv_freq")  # [dim/2]
        if f.long_inv_freq is not None or f.dynamic is not None:
            # transformers picks the table from the sequence length = max position + 1; we decide
            # per sequence so a batched row behaves exactly like the same sequence alone
            seq_len = b.op("Add", b.op("ReduceMax", position_ids, b.ints([1]), keepdims=1),
                           b.const(1, INT64))  # [batch, 1]
            seq_len = b.op("Unsqueeze", seq_len, b.ints([-1]))  # [batch, 1, 1]
            if f.long_inv_freq is not None:
                # longrope: long factors once the sequence outgrows original_max_position_embeddings
                use_long = b.op("Greater", seq_len, b.const(f.long_after, INT64))
                long_freq = b.tensor(f.long_inv_freq, f"{name}.long_inv_freq")
                inv_freq = b.op("Where", use_long, long_freq, inv_freq)  # [batch, 1, dim/2]
            else:
                inv_freq = _dynamic_ntk(b, seq_len, f, inv_freq, name)  # [batch, 1, dim/2]
        freqs = b.op("Mul", pos, inv_freq)  # [batch, seq, dim/2]
        if interleaved:
            # channel pairs (2i, 2i+1) share frequency i: [f0, f0, f1, f1, ...]
            pairs = b.op("Unsqueeze", freqs, b.ints([-1]))  # [batch, seq, dim/2, 1]
            emb = b.op("Reshape", b.op("Concat", pairs, pairs, axis=-1), b.ints([0, 0, f.dim]))
        else:
            emb = b.op("Concat", freqs, freqs, axis=-1)  # [batch, seq, dim]
        cos, sin = b.op("Cos", emb), b.op("Sin", emb)
        if f.attention_factor != 1.0:
            factor = b.const(f.attention_factor, FLOAT)
            cos, sin = b.op("Mul", cos, factor), b.op("Mul", sin, factor)
        if b.dtype != FLOAT:
            cos, sin = b.cast(cos, b.dtype), b.cast(sin, b.dtype)
        # [batch, 1, seq, dim]: broadcasts over the heads of [batch, heads, seq, head_dim]
        cos = b.op("Unsqueeze", cos, b.ints([1]), name="cos")
        sin = b.op("Unsqueeze", sin, b.ints([1]), name="sin")
    return RotaryTables(cos, sin, f.dim, interleaved)


def _dynamic_ntk(b: GraphBuilder, seq_len: ir.Value, f: RopeFrequencies, static: ir.Value,
                 name: str) -> ir.Value:
    """transformers' _compute_dynamic_ntk_parameters with a tensor seq_len, in float32."""
    d = f.dynamic
    assert d is not None
    length = b.cast(seq_len, FLOAT)  # [batch, 1, 1]
    # (factor * L / max_pos) - (factor - 1)
    stretch = b.op("Sub", b.op("Div", b.op("Mul", length, b.const(d.factor, FLOAT)),
                                b.const(float(d.max_position_embeddings), FLOAT)),
                   b.const(d.factor - 1, FLOAT))
    base = b.op("Mul", b.op("Pow", stretch, b.const(f.dim / (f.dim - 2), FLOAT)), b.const(d.theta, FLOAT))
    exponents = b.tensor(np.arange(0, f.dim, 2, dtype=np.float32) / np.float32(f.dim), f"{name}.exponents")
    grown = b.op("Reciprocal", b.op("Pow", base, exponents))  # [batch, 1, dim/2]
    # up to max_position_embeddings transformers keeps its init-time table
    longer = b.op("Greater", seq_len, b.const(d.max_position_embeddings, INT64))
    return b.op("Where", longer, grown, static)


def apply_rotary(b: GraphBuilder, x: ir.Value, rot: RotaryTables, head_dim: int) -> ir.Value:
    """x: [batch, heads, seq, head_dim] -> same, first rot.dim channels rotated."""
    dim = rot.dim
    if dim < head_dim:  # partial rotary: the tail channels pass through unrotated
        x_rot = _slice_last(b, x, 0, dim)
        x_pass = _slice_last(b, x, dim, INT64_MAX)
    else:
        x_rot = x
    if rot.interleaved:
        rotated = _rotate_pairs(b, x_rot, dim)
    else:
        # rotate_half: cat(-x2, x1)
        x1 = _slice_last(b, x_rot, 0, dim // 2)
        x2 = _slice_last(b, x_rot, dim // 2, INT64_MAX)
        rotated = b.op("Concat", b.op("Neg", x2), x1, axis=-1)
    out = b.op("Add", b.op("Mul", x_rot, rot.cos), b.op("Mul", rotated, rot.sin))
    return b.op("Concat", out, x_pass, axis=-1) if dim < head_dim else out


def _rotate_pairs(b: GraphBuilder, x: ir.Value, dim: int) -> ir.Value:
    # GPT-J style: (x0, x1) -> (-x1, x0) for each channel pair
    pairs = b.op("Reshape", x, b.ints([0, 0, 0, dim // 2, 2]))  # [batch, heads, seq, dim/2, 2]
    even = _slice_last(b, pairs, 0, 1)
    odd = _slice_last(b, pairs, 1, 2)
    return b.op("Reshape", b.op("Concat", b.op("Neg", odd), even, axis=-1), b.ints([0, 0, 0, dim]))


def _slice_last(b: GraphBuilder, x: ir.Value, start: int, end: int) -> ir.Value:
    return b.op("Slice", x, b.ints([start]), b.ints([end]), b.ints([-1]))
