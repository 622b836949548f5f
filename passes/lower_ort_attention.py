"""lower_ort_attention: each layer's attention block becomes com.microsoft GroupQueryAttention.

onnxruntime's GroupQueryAttention (GQA) takes q/k/v as [batch, seq, heads * head_dim], writes the
new keys/values into past_key/past_value [batch, kv_heads, max_seq, head_dim] at each sequence's
own offset and attends causally over each sequence's own length only (Attention-24 scores all
max_seq slots against a mask: 4-5x slower per layer in a SmolLM2-shaped decode step). When
past_key.{i} and present_key.{i} are bound to the same OrtValue (IO binding), it detects the
shared buffer and writes only the new tokens: no per-step copy of the cache. And q/k/v/output
keep the [batch, seq, hidden] layout, so the four Transposes per layer go. Per block (see
passes/attention_block.py for what is matched):

    q3 = RotaryEmbedding([batch, seq, heads * head_dim], cos, sin, num_heads)   # k3 likewise; v3 as is
    If(seq == 1 or batch == 1 or max(past_lengths) == 0)
        then: GroupQueryAttention(q3, k3, v3, past_key, past_value, seqlens_k, total_len)
        else: the TensorScatter + Attention-24 block as before (reshaped from q3, k3, v3)
    -> out [batch, seq, heads * head_dim], present_key, present_value

or, when the rotary table is a fixed function of the position (plain, linear or llama3 rope over the whole
head: no attention factor, nothing computed from the sequence length), GQA rotates q and k itself from
[max_seq, head_dim / 2] cos/sin caches (the block's own Cos/Sin of the constant positions, which onnxruntime
folds when it loads the graph: the unlowered graph's tables to the bit, see _rotary_caches), and reads q, k
and v from the projection's one output when they are split from it (no q/k norm between):

    If(...)
        then: GroupQueryAttention(qkv, -, -, past_key, past_value, seqlens_k, total_len, cos_cache, sin_cache,
                                  do_rotary=1)
        else: Split(qkv) -> RotaryEmbedding(q3), RotaryEmbedding(k3) -> the fallback block as before

so a decode step runs no Split and no RotaryEmbedding node (90 fewer kernels per SmolLM2 step: the
Split and RotaryEmbedding kernels were 0.5-1.1 ms of a 23-28 ms profiled step on a quiet Xeon at 2
threads, benchmarks/decode_overhead.py --profile). GQA derives each token's position from seqlens_k,
past_lengths[b] + t: what the runner binds as position_ids (graph_io's contract; a ragged row's padding
is rotated differently, which only its masked slots see). drop_ort_attention_fallback then removes the If.

Why the If: onnxruntime 1.31's CPU GQA refuses a multi-token step over a non-empty cache when
batch > 1 ("batch_size must be 1 when sequence_length > 1 and past context is given."), which the
graph contract allows (batched chunked prefill, prefix reuse). Every other step takes GQA, and
the shared buffer still works through the If (its outputs are allocated in the bound OrtValue).

Semantics checked against the unfused graph (tests/passes/test_lower_ort_attention.py):
  * seqlens_k = past_lengths + seq - 1 (int32), total_sequence_length = max(past_lengths) + seq.
  * the additive mask is dropped: GQA is causal over slots 0..past_lengths[b] + t, and its
    local_window_size W keeps slots j > p - W, exactly transformers' sliding window.
  * other rotary (dynamic NTK, longrope: tables computed from the sequence length; yarn's attention
    factor; partial rotary) stays our RotaryEmbedding-23 (3-D form) before the If.
  * the If costs 15-21 us per layer beyond its GQA (profile above), and every value only its else
    branch reads (mask, rotary tables) is computed each step: passes/drop_ort_attention_fallback.py.
  * CPU GQA has float32 and float16 kernels only (bfloat16: "Could not find an implementation"),
    and needs head_dim % 8 == 0.
  * with past/present in separate buffers GQA writes zeros above each sequence's length, where
    the unfused graph copies the past buffer: identical under graph_io's zero-filled buffers.
  * an int8 cache (`convert --kv-cache int8`, engine_builder/network/kv_quant.py) is handed to GQA as
    it is: int8 past/present, kv_cache_bit_width 8, per-channel scales [1, kv_heads, 1, head_dim] as
    inputs 12 and 13 (k/v_quant_type PER_CHANNEL). onnxruntime 1.31 rounds and saturates as kv_quant
    does (measured); it needs float32 q/k/v, and has no CPU kernel for an fp8 cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from engine_builder.formats.graph_io import POSITION_IDS
from engine_builder.network import kv_quant
from passes.attention_block import (
    BHSD,
    NO_ATTENTION,
    AttentionBlock,
    NoMatch,
    find_attention_block,
    match_attention_nodes,
)
from passes.base import MS_DOMAIN, Pass, register_pass
from passes.constant_values import ints

GQA_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})


class _Emitter:
    """Creates nodes named `{prefix}/{op}_{n}` (values likewise): unique in the graph and its branches."""

    def __init__(self, graph: ir.Graph, prefix: str):
        self.graph, self.prefix, self.nodes, self._n = graph, prefix, [], 0

    def op(self, op_type: str, *inputs: ir.Value | None, domain: str = "", num_outputs: int = 1,
           **attrs: Any) -> Any:
        self._n += 1
        name = f"{self.prefix}/{op_type}_{self._n}"
        node = ir.Node(domain, op_type, list(inputs), attributes=ir.convenience.convert_attributes(attrs),
                       num_outputs=num_outputs, name=name)
        for j, out in enumerate(node.outputs):
            out.name = name if num_outputs == 1 else f"{name}:{j}"
        self.nodes.append(node)
        return node.outputs[0] if num_outputs == 1 else node.outputs

    def ints(self, values: Sequence[int]) -> ir.Value:
        """A shared int64 initializer of the main graph (branches read it from the outer scope)."""
        name = "ort_attention.const." + "_".join(str(v) for v in values)
        if name not in self.graph.initializers:
            self.graph.register_initializer(ir.Value(name=name, const_value=ir.tensor(np.asarray(values, np.int64),
                                                                                       name=name)))
        return self.graph.initializers[name]


class _StepInputs:
    """Per-step tensors every layer's GQA shares, computed once before the first layer."""

    def __init__(self, e: _Emitter, block: AttentionBlock):
        lengths = block.past_lengths  # [batch] int64
        rows = _projection(block.q_heads)  # [batch, seq, ...]: read the shape where no dead Split stays alive for it
        seq = e.op("Squeeze", e.op("Shape", rows, start=1, end=2))  # scalar
        batch = e.op("Squeeze", e.op("Shape", rows, start=0, end=1))
        max_past = e.op("ReduceMax", lengths, keepdims=0)  # scalar
        one, zero = e.ints([1]), e.ints([0])
        self.seqlens_k = e.op("Cast", e.op("Sub", e.op("Add", lengths, seq), one), to=ir.DataType.INT32)  # [batch]
        self.total = e.op("Cast", e.op("Add", max_past, seq), to=ir.DataType.INT32)  # scalar
        # the steps CPU GQA accepts: decode, a single sequence, or a first prefill of the batch
        self.use_gqa = e.op("Squeeze", e.op("Or", e.op("Or", e.op("Equal", seq, one), e.op("Equal", batch, one)),
                                            e.op("Equal", max_past, zero)))  # scalar bool


