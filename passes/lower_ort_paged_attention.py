"""lower_ort_paged_attention: the paged layout's attention (network/paged_attention.py) with fewer nodes.

The portable paged block (what TensorRT builds) rotates q and k in [batch, heads, seq, head_dim] and
writes k and v into the pool in that order, so each layer runs, around its Attention-24:

    q: Reshape -> Transpose -> RotaryEmbedding -> Reshape -> Transpose -> Reshape   (head-major rows)
    k: Reshape -> Transpose -> RotaryEmbedding -> ScatterND(pool, indices [batch, kv_heads, seq, 3])
    v: Reshape -> Transpose -> ScatterND

For onnxruntime this becomes

    q: RotaryEmbedding([batch, seq, heads * head_dim], num_heads) -> Reshape -> Transpose -> Reshape
    k: RotaryEmbedding([batch, seq, kv_heads * head_dim], num_heads) -> Reshape -> ScatterND(pool,
       indices [batch, seq, kv_heads, 3])
    v: ScatterND(pool, indices [batch, seq, kv_heads, 3], the [batch, seq, kv_heads, head_dim] Reshape as is)

with the indices transposed once per step, not per layer: 4 nodes fewer per layer (3 Transposes, 1
Reshape), the same values written to the same pool positions and the same rows attended. A batch-1
decode step is a few hundred small kernels besides its matmuls, and each costs onnxruntime's executor
(and, with 2+ threads, its thread pool) a few microseconds whatever its size: what made the paged step
5-8 % slower than the slot layout's GroupQueryAttention at batch 1 (benchmarks/paged_kv.py).
The slot layout's block is lower_ort_attention's; an int8 paged cache, or a block of another shape, is
left as it is (why_not says why).
"""

from __future__ import annotations

import onnx_ir as ir

from passes.attention_block import NO_ATTENTION, NoMatch, _attr, _bhsd_input, _producer, match_attention_nodes
from passes.base import Pass, register_pass
from passes.constant_values import ints
from passes.lower_ort_attention import _Emitter, _flat

HEAD_MAJOR_Q = [1, 0, 2, 3, 4]  # [batch, kv_heads, rep, seq, hd] -> [kv_heads, batch, rep, seq, hd]


class _PagedBlock:
    """One layer's paged attention, found from its Attention-24 node (NoMatch otherwise)."""

    def __init__(self, node: ir.Node, graph: ir.Graph):
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx"):
            raise NoMatch(f"{node.op_type} is not Attention-24")
        inputs = list(node.inputs)
        if len(inputs) != 4 or any(i is None for i in inputs) or any(o.uses() for o in node.outputs[1:]):
            raise NoMatch("Attention has past/present inputs or extra outputs in use")
        for name in ("is_causal", "q_num_heads", "kv_num_heads"):
            if _attr(node, name, 0):
                raise NoMatch(f"Attention sets {name}")
        self.attention = node
        q_att, k_att, v_att, _ = inputs
        self.write_k, self.pool_k = self._paged_read(k_att, graph, "key")
        self.write_v, self.pool_v = self._paged_read(v_att, graph, "value")
        self.indices = self.write_k.inputs[1]
        if self.write_v.inputs[1] is not self.indices:
            raise NoMatch("key and value are written at different pool positions")
        shape = self.pool_k.shape  # [kv_heads, num_blocks, B, head_dim]
        if shape is None or len(shape) != 4 or not isinstance(shape[0], int) or not isinstance(shape[3], int):
            raise NoMatch("pool head count or head size is not static")
        self.kv_heads, self.head_dim = shape[0], shape[3]

        # q_att = Reshape(Transpose(Reshape(q4, [0, kv, rep, -1, hd]), [1, 0, 2, 3, 4]), [kv, 0, -1, hd])
        outer = _producer(q_att, "Reshape", "query rows")
        transpose = _producer(outer.inputs[0], "Transpose", "query rows")
        if list(_attr(transpose, "perm", [])) != HEAD_MAJOR_Q:
            raise NoMatch("query is not transposed to head-major rows")
        inner = _producer(transpose.inputs[0], "Reshape", "query rows")
        kv, hd = self.kv_heads, self.head_dim
        rep_shape = ints(inner.inputs[1])
        if rep_shape is None or len(rep_shape) != 5 or rep_shape[:2] != [0, kv] or rep_shape[3:] != [-1, hd] \
                or ints(outer.inputs[1]) != [kv, 0, -1, hd]:
            raise NoMatch("query rows are not grouped [kv_heads, batch, rep * seq, head_dim]")
        self.rep = rep_shape[2]
        self.q_heads, q_rotary = _bhsd_input(inner.inputs[0], "query")
        self.k_heads, k_rotary = _bhsd_input(self.write_k.inputs[2], "key")
        self.v_heads, v_rotary = _bhsd_input(self.write_v.inputs[2], "value")
        if v_rotary is not None or (q_rotary is None) != (k_rotary is None):
            raise NoMatch("rotary is not applied to exactly query and key")
        if q_rotary is not None and (list(q_rotary.inputs[1:3]) != list(k_rotary.inputs[1:3]) or
                                     {k: a.value for k, a in q_rotary.attributes.items()} !=
                                     {k: a.value for k, a in k_rotary.attributes.items()}):
            raise NoMatch("query and key are rotated with different tables or attributes")
        self.rotary = q_rotary
        for value, heads, what in ((self.q_heads, kv * self.rep, "query"), (self.k_heads, kv, "key"),
                                   (self.v_heads, kv, "value")):
            if value.shape is None or len(value.shape) != 4 or list(value.shape[2:]) != [heads, hd]:
                raise NoMatch(f"{what} is not [batch, seq, {heads}, {hd}] (run shape inference)")

    @staticmethod
    def _paged_read(value: ir.Value, graph: ir.Graph, what: str) -> tuple[ir.Node, ir.Value]:
        """value = Reshape(Gather(ScatterND(pool, indices, new), block_table, axis=1)) -> (ScatterND, pool)."""
        gather = _producer(_producer(value, "Reshape", f"cached {what}").inputs[0], "Gather", f"cached {what}")
        if _attr(gather, "axis", 0) != 1:
            raise NoMatch(f"cached {what} is not gathered along the pool's block axis")
        write = _producer(gather.inputs[0], "ScatterND", f"{what} pool write")
        pool, present = write.inputs[0], write.outputs[0]
        if pool not in graph.inputs or present not in graph.outputs:
            raise NoMatch(f"{what} pool write is not graph input -> graph output")
        if _attr(write, "reduction", "none") != "none":
            raise NoMatch(f"{what} pool write reduces")
        return write, pool


