"""What an MoE checkpoint's quantization can build for, refused before any work (one line, exit 2)."""

from __future__ import annotations

from collections.abc import Sequence

from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.quantization import Quantization
from engine_builder.util.errors import UnsupportedError


def check_moe_build(model: ModelConfig, quantization: Quantization, targets: Sequence[str]) -> None:
    """int4 expert stacks (DequantizeLinear blocked -> Reshape -> Gather) crash the TensorRT-RTX 1.7.1
    builder (measured: the build process dies with SIGSEGV); int8 stacks, per channel or blocked, build."""
    experts = [p for p in quantization.quantized if ".mlp.experts." in p]
    if model.block.mlp.kind == "moe" and experts and quantization.weight_bits == 4 and "tensorrt" in targets:
        raise UnsupportedError(
            "int4 MoE experts cannot build for --target tensorrt (TensorRT-RTX 1.7 crashes on them); convert "
            "with --quant int8_wo, or with --exclude 'layers.*.mlp.experts.*', or build --target onnxruntime")
