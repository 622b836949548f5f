"""--dtype auto: the TensorRT engine in float16 / bfloat16, the onnxruntime twin in the fastest faithful dtype
of the CPU that builds it (engine_builder/build/dtype_choice.py)."""

from __future__ import annotations

import pytest

from engine_builder.build.dtype_choice import choose_dtypes, cpu_has_fast_fp16
from engine_builder.formats.build_config import BuildConfig
from engine_builder.formats.quantization import Quantization

NONE = Quantization()


@pytest.mark.parametrize("ckpt_dtype, fast, engine, twin", [
    ("float32", False, "float16", "float32"),
    ("float16", False, "float16", "float32"),
    ("bfloat16", False, "bfloat16", "float32"),
    ("float32", True, "float16", "float16"),
    ("bfloat16", True, "bfloat16", "float32"),  # onnxruntime's CPU bfloat16 kernels are few: float32
])
def test_auto_picks_per_target(ckpt_dtype, fast, engine, twin):
    choice = choose_dtypes(BuildConfig(), ckpt_dtype, NONE, fast_fp16=fast)
    assert (choice.engine, choice.twin) == (engine, twin)
    assert ("no native float16" in choice.reason) == (not fast and twin == "float32")


def test_explicit_dtypes_and_quantization_rules_win():
    assert choose_dtypes(BuildConfig(dtype="float32"), "float32", NONE, fast_fp16=False).twin == "float32"
    assert choose_dtypes(BuildConfig(dtype="float16"), "float32", NONE, fast_fp16=False).twin == "float16"
    assert choose_dtypes(BuildConfig(twin_dtype="float16"), "float32", NONE, fast_fp16=False).twin == "float16"
    fp8 = choose_dtypes(BuildConfig(), "float32", Quantization(scheme="fp8", activation="fp8"), fast_fp16=False)
    assert fp8.twin == "float16" and "fp8" in fp8.reason
    kv = choose_dtypes(BuildConfig(), "float32", Quantization(kv_cache="int8"), fast_fp16=True)
    assert kv.twin == "float32" and "KV cache" in kv.reason


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f f16c\n")
    assert cpu_has_fast_fp16(info) is False  # f16c only converts; no float16 arithmetic
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_fp16 amx_tile\n")
    assert cpu_has_fast_fp16(info) is True
    info.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm aes fphp asimdhp\n")
    assert cpu_has_fast_fp16(info) is True