def _lower(block: _PagedBlock, indices: ir.Value, e: _Emitter) -> None:
    kv, hd, heads = block.kv_heads, block.head_dim, block.kv_heads * block.rep
    q3 = _flat(e, block.q_heads, heads * hd)  # [batch, seq, heads * head_dim]
    k_new = block.k_heads  # [batch, seq, kv_heads, head_dim]
    if block.rotary is not None:
        r = block.rotary
        cos, sin = r.inputs[1], r.inputs[2]
        attrs = {k: a.value for k, a in r.attributes.items()}
        q3 = e.op("RotaryEmbedding", q3, cos, sin, num_heads=heads, **attrs)
        k3 = e.op("RotaryEmbedding", _flat(e, block.k_heads, kv * hd), cos, sin, num_heads=kv, **attrs)
        k_new = e.op("Reshape", k3, e.ints([0, 0, kv, hd]))
    q = e.op("Reshape", q3, e.ints([0, 0, kv, block.rep, hd]))  # [batch, seq, kv_heads, rep, hd]
    q = e.op("Transpose", q, perm=[2, 0, 3, 1, 4])  # [kv_heads, batch, rep, seq, hd]
    q = e.op("Reshape", q, e.ints([kv, 0, -1, hd]))  # [kv_heads, batch, rep * seq, hd]
    block.write_k.replace_input_with(1, indices)
    block.write_k.replace_input_with(2, k_new)
    block.write_v.replace_input_with(1, indices)
    block.write_v.replace_input_with(2, block.v_heads)
    block.attention.replace_input_with(0, q)


@register_pass
class LowerOrtPagedAttention(Pass):
    name = "lower_ort_paged_attention"
    description = "paged attention: rotary on [batch, seq, hidden], pool writes in token order (fewer nodes)"

    def apply(self, model: ir.Model) -> int:
        blocks, _ = match_attention_nodes(model, _PagedBlock)
        if not blocks:
            return 0
        graph = model.graph
        transposed: dict[int, ir.Value] = {}  # id(indices) -> [batch, seq, kv_heads, 3], once per step
        for block in blocks:
            e = _Emitter(graph, f"ort_paged.{block.write_k.outputs[0].name}")
            indices = transposed.get(id(block.indices))
            if indices is None:
                indices = transposed[id(block.indices)] = e.op("Transpose", block.indices, perm=[0, 2, 1, 3])
            _lower(block, indices, e)
            graph.extend(e.nodes)
        graph.sort()  # the new nodes were appended: put each before its readers
        ir.passes.common.RemoveUnusedNodesPass()(model)
        return len(blocks)

    def why_not(self, model: ir.Model) -> str | None:
        return match_attention_nodes(model, _PagedBlock)[1] or NO_ATTENTION
