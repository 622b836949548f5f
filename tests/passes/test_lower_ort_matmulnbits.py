"""lower_ort_matmulnbits(_exact): every quantized linear of a tiny model becomes one MatMulNBits.

Checkpoints are quantized per FORMAT.md by tests/engine_builder/quantized_ckpt.py: int8 per
channel and per group, symmetric int4 (signed nibbles, rewritten XOR 0x88) and asymmetric uint4 with zero
points (awq / gptq ingest, referenced in place).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from ort_check import decoder_feeds
from ort_lowering_check import STEPS, assert_matches_unfused, session

from converters.convert import convert
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.network import NetworkOptions, save_graph, write_onnx
from passes.base import get_pass
from passes.graph_stats import op_counts
from passes.lower_ort_matmulnbits import ACCURACY_META

sys.path.insert(0, str(Path(__file__).parents[1] / "engine_builder"))
from quantized_ckpt import quantize_checkpoint  # noqa: E402

NBITS = "com.microsoft.MatMulNBits"
SCHEMES = [("int8_wo", None), ("int8_wo", 16), ("int4_wo", 32), ("awq", 16)]


@pytest.fixture(scope="module")
def float_ckpt(tiny_model_dir, module_tmp_factory):
    """ckpt(dtype) -> the tiny llama converted to that dtype, once."""
    made = {}

    def get(dtype: str) -> Path:
        if dtype not in made:
            made[dtype] = module_tmp_factory.mktemp(f"llama-{dtype}") / "ckpt"
            convert(tiny_model_dir("llama"), made[dtype], dtype=dtype)
        return made[dtype]

    return get


def unfused(float_ckpt: Path, tmp: Path, scheme: str, group: int | None) -> tuple[int, Path, ir.Model]:
    """(number of quantized linears, the unfused quantized model.onnx, that graph loaded)."""
    q = quantize_checkpoint(float_ckpt, tmp / "q", scheme, group)
    path = write_onnx(q, tmp / "engine", NetworkOptions(max_seq_len=32, dtype="float32"))
    return len(CheckpointConfig.load(q).quantization.quantized), path, ir.load(path)


@pytest.mark.parametrize("ckpt_dtype", ["float32", "float16"])  # float16: scales reach DQ through a Cast
@pytest.mark.parametrize(("scheme", "group"), SCHEMES)
def test_dequantized_matmuls_become_matmulnbits(float_ckpt, tmp_path, scheme, group, ckpt_dtype):
    n, path, model = unfused(float_ckpt(ckpt_dtype), tmp_path, scheme, group)
    before = op_counts(model)
    assert before["DequantizeLinear"] == n == 9  # 2 layers x (qkv, o, gate_up, down) + lm_head
    assert get_pass("lower_ort_matmulnbits_exact").apply(model) == n
    after = op_counts(model)
    # int8 at float activations: a pair of 4-bit MatMulNBits and their Add per linear (the 8-bit kernel
    # dequantizes the whole matrix every call at level 0)
    pairs = n if scheme == "int8_wo" else 0
    assert after[NBITS] == n + pairs and after["DequantizeLinear"] == 0
    assert after.get("Add", 0) - before.get("Add", 0) == pairs
    assert before["MatMul"] - after["MatMul"] == before["Transpose"] - after["Transpose"] == n
    assert model.metadata_props[ACCURACY_META] == "0"
    lowered = path.with_name("exact.onnx")
    save_graph(model, lowered)
    for level in ("disable_all", "basic"):
        assert_matches_unfused(path, lowered, level)  # logits and caches within 1e-4, batched steps

    # bytes that change (sign moved, scales recast or repeated) went to exact.onnx.data; the
    # asymmetric layout is MatMulNBits' own, so awq in fp32 references rank0.safetensors only
    data = lowered.with_name("exact.onnx.data")
    assert data.exists() == (scheme != "awq" or ckpt_dtype != "float32")
    assert lowered.stat().st_size < 100_000
    assert get_pass("lower_ort_matmulnbits_exact").apply(model) == 0  # idempotent
    assert get_pass("lower_ort_matmulnbits_exact").why_not(model)


@pytest.mark.parametrize(("scheme", "group"), SCHEMES)
def test_shipped_accuracy_level_quantizes_activations_within_bound(float_ckpt, tmp_path, scheme, group):
    """Level 4 quantizes each block of 32 activations to int8 (a rounding step of amax/254 per value),
    so it is not exact by design: the logits stay within 3% of their own range of the unfused graph's
    and the caches within 2% of theirs (measured here: at most 1.2% for both, through two layers
    and the head). What this costs a real model is measured on SmolLM2 in test_quantized_smollm2."""
    n, path, model = unfused(float_ckpt("float32"), tmp_path, scheme, group)
    assert get_pass("lower_ort_matmulnbits").apply(model) == n
    assert {node.attributes.get_int("accuracy_level") for node in model.graph if node.op_type == "MatMulNBits"} == {4}
    assert model.metadata_props[ACCURACY_META] == "4"
    lowered = path.with_name("level4.onnx")
    save_graph(model, lowered)
    reference, got = session(path), session(lowered, "basic")
    names = [o.name for o in reference.get_outputs()]
    for seq, past in STEPS:
        feeds = decoder_feeds(reference, batch=len(past), seq=seq, past=past)
        for name, want, have in zip(names, reference.run(None, feeds), got.run(None, feeds)):
            bound = 0.03 if name == "logits" else 0.02
            err = float(np.abs(have - want).max()) / float(np.abs(want).max())
            assert err <= bound, f"{name}, seq {seq}, past {past}: {err:.2%} of its range"


def test_unquantized_graph_is_left_alone(float_ckpt, tmp_path):
    path = write_onnx(float_ckpt("float32"), tmp_path / "engine", NetworkOptions(max_seq_len=32))
    model = ir.load(path)
    assert get_pass("lower_ort_matmulnbits").apply(model) == 0
    assert ACCURACY_META not in model.metadata_props
    assert "no quantized linears" in get_pass("lower_ort_matmulnbits").why_not(model)
