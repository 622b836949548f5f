"""Refuse what a target cannot take: quantizations before any work, ops left after the passes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine_builder.formats.quantization import Quantization
from engine_builder.util.errors import UnsupportedError

# op -> the pass that emits it, for ops only one backend implements
ORT_ONLY = {"GroupQueryAttention": "lower_ort_attention", "SkipSimplifiedLayerNormalization": "lower_ort_norms",
            "SimplifiedLayerNormalization": "lower_ort_norms", "MatMulNBits": "a quantized-linear lowering pass",
            "RotaryEmbedding": "lower_ort_attention"}
TRT_ONLY_PREFIX = "TRT_"

if TYPE_CHECKING:  # onnx_ir takes a second to import: the quantization checks run before it is needed
    import onnx_ir as ir


def check_target_ops(model: ir.Model, target: str) -> None:
    import onnx_ir as ir

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


# compute capabilities with FP8 tensor cores; TensorRT-RTX 1.7 refuses e4m3 for the others
# ("Cannot compile for target(s) sm86, because the model contains HW-specific datatypes: fp8_e4m3")
FP8_CAPABLE = ("sm89", "sm120", "sm121")


def check_quantized_build(quantization: Quantization, targets: Sequence[str], dtype: str,
                          compute_capabilities: Sequence[str]) -> None:
    """Refuse, before any work, a quantization this build cannot lower, naming what would work.

    The onnxruntime twin is always built, so its limits hold whatever the targets."""
    q = quantization
    fp8 = q.scheme == "fp8" or q.activation == "fp8"
    if q.kv_cache != "none" and "tensorrt" in targets:
        # measured: its KV_CACHE_UPDATE layer says "cache has type Int8 (FP8) but must have type Float,
        # Half, or BFloat16", and a copying ScatterND would cost more than the smaller cache saves
        raise UnsupportedError(
            f"an {q.kv_cache} KV cache cannot build for --target tensorrt: TensorRT-RTX updates only "
            f"float16/bfloat16/float32 caches in place; build with --target onnxruntime, or convert again with "
            f"--kv-cache none (the weights stay quantized)")
    if q.kv_cache != "none" and dtype != "float32":
        # onnxruntime's CPU GroupQueryAttention reads an int8 cache only with float32 q/k/v
        raise UnsupportedError(f"an {q.kv_cache} KV cache needs --dtype float32 (onnxruntime's int8-cache attention "
                               f"takes float32 activations); build with --dtype float32")
    if q.zero_point and "tensorrt" in targets:
        raise UnsupportedError(
            f"{q.scheme} int4 with zero points cannot build for --target tensorrt (TensorRT refuses int4 zero "
            f"points); build for --target onnxruntime, or convert the float model with --quant int4_awq, "
            f"which is symmetric")
    if fp8 and dtype != "float16":
        raise UnsupportedError(
            f"fp8 needs --dtype float16 (onnxruntime cannot run FP8 Q/DQ in {dtype}, and the onnxruntime twin "
            f"is always built); build with --dtype float16, or use int8_wo")
    old = [cc for cc in compute_capabilities if cc not in FP8_CAPABLE]
    if fp8 and "tensorrt" in targets and old:
        raise UnsupportedError(
            f"fp8 needs compute capability 8.9 or newer ({','.join(old)} lack FP8 tensor cores); build with "
            f"--cc {','.join(c for c in compute_capabilities if c in FP8_CAPABLE) or 'sm89,sm120'}, "
            f"or use int8_wo / int4_awq for older GPUs")
