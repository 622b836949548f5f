"""How onnxruntime optimizes a twin's graph: the level per activation dtype and the config entries that
change the optimized graph. One place, read by the runner's sessions (runner/ort_backend.py) and by the
build's prepacked twin (build/ort_prepack.py), which bakes the optimized graph in: the two cannot drift.

ENABLE_ALL for float32; BASIC for float16/bfloat16, because DESIGN §4 records EXTENDED corrupting some
fp16 graphs (measurements: runner/ort_backend.py's docstring).
"""

from __future__ import annotations

import onnxruntime as ort

OPTIMIZATION_LEVELS = {
    "float32": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    "float16": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "bfloat16": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
}
# DQ -> MatMul fuses into MatMulNBits, which by default quantizes activations to int8 (~1% error,
# DESIGN §4); accuracy level 0 keeps them in the graph's float type
GRAPH_CONFIG = {"session.qdq_matmulnbits_accuracy_level": "0"}


def optimization_level(dtype: str) -> ort.GraphOptimizationLevel:
    return OPTIMIZATION_LEVELS.get(dtype, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
