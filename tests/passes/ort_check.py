"""Helpers for pass tests: build a small model, run it in onnxruntime before and after a pass."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort


def model_from_helper(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
                      outputs: list[onnx.ValueInfoProto], initializers: list[onnx.TensorProto] = ()) -> ir.Model:
    graph = onnx.helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 24)])
    proto.ir_version = 10
    return ir.serde.deserialize_model(proto)


def run(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # test our passes, not ORT's
    proto = ir.serde.serialize_model(model)
    session = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_same_outputs(before: list[np.ndarray], after: list[np.ndarray], atol: float = 1e-6) -> None:
    assert len(before) == len(after)
    for b, a in zip(before, after):
        assert b.shape == a.shape and b.dtype == a.dtype
        np.testing.assert_allclose(a, b, atol=atol, rtol=0)


def decoder_feeds(session: ort.InferenceSession, batch: int, seq: int, past: list[int],
                  seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for one decoder step: random tokens at random-but-valid cache offsets, with the
    cache filled with noise below each sequence's length and zeros above (as graph_io asks)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    vocab = None
    for inp in session.get_inputs():
        if inp.name.startswith(("past_key.", "past_value.")):
            if "int8" in inp.type:  # `--kv-cache int8`: any codes will do
                cache = rng.integers(-128, 128, [batch, *inp.shape[1:]]).astype(np.int8)
            else:
                dtype = np.float16 if "float16" in inp.type else np.float32
                cache = rng.standard_normal([batch, *inp.shape[1:]]).astype(dtype)
            for b, n in enumerate(past):
                cache[b, :, n:] = 0
            feeds[inp.name] = cache
    vocab = 256  # tiny models have >= 256 tokens
    lengths = np.asarray(past, np.int64)
    feeds["input_ids"] = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
    feeds["position_ids"] = lengths[:, None] + np.arange(seq, dtype=np.int64)[None, :]
    feeds["past_lengths"] = lengths
    return feeds


def session_for(path, level: str = "disable_all") -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = {"disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                     "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}[level]
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