def _projection(heads: ir.Value) -> ir.Value:
    """The value q_heads [batch, seq, heads, head_dim] was reshaped (and split) from, else q_heads itself."""
    node = heads.producer()
    if node is None or node.op_type != "Reshape" or node.domain != "":
        return heads
    split = node.inputs[0].producer()
    if split is not None and split.op_type == "Split" and split.domain in ("", "ai.onnx"):
        return split.inputs[0]
    return node.inputs[0]


def _flat(e: _Emitter, heads: ir.Value, width: int) -> ir.Value:
    """[batch, seq, n, head_dim] -> [batch, seq, n * head_dim], reusing the value it was reshaped from."""
    node = heads.producer()
    if node is not None and node.op_type == "Reshape" and node.domain == "":
        src = node.inputs[0]
        if src.shape is not None and len(src.shape) == 3 and src.shape[2] == width:
            return src
    return e.op("Reshape", heads, e.ints([0, 0, width]))


def _output_tail(block: AttentionBlock) -> ir.Value | None:
    """The Reshape(Transpose(attention, BHSD), [0, 0, heads * head_dim]) value, if that is the only consumer."""
    uses = block.attention.outputs[0].uses()
    if len(uses) != 1 or uses[0].node.op_type != "Transpose":
        return None
    perm = uses[0].node.attributes.get("perm")
    if perm is None or list(perm.value) != BHSD:
        return None
    after = uses[0].node.outputs[0].uses()
    if len(after) != 1 or after[0].node.op_type != "Reshape":
        return None
    reshape = after[0].node
    shape = reshape.inputs[1].const_value
    if shape is None or shape.numpy().tolist() != [0, 0, block.heads * block.head_dim]:
        return None
    return reshape.outputs[0]


