"""The fused attention block of one decoder layer, found from its Attention-24 node.

After the fusion passes, each layer's attention reads (see engine_builder/formats/graph_io.py):
    q4 = [RotaryEmbedding](Transpose(q_heads, [0, 2, 1, 3]), cos, sin)   # q_heads [batch, seq, heads, head_dim]
    k4 = [RotaryEmbedding](Transpose(k_heads, [0, 2, 1, 3]), cos, sin)   # same tables and attributes
    v4 = Transpose(v_heads, [0, 2, 1, 3])
    present_key = TensorScatter(past_key, k4, past_lengths, axis=-2)     # graph input -> graph output
    out = Attention(q4, present_key, present_value, mask, scale, softcap)
or, with an int8 cache (engine_builder/network/kv_quant.py), k4 quantized before the write and
present_key dequantized before the Attention.
with `mask` the emitter's additive causal mask over cache slots (optionally a sliding window).
Lowering passes replace the whole block by one backend op, which is only exact when the mask
is exactly that causal (+ window) mask, so the mask is traced back to past_lengths here too.
`find_attention_block` raises NoMatch with the reason when a node does not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import onnx_ir as ir

from passes.constant_values import ints
from passes.fuse_kv_cache_update import is_arange

BHSD = [0, 2, 1, 3]
# the emitter fills hidden slots with the dtype's minimum; anything this low underflows exp to 0
HIDDEN_BIAS_MAX = -1e4


class NoMatch(Exception):
    """The node is not a lowerable attention block; str(self) says why."""


NO_ATTENTION = "no Attention-24 node (run fuse_attention first)"
T = TypeVar("T")


def match_attention_nodes(model: ir.Model, match: Callable[[ir.Node, ir.Graph], T]) -> tuple[list[T], str | None]:
    """MATCH (which raises NoMatch) at every Attention-24 node: what matched, and the first reason a node did not."""
    matched, why = [], None
    for node in model.graph:
        if node.op_type == "Attention" and node.domain in ("", "ai.onnx"):
            try:
                matched.append(match(node, model.graph))
            except NoMatch as exc:
                why = why or f"at Attention node {node.name!r}: {exc}"
    return matched, why


@dataclass(frozen=True)
class Rotary:
    cos: ir.Value  # [batch, seq, rot_dim / 2]
    sin: ir.Value
    interleaved: int
    dim: int | None  # rotary_embedding_dim, None = whole head


@dataclass(frozen=True)
class CacheQuant:
    """An int8 KV cache (engine_builder/network/kv_quant.py): what the cache stores is
    Cast(Clip(Round(x / scale), low, high), int8), and attention reads Cast(stored, float) * scale."""

    k_scale: ir.Value  # [1, kv_heads, 1, head_dim] float32
    v_scale: ir.Value
    low: ir.Value  # the Clip bounds, float32 scalars
    high: ir.Value


@dataclass(frozen=True)
class AttentionBlock:
    attention: ir.Node
    q_heads: ir.Value  # [batch, seq, heads, head_dim]
    k_heads: ir.Value  # [batch, seq, kv_heads, head_dim]
    v_heads: ir.Value
    rotary: Rotary | None
    past_key: ir.Value  # graph input  [batch, kv_heads, max_seq, head_dim]
    past_value: ir.Value
    present_key: ir.Value  # graph output, same shape
    present_value: ir.Value
    past_lengths: ir.Value  # graph input [batch] int64
    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    softcap: float
    window: int | None  # sliding window in transformers' sense: slot j visible iff j > p - window
    cache_quant: CacheQuant | None = None  # None: the cache holds the compute dtype


def _producer(value: ir.Value | None, op_type: str, what: str) -> ir.Node:
    node = value.producer() if value is not None else None
    if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
        raise NoMatch(f"{what} is not made by {op_type}")
    return node


def _attr(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _bhsd_input(value: ir.Value, what: str) -> tuple[ir.Value, ir.Node | None]:
    """value = [RotaryEmbedding](Transpose(x, [0, 2, 1, 3])) -> (x, rotary node or None)."""
    node = value.producer()
    rotary = None
    if node is not None and node.op_type == "RotaryEmbedding" and node.domain in ("", "ai.onnx"):
        if len([i for i in node.inputs if i is not None]) != 3 or "num_heads" in node.attributes:
            raise NoMatch(f"rotary of {what} has position_ids or is not the 4-D form")
        rotary, value = node, node.inputs[0]
    transpose = _producer(value, "Transpose", f"{what} (before rotary)")
    if list(_attr(transpose, "perm", [])) != BHSD:
        raise NoMatch(f"{what} is not transposed [batch, seq, heads, dim] -> [batch, heads, seq, dim]")
    return transpose.inputs[0], rotary


def _cache_write(present: ir.Value, graph: ir.Graph, what: str) -> tuple[ir.Value, ir.Value, ir.Value]:
    """present = TensorScatter(past, update, past_lengths) over whole graph I/O -> (past, update, lengths)."""
    node = _producer(present, "TensorScatter", what)
    if _attr(node, "mode", "linear") != "linear" or _attr(node, "axis", -2) not in (-2, 2):
        raise NoMatch(f"{what} is not a linear TensorScatter on the sequence axis")
    past, update, lengths = node.inputs[0], node.inputs[1], node.inputs[2]
    if past not in graph.inputs or lengths not in graph.inputs:
        raise NoMatch(f"{what}: cache buffer and write offsets are not graph inputs")
    if present not in graph.outputs or len(present.uses()) != 1:
        raise NoMatch(f"{what} is not a graph output read only by its attention")
    if len(past.uses()) != 1:  # the buffer is updated in place: nobody else may read it
        raise NoMatch(f"{past.name} has readers besides its cache write")
    return past, update, lengths


def _dequantized(value: ir.Value) -> tuple[ir.Value, ir.Value | None]:
    """value = Mul(Cast(stored int8, to=float), scale) -> (stored, scale); any other value -> (value, None)."""
    mul = value.producer()
    cast = mul.inputs[0].producer() if mul is not None and mul.op_type == "Mul" else None
    if cast is None or cast.op_type != "Cast" or cast.inputs[0].dtype != ir.DataType.INT8:
        return value, None
    return cast.inputs[0], mul.inputs[1]


def _quantized(update: ir.Value, scale: ir.Value, what: str) -> tuple[ir.Value, ir.Value, ir.Value]:
    """update = Cast(Clip(Round(Div(x, scale)), low, high), to=int8) -> (x, low, high)."""
    cast = _producer(update, "Cast", f"{what}'s int8 cache write")
    clip = _producer(cast.inputs[0], "Clip", f"{what}'s int8 cache write")
    div = _producer(_producer(clip.inputs[0], "Round", f"{what}'s int8 cache write").inputs[0], "Div",
                    f"{what}'s int8 cache write")
    if div.inputs[1] is not scale or len(clip.inputs) != 3:
        raise NoMatch(f"{what} is quantized into the cache with another scale than it is read with")
    return div.inputs[0], clip.inputs[1], clip.inputs[2]


def _query_positions(value: ir.Value, past_lengths: ir.Value) -> None:
    """value = Unsqueeze(Unsqueeze(past_lengths, [1]) + arange(seq), [1, 3])  # [batch, 1, seq, 1]"""
    outer = _producer(value, "Unsqueeze", "query positions")
    if ints(outer.inputs[1]) != [1, 3]:
        raise NoMatch("query positions are not laid out [batch, 1, seq, 1]")
    add = _producer(outer.inputs[0], "Add", "query positions")
    for lengths, steps in (add.inputs, reversed(add.inputs)):
        node = lengths.producer()
        if (node is not None and node.op_type == "Unsqueeze" and node.inputs[0] is past_lengths
                and ints(node.inputs[1]) == [1] and is_arange(steps, axis=1)):
            return
    raise NoMatch("query positions are not past_lengths + arange(seq)")


