"""`convert --quant int8_wo / int4_wo` on tiny models: FORMAT.md's tensors, the config block, RTN error bounds."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from checkpoint_to_hf import read_checkpoint
from cli_process import trtbuild
from safetensors import safe_open

from converters.convert import convert
from converters.quantize import rtn
from engine_builder.formats import quant_packing
from engine_builder.formats.checkpoint import CheckpointConfig

LINEARS = ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down")
GROUP = 32  # divides the tiny models' hidden (64), intermediate (96) and q (64 / 128) sizes


def dequantize(tensors: dict[str, np.ndarray], prefix: str, scheme: str,
               group: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(dequantized weight [out, in], the scale of each element's group [out, in]) of linear `prefix`."""
    q, scale = tensors[f"{prefix}.weight"], tensors[f"{prefix}.weight_scale"]
    if scheme == "int8_wo" and group is None:
        assert q.dtype == np.int8 and scale.shape == (q.shape[0],)
        return rtn.dequantize_int8(q, scale), np.broadcast_to(scale[:, None], q.shape)
    if scheme == "int8_wo":
        assert q.dtype == np.int8 and scale.shape == (q.shape[0], q.shape[1] // group)
        return rtn.dequantize_int8(q, scale), np.repeat(scale, group, axis=1)
    assert q.dtype == np.uint8
    inp = q.shape[1] * 2
    assert scale.shape == (q.shape[0], inp // GROUP)
    codes = quant_packing.unpack_int4(q, inp)  # [out, in] -7..7
    assert codes.min() >= -rtn.INT4_MAX and codes.max() <= rtn.INT4_MAX
    return rtn.dequantize_blocked(codes, scale), np.repeat(scale, GROUP, axis=1)


@pytest.mark.parametrize(("scheme", "group"), [("int8_wo", None), ("int8_wo", GROUP), ("int4_wo", GROUP)])
@pytest.mark.parametrize("arch", ["llama", "llama_tied", "gemma2"])
def test_rtn_checkpoint_dequantizes_within_half_a_step(arch, scheme, group, tiny_model_dir, tmp_path):
    hf = tiny_model_dir(arch)
    convert(hf, tmp_path / "fp", dtype="float32")
    # every linear in the scheme's own layout, lm_head too (its int8 default: tests/converters/quantize/test_lm_head.py)
    result = convert(hf, tmp_path / "q", quant=scheme, group_size=group, lm_head="same")
    cfg = CheckpointConfig.load(tmp_path / "q")
    fp, q = read_checkpoint(tmp_path / "fp"), read_checkpoint(tmp_path / "q")
    linears = tuple(f"layers.{i}.{p}" for i in range(cfg.model.num_layers) for p in LINEARS) + ("lm_head",)

    block = cfg.quantization
    assert (block.scheme, block.weight_bits, block.group_size, block.zero_point, block.activation) == (
        scheme, 8 if scheme == "int8_wo" else 4, group, False, "none")
    assert block.quantized == linears and block.excluded == () and block.calibration is None
    assert cfg.dtype == "float32" and cfg.num_tensors == len(q) == result.tensors
    assert result.quantization == scheme and result.quantized == len(linears)
    # a tied model keeps its float embedding and gains its own quantized lm_head (FORMAT.md)
    assert cfg.model.tie_word_embeddings == (arch != "llama") and "embed.weight" in q
    float_names = set(fp) - {f"{p}.weight" for p in linears}
    suffixes = (".weight", ".weight_scale")
    assert set(q) == float_names | {p + s for p in linears for s in suffixes}
    for name in float_names:
        assert q[name].dtype == np.float32 and np.array_equal(q[name], fp[name]), name
    for prefix in linears:
        w = fp["embed.weight" if prefix == "lm_head" and cfg.model.tie_word_embeddings else f"{prefix}.weight"]
        assert q[f"{prefix}.weight_scale"].dtype == np.float32
        deq, step = dequantize(q, prefix, scheme, group)
        assert deq.shape == w.shape
        # round to nearest: never more than half a quantization step away, and the step is amax / qmax
        assert np.all(np.abs(deq - w) <= step * (0.5 + 1e-5)), prefix
        assert np.abs(deq - w).max() > 0  # really quantized
    assert result.bytes == sum(t.nbytes for t in q.values())
    fp_bytes = sum(t.nbytes for t in fp.values())
    # int8: 1/4 of fp32 for the linears, int4: 1/8 plus a scale per 32 weights; the tiny models' embeddings
    # (float, and kept beside a tied lm_head) weigh a lot here, so only the order is checked
    assert result.bytes < fp_bytes


def test_checkpoint_dtype_applies_to_floats_and_scales(tiny_model_dir, tmp_path):
    """--dtype bfloat16: the float checkpoint quantized from is bfloat16, and so are the embeddings, norms
    and scales stored; the codes are RTN's of the bfloat16 weights, computed in float32."""
    hf = tiny_model_dir("llama")
    convert(hf, tmp_path / "fp", dtype="bfloat16")
    convert(hf, tmp_path / "q", quant="int4_wo", group_size=GROUP, dtype="bfloat16", lm_head="same")
    assert CheckpointConfig.load(tmp_path / "q").dtype == "bfloat16"
    with safe_open(tmp_path / "q" / "rank0.safetensors", framework="pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118 (not a dict)
    assert dtypes["embed.weight"] == dtypes["layers.0.attn_norm.weight"] == "BF16"
    assert dtypes["layers.0.mlp.down.weight_scale"] == "BF16" and dtypes["layers.0.mlp.down.weight"] == "U8"
    fp, q = read_checkpoint(tmp_path / "fp"), read_checkpoint(tmp_path / "q")
    for prefix in ("layers.0.attn.qkv", "layers.1.mlp.down", "lm_head"):
        codes, scale = rtn.quantize_int4_blocked(fp[f"{prefix}.weight"], GROUP)
        np.testing.assert_array_equal(q[f"{prefix}.weight"], quant_packing.pack_int4(codes))
        np.testing.assert_array_equal(q[f"{prefix}.weight_scale"], torch.from_numpy(scale).bfloat16().float())
    np.testing.assert_array_equal(q["embed.weight"], fp["embed.weight"])


def test_exclude_and_json_summary(tiny_model_dir, tmp_path):
    hf = tiny_model_dir("llama_tied")
    proc = trtbuild("convert", hf, tmp_path / "q", "--quant", "int4_wo", "--group-size", str(GROUP),
                   "--exclude", "lm_head", "--exclude", "layers.1.*", "--exclude", "*.mlp.down", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    excluded = ("layers.0.mlp.down", "layers.1.attn.qkv", "layers.1.attn.o", "layers.1.mlp.gate_up",
                "layers.1.mlp.down", "lm_head")
    assert summary["quantization"] == "int4_wo" and summary["quantized"] == 3
    assert tuple(summary["excluded"]) == excluded and summary["seconds"] > 0
    block = CheckpointConfig.load(tmp_path / "q").quantization
    assert block.quantized == ("layers.0.attn.qkv", "layers.0.attn.o", "layers.0.mlp.gate_up")
    assert block.excluded == excluded
    q = read_checkpoint(tmp_path / "q")
    assert summary["bytes"] == sum(t.nbytes for t in q.values())
    # excluded linears stay float under their usual names; a tied, excluded lm_head is the embedding again
    assert q["layers.1.attn.qkv.weight"].dtype == np.float32 and "layers.1.attn.qkv.weight_scale" not in q
    assert q["layers.0.mlp.down.weight"].dtype == np.float32
    assert not any(name.startswith("lm_head") for name in q)
    assert q["layers.0.attn.qkv.weight"].dtype == np.uint8
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")], "scratch or temp dir left behind"
