"""`--dtype auto` (the default): which dtype the TensorRT engine and the onnxruntime twin each get, and why.

The two targets run on different hardware. A GPU's tensor cores make float16 / bfloat16 the fast
dtype for the engine; the twin runs on the CPU that builds (CI) or serves without a GPU, where
onnxruntime's float16 kernels are fast only with native half-precision arithmetic (x86 AVX512-FP16,
ARM's FP16 SIMD). Without it onnxruntime converts to and from float32 around most ops, and a float16
twin of SmolLM2 decodes 2-4x slower than a float32 one (issue 16), while float32 is also the exact one.
"""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import dataclass
from pathlib import Path

from engine_builder.formats.build_config import BuildConfig
from engine_builder.formats.quantization import Quantization

# /proc/cpuinfo flags of CPUs with native float16 arithmetic that onnxruntime's MLAS kernels use
FAST_FP16_FLAGS = ("avx512_fp16", "asimdhp", "fphp")


@dataclass(frozen=True)
class DtypeChoice:
    engine: str  # the TensorRT engine's compute dtype
    twin: str  # the onnxruntime twin's
    reason: str  # one sentence: inspect prints it


def cpu_has_fast_fp16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Does this CPU do float16 arithmetic natively (so a float16 twin is as fast as a float32 one)?"""
    if platform.system() == "Darwin":
        return platform.machine() == "arm64"  # every Apple silicon core has FP16 SIMD
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    flags = {word for line in text.splitlines() if line.lower().startswith(("flags", "features"))
             for word in line.partition(":")[2].split()}
    return any(f in flags for f in FAST_FP16_FLAGS)


def choose_dtypes(config: BuildConfig, checkpoint_dtype: str, quantization: Quantization,
                  fast_fp16: bool | None = None) -> DtypeChoice:
    """The dtypes CONFIG asks for, "auto" resolved for a checkpoint of CHECKPOINT_DTYPE and QUANTIZATION."""
    if config.dtype != "auto":
        twin = config.twin_dtype or config.dtype
        why = "--dtype given" if twin == config.dtype else "--dtype and twin_dtype given"
        return DtypeChoice(config.dtype, twin, f"{why}: engine {config.dtype}, twin {twin}")
    engine = "bfloat16" if checkpoint_dtype == "bfloat16" else "float16"
    engine_why = f"engine {engine} (GPU tensor cores{', the checkpoint is bfloat16' if engine == 'bfloat16' else ''})"
    if config.twin_dtype is not None:
        return DtypeChoice(engine, config.twin_dtype, f"--dtype auto: {engine_why}; twin {config.twin_dtype} as set")
    fp8 = quantization.scheme == "fp8" or quantization.activation == "fp8"
    if fp8:  # onnxruntime runs FP8 Q/DQ only in float16 (target_check.py)
        return DtypeChoice(engine, "float16", f"--dtype auto: {engine_why}; twin float16, the only dtype "
                                              "onnxruntime runs fp8 Q/DQ in")
    if quantization.kv_cache != "none":  # onnxruntime's int8-cache attention takes float32
        return DtypeChoice(engine, "float32", f"--dtype auto: {engine_why}; twin float32, which an "
                                              f"{quantization.kv_cache} KV cache needs")
    fast = cpu_has_fast_fp16() if fast_fp16 is None else fast_fp16
    if fast:
        return DtypeChoice(engine, engine if engine == "float16" else "float32",
                           f"--dtype auto: {engine_why}; twin {'float16' if engine == 'float16' else 'float32'}: "
                           f"this CPU ({platform.machine()}) has native float16 arithmetic")
    return DtypeChoice(engine, "float32", f"--dtype auto: {engine_why}; twin float32: this CPU "
                                          f"({platform.machine()}) has no native float16 arithmetic, where "
                                          "onnxruntime's float16 decodes 2-4x slower than float32 (and less exactly)")


def resolved(config: BuildConfig, choice: DtypeChoice) -> BuildConfig:
    """CONFIG with both dtypes concrete, as the manifest records it."""
    return dataclasses.replace(config, dtype=choice.engine, twin_dtype=choice.twin)
