"""`convert model.gguf OUT --quant gguf`: the GGUF's own Q4_0/Q4_1/Q4_K blocks, kept as they are.

Against gguf's own dequantizer: the decoded blocks, and the whole checkpoint, dequantize to the
weights `convert` without --quant writes (which tests/converters/test_gguf_source.py holds to
gguf and transformers). Graph numerics and TensorRT: tests/engine_builder/test_gguf_blocks_build.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_process import assert_user_error, trtbuild
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file
from tiny_gguf import random_q4_k, tiny_gguf

from converters.convert import convert
from converters.sources.gguf_codes import decode
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.quant_packing import unpack_int4


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K], ids=lambda q: q.name)
def test_decoded_blocks_are_the_dequantized_weights(qtype):
    rng = np.random.default_rng(qtype.value)
    w = rng.standard_normal((48, 512)).astype(np.float32)
    w[3, 32:64] = np.linspace(0.5, 2.0, 32)  # an all-positive block: Q4_1's min is far from -8 d
    w[5, :32] = 0.25  # a constant block: Q4_1 stores d = 0
    blocks = random_q4_k(w.shape, rng, 1.0) if qtype == Q.Q4_K else quantize(w, qtype)
    codes, scale, offset = decode(blocks, qtype.name)
    assert codes.dtype == np.int8 and codes.min() >= -8 and codes.max() <= 7 and (scale > 0).all()
    assert scale.shape == offset.shape == (48, 512 // 32)
    if qtype == Q.Q4_0:  # no minimum: offsets only where a negative d was made positive
        assert ((offset == 0) | (offset == scale)).all() and offset.any()
    got = (codes.reshape(48, -1, 32) * scale[..., None] + offset[..., None]).reshape(w.shape)
    want = dequantize(blocks, qtype)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.fixture(scope="module")
def mixed(module_tmp_factory):
    """A Q4_1 tiny llama with a Q4_0 o_proj and a Q4_K down_proj in layer 0 and a Q8_0 ffn_up in layer 1,
    converted twice:
    with --quant gguf and without (dequantized float32)."""
    root = module_tmp_factory.mktemp("gguf-blocks")
    src = tiny_gguf(root / "tiny.gguf", {"blk.0.attn_output.weight": Q.Q4_0, "blk.1.ffn_up.weight": Q.Q8_0,
                                         "blk.0.ffn_down.weight": Q.Q4_K})
    convert(src, root / "blocks", quant="gguf")
    convert(src, root / "float", dtype="float32")
    return root


def test_quantization_block_lists_what_kept_its_blocks(mixed):
    q = CheckpointConfig.load(mixed / "blocks").quantization
    assert (q.scheme, q.weight_bits, q.group_size, q.zero_point) == ("gguf", 4, 32, False)
    # layer 1's gate_up fuses a Q4_1 gate with a Q8_0 up: the whole linear stays float
    assert q.excluded == ("layers.1.mlp.gate_up",)
    linears = {f"layers.{i}.{p}" for i in range(2) for p in ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down")}
    assert set(q.quantized) == linears - set(q.excluded) | {"lm_head"}
    assert CheckpointConfig.load(mixed / "blocks").dtype == "float32"  # the default with a --quant


def test_checkpoint_dequantizes_to_the_float_conversion(mixed):
    q = CheckpointConfig.load(mixed / "blocks").quantization
    blocks, floats = load_file(mixed / "blocks" / "rank0.safetensors"), load_file(mixed / "float" / "rank0.safetensors")
    for prefix in q.quantized:
        want = floats[f"{prefix}.weight"]  # [out, in]: fused rows, q/k un-permuted
        codes = unpack_int4(blocks[f"{prefix}.weight"], want.shape[1])  # [out, in] -8..7
        scale, offset = blocks[f"{prefix}.weight_scale"], blocks[f"{prefix}.weight_offset"]  # [out, in/32]
        got = (codes.reshape(want.shape[0], -1, 32) * scale[..., None] + offset[..., None]).reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=prefix)
    # everything else is the float conversion's own tensors
    rest = set(floats) - {f"{p}.weight" for p in q.quantized}
    assert all(np.array_equal(blocks[name], floats[name]) for name in rest)


def test_convert_reports_kept_and_float_linears(tmp_path):
    src = tiny_gguf(tmp_path / "tiny.gguf", {})
    proc = trtbuild("convert", src, tmp_path / "ckpt", "--quant", "gguf", "--exclude", "lm_head", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["quantization"], result["quantized"], result["excluded"]) == ("gguf", 8, ["lm_head"])


@pytest.mark.parametrize(("args", "needles"), [
    (["--group-size", "64"], ["--quant gguf", "--group-size"]),
    (["--kv-cache", "int8"], ["--quant gguf", "--kv-cache"]),
    (["--lm-head", "float"], ["--quant gguf", "--lm-head float", "--lm-head int8"]),
    (["--exclude", "layers.*", "--exclude", "lm_head"], ["no linear stored as Q4_0, Q4_1 or Q4_K", "--exclude"]),
])
def test_bad_gguf_options_are_refused(tmp_path, args, needles):
    src = tiny_gguf(tmp_path / "tiny.gguf", {})
    proc = trtbuild("convert", src, tmp_path / "ckpt", "--quant", "gguf", *args)
    assert_user_error(proc, *needles)
    assert not (tmp_path / "ckpt").exists()


def test_gguf_without_4bit_blocks_is_refused(tmp_path):
    src = tiny_gguf(tmp_path / "q8.gguf", {}, default=Q.Q8_0)
    proc = trtbuild("convert", src, tmp_path / "ckpt", "--quant", "gguf")
    assert_user_error(proc, "q8.gguf", "Q8_0", "--quant int4_awq")
    assert not (tmp_path / "ckpt").exists()


def test_quant_gguf_on_a_safetensors_dir_is_refused(tiny_model_dir, tmp_path):
    proc = trtbuild("convert", tiny_model_dir("llama"), tmp_path / "ckpt", "--quant", "gguf")
    assert_user_error(proc, "--quant gguf", "GGUF", "--quant int4_awq")
    assert not (tmp_path / "ckpt").exists()
