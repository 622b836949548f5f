"""After the passes: refuse a graph holding an op its target cannot take, naming who should lower it."""

from __future__ import annotations

import onnx_ir as ir

from engine_builder.errors import UnsupportedError

# op -> the pass that emits it, for ops only one backend implements
ORT_ONLY = {"GroupQueryAttention": "lower_ort_attention", "SkipSimplifiedLayerNormalization": "lower_ort_norms",
            "SimplifiedLayerNormalization": "lower_ort_norms", "MatMulNBits": "a quantized-linear lowering pass",
            "RotaryEmbedding": "lower_ort_attention"}
TRT_ONLY_PREFIX = "TRT_"


def check_target_ops(model: ir.Model, target: str) -> None:
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        op = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
        if target == "tensorrt" and node.domain == "com.microsoft":
            source = ORT_ONLY.get(node.op_type, "an onnxruntime lowering pass")
            raise UnsupportedError(
                f"node {node.name!r} is {op}, which TensorRT cannot parse; it comes from {source}: "
                f"remove that pass from passes.tensorrt")
        if target == "onnxruntime" and node.op_type.startswith(TRT_ONLY_PREFIX):
            raise UnsupportedError(
                f"node {node.name!r} is {op}, a TensorRT parser op onnxruntime does not have; "
                f"remove the TensorRT lowering pass from passes.onnxruntime")