def _mask_window(mask: ir.Value, past_lengths: ir.Value, max_seq: int) -> int | None:
    """The sliding window of the emitter's causal mask (None: plain causal); NoMatch otherwise."""
    where = _producer(mask, "Where", "attention mask")
    zero, hidden = (i.const_value for i in where.inputs[1:])
    if zero is None or hidden is None or np.any(zero.numpy() != 0) or np.any(hidden.numpy() > HIDDEN_BIAS_MAX):
        raise NoMatch("attention mask is not Where(visible, 0, large negative)")
    cond = where.inputs[0].producer()
    window = None
    if cond is not None and cond.op_type == "And":
        a, b = cond.inputs
        if a.producer() is not None and a.producer().op_type == "Greater":
            a, b = b, a
        visible, greater = a, _producer(b, "Greater", "sliding-window condition")
        slots, start = greater.inputs
        sub = _producer(start, "Sub", "sliding-window start")
        window = (ints(sub.inputs[1]) or [None])[0]
        if window is None or window <= 0:
            raise NoMatch("sliding window is not a positive constant")
        _query_positions(sub.inputs[0], past_lengths)
        _check_slots(slots, max_seq)
    else:
        visible = where.inputs[0]
    less = _producer(visible, "LessOrEqual", "causal condition")
    _check_slots(less.inputs[0], max_seq)
    _query_positions(less.inputs[1], past_lengths)
    return window


