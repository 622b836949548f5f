"""Quantized checkpoints for tests, made from a converted float checkpoint exactly per FORMAT.md.

    quantize_checkpoint(float_ckpt, out, "int4_wo", group_size=32)          # the quantized ckpt dir
    dequantized_checkpoint(quantized_ckpt, out)                             # its float twin

The float twin holds W = dequantize(W_q) in float32 and no quantization block: the graph built
from it is what the quantized graph must equal (weight-only schemes). Round-to-nearest only, with
converters/quantize/rtn.py; `trtbuild convert --quant` makes the real ones.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

from converters.quantize.fp8 import E4M3_MAX, quantize_fp8
from converters.quantize.rtn import (
    dequantize_blocked,
    dequantize_int8,
    quantize_int4_blocked,
    quantize_int8_blocked,
    quantize_int8_per_channel,
)
from engine_builder.formats.checkpoint import CheckpointConfig, linear_prefixes
from engine_builder.formats.quant_packing import pack_int4, unpack_int4
from engine_builder.formats.quantization import Quantization

WEIGHTS = "rank0.safetensors"
# static per-tensor activation scales: no calibration here, so a range that covers the tiny
# models' normalized activations (|x| < ~8) without clipping much
ACTIVATION_SCALES = {"int8": 8.0 / 127, "fp8": 8.0 / E4M3_MAX}
SCHEMES: dict[str, dict] = {
    "int8_wo": dict(weight_bits=8),
    "w8a8_sq": dict(weight_bits=8, activation="int8"),
    "int4_wo": dict(weight_bits=4),
    "awq": dict(weight_bits=4, zero_point=True),  # the ingested asymmetric layout (uint4 + zeros)
    "fp8": dict(activation="fp8"),
}


def quantize_checkpoint(src: Path, out: Path, scheme: str, group_size: int | None = None,
                        lm_head: bool = True) -> Path:
    """Rewrite float checkpoint SRC's linears (and lm_head) into OUT, quantized with SCHEME."""
    ckpt = CheckpointConfig.load(src)
    tensors = load_file(Path(src) / WEIGHTS)
    prefixes = [p for p in linear_prefixes(ckpt.model) if lm_head or p != "lm_head"]
    float_dtype = next(iter(tensors.values())).dtype
    for p in prefixes:
        source = p + ".weight" if p + ".weight" in tensors else "embed.weight"  # a tied lm_head
        w = tensors[source].astype(np.float32)
        if source != "embed.weight":
            del tensors[source]
        tensors |= _quantize(p, w, scheme, group_size, float_dtype)
    out.mkdir(parents=True)
    for f in Path(src).iterdir():
        if f.name not in ("config.json", WEIGHTS):
            shutil.copyfile(f, out / f.name)
    save_file(tensors, str(out / WEIGHTS))
    grouped = SCHEMES[scheme].get("weight_bits") == 4 or scheme == "int8_wo"
    quant = Quantization(scheme=scheme, group_size=group_size if grouped else None,
                         quantized=tuple(prefixes), **SCHEMES[scheme])
    (out / "config.json").write_text(dataclasses.replace(ckpt, quantization=quant, num_tensors=len(tensors)).to_json())
    return out


def _quantize(p: str, w: np.ndarray, scheme: str, g: int | None, float_dtype: np.dtype) -> dict[str, np.ndarray]:
    """w: [out, in] float32 -> P.weight, P.weight_scale[, P.weight_zero][, P.input_scale] as FORMAT.md stores them."""
    kind = SCHEMES[scheme]
    if kind.get("weight_bits") == 8:
        # [out, in] int8, [out] (or [out, in/g] for blocked int8_wo)
        q, scale = quantize_int8_blocked(w, g) if scheme == "int8_wo" and g else quantize_int8_per_channel(w)
        found = {".weight": q, ".weight_scale": scale.astype(float_dtype)}
    elif kind.get("zero_point"):
        q, scale, zero = quantize_uint4_asymmetric(w, g)
        found = {".weight": pack_int4(q), ".weight_scale": scale.astype(float_dtype), ".weight_zero": pack_int4(zero)}
    elif kind.get("weight_bits") == 4:
        q, scale = quantize_int4_blocked(w, g)
        found = {".weight": pack_int4(q), ".weight_scale": scale.astype(float_dtype)}
    else:  # fp8 e4m3, one scale per tensor
        q, scale = quantize_fp8(w)
        found = {".weight": q.view(ml_dtypes.float8_e4m3fn), ".weight_scale": np.array(scale, np.float32)}
    if kind.get("activation"):
        found[".input_scale"] = np.array(ACTIVATION_SCALES[kind["activation"]], np.float32)
    return {p + suffix: np.array(v, order="C") for suffix, v in found.items()}  # 0-d stays 0-d


def quantize_uint4_asymmetric(w: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """AutoAWQ / GPTQ style: per group, q = round(w / scale) + zero in 0..15. Returns q [out, in]
    uint8, scale float32 [out, in/g], zero uint8 [out, in/g]."""
    out, inp = w.shape
    groups = w.reshape(out, inp // g, g)  # [out, blocks, g]
    lo, hi = np.minimum(groups.min(axis=2), 0), np.maximum(groups.max(axis=2), 0)
    scale = np.where(hi > lo, (hi - lo) / 15, 1.0).astype(np.float32)  # [out, blocks]
    zero = np.clip(np.rint(-lo / scale), 0, 15).astype(np.uint8)
    q = np.clip(np.rint(groups / scale[:, :, None]) + zero[:, :, None], 0, 15).astype(np.uint8)
    return q.reshape(out, inp), scale, zero


def dequantized_checkpoint(qckpt: Path, out: Path) -> Path:
    """The float32 twin of quantized checkpoint QCKPT: every quantized linear as its dequantized weight."""
    ckpt = CheckpointConfig.load(qckpt)
    q = ckpt.quantization
    tensors = load_file(Path(qckpt) / WEIGHTS)
    tied_head = ckpt.model.tie_word_embeddings and "lm_head" in q.quantized
    for p in q.quantized:
        found = {s: tensors.pop(p + s) for s in (".weight", ".weight_scale", ".weight_zero", ".input_scale")
                 if p + s in tensors}
        w, scale = found[".weight"], found[".weight_scale"].astype(np.float32)
        if w.dtype == np.int8:
            w = dequantize_int8(w, scale)
        elif w.dtype == np.uint8:
            n = w.shape[1] * 2
            zero = unpack_int4(found[".weight_zero"], scale.shape[1], signed=False) if q.zero_point else None
            w = dequantize_blocked(unpack_int4(w, n, signed=not q.zero_point), scale, zero)
        else:
            w = w.astype(np.float32) * scale
        tensors[p + ".weight"] = w.astype(np.float32)
    tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
    out.mkdir(parents=True)
    for f in Path(qckpt).iterdir():
        if f.name not in ("config.json", WEIGHTS):
            shutil.copyfile(f, out / f.name)
    save_file(tensors, str(out / WEIGHTS))
    # a tied model's quantized lm_head has its own weight now: the twin reads it untied
    model = dataclasses.replace(ckpt.model, tie_word_embeddings=False) if tied_head else ckpt.model
    twin = dataclasses.replace(ckpt, model=model, dtype="float32", quantization=Quantization(),
                               num_tensors=len(tensors))
    (out / "config.json").write_text(twin.to_json())
    return out
