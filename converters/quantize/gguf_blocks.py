"""A GGUF file's own 4-bit blocks kept as they are: `trtbuild convert model.gguf OUT --quant gguf`.

llama.cpp's 4-bit block types give every run of 32 inputs of a weight row a scale and a minimum:

    Q4_0  fp16 d,           16 bytes of nibbles    w = d * (q - 8)      q in 0..15
    Q4_1  fp16 d, fp16 m,   16 bytes of nibbles    w = d * q + m
          nibble j of byte i: input i (low nibble) or input i + 16 (high nibble)
    Q4_K  256 inputs: fp16 d, fp16 dmin, 12 bytes of 6-bit (sc, mn) for each run of 32,
          128 bytes of nibbles (bytes 32j..32j+31: run 2j in the low nibbles, 2j+1 in the high)
                                                   w = d * sc * q - dmin * mn

Each is w = s * (q - 8) + offset per run of 32 (s = d or d * sc, offset = m + 8 s): signed int4 codes
with one scale per 32 inputs, which is FORMAT.md's int4 row, plus a float offset per run (its gguf row).
So the canonical checkpoint dequantizes to exactly the weights the GGUF does, and the graph
(network/linear.py) keeps TensorRT's and onnxruntime's fused int4 GEMM for the codes and adds the
offsets as a small float product. Other block types (Q8_0, Q6_K, ...) are dequantized to float
and listed as kept float; a fused linear (qkv, gate_up) keeps its blocks only when every part has them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from converters.base import PlannedTensor
from converters.quantize.options import linear_prefixes, split_excluded
from converters.quantize.quantized_checkpoint import FLOAT_DTYPES
from converters.quantize.rtn import pack_int4
from engine_builder.config import ModelConfig, Quantization
from engine_builder.errors import InputError

if TYPE_CHECKING:
    from converters.gguf_source import GGUFSource
    from converters.safetensors_writer import StreamingSafetensorsWriter
    from converters.sources import Source

BLOCK = 32  # inputs per block, and so the checkpoint's group size
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q4_K": 144}  # bytes per block of 32 inputs (Q4_K: of 256)


def decode(blocks: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw GGUF rows, uint8 [rows, row bytes] -> (codes int8 -8..7 [rows, in], scale float32 [rows, in/32],
    offset float32 [rows, in/32]): w = codes * scale + offset."""
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, BLOCK_BYTES[qtype])  # [rows, blocks, block bytes]
    d = _fp16(b[..., 0:2])  # [rows, blocks]
    if qtype == "Q4_K":
        from gguf.quants import Q4_K

        sc, mn = Q4_K.get_scale_min(b[..., 4:16].reshape(-1, 12))  # [rows * blocks, 8] each, 0..63
        scale = d[..., None] * sc.reshape(*d.shape, 8).astype(np.float32)  # [rows, blocks, 8]
        minimum = -_fp16(b[..., 2:4])[..., None] * mn.reshape(*d.shape, 8).astype(np.float32)
        nibbles = b[..., 16:].reshape(rows, -1, 4, 1, BLOCK)  # [rows, blocks, 4, 1, 32]
        runs = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=3)  # [rows, blocks, 4, 2, 32]: run 2j, 2j + 1
        return _signed(runs.reshape(rows, -1, BLOCK), scale.reshape(rows, -1), minimum.reshape(rows, -1))
    minimum = _fp16(b[..., 2:4]) if qtype == "Q4_1" else -8 * d
    nibbles = b[..., -BLOCK // 2:]  # [rows, blocks, 16]
    return _signed(np.concatenate([nibbles & 0xF, nibbles >> 4], axis=-1), d, minimum)


def _fp16(raw: np.ndarray) -> np.ndarray:
    """uint8 [..., 2] little-endian fp16 -> float32 [...]."""
    return raw.copy().view(np.float16)[..., 0].astype(np.float32)


def _signed(nibbles: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> tuple[np.ndarray, ...]:
    """Runs of w = scale * u + minimum (u: uint8 0..15 [rows, runs, 32], scale and minimum [rows, runs]) as
    (codes int8 -8..7 [rows, in], scale > 0, offset): w = scale * codes + offset.

    The scale a DequantizeLinear is handed is kept positive: a run of one value has scale 0 in the file
    and gets scale 1 with codes 0 (w = offset = minimum); Q4_0 stores a negative d when a run's largest
    magnitude is negative, and w = d * c + o = -d * (-c - 1) + (o - d), where -c - 1 (= ~c) stays in -8..7."""
    offset = minimum + 8 * scale  # [rows, runs]
    flat = scale == 0
    codes = np.where(flat[..., None], 8, nibbles).astype(np.int8) - 8  # [rows, runs, 32]
    scale = np.where(flat, np.float32(1), scale)
    negative = scale < 0
    codes = np.where(negative[..., None], ~codes, codes)
    return codes.reshape(len(codes), -1), np.abs(scale), np.where(negative, offset - scale, offset)


def kept_linears(source: Source, model: ModelConfig, tensors: tuple[PlannedTensor, ...],
                 exclude: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(linears whose every part is a Q4_0/Q4_1/Q4_K tensor, the other linears) by canonical prefix; the
    first are stored as blocks, the rest float. --exclude patterns send a linear to the second."""
    if source.kind != "gguf":
        raise InputError(f"--quant gguf keeps a GGUF file's own 4-bit blocks, but the source is a {source.kind} "
                         f"checkpoint; use --quant int4_awq (or int4_wo) to quantize it")
    planned = {t.name: t for t in tensors}
    types = source.block_types()  # HF name -> ggml type name
    _, excluded = split_excluded(linear_prefixes(model), exclude)
    kept, floats = [], []
    for p in linear_prefixes(model):
        if f"{p}.weight" not in planned:  # a tied lm_head
            continue
        blocks = all(types[s] in BLOCK_BYTES for s in planned[f"{p}.weight"].sources)
        (kept if blocks and p not in excluded else floats).append(p)
    if not kept:
        found = sorted({types[s] for p in floats for s in planned[f"{p}.weight"].sources})
        raise InputError(f"{source.files()[0].name} has no linear stored as Q4_0, Q4_1 or Q4_K (its linears are "
                         f"{', '.join(found)}{', or --exclude matched them all' if exclude else ''}); convert "
                         f"without --quant to dequantize it, or with --quant int4_awq to re-quantize it")
    return tuple(kept), tuple(floats)


def quantization_block(kept: tuple[str, ...], floats: tuple[str, ...]) -> Quantization:
    return Quantization(scheme="gguf", weight_bits=4, group_size=BLOCK, quantized=kept, excluded=floats)


def linear_layout(t: PlannedTensor, dtype: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """The tensors of planned weight `t` ([out, in]): FORMAT.md's gguf row."""
    prefix = t.name.removesuffix(".weight")
    out, inp = t.shape
    return [(t.name, "uint8", (out, inp // 2)), (f"{prefix}.weight_scale", dtype, (out, inp // BLOCK)),
            (f"{prefix}.weight_offset", dtype, (out, inp // BLOCK))]


def append_linear(source: GGUFSource, writer: StreamingSafetensorsWriter, t: PlannedTensor, dtype: str) -> None:
    """Write planned weight `t`: its parts' codes, then scales, then offsets, each fused by rows."""
    parts = [source.load_blocks(name) for name in t.sources]
    prefix = t.name.removesuffix(".weight")
    for codes, _, _ in parts:
        writer.append(t.name, pack_int4(codes))  # [rows, in/2]
    for suffix, i in (("weight_scale", 1), ("weight_offset", 2)):
        for part in parts:
            writer.append(f"{prefix}.{suffix}", part[i].astype(FLOAT_DTYPES[dtype]))  # [rows, in/32]