def _check_slots(value: ir.Value, max_seq: int) -> None:
    if ints(value) != list(range(max_seq)):
        raise NoMatch(f"mask does not compare against cache slots 0..{max_seq - 1}")


def find_attention_block(node: ir.Node, graph: ir.Graph) -> AttentionBlock:
    if node.op_type != "Attention" or node.domain not in ("", "ai.onnx"):
        raise NoMatch(f"{node.op_type} is not Attention-24")
    inputs = list(node.inputs)
    if len(inputs) != 4 or any(i is None for i in inputs) or any(o.uses() for o in node.outputs[1:]):
        raise NoMatch("Attention has past/present inputs or extra outputs in use")
    for name in ("is_causal", "qk_matmul_output_mode", "q_num_heads", "kv_num_heads"):
        if _attr(node, name, 0):
            raise NoMatch(f"Attention sets {name}; expected 4-D q/k/v with an additive mask")
    if _attr(node, "softmax_precision", ir.DataType.FLOAT) != ir.DataType.FLOAT:
        raise NoMatch("Attention takes its softmax below float32")
    query, cached_key, cached_value, mask = inputs
    present_key, k_scale = _dequantized(cached_key)
    present_value, v_scale = _dequantized(cached_value)
    past_key, k4, past_lengths = _cache_write(present_key, graph, "present key")
    past_value, v4, lengths_v = _cache_write(present_value, graph, "present value")
    if lengths_v is not past_lengths:
        raise NoMatch("key and value are written at different offsets")
    cache_quant = None
    if (k_scale is None) != (v_scale is None):
        raise NoMatch("only one of the key and value caches is int8")
    if k_scale is not None:
        k4, low, high = _quantized(k4, k_scale, "key")
        v4, v_low, v_high = _quantized(v4, v_scale, "value")
        if (v_low, v_high) != (low, high):
            raise NoMatch("key and value are clipped to different int8 ranges")
        cache_quant = CacheQuant(k_scale, v_scale, low, high)
    q_heads, q_rotary = _bhsd_input(query, "query")
    k_heads, k_rotary = _bhsd_input(k4, "key")
    v_heads, v_rotary = _bhsd_input(v4, "value")
    if v_rotary is not None or (q_rotary is None) != (k_rotary is None):
        raise NoMatch("rotary is not applied to exactly query and key")
    rotary = None
    if q_rotary is not None:
        if list(q_rotary.inputs[1:3]) != list(k_rotary.inputs[1:3]) or \
                {k: a.value for k, a in q_rotary.attributes.items()} != \
                {k: a.value for k, a in k_rotary.attributes.items()}:
            raise NoMatch("query and key are rotated with different tables or attributes")
        rotary = Rotary(q_rotary.inputs[1], q_rotary.inputs[2], int(_attr(q_rotary, "interleaved", 0)),
                        _attr(q_rotary, "rotary_embedding_dim", 0) or None)
    shape, q_shape = past_key.shape, q_heads.shape
    if shape is None or q_shape is None or len(shape) != 4 or len(q_shape) != 4 or \
            not all(isinstance(d, int) for d in (shape[1], shape[2], shape[3], q_shape[2])):
        raise NoMatch("head counts, head size or max_seq are not static (run shape inference)")
    window = _mask_window(mask, past_lengths, shape[2])
    head_dim = shape[3]
    return AttentionBlock(node, q_heads, k_heads, v_heads, rotary, past_key, past_value, present_key,
                          present_value, past_lengths, heads=q_shape[2], kv_heads=shape[1], head_dim=head_dim,
                          scale=float(_attr(node, "scale", head_dim ** -0.5)),
                          softcap=float(_attr(node, "softcap", 0.0)), window=window, cache_quant=cache_quant)
