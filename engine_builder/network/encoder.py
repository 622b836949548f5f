"""The encoder graph (BERT family): embeddings, post-norm layers, pooling, optional L2 normalization.

What it computes and its I/O: formats/encoder_spec.py. No KV cache: each call sees whole texts,
so batch and sequence are both dynamic (the TensorRT profile spans them, build/encoder_profiles.py).
Attention is plain MatMul -> Softmax -> MatMul with an additive padding mask, the form every
backend runs (TensorRT-RTX has no fp32 fused attention kernel; onnxruntime fuses it on its own).
Pooling and normalization run in float32 whatever the activation dtype, as sentence-transformers
pools the model's output.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from engine_builder.formats import encoder_spec as io
from engine_builder.formats import graph_io
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.encoder_spec import EncoderSpec
from engine_builder.formats.model_config import ModelConfig
from engine_builder.network.builder import FLOAT, INT64, GraphBuilder
from engine_builder.network.decoder import DTYPES, IR_VERSION, OPSET
from engine_builder.network.linear import linear
from engine_builder.network.options import NetworkOptions
from engine_builder.network.weights import CheckpointWeights
from engine_builder.util.errors import InputError
from engine_builder.util.version import __version__

# sentence-transformers: token_embeddings[mask == 0] = -1e9 before max pooling; F.normalize's eps
MAX_POOL_FILL = -1e9
NORMALIZE_EPS = 1e-12
META_GRAPH = "trtbuild.graph"  # "encoder": model.onnx holds the encoder graph of encoder_spec.py


def build_encoder(ckpt_dir: Path, options: NetworkOptions = NetworkOptions()) -> ir.Model:
    """The encoder graph of checkpoint dir CKPT_DIR; its weights reference ckpt_dir/rank0.safetensors."""
    options.validate()
    ckpt_dir = Path(ckpt_dir)
    ckpt = CheckpointConfig.load(ckpt_dir)
    cfg = ckpt.model
    cfg.validate()
    if cfg.encoder is None:
        raise InputError(f"{ckpt_dir} holds a decoder ({cfg.architecture}), not an encoder")
    spec = cfg.encoder
    dtype = DTYPES[ckpt.dtype if options.dtype == "auto" else options.dtype]
    b = GraphBuilder(dtype)
    w = CheckpointWeights(ckpt_dir, cfg, b, ckpt.quantization)

    input_ids = _input(io.INPUT_IDS)
    attention_mask = _input(io.ATTENTION_MASK)
    with b.scope("embed"):
        hidden = _embeddings(b, w, input_ids, spec)  # [batch, seq, hidden]
    with b.scope("masks"):
        keep = b.cast(attention_mask, dtype)  # [batch, seq]: 1 real, 0 padding
        hidden_value = b.const(float(ml_dtypes.finfo(dtype.numpy()).min))
        # (1 - keep) * min: 0 where visible, the dtype's lowest value on padding keys, as transformers does
        bias = b.op("Mul", b.op("Sub", b.const(1.0), keep), hidden_value)
        bias = b.op("Unsqueeze", bias, b.ints([1, 2]))  # [batch, 1, 1, seq]
        # spelled out per query row: Attention-24 (what fuse_attention makes of this) on onnxruntime wants
        # a mask of [.., q_seq, kv_seq] and does not broadcast a 1 there
        batch, seq = b.op("Shape", input_ids, start=0, end=1), b.op("Shape", input_ids, start=1, end=2)
        bias = b.op("Expand", bias, b.op("Concat", batch, b.ints([1]), seq, seq, axis=0),
                    name="padding_bias")  # [batch, 1, seq, seq]
    for i in range(cfg.num_layers):
        with b.scope(f"layers.{i}"):
            hidden = _layer(b, w, hidden, bias, cfg, i)
    with b.scope("pool"):
        pooled = _pool(b, hidden if dtype == FLOAT else b.cast(hidden, FLOAT), attention_mask, spec)
        if spec.pooling.normalize:
            norm = b.op("ReduceL2", pooled, b.ints([-1]), keepdims=1)
            pooled = b.op("Div", pooled, b.op("Max", norm, b.const(NORMALIZE_EPS, FLOAT)))
    pooled.name = io.EMBEDDINGS
    pooled.dtype, pooled.shape = FLOAT, ir.Shape([graph_io.BATCH, cfg.hidden_size])

    graph = ir.Graph(inputs=[input_ids, attention_mask], outputs=[pooled], nodes=b.tape.nodes,
                     initializers=b.initializers, opset_imports={"": OPSET}, name=f"{cfg.architecture}_encoder")
    model = ir.Model(graph, ir_version=IR_VERSION, producer_name="trtbuild", producer_version=__version__)
    model.metadata_props.update({graph_io.META_ARCHITECTURE: cfg.architecture, META_GRAPH: "encoder",
                                 graph_io.META_DTYPE: dtype.name.lower()})
    ShapeInferencePass()(model)
    return model


def _input(name: str) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(INT64), shape=ir.Shape([graph_io.BATCH, graph_io.SEQ]))


def _embeddings(b: GraphBuilder, w: CheckpointWeights, input_ids: ir.Value, spec: EncoderSpec) -> ir.Value:
    """word[ids] + position[t + offset] + token_type[0], then LayerNorm. One text per row: token type 0."""
    words = b.op("Gather", w["embed.weight"], input_ids, axis=0)  # [batch, seq, hidden]
    # positions from a cumulative sum of ones: keeps the symbolic [batch, seq] shape through inference
    ones = b.op("ConstantOfShape", b.op("Shape", input_ids), value=ir.tensor([1], dtype=INT64))
    positions = b.op("Add", b.op("CumSum", ones, b.const(1, INT64)), b.const(spec.position_offset - 1, INT64))
    hidden = b.op("Add", words, b.op("Gather", w["embed.position.weight"], positions, axis=0))
    token_type = b.op("Gather", w["embed.token_type.weight"], b.ints([0]), axis=0)  # [1, hidden]
    hidden = b.op("Add", hidden, token_type)
    return _layer_norm(b, hidden, w, "embed.norm", spec.layer_norm_eps)


def _layer_norm(b: GraphBuilder, x: ir.Value, w: CheckpointWeights, prefix: str, eps: float) -> ir.Value:
    # stash_type 1: mean and variance in float32 for 16-bit activations too
    return b.op("LayerNormalization", x, w[prefix + ".weight"], w[prefix + ".bias"], axis=-1, epsilon=eps,
                stash_type=1, name="LayerNorm")


def _layer(b: GraphBuilder, w: CheckpointWeights, x: ir.Value, bias: ir.Value, cfg: ModelConfig, i: int) -> ir.Value:
    p, spec = f"layers.{i}.", cfg.encoder
    heads, head_dim, hidden = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    with b.scope("attn"):
        qkv = linear(b, w, x, p + "attn.qkv", w[p + "attn.qkv.bias"])  # [batch, seq, 3 hidden]
        q, k, v = b.op_multi("Split", qkv, b.ints([cfg.q_dim] * 3), axis=-1, num_outputs=3)
        q, k, v = (b.op("Transpose", b.op("Reshape", t, b.ints([0, 0, heads, head_dim])), perm=[0, 2, 1, 3])
                   for t in (q, k, v))  # [batch, heads, seq, head_dim]
        scores = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 1, 3, 2]))  # [batch, heads, seq, seq]
        scores = b.op("Add", b.op("Mul", scores, b.const(head_dim ** -0.5)), bias)
        probs = b.op("Softmax", scores if b.dtype == FLOAT else b.cast(scores, FLOAT), axis=-1)
        out = b.op("MatMul", probs if b.dtype == FLOAT else b.cast(probs, b.dtype), v)  # [batch, heads, seq, hd]
        out = b.op("Reshape", b.op("Transpose", out, perm=[0, 2, 1, 3]), b.ints([0, 0, hidden]))
        out = linear(b, w, out, p + "attn.o", w[p + "attn.o.bias"])
    x = _layer_norm(b, b.op("Add", x, out, name="attn_residual"), w, p + "attn_norm", spec.layer_norm_eps)
    with b.scope("mlp"):
        h = linear(b, w, x, p + "mlp.up", w[p + "mlp.up.bias"])  # [batch, seq, inter]
        h = _ACTIVATIONS[spec.activation](b, h)
        h = linear(b, w, h, p + "mlp.down", w[p + "mlp.down.bias"])
    return _layer_norm(b, b.op("Add", x, h, name="mlp_residual"), w, p + "mlp_norm", spec.layer_norm_eps)


_ACTIVATIONS = {
    "gelu": lambda b, x: b.op("Gelu", x),  # erf form, BERT's "gelu"
    "gelu_tanh": lambda b, x: b.op("Gelu", x, approximate="tanh"),
    "relu": lambda b, x: b.op("Relu", x),
}


def _pool(b: GraphBuilder, x: ir.Value, attention_mask: ir.Value, spec: EncoderSpec) -> ir.Value:
    """x [batch, seq, hidden] float32 -> [batch, hidden], as sentence-transformers' Pooling computes it."""
    mode = spec.pooling.mode
    if mode == "cls":
        return b.op("Gather", x, b.const(0, INT64), axis=1)
    keep = b.op("Unsqueeze", b.cast(attention_mask, FLOAT), b.ints([-1]))  # [batch, seq, 1]
    if mode == "max":
        filled = b.op("Where", b.cast(keep, ir.DataType.BOOL), x, b.const(MAX_POOL_FILL, FLOAT))
        return b.op("ReduceMax", filled, b.ints([1]), keepdims=0)
    count = b.op("ReduceSum", keep, b.ints([1]), keepdims=0)  # [batch, 1]
    if mode == "lasttoken":  # the last real token of a right-padded row
        last = b.op("Sub", b.cast(count, INT64), b.const(1, INT64))  # [batch, 1]
        index = b.op("Expand", b.op("Unsqueeze", last, b.ints([1])), b.op("Shape", x))  # [batch, seq, hidden]
        index = b.op("Slice", index, b.ints([0]), b.ints([1]), b.ints([1]))  # [batch, 1, hidden]
        return b.op("Squeeze", b.op("GatherElements", x, index, axis=1), b.ints([1]))
    total = b.op("ReduceSum", b.op("Mul", x, keep), b.ints([1]), keepdims=0)  # [batch, hidden]
    count = b.op("Max", count, b.const(1e-9, FLOAT))  # sentence-transformers' clamp(min=1e-9)
    return b.op("Div", total, count if mode == "mean" else b.op("Sqrt", count))
