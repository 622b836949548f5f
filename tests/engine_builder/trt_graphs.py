"""Small ONNX graphs for real TensorRT(-RTX) builds in tests.

The decoder layer uses the portable opset-24 ops the network emits for TensorRT
(RMSNormalization-23, RotaryEmbedding-23, TensorScatter-24, Attention-24) and keeps every
weight in a safetensors file beside the model, referenced as ONNX external data by byte
offset: the same layout an engine dir has (DESIGN §4).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from safetensors.numpy import save_file

OPSET = 24
IR_VERSION = 10  # <= 13 so onnxruntime 1.31 loads the same file (DESIGN §4)
WEIGHTS_FILE = "rank0.safetensors"


@dataclass(frozen=True)
class LayerDims:
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32  # TRT's fused attention wants 32..256
    ffn: int = 256
    max_seq: int = 64  # static KV cache length
    rope_theta: float = 10000.0


def safetensors_offsets(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (absolute byte offset, length) of each tensor's data inside a safetensors file."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    base = 8 + header_len
    return {
        name: (base + meta["data_offsets"][0], meta["data_offsets"][1] - meta["data_offsets"][0])
        for name, meta in header.items()
        if name != "__metadata__"
    }


def external_initializers(model_dir: Path, tensors: dict[str, np.ndarray]) -> list[TensorProto]:
    """Write `tensors` to model_dir/rank0.safetensors and return initializers pointing into it."""
    path = model_dir / WEIGHTS_FILE
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    inits = []
    for name, (offset, length) in safetensors_offsets(path).items():
        array = tensors[name]
        t = TensorProto(name=name, dims=list(array.shape),
                        data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)), ("length", str(length))):
            t.external_data.add(key=key, value=value)
        inits.append(t)
    return inits


def save_model(graph: onnx.GraphProto, path: Path, extra_opsets: dict[str, int] | None = None) -> Path:
    opsets = [helper.make_opsetid("", OPSET)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)
    # save via SerializeToString: onnx.save would try to re-resolve the external data
    path.write_bytes(model.SerializeToString())
    return path


def _rope_caches(d: LayerDims) -> tuple[np.ndarray, np.ndarray]:
    inv_freq = 1.0 / d.rope_theta ** (np.arange(0, d.head_dim, 2, dtype=np.float64) / d.head_dim)
    angles = np.outer(np.arange(d.max_seq, dtype=np.float64), inv_freq)  # [max_seq, head_dim/2]
    return np.cos(angles), np.sin(angles)


def decoder_layer_model(model_dir: Path, dims: LayerDims = LayerDims(), dtype: str = "float16",
                        bool_mask: bool = False, layers: int = 1) -> Path:
    """`layers` Llama-style decoder layers over static BHSD KV caches; returns model_dir/model.onnx.

    Inputs: hidden [batch, seq, hidden], position_ids [batch, seq], per layer i
    past_key.i/past_value.i [batch, kv_heads, max_seq, head_dim], write_indices [batch] (cache
    slot of the first new token), nonpad_kv_seqlen [batch] (valid cache length after the
    update) -- or, with bool_mask, attn_mask [batch, 1, seq, max_seq] bool instead of
    is_causal + nonpad_kv_seqlen. Outputs: out [batch, seq, hidden], present_key.i/present_value.i.
    """
    d = dims
    model_dir.mkdir(parents=True, exist_ok=True)
    np_dt = np.dtype(dtype)
    et = helper.np_dtype_to_tensor_dtype(np_dt)
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np_dt)

    cos, sin = _rope_caches(d)
    q_dim, kv_dim = d.heads * d.head_dim, d.kv_heads * d.head_dim
    weights = {"rope.cos": cos.astype(np_dt), "rope.sin": sin.astype(np_dt)}
    for i in range(layers):
        weights |= {
            f"{i}.input_norm": np.ones(d.hidden, np_dt), f"{i}.post_norm": np.ones(d.hidden, np_dt),
            f"{i}.q": w(d.hidden, q_dim), f"{i}.k": w(d.hidden, kv_dim), f"{i}.v": w(d.hidden, kv_dim),
            f"{i}.o": w(q_dim, d.hidden), f"{i}.gate": w(d.hidden, d.ffn), f"{i}.up": w(d.hidden, d.ffn),
            f"{i}.down": w(d.ffn, d.hidden),
        }
    inits = external_initializers(model_dir, weights)
    inits += [helper.make_tensor(f"shape.{n}", TensorProto.INT64, [4], [0, 0, h, d.head_dim])
              for n, h in (("q", d.heads), ("kv", d.kv_heads))]
    inits.append(helper.make_tensor("shape.out", TensorProto.INT64, [3], [0, 0, q_dim]))
    cache = ["batch", d.kv_heads, d.max_seq, d.head_dim]
    vi = helper.make_tensor_value_info
    inputs = [vi("hidden", et, ["batch", "seq", d.hidden]), vi("position_ids", TensorProto.INT64, ["batch", "seq"]),
              vi("write_indices", TensorProto.INT64, ["batch"]),
              vi("attn_mask", TensorProto.BOOL, ["batch", 1, "seq", d.max_seq]) if bool_mask else
              vi("nonpad_kv_seqlen", TensorProto.INT64, ["batch"])]
    outputs = []
    nodes: list[onnx.NodeProto] = []
    x = "hidden"
    for i in range(layers):
        inputs += [vi(f"past_key.{i}", et, cache), vi(f"past_value.{i}", et, cache)]
        outputs += [vi(f"present_key.{i}", et, cache), vi(f"present_value.{i}", et, cache)]
        nodes += _layer_nodes(i, x, d, bool_mask)
        x = f"{i}.out"
    nodes.append(helper.make_node("Identity", [x], ["out"], name="output"))
    graph = helper.make_graph(nodes, "decoder", inputs, [vi("out", et, ["batch", "seq", d.hidden]), *outputs],
                              initializer=inits)
    return save_model(graph, model_dir / "model.onnx")


def _layer_nodes(i: int, x: str, d: LayerDims, bool_mask: bool) -> list[onnx.NodeProto]:
    shared = {x, "", "position_ids", "write_indices", "nonpad_kv_seqlen", "attn_mask", "rope.cos", "rope.sin",
              "shape.q", "shape.kv", "shape.out", f"past_key.{i}", f"past_value.{i}", f"present_key.{i}",
              f"present_value.{i}"}

    def n(op: str, ins: list[str], out: str, **attrs: object) -> onnx.NodeProto:
        # layer-local tensors and weights are "<layer>.<name>"; each node is named after its output
        # tensor's local name ("0.attention"), so parser errors and engine metadata say which layer
        local = [a if a in shared else f"{i}.{a}" for a in ins]
        return helper.make_node(op, local, [out if out in shared else f"{i}.{out}"],
                                name=f"{i}.{out.split('.')[0]}", **attrs)

    nodes = [n("RMSNormalization", [x, "input_norm"], "x", axis=-1, epsilon=1e-5)]
    for t, heads in (("q", "q"), ("k", "kv"), ("v", "kv")):
        nodes += [n("MatMul", ["x", t], f"{t}_proj"),
                  n("Reshape", [f"{t}_proj", f"shape.{heads}"], f"{t}_heads"),
                  n("Transpose", [f"{t}_heads"], f"{t}_bhsd", perm=[0, 2, 1, 3])]  # [batch, heads, seq, head_dim]
    mask = (["attn_mask"], {}) if bool_mask else (["", "", "", "nonpad_kv_seqlen"], {"is_causal": 1})
    nodes += [
        n("RotaryEmbedding", ["q_bhsd", "rope.cos", "rope.sin", "position_ids"], "q_rope"),
        n("RotaryEmbedding", ["k_bhsd", "rope.cos", "rope.sin", "position_ids"], "k_rope"),
        # in-place cache update: TRT maps this to a KV_CACHE_UPDATE layer
        n("TensorScatter", [f"past_key.{i}", "k_rope", "write_indices"], f"present_key.{i}", axis=-2, mode="linear"),
        n("TensorScatter", [f"past_value.{i}", "v_bhsd", "write_indices"], f"present_value.{i}", axis=-2,
          mode="linear"),
        n("Attention", ["q_rope", f"present_key.{i}", f"present_value.{i}", *mask[0]], "attention",
          q_num_heads=d.heads, kv_num_heads=d.kv_heads, **mask[1]),
        n("Transpose", ["attention"], "attn_bshd", perm=[0, 2, 1, 3]),
        n("Reshape", ["attn_bshd", "shape.out"], "attn_merged"),
        n("MatMul", ["attn_merged", "o"], "o_proj"),
        n("Add", [x, "o_proj"], "residual1"),
        n("RMSNormalization", ["residual1", "post_norm"], "y", axis=-1, epsilon=1e-5),
        n("MatMul", ["y", "gate"], "gate_proj"),
        n("MatMul", ["y", "up"], "up_proj"),
        n("Sigmoid", ["gate_proj"], "sigmoid"),
        n("Mul", ["gate_proj", "sigmoid"], "silu"),
        n("Mul", ["silu", "up_proj"], "gate_up"),
        n("MatMul", ["gate_up", "down"], "down_proj"),
        n("Add", ["residual1", "down_proj"], "out"),
    ]
    return nodes


def decoder_profiles(dims: LayerDims = LayerDims(), layers: int = 1, max_batch: int = 2, prefill_opt: int = 16,
                     bool_mask: bool = False) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """Two optimization profiles: decode (seq pinned to 1) and prefill (seq 2..max_seq)."""
    def profile(seq: tuple[int, int, int]) -> dict[str, tuple[tuple[int, ...], ...]]:
        batch = (1, 1, max_batch)
        cache = tuple((b, dims.kv_heads, dims.max_seq, dims.head_dim) for b in batch)
        shapes = {
            "hidden": tuple((b, s, dims.hidden) for b, s in zip(batch, seq)),
            "position_ids": tuple((b, s) for b, s in zip(batch, seq)),
            "write_indices": tuple((b,) for b in batch),
        }
        if bool_mask:
            shapes["attn_mask"] = tuple((b, 1, s, dims.max_seq) for b, s in zip(batch, seq))
        else:
            shapes["nonpad_kv_seqlen"] = tuple((b,) for b in batch)
        for i in range(layers):
            shapes[f"past_key.{i}"] = shapes[f"past_value.{i}"] = cache
        return shapes
    return [profile((1, 1, 1)), profile((2, prefill_opt, dims.max_seq))]


def single_op_model(model_dir: Path, op_type: str, domain: str = "", **attrs: object) -> Path:
    """x [2, 8] fp16 -> op -> y: the smallest graph that exercises one op's importer."""
    model_dir.mkdir(parents=True, exist_ok=True)
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node(op_type, ["r"], ["y"], name=f"the_{op_type.lower()}", domain=domain, **attrs)],
        "single_op", [vi("x", TensorProto.FLOAT16, [2, 8])], [vi("y", TensorProto.FLOAT16, None)],
    )
    return save_model(graph, model_dir / "model.onnx", {domain: 1} if domain else None)
