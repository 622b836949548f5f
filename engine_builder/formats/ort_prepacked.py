"""The prepacked twin: model.onnx as onnxruntime optimized it, with its MatMul weights already packed.

onnxruntime packs every float32 MatMul weight (MLAS's GEMM layout) when it creates a session: for SmolLM2
that is ~0.25 s of CPU and 538 MB of fresh pages before the first token (issue 16's cold start). The build
saves the optimized graph once with those packed weights in external data
(session.save_external_prepacked_constant_initializers), and `run` loads that graph with optimizations off:
the packed weights are memory-mapped from the page cache instead of computed. Logits are bit-identical and
decode is as fast (the same kernels on the same packed layout); it costs disk (the data file holds the
weights and their packed copies, about 2x the float32 weights) and build time.

The packed layout belongs to the onnxruntime version and the CPU (its SIMD flags) that made it, recorded in
the graph's metadata (META_PREPACKED_FOR). A load on anything else uses model.onnx, which every engine dir
keeps. Both files are in the manifest's sha256 records (formats/manifest.py verified_files).
"""

from __future__ import annotations

import platform

PREPACKED_MODEL = "model.prepacked.onnx"
PREPACKED_DATA = PREPACKED_MODEL + ".data"
META_PREPACKED_FOR = "trtbuild.prepacked_for"  # cpu_signature() of the build that packed the weights

# the flags that choose MLAS kernels (and so a packed layout) on x86-64 and arm64
_SIMD_FLAGS = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
               "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
               "asimd", "asimddp", "asimdhp", "sve", "sve2", "i8mm", "bf16")


def cpu_signature() -> str | None:
    """onnxruntime's version, the machine and its SIMD flags; None where /proc/cpuinfo cannot tell them."""
    import onnxruntime

    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    if not flags:
        return None
    return f"onnxruntime {onnxruntime.__version__}; {platform.machine()}; " + \
        " ".join(f for f in _SIMD_FLAGS if f in flags)