def _check(block: AttentionBlock) -> None:
    dtype = block.q_heads.dtype
    if block.cache_quant is not None and dtype != ir.DataType.FLOAT:
        raise NoMatch(f"onnxruntime's CPU GroupQueryAttention reads an int8 cache with float32 q/k/v only, not {dtype}")
    if dtype not in GQA_DTYPES:
        raise NoMatch(f"onnxruntime's CPU GroupQueryAttention has no {dtype} kernel (float32/float16 only)")
    if block.head_dim % 8:
        raise NoMatch(f"head_dim {block.head_dim} is not a multiple of 8, which CPU GroupQueryAttention requires")
    if block.heads % block.kv_heads:
        raise NoMatch(f"{block.heads} query heads are not a multiple of {block.kv_heads} KV heads")


def _lower(graph: ir.Graph, block: AttentionBlock, step: _StepInputs, e: _Emitter,
           tables: tuple[ir.Value, ir.Value] | None) -> None:
    b, heads, kv_heads, dim = block, block.heads, block.kv_heads, block.head_dim
    fast = _Emitter(graph, f"{e.prefix}/gqa")
    slow = _Emitter(graph, f"{e.prefix}/fallback")
    q3 = _flat(e, b.q_heads, heads * dim)  # [batch, seq, heads * head_dim]
    k3, v3 = _flat(e, b.k_heads, kv_heads * dim), _flat(e, b.v_heads, kv_heads * dim)
    gqa_q, gqa_k, gqa_v = q3, k3, v3
    # the rotary and the q/k/v Split go inside the fallback branch when GQA does them itself: a node of the
    # main graph runs every step, also when only the branch not taken reads it
    inner = slow if tables is not None else e
    packed = _packed_qkv(q3, k3, v3, heads * dim, kv_heads * dim) if tables is not None else None
    if packed is not None:  # GQA reads q, k and v from the projection's one output
        gqa_q, gqa_k, gqa_v = packed, None, None
        q3, k3, v3 = slow.op("Split", packed, e.ints([heads * dim, kv_heads * dim, kv_heads * dim]), axis=-1,
                             num_outputs=3)
    if b.rotary is not None:
        rot = {"interleaved": b.rotary.interleaved, **({"rotary_embedding_dim": b.rotary.dim} if b.rotary.dim else {})}
        q3 = inner.op("RotaryEmbedding", q3, b.rotary.cos, b.rotary.sin, num_heads=heads, **rot)
        k3 = inner.op("RotaryEmbedding", k3, b.rotary.cos, b.rotary.sin, num_heads=kv_heads, **rot)
        if tables is None:
            gqa_q, gqa_k = q3, k3

    gqa_attrs: dict[str, Any] = {"num_heads": heads, "kv_num_heads": kv_heads, "scale": b.scale}
    if b.softcap:
        gqa_attrs["softcap"] = b.softcap
    if b.window is not None:
        gqa_attrs["local_window_size"] = b.window
    extra: list[ir.Value | None] = []  # inputs 7.. of GQA: cos/sin caches, position_ids, bias, head_sink, scales
    if tables is not None:
        extra = list(tables)
        gqa_attrs |= {"do_rotary": 1, "rotary_interleaved": b.rotary.interleaved}
    if b.cache_quant is not None:  # inputs 12 and 13
        extra = (extra or [None, None]) + [None] * 3 + [b.cache_quant.k_scale, b.cache_quant.v_scale]
        gqa_attrs |= {"kv_cache_bit_width": 8, "k_quant_type": "PER_CHANNEL", "v_quant_type": "PER_CHANNEL"}
    fast_out = fast.op("GroupQueryAttention", gqa_q, gqa_k, gqa_v, b.past_key, b.past_value, step.seqlens_k,
                       step.total, *extra, domain=MS_DOMAIN, num_outputs=3, **gqa_attrs)

    def bhsd(x: ir.Value, n: int) -> ir.Value:
        return slow.op("Transpose", slow.op("Reshape", x, e.ints([0, 0, n, dim])), perm=BHSD)

    new_keys, new_values = bhsd(k3, kv_heads), bhsd(v3, kv_heads)
    quant = b.cache_quant
    if quant is not None:
        new_keys = kv_quant.quantize(slow.op, new_keys, quant.k_scale, quant.low, quant.high)
        new_values = kv_quant.quantize(slow.op, new_values, quant.v_scale, quant.low, quant.high)
    keys = slow.op("TensorScatter", b.past_key, new_keys, b.past_lengths, axis=-2, mode="linear")
    values = slow.op("TensorScatter", b.past_value, new_values, b.past_lengths, axis=-2, mode="linear")
    read_keys, read_values = keys, values
    if quant is not None:
        read_keys, read_values = kv_quant.dequantize(slow.op, keys, quant.k_scale), \
            kv_quant.dequantize(slow.op, values, quant.v_scale)
    attn_attrs = {k: a.value for k, a in b.attention.attributes.items()}
    attn = slow.op("Attention", bhsd(q3, heads), read_keys, read_values, b.attention.inputs[3], **attn_attrs)
    slow_out = slow.op("Reshape", slow.op("Transpose", attn, perm=BHSD), e.ints([0, 0, heads * dim]))

    branch_outputs = []
    for branch, outs in ((fast, list(fast_out)), (slow, [slow_out, keys, values])):
        branch_outputs.append(ir.Graph(inputs=[], outputs=outs, nodes=branch.nodes, name=branch.prefix))
    out, present_key, present_value = e.op("If", step.use_gqa, num_outputs=3, then_branch=branch_outputs[0],
                                           else_branch=branch_outputs[1])
    out.dtype, out.shape = b.q_heads.dtype, ir.Shape([*b.q_heads.shape[:2], heads * dim])

    tail = _output_tail(b)
    if tail is None:  # an unusual consumer: give it the [batch, heads, seq, head_dim] it read before
        out = e.op("Transpose", e.op("Reshape", out, e.ints([0, 0, heads, dim])), perm=BHSD)
    graph.insert_before(b.attention, e.nodes)
    ir.convenience.replace_all_uses_with(tail if tail is not None else b.attention.outputs[0], out)
    for old, new in ((b.present_key, present_key), (b.present_value, present_value)):
        name, old.name = old.name, f"{old.name}.replaced"
        new.name, new.dtype, new.shape = name, old.dtype, old.shape
        graph.outputs[graph.outputs.index(old)] = new


