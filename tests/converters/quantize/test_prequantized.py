"""Pre-quantized AutoAWQ (GEMM) and GPTQ checkpoints, written here in their published layouts, are ingested
without re-quantizing: the canonical checkpoint dequantizes to exactly the weights the source encodes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_quantize_errors import assert_refused, run_convert

from converters.convert import convert
from converters.quantize import rtn
from engine_builder.formats import quant_packing
from engine_builder.formats.checkpoint import CheckpointConfig

GROUP = 32
AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ GEMM: nibble i of word c holds output column 8c + order[i]
HF_LINEARS = {"self_attn.q_proj": "attn.qkv", "self_attn.k_proj": "attn.qkv", "self_attn.v_proj": "attn.qkv",
              "self_attn.o_proj": "attn.o", "mlp.gate_proj": "mlp.gate_up", "mlp.up_proj": "mlp.gate_up",
              "mlp.down_proj": "mlp.down"}


def quantize_asym(w: np.ndarray, rng: np.random.Generator, symmetric: bool, group: int):
    """w [out, in] -> (q 0..15 [out, in], zero 0..15 [out, in/g], scale fp16 [out, in/g]), min/max per group.

    A few zeros are pushed to 0 and 15 so both ends of the nibble range (and GPTQ's zero - 1 wrap) occur."""
    out, inp = w.shape
    groups = w.reshape(out, inp // group, group)
    if symmetric:  # GPTQ sym: zero 8, scale from the absmax
        scale = (np.abs(groups).max(axis=2) / 7.5).astype(np.float16)
        zero = np.full(scale.shape, 8, np.int64)
    else:
        lo, hi = groups.min(axis=2), groups.max(axis=2)
        scale = ((hi - lo) / 15).astype(np.float16)
        zero = np.clip(np.rint(-lo / scale.astype(np.float32)), 0, 15).astype(np.int64)
        zero.flat[rng.choice(zero.size, 4, replace=False)] = [0, 0, 15, 15]
    q = np.clip(np.rint(groups / scale.astype(np.float32)[..., None]) + zero[..., None], 0, 15).astype(np.int64)
    return q.reshape(out, inp), zero, scale


def reference_dequant(q, zero, scale) -> np.ndarray:
    """The test's own dequantization: w[o, k] = (q[o, k] - zero[o, k // g]) * scale[o, k // g]."""
    group = q.shape[1] // zero.shape[1]
    zeros = np.repeat(zero, group, axis=1).astype(np.float32)
    return (q.astype(np.float32) - zeros) * np.repeat(scale.astype(np.float32), group, axis=1)


def pack_words(values: np.ndarray, order=range(8)) -> np.ndarray:
    """[rows, 8n] values 0..15 -> int32 [rows, n]: nibble i of word c is values[:, 8c + order[i]]."""
    rows, n = values.shape[0], values.shape[1] // 8
    words = np.zeros((rows, n), np.uint64)
    for i, column in enumerate(order):
        words |= values[:, column::8].astype(np.uint64) << np.uint64(4 * i)
    return words.astype(np.uint32).view(np.int32)


def awq_tensors(q, zero, scale) -> dict[str, np.ndarray]:
    return {"qweight": pack_words(q.T, AWQ_PACK_ORDER),  # [in, out/8]
            "qzeros": pack_words(zero.T, AWQ_PACK_ORDER),  # [in/g, out/8]
            "scales": scale.T.copy()}  # [in/g, out] fp16


def gptq_tensors(q, zero, scale, zero_minus_one: bool) -> dict[str, np.ndarray]:
    inp, group = q.shape[1], q.shape[1] // zero.shape[1]
    # qweight packs along the input dim: word r of column o holds input rows 8r..8r+7, the first lowest
    words = np.zeros((inp // 8, q.shape[0]), np.uint64)
    for j in range(8):
        words |= q.T[j::8].astype(np.uint64) << np.uint64(4 * j)
    stored_zero = (zero - 1) & 0xF if zero_minus_one else zero  # the classic format stores zero - 1
    return {"qweight": words.astype(np.uint32).view(np.int32),  # [in/8, out]
            "qzeros": pack_words(stored_zero.T),  # [in/g, out/8]
            "scales": scale.T.copy(),  # [in/g, out] fp16
            "g_idx": (np.arange(inp) // group).astype(np.int32)}


def write_prequantized(hf_dir: Path, out: Path, method: str, quant_config: dict, symmetric: bool = False,
                       zero_minus_one: bool = True, group_size: int = GROUP) -> dict[str, np.ndarray]:
    """Write hf_dir's model as a `method` checkpoint; returns canonical prefix -> the encoded weight [out, in]."""
    rng = np.random.default_rng(0)
    out.mkdir()
    state = load_file(hf_dir / "model.safetensors")
    tensors, encoded = {}, {}  # encoded: HF module -> the weight it encodes
    for name, tensor in state.items():
        module, kind = name.rsplit(".", 1)
        part = next((c for h, c in HF_LINEARS.items() if module.endswith(h)), None)
        if part is None or kind != "weight":
            tensors[name] = tensor.half()
            continue
        q, zero, scale = quantize_asym(tensor.numpy(), rng, symmetric, group_size)
        packed = awq_tensors(q, zero, scale) if method == "awq" else gptq_tensors(q, zero, scale, zero_minus_one)
        tensors |= {f"{module}.{k}": torch.from_numpy(v) for k, v in packed.items()}
        encoded[module] = reference_dequant(q, zero, scale)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((hf_dir / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": quant_config}))
    # fused linears are their parts' rows one after another, in HF_LINEARS' order (q, k, v; gate, up)
    return {f"layers.{i}.{part}": np.concatenate([encoded[f"model.layers.{i}.{h}"] for h, c in HF_LINEARS.items()
                                                 if c == part])
            for i in range(config["num_hidden_layers"]) for part in dict.fromkeys(HF_LINEARS.values())}


AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}
GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": False}


def canonical_dequant(ckpt: Path, prefix: str, zero_point: bool) -> np.ndarray:
    with safe_open(ckpt / "rank0.safetensors", framework="numpy") as f:
        packed, scale = f.get_tensor(f"{prefix}.weight"), f.get_tensor(f"{prefix}.weight_scale")
        assert packed.dtype == np.uint8 and scale.dtype == np.float16
        inp = packed.shape[1] * 2
        if not zero_point:
            assert f"{prefix}.weight_zero" not in f.keys()
            return rtn.dequantize_blocked(quant_packing.unpack_int4(packed, inp), scale)
        zero = f.get_tensor(f"{prefix}.weight_zero")
        assert zero.dtype == np.uint8 and zero.shape == (packed.shape[0], (scale.shape[1] + 1) // 2)
        return rtn.dequantize_blocked(quant_packing.unpack_int4(packed, inp, signed=False), scale,
                                           quant_packing.unpack_int4(zero, scale.shape[1], signed=False))


@pytest.mark.parametrize(("method", "quant_config", "symmetric", "zero_minus_one"), [
    ("awq", AWQ_CONFIG, False, True),
    ("gptq", GPTQ_CONFIG, False, True),
    ("gptq", {**GPTQ_CONFIG, "checkpoint_format": "gptq_v2"}, False, False),
    ("gptq", {**GPTQ_CONFIG, "sym": True}, True, True),
], ids=["awq-gemm", "gptq", "gptq_v2", "gptq-sym"])
def test_ingest_dequantizes_exactly(method, quant_config, symmetric, zero_minus_one, tiny_model_dir, tmp_path):
    hf = tiny_model_dir("llama")
    encoded = write_prequantized(hf, tmp_path / "src", method, quant_config, symmetric, zero_minus_one)
    result = convert(tmp_path / "src", tmp_path / "ckpt")
    cfg = CheckpointConfig.load(tmp_path / "ckpt")
    block = cfg.quantization
    assert (block.scheme, block.weight_bits, block.group_size, block.zero_point) == (method, 4, GROUP, not symmetric)
    assert block.quantized == tuple(encoded) and block.excluded == ("lm_head",)  # AutoAWQ / GPTQ keep lm_head float
    assert cfg.dtype == "float16" and result.quantization == method and result.quantized == len(encoded)
    for prefix, weight in encoded.items():
        np.testing.assert_array_equal(canonical_dequant(tmp_path / "ckpt", prefix, not symmetric), weight,
                                      err_msg=prefix)
    # everything else is the source's float tensors, as a float convert leaves them
    with safe_open(tmp_path / "ckpt" / "rank0.safetensors", framework="pt") as f:
        source = load_file(tmp_path / "src" / "model.safetensors")
        assert torch.equal(f.get_tensor("layers.1.mlp_norm.weight"),
                           source["model.layers.1.post_attention_layernorm.weight"])
        assert torch.equal(f.get_tensor("lm_head.weight"), source["lm_head.weight"])
        assert len(f.keys()) == cfg.num_tensors == result.tensors


@pytest.fixture(scope="module")
def gptq_source(tiny_model_dir, module_tmp_factory) -> Path:
    src = module_tmp_factory.mktemp("gptq") / "src"
    write_prequantized(tiny_model_dir("llama"), src, "gptq", GPTQ_CONFIG)
    return src


def with_quant_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] |= changes
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize(("changes", "needles"), [
    ({"desc_act": True}, ("act-order (desc_act true)", "desc_act=False", "--quant int4_awq")),
    ({"bits": 8}, ("bits 8", "4-bit gptq only")),
    ({"checkpoint_format": "marlin"}, ("checkpoint_format 'marlin'", "gptq and gptq_v2")),
    ({"quant_method": "awq", "version": "gemv"}, ("AWQ version 'gemv'", "version='gemm'")),
    ({"quant_method": "bitsandbytes"}, ("quant_method 'bitsandbytes'", "awq (AutoAWQ GEMM) and gptq")),
], ids=["desc_act", "bits", "gptq-format", "awq-gemv", "other-method"])
def test_unsupported_variants_are_refused(gptq_source, tmp_path, changes, needles):
    src = with_quant_config(gptq_source, tmp_path / "src", **changes)
    assert_refused(run_convert(src, tmp_path / "out"), tmp_path / "out", *needles)


def test_quant_on_a_prequantized_source_is_refused(gptq_source, tmp_path):
    proc = run_convert(gptq_source, tmp_path / "out", "--quant", "int8_wo")
    assert_refused(proc, tmp_path / "out", "already quantized (gptq)", "drop --quant int8_wo")


def test_permuted_g_idx_is_refused_as_act_order(gptq_source, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(gptq_source, src)
    state = load_file(src / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.g_idx"
    state[name] = state[name].flip(0)
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    assert_refused(run_convert(src, tmp_path / "out"), tmp_path / "out", "g_idx", "act-order")
