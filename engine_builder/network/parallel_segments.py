"""One rank's graph of a tp/pp checkpoint, split at the collectives (formats/parallel_mapping.py).

ONNX has no collective op (and TensorRT would need a plugin), so each piece between two all-reduces is
its own graph; the runtime (runner/parallel/) runs one, all-reduces its partial sum, adds it to the
residual stream and runs the next:

    embed            input_ids -> partial            vocab-parallel: rows outside the shard give zeros
    layers.i.attn    hidden, position_ids, past_lengths, past_* -> partial, present_*
                     (attn_norm, attention over this rank's heads, o_proj's rows of the sum)
    layers.i.mlp     hidden -> partial               (mlp_norm, this rank's gate/up slice, down's rows)
    head             hidden -> local_logits          (final_norm, this rank's vocab shard of lm_head)

The attention and MLP are the single-process emitters (attention.py, mlp.py) over the rank's local
model config (its heads, KV heads, intermediate slice), so a tp rank computes exactly what the whole
model computes for its heads.
"""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from engine_builder.formats import graph_io as io
from engine_builder.formats import parallel_mapping as pm
from engine_builder.formats.checkpoint import CheckpointConfig, expected_shapes, weights_file
from engine_builder.formats.parallel_mapping import Segment
from engine_builder.formats.rope_frequencies import rope_frequencies
from engine_builder.network.attention import self_attention
from engine_builder.network.builder import FLOAT, INT64, GraphBuilder
from engine_builder.network.decoder import DTYPES, IR_VERSION, OPSET
from engine_builder.network.masks import attention_masks
from engine_builder.network.mlp import mlp
from engine_builder.network.norms import checkpoint_norm
from engine_builder.network.rotary import rotary_tables
from engine_builder.network.weights import CheckpointWeights
from engine_builder.util.errors import InputError
from engine_builder.util.version import __version__