def _packed_qkv(q3: ir.Value, k3: ir.Value, v3: ir.Value, q_width: int, kv_width: int) -> ir.Value | None:
    """The [batch, seq, (heads + 2 kv_heads) * head_dim] projection q3, k3, v3 are split from, in that order."""
    split = q3.producer()
    if split is None or split.op_type != "Split" or split.domain not in ("", "ai.onnx") or \
            list(split.outputs) != [q3, k3, v3] or len(split.inputs) != 2:
        return None
    packed = split.inputs[0]
    axis = split.attributes["axis"].value if "axis" in split.attributes else 0
    rank = len(packed.shape) if packed.shape is not None else None
    if rank != 3 or axis not in (-1, 2) or ints(split.inputs[1]) != [q_width, kv_width, kv_width]:
        return None
    return packed


def _rotary_caches(graph: ir.Graph, block: AttentionBlock, n: int) -> tuple[ir.Value, ir.Value] | None:
    """GQA's own rotary tables [max_seq, head_dim / 2] (cos, sin), when the block's are a fixed function of
    position_ids: cos = Cos(Unsqueeze(Cast(position_ids), -1) * inv_freq) (sin likewise), optionally cast to
    the compute dtype, over the whole head. Then GQA rotates q and k itself (do_rotary) at the position it
    derives from seqlens_k, past_lengths[b] + t: what the runner binds as position_ids (graph_io's
    contract; padding of a ragged row gets another rotation, which only its masked slots see). Rope
    scaling that depends on the length (dynamic NTK, longrope), an attention factor, or partial rotary keep
    the RotaryEmbedding nodes (None).

    The tables are the block's own nodes (Mul, Cos/Sin, Cast) applied to the constant positions 0..max_seq-1,
    which onnxruntime folds into initializers when it loads the graph (the build's prepacked twin holds
    them folded): each entry is what the unlowered graph computes at that position, to the bit. Tables
    computed here in numpy were not: onnxruntime's float32 Cos/Sin (Eigen's vectorized polynomial) differ
    from a correctly rounded cos by 1-2 ulp on 14-16% of SmolLM2's entries, which the float32 twin shrugs off
    (KL 8e-12) but MatMulNBits' int8 activations (accuracy level 4) turn into different roundings: the
    int8_wo g32 SmolLM2 twin moved by KL 0.0028 and its top-1 agreement with fp32 from 0.951 to 0.933."""
    rotary = block.rotary
    if rotary is None or rotary.dim is not None or block.cache_quant is not None:
        return None
    chains = []  # per table: (Cos or Sin node, Cast node or None)
    for value, op_type in ((rotary.cos, "Cos"), (rotary.sin, "Sin")):
        node, cast = value.producer(), None
        if node is not None and node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
            cast, node = node, node.inputs[0].producer()
        if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            return None
        chains.append((node, cast))
    freqs = chains[0][0].inputs[0]
    if freqs is not chains[1][0].inputs[0]:
        return None
    found = _position_times_constant(freqs)
    if found is None or found[0].const_value.numpy().reshape(-1).shape != (block.head_dim // 2,):
        return None
    inv_freq, position_first = found
    e = _Emitter(graph, f"ort_attention.rotary_cache.{n}")
    name = f"ort_attention.rotary_positions.{n}"
    # Cast(position_ids) to float is exact below 2^24, so the positions are given as float32 already
    positions = ir.Value(name=name, const_value=ir.tensor(
        np.arange(block.past_key.shape[2], dtype=np.float32)[:, None], name=name))  # [max_seq, 1]
    graph.register_initializer(positions)
    angles = e.op("Mul", *((positions, inv_freq) if position_first else (inv_freq, positions)))
    out = []
    for node, cast in chains:
        table = e.op(node.op_type, angles)
        if cast is not None:
            table = e.op("Cast", table, to=cast.attributes["to"].value)
        out.append(table)
    graph.insert_before(block.attention, e.nodes)  # inv_freq comes before the block, as its rotary did
    return out[0], out[1]


def _position_times_constant(freqs: ir.Value) -> tuple[ir.Value, bool] | None:
    """(inv_freq, whether the positions are Mul's first input) of freqs = Mul(Unsqueeze(Cast(position_ids,
    float), [-1]), inv_freq) (either order), inv_freq a constant of rank 1, else None."""
    mul = freqs.producer()
    if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx"):
        return None
    for first, (pos, const) in enumerate((mul.inputs, reversed(mul.inputs))):
        unsqueeze = pos.producer()
        if const.const_value is None or unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or \
                ints(unsqueeze.inputs[1]) not in ([-1], [2]):
            continue
        cast = unsqueeze.inputs[0].producer()
        if cast is None or cast.op_type != "Cast" or cast.inputs[0].name != POSITION_IDS or \
                cast.inputs[0] not in _graph_inputs(cast):
            continue
        return (const, first == 0) if const.const_value.numpy().ndim == 1 else None
    return None


def _graph_inputs(node: ir.Node) -> list[ir.Value]:
    return list(node.graph.inputs) if node.graph is not None else []


def _checked_block(node: ir.Node, graph: ir.Graph) -> AttentionBlock:
    block = find_attention_block(node, graph)
    _check(block)
    return block


@register_pass
class LowerOrtAttention(Pass):
    name = "lower_ort_attention"
    description = "attention block (rotary, TensorScatter, Attention-24) -> com.microsoft GroupQueryAttention"

    def apply(self, model: ir.Model) -> int:
        blocks, _ = match_attention_nodes(model, _checked_block)
        if not blocks:
            return 0
        graph = model.graph
        shared = _Emitter(graph, "ort_attention.step")
        step = _StepInputs(shared, blocks[0])
        graph.insert_before(blocks[0].attention, shared.nodes)
        tables: dict[tuple[int, int], tuple[ir.Value, ir.Value] | None] = {}  # per rotary (cos, sin) pair
        for block in blocks:
            rotary = block.rotary
            key = (id(rotary.cos), id(rotary.sin)) if rotary is not None else (0, 0)
            if key not in tables:
                tables[key] = _rotary_caches(graph, block, len(tables))
            _lower(graph, block, step, _Emitter(graph, f"ort_attention.{block.present_key.name}"), tables[key])
        ir.passes.common.RemoveUnusedNodesPass()(model)
        model.opset_imports.setdefault(MS_DOMAIN, 1)
        return len(blocks)

    def why_not(self, model: ir.Model) -> str | None:
        return match_attention_nodes(model, _checked_block)[1] or NO_ATTENTION
