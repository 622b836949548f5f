"""`trtbuild build --twin-accuracy`: which MatMulNBits lowering the onnxruntime twin's passes use.

The choice only swaps one pass name in passes.onnxruntime, so the manifest's pass list records it and a
recipe can say the same with its own list. The TensorRT graph is untouched (it keeps DequantizeLinear ->
MatMul, which TensorRT fuses whatever onnxruntime does). See passes/lower_ort_matmulnbits.py for the levels.
"""

from __future__ import annotations

from engine_builder.util.errors import ConfigError

# accuracy -> the lowering pass: auto int8 activations for float32 twins, float ones where a linear has block
# offsets (exact); exact float activations everywhere; draft int8 activations for block offsets too (not exact:
# for a speculative draft, whose every token the target verifies)
TWIN_ACCURACY = {"auto": "lower_ort_matmulnbits", "exact": "lower_ort_matmulnbits_exact",
                 "draft": "lower_ort_matmulnbits_draft"}


def with_twin_accuracy(passes: tuple[str, ...], accuracy: str) -> tuple[str, ...]:
    """PASSES (an onnxruntime pass list) with its MatMulNBits lowering replaced by ACCURACY's."""
    if accuracy not in TWIN_ACCURACY:
        raise ConfigError(f"--twin-accuracy {accuracy!r} is not one of {', '.join(TWIN_ACCURACY)}")
    lowerings = set(TWIN_ACCURACY.values())
    if not lowerings & set(passes):
        raise ConfigError(f"--twin-accuracy {accuracy} swaps the MatMulNBits lowering, but passes.onnxruntime has "
                          f"none ({', '.join(passes) or 'empty'}); add {TWIN_ACCURACY[accuracy]} to it instead")
    return tuple(TWIN_ACCURACY[accuracy] if p in lowerings else p for p in passes)