def build_segment(ckpt_dir: Path, rank: int, segment: Segment, max_seq_len: int, dtype: str = "auto") -> ir.Model:
    """SEGMENT of RANK's graph; its weights reference ckpt_dir/rank{rank}.safetensors."""
    ckpt_dir = Path(ckpt_dir)
    ckpt = CheckpointConfig.load(ckpt_dir)
    mapping = ckpt.mapping
    if mapping is None:
        raise InputError(f"{ckpt_dir} is not a tp/pp checkpoint; convert it with `trtbuild convert ... --tp N`")
    cfg, local = ckpt.model, mapping.local_model(ckpt.model)
    dtype_name = ckpt.dtype if dtype == "auto" else dtype
    b = GraphBuilder(DTYPES[dtype_name])
    shapes = mapping.rank_tensors(cfg, rank, {n: s for n, (s, _) in expected_shapes(local).items()})
    w = CheckpointWeights(ckpt_dir, local, b, ckpt.quantization, file=weights_file(rank), shapes=shapes)
    hidden = _input(pm.HIDDEN, b.dtype, [io.BATCH, io.SEQ, cfg.hidden_size])
    extra_outputs: list[ir.Value] = []
    if segment.kind == "embed":
        input_ids = _input(io.INPUT_IDS, INT64, [io.BATCH, io.SEQ])
        inputs = [input_ids]
        out = _embed(b, w, input_ids, mapping.vocab_start(cfg, mapping.tp_rank(rank)), local.vocab_size)
        out.name, out.shape = pm.PARTIAL, ir.Shape([io.BATCH, io.SEQ, cfg.hidden_size])
    elif segment.kind == "attn":
        i = segment.layer
        assert i is not None
        position_ids = _input(io.POSITION_IDS, INT64, [io.BATCH, io.SEQ])
        past_lengths = _input(io.PAST_LENGTHS, INT64, [io.BATCH])
        kv = io.KVCacheLayout.of(local, max_seq_len, dtype_name, "none")
        kv_shape = list(kv.shape(io.BATCH))
        past = [_input(io.past_key(i), b.dtype, kv_shape), _input(io.past_value(i), b.dtype, kv_shape)]
        inputs = [hidden, position_ids, past_lengths, *past]
        spec = local.block.attention
        layer_type = spec.layer_types[i]
        with b.scope(f"layers.{i}"):
            # position_ids has input_ids' [batch, seq]: the masks only read its shape
            masks = attention_masks(b, position_ids, past_lengths, local.num_kv_heads, max_seq_len,
                                    spec.sliding_window if layer_type == "sliding_attention" else None)
            local_rope = layer_type == "sliding_attention" and local.rope.local_theta is not None
            rotary = rotary_tables(b, position_ids, rope_frequencies(local, layer_type),
                                   "rope_local" if local_rope else "rope", local.rope.interleaved)
            h = checkpoint_norm(b, hidden, w, f"layers.{i}.attn_norm", local.block.norm, name="attn_norm")
            attn = self_attention(b, h, local, w, i, rotary, masks, *past)
        out = attn.out
        out.name = pm.PARTIAL
        for value, name in ((attn.present_key, io.present_key(i)), (attn.present_value, io.present_value(i))):
            value.name, value.shape, value.dtype = name, ir.Shape(kv_shape), b.dtype
            extra_outputs.append(value)
    elif segment.kind == "mlp":
        i = segment.layer
        assert i is not None
        inputs = [hidden]
        with b.scope(f"layers.{i}"):
            h = checkpoint_norm(b, hidden, w, f"layers.{i}.mlp_norm", local.block.norm, name="mlp_norm")
            out = mlp(b, h, local, w, i)
        out.name = pm.PARTIAL
    else:  # head: the last position only (the runtime samples from it)
        inputs = [hidden]
        with b.scope("head"):
            h = b.op("Gather", hidden, b.ints([-1]), axis=1)  # [batch, 1, hidden]
            h = checkpoint_norm(b, h, w, "final_norm", local.block.norm, name="final_norm")
            out = b.linear(h, w["embed.weight" if cfg.tie_word_embeddings else "lm_head.weight"])
            if b.dtype != FLOAT:
                out = b.cast(out, FLOAT)
        out.name, out.dtype = pm.LOCAL_LOGITS, FLOAT
        out.shape = ir.Shape([io.BATCH, 1, local.vocab_size])
    if segment.kind != "head":
        out.dtype, out.shape = b.dtype, ir.Shape([io.BATCH, io.SEQ, cfg.hidden_size])
    graph = ir.Graph(inputs=inputs, outputs=[out, *extra_outputs], nodes=b.tape.nodes, initializers=b.initializers,
                     opset_imports={"": OPSET}, name=f"{cfg.architecture}_rank{rank}_{segment.name}")
    model = ir.Model(graph, ir_version=IR_VERSION, producer_name="trtbuild", producer_version=__version__)
    model.metadata_props.update({io.META_ARCHITECTURE: cfg.architecture, io.META_MAX_SEQ_LEN: str(max_seq_len),
                                 io.META_DTYPE: b.dtype.name.lower(), "trtbuild.segment": segment.name,
                                 "trtbuild.rank": str(rank)})
    ShapeInferencePass()(model)
    return model


def _embed(b: GraphBuilder, w: CheckpointWeights, input_ids: ir.Value, start: int, rows: int) -> ir.Value:
    """Vocab-parallel embedding: this shard's rows for ids in [start, start + rows), zeros for the others
    (the all-reduce then sums exactly one non-zero row per token)."""
    with b.scope("embed"):
        local = b.op("Sub", input_ids, b.const(start, INT64))  # [batch, seq]
        inside = b.op("And", b.op("GreaterOrEqual", local, b.const(0, INT64)),
                      b.op("Less", local, b.const(rows, INT64)))
        safe = b.op("Where", inside, local, b.const(0, INT64))
        found = b.op("Gather", w["embed.weight"], safe, axis=0)  # [batch, seq, hidden]
        return b.op("Where", b.op("Unsqueeze", inside, b.ints([-1])), found, b.const(0.0))


def _input(name: str, dtype: ir.DataType, shape: list) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))

