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
